//! `flower-hub run submit|list|logs|stop|delete`: FlowerRuns from the command line, in both hub
//! modes. `submit` builds the app's FAB in Rust (byte for byte what `flwr build` makes), stores
//! it in a ConfigMap and creates the FlowerRun — through the Kubernetes API with the user's own
//! credentials (RBAC on `flowerruns` and `configmaps` decides), or as one file in a standalone
//! hub's manifests directory. No Control API is reached from here: the hub submits.
use super::*;
use flower_addon_crds::run::{
    ConfigMapKeyRef, FabSource, FederationRef, FlowerRun, FlowerRunSpec, FlowerRunStatus, RunApp,
    RunConfigValue,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
mod manage;
use manage::{delete, fetch, list, stop};

/// `flower-hub run`.
#[derive(clap::Args, Debug)]
pub struct RunCommand {
    #[command(subcommand)]
    command: RunSub,
}

#[derive(clap::Subcommand, Debug)]
enum RunSub {
    /// Build APP_DIR into a FAB and submit it as a FlowerRun of a Federation.
    #[command(
        after_help = "Examples:\n  flower-hub run submit examples/fedavg --federation demo --federation-namespace demo --run-config num-server-rounds=2 --follow\n  flower-hub run submit ./app --federation quickstart --state-dir /var/lib/flower-hub --wait"
    )]
    Submit(SubmitArgs),
    /// List FlowerRuns (like `kubectl get flowerrun`).
    #[command(
        after_help = "Examples:\n  flower-hub run list\n  flower-hub run list --federation-namespace demo\n  flower-hub run list --state-dir /var/lib/flower-hub"
    )]
    List(ListArgs),
    /// Print a FlowerRun's log tail; `--follow` prints new lines until the run ends.
    #[command(
        after_help = "Examples:\n  flower-hub run logs fedavg-1795000000 --federation-namespace demo\n  flower-hub run logs fedavg-1795000000 --federation-namespace demo --follow"
    )]
    Logs(LogsArgs),
    /// Stop a FlowerRun (sets `spec.suspend: true`; the hub stops its Flower run).
    #[command(
        after_help = "Example:\n  flower-hub run stop fedavg-1795000000 --federation-namespace demo"
    )]
    Stop(NameArgs),
    /// Copy a finished FlowerRun's outputs (`status.outputs`) to a directory, each file checked
    /// against its listed sha256: through the Kubernetes API with your own credentials (a
    /// port-forward to the SuperLink pod: you need `get` and `create` on `pods/portforward` in
    /// the run's namespace), or from a standalone hub's state directory.
    #[command(
        after_help = "Examples:\n  flower-hub run fetch fedavg-1795000000 --federation-namespace demo -o ./model\n  flower-hub run fetch fedavg-1795000000 --state-dir /var/lib/flower-hub"
    )]
    Fetch(FetchArgs),
    /// Delete a FlowerRun (the hub stops its Flower run first) and the ConfigMap `submit` made.
    #[command(
        after_help = "Example:\n  flower-hub run delete fedavg-1795000000 --federation-namespace demo"
    )]
    Delete(NameArgs),
}

/// Arguments of `run submit`.
#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    #[command(flatten)]
    hub_args: HubArgs,
    /// The Flower app directory (with its pyproject.toml).
    pub app: PathBuf,
    /// The Federation to run it on.
    #[arg(long)]
    pub federation: String,
    /// The Federation's namespace (the FlowerRun and its ConfigMap are made there).
    #[arg(long = "federation-namespace", default_value = "default")]
    pub federation_namespace: String,
    /// The FlowerRun's name (default: the app's name and the time).
    #[arg(long)]
    pub name: Option<String>,
    /// Run-config values, as `flwr run --run-config` takes them (`k=v`, several per argument or
    /// the option repeated; TOML values: `3`, `0.5`, `true`, `"text"`).
    #[arg(long = "run-config", value_name = "K=V")]
    pub run_config: Vec<String>,
    /// `spec.activeDeadlineSeconds`.
    #[arg(long)]
    pub active_deadline_seconds: Option<i64>,
    /// `spec.backoffLimit`.
    #[arg(long)]
    pub backoff_limit: Option<i32>,
    /// Wait until the run ends; exit non-zero when it failed.
    #[arg(long)]
    pub wait: bool,
    /// Print the log and the rounds as they come until the run ends (implies --wait).
    #[arg(long)]
    pub follow: bool,
}

/// Arguments of `run list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    hub_args: HubArgs,
    /// Only this namespace (default: all).
    #[arg(long = "federation-namespace")]
    pub federation_namespace: Option<String>,
    /// Output: a table, or every run with its whole status as JSON or YAML (a list of
    /// `{namespace, name, federation, status}`), for scripts.
    #[arg(long, short = 'o', value_enum, default_value = "table")]
    pub output: ListOutput,
}

/// Output format of `run list`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListOutput {
    /// One line per run.
    Table,
    /// A JSON array.
    Json,
    /// A YAML sequence.
    Yaml,
}

/// Arguments of `run logs`.
#[derive(clap::Args, Debug)]
pub struct LogsArgs {
    #[command(flatten)]
    names: NameArgs,
    /// Keep printing until the run ends; exit non-zero when it failed.
    #[arg(long, short = 'f')]
    pub follow: bool,
}

/// Arguments of `run fetch`.
#[derive(clap::Args, Debug)]
pub struct FetchArgs {
    #[command(flatten)]
    names: NameArgs,
    /// Directory to write the files to (made when missing; default: ./<NAME>).
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
}

/// A FlowerRun by name.
#[derive(clap::Args, Debug)]
pub struct NameArgs {
    #[command(flatten)]
    hub_args: HubArgs,
    /// The FlowerRun's name.
    pub name: String,
    /// Its namespace.
    #[arg(long = "federation-namespace", default_value = "default")]
    pub federation_namespace: String,
}

/// `flower-hub run …`.
pub fn run(cmd: RunCommand) -> anyhow::Result<ExitCode> {
    block_on(async move {
        match cmd.command {
            RunSub::Submit(args) => submit(args).await,
            RunSub::List(args) => list(args).await,
            RunSub::Logs(args) => {
                let hub = Hub::open(&args.names.hub_args).await?;
                let (ns, name) = (&args.names.federation_namespace, &args.names.name);
                if !args.follow {
                    let status = get(&hub, ns, name).await?;
                    for line in &status.log_tail {
                        println!("{}", crate::core::text::printable(line));
                    }
                    return Ok(ExitCode::SUCCESS);
                }
                follow(&hub, ns, name, true).await
            }
            RunSub::Stop(args) => stop(args).await,
            RunSub::Fetch(args) => fetch(args).await,
            RunSub::Delete(args) => delete(args).await,
        }
    })
}

async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let fab = crate::flower::fab::build_from_dir(&args.app)
        .with_context(|| format!("building a FAB of {}", args.app.display()))?;
    let overrides = crate::flower::fab::parse_run_config(&args.run_config)?;
    // Checked here as the hub will: a typo fails now, not after the submission.
    let overrides = crate::flower::fab::check_overrides(&fab.config, &overrides)?;
    let project = fab.fab_id.rsplit('/').next().unwrap_or("run").to_owned();
    let name = match &args.name {
        Some(n) => n.clone(),
        None => format!(
            "{}-{}",
            dns_part(&project),
            crate::registration::tokens::unix_now()
        ),
    };
    let ns = args.federation_namespace.clone();
    let (config_map, run) = run_objects(&args, &ns, &name, &fab.bytes, overrides);
    let problems = flower_addon_crds::validate_flower_run(&run);
    if let Some(p) = problems.first() {
        anyhow::bail!("{}: {}", p.path, p.message);
    }
    let hub = Hub::open(&args.hub_args).await?;
    store_run(&hub, &ns, &name, &config_map, &run).await?;
    println!(
        "FlowerRun {ns}/{name} submitted (app {} {}, FAB {} bytes, sha256 {})",
        fab.fab_id,
        fab.version,
        fab.bytes.len(),
        fab.hash
    );
    if args.follow || args.wait {
        return follow(&hub, &ns, &name, args.follow).await;
    }
    println!("follow it with: flower-hub run logs {name} --federation-namespace {ns} --follow");
    Ok(ExitCode::SUCCESS)
}

/// The FlowerRun `ns/name` of `submit` and the ConfigMap `<name>-fab` holding its FAB.
fn run_objects(
    args: &SubmitArgs,
    ns: &str,
    name: &str,
    fab: &[u8],
    overrides: std::collections::BTreeMap<String, crate::flower::fab::ConfigValue>,
) -> (ConfigMap, FlowerRun) {
    let config_map_name = format!("{name}-fab");
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(config_map_name.to_owned()),
            namespace: Some(ns.to_owned()),
            labels: Some([("flower-addon.io/flowerrun".to_owned(), name.to_owned())].into()),
            ..Default::default()
        },
        binary_data: Some([(FAB_KEY.to_owned(), k8s_openapi::ByteString(fab.to_vec()))].into()),
        ..Default::default()
    };
    let run = FlowerRun {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(ns.to_owned()),
            ..Default::default()
        },
        spec: FlowerRunSpec {
            federation_ref: FederationRef {
                name: args.federation.clone(),
            },
            app: RunApp {
                fab: FabSource {
                    config_map_ref: Some(ConfigMapKeyRef {
                        name: config_map_name.to_owned(),
                        key: FAB_KEY.into(),
                    }),
                    url: None,
                    sha256: None,
                },
            },
            run_config: overrides
                .into_iter()
                .map(|(k, v)| {
                    let v = match v {
                        crate::flower::fab::ConfigValue::Bool(b) => RunConfigValue::Bool(b),
                        crate::flower::fab::ConfigValue::Int(i) => RunConfigValue::Int(i),
                        crate::flower::fab::ConfigValue::Float(x) => RunConfigValue::Float(x),
                        crate::flower::fab::ConfigValue::Str(s) => RunConfigValue::Str(s),
                    };
                    (k, v)
                })
                .collect(),
            suspend: None,
            active_deadline_seconds: args.active_deadline_seconds,
            backoff_limit: args.backoff_limit,
            ttl_seconds_after_finished: None,
        },
        status: None,
    };
    (config_map, run)
}

/// Creates `run` and its `config_map` (Kubernetes: the FlowerRun, then the ConfigMap owned by
/// it, so the garbage collector deletes it with the run and a user needs no right on ConfigMaps
/// but `create` (the chart's FlowerRun roles); the run removed again when its ConfigMap cannot
/// be made. Standalone: one manifest file, never over an existing one).
async fn store_run(
    hub: &Hub,
    ns: &str,
    name: &str,
    config_map: &ConfigMap,
    run: &FlowerRun,
) -> anyhow::Result<()> {
    let config_map_name = format!("{name}-fab");
    match hub {
        Hub::Kube { client, .. } => {
            let maps: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), ns);
            let runs: kube::Api<FlowerRun> = kube::Api::namespaced(client.clone(), ns);
            let pp = kube::api::PostParams::default();
            // Until its ConfigMap exists the hub says the run waits for its app.
            let created = runs.create(&pp, run).await.with_context(|| {
                format!(
                    "creating FlowerRun {ns}/{name} (is the FlowerRun CRD installed: \
                     `flower-hub crds | kubectl apply -f -`?)"
                )
            })?;
            let mut config_map = config_map.clone();
            config_map.metadata.owner_references = Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: flower_addon_crds::API_VERSION.to_owned(),
                    kind: "FlowerRun".to_owned(),
                    name: name.to_owned(),
                    uid: created.metadata.uid.clone().unwrap_or_default(),
                    controller: None,
                    block_owner_deletion: None,
                },
            ]);
            if let Err(e) = maps.create(&pp, &config_map).await {
                // Nothing half-made is left behind.
                let _ = runs.delete(name, &kube::api::DeleteParams::default()).await;
                return Err(anyhow::Error::new(e).context(format!(
                    "creating ConfigMap {ns}/{config_map_name} with the FAB (FlowerRun {ns}/{name} \
                     deleted again; you need `create` on configmaps in {ns}, which the \
                     flower-addon-flowerrun-editor role grants)"
                )));
            }
        }
        Hub::File { dir, .. } => {
            let path = standalone_file(dir, ns, name)?;
            anyhow::ensure!(
                !path.exists(),
                "{} exists: FlowerRun {ns}/{name} was submitted before; pick another --name",
                path.display()
            );
            let text = format!(
                "# Made by `flower-hub run submit`; `flower-hub run stop|delete {name}` edit or remove it.\n---\n{}---\n{}",
                serde_saphyr::to_string(&with_kind(config_map, "v1", "ConfigMap")?)?,
                serde_saphyr::to_string(&with_kind(
                    run,
                    flower_addon_crds::API_VERSION,
                    "FlowerRun"
                )?)?,
            );
            write_new(&path, &text)?;
        }
    }
    Ok(())
}

/// The ConfigMap key `submit` stores the FAB under.
const FAB_KEY: &str = "app.fab";

fn dns_part(text: &str) -> String {
    let s: String = text
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    let s = s.trim_matches('-').to_owned();
    if s.is_empty() { "run".into() } else { s }
}

/// An object as JSON with `apiVersion` and `kind` first (k8s-openapi types leave them out).
fn with_kind(
    object: &impl serde::Serialize,
    api_version: &str,
    kind: &str,
) -> anyhow::Result<serde_json::Value> {
    let mut map = serde_json::Map::new();
    map.insert("apiVersion".into(), api_version.into());
    map.insert("kind".into(), kind.into());
    if let serde_json::Value::Object(rest) = serde_json::to_value(object)? {
        for (k, v) in rest {
            if k != "apiVersion" && k != "kind" && k != "status" {
                map.insert(k, v);
            }
        }
    }
    Ok(serde_json::Value::Object(map))
}

/// Where `submit` writes a standalone run: `<manifests>/flowerrun-<ns>-<name>.yaml`.
fn standalone_file(state_dir: &Path, ns: &str, name: &str) -> anyhow::Result<PathBuf> {
    let status = crate::standalone::status::HubStatus::read(state_dir).with_context(|| {
        format!(
            "reading {}/status.json: is `flower-hub serve --standalone --state-dir {}` running?",
            state_dir.display(),
            state_dir.display()
        )
    })?;
    let manifests = status.manifests_dir.with_context(|| {
        "the running hub did not record its manifests directory (an older flower-hub?): \
         restart `flower-hub serve --standalone`"
    })?;
    Ok(PathBuf::from(manifests).join(format!("flowerrun-{ns}-{name}.yaml")))
}

fn write_new(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("yaml.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

async fn get(hub: &Hub, ns: &str, name: &str) -> anyhow::Result<FlowerRunStatus> {
    match hub {
        Hub::Kube { client, .. } => {
            let runs: kube::Api<FlowerRun> = kube::Api::namespaced(client.clone(), ns);
            let run = runs.get_opt(name).await?.with_context(|| {
                format!("no FlowerRun {ns}/{name}; list them with `flower-hub run list`")
            })?;
            Ok(run.status.unwrap_or_default())
        }
        Hub::File { dir, .. } => {
            let status = crate::standalone::status::HubStatus::read(dir)
                .with_context(|| format!("reading {}/status.json", dir.display()))?;
            status
                .runs
                .into_iter()
                .find(|r| r.namespace == ns && r.name == name)
                .map(|r| r.status)
                .with_context(|| {
                    format!(
                        "no FlowerRun {ns}/{name} in the hub's status (a new run shows up within a \
                         second); list them with `flower-hub run list --state-dir {}`",
                        dir.display()
                    )
                })
        }
    }
}

/// Prints new log lines (and rounds) until the run ends: success when it completed.
async fn follow(hub: &Hub, ns: &str, name: &str, print_log: bool) -> anyhow::Result<ExitCode> {
    let mut printed: Vec<String> = Vec::new();
    let mut last_round = String::new();
    let mut missing_since: Option<std::time::Instant> = None;
    loop {
        let status = match get(hub, ns, name).await {
            Ok(s) => {
                missing_since = None;
                s
            }
            // The standalone hub lists a new run within a pass: give it a few seconds.
            Err(e)
                if missing_since
                    .is_none_or(|t| t.elapsed() < std::time::Duration::from_secs(10)) =>
            {
                missing_since.get_or_insert_with(std::time::Instant::now);
                tracing::debug!(error = %e, "waiting for the run to be listed");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        if print_log {
            for line in new_lines(&printed, &status.log_tail) {
                println!("{}", crate::core::text::printable(line));
            }
            printed = status.log_tail.clone();
            if let Some(p) = &status.progress
                && p.text != last_round
            {
                eprintln!("[{name}] round {}", p.text);
                last_round = p.text.clone();
            }
        }
        let condition = |t: &str| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == t && c.status == "True")
        };
        if let Some(c) = condition(flower_addon_crds::run::RUN_COMPLETE) {
            eprintln!("FlowerRun {ns}/{name}: Complete ({})", c.message);
            return Ok(ExitCode::SUCCESS);
        }
        if let Some(c) = condition(flower_addon_crds::run::RUN_FAILED) {
            eprintln!("FlowerRun {ns}/{name}: Failed, {}: {}", c.reason, c.message);
            return Ok(ExitCode::FAILURE);
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// The lines of `now` after the longest overlap of `before`'s end with `now`'s start (the tail
/// is a sliding window of the last lines).
fn new_lines<'a>(before: &[String], now: &'a [String]) -> &'a [String] {
    for start in 0..before.len() {
        let overlap = &before[start..];
        if now.starts_with(overlap) {
            return &now[overlap.len()..];
        }
    }
    now
}

#[cfg(test)]
mod tests;

//! `flower-agent run`.
use super::join::{JoinSourceArgs, KubeContext, StoreArgs, join_options, open_store};
use crate::channel::{RunOptions, run as run_channel};
use crate::kube_runtime::{Allowance, Applier, KubeRuntime, PodPolicy, PodSecurityLevel};
use crate::process_runtime::{ProcessRuntime, ProcessRuntimeConfig};
use crate::runtime::{MemoryRuntime, Runtime};
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// Which runtime applies the work.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeKind {
    /// Server-side apply of StatefulSets/DaemonSets in this cluster.
    Kubernetes,
    /// Supervised `flower-supernode` processes on this machine.
    Process,
    /// Record the work and report it ready, run nothing (testing the channel).
    Noop,
}

/// Arguments of `flower-agent run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Where the credentials are (`--state-dir` as written by `flower-agent join`, or
    /// `--credentials-secret`).
    #[command(flatten)]
    pub store: StoreArgs,
    /// How to join when the store holds no credentials yet (e.g. `--bootstrap-secret`). Without
    /// any, an agent that never joined stops with an error.
    #[command(flatten)]
    pub source: JoinSourceArgs,
    /// Run as the Open Cluster Management addon (manifests/ocm): the certificate and key are in
    /// this directory, where the Deployment mounts the Secret OCM's klusterlet keeps them in
    /// (`/managed/flower-addon.io-work-channel`). No join and no token: with --hub and --ca-hash
    /// (the AddOnDeploymentConfig's variables); the cluster name is the certificate's.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["state_dir", "credentials_secret", "bootstrap_secret", "token", "token_file"])]
    pub ocm_addon_dir: Option<PathBuf>,
    /// Runtime that applies the work.
    #[arg(long, value_enum, default_value = "process")]
    pub runtime: RuntimeKind,
    /// Kubernetes runtime: make the Namespace NAME the owner (`metadata.ownerReferences`) of
    /// every object this agent applies (SuperNode workloads, their key Secrets, CA Secrets and
    /// Services), so Kubernetes' garbage collector removes them when that namespace goes. The
    /// OCM addon passes its install namespace, which OCM's work agent deletes when the addon is
    /// disabled on this cluster or the cluster leaves OCM: no SuperNode outlives its agent.
    /// Without it, the workloads stay when the agent goes (uninstall with the agent's own
    /// manifests, which prune nothing on their own).
    #[arg(long, value_name = "NAME")]
    pub owner_namespace: Option<String>,
    /// Directory holding `flower-supernode` (a venv's `bin/`; process runtime). Default: PATH.
    #[arg(long, env = "FLOWER_BIN_DIR")]
    pub flower_bin: Option<PathBuf>,
    /// First local port tried for SuperNode Runtime/ClientAppIO APIs (process runtime). Give
    /// agents sharing one machine distinct ranges.
    #[arg(long, default_value_t = 19100)]
    pub port_base: u16,
    /// Value of `{node}` (process runtime). Default: the host name.
    #[arg(long)]
    pub node_name: Option<String>,
    /// Process runtime: run each SuperNode (and its ClientApps) in a mount namespace where the
    /// state directory is empty but for its Federation's own directory, so code a ServerApp
    /// sends cannot read this agent's key or other Federations' files; an agent run as root also
    /// runs them as an unprivileged uid of their Federation's own, without capabilities, in a
    /// PID namespace of their own. Needs root or unprivileged user namespaces; `false` turns it
    /// off.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub supernode_sandbox: bool,
    /// Process runtime, with the sandbox: `isolated` runs each SuperNode (with its ClientApps
    /// and SuperExec) in a network namespace of its own that reaches only its SuperLink's Fleet
    /// API (through this agent), so a ClientApp cannot reach another Federation's SuperNodes or
    /// Control API on this machine, nor the network. `host`: the machine's network (ClientApps
    /// that download data need it). `--supernode-sandbox false` implies `host`.
    #[arg(long, value_enum, default_value_t = crate::netns::NetworkMode::Isolated)]
    pub supernode_network: crate::netns::NetworkMode,
    /// How often the observed status is checked (sent only when it changed), e.g. `5s`.
    #[arg(long, default_value = "3s", value_parser = super::join::parse_duration)]
    pub status_interval: std::time::Duration,
    /// The spoke admin's pod policy (Kubernetes runtime).
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// `/metrics`, `/healthz` and `/readyz` (ready once credentials are loaded and the runtime
    /// is up).
    #[command(flatten)]
    pub ops: crate::ops::OpsArgs,
}

/// What the pods of the work this cluster receives may do (Kubernetes runtime). A Federation
/// whose pods do more is refused here, with the flag that would allow it.
#[derive(clap::Args, Debug, Clone)]
pub struct PolicyArgs {
    /// Allow pods to use this (comma-separated or repeated): host-path, host-network, host-pid,
    /// host-ipc, privileged, host-port, other-volumes, secrets, unconfined, run-as-root,
    /// service-account-token; and
    /// weaker-namespaces (work in an existing namespace whose Pod Security label is weaker than
    /// --namespace-pod-security). Default: none (e.g. AMD GPU pools need
    /// `--allow privileged,host-path --namespace-pod-security privileged`: the API server
    /// refuses such pods in namespaces labelled baseline, and so does this flag at start).
    #[arg(long = "allow", value_delimiter = ',', value_parser = parse_allowance)]
    pub allow: Vec<Allowance>,
    /// A service account pods may name besides `default` (repeatable).
    #[arg(long = "allow-service-account", value_name = "NAME")]
    pub allow_service_account: Vec<String>,
    /// Pod Security Standards level of the namespaces work goes to (`enforce`, `audit`, `warn`
    /// labels): set on those the agent creates and on existing ones without an `enforce` label;
    /// work in an existing namespace with a weaker `enforce` label is refused (see --allow).
    /// `none`: namespaces are neither labelled nor checked.
    #[arg(long, default_value = "baseline", value_parser = parse_level)]
    pub namespace_pod_security: PodSecurityLevel,
    /// The only namespaces work may go to (comma-separated or repeated), for an agent whose RBAC
    /// is a Role in each of them (Helm value `agent.namespaces`) instead of cluster-wide; work
    /// for any other namespace is refused with a message naming this flag. Default: any
    /// namespace but kube-system, kube-public and kube-node-lease.
    #[arg(long = "namespaces", value_name = "NAMESPACE", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Marks the objects this agent applies (label `flower-addon.io/installation`); it prunes
    /// and updates only objects with it. Default: derived from where its credentials are kept,
    /// so two agents in one cluster (joined to two hubs) never touch each other's objects.
    #[arg(long, value_name = "ID")]
    pub installation_id: Option<String>,
}

/// `--allow NAME`.
pub fn parse_allowance(name: &str) -> Result<Allowance, String> {
    name.parse()
}

/// `--namespace-pod-security LEVEL`.
pub fn parse_level(name: &str) -> Result<PodSecurityLevel, String> {
    name.parse()
}

impl PolicyArgs {
    /// The policy these flags describe.
    pub fn policy(&self) -> anyhow::Result<PodPolicy> {
        let mut policy = PodPolicy::allowing(
            flower_addon_crds::policy::Admin::Spoke,
            &self.allow,
            &self.allow_service_account,
        )
        .map_err(anyhow::Error::msg)?;
        for name in &self.namespaces {
            flower_addon_crds::dns_label(name).map_err(|why| {
                anyhow::anyhow!("--namespaces {name:?}: {why} (a namespace name)")
            })?;
        }
        policy.namespaces =
            (!self.namespaces.is_empty()).then(|| self.namespaces.iter().cloned().collect());
        policy.namespace_level = self.namespace_pod_security;
        Ok(policy)
    }

    /// `--installation-id`, or the first 16 hex digits of the SHA-256 of `store` (where the
    /// credentials are kept).
    pub fn installation_id(&self, store: &str) -> anyhow::Result<String> {
        use sha2::Digest;
        let id = match &self.installation_id {
            Some(id) => id.clone(),
            None => hex::encode(sha2::Sha256::digest(store.as_bytes()))[..16].to_owned(),
        };
        let valid = !id.is_empty()
            && id.len() <= 63
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && id.as_bytes()[0].is_ascii_alphanumeric()
            && id.as_bytes()[id.len() - 1].is_ascii_alphanumeric();
        anyhow::ensure!(
            valid,
            "--installation-id {id:?}: must be a label value (at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
        );
        Ok(id)
    }
}

/// `flower-agent run`.
///
/// The process runtime stops its SuperNodes when the agent stops (an edge device runs nothing it
/// does not supervise); the Kubernetes runtime leaves the workloads running. Neither removes
/// anything because the hub is unreachable.
pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    if args.runtime == RuntimeKind::Process && args.store.state_dir.is_none() {
        anyhow::bail!(
            "--runtime process keeps its SuperNodes' keys and files in --state-dir: give --state-dir DIR"
        );
    }
    if args.runtime == RuntimeKind::Kubernetes
        && let Some(why) = args.policy.policy()?.level_conflict("flower-agent run")
    {
        anyhow::bail!(why);
    }
    if let Some(name) = &args.owner_namespace {
        anyhow::ensure!(
            args.runtime == RuntimeKind::Kubernetes,
            "--owner-namespace {name:?} makes a Namespace own the objects the Kubernetes runtime applies: give --runtime kubernetes, or leave it out"
        );
        flower_addon_crds::dns_label(name).map_err(|why| {
            anyhow::anyhow!("--owner-namespace {name:?}: {why} (a namespace name)")
        })?;
    }
    // One thread: everything the agent does waits on the network or its children, and a
    // worker per core (with a malloc arena each) would make its memory grow with the machine.
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    tokio.block_on(async move {
        let health = crate::ops::Health::new(&["credentials", "runtime"]);
        crate::ops::serve(
            &args.ops,
            crate::ops::Metrics {
                registry: crate::metrics::registry(),
                refresh: Some(Arc::new(|| Box::pin(async { crate::metrics::refresh() }))),
            },
            health.clone(),
        )
        .await?;
        let mut kube = KubeContext::default();
        if let Some(dir) = &args.ocm_addon_dir {
            anyhow::ensure!(
                args.runtime != RuntimeKind::Process,
                "--ocm-addon-dir is for an agent in a Kubernetes cluster installed by OCM: give --runtime kubernetes"
            );
            let hub = crate::ocm_addon::AddonHub {
                hub: args.source.hub.clone().context(
                    "--ocm-addon-dir needs --hub HOST:PORT (the AddOnDeploymentConfig's FLOWER_HUB_ADDRESS)",
                )?,
                ca_hash: args.source.ca_hash.clone().context(
                    "--ocm-addon-dir needs --ca-hash sha256:… (the AddOnDeploymentConfig's FLOWER_HUB_CA_HASH, printed by `flower-hub ca status`)",
                )?,
                server_name: args.source.server_name.clone(),
            };
            let mut progress = |line: &str| eprintln!("flower-agent: {line}");
            let credentials = crate::ocm_addon::credentials(dir, &hub, &mut progress).await?;
            if let Some(name) = &args.source.cluster_name {
                anyhow::ensure!(
                    *name == credentials.config.cluster_name,
                    "--cluster-name {name:?}, but the certificate OCM's klusterlet holds is cluster {:?}'s",
                    credentials.config.cluster_name
                );
            }
            tracing::info!(cluster = %credentials.config.cluster_name, hub = %hub.hub, "running as the OCM addon");
            health.set("credentials", true);
            let mut options = RunOptions::with_store(credentials, None);
            options.ocm_addon_dir = Some(dir.clone());
            let describe = format!("ocm addon {}", dir.display());
            return run_with(args, options, kube, describe, health).await;
        }
        let store = open_store(&args.store, &mut kube).await?;
        let can_join = args.source.bootstrap_secret.is_some() || args.source.token.is_some();
        let stored = store.load().await?;
        // An expired certificate cannot be renewed: re-join (same key) when told how.
        let stored = match stored {
            Some(c) if can_join && crate::channel::expired(&c).is_some() => {
                tracing::warn!(cluster = %c.config.cluster_name, "the client certificate has expired; re-joining with the stored key");
                None
            }
            other => other,
        };
        let credentials = match stored {
            Some(c) => c,
            None if can_join => {
                let options = join_options(
                    &args.source,
                    store.clone(),
                    args.store.namespace.as_deref(),
                    &mut kube,
                    None,
                    true,
                )
                .await?;
                let mut progress = |line: &str| eprintln!("flower-agent: {line}");
                crate::join::join(&options, &mut progress).await?
            }
            None => anyhow::bail!(
                "no credentials in {}: join first (`flower-agent join …`), or give --bootstrap-secret NAME to join from a Secret",
                store.describe()
            ),
        };
        health.set("credentials", true);
        // A pod that can re-join from its bootstrap Secret stops on expiry, so its restart does.
        let exit_when_expired =
            matches!(store, crate::credentials::CredentialStore::Secret(_)) && can_join;
        let describe = store.describe();
        let mut options = RunOptions::with_store(credentials, Some(store));
        options.exit_when_expired = exit_when_expired;
        run_with(args, options, kube, describe, health).await
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Runs the channel with `options` on the runtime `args` name (`describe`: where the
/// credentials are, for the installation id) until a signal.
async fn run_with(
    args: RunArgs,
    mut options: RunOptions,
    mut kube: KubeContext,
    describe: String,
    health: Arc<crate::ops::Health>,
) -> anyhow::Result<()> {
    let mut process: Option<Arc<ProcessRuntime>> = None;
    let runtime: Arc<dyn Runtime> = match args.runtime {
        RuntimeKind::Noop => Arc::new(MemoryRuntime::new()),
        RuntimeKind::Process => {
            let state_dir = args.store.state_dir.clone().unwrap_or_default();
            let node_name = match args.node_name.clone() {
                Some(n) => n,
                None => nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
                    .unwrap_or_else(|| "localhost".into()),
            };
            // SuperNodes run in subdirectories: every path handed to them must be absolute.
            let absolute = |p: &std::path::Path| {
                std::fs::canonicalize(p).with_context(|| format!("resolve {}", p.display()))
            };
            let rt = Arc::new(ProcessRuntime::new(ProcessRuntimeConfig {
                state_dir: absolute(&state_dir)?,
                flower_bin: args.flower_bin.as_deref().map(absolute).transpose()?,
                port_base: args.port_base,
                node_name,
                hide: args
                    .supernode_sandbox
                    .then(|| absolute(&state_dir))
                    .transpose()?,
                bridge: (args.supernode_sandbox
                    && args.supernode_network == crate::netns::NetworkMode::Isolated)
                    .then(std::env::current_exe)
                    .transpose()
                    .context("--supernode-network isolated: cannot find the flower-agent binary")?,
            })?);
            process = Some(rt.clone());
            rt
        }
        RuntimeKind::Kubernetes => {
            let (client, _) = kube.get(args.store.namespace.as_deref()).await?;
            let id = args.policy.installation_id(&describe)?;
            let policy = args.policy.policy()?;
            tracing::info!(installation = %id, ?policy, "pod policy");
            let mut applier = Applier::agent().with_installation(id);
            if let Some(name) = &args.owner_namespace {
                let owner = namespace_owner(&client, name).await?;
                tracing::info!(namespace = %name, uid = %owner.uid, "every object applied is owned by this namespace");
                applier = applier.with_owner(owner);
            }
            Arc::new(KubeRuntime::with_applier(client, applier).with_policy(policy))
        }
    };
    health.set("runtime", true);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        super::shutdown_signal().await;
        tracing::info!("stopping");
        let _ = stop_tx.send(true);
    });
    options.status_interval = args.status_interval;
    let result = run_channel(options, runtime, stop_rx).await;
    if let Some(rt) = process {
        tracing::info!("stopping this agent's SuperNodes");
        rt.shutdown().await;
    }
    result.map_err(anyhow::Error::from)
}

/// The owner reference of the Namespace `name` (`--owner-namespace`).
async fn namespace_owner(
    client: &kube::Client,
    name: &str,
) -> anyhow::Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    use k8s_openapi::api::core::v1::Namespace;
    let ns = kube::Api::<Namespace>::all(client.clone())
        .get_opt(name)
        .await
        .with_context(|| format!("--owner-namespace {name}: read the Namespace"))?
        .with_context(|| {
            format!(
                "--owner-namespace {name}: no such Namespace (the OCM addon passes its own, $(POD_NAMESPACE))"
            )
        })?;
    let uid = ns
        .metadata
        .uid
        .with_context(|| format!("--owner-namespace {name}: the Namespace has no uid"))?;
    anyhow::ensure!(
        ns.metadata.deletion_timestamp.is_none(),
        "--owner-namespace {name}: the Namespace is being deleted; objects it owned would go with it"
    );
    Ok(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Namespace".to_owned(),
            name: name.to_owned(),
            uid,
            controller: None,
            block_owner_deletion: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(id: Option<&str>, accounts: &[&str]) -> PolicyArgs {
        PolicyArgs {
            allow: vec![Allowance::Privileged],
            allow_service_account: accounts.iter().map(|a| a.to_string()).collect(),
            namespace_pod_security: PodSecurityLevel::Restricted,
            namespaces: Vec::new(),
            installation_id: id.map(str::to_owned),
        }
    }

    #[test]
    fn the_installation_id_is_stable_per_store_and_checked_as_a_label_value() {
        let a = args(None, &[]);
        let id = a
            .installation_id("secret flower-addon-agent/flower-agent-credentials")
            .expect("id");
        assert_eq!(id.len(), 16);
        assert_eq!(
            a.installation_id("secret flower-addon-agent/flower-agent-credentials")
                .expect("id"),
            id
        );
        assert_ne!(
            a.installation_id("directory /var/lib/agent").expect("id"),
            id
        );
        assert_eq!(
            args(Some("hub-a"), &[]).installation_id("x").expect("id"),
            "hub-a"
        );
        let bad = args(Some("-no/"), &[]).installation_id("x").unwrap_err();
        assert!(bad.to_string().contains("--installation-id"), "{bad}");
    }

    #[test]
    fn the_flags_make_the_policy_and_bad_names_are_refused() {
        let policy = args(None, &["trainer"]).policy().expect("policy");
        assert!(policy.allowed.contains(&Allowance::Privileged));
        assert!(policy.service_accounts.contains("trainer"));
        assert_eq!(policy.namespace_level, PodSecurityLevel::Restricted);
        let bad = args(None, &["Not_A_Name"]).policy().unwrap_err();
        assert!(bad.to_string().contains("--allow-service-account"), "{bad}");
        assert_eq!(policy.namespaces, None);
        let mut scoped = args(None, &[]);
        scoped.namespaces = vec!["team-a".into(), "team-b".into()];
        assert_eq!(
            scoped.policy().expect("policy").namespaces,
            Some(["team-a".to_owned(), "team-b".to_owned()].into())
        );
        scoped.namespaces.push("Team_C".into());
        let bad = scoped.policy().unwrap_err();
        assert!(bad.to_string().contains("--namespaces \"Team_C\""), "{bad}");
    }
}

//! `flower-agent join`.
use crate::bootstrap::{self, JoinSettings};
use crate::credentials::CredentialStore;
use crate::join::{JoinOptions, join as join_hub};
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Where the agent keeps its credentials: a directory, or a Secret in its namespace.
#[derive(clap::Args, Debug, Clone)]
pub struct StoreArgs {
    /// Directory for the key and credentials (files 0600); standalone and edge agents. One of
    /// --state-dir and --credentials-secret is needed (or, for `run`, --ocm-addon-dir).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Keep the key and credentials in this Secret of --namespace instead (agents in a
    /// Kubernetes cluster; the API is reached through KUBECONFIG or the in-cluster config).
    #[arg(long, conflicts_with = "state_dir")]
    pub credentials_secret: Option<String>,
    /// Namespace of the credential and bootstrap Secrets. Default: the kubeconfig's namespace
    /// (in a pod: its own).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
}

/// How to join: flags, or a bootstrap Secret (flags override its values).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct JoinSourceArgs {
    /// `HOST:PORT` of the hub's work channel (as printed by `flower-hub token create`).
    #[arg(long)]
    pub hub: Option<String>,
    /// Bootstrap token `<id>.<secret>` from `flower-hub token create`. Prefer --token-file (or
    /// the environment): a command-line argument is visible to every user of the machine.
    #[arg(long, env = "FLOWER_AGENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Read the bootstrap token from this file (`-`: standard input), e.g.
    /// `printf '%s\n' "$TOKEN" | flower-agent join --token-file - …`.
    #[arg(long, conflicts_with = "token", value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// `sha256:<hex>` of the hub CA's public key; the agent refuses a hub that does not match.
    #[arg(long)]
    pub ca_hash: Option<String>,
    /// Name to register this cluster under (DNS-1123 label).
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// Label this cluster asserts about itself, `key=value` (repeatable). The hub records it as a
    /// claim only: placement uses the labels the admin gives (`flower-hub accept --label`,
    /// `token create --label`), never what an agent says.
    #[arg(long = "label", value_parser = parse_pair)]
    pub labels: Vec<(String, String)>,
    /// Cluster claim reported to the hub, `name=value` (repeatable).
    #[arg(long = "claim", value_parser = parse_pair)]
    pub claims: Vec<(String, String)>,
    /// Name the hub's certificate must carry (default: the host of --hub).
    #[arg(long)]
    pub server_name: Option<String>,
    /// Read hub, token, caHash, clusterName (and serverName, labels, claims) from this Secret of
    /// --namespace, as `flower-hub token create -o secret` prints it.
    #[arg(long)]
    pub bootstrap_secret: Option<String>,
}

/// Arguments of `flower-agent join`.
#[derive(clap::Args, Debug)]
pub struct JoinArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub source: JoinSourceArgs,
    /// Stop waiting for acceptance after this long (e.g. `10m`; default: wait forever).
    #[arg(long, value_parser = humantime_duration)]
    pub timeout: Option<Duration>,
}

/// The Kubernetes client and namespace, made on first use.
#[derive(Default)]
pub struct KubeContext {
    client: Option<(kube::Client, String)>,
}

impl KubeContext {
    /// The client (KUBECONFIG or in-cluster) and the namespace (`namespace`, else the client's).
    pub async fn get(&mut self, namespace: Option<&str>) -> anyhow::Result<(kube::Client, String)> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let client = kube::Client::try_default().await.context(
            "connect to this cluster's Kubernetes API (in-cluster config or KUBECONFIG)",
        )?;
        let ns = namespace
            .map(str::to_string)
            .unwrap_or_else(|| client.default_namespace().to_string());
        self.client = Some((client.clone(), ns.clone()));
        Ok((client, ns))
    }
}

/// Opens the credential store `args` name.
pub async fn open_store(
    args: &StoreArgs,
    kube: &mut KubeContext,
) -> anyhow::Result<CredentialStore> {
    match (&args.state_dir, &args.credentials_secret) {
        (Some(dir), _) => Ok(CredentialStore::Dir(dir.clone())),
        (None, Some(name)) => {
            let (client, ns) = kube.get(args.namespace.as_deref()).await?;
            Ok(CredentialStore::secret(client, &ns, name))
        }
        (None, None) => anyhow::bail!("give --state-dir DIR or --credentials-secret NAME"),
    }
}

/// The token in `file` (`-`: standard input): its first line, trimmed; an empty one is refused.
fn read_token_file(file: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let text = if file.as_os_str() == "-" {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .context("--token-file -: cannot read the token from standard input")?;
        line
    } else {
        std::fs::read_to_string(file).with_context(|| format!("--token-file {}", file.display()))?
    };
    let token = text.lines().next().unwrap_or_default().trim().to_owned();
    anyhow::ensure!(
        !token.is_empty(),
        "--token-file {}: no token in it (expected `<id>.<secret>` from `flower-hub token create`)",
        file.display()
    );
    Ok(token)
}

/// Join options from the flags and, if named, the bootstrap Secret. With `wait_for_secret` a
/// missing Secret is waited for (a pod may start before the admin creates it).
pub async fn join_options(
    source: &JoinSourceArgs,
    store: CredentialStore,
    namespace: Option<&str>,
    kube: &mut KubeContext,
    max_wait: Option<Duration>,
    wait_for_secret: bool,
) -> anyhow::Result<JoinOptions> {
    let token = match &source.token_file {
        Some(file) => Some(read_token_file(file)?),
        None => source.token.clone(),
    };
    let flags = JoinSettings {
        hub: source.hub.clone(),
        token,
        ca_hash: source.ca_hash.clone(),
        cluster_name: source.cluster_name.clone(),
        server_name: source.server_name.clone(),
        labels: source.labels.iter().cloned().collect::<BTreeMap<_, _>>(),
        claims: source.claims.iter().cloned().collect::<BTreeMap<_, _>>(),
    };
    let Some(name) = &source.bootstrap_secret else {
        return Ok(flags.into_options(store, "the flags", max_wait)?);
    };
    let (client, ns) = kube.get(namespace).await?;
    let label = format!("{ns}/{name}");
    let mut announced = false;
    let data = loop {
        match bootstrap::read_secret(&client, &ns, name)
            .await
            .with_context(|| format!("read the bootstrap secret {label}"))?
        {
            Some(data) => break data,
            None if wait_for_secret => {
                if !announced {
                    eprintln!(
                        "flower-agent: waiting for the bootstrap secret {label}: on the hub run `flower-hub token create --cluster-name NAME -o secret --agent-namespace {ns}` and apply its output here"
                    );
                    announced = true;
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            None => anyhow::bail!(
                "bootstrap secret {label} not found: on the hub run `flower-hub token create --cluster-name NAME -o secret --agent-namespace {ns}` and apply its output here"
            ),
        }
    };
    let settings = JoinSettings::from_secret_data(&data, &label)?.overlaid_by(flags);
    Ok(settings.into_options(store, &format!("secret {label} or the flags"), max_wait)?)
}

pub use flower_addon_runtime::cli::{parse_duration, parse_pair};

fn humantime_duration(s: &str) -> Result<Duration, String> {
    parse_duration(s)
}

/// `flower-agent join`: joins (again, idempotently with the stored key) and stores the
/// credentials.
pub fn join(args: JoinArgs) -> anyhow::Result<ExitCode> {
    // One thread: everything the agent does waits on the network or its children, and a
    // worker per core (with a malloc arena each) would make its memory grow with the machine.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(async {
        let mut kube = KubeContext::default();
        let store = open_store(&args.store, &mut kube).await?;
        let options = join_options(
            &args.source,
            store,
            args.store.namespace.as_deref(),
            &mut kube,
            args.timeout,
            false,
        )
        .await?;
        let mut progress = |line: &str| eprintln!("flower-agent: {line}");
        join_hub(&options, &mut progress).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_gives_its_first_line_and_an_empty_one_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("token");
        std::fs::write(&file, "  abcdef.0123456789abcdef \nsecond line\n").expect("write");
        assert_eq!(
            read_token_file(&file).expect("token"),
            "abcdef.0123456789abcdef"
        );
        std::fs::write(&file, "\n").expect("write");
        let err = read_token_file(&file).expect_err("empty").to_string();
        assert!(err.contains("no token in it"), "{err}");
        let err = read_token_file(&dir.path().join("missing"))
            .expect_err("missing")
            .to_string();
        assert!(err.contains("--token-file"), "{err}");
    }
}

//! Registration commands: `token create|list|delete`, `accept`, `revoke`, `status`.
//!
//! With `--state-dir` (or `FLOWER_HUB_STATE_DIR`) they work on a standalone hub's state
//! directory, also while `flower-hub serve --standalone` runs (it notices changes within a
//! second). Without it they work on the hub cluster's Kubernetes API (`--kubeconfig`,
//! `--context`, else KUBECONFIG or in-cluster): ManagedClusters, token Secrets and the CA Secret
//! in `--namespace`, the same objects `flower-hub serve` uses.
use crate::kube::store::KubeStore;
use crate::registration::store::file::FileStore;
use crate::registration::store::{
    CONDITION_AVAILABLE, ClusterRecord, ClusterStore, StoreError, load_or_create_ca,
};
use crate::registration::tokens;
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

mod kube_api;
mod secret;

pub use secret::{Bootstrap, bootstrap_secret, bootstrap_secret_yaml};

/// Default port of the work channel.
pub const DEFAULT_PORT: u16 = 9443;

/// `flower-hub token …`.
#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a bootstrap token and print a ready-to-paste `flower-agent join` line (or, with
    /// `-o secret`, the agent's bootstrap Secret).
    #[command(
        after_help = "Examples:\n  flower-hub token create --cluster-name spoke-1 --label env=prod -o secret > spoke-1-bootstrap.yaml\n  flower-hub token create --state-dir /var/lib/flower-hub --ttl 24h"
    )]
    Create(TokenCreateArgs),
    /// List bootstrap tokens (ids and expiry; secrets are not stored).
    #[command(after_help = "Example:\n  flower-hub token list --state-dir /var/lib/flower-hub")]
    List(HubArgs),
    /// Delete (revoke) a bootstrap token by id.
    #[command(after_help = "Example:\n  flower-hub token delete abcdef")]
    Delete(TokenDeleteArgs),
}

/// Which hub a command works on: a standalone hub's state directory, or the hub cluster's API.
#[derive(clap::Args, Debug, Clone)]
pub struct HubArgs {
    /// State directory of a standalone hub (tokens, clusters, CA). Without it the command works
    /// on the hub cluster's Kubernetes API.
    #[arg(long, env = "FLOWER_HUB_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Kubeconfig of the hub cluster (default: KUBECONFIG, ~/.kube/config, else in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context of the hub cluster (default: the current context).
    #[arg(long)]
    pub context: Option<String>,
    /// Namespace of the hub in Kubernetes mode (CA and token Secrets, Service flower-hub).
    #[arg(long, env = "POD_NAMESPACE", default_value = "flower-addon-system")]
    pub namespace: String,
}

/// Output format of `status`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Human-readable lines.
    Text,
    /// One JSON object.
    Json,
}

/// Output format of `token create`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenOutput {
    /// Human-readable lines and the `flower-agent join` command.
    Text,
    /// One JSON object.
    Json,
    /// The agent's bootstrap Secret as YAML, for `kubectl apply -f -` on the spoke cluster
    /// (needs --cluster-name).
    Secret,
}

/// Arguments of `flower-hub token create`.
#[derive(clap::Args, Debug)]
pub struct TokenCreateArgs {
    #[command(flatten)]
    hub_args: HubArgs,
    /// Lifetime of the token (e.g. `30m`, `24h`, `7d`).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub ttl: Duration,
    /// `HOST:PORT` agents dial (default: standalone, the address `serve` advertises; Kubernetes,
    /// derived from the Service flower-hub).
    #[arg(long)]
    pub hub: Option<String>,
    /// Name the hub certificate is verified by (default in Kubernetes mode:
    /// `flower-hub.<namespace>.svc`; standalone: the host of --hub).
    #[arg(long)]
    pub server_name: Option<String>,
    /// Free text stored with the token.
    #[arg(long, default_value = "")]
    pub description: String,
    /// Bind the token to this cluster name: it joins only as NAME, and it is the only kind of
    /// token that binds a ManagedCluster an admin created before the agent joined (required with
    /// `-o secret`; used in the printed join command).
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// Label the cluster gets, `key=value` (repeatable): the admin's labels, which placement
    /// and `serve --auto-accept` match. Labels an agent reports itself are recorded as claims.
    #[arg(long = "label", value_parser = flower_addon_agent::cli::join::parse_pair)]
    pub labels: Vec<(String, String)>,
    /// How many clusters the token may register (unlimited when absent); re-joins of a cluster
    /// already registered with the same key do not count.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub uses: Option<u32>,
    /// Cluster claim the agent reports, `name=value` (repeatable).
    #[arg(long = "claim", value_parser = flower_addon_agent::cli::join::parse_pair)]
    pub claims: Vec<(String, String)>,
    /// Name of the bootstrap Secret (`-o secret`).
    #[arg(long, default_value = secret::DEFAULT_SECRET_NAME)]
    pub secret_name: String,
    /// Namespace of the agent, where the bootstrap Secret goes (`-o secret`).
    #[arg(long, default_value = secret::DEFAULT_AGENT_NAMESPACE)]
    pub agent_namespace: String,
    /// Output format; JSON has keys `token`, `caHash`, `hub`, `expires`, `joinCommand` and
    /// `serverName` when known; `secret` prints the agent's bootstrap Secret.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: TokenOutput,
}

/// Arguments of `flower-hub token delete`.
#[derive(clap::Args, Debug)]
pub struct TokenDeleteArgs {
    #[command(flatten)]
    hub_args: HubArgs,
    /// Token id (the part before the dot) or the whole token.
    pub id: String,
}

/// Arguments of `flower-hub accept`.
#[derive(clap::Args, Debug)]
pub struct AcceptArgs {
    /// Name of the ManagedCluster to accept.
    pub cluster: String,
    /// Label to give the cluster, `key=value` (repeatable), set before it is accepted. Labels
    /// are the admin's (placement selects on them); what the agent reported is shown as claims
    /// by `flower-hub status`.
    #[arg(long = "label", value_parser = flower_addon_agent::cli::join::parse_pair)]
    pub labels: Vec<(String, String)>,
    #[command(flatten)]
    hub_args: HubArgs,
}

/// Arguments of `flower-hub revoke`.
#[derive(clap::Args, Debug)]
pub struct RevokeArgs {
    /// Name of the ManagedCluster to revoke (sets hubAcceptsClient=false; its stream closes and its agent stops its SuperNodes).
    pub cluster: String,
    /// Delete the cluster record too, so the name can join again with a new key.
    #[arg(long)]
    pub delete: bool,
    #[command(flatten)]
    hub_args: HubArgs,
}

/// Arguments of `flower-hub status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    hub_args: HubArgs,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: Output,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    flower_addon_agent::cli::join::parse_duration(s)
}

fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?
        .block_on(f)
}

/// The advertised `HOST:PORT` that `serve` records in the state directory.
pub fn advertised_hub(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("hub-address"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

// === Hub: the store a command works on ===

/// An opened hub: a standalone state directory or the hub cluster's API.
enum Hub {
    File {
        store: FileStore,
        dir: PathBuf,
    },
    Kube {
        store: KubeStore,
        client: kube::Client,
        namespace: String,
    },
}

/// Runs `$body` with `$s` bound to the store of `$hub`, whichever kind it is (the store trait is
/// not object-safe, so the bodies are generic and this dispatches).
macro_rules! with_store {
    ($hub:expr, $s:ident => $body:expr) => {
        match $hub {
            Hub::File { store: $s, .. } => $body,
            Hub::Kube { store: $s, .. } => $body,
        }
    };
}

impl Hub {
    async fn open(args: &HubArgs) -> anyhow::Result<Hub> {
        if let Some(dir) = &args.state_dir {
            if args.kubeconfig.is_some() || args.context.is_some() {
                anyhow::bail!(
                    "--state-dir (or FLOWER_HUB_STATE_DIR) selects a standalone hub and \
                     --kubeconfig/--context a hub in Kubernetes: pass one of them"
                );
            }
            return Ok(Hub::File {
                store: FileStore::open(dir)?,
                dir: dir.clone(),
            });
        }
        let (client, _source) =
            kube_api::connect(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
        Ok(Hub::Kube {
            store: KubeStore::without_watch(client.clone(), args.namespace.clone()),
            client,
            namespace: args.namespace.clone(),
        })
    }

    /// Where clusters come from and how to list them, for "no such cluster" messages.
    fn list_clusters_hint(&self) -> &'static str {
        match self {
            Hub::File { .. } => {
                "a cluster appears when its agent joins; list the registered clusters with \
                 `flower-hub status`"
            }
            Hub::Kube { .. } => {
                "a ManagedCluster appears when its agent joins (or create one); list them with \
                 `flower-hub status` or `kubectl get managedclusters`"
            }
        }
    }
}

/// The HTTP status of a Kubernetes API error inside a store error, if that is what it is.
fn api_code(error: &StoreError) -> Option<u16> {
    match error {
        StoreError::Io { source, .. } => match source.get_ref()?.downcast_ref::<kube::Error>()? {
            kube::Error::Api(s) => Some(s.code),
            _ => None,
        },
        _ => None,
    }
}

/// Adds what to do about common API failures (CRDs missing, namespace missing, forbidden).
fn explain(error: StoreError, hub: &Hub) -> anyhow::Error {
    let hint = match (hub, api_code(&error)) {
        (Hub::Kube { namespace, .. }, Some(404)) => Some(format!(
            "are the flower-addon CRDs installed (`flower-hub crds | kubectl apply --server-side \
             -f -`) and does namespace {namespace:?} exist (manifests/hub/namespace.yaml)?"
        )),
        (Hub::Kube { namespace, .. }, Some(403)) => Some(format!(
            "the kubeconfig's user may not do this: it needs ManagedClusters and Secrets in \
             namespace {namespace:?} (or use the hub's ServiceAccount)"
        )),
        _ => None,
    };
    match hint {
        Some(hint) => anyhow::Error::new(error).context(hint),
        None => anyhow::Error::new(error),
    }
}

// === token ===

/// `flower-hub token …`.
pub fn token(cmd: TokenCommand) -> anyhow::Result<ExitCode> {
    block_on(async move {
        match cmd {
            TokenCommand::Create(args) => token_create(args).await,
            TokenCommand::List(args) => {
                let hub = Hub::open(&args).await?;
                with_store!(&hub, s => token_list(s).await.map_err(|e| explain(e, &hub)))
            }
            TokenCommand::Delete(args) => {
                let hub = Hub::open(&args.hub_args).await?;
                let id = args.id.split('.').next().unwrap_or_default();
                let deleted = with_store!(&hub, s => s.delete_token(id).await)
                    .map_err(|e| explain(e, &hub))?;
                if deleted {
                    println!("token {id} deleted");
                    Ok(ExitCode::SUCCESS)
                } else {
                    eprintln!("flower-hub: no token with id {id:?} (see `flower-hub token list`)");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    })
}

async fn token_list<S: ClusterStore>(store: &S) -> Result<ExitCode, StoreError> {
    let now = tokens::unix_now();
    println!(
        "{:<8} {:<22} {:<8} {:<16} {:<6} {:<24} DESCRIPTION",
        "ID", "EXPIRES", "STATE", "CLUSTER", "USES", "LABELS"
    );
    for t in store.list_tokens().await? {
        let state = if now >= t.expires_unix {
            "expired"
        } else if !t.has_uses_left() {
            "used-up"
        } else {
            "valid"
        };
        let uses = match t.max_uses {
            Some(max) => format!("{}/{max}", t.uses),
            None => t.uses.to_string(),
        };
        let labels: Vec<String> = t.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let labels = if labels.is_empty() {
            "-".to_owned()
        } else {
            labels.join(",")
        };
        println!(
            "{:<8} {:<22} {:<8} {:<16} {:<6} {:<24} {}",
            t.id,
            rfc3339(t.expires_unix),
            state,
            t.cluster_name.as_deref().unwrap_or("*"),
            uses,
            labels,
            t.description
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn token_create(args: TokenCreateArgs) -> anyhow::Result<ExitCode> {
    // Everything the output needs is checked before a token exists.
    if let Some(name) = &args.cluster_name {
        crate::channel::validate_cluster_name(name)
            .map_err(|s| anyhow::anyhow!("--cluster-name: {}", s.message()))?;
    }
    if args.output == TokenOutput::Secret && args.cluster_name.is_none() {
        anyhow::bail!(
            "-o secret needs --cluster-name NAME: the bootstrap Secret says which name the agent \
             joins as"
        );
    }
    let hub = Hub::open(&args.hub_args).await?;
    let (ca, address, server_name) = match &hub {
        Hub::File { store, dir } => {
            let known = args.hub.clone().or_else(|| advertised_hub(dir));
            if known.is_none() && args.output == TokenOutput::Secret {
                anyhow::bail!(
                    "no hub address for the bootstrap Secret: pass --hub HOST:PORT (or start \
                     `flower-hub serve --standalone --advertise-address HOST` once)"
                );
            }
            let address = known.unwrap_or_else(|| format!("HUB_HOST:{DEFAULT_PORT}"));
            let ca = load_or_create_ca(store).await?;
            (ca, address, args.server_name.clone())
        }
        Hub::Kube {
            client, namespace, ..
        } => {
            let ca = super::serve::load_or_create_ca_secret(client.clone(), namespace).await?;
            let address = match &args.hub {
                Some(hub) => hub.clone(),
                None => {
                    let derived = kube_api::derive_hub_address(client, namespace).await?;
                    if !derived.resolved && args.output == TokenOutput::Secret {
                        anyhow::bail!(
                            "cannot derive the hub address for the bootstrap Secret: {}",
                            derived.hint.unwrap_or_default()
                        );
                    }
                    if let Some(hint) = &derived.hint {
                        eprintln!("flower-hub: hub address {}: {hint}", derived.address);
                    }
                    derived.address
                }
            };
            let server_name = args
                .server_name
                .clone()
                .unwrap_or_else(|| crate::kube::store::hub_service_server_name(namespace));
            (ca, address, Some(server_name))
        }
    };
    let new = tokens::generate_scoped(
        args.ttl,
        &args.description,
        tokens::TokenScope {
            cluster_name: args.cluster_name.clone(),
            labels: args.labels.iter().cloned().collect(),
            max_uses: args.uses,
        },
    );
    with_store!(&hub, s => s.put_token(&new.record).await).map_err(|e| explain(e, &hub))?;

    let bootstrap = Bootstrap {
        hub: address,
        token: new.token.clone(),
        ca_hash: ca.hash().to_string(),
        server_name,
        cluster_name: args.cluster_name.clone().unwrap_or_default(),
        labels: args.labels.iter().cloned().collect::<BTreeMap<_, _>>(),
        claims: args.claims.iter().cloned().collect::<BTreeMap<_, _>>(),
    };
    let expires = rfc3339(new.record.expires_unix);
    match args.output {
        TokenOutput::Secret => {
            print!(
                "{}",
                bootstrap_secret_yaml(&bootstrap, &args.secret_name, &args.agent_namespace)?
            );
        }
        TokenOutput::Json => {
            let mut value = serde_json::json!({
                "token": bootstrap.token,
                "caHash": bootstrap.ca_hash,
                "hub": bootstrap.hub,
                "expires": expires,
                "joinCommand": join_command(&bootstrap),
            });
            if let Some(server_name) = &bootstrap.server_name {
                value["serverName"] = server_name.clone().into();
            }
            println!("{}", serde_json::to_string_pretty(&value)?);
        }
        TokenOutput::Text => {
            // Values aligned; "serverName:" is the longest key when present.
            let w = if bootstrap.server_name.is_some() {
                12
            } else {
                9
            };
            println!("{:<w$}{}", "token:", bootstrap.token);
            println!("{:<w$}{}", "caHash:", bootstrap.ca_hash);
            println!("{:<w$}{}", "hub:", bootstrap.hub);
            if let Some(server_name) = &bootstrap.server_name {
                println!("{:<w$}{server_name}", "serverName:");
            }
            println!("{:<w$}{expires}", "expires:");
            println!();
            if bootstrap.cluster_name.is_empty() {
                println!("On the cluster or device to add, run (choose CLUSTER_NAME):");
            } else {
                println!("On the cluster or device to add, run:");
            }
            println!("  {}", join_command(&bootstrap));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The `flower-agent join` line for `b` (`CLUSTER_NAME` when no name was given).
fn join_command(b: &Bootstrap) -> String {
    let name = if b.cluster_name.is_empty() {
        "CLUSTER_NAME"
    } else {
        &b.cluster_name
    };
    let mut line = format!(
        "flower-agent join --hub {} --token {} --ca-hash {} --cluster-name {name}",
        b.hub, b.token, b.ca_hash
    );
    if let Some(server_name) = &b.server_name {
        line.push_str(&format!(" --server-name {server_name}"));
    }
    for (k, v) in &b.labels {
        line.push_str(&format!(" --label {k}={v}"));
    }
    for (k, v) in &b.claims {
        line.push_str(&format!(" --claim {k}={v}"));
    }
    line.push_str(" --state-dir /var/lib/flower-agent");
    line
}

// === accept, revoke ===

/// `flower-hub accept`.
pub fn accept(args: AcceptArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let hub = Hub::open(&args.hub_args).await?;
        let name = &args.cluster;
        let labels: BTreeMap<String, String> = args.labels.iter().cloned().collect();
        let accepted = with_store!(&hub, s => async {
            label_cluster(s, name, &labels).await?;
            s.set_accepted(name, true).await
        }
        .await);
        match accepted {
            Ok(()) => {
                if labels.is_empty() {
                    println!("cluster {name} accepted");
                } else {
                    let shown: Vec<String> =
                        labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    println!("cluster {name} labelled {} and accepted", shown.join(","));
                }
                Ok(ExitCode::SUCCESS)
            }
            Err(StoreError::NotFound { .. }) => {
                eprintln!(
                    "flower-hub: cannot accept cluster {name:?}: no such cluster on this hub; {}",
                    hub.list_clusters_hint()
                );
                Ok(ExitCode::FAILURE)
            }
            Err(e) => Err(explain(e, &hub).context(format!("accept cluster {name}"))),
        }
    })
}

/// Adds `labels` to cluster `name`'s (the admin's) labels; nothing to do when empty.
async fn label_cluster<S: ClusterStore>(
    store: &S,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), StoreError> {
    if labels.is_empty() {
        return Ok(());
    }
    let mut record = store
        .get_cluster(name)
        .await?
        .ok_or_else(|| StoreError::NotFound {
            kind: "cluster",
            name: name.to_owned(),
        })?;
    let before = record.registration.labels.clone();
    record.registration.labels.extend(labels.clone());
    if record.registration.labels != before {
        store.update_registration(&record.registration).await?;
    }
    Ok(())
}

/// `flower-hub revoke`.
pub fn revoke(args: RevokeArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let hub = Hub::open(&args.hub_args).await?;
        let name = &args.cluster;
        let missing = || {
            eprintln!(
                "flower-hub: cannot revoke cluster {name:?}: no such cluster on this hub; {}",
                hub.list_clusters_hint()
            );
            Ok(ExitCode::FAILURE)
        };
        if args.delete {
            let deleted = with_store!(&hub, s => s.delete_cluster(name).await)
                .map_err(|e| explain(e, &hub))?;
            if deleted {
                println!("cluster {name} deleted");
                return Ok(ExitCode::SUCCESS);
            }
            return missing();
        }
        match with_store!(&hub, s => s.set_accepted(name, false).await) {
            Ok(()) => {
                println!("cluster {name} revoked (hubAcceptsClient=false)");
                Ok(ExitCode::SUCCESS)
            }
            Err(StoreError::NotFound { .. }) => missing(),
            Err(e) => Err(explain(e, &hub).context(format!("revoke cluster {name}"))),
        }
    })
}

mod status;
pub use status::status;

mod connect;
pub use connect::{ConnectArgs, connect};

mod ca;
pub use ca::{CaArgs, CaCommand, RotateArgs, WhichCa, ca};

fn rfc3339(unix: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(unix)).to_string()
}

#[cfg(test)]
mod tests;

//! Registration commands: `token create|list|delete` (`token`), `accept`, `revoke`, `status`,
//! `ca` and `connect`.
//!
//! With `--state-dir` (or `FLOWER_HUB_STATE_DIR`) they work on a standalone hub's state
//! directory, also while `flower-hub serve --standalone` runs (it notices changes within a
//! second). Without it they work on the hub cluster's Kubernetes API (`--kubeconfig`,
//! `--context`, else KUBECONFIG or in-cluster): ManagedClusters, token Secrets and the CA Secret
//! in `--namespace`, the same objects `flower-hub serve` uses.
use crate::kube::store::KubeStore;
use crate::registration::store::file::FileStore;
use crate::registration::store::{CONDITION_AVAILABLE, ClusterRecord, ClusterStore, StoreError};
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

/// Arguments of `flower-hub accept`.
#[derive(clap::Args, Debug)]
pub struct AcceptArgs {
    /// Name of the ManagedCluster to accept.
    pub cluster: String,
    /// Label to give the cluster, `key=value` (repeatable), set before it is accepted. Labels
    /// are the admin's (placement selects on them); what the agent reported is shown as claims
    /// by `flower-hub status`.
    #[arg(long = "label", value_parser = flower_addon_runtime::cli::parse_pair)]
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
    flower_addon_runtime::cli::parse_duration(s)
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

mod token;
pub use token::{TokenCommand, TokenCreateArgs, TokenDeleteArgs, TokenOutput, token};

mod status;
pub use status::status;

mod connect;
pub use connect::{ConnectArgs, connect};

mod ca;
pub use ca::{CaArgs, CaCommand, RotateArgs, WhichCa, ca};

mod run;
pub use run::{RunCommand, run};

/// `unix` as an RFC 3339 UTC date; `None` when it is past the last date RFC 3339 can show
/// (year 9999), e.g. a stored value an older hub or a hand edit left behind.
fn rfc3339(unix: u64) -> Option<String> {
    use std::fmt::Write;
    let time = UNIX_EPOCH.checked_add(Duration::from_secs(unix))?;
    let mut out = String::new();
    write!(out, "{}", humantime::format_rfc3339_seconds(time)).ok()?;
    Some(out)
}

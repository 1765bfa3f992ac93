//! `flower-agent run`.
use super::join::{JoinSourceArgs, KubeContext, StoreArgs, join_options, open_store};
use crate::channel::{RunOptions, run as run_channel};
use crate::kube_runtime::KubeRuntime;
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
    /// Runtime that applies the work.
    #[arg(long, value_enum, default_value = "process")]
    pub runtime: RuntimeKind,
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
    /// How often the observed status is checked (sent only when it changed), e.g. `5s`.
    #[arg(long, default_value = "3s", value_parser = super::join::parse_duration)]
    pub status_interval: std::time::Duration,
    /// `/metrics`, `/healthz` and `/readyz` (ready once credentials are loaded and the runtime
    /// is up).
    #[command(flatten)]
    pub ops: crate::ops::OpsArgs,
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
                })?);
                process = Some(rt.clone());
                rt
            }
            RuntimeKind::Kubernetes => {
                let (client, _) = kube.get(args.store.namespace.as_deref()).await?;
                Arc::new(KubeRuntime::new(client))
            }
        };
        health.set("runtime", true);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            super::shutdown_signal().await;
            tracing::info!("stopping");
            let _ = stop_tx.send(true);
        });
        // A pod that can re-join from its bootstrap Secret stops on expiry, so its restart does.
        let exit_when_expired =
            matches!(store, crate::credentials::CredentialStore::Secret(_)) && can_join;
        let mut options = RunOptions::with_store(credentials, Some(store));
        options.exit_when_expired = exit_when_expired;
        options.status_interval = args.status_interval;
        let result = run_channel(options, runtime, stop_rx).await;
        if let Some(rt) = process {
            tracing::info!("stopping this agent's SuperNodes");
            rt.shutdown().await;
        }
        result.map_err(anyhow::Error::from)
    })?;
    Ok(ExitCode::SUCCESS)
}

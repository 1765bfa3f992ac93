//! `flower-agent run`.
use crate::channel::{RunOptions, run as run_channel};
use crate::credentials::Credentials;
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
    /// Directory holding the credentials written by `flower-agent join`.
    #[arg(long)]
    pub state_dir: PathBuf,
    /// Runtime that applies the work.
    #[arg(long, value_enum, default_value = "noop")]
    pub runtime: RuntimeKind,
}

/// `flower-agent run`.
pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let credentials = Credentials::load(&args.state_dir)?;
    let runtime: Arc<dyn Runtime> = match args.runtime {
        RuntimeKind::Noop => Arc::new(MemoryRuntime::new()),
        other => anyhow::bail!("--runtime {other:?} is not available yet; use --runtime noop"),
    };
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    tokio.block_on(async move {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("interrupted: stopping (applied work keeps running)");
            let _ = stop_tx.send(true);
        });
        run_channel(
            RunOptions::new(credentials, Some(args.state_dir)),
            runtime,
            stop_rx,
        )
        .await
    })?;
    Ok(ExitCode::SUCCESS)
}

//! `flower-hub outputs-server`: the read-only server of run outputs
//! ([`crate::flower::outputs::serve`]) as its own process, the sidecar the Kubernetes hub puts on
//! a SuperLink pod whose Federation declares outputs.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::flower::outputs;

/// Arguments of `flower-hub outputs-server`.
#[derive(clap::Args, Debug)]
pub struct OutputsServerArgs {
    /// Address to listen on: the pod's loopback, where a port-forward connects (the outputs
    /// are on no network).
    #[arg(long, default_value = "127.0.0.1:9099")]
    pub listen: SocketAddr,
    /// The outputs root: each run's files are below `<dir>/<namespace>/<run>/`. Only read.
    #[arg(long, default_value = outputs::OUTPUTS_MOUNT_DIR)]
    pub dir: PathBuf,
    /// The most bytes one run's outputs may take (the Federation's `spec.outputs.sizeLimit`):
    /// a run over it is answered 413, nothing of it hashed.
    #[arg(long, default_value_t = u64::MAX)]
    pub max_bytes: u64,
}

/// Serves run outputs until SIGINT/SIGTERM.
pub fn outputs_server(args: OutputsServerArgs) -> anyhow::Result<ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            let listener = tokio::net::TcpListener::bind(args.listen)
                .await
                .with_context(|| format!("--listen {}", args.listen))?;
            if !args.dir.is_dir() {
                tracing::warn!(dir = %args.dir.display(), "outputs server: --dir is not a directory (yet); every request fails until it is");
            }
            tracing::info!(
                listen = %args.listen,
                dir = %args.dir.display(),
                "outputs server: serving run outputs read-only"
            );
            outputs::serve(listener, args.dir, args.max_bytes, async {
                super::serve::shutdown_signal().await;
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        })
}

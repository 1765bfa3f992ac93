//! `flower-hub serve`: the long-running hub (Kubernetes mode or standalone).
use std::process::ExitCode;

/// Arguments of `flower-hub serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {}

/// `flower-hub serve`.
pub fn serve(_args: ServeArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("serve: not implemented yet")
}

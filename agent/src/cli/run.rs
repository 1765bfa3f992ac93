//! `flower-agent run`.
use std::process::ExitCode;

/// Arguments of `flower-agent run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {}

/// `flower-agent run`.
pub fn run(_args: RunArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("run: not implemented yet")
}

//! `flower-agent join`.
use std::process::ExitCode;

/// Arguments of `flower-agent join`.
#[derive(clap::Args, Debug)]
pub struct JoinArgs {}

/// `flower-agent join`.
pub fn join(_args: JoinArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("join: not implemented yet")
}

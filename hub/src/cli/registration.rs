//! Registration commands: `token create|list|delete`, `accept`, `status`.
use std::process::ExitCode;

/// `flower-hub token …`.
#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a bootstrap token and print a ready-to-paste `flower-agent join` line.
    Create,
}

/// Arguments of `flower-hub accept`.
#[derive(clap::Args, Debug)]
pub struct AcceptArgs {
    /// Name of the ManagedCluster to accept.
    pub cluster: String,
}

/// Arguments of `flower-hub status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {}

/// `flower-hub token …`.
pub fn token(_cmd: TokenCommand) -> anyhow::Result<ExitCode> {
    anyhow::bail!("token: not implemented yet")
}

/// `flower-hub accept`.
pub fn accept(_args: AcceptArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("accept: not implemented yet")
}

/// `flower-hub status`.
pub fn status(_args: StatusArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("status: not implemented yet")
}

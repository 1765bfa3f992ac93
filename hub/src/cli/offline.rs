//! Offline commands: `crds`, `validate`, `render`. They read files and print; no cluster needed.
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `flower-hub validate`.
#[derive(clap::Args, Debug)]
pub struct ValidateArgs {
    /// YAML files holding Federation, Placement or ManagedCluster objects.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Arguments of `flower-hub render`.
#[derive(clap::Args, Debug)]
pub struct RenderArgs {
    /// YAML files holding Federation and Placement objects.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Render what this spoke cluster's agent would apply (default: what the hub applies).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Position of the cluster among the selected clusters (0-based).
    #[arg(long, requires = "cluster", default_value_t = 0)]
    pub cluster_index: u32,
    /// Number of selected clusters.
    #[arg(long, requires = "cluster", default_value_t = 1)]
    pub clusters: u32,
}

/// `flower-hub crds`.
pub fn crds() -> anyhow::Result<ExitCode> {
    anyhow::bail!("crds: not implemented yet")
}

/// `flower-hub validate`.
pub fn validate(_args: ValidateArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("validate: not implemented yet")
}

/// `flower-hub render`.
pub fn render(_args: RenderArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("render: not implemented yet")
}

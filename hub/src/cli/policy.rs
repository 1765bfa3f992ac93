//! The hub admin's pod policy flags (`flower-hub serve`, `validate`, `render`): what the pods the
//! hub makes in its own cluster — SuperLink pods and the pools of Federations without a
//! Placement — may do ([`flower_addon_crds::policy`]).
use flower_addon_crds::policy::{Admin, Allowance, PodPolicy};

/// What the pods the hub makes in its cluster may do. A Federation whose pods do more is refused
/// (`Degraded`, and by `validate`/`render`), naming the field and the flag that allows it.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct HubPolicyArgs {
    /// Allow the SuperLink pods and hub-local pools to use this (comma-separated or repeated):
    /// host-path, host-network, host-pid, host-ipc, privileged, host-port, other-volumes,
    /// secrets, unconfined, run-as-root, service-account-token. Default: none (e.g. a
    /// Federation without a Placement whose pools are AMD GPU pools needs
    /// `--allow privileged,host-path`). Helm value `hub.podPolicy.allow`.
    #[arg(long = "allow", value_delimiter = ',', value_parser = parse_allowance)]
    pub allow: Vec<Allowance>,
    /// A ServiceAccount those pods may name besides `default` (repeatable). Helm value
    /// `hub.podPolicy.serviceAccounts`.
    #[arg(long = "allow-service-account", value_name = "NAME")]
    pub allow_service_account: Vec<String>,
}

/// `--allow NAME`.
fn parse_allowance(name: &str) -> Result<Allowance, String> {
    name.parse()
}

impl HubPolicyArgs {
    /// The policy these flags describe.
    pub fn policy(&self) -> anyhow::Result<PodPolicy> {
        if self.allow.contains(&Allowance::WeakerNamespaces) {
            anyhow::bail!(
                "--allow weaker-namespaces: the hub does not label or check namespaces (that is `flower-agent run`'s); leave it out"
            );
        }
        PodPolicy::allowing(Admin::Hub, &self.allow, &self.allow_service_account)
            .map_err(anyhow::Error::msg)
    }
}

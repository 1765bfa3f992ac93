//! The hub admin's pod policy flags (`flower-hub serve`, `validate`, `render`): what the pods the
//! hub makes in its own cluster — SuperLink pods and the pools of Federations without a
//! Placement — may do ([`flower_addon_crds::policy`]).
use flower_addon_crds::policy::{Admin, Allowance, PodPolicy, PodSecurityLevel};

/// What the pods the hub makes in its cluster may do. A Federation whose pods do more is refused
/// (`Degraded`, and by `validate`/`render`), naming the field and the flag that allows it.
#[derive(clap::Args, Debug, Clone)]
pub struct HubPolicyArgs {
    /// Allow the SuperLink pods and hub-local pools to use this (comma-separated or repeated):
    /// host-path, host-network, host-pid, host-ipc, privileged, host-port, other-volumes,
    /// secrets, unconfined, run-as-root, service-account-token; and weaker-namespaces (a
    /// Federation in a namespace whose Pod Security `enforce` label is weaker than
    /// --namespace-pod-security). Default: none (e.g. a Federation without a Placement whose
    /// pools are AMD GPU pools needs `--allow privileged,host-path`, and `serve` then
    /// `--namespace-pod-security privileged`: the API server refuses such pods in namespaces
    /// labelled baseline). Helm value `hub.podPolicy.allow`.
    #[arg(long = "allow", value_delimiter = ',', value_parser = parse_allowance)]
    pub allow: Vec<Allowance>,
    /// A ServiceAccount those pods may name besides `default` (repeatable). Helm value
    /// `hub.podPolicy.serviceAccounts`.
    #[arg(long = "allow-service-account", value_name = "NAME")]
    pub allow_service_account: Vec<String>,
    /// Pod Security Standards level of the namespaces the hub writes SuperLinks and hub-local
    /// pools into (the Federations' own; `enforce`, `audit` and `warn` labels), so the API server
    /// enforces it too: set on a namespace without an `enforce` label (labels its admin set are
    /// kept); a Federation in a namespace with a weaker `enforce` label is refused (see
    /// --allow). `none`: namespaces are neither labelled nor checked. Helm value
    /// `hub.podPolicy.namespacePodSecurity`.
    #[arg(long, default_value = "baseline", value_parser = parse_level)]
    pub namespace_pod_security: PodSecurityLevel,
}

impl Default for HubPolicyArgs {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            allow_service_account: Vec::new(),
            namespace_pod_security: PodSecurityLevel::Baseline,
        }
    }
}

/// `--allow NAME`.
fn parse_allowance(name: &str) -> Result<Allowance, String> {
    name.parse()
}

/// `--namespace-pod-security LEVEL`.
fn parse_level(name: &str) -> Result<PodSecurityLevel, String> {
    name.parse()
}

impl HubPolicyArgs {
    /// The policy these flags describe.
    pub fn policy(&self) -> anyhow::Result<PodPolicy> {
        let mut policy = PodPolicy::allowing(Admin::Hub, &self.allow, &self.allow_service_account)
            .map_err(anyhow::Error::msg)?;
        policy.namespace_level = self.namespace_pod_security;
        Ok(policy)
    }
}

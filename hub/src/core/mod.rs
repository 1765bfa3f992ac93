//! The hub's pure core, shared by both adapters (Kubernetes controllers; standalone files and
//! processes): which clusters a Placement may select ([`clustersets`]) and selects ([`placement`]),
//! what each selected cluster runs ([`work`]), the SuperLink's arguments ([`superlink`]) and
//! objects ([`render`]), what keeps a Federation from being applied ([`problems`]), when a
//! SuperLink certificate is re-issued ([`renewal`]), and what to do next for a `FlowerRun`
//! ([`run`]). Nothing here does I/O, reads a clock (callers pass the time) or imports the modules
//! above it (`flower`, `kube`, `standalone`, `channel`); every function is unit-tested without a
//! cluster or a process. The versioned index of each cluster's work that the work channel serves
//! from is `crate::channel::source`.
pub mod clustersets;
pub mod hold;
pub mod nodekeys;
pub mod placement;
pub mod problems;
pub mod render;
pub mod renewal;
pub mod run;
pub mod sans;
pub mod selector;
pub mod status;
pub mod superlink;
pub mod text;
pub mod work;

/// Name of the hub's own cluster: `{cluster}` of the pools of Federations without
/// `placementRef` (they run in the hub cluster, or on the standalone hub machine), as OCM names
/// a hub that manages itself. Reserved: no agent may join under it.
pub const HUB_CLUSTER: &str = "local-cluster";

/// `(namespace, name)` of a Federation (namespace `default` when unset), the key both hub modes
/// index Federations by.
pub fn federation_key(fed: &flower_addon_crds::Federation) -> (String, String) {
    (
        fed.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        fed.metadata.name.clone().unwrap_or_default(),
    )
}

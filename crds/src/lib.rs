//! flower-addon API types: `Federation`, `Placement`, `PlacementDecision`, `ManagedCluster`,
//! `ManagedClusterSet`, `ManagedClusterSetBinding` and `FlowerRun`
//! (group `flower-addon.io`, version `v1alpha1`), their validation and CRD generation, and the pure
//! SuperNode renderer ([`render`]) that the agent's runtimes, the hub and `flower-hub render` share.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod cluster;
pub mod clusterset;
pub mod crdgen;
pub mod federation;
mod limits;
pub mod parse;
pub mod placement;
pub mod policy;
pub mod quantity;
pub mod render;
pub mod rules;
pub mod run;
mod schema_helpers;
pub mod validate;

pub use cluster::*;
pub use clusterset::*;
pub use crdgen::{crd_file_name, crd_yaml, crds, crds_yaml};
pub use federation::*;
pub use parse::{Object, ParseError, parse_documents};
pub use placement::*;
pub use quantity::parse_quantity;
pub use run::*;
pub use validate::{
    FieldError, dns_label, validate_cluster_set, validate_cluster_set_binding, validate_federation,
    validate_flower_run, validate_placement,
};

/// API group of every flower-addon resource.
pub const GROUP: &str = "flower-addon.io";
/// API version of every flower-addon resource.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of every flower-addon resource.
pub const API_VERSION: &str = "flower-addon.io/v1alpha1";

/// Annotation of a Federation whose change restarts all its SuperNodes, keys and identities
/// kept, as `kubectl rollout restart` does for a Deployment (any value; a timestamp is usual).
/// The agents carry it on the pools' pod templates and in the processes' environment.
pub const SUPERNODE_RESTART_ANNOTATION: &str = "flower-addon.io/supernode-restart";
/// Longest value of [`SUPERNODE_RESTART_ANNOTATION`] the hub sends on.
pub const SUPERNODE_RESTART_MAX: usize = 63;

/// The restart mark of a Federation ([`SUPERNODE_RESTART_ANNOTATION`]), trimmed; `None` when
/// absent or empty.
pub fn supernode_restart(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(SUPERNODE_RESTART_ANNOTATION)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
}

/// The restart mark the agents apply: the user's mark ([`supernode_restart`]) and the hub's
/// (`status.supernodeRestartAfterRun`, as `after-run-<id>`), joined by a space; `None` when
/// neither is set. A change of either restarts every SuperNode of the Federation.
pub fn supernode_restart_mark(fed: &Federation) -> Option<String> {
    let hub = fed
        .status
        .as_ref()
        .and_then(|s| s.supernode_restart_after_run.as_deref())
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(|id| format!("after-run-{id}"));
    match (supernode_restart(&fed.metadata), hub) {
        (None, None) => None,
        (Some(user), None) => Some(user.to_owned()),
        (None, Some(hub)) => Some(hub),
        (Some(user), Some(hub)) => Some(format!("{user} {hub}")),
    }
}

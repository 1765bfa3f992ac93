//! Who applies the runtime's objects: the field manager and applied-by label, and optional owner
//! references (the hub's embedded runtime for its own cluster).
use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{AGENT_FIELD_MANAGER, APPLIED_BY_LABEL};

/// The owner reference of the Federation `(namespace, name)`, if it has one (see [`Applier`]).
pub type OwnerFn = std::sync::Arc<
    dyn Fn(&str, &str) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>
        + Send
        + Sync,
>;

/// Who applies: the field manager of every write, which is also the value of
/// [`APPLIED_BY_LABEL`] on everything applied (pruning selects on it, so two runtimes in one
/// cluster never prune each other's objects), and optionally each Federation's owner
/// reference. The agent is [`Applier::agent`]; the hub runs the same runtime for the pools of
/// Federations without `placementRef` in its own cluster under its own manager, with the
/// Federation as owner (deleted with it by the garbage collector).
#[derive(Clone)]
pub struct Applier {
    manager: &'static str,
    owners: Option<OwnerFn>,
}

impl Applier {
    /// The agent in a spoke: [`AGENT_FIELD_MANAGER`], no owner references.
    pub fn agent() -> Self {
        Self {
            manager: AGENT_FIELD_MANAGER,
            owners: None,
        }
    }

    /// Another component applying under `manager` (a valid label value), with `owners` giving
    /// each Federation's owner reference.
    pub fn new(manager: &'static str, owners: Option<OwnerFn>) -> Self {
        Self { manager, owners }
    }

    /// The field manager (and applied-by label value).
    pub fn manager(&self) -> &'static str {
        self.manager
    }

    /// Marks `meta` as applied by this applier for the Federation `namespace/federation`:
    /// the applied-by label, and the owner reference when there is one.
    pub fn stamp(&self, meta: &mut ObjectMeta, namespace: &str, federation: &str) {
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(APPLIED_BY_LABEL.to_owned(), self.manager.to_owned());
        if let Some(owner) = self.owners.as_ref().and_then(|f| f(namespace, federation)) {
            meta.owner_references = Some(vec![owner]);
        }
    }
}

impl Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier")
            .field("manager", &self.manager)
            .field("owners", &self.owners.is_some())
            .finish()
    }
}

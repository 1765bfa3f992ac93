//! Who applies the runtime's objects: the field manager and applied-by label, and optional owner
//! references (the hub's embedded runtime for its own cluster).
use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{AGENT_FIELD_MANAGER, APPLIED_BY_LABEL, INSTALLATION_LABEL};

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
///
/// An agent also has an installation id ([`Applier::with_installation`], label
/// [`INSTALLATION_LABEL`]): two agents in one cluster (joined to two hubs) prune and take over
/// only their own objects.
#[derive(Clone)]
pub struct Applier {
    manager: &'static str,
    owners: Option<OwnerFn>,
    installation: Option<String>,
}

impl Applier {
    /// The agent in a spoke: [`AGENT_FIELD_MANAGER`], no owner references.
    pub fn agent() -> Self {
        Self {
            manager: AGENT_FIELD_MANAGER,
            owners: None,
            installation: None,
        }
    }

    /// The same applier, marking and pruning only objects of installation `id` (a label value).
    pub fn with_installation(mut self, id: impl Into<String>) -> Self {
        self.installation = Some(id.into());
        self
    }

    /// The same applier, making `owner` (a cluster-scoped object, e.g. the OCM addon's install
    /// Namespace) the owner of everything it applies, so the garbage collector removes it all
    /// when the owner goes.
    pub fn with_owner(
        mut self,
        owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    ) -> Self {
        self.owners = Some(std::sync::Arc::new(move |_: &str, _: &str| {
            Some(owner.clone())
        }));
        self
    }

    /// The installation id, if any.
    pub fn installation(&self) -> Option<&str> {
        self.installation.as_deref()
    }

    /// The label selector of everything this applier applied (what pruning lists).
    pub fn selector(&self) -> String {
        let mut selector = format!(
            "app.kubernetes.io/managed-by={},{APPLIED_BY_LABEL}={}",
            crate::render::MANAGED_BY,
            self.manager
        );
        match &self.installation {
            Some(id) => selector.push_str(&format!(",{INSTALLATION_LABEL}={id}")),
            // Without an id, never the objects of an installation that has one.
            None => selector.push_str(&format!(",!{INSTALLATION_LABEL}")),
        }
        selector
    }

    /// Whether an existing object with `meta` is this applier's: it carries the applied-by
    /// label and this installation's id (or no installation id: applied before ids existed).
    pub fn owns(&self, meta: &ObjectMeta) -> bool {
        let labels = meta.labels.as_ref();
        let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
        label(APPLIED_BY_LABEL) == Some(self.manager)
            && match (&self.installation, label(INSTALLATION_LABEL)) {
                (Some(ours), Some(theirs)) => ours == theirs,
                (None, Some(_)) => false,
                (_, None) => true,
            }
    }

    /// Another component applying under `manager` (a valid label value), with `owners` giving
    /// each Federation's owner reference.
    pub fn new(manager: &'static str, owners: Option<OwnerFn>) -> Self {
        Self {
            manager,
            owners,
            installation: None,
        }
    }

    /// The field manager (and applied-by label value).
    pub fn manager(&self) -> &'static str {
        self.manager
    }

    /// Marks `meta` as applied by this applier for the Federation `namespace/federation`:
    /// the applied-by label, and the owner reference when there is one.
    pub fn stamp(&self, meta: &mut ObjectMeta, namespace: &str, federation: &str) {
        let labels = meta.labels.get_or_insert_with(BTreeMap::new);
        labels.insert(APPLIED_BY_LABEL.to_owned(), self.manager.to_owned());
        if let Some(id) = &self.installation {
            labels.insert(INSTALLATION_LABEL.to_owned(), id.clone());
        }
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
            .field("installation", &self.installation)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn an_installation_owns_and_prunes_only_its_own_objects() {
        let x = Applier::agent().with_installation("x");
        let mut stamped = ObjectMeta::default();
        x.stamp(&mut stamped, "ns", "fed");
        assert!(x.owns(&stamped));
        assert!(!Applier::agent().with_installation("y").owns(&stamped));
        // Without an id, never an installation's object; objects from before ids are adopted.
        assert!(!Applier::agent().owns(&stamped));
        assert!(x.owns(&meta(&[(APPLIED_BY_LABEL, AGENT_FIELD_MANAGER)])));
        // Someone else's object of the same name.
        assert!(!x.owns(&meta(&[("team", "other")])));
        assert!(x.selector().ends_with(",flower-addon.io/installation=x"));
        assert!(
            Applier::agent()
                .selector()
                .ends_with(",!flower-addon.io/installation")
        );
    }

    #[test]
    fn an_owner_given_owns_every_object_applied() {
        // The OCM addon's install Namespace: its deletion takes every pool object with it.
        let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "Namespace".into(),
            name: "flower-addon-ocm".into(),
            uid: "u-1".into(),
            ..Default::default()
        };
        let applier = Applier::agent()
            .with_installation("x")
            .with_owner(owner.clone());
        for (ns, fed) in [("fl", "a"), ("team-b", "b")] {
            let mut stamped = ObjectMeta::default();
            applier.stamp(&mut stamped, ns, fed);
            assert_eq!(stamped.owner_references, Some(vec![owner.clone()]));
            assert!(applier.owns(&stamped));
        }
        let mut unowned = ObjectMeta::default();
        Applier::agent().stamp(&mut unowned, "fl", "a");
        assert_eq!(unowned.owner_references, None);
    }
}

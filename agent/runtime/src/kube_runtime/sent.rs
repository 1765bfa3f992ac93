//! What the runtime last sent, so that a snapshot costs requests only for what changed in it: a
//! Federation whose work is unchanged is not touched, an object whose body is unchanged is not
//! applied again, and the orphans are the objects sent before that are not wanted now (deleted
//! by name, no LIST). The first apply, and the first after [`FULL_EVERY`], is a full one: every
//! object applied, orphans found by listing the labelled objects (those of a previous run too),
//! which also puts back what was changed by hand.
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use flower_addon_proto::FederationWork;

use super::ObjectKey;

/// How often an apply is a full one (see the module doc).
pub const FULL_EVERY: Duration = Duration::from_secs(300);

/// `(namespace, name)` of a Federation.
type FedKey = (String, String);

/// The memory of what was sent (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Sent {
    /// When the last full apply succeeded.
    full_at: Option<Instant>,
    /// Each Federation's last successfully applied work (`None` after a failure: applied again
    /// next time) and the objects it wants (kept after a failure, so they are still pruned when
    /// the Federation or a pool goes away later).
    federations: BTreeMap<FedKey, (Option<FederationWork>, BTreeSet<ObjectKey>)>,
    /// The hash of the body last applied, per object.
    bodies: BTreeMap<ObjectKey, u64>,
    /// Namespaces known to exist.
    namespaces: BTreeSet<String>,
}

impl Sent {
    /// Whether the next apply must be a full one; if so, everything is forgotten.
    pub fn start(&mut self) -> bool {
        let full = self.full_at.is_none_or(|t| t.elapsed() >= FULL_EVERY);
        if full {
            *self = Self::default();
        }
        full
    }

    /// Something sent is gone (a workload deleted by hand): the next apply is a full one.
    pub fn expire(&mut self) {
        self.full_at = None;
    }

    /// A full apply ended without error.
    pub fn full_done(&mut self) {
        self.full_at = Some(Instant::now());
    }

    /// The objects of `fed` when its work is exactly what was last applied.
    pub fn unchanged(&self, fed: &FederationWork) -> Option<&BTreeSet<ObjectKey>> {
        self.federations
            .get(&(fed.namespace.clone(), fed.name.clone()))
            .filter(|(work, _)| work.as_ref() == Some(fed))
            .map(|(_, objects)| objects)
    }

    /// `fed` was applied, wanting `objects`.
    pub fn applied(&mut self, fed: &FederationWork, objects: BTreeSet<ObjectKey>) {
        self.federations.insert(
            (fed.namespace.clone(), fed.name.clone()),
            (Some(fed.clone()), objects),
        );
    }

    /// `fed` failed: its work is applied again next time; returns the objects it wanted before
    /// (kept: a failed Federation's running objects are never pruned).
    pub fn failed(&mut self, fed: &FederationWork) -> BTreeSet<ObjectKey> {
        match self
            .federations
            .get_mut(&(fed.namespace.clone(), fed.name.clone()))
        {
            Some((work, objects)) => {
                *work = None;
                objects.clone()
            }
            None => BTreeSet::new(),
        }
    }

    /// Every object some Federation wanted after the last apply.
    pub fn wanted(&self) -> BTreeSet<ObjectKey> {
        self.federations
            .values()
            .flat_map(|(_, objects)| objects.iter().cloned())
            .collect()
    }

    /// Forgets the Federations not in `live` (after their objects are pruned).
    pub fn retain(&mut self, live: &BTreeSet<FedKey>) {
        self.federations.retain(|k, _| live.contains(k));
    }

    /// Whether `body` is what was last applied to `key`.
    pub fn same_body(&self, key: &ObjectKey, body: &serde_json::Value) -> bool {
        self.bodies.get(key) == Some(&hash(body))
    }

    /// Whether some body was applied to `key` since the last full apply (so it is this
    /// runtime's).
    pub fn has_body(&self, key: &ObjectKey) -> bool {
        self.bodies.contains_key(key)
    }

    /// `body` was applied to `key`.
    pub fn body_applied(&mut self, key: ObjectKey, body: &serde_json::Value) {
        self.bodies.insert(key, hash(body));
    }

    /// `key` was deleted (or its apply failed).
    pub fn forget_body(&mut self, key: &ObjectKey) {
        self.bodies.remove(key);
    }

    /// Whether `namespace` is known to exist.
    pub fn has_namespace(&self, namespace: &str) -> bool {
        self.namespaces.contains(namespace)
    }

    /// `namespace` exists.
    pub fn namespace_exists(&mut self, namespace: &str) {
        self.namespaces.insert(namespace.to_owned());
    }
}

fn hash(body: &serde_json::Value) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    body.to_string().hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::super::Kind;
    use super::*;

    fn work(name: &str, replicas: u32) -> FederationWork {
        FederationWork {
            namespace: "ns".into(),
            name: name.into(),
            partitions_total: replicas,
            ..Default::default()
        }
    }

    #[test]
    fn only_changed_work_and_bodies_are_sent_until_a_full_apply_is_due() {
        let mut sent = Sent::default();
        assert!(sent.start(), "the first apply is full");
        let key = (Kind::StatefulSet, "ns".to_owned(), "f-a".to_owned());
        sent.applied(&work("f", 2), BTreeSet::from([key.clone()]));
        sent.body_applied(key.clone(), &serde_json::json!({"replicas": 2}));
        sent.full_done();
        assert!(!sent.start(), "a full apply is done");
        assert!(sent.unchanged(&work("f", 2)).is_some());
        assert!(sent.unchanged(&work("f", 3)).is_none(), "changed work");
        assert!(
            sent.unchanged(&work("g", 2)).is_none(),
            "unknown Federation"
        );
        assert!(sent.same_body(&key, &serde_json::json!({"replicas": 2})));
        assert!(!sent.same_body(&key, &serde_json::json!({"replicas": 3})));
        assert_eq!(sent.failed(&work("f", 3)), BTreeSet::from([key.clone()]));
        assert!(
            sent.unchanged(&work("f", 2)).is_none(),
            "a failure is retried"
        );
        sent.full_at = Some(Instant::now() - FULL_EVERY);
        assert!(sent.start(), "due again");
        assert!(
            !sent.same_body(&key, &serde_json::json!({"replicas": 2})),
            "forgotten"
        );
    }
}

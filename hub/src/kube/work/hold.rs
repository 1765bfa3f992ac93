//! Kubernetes mode's observation for [`crate::core::hold`]: a Federation's work is held while its
//! SuperLink StatefulSet rolls out ([`superlink_rolling`]), at most [`HOLD_MAX`], so that a
//! Federation edit that restarts the SuperLink and changes a pool does not roll both at once
//! (Flower would refuse the restarted SuperNodes for about a minute).
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use flower_addon_crds::Federation;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::time::Instant;

use super::FedKey;
use crate::core::hold::{Rollout, superlink_rolling};

/// Longest time a Federation's work is held for its SuperLink (a pod that cannot start must not
/// freeze its clusters' work for ever; an image pull may take a while).
pub const HOLD_MAX: std::time::Duration = std::time::Duration::from_secs(120);

/// What of a SuperLink StatefulSet the hold is decided from (wakes the recompute when it
/// changes).
pub(super) fn statefulset_inputs(sts: &StatefulSet) -> u64 {
    let r = rollout(sts);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (
        r.generation,
        r.observed_generation,
        r.replicas,
        r.ready,
        r.updated,
        r.revisions,
    )
        .hash(&mut hasher);
    hasher.finish()
}

/// The rollout state of `sts`.
fn rollout(sts: &StatefulSet) -> Rollout {
    let status = sts.status.as_ref();
    Rollout {
        generation: sts.metadata.generation.unwrap_or(0),
        observed_generation: status.and_then(|s| s.observed_generation).unwrap_or(0),
        replicas: sts.spec.replicas.unwrap_or(1),
        ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
        updated: status.and_then(|s| s.updated_replicas).unwrap_or(0),
        revisions: (
            status.and_then(|s| s.current_revision.clone()),
            status.and_then(|s| s.update_revision.clone()),
        ),
    }
}

/// Which Federations are held, and since when.
#[derive(Debug, Default)]
pub(super) struct Holds {
    /// When each rolling Federation's hold started, and whether it ran out (warned once).
    since: BTreeMap<FedKey, (Instant, bool)>,
}

impl Holds {
    /// The Federations among `federations` held now, and when the next hold runs out (the
    /// recompute must run again then). Logs each hold as it starts and ends.
    pub(super) fn update(
        &mut self,
        federations: &[std::sync::Arc<Federation>],
        superlinks: &Store<StatefulSet>,
        now: Instant,
    ) -> (BTreeSet<FedKey>, Option<Instant>) {
        let mut held = BTreeSet::new();
        let mut next = None;
        let mut rolling_now = BTreeSet::new();
        for fed in federations {
            let namespace = fed.namespace().unwrap_or_default();
            let key = (namespace.clone(), fed.name_any());
            let sts = superlinks
                .get(
                    &ObjectRef::new(&crate::core::render::superlink_name(&key.1))
                        .within(&namespace),
                )
                .map(|s| rollout(&s));
            let rolling = superlink_rolling(
                fed.metadata.generation,
                fed.status.as_ref().and_then(|s| s.observed_generation),
                sts.as_ref(),
            );
            if !rolling {
                continue;
            }
            rolling_now.insert(key.clone());
            let (since, expired) = self.since.entry(key.clone()).or_insert_with(|| {
                tracing::info!(namespace = %key.0, federation = %key.1, "holding back this Federation's work until its SuperLink has rolled out and is ready (at most {} s): no SuperNode is started or restarted while it cannot reach it", HOLD_MAX.as_secs());
                (now, false)
            });
            let until = *since + HOLD_MAX;
            if now < until {
                held.insert(key);
                next = Some(next.map_or(until, |n: Instant| n.min(until)));
            } else if !*expired {
                *expired = true;
                tracing::warn!(namespace = %key.0, federation = %key.1, "the SuperLink has not rolled out after {} s: sending its Federation's work anyway", HOLD_MAX.as_secs());
            }
        }
        self.since.retain(|key, (since, expired)| {
            let keep = rolling_now.contains(key);
            if !keep && !*expired {
                tracing::info!(namespace = %key.0, federation = %key.1, after_ms = now.duration_since(*since).as_millis() as u64, "the SuperLink has rolled out: sending its Federation's work");
            }
            keep
        });
        (held, next)
    }
}

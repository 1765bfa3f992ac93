//! Which reflector events can change the work: the recompute loop wakes only for those.
//!
//! The work of a cluster is a function of each Federation's spec, name, Fleet address
//! (`status.endpoints.fleet`) and, while its SuperLink rolls out, `status.observedGeneration` and
//! the SuperLink StatefulSet's rollout, of the PlacementDecisions' content and of the ManagedClusters'
//! names and labels. Everything else these objects carry changes far more often: the Federation
//! controller's and the work source's own status writes, ManagedCluster heartbeats. Waking the
//! loop for those costs a recompute and, during a burst, delays the next real change by the
//! debounce.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use flower_addon_crds::{Federation, ManagedCluster, PlacementDecision};
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

/// What of a Federation the work is computed from.
pub(super) fn federation_inputs(fed: &Federation) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    fed.metadata.uid.hash(&mut hasher);
    fed.metadata.generation.hash(&mut hasher);
    fed.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    flower_addon_crds::supernode_restart_mark(fed).hash(&mut hasher);
    // The controller catching up with a new spec ends a hold ([`super::hold`]).
    fed.status
        .as_ref()
        .and_then(|s| s.observed_generation)
        .hash(&mut hasher);
    fed.status
        .as_ref()
        .and_then(|s| s.endpoints.as_ref())
        .and_then(|e| e.fleet.as_deref())
        .hash(&mut hasher);
    hasher.finish()
}

/// What of a PlacementDecision the work is computed from: its labels (which Placement) and
/// decisions.
pub(super) fn decision_inputs(decision: &PlacementDecision) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    decision.metadata.labels.hash(&mut hasher);
    serde_json::to_string(&decision.status)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// What of a ManagedCluster the work is computed from: its labels (pool `clusterSelector`s).
pub(super) fn cluster_inputs(cluster: &ManagedCluster) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    cluster.metadata.labels.hash(&mut hasher);
    hasher.finish()
}

/// One item per event of `events` that can change the work: an object whose `inputs` changed
/// or that is new, a deleted object, a completed (re)list. The stream itself still drives the
/// reflector behind `events` for every event.
pub(super) fn relevant<K, S>(events: S, inputs: fn(&K) -> u64) -> impl Stream<Item = ()>
where
    K: Resource<DynamicType = ()> + Clone,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut seen: HashMap<ObjectRef<K>, u64> = HashMap::new();
    let mut listing: HashMap<ObjectRef<K>, u64> = HashMap::new();
    events.filter_map(move |event| {
        let wake = match event {
            Ok(watcher::Event::Apply(object)) => {
                let hash = inputs(&object);
                seen.insert(ObjectRef::from_obj(&object), hash) != Some(hash)
            }
            Ok(watcher::Event::Delete(object)) => {
                seen.remove(&ObjectRef::from_obj(&object));
                true
            }
            Ok(watcher::Event::Init) => {
                listing.clear();
                false
            }
            Ok(watcher::Event::InitApply(object)) => {
                listing.insert(ObjectRef::from_obj(&object), inputs(&object));
                false
            }
            Ok(watcher::Event::InitDone) => {
                seen = std::mem::take(&mut listing);
                true
            }
            // The watcher retries (with backoff); the relist that follows wakes the loop.
            Err(_) => false,
        };
        futures::future::ready(wake.then_some(()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use flower_addon_crds::{FederationEndpoints, FederationStatus};

    fn fed(generation: i64, fleet: Option<&str>, clusters: usize) -> Federation {
        let mut fed = super::super::tests::federation("[]");
        fed.metadata.name = Some("f".into());
        fed.metadata.uid = Some("u1".into());
        fed.metadata.generation = Some(generation);
        fed.status = Some(FederationStatus {
            endpoints: Some(FederationEndpoints {
                fleet: fleet.map(str::to_owned),
                ..Default::default()
            }),
            clusters: (0..clusters)
                .map(|i| flower_addon_crds::ClusterStatus {
                    name: format!("c{i}"),
                    ..Default::default()
                })
                .collect(),
            supernodes: Some(format!("0/{clusters}")),
            ..Default::default()
        });
        fed
    }

    async fn woken(events: Vec<watcher::Event<Federation>>) -> usize {
        relevant(
            futures::stream::iter(events.into_iter().map(Ok)),
            federation_inputs,
        )
        .count()
        .await
    }

    #[tokio::test]
    async fn status_writes_other_than_the_fleet_address_do_not_wake() {
        use watcher::Event::*;
        let n = woken(vec![
            Init,
            InitApply(fed(1, None, 0)),
            InitDone,
            // The controller's and the work source's status writes.
            Apply(fed(1, None, 2)),
            Apply(fed(1, None, 3)),
        ])
        .await;
        assert_eq!(n, 1, "only the completed list");
    }

    #[tokio::test]
    async fn spec_fleet_address_new_and_deleted_objects_wake() {
        use watcher::Event::*;
        let mut other = fed(1, None, 0);
        other.metadata.name = Some("g".into());
        let n = woken(vec![
            Init,
            InitDone,
            Apply(fed(1, None, 0)),              // new
            Apply(fed(2, None, 0)),              // spec changed
            Apply(fed(2, Some("1.2.3.4:9"), 0)), // Fleet address known
            Apply(other.clone()),                // another new one
            Apply(other.clone()),                // unchanged
            Delete(other),
        ])
        .await;
        assert_eq!(n, 6);
    }

    #[tokio::test]
    async fn a_relist_forgets_what_it_no_longer_lists() {
        use watcher::Event::*;
        let n = woken(vec![
            Init,
            InitApply(fed(1, None, 0)),
            InitDone,
            Init,
            InitDone, // f is gone after the relist
            Apply(fed(1, None, 0)),
        ])
        .await;
        assert_eq!(n, 3, "both lists and f, new again");
    }

    #[test]
    fn cluster_heartbeats_do_not_change_the_inputs() {
        let mut mc: ManagedCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "flower-addon.io/v1alpha1", "kind": "ManagedCluster",
            "metadata": {"name": "c", "labels": {"region": "eu"}},
            "spec": {"hubAcceptsClient": true}
        }))
        .unwrap();
        let before = cluster_inputs(&mc);
        mc.metadata.resource_version = Some("99".into());
        mc.status = Some(Default::default());
        assert_eq!(cluster_inputs(&mc), before);
        mc.metadata
            .labels
            .get_or_insert_default()
            .insert("region".into(), "us".into());
        assert_ne!(cluster_inputs(&mc), before);
    }
}

//! Readiness of applied pools from their workloads' status.
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};

use flower_addon_proto::{Condition, FederationStatus, PoolStatus};
use kube::api::Api;

use super::{AppliedPool, Kind, WORKLOAD_MISSING};

/// Desired and ready SuperNodes of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Counts {
    /// SuperNodes the pool wants, started or waiting for their key's registration.
    pub(super) desired: u32,
    pub(super) ready: u32,
    /// The controller has not yet observed the latest spec.
    pub(super) stale: bool,
    /// Desired SuperNodes not started because their key is not registered yet.
    pub(super) waiting: u32,
}

fn non_negative(n: Option<i32>) -> u32 {
    n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0)
}

pub(super) fn statefulset_counts(s: &StatefulSet) -> Counts {
    let status = s.status.as_ref();
    let desired = non_negative(s.spec.replicas.or(Some(1)));
    Counts {
        desired,
        ready: non_negative(status.and_then(|st| st.ready_replicas)),
        stale: status.and_then(|st| st.observed_generation) < s.metadata.generation,
        waiting: 0,
    }
}

pub(super) fn daemonset_counts(d: &DaemonSet) -> Counts {
    let status = d.status.as_ref();
    Counts {
        desired: non_negative(status.map(|st| st.desired_number_scheduled)),
        ready: non_negative(status.map(|st| st.number_ready)),
        stale: status.and_then(|st| st.observed_generation) < d.metadata.generation,
        waiting: 0,
    }
}

pub(super) fn condition(status: &str, reason: &str, message: String) -> Condition {
    Condition {
        r#type: "Ready".to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
    }
}

/// `Ready` of one pool; the message names the workload and what it lacks.
pub(super) fn ready_condition(what: &str, counts: Counts) -> Condition {
    if counts.stale {
        return condition(
            "False",
            "Progressing",
            format!("{what}: the latest spec is not yet observed by its controller"),
        );
    }
    if counts.ready >= counts.desired && counts.desired > 0 {
        condition(
            "True",
            "SuperNodesReady",
            format!(
                "{what}: {}/{} SuperNodes ready",
                counts.ready, counts.desired
            ),
        )
    } else if counts.waiting > 0 {
        condition(
            "False",
            "NodeKeysNotRegistered",
            format!(
                "{what}: {}/{} SuperNodes ready; {} waiting for the hub to register their key",
                counts.ready, counts.desired, counts.waiting
            ),
        )
    } else {
        condition(
            "False",
            "SuperNodesNotReady",
            format!(
                "{what}: {}/{} SuperNodes ready",
                counts.ready, counts.desired
            ),
        )
    }
}

/// Reflector stores of the runtime's StatefulSets and DaemonSets.
#[derive(Clone)]
pub(super) struct WorkloadCache {
    pub(super) statefulsets: kube::runtime::reflector::Store<StatefulSet>,
    pub(super) daemonsets: kube::runtime::reflector::Store<DaemonSet>,
}

impl WorkloadCache {
    /// The pool's counts from the cache (`Some(None)`: not there), or `None` while the cache
    /// has not listed yet.
    pub(super) fn counts(&self, namespace: &str, pool: &AppliedPool) -> Option<Option<Counts>> {
        use futures::FutureExt;
        use kube::runtime::reflector::ObjectRef;
        let listed = |ready: Option<Result<(), _>>| matches!(ready, Some(Ok(())));
        match pool.kind {
            Kind::StatefulSet => {
                if !listed(self.statefulsets.wait_until_ready().now_or_never()) {
                    return None;
                }
                let key = ObjectRef::new(&pool.workload).within(namespace);
                Some(self.statefulsets.get(&key).map(|s| statefulset_counts(&s)))
            }
            _ => {
                if !listed(self.daemonsets.wait_until_ready().now_or_never()) {
                    return None;
                }
                let key = ObjectRef::new(&pool.workload).within(namespace);
                Some(self.daemonsets.get(&key).map(|d| daemonset_counts(&d)))
            }
        }
    }
}

impl super::KubeRuntime {
    /// The observed state of every Federation of the last applied snapshot.
    pub async fn observe(&self) -> Vec<FederationStatus> {
        let applied = self.applied.lock().map(|a| a.clone()).unwrap_or_default();
        let mut out = Vec::with_capacity(applied.len());
        for fed in applied {
            let mut pools = Vec::with_capacity(fed.pools.len());
            for pool in &fed.pools {
                pools.push(match &fed.error {
                    Some(error) => PoolStatus {
                        name: pool.name.clone(),
                        conditions: vec![condition("False", "ApplyFailed", error.clone())],
                        node_public_keys: pool.node_public_keys.clone(),
                        ..PoolStatus::default()
                    },
                    None => self.pool_status(&fed.namespace, pool).await,
                });
            }
            out.push(FederationStatus {
                namespace: fed.namespace,
                name: fed.name,
                pools,
            });
        }
        out
    }

    async fn pool_status(&self, namespace: &str, pool: &AppliedPool) -> PoolStatus {
        // A workload just applied may not be in the cache yet: only a cache hit is taken from
        // it, a miss is asked of the apiserver (so "missing" is never a cache lag).
        let cached = self
            .workloads
            .as_ref()
            .and_then(|c| c.counts(namespace, pool))
            .filter(Option::is_some);
        let observed = match (cached, pool.kind) {
            (Some(counts), _) => Ok(counts),
            (None, Kind::StatefulSet) => {
                Api::<StatefulSet>::namespaced(self.client.clone(), namespace)
                    .get_opt(&pool.workload)
                    .await
                    .map(|s| s.map(|s| statefulset_counts(&s)))
            }
            (None, _) => Api::<DaemonSet>::namespaced(self.client.clone(), namespace)
                .get_opt(&pool.workload)
                .await
                .map(|d| d.map(|d| daemonset_counts(&d))),
        };
        let what = format!("{} {namespace}/{}", pool.kind.name(), pool.workload);
        let (desired, ready, cond) = match observed {
            Ok(Some(mut counts)) => {
                counts.desired += pool.waiting;
                counts.waiting = pool.waiting;
                let cond = ready_condition(&what, counts);
                (counts.desired, counts.ready, cond)
            }
            Ok(None) => {
                // Gone behind the runtime's back: the next apply puts it back.
                self.sent().expire();
                (
                    0,
                    0,
                    condition("False", WORKLOAD_MISSING, format!("{what} not found")),
                )
            }
            Err(e) => (
                0,
                0,
                condition("Unknown", "StatusUnavailable", format!("get {what}: {e}")),
            ),
        };
        PoolStatus {
            name: pool.name.clone(),
            desired,
            ready,
            conditions: vec![cond],
            node_public_keys: pool.node_public_keys.clone(),
        }
    }
}

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
    /// A rollout of a new pod template is under way (a restart mark, a new image): the
    /// SuperNodes updated so far. Ready waits for its end, so a restart counts as done only when
    /// every SuperNode runs the new template.
    pub(super) rolling: Option<u32>,
}

fn non_negative(n: Option<i32>) -> u32 {
    n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0)
}

pub(super) fn statefulset_counts(s: &StatefulSet) -> Counts {
    let status = s.status.as_ref();
    let desired = non_negative(s.spec.replicas.or(Some(1)));
    // A StatefulSet's rollout ends when its current revision is the update revision.
    let rolling = status
        .filter(|st| st.update_revision.is_some() && st.current_revision != st.update_revision)
        .map(|st| non_negative(st.updated_replicas));
    Counts {
        desired,
        ready: non_negative(status.and_then(|st| st.ready_replicas)),
        stale: status.and_then(|st| st.observed_generation) < s.metadata.generation,
        waiting: 0,
        rolling,
    }
}

pub(super) fn daemonset_counts(d: &DaemonSet) -> Counts {
    let status = d.status.as_ref();
    let desired = non_negative(status.map(|st| st.desired_number_scheduled));
    // `updatedNumberScheduled` is left out when 0: absent means none updated yet.
    let updated = non_negative(status.and_then(|st| st.updated_number_scheduled));
    Counts {
        desired,
        ready: non_negative(status.map(|st| st.number_ready)),
        stale: status.and_then(|st| st.observed_generation) < d.metadata.generation,
        waiting: 0,
        rolling: (status.is_some() && updated < desired).then_some(updated),
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
    if let Some(updated) = counts.rolling {
        return condition(
            "False",
            "RollingOut",
            format!(
                "{what}: rolling out a new pod template: {updated}/{} SuperNodes updated, {} ready",
                counts.desired, counts.ready
            ),
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

/// Reflector stores of the runtime's StatefulSets and DaemonSets, and the workloads applied
/// since that the stores do not hold yet.
pub(super) struct WorkloadCache {
    pub(super) statefulsets: kube::runtime::reflector::Store<StatefulSet>,
    pub(super) daemonsets: kube::runtime::reflector::Store<DaemonSet>,
    /// Counts from the answers of applies whose object the stores have not shown yet, with the
    /// `metadata.generation` that answer carried: a workload just created is read from there,
    /// not asked of the apiserver again, and a workload just changed (a restart mark, a new
    /// image) is not read from the store's copy of the spec before the change, which still
    /// looks rolled out and ready. An entry goes once the store holds the object at that
    /// generation or later, so a workload deleted later is found missing.
    pub(super) fresh: std::sync::Mutex<std::collections::BTreeMap<super::ObjectKey, Applied>>,
}

/// What the answer of an apply said of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Applied {
    /// `metadata.generation` of the answer (the spec the counts are of).
    pub(super) generation: Option<i64>,
    pub(super) counts: Counts,
}

impl WorkloadCache {
    pub(super) fn new(
        statefulsets: kube::runtime::reflector::Store<StatefulSet>,
        daemonsets: kube::runtime::reflector::Store<DaemonSet>,
    ) -> Self {
        Self {
            statefulsets,
            daemonsets,
            fresh: Default::default(),
        }
    }

    /// Remembers the counts of a workload the runtime just applied (from the apply's answer).
    pub(super) fn just_applied(&self, key: super::ObjectKey, applied: Applied) {
        if let Ok(mut fresh) = self.fresh.lock() {
            fresh.insert(key, applied);
        }
    }

    /// The pool's counts from the cache, else from the answer of its last apply if the cache
    /// does not hold it yet (`Some(None)`: in neither), or `None` while the cache has not listed
    /// yet.
    pub(super) fn counts(&self, namespace: &str, pool: &AppliedPool) -> Option<Option<Counts>> {
        use futures::FutureExt;
        use kube::runtime::reflector::ObjectRef;
        let listed = |ready: Option<Result<(), _>>| matches!(ready, Some(Ok(())));
        let cached = match pool.kind {
            Kind::StatefulSet => {
                if !listed(self.statefulsets.wait_until_ready().now_or_never()) {
                    return None;
                }
                self.statefulsets
                    .get(&ObjectRef::new(&pool.workload).within(namespace))
                    .map(|s| (s.metadata.generation, statefulset_counts(&s)))
            }
            _ => {
                if !listed(self.daemonsets.wait_until_ready().now_or_never()) {
                    return None;
                }
                self.daemonsets
                    .get(&ObjectRef::new(&pool.workload).within(namespace))
                    .map(|d| (d.metadata.generation, daemonset_counts(&d)))
            }
        };
        let mut fresh = self.fresh.lock().ok()?;
        let fresh_key = (pool.kind, namespace.to_owned(), pool.workload.clone());
        let applied = fresh.get(&fresh_key).copied();
        Some(match (cached, applied) {
            // The store is behind the last apply: its counts are of the spec before it.
            (Some((generation, _)), Some(applied)) if generation < applied.generation => {
                Some(applied.counts)
            }
            (Some((_, counts)), _) => {
                fresh.remove(&fresh_key);
                Some(counts)
            }
            (None, applied) => applied.map(|a| a.counts),
        })
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
                supernode_restart: fed.supernode_restart,
            });
        }
        out
    }

    async fn pool_status(&self, namespace: &str, pool: &AppliedPool) -> PoolStatus {
        // A workload just applied may not be in the cache yet: a cache hit (or the answer of
        // that apply) is taken, a miss is asked of the apiserver (so "missing" is never a cache
        // lag).
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

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::{reflector, watcher};

    fn sts(name: &str, replicas: i32, ready: i32) -> StatefulSet {
        let mut s = StatefulSet::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("ns".into());
        s.spec.replicas = Some(replicas);
        s.status = Some(k8s_openapi::api::apps::v1::StatefulSetStatus {
            ready_replicas: Some(ready),
            ..Default::default()
        });
        s
    }

    #[test]
    fn a_rollout_keeps_a_pool_not_ready_until_every_supernode_runs_the_new_template() {
        // A restart mark rolls the pods one by one; all of them ready under the old template
        // (or mid-rollout) is not a restart done.
        let mut s = sts("f-supernode-a", 3, 3);
        let st = s.status.as_mut().unwrap();
        st.current_revision = Some("f-supernode-a-1".into());
        st.update_revision = Some("f-supernode-a-2".into());
        st.updated_replicas = Some(1);
        let cond = ready_condition("StatefulSet ns/f-supernode-a", statefulset_counts(&s));
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("False", "RollingOut")
        );
        assert!(
            cond.message.contains("1/3 SuperNodes updated"),
            "{}",
            cond.message
        );
        let st = s.status.as_mut().unwrap();
        st.current_revision = st.update_revision.clone();
        st.updated_replicas = Some(3);
        let cond = ready_condition("StatefulSet ns/f-supernode-a", statefulset_counts(&s));
        assert_eq!(cond.status, "True", "{}", cond.message);

        let mut d = DaemonSet {
            status: Some(k8s_openapi::api::apps::v1::DaemonSetStatus {
                desired_number_scheduled: 2,
                number_ready: 2,
                updated_number_scheduled: None,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            ready_condition("d", daemonset_counts(&d)).reason,
            "RollingOut"
        );
        d.status.as_mut().unwrap().updated_number_scheduled = Some(2);
        assert_eq!(ready_condition("d", daemonset_counts(&d)).status, "True");
    }

    #[test]
    fn a_just_applied_workload_is_read_from_the_apply_until_the_cache_has_it() {
        let (statefulsets, mut writer) = reflector::store::<StatefulSet>();
        let (daemonsets, mut ds_writer) = reflector::store::<DaemonSet>();
        for w in [watcher::Event::Init, watcher::Event::InitDone] {
            writer.apply_watcher_event(&w);
        }
        ds_writer.apply_watcher_event(&watcher::Event::Init);
        ds_writer.apply_watcher_event(&watcher::Event::InitDone);
        let cache = WorkloadCache::new(statefulsets, daemonsets);
        let pool = AppliedPool {
            name: "a".into(),
            workload: "f-supernode-a".into(),
            kind: Kind::StatefulSet,
            node_public_keys: Vec::new(),
            waiting: 0,
        };
        assert_eq!(cache.counts("ns", &pool), Some(None), "in neither");
        let key = (Kind::StatefulSet, "ns".to_owned(), pool.workload.clone());
        let created = sts(&pool.workload, 2, 0);
        cache.just_applied(
            key,
            Applied {
                generation: created.metadata.generation,
                counts: statefulset_counts(&created),
            },
        );
        let counts = cache.counts("ns", &pool).flatten().expect("from the apply");
        assert_eq!((counts.desired, counts.ready), (2, 0));
        // The watch delivers it: the cache answers, and the apply's answer is forgotten.
        writer.apply_watcher_event(&watcher::Event::Apply(sts(&pool.workload, 2, 1)));
        let counts = cache.counts("ns", &pool).flatten().expect("from the cache");
        assert_eq!((counts.desired, counts.ready), (2, 1));
        // Deleted by hand afterwards: missing, not the old answer.
        writer.apply_watcher_event(&watcher::Event::Delete(sts(&pool.workload, 2, 1)));
        assert_eq!(cache.counts("ns", &pool), Some(None));
    }

    #[test]
    fn a_workload_just_changed_is_not_read_from_the_stores_copy_of_the_old_spec() {
        // A restart mark changes the pod template: until the watch delivers the new generation,
        // the store still holds the old spec, rolled out and all ready. Read from there, a
        // restart would count as done before a single pod rolled.
        let (statefulsets, mut writer) = reflector::store::<StatefulSet>();
        let (daemonsets, mut ds_writer) = reflector::store::<DaemonSet>();
        for w in [watcher::Event::Init, watcher::Event::InitDone] {
            ds_writer.apply_watcher_event(&w);
        }
        let at = |generation: i64, observed: i64, ready: i32| {
            let mut s = sts("f-supernode-a", 3, ready);
            s.metadata.generation = Some(generation);
            let st = s.status.as_mut().unwrap();
            st.observed_generation = Some(observed);
            st.current_revision = Some(format!("f-supernode-a-{observed}"));
            st.update_revision = Some(format!("f-supernode-a-{observed}"));
            st.updated_replicas = Some(3);
            s
        };
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(at(1, 1, 3)));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let cache = WorkloadCache::new(statefulsets, daemonsets);
        let pool = AppliedPool {
            name: "a".into(),
            workload: "f-supernode-a".into(),
            kind: Kind::StatefulSet,
            node_public_keys: Vec::new(),
            waiting: 0,
        };
        let ready = |cache: &WorkloadCache| {
            let counts = cache.counts("ns", &pool).flatten().expect("counts");
            ready_condition("StatefulSet ns/f-supernode-a", counts).status
        };
        assert_eq!(ready(&cache), "True", "rolled out before the change");
        // The apply's answer: generation 2, not yet observed by the controller.
        let answer = at(2, 1, 3);
        let key = (Kind::StatefulSet, "ns".to_owned(), pool.workload.clone());
        cache.just_applied(
            key.clone(),
            Applied {
                generation: answer.metadata.generation,
                counts: statefulset_counts(&answer),
            },
        );
        assert_eq!(ready(&cache), "False", "the store still holds generation 1");
        assert!(
            cache.fresh.lock().unwrap().contains_key(&key),
            "kept until the store catches up"
        );
        // The watch delivers generation 2, then the controller's rollout: still not ready.
        writer.apply_watcher_event(&watcher::Event::Apply(at(2, 1, 3)));
        assert_eq!(ready(&cache), "False", "not yet observed");
        assert!(
            !cache.fresh.lock().unwrap().contains_key(&key),
            "the store holds it now"
        );
        let mut rolling = at(2, 2, 3);
        let st = rolling.status.as_mut().unwrap();
        st.current_revision = Some("f-supernode-a-1".into());
        st.updated_replicas = Some(1);
        writer.apply_watcher_event(&watcher::Event::Apply(rolling));
        assert_eq!(ready(&cache), "False", "rolling");
        writer.apply_watcher_event(&watcher::Event::Apply(at(2, 2, 3)));
        assert_eq!(ready(&cache), "True", "rolled out");
    }
}

//! Readiness of applied pools from their workloads' status.
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};

use flower_addon_proto::Condition;

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

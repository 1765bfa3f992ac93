//! The Federation status from what was applied (pure): `supernodes "r/d"`, per-pool readiness,
//! endpoints and the conditions `Ready`, `Reconciling`, `Degraded` and, for a Federation with
//! `placementRef`, `PlacementSatisfied` (mirrored from its Placement).
//!
//! Unchanged facts give an identical status (a condition keeps its `lastTransitionTime` while its
//! status stays), so the controller only writes when something changed and never loops on its
//! own status updates.

use flower_addon_crds::{
    ClusterTotals, DeploymentMode, Federation, FederationEndpoints, FederationStatus, PoolStatus,
};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::core::render::{ExternalAddressError, ExternalEndpoints, superlink_name};

/// Desired and ready replicas of one workload as its controller last reported them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadReadiness {
    /// Pool name (or `superlink`).
    pub name: String,
    /// `StatefulSet` or `DaemonSet`.
    pub kind: &'static str,
    /// Desired replicas (StatefulSet `spec.replicas`; DaemonSet `desiredNumberScheduled`).
    pub desired: i32,
    /// Ready replicas (`readyReplicas`; `numberReady`).
    pub ready: i32,
    /// The workload controller has not observed the latest spec yet.
    pub stale: bool,
}

impl WorkloadReadiness {
    /// Readiness of a StatefulSet.
    pub fn of_statefulset(name: &str, s: &StatefulSet) -> Self {
        let status = s.status.as_ref();
        Self {
            name: name.to_owned(),
            kind: "StatefulSet",
            desired: s.spec.replicas.unwrap_or(1),
            ready: status.and_then(|st| st.ready_replicas).unwrap_or(0),
            stale: status.and_then(|st| st.observed_generation) < s.metadata.generation,
        }
    }

    /// Readiness of a DaemonSet.
    pub fn of_daemonset(name: &str, d: &DaemonSet) -> Self {
        let status = d.status.as_ref();
        Self {
            name: name.to_owned(),
            kind: "DaemonSet",
            desired: status.map_or(0, |st| st.desired_number_scheduled),
            ready: status.map_or(0, |st| st.number_ready),
            stale: status.and_then(|st| st.observed_generation) < d.metadata.generation,
        }
    }

    fn is_ready(&self) -> bool {
        !self.stale && self.desired > 0 && self.ready >= self.desired
    }

    fn summary(&self, what: &str) -> String {
        if self.stale {
            format!("{what} {}: update not yet observed", self.name)
        } else {
            format!(
                "{what} {}: {}/{} ready",
                self.name, self.ready, self.desired
            )
        }
    }
}

/// What the Federation's `placementRef` points at, for its `PlacementSatisfied` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacementState {
    /// No `placementRef`: no such condition.
    NotReferenced,
    /// The referenced Placement does not exist.
    NotFound {
        /// Its name.
        name: String,
    },
    /// The `placementRef` names an Open Cluster Management Placement, and OCM's API is not
    /// served by this hub's apiserver.
    OcmNotInstalled {
        /// Its name.
        name: String,
    },
    /// The Placement exists; its `PlacementSatisfied` condition, if it has one yet.
    Found {
        /// Its name.
        name: String,
        /// `(status, reason, message)` of its `PlacementSatisfied` condition.
        satisfied: Option<(String, String, String)>,
    },
}

impl PlacementState {
    /// The state of Placement `name` (`placement` as read, `None` if absent).
    pub fn of(name: &str, placement: Option<&flower_addon_crds::Placement>) -> Self {
        match placement {
            None => Self::NotFound {
                name: name.to_owned(),
            },
            Some(p) => Self::Found {
                name: name.to_owned(),
                satisfied: p.status.as_ref().and_then(|s| {
                    s.conditions
                        .iter()
                        .find(|c| c.type_ == "PlacementSatisfied")
                        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
                }),
            },
        }
    }

    /// The condition, and a not-ready reason when the Placement cannot place anything yet.
    fn condition(&self) -> Option<(Condition, Option<String>)> {
        match self {
            Self::NotReferenced => None,
            Self::NotFound { name } => {
                let message = format!(
                    "Placement {name} not found in this namespace: create it, or fix spec.placementRef.name"
                );
                Some((
                    cond("PlacementSatisfied", "False", "PlacementNotFound", &message),
                    Some(message),
                ))
            }
            Self::OcmNotInstalled { name } => {
                let message = format!(
                    "spec.placementRef names the Open Cluster Management Placement {name}, but OCM is not installed on this hub (no placements.cluster.open-cluster-management.io): install OCM's hub, or drop spec.placementRef.apiGroup to use the addon's own Placement"
                );
                Some((
                    cond("PlacementSatisfied", "False", "OcmNotInstalled", &message),
                    Some(message),
                ))
            }
            Self::Found {
                name,
                satisfied: None,
            } => Some((
                cond(
                    "PlacementSatisfied",
                    "Unknown",
                    "PlacementPending",
                    &format!("Placement {name} has not been evaluated yet"),
                ),
                None,
            )),
            Self::Found {
                name,
                satisfied: Some((status, reason, message)),
            } => Some((
                cond(
                    "PlacementSatisfied",
                    status,
                    reason,
                    &format!("Placement {name}: {message}"),
                ),
                None,
            )),
        }
    }
}

/// What the reconcile found: either the validation problems (nothing applied) or the applied
/// SuperLink and pools.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// The spec is invalid; `(field path, message)` pairs.
    Invalid(Vec<(String, String)>),
    /// Applying failed (retried): the error and what to do about it.
    Failed(String),
    /// Objects applied; their readiness.
    Applied {
        /// The SuperLink StatefulSet.
        superlink: WorkloadReadiness,
        /// With `placementRef`: the external endpoints spokes and `flwr` dial, or why they are
        /// not known yet ([`external_endpoints`](crate::core::render::external_endpoints)).
        external: Option<Result<ExternalEndpoints, ExternalAddressError>>,
    },
}

/// The Federation status for `outcome`, keeping transition times of unchanged conditions.
pub fn federation_status(
    fed: &Federation,
    outcome: &Outcome,
    placement: &PlacementState,
    now: &Time,
) -> FederationStatus {
    let previous = fed.status.clone().unwrap_or_default();
    let generation = fed.metadata.generation;
    let external = match outcome {
        Outcome::Applied { external, .. } => external.as_ref(),
        Outcome::Invalid(_) | Outcome::Failed(_) => None,
    };
    let mut status = FederationStatus {
        observed_generation: generation,
        endpoints: Some(endpoints(fed, external, previous.endpoints.as_ref())),
        ..FederationStatus::default()
    };
    let placement = placement.condition();
    let mut conditions = match outcome {
        Outcome::Invalid(problems) => {
            // Nothing was touched, workloads keep running: their last known readiness stays.
            keep_readiness(&mut status, &previous);
            invalid_conditions(problems)
        }
        Outcome::Failed(message) => {
            // What was applied before keeps running: its last known readiness stays.
            keep_readiness(&mut status, &previous);
            let mut conditions = vec![cond("Degraded", "True", "ReconcileFailed", message)];
            if let Some(ready) = previous.conditions.iter().find(|c| c.type_ == "Ready") {
                conditions.push(ready.clone());
            }
            conditions.push(cond(
                "Reconciling",
                "True",
                "RetryingAfterError",
                "retried every 15 s until it succeeds (see Degraded)",
            ));
            conditions
        }
        Outcome::Applied { superlink, .. } => {
            let mut problems: Vec<String> = Vec::new();
            if let Some((_, Some(reason))) = &placement {
                problems.push(reason.clone());
            }
            if let Some(Err(why)) = external {
                problems.push(why.to_string());
            }
            applied_conditions(
                fed,
                &previous,
                &mut status,
                superlink,
                external,
                &problems,
                now,
            )
        }
    };
    conditions.extend(placement.map(|(c, _)| c));
    if let Some(warning) = crate::core::render::version_warning(fed) {
        conditions.push(cond(
            VERSION_CONDITION,
            "False",
            "NewerThanVerified",
            &warning,
        ));
    }
    status.conditions = conditions
        .into_iter()
        .map(|c| keep_time(&previous.conditions, c, now, generation))
        .collect();
    status
}

/// Degraded, Ready and Reconciling of an invalid spec (`(field path, message)` problems).
fn invalid_conditions(problems: &[(String, String)]) -> Vec<Condition> {
    let message = problems
        .iter()
        .map(|(path, msg)| {
            if path.is_empty() {
                msg.clone()
            } else {
                format!("{path}: {msg}")
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    vec![
        cond("Degraded", "True", "InvalidSpec", &message),
        cond(
            "Ready",
            "False",
            "InvalidSpec",
            "the spec is invalid; nothing was applied (see Degraded)",
        ),
        cond(
            "Reconciling",
            "False",
            "InvalidSpec",
            "waiting for a valid spec",
        ),
    ]
}

/// An applied Federation's SuperNode counts and pools in `status`, and its Degraded, Ready and
/// Reconciling conditions.
///
/// `status.clusters` (a bounded list) and `status.clusterTotals` are written from the clusters'
/// reports by the work source (its own field manager): the spokes' agents, or the hub's own
/// pools ([`crate::kube::hub_pools`]); the totals and Ready are computed here from them.
fn applied_conditions(
    fed: &Federation,
    previous: &FederationStatus,
    status: &mut FederationStatus,
    superlink: &WorkloadReadiness,
    external: Option<&Result<ExternalEndpoints, ExternalAddressError>>,
    problems: &[String],
    now: &Time,
) -> Vec<Condition> {
    let totals = crate::core::status::totals_of(fed, previous);
    let pool_totals = pool_totals_over_clusters(fed, &totals);
    let desired: i32 = pool_totals.iter().map(|p| p.desired).sum();
    let ready: i32 = pool_totals.iter().map(|p| p.ready).sum();
    status.desired_supernodes = desired;
    status.ready_supernodes = ready;
    status.supernodes = Some(format!("{ready}/{desired}"));
    status.selected_clusters = totals.selected;
    status.pools = pool_statuses(&pool_totals, previous, now, fed.metadata.generation);
    let superlink_ready = if superlink.is_ready() {
        Ok(())
    } else {
        Err(superlink.summary("SuperLink"))
    };
    let readiness = crate::core::status::readiness(
        superlink_ready,
        problems,
        fed.spec.placement_ref.is_some(),
        &previous.clusters,
        &totals,
    );
    let mut conditions = Vec::new();
    match external {
        // Valid in general, but in Kubernetes mode nothing outside reaches the SuperLink.
        Some(Err(why @ ExternalAddressError::NotExposed)) => conditions.push(cond(
            "Degraded",
            "True",
            "SuperLinkNotExposed",
            &why.to_string(),
        )),
        _ => conditions.push(cond("Degraded", "False", "Valid", "the spec is valid")),
    }
    match readiness {
        Ok(()) => {
            let message = format!("SuperLink and {ready}/{desired} SuperNodes ready");
            conditions.push(cond("Ready", "True", "AllReady", &message));
            conditions.push(cond(
                "Reconciling",
                "False",
                "Converged",
                "every object is applied and ready",
            ));
        }
        Err(message) => {
            conditions.push(cond("Ready", "False", "NotReady", &message));
            conditions.push(cond("Reconciling", "True", "Progressing", &message));
        }
    }
    conditions
}

/// Each pool summed over the clusters that reported it, in spec order, with its Ready condition.
fn pool_statuses(
    pool_totals: &[WorkloadReadiness],
    previous: &FederationStatus,
    now: &Time,
    generation: Option<i64>,
) -> Vec<PoolStatus> {
    pool_totals
        .iter()
        .map(|p| PoolStatus {
            name: p.name.clone(),
            kind: Some(p.kind.to_owned()),
            desired: p.desired,
            ready: p.ready,
            conditions: vec![keep_time(
                previous
                    .pools
                    .iter()
                    .find(|q| q.name == p.name)
                    .map_or(&[][..], |q| &q.conditions[..]),
                if p.is_ready() {
                    cond("Ready", "True", "SuperNodesReady", &p.summary("pool"))
                } else {
                    cond("Ready", "False", "SuperNodesNotReady", &p.summary("pool"))
                },
                now,
                generation,
            )],
        })
        .collect()
}

/// `superlinkService` (Control API in the cluster) and, for a placed Federation, the external
/// Fleet and Control endpoints; while they are unknown (invalid spec, address pending) the
/// previous ones are kept, since what runs still uses them.
fn endpoints(
    fed: &Federation,
    external: Option<&Result<ExternalEndpoints, ExternalAddressError>>,
    previous: Option<&FederationEndpoints>,
) -> FederationEndpoints {
    let ns = fed.namespace().unwrap_or_else(|| "default".to_owned());
    let (fleet, control) = match external {
        Some(Ok(e)) => (Some(e.fleet.clone()), e.control.clone()),
        _ if fed.spec.placement_ref.is_some() => previous
            .map(|p| (p.fleet.clone(), p.control.clone()))
            .unwrap_or_default(),
        _ => (None, None),
    };
    FederationEndpoints {
        // Only with `exposeControl` is Control on the pod network (Service
        // `<fed>-superlink-control`); otherwise it is on the pod's loopback.
        superlink_service: fed.spec.superlink.service.expose_control.then(|| {
            format!(
                "{}.{ns}.svc:{}",
                crate::core::superlink::control_service_name(&superlink_name(&fed.name_any())),
                fed.spec.superlink.service.ports.extra
            )
        }),
        fleet,
        control,
    }
}

/// Per-pool readiness of a placed Federation: each pool of the spec summed over the clusters'
/// reports ([`crate::core::status::cluster_totals`]; a pool they do not count yet is 0/0).
fn pool_totals_over_clusters(fed: &Federation, totals: &ClusterTotals) -> Vec<WorkloadReadiness> {
    let kind = match fed.spec.mode {
        DeploymentMode::StatefulSet => "StatefulSet",
        DeploymentMode::DaemonSet => "DaemonSet",
    };
    fed.spec
        .supernodes
        .pools
        .iter()
        .map(|pool| {
            let total = totals.pools.iter().find(|t| t.name == pool.name);
            WorkloadReadiness {
                name: pool.name.clone(),
                kind,
                desired: total.map_or(0, |t| t.desired),
                ready: total.map_or(0, |t| t.ready),
                stale: false,
            }
        })
        .collect()
}

/// Condition type set `False` (reason `NewerThanVerified`) while `spec.version` is a Flower release
/// newer than the ones flower-addon is verified with; absent otherwise.
pub const VERSION_CONDITION: &str = "FlowerVersionVerified";

/// The readiness fields of `previous`, for an outcome that applied nothing.
fn keep_readiness(status: &mut FederationStatus, previous: &FederationStatus) {
    status.supernodes = previous.supernodes.clone();
    status.ready_supernodes = previous.ready_supernodes;
    status.desired_supernodes = previous.desired_supernodes;
    status.selected_clusters = previous.selected_clusters;
    status.pools = previous.pools.clone();
}

fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

/// Sets the transition time (kept from `previous` when the condition's status did not change)
/// and the observed generation.
fn keep_time(
    previous: &[Condition],
    mut c: Condition,
    now: &Time,
    generation: Option<i64>,
) -> Condition {
    c.last_transition_time = previous
        .iter()
        .find(|p| p.type_ == c.type_ && p.status == c.status)
        .map_or_else(|| now.clone(), |p| p.last_transition_time.clone());
    c.observed_generation = generation;
    c
}

#[cfg(test)]
mod tests;

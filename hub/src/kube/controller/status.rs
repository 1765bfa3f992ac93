//! The Federation status from what was applied (pure): `supernodes "r/d"`, per-pool readiness,
//! endpoints and the conditions `Ready`, `Reconciling`, `Degraded` and, for a Federation with
//! `placementRef`, `PlacementSatisfied` (mirrored from its Placement).
//!
//! Unchanged facts give an identical status (a condition keeps its `lastTransitionTime` while its
//! status stays), so the controller only writes when something changed and never loops on its
//! own status updates.

use flower_addon_crds::{
    ClusterStatus, DeploymentMode, Federation, FederationEndpoints, FederationStatus, PoolStatus,
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
    /// Objects applied; their readiness.
    Applied {
        /// The SuperLink StatefulSet.
        superlink: WorkloadReadiness,
        /// Pools in the hub cluster (empty with `placementRef`).
        pools: Vec<WorkloadReadiness>,
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
        Outcome::Invalid(_) => None,
    };
    let mut status = FederationStatus {
        observed_generation: generation,
        endpoints: Some(endpoints(fed, external, previous.endpoints.as_ref())),
        ..FederationStatus::default()
    };
    let mut conditions = Vec::new();
    let placement = placement.condition();
    match outcome {
        Outcome::Invalid(problems) => {
            // Keep the last known readiness: nothing was touched, workloads keep running.
            status.supernodes = previous.supernodes.clone();
            status.ready_supernodes = previous.ready_supernodes;
            status.desired_supernodes = previous.desired_supernodes;
            status.selected_clusters = previous.selected_clusters;
            status.pools = previous.pools.clone();
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
            conditions.push(cond("Degraded", "True", "InvalidSpec", &message));
            conditions.push(cond(
                "Ready",
                "False",
                "InvalidSpec",
                "the spec is invalid; nothing was applied (see Degraded)",
            ));
            conditions.push(cond(
                "Reconciling",
                "False",
                "InvalidSpec",
                "waiting for a valid spec",
            ));
        }
        Outcome::Applied {
            superlink, pools, ..
        } => {
            let mut desired: i32 = pools.iter().map(|p| p.desired).sum();
            let mut ready: i32 = pools.iter().map(|p| p.ready.min(p.desired)).sum();
            // Spoke clusters: `status.clusters` is written from the agents' reports by the work
            // source (its own field manager); the totals and Ready are computed here from it.
            let spokes = if fed.spec.placement_ref.is_some() {
                previous.clusters.clone()
            } else {
                Vec::new()
            };
            for cluster in &spokes {
                for p in &cluster.pools {
                    desired += p.desired;
                    ready += p.ready.min(p.desired);
                }
            }
            status.desired_supernodes = desired;
            status.ready_supernodes = ready;
            status.supernodes = Some(format!("{ready}/{desired}"));
            status.selected_clusters = if fed.spec.placement_ref.is_some() {
                i32::try_from(spokes.len()).unwrap_or(i32::MAX)
            } else {
                1
            };
            // Placed pools: each pool summed over the clusters that reported it, in spec order.
            let placed_pools: Vec<WorkloadReadiness>;
            let pool_totals = if fed.spec.placement_ref.is_some() {
                placed_pools = pool_totals_over_clusters(fed, &spokes);
                &placed_pools
            } else {
                pools
            };
            status.pools = pool_totals
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
                .collect();
            let mut not_ready: Vec<String> = Vec::new();
            if !superlink.is_ready() {
                not_ready.push(superlink.summary("SuperLink"));
            }
            not_ready.extend(
                pools
                    .iter()
                    .filter(|p| !p.is_ready())
                    .map(|p| p.summary("pool")),
            );
            if let Some((_, Some(reason))) = &placement {
                not_ready.push(reason.clone());
            }
            if let Some(Err(why)) = external {
                not_ready.push(why.to_string());
            }
            if fed.spec.placement_ref.is_some() {
                if spokes.is_empty() {
                    not_ready.push("no cluster selected by the Placement (yet)".to_owned());
                }
                for cluster in &spokes {
                    if !cluster.connected {
                        not_ready.push(format!("cluster {}: agent not connected", cluster.name));
                    }
                    for p in cluster.pools.iter().filter(|p| p.ready < p.desired) {
                        not_ready.push(format!(
                            "cluster {} pool {}: {}/{} ready",
                            cluster.name, p.name, p.ready, p.desired
                        ));
                    }
                }
            }
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
            if not_ready.is_empty() {
                let message = format!("SuperLink and {ready}/{desired} SuperNodes ready");
                conditions.push(cond("Ready", "True", "AllReady", &message));
                conditions.push(cond(
                    "Reconciling",
                    "False",
                    "Converged",
                    "every object is applied and ready",
                ));
            } else {
                let message = not_ready.join("; ");
                conditions.push(cond("Ready", "False", "NotReady", &message));
                conditions.push(cond("Reconciling", "True", "Progressing", &message));
            }
        }
    }
    conditions.extend(placement.map(|(c, _)| c));
    status.conditions = conditions
        .into_iter()
        .map(|c| keep_time(&previous.conditions, c, now, generation))
        .collect();
    status
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
        superlink_service: Some(format!(
            "{}.{ns}.svc:{}",
            superlink_name(&fed.name_any()),
            fed.spec.superlink.service.ports.extra
        )),
        fleet,
        control,
    }
}

/// Per-pool readiness of a placed Federation: each pool of the spec summed over the clusters'
/// reports (a pool no cluster runs is 0/0).
fn pool_totals_over_clusters(
    fed: &Federation,
    clusters: &[ClusterStatus],
) -> Vec<WorkloadReadiness> {
    let kind = match fed.spec.mode {
        DeploymentMode::StatefulSet => "StatefulSet",
        DeploymentMode::DaemonSet => "DaemonSet",
    };
    fed.spec
        .supernodes
        .pools
        .iter()
        .map(|pool| {
            let reported = clusters
                .iter()
                .flat_map(|c| c.pools.iter())
                .filter(|p| p.name == pool.name);
            let (desired, ready) = reported.fold((0, 0), |(d, r), p| {
                (d + p.desired, r + p.ready.min(p.desired))
            });
            WorkloadReadiness {
                name: pool.name.clone(),
                kind,
                desired,
                ready,
                stale: false,
            }
        })
        .collect()
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
mod tests {
    use super::*;

    fn fed() -> Federation {
        let mut f: Federation = serde_saphyr::from_str(
            r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {name: f, namespace: team, generation: 3}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  superlink: {image: "flwr/superlink:1.42.0"}
  supernodes: {image: "flwr/supernode:1.42.0", pools: [{name: a, replicas: 2, images: {}}]}
"#,
        )
        .unwrap();
        f.status = None;
        f
    }

    fn w(name: &str, desired: i32, ready: i32) -> WorkloadReadiness {
        WorkloadReadiness {
            name: name.into(),
            kind: "StatefulSet",
            desired,
            ready,
            stale: false,
        }
    }

    fn find<'a>(s: &'a FederationStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn not_ready_names_what_is_missing() {
        // Users see which pool or the SuperLink holds Ready back, with counts.
        let outcome = Outcome::Applied {
            superlink: w("superlink", 1, 1),
            pools: vec![w("a", 2, 1)],
            external: None,
        };
        let s = federation_status(&fed(), &outcome, &PlacementState::NotReferenced, &at(10));
        assert_eq!(s.supernodes.as_deref(), Some("1/2"));
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(find(&s, "Ready").status, "False");
        assert!(find(&s, "Ready").message.contains("pool a: 1/2 ready"));
        assert_eq!(find(&s, "Reconciling").status, "True");
        assert_eq!(
            s.endpoints.unwrap().superlink_service.as_deref(),
            Some("f-superlink.team.svc:9093")
        );
    }

    #[test]
    fn unchanged_facts_give_an_identical_status() {
        // The controller writes status only on change, so it never loops on its own writes.
        let outcome = Outcome::Applied {
            superlink: w("superlink", 1, 1),
            pools: vec![w("a", 2, 2)],
            external: None,
        };
        let mut f = fed();
        let first = federation_status(&f, &outcome, &PlacementState::NotReferenced, &at(10));
        assert_eq!(find(&first, "Ready").status, "True");
        f.status = Some(first.clone());
        assert_eq!(
            federation_status(&f, &outcome, &PlacementState::NotReferenced, &at(20)),
            first
        );
    }

    #[test]
    fn invalid_spec_is_degraded_with_the_field_path() {
        // The message names the field to fix; readiness of what runs is kept.
        let outcome = Outcome::Invalid(vec![("spec.version".into(), "not set".into())]);
        let s = federation_status(&fed(), &outcome, &PlacementState::NotReferenced, &at(10));
        assert_eq!(find(&s, "Degraded").status, "True");
        assert_eq!(find(&s, "Degraded").message, "spec.version: not set");
        assert_eq!(find(&s, "Ready").status, "False");
    }

    #[test]
    fn a_placement_ref_mirrors_the_placement_and_a_missing_one_holds_ready_back() {
        // Invariant: no placementRef → no PlacementSatisfied; a missing Placement → False naming
        // it and the fix, and Ready=False says so; an evaluated one is mirrored; an unevaluated
        // one is Unknown.
        let outcome = Outcome::Applied {
            superlink: w("superlink", 1, 1),
            pools: vec![],
            external: None,
        };
        let plain = federation_status(&fed(), &outcome, &PlacementState::NotReferenced, &at(10));
        assert!(
            plain
                .conditions
                .iter()
                .all(|c| c.type_ != "PlacementSatisfied")
        );

        let missing = PlacementState::of("sites", None);
        let s = federation_status(&fed(), &outcome, &missing, &at(10));
        let c = find(&s, "PlacementSatisfied");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "PlacementNotFound")
        );
        assert!(
            c.message.contains("Placement sites not found"),
            "{}",
            c.message
        );
        assert!(
            c.message.contains("spec.placementRef.name"),
            "{}",
            c.message
        );
        assert_eq!(find(&s, "Ready").status, "False");
        assert!(
            find(&s, "Ready")
                .message
                .contains("Placement sites not found")
        );

        let mut placement: flower_addon_crds::Placement = serde_saphyr::from_str(
            "apiVersion: flower-addon.io/v1alpha1\nkind: Placement\nmetadata: {name: sites, namespace: team}\nspec: {}\n",
        )
        .unwrap();
        let pending = PlacementState::of("sites", Some(&placement));
        let s = federation_status(&fed(), &outcome, &pending, &at(10));
        assert_eq!(find(&s, "PlacementSatisfied").status, "Unknown");

        placement.status = Some(flower_addon_crds::PlacementStatus {
            conditions: vec![cond(
                "PlacementSatisfied",
                "False",
                "NotAllDecisionsScheduled",
                "1 of 3 clusters selected",
            )],
            ..Default::default()
        });
        let s = federation_status(
            &fed(),
            &outcome,
            &PlacementState::of("sites", Some(&placement)),
            &at(10),
        );
        let c = find(&s, "PlacementSatisfied");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (
                "False",
                "NotAllDecisionsScheduled",
                "Placement sites: 1 of 3 clusters selected"
            )
        );
    }

    fn placed(clusters: Vec<ClusterStatus>) -> Federation {
        let mut f = fed();
        f.spec.placement_ref = Some(flower_addon_crds::PlacementRef { name: "p".into() });
        f.status = Some(FederationStatus {
            clusters,
            ..FederationStatus::default()
        });
        f
    }

    fn reported(name: &str, pools: &[(&str, i32, i32)]) -> ClusterStatus {
        ClusterStatus {
            name: name.into(),
            connected: true,
            pools: pools
                .iter()
                .map(|(p, desired, ready)| PoolStatus {
                    name: (*p).into(),
                    desired: *desired,
                    ready: *ready,
                    ..PoolStatus::default()
                })
                .collect(),
            ..ClusterStatus::default()
        }
    }

    #[test]
    fn placed_federations_show_derived_endpoints_and_pools_summed_over_clusters() {
        // A placed Federation's status has the Fleet and Control addresses the hub derived and
        // one entry per pool summed over the clusters, like a hub-local one.
        let f = placed(vec![
            reported("s1", &[("a", 2, 2)]),
            reported("s2", &[("a", 2, 1)]),
        ]);
        let outcome = Outcome::Applied {
            superlink: w("superlink", 1, 1),
            pools: vec![],
            external: Some(Ok(ExternalEndpoints {
                fleet: "198.18.0.1:30092".into(),
                control: Some("198.18.0.1:30093".into()),
            })),
        };
        let s = federation_status(&f, &outcome, &PlacementState::NotReferenced, &at(10));
        let endpoints = s.endpoints.clone().unwrap();
        assert_eq!(endpoints.fleet.as_deref(), Some("198.18.0.1:30092"));
        assert_eq!(endpoints.control.as_deref(), Some("198.18.0.1:30093"));
        assert_eq!(s.pools.len(), 1);
        assert_eq!(
            (
                s.pools[0].name.as_str(),
                s.pools[0].desired,
                s.pools[0].ready
            ),
            ("a", 4, 3)
        );
        assert_eq!(s.pools[0].kind.as_deref(), Some("StatefulSet"));
        assert_eq!(s.supernodes.as_deref(), Some("3/4"));
    }

    #[test]
    fn an_unknown_external_address_holds_ready_back_and_keeps_the_old_one() {
        // While the address is pending, Ready says what it waits for and the last known
        // endpoints stay (SuperNodes still dial them); a ClusterIP Service is Degraded.
        let mut f = placed(vec![reported("s1", &[("a", 2, 2)])]);
        f.status.as_mut().unwrap().endpoints = Some(FederationEndpoints {
            fleet: Some("198.18.0.1:30092".into()),
            ..FederationEndpoints::default()
        });
        let pending = Outcome::Applied {
            superlink: w("superlink", 1, 1),
            pools: vec![],
            external: Some(Err(ExternalAddressError::Pending("a node port".into()))),
        };
        let s = federation_status(&f, &pending, &PlacementState::NotReferenced, &at(10));
        assert_eq!(find(&s, "Ready").status, "False");
        assert!(
            find(&s, "Ready")
                .message
                .contains("waiting for a node port")
        );
        assert_eq!(
            s.endpoints.unwrap().fleet.as_deref(),
            Some("198.18.0.1:30092")
        );
        let hidden = Outcome::Applied {
            superlink: w("superlink", 1, 1),
            pools: vec![],
            external: Some(Err(ExternalAddressError::NotExposed)),
        };
        let s = federation_status(&f, &hidden, &PlacementState::NotReferenced, &at(10));
        assert_eq!(find(&s, "Degraded").status, "True");
        assert!(
            find(&s, "Degraded")
                .message
                .starts_with("spec.superlink.externalAddress: required")
        );
    }
}

//! The status writer of the Kubernetes-mode work source: keeps `status.clusters` and
//! `status.clusterTotals` of every Federation current from the agents' reports, under its own
//! field manager ([`CLUSTER_STATUS_FIELD_MANAGER`]; the rest of the status is the Federation
//! controller's). A status is written only when it changed beyond the time of the last report
//! ([`same_but_fresh`]), and not again while the cache has not caught up with the last write
//! ([`needs_status_write`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use flower_addon_crds::{Federation, ManagedCluster};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::events::EventType;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

use super::{Report, Stores};
use crate::core::HUB_CLUSTER;
use crate::flower::registry::NodeKeyRegistry;

/// Field manager of the per-cluster part of the Federation status (`status.clusters`), which
/// the work source owns; everything else in the status is the Federation controller's.
pub const CLUSTER_STATUS_FIELD_MANAGER: &str = "flower-addon-hub-clusters";
/// How often the per-cluster status is refreshed without new reports (connectivity changes).
const STATUS_RESYNC: Duration = Duration::from_secs(10);

/// What the status writer last wrote for a Federation: the resourceVersion of the cached object
/// it was computed from, the listed clusters, the totals and the `SuperLinkHealthy` condition.
type WrittenStatus = (
    Option<String>,
    Vec<flower_addon_crds::ClusterStatus>,
    flower_addon_crds::ClusterTotals,
    Option<Condition>,
);

/// Keeps `status.clusters` of every Federation current from the agents' reports (and the hub's
/// own pools' report, cluster [`HUB_CLUSTER`], for a Federation without `placementRef`): per
/// cluster its pools' `ready/desired`, whether it is connected (`Available=True`; always for the
/// hub's own cluster), the time of its last report, and what is missing.
pub(super) async fn write_cluster_statuses(
    client: Client,
    stores: Stores,
    reports: Arc<DashMap<String, Report>>,
    registry: Arc<NodeKeyRegistry>,
    mut reported: watch::Receiver<u64>,
) {
    // What was last written per Federation, and the resourceVersion of the cached object it
    // was computed from: while the reflector has not yet seen that write, the cache still shows
    // the old status, and the same write is not sent again.
    let mut written: BTreeMap<(String, String), WrittenStatus> = BTreeMap::new();
    let recorder = crate::kube::controller::apply::recorder(client.clone());
    loop {
        tokio::select! {
            changed = reported.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(STATUS_RESYNC) => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let clusters: BTreeMap<String, Arc<ManagedCluster>> = stores
            .clusters
            .state()
            .into_iter()
            .map(|mc| (mc.name_any(), mc))
            .collect();
        let decided = super::Decided::of(&stores);
        let federations = stores.federations.state();
        let live: BTreeSet<(String, String)> = federations
            .iter()
            .map(|f| (f.namespace().unwrap_or_default(), f.name_any()))
            .collect();
        written.retain(|key, _| live.contains(key));
        for fed in federations {
            let key = (fed.namespace().unwrap_or_default(), fed.name_any());
            let selected = decided.placed_on(&fed, |c| clusters.contains_key(c));
            let keys = registry.get(&key).filter(|k| k.listed);
            let all: Vec<flower_addon_crds::ClusterStatus> = selected
                .iter()
                .map(|name| {
                    cluster_status(
                        &fed,
                        name,
                        clusters.get(name).map(AsRef::as_ref),
                        reports.get(name).as_deref(),
                        keys.as_ref().map(|k| &k.online),
                    )
                })
                .collect();
            // A bounded list and the totals over all (etcd refuses objects over 1.5 MiB).
            let listed = all.len().min(crate::core::status::LISTED_CLUSTERS);
            let totals = crate::core::status::cluster_totals(&fed, &all, listed);
            let want = crate::core::status::listed_clusters(all);
            let current_health = fed.status.as_ref().and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == crate::core::status::SUPERLINK_HEALTHY)
            });
            let health = keys.as_ref().map(|k| {
                let (status, reason, message) = crate::core::status::superlink_health(
                    k.problem
                        .as_ref()
                        .map(crate::flower::registry::Diagnosis::health),
                );
                health_condition(
                    current_health,
                    status,
                    reason,
                    message,
                    fed.metadata.generation,
                )
            });
            let wanted = (fed.resource_version(), want, totals, health);
            if already_written(&fed, &wanted, written.get(&key)) {
                continue;
            }
            if write_one(&client, &recorder, &fed, &wanted).await {
                written.insert(key, wanted);
            }
        }
    }
}

/// Whether `wanted` (the resourceVersion it is computed from, the listed clusters, the totals
/// and the health condition) is what `fed`'s status holds, or what was `last` written from the
/// same resourceVersion (the cache has not caught up with that write yet).
fn already_written(fed: &Federation, wanted: &WrittenStatus, last: Option<&WrittenStatus>) -> bool {
    let (version, want, totals, health) = wanted;
    let current = fed.status.as_ref().map(|s| &s.clusters[..]).unwrap_or(&[]);
    let current_totals = fed.status.as_ref().and_then(|s| s.cluster_totals.as_ref());
    let current_health = fed.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == crate::core::status::SUPERLINK_HEALTHY)
    });
    let totals_written = current_totals == Some(totals)
        || last.is_some_and(|(at, _, t, _)| at == version && t == totals);
    let listed_written = !needs_status_write(
        current,
        want,
        last.map(|(at, listed, _, _)| (at, listed)),
        version,
    );
    let health_written = same_condition(current_health, health.as_ref())
        || last.is_some_and(|(at, _, _, h)| {
            at == version && same_condition(h.as_ref(), health.as_ref())
        });
    totals_written && listed_written && health_written
}

/// Applies `wanted`'s clusters, totals and health condition to `fed`'s status under
/// [`CLUSTER_STATUS_FIELD_MANAGER`], with a Warning event when the SuperLink newly turned
/// unhealthy. Whether it was written.
async fn write_one(
    client: &Client,
    recorder: &kube::runtime::events::Recorder,
    fed: &Federation,
    wanted: &WrittenStatus,
) -> bool {
    let (_, want, totals, health) = wanted;
    let namespace = fed.namespace().unwrap_or_default();
    let current_health = fed.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == crate::core::status::SUPERLINK_HEALTHY)
    });
    let mut status = serde_json::json!({"clusters": want, "clusterTotals": totals});
    if let Some(health) = health {
        status["conditions"] = serde_json::json!([health]);
    }
    let body = serde_json::json!({
        "apiVersion": flower_addon_crds::API_VERSION,
        "kind": "Federation",
        "status": status,
    });
    let name = fed.name_any();
    let result = Api::<Federation>::namespaced(client.clone(), &namespace)
        .patch_status(
            &name,
            &kube::api::PatchParams::apply(CLUSTER_STATUS_FIELD_MANAGER),
            &kube::api::Patch::Apply(&body),
        )
        .await;
    match result {
        Ok(_) => {
            if let Some(h) = health.as_ref().filter(|h| {
                h.status == "False"
                    && !current_health.is_some_and(|c| c.status == "False" && c.reason == h.reason)
            }) {
                crate::kube::controller::apply::publish(
                    recorder,
                    fed,
                    EventType::Warning,
                    "Diagnose",
                    &h.reason,
                    h.message.clone(),
                )
                .await;
            }
            true
        }
        Err(error) => {
            tracing::warn!(%namespace, federation = %name, %error, "cannot write the per-cluster status");
            false
        }
    }
}

/// The `SuperLinkHealthy` condition, keeping `current`'s transition time while its status holds.
fn health_condition(
    current: Option<&Condition>,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: crate::core::status::SUPERLINK_HEALTHY.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time: current.filter(|c| c.status == status).map_or_else(
            || Time(k8s_openapi::jiff::Timestamp::now()),
            |c| c.last_transition_time.clone(),
        ),
    }
}

/// Whether two conditions say the same (their times and generations aside).
fn same_condition(a: Option<&Condition>, b: Option<&Condition>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            a.type_ == b.type_
                && a.status == b.status
                && a.reason == b.reason
                && a.message == b.message
        }
        (None, None) => true,
        _ => false,
    }
}

/// Whether `want` must be written over the cached `current` status (of the object at
/// `version`): not when they agree, and not when `want` is what was last written (`written`)
/// from this very `version`, i.e. the cache has not caught up with that write yet.
fn needs_status_write(
    current: &[flower_addon_crds::ClusterStatus],
    want: &[flower_addon_crds::ClusterStatus],
    written: Option<(&Option<String>, &Vec<flower_addon_crds::ClusterStatus>)>,
    version: &Option<String>,
) -> bool {
    !same_but_fresh(current, want)
        && !written.is_some_and(|(at, last)| at == version && same_but_fresh(last, want))
}

/// How stale `lastReport` may get before it alone causes a status write.
const REPORT_TIME_SLACK: i64 = 60;

/// True when `current` equals `want` up to `lastReport` times less than
/// [`REPORT_TIME_SLACK`] apart (so periodic reports do not rewrite the status each time).
fn same_but_fresh(
    current: &[flower_addon_crds::ClusterStatus],
    want: &[flower_addon_crds::ClusterStatus],
) -> bool {
    current.len() == want.len()
        && current.iter().zip(want).all(|(c, w)| {
            let close = match (&c.last_report, &w.last_report) {
                (Some(a), Some(b)) => (a.0.as_second() - b.0.as_second()).abs() < REPORT_TIME_SLACK,
                (None, None) => true,
                _ => false,
            };
            close
                && flower_addon_crds::ClusterStatus {
                    last_report: None,
                    ..c.clone()
                } == flower_addon_crds::ClusterStatus {
                    last_report: None,
                    ..w.clone()
                }
        })
}

/// The status of Federation `fed` in cluster `name` ([`crate::core::status::cluster_status`];
/// connected when the ManagedCluster is `Available=True`, or when it is the hub's own cluster).
fn cluster_status(
    fed: &Federation,
    name: &str,
    cluster: Option<&ManagedCluster>,
    report: Option<&Report>,
    online: Option<&BTreeSet<String>>,
) -> flower_addon_crds::ClusterStatus {
    let connected = name == HUB_CLUSTER
        || cluster.and_then(|mc| mc.status.as_ref()).is_some_and(|st| {
            st.conditions.iter().any(|c| {
                c.type_ == crate::registration::store::CONDITION_AVAILABLE && c.status == "True"
            })
        });
    crate::core::status::cluster_status(
        &fed.namespace().unwrap_or_default(),
        &fed.name_any(),
        name,
        connected,
        report.map(|r| (&r.status, r.at)),
        online,
        flower_addon_crds::supernode_restart_mark(fed).as_deref(),
    )
}

#[cfg(test)]
mod tests;

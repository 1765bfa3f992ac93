//! Kubernetes mode's per-Federation and per-cluster gauges, read at scrape time from caches the
//! hub keeps anyway (the work source's Federations and ManagedClusters) plus one watch of the
//! SuperLink pods for their container restarts: a scrape sends no request to the apiserver.
use crate::kube::backoff::ShortBackoff;
use crate::metrics::{FederationLabels, FederationSample};
use flower_addon_crds::{Federation, ManagedCluster};
use flower_addon_runtime::ops::Refresh;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The label selector of SuperLink pods (the labels [`crate::core::render`] gives them).
pub fn superlink_pods_selector() -> String {
    format!(
        "app.kubernetes.io/component=superlink,app.kubernetes.io/managed-by={}",
        flower_addon_crds::render::MANAGED_BY
    )
}

/// Starts the SuperLink pod watch and returns the scrape-time refresh of the hub's gauges from
/// `federations`, `clusters` and those pods.
pub fn refresh(
    client: Client,
    federations: Store<Federation>,
    clusters: Store<ManagedCluster>,
) -> Refresh {
    let (pods, writer) = reflector::store::<Pod>();
    let watch = watcher(
        Api::<Pod>::all(client),
        watcher::Config::default().labels(&superlink_pods_selector()),
    )
    .backoff(ShortBackoff::default())
    .modify(|pod| {
        // Only the restart counts are read: keep the cache small.
        pod.managed_fields_mut().clear();
        pod.spec = None;
    })
    .reflect(writer)
    .for_each(|_| futures::future::ready(()));
    tokio::spawn(watch);
    Arc::new(move || {
        record(&federations, &clusters, &pods);
        Box::pin(async { crate::metrics::refresh_process() })
    })
}

/// Sets the gauges from the caches.
fn record(federations: &Store<Federation>, clusters: &Store<ManagedCluster>, pods: &Store<Pod>) {
    let mut restarts: BTreeMap<(String, String), i64> = BTreeMap::new();
    for pod in pods.state() {
        let Some(instance) = pod.labels().get("app.kubernetes.io/instance") else {
            continue;
        };
        let count: i64 = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map(|cs| cs.iter().map(|c| i64::from(c.restart_count)).sum())
            .unwrap_or(0);
        *restarts
            .entry((pod.namespace().unwrap_or_default(), instance.clone()))
            .or_default() += count;
    }
    crate::metrics::hub().set_federations(federations.state().iter().map(|fed| {
        let key = (fed.namespace().unwrap_or_default(), fed.name_any());
        let status = fed.status.clone().unwrap_or_default();
        let mut sample = FederationSample::of(
            status.desired_supernodes,
            status.ready_supernodes,
            &crate::core::status::totals_of(fed, &status),
        );
        sample.superlink_restarts = Some(restarts.get(&key).copied().unwrap_or(0));
        let labels = FederationLabels {
            namespace: key.0,
            federation: key.1,
        };
        (labels, sample)
    }));
    let clusters = clusters.state();
    crate::metrics::hub().set_clusters(clusters.iter().map(|c| {
        c.status
            .as_ref()
            .and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == crate::registration::store::CONDITION_AVAILABLE)
            })
            .map(|c| c.status.as_str())
    }));
}

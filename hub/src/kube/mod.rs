//! Kubernetes mode: the Federation, Placement and FlowerRun controllers ([`controller`]), the
//! work source that turns Federations and PlacementDecisions into each cluster's work
//! ([`work`]), and the cluster store on `ManagedCluster`s and Secrets ([`store`]), and the hub's
//! own cluster run like a spoke by the embedded agent runtime ([`hub_pools`]); how the hub dials
//! a SuperLink's Control API ([`control`]). Around them: leader election
//! ([`leader`]), the readiness gate that passes once the watches have listed ([`list_gate`]) and
//! the scrape-time gauges ([`metrics`]).
pub mod backoff;
pub mod control;
pub mod controller;
pub mod hub_pools;
pub mod leader;
pub mod list_gate;
pub mod metrics;
pub mod ocm;
pub mod ocm_addon;
pub mod portforward;
pub mod store;
pub mod work;

use std::future::Future;
use std::sync::Arc;

use crate::registration::ca::HubCa;

/// The Federation and FlowerRun controllers, the work source and the hub's own pools, without
/// the work channel and the Placement controller: what runs Federations without `placementRef` (tests,
/// and a hub cluster with no spokes). Returns once `shutdown` resolved and everything stopped.
pub async fn run_hub_cluster(
    client: kube::Client,
    ca: Arc<HubCa>,
    settings: controller::Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), work::KubeWorkError> {
    let work = Arc::new(
        work::KubeWorkSource::start_with_policy(
            client.clone(),
            ca.clone(),
            settings.pod_policy.clone(),
        )
        .await?,
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let runs = tokio::spawn(controller::runs::run(
        client.clone(),
        ca.clone(),
        settings.fab_egress.clone(),
        stopped(stop_rx.clone()),
    ));
    let pod_policy = settings.pod_policy.clone();
    let federations = tokio::spawn(controller::run(
        client.clone(),
        ca,
        settings,
        flower_addon_runtime::ops::Health::new(&[]),
        stopped(stop_rx.clone()),
    ));
    let local_pools = tokio::spawn(hub_pools::run(client, work, pod_policy, stopped(stop_rx)));
    shutdown.await;
    let _ = stop_tx.send(true);
    let _ = federations.await;
    let _ = local_pools.await;
    let _ = runs.await;
    Ok(())
}

/// Drops `metadata.managedFields` from a cached object: nothing the hub does reads them, and
/// over 10,000 ManagedClusters they are most of the cache.
pub(crate) fn strip_managed_fields<K: kube::Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

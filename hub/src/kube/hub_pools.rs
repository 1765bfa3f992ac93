//! The hub's own cluster as a cluster like the others: the pools of Federations without
//! `placementRef` are the work of [`HUB_CLUSTER`] ([`crate::kube::work`] computes it like every
//! spoke's), applied by the agent's Kubernetes runtime embedded in the hub
//! ([`flower_addon_runtime::kube_runtime::KubeRuntime`]) under its own field manager
//! [`LOCAL_POOLS_FIELD_MANAGER`] and owned by their Federation, and reported back like an
//! agent's status. So hub-local pools get exactly what placed pools get: one key pair per
//! SuperNode made in the cluster, registered with the SuperLink before the SuperNode starts,
//! readiness from the SuperLink's node list, and the same rendering.
//!
//! The loop applies when the work changed, when the last apply failed (after [`RETRY`]) and every
//! [`RESYNC`] (drift); it reports what it observes when a pool's workload changes (a watch, whose
//! cache the runtime reads instead of asking the apiserver) and every [`OBSERVE_EVERY`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use flower_addon_crds::Federation;
use flower_addon_proto::{ClusterWork, Status};
use flower_addon_runtime::kube_runtime::{
    APPLIED_BY_LABEL, Applier, KubeRuntime, OwnerFn, WORKLOAD_MISSING,
};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::time::Instant;

use crate::channel::source::WorkSource;
use crate::core::HUB_CLUSTER;
use crate::kube::backoff::ShortBackoff;
use crate::kube::work::KubeWorkSource;

/// Field manager (and `flower-addon.io/applied-by` value) of the hub's own pools; distinct from
/// the Federation controller's, so neither prunes the other's objects, and from the agent's, so an
/// agent also running in the hub cluster keeps its own.
pub const LOCAL_POOLS_FIELD_MANAGER: &str = "flower-addon-hub-pools";
/// How often the pools' state is observed and reported.
pub const OBSERVE_EVERY: Duration = Duration::from_secs(5);
/// How soon a failed apply is retried.
pub const RETRY: Duration = Duration::from_secs(5);
/// How often unchanged work is applied anyway (objects changed by hand are put back).
pub const RESYNC: Duration = Duration::from_secs(300);

/// The applier of the hub's own pools: [`LOCAL_POOLS_FIELD_MANAGER`], each Federation's objects
/// owned by it (controller reference from `federations`, as the controller's own objects).
pub fn applier(federations: Store<Federation>) -> Applier {
    let owners: OwnerFn = Arc::new(move |namespace: &str, name: &str| {
        let fed = federations.get(&ObjectRef::new(name).within(namespace))?;
        crate::kube::controller::controller_ref(fed.as_ref())
    });
    Applier::new(LOCAL_POOLS_FIELD_MANAGER, Some(owners))
}

/// The applier `flower-hub render` marks hub-local pools with (no owner: offline there is no uid).
pub fn offline_applier() -> Applier {
    Applier::new(LOCAL_POOLS_FIELD_MANAGER, None)
}

/// Runs the hub's own pools from `work` until `shutdown` resolves.
pub async fn run(
    client: Client,
    work: Arc<KubeWorkSource>,
    policy: flower_addon_crds::policy::PodPolicy,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    // The pools' workloads are watched: their status is read from the cache (no GET per pool
    // per observation) and a change is reported at once instead of at the next OBSERVE_EVERY.
    let (statefulsets, sts_writer) = reflector::store::<StatefulSet>();
    let (daemonsets, ds_writer) = reflector::store::<DaemonSet>();
    let mine = watcher::Config::default()
        .labels(&format!("{APPLIED_BY_LABEL}={LOCAL_POOLS_FIELD_MANAGER}"));
    let sts_events = watcher(Api::<StatefulSet>::all(client.clone()), mine.clone())
        .backoff(ShortBackoff::default())
        .reflect(sts_writer)
        .map(|_| ())
        .boxed();
    let ds_events = watcher(Api::<DaemonSet>::all(client.clone()), mine)
        .backoff(ShortBackoff::default())
        .reflect(ds_writer)
        .map(|_| ())
        .boxed();
    let mut workload_events = futures::stream::select(sts_events, ds_events);
    // The hub admin's pod policy, as a spoke's agent applies its own (namespaces are the
    // Federation author's: the hub neither refuses nor labels them).
    let runtime = KubeRuntime::with_applier(client.clone(), applier(work.federations()))
        .with_policy(policy)
        .with_workload_cache(statefulsets, daemonsets);
    let mut changes = work.changes();
    let mut applied: Option<ClusterWork> = None;
    let mut next_apply = Instant::now();
    tokio::pin!(shutdown);
    loop {
        let mut snapshot = work.snapshot(HUB_CLUSTER);
        snapshot.version = 0;
        with_user_cas(&client, &work.federations(), &mut snapshot).await;
        if applied.as_ref() != Some(&snapshot) || Instant::now() >= next_apply {
            let started = std::time::Instant::now();
            let result = runtime.apply_work(&snapshot).await;
            tracing::debug!(
                took_us = started.elapsed().as_micros() as u64,
                "hub-local pools applied"
            );
            crate::metrics::hub().reconciled(
                "local-pools",
                started.elapsed(),
                result.as_ref().err().map(|e| e.metric_label()),
            );
            match result {
                Ok(()) => {
                    applied = Some(snapshot);
                    next_apply = Instant::now() + RESYNC;
                }
                Err(error) => {
                    tracing::warn!(kind = error.metric_label(), %error, "cannot apply the hub's own pools; retrying");
                    applied = None;
                    next_apply = Instant::now() + RETRY;
                }
            }
        }
        let federations = runtime.observe().await;
        // A workload deleted by hand (or by an older hub's prune) is put back soon, not at the
        // next resync.
        let missing = federations
            .iter()
            .flat_map(|f| &f.pools)
            .any(|p| p.conditions.iter().any(|c| c.reason == WORKLOAD_MISSING));
        if missing {
            next_apply = next_apply.min(Instant::now() + RETRY);
        }
        let status = Status {
            observed_version: 0,
            federations,
            cluster_name: HUB_CLUSTER.to_owned(),
            allocatable: Default::default(),
        };
        work.on_status(HUB_CLUSTER, &status);
        let go_on = tokio::select! {
            () = &mut shutdown => false,
            changed = changes.changed() => changed.is_ok(),
            event = workload_events.next() => {
                // Drain the burst (one apply makes several events), then observe.
                while let Some(Some(_)) = workload_events.next().now_or_never() {}
                event.is_some()
            }
            () = tokio::time::sleep(OBSERVE_EVERY) => true,
        };
        if !go_on {
            break;
        }
    }
    tracing::info!("hub-local pools stopped");
}

/// SuperNodes of a Federation whose SuperLink certificate is the user's own (`spec.tls.secretName`)
/// trust that Secret's `ca.crt`, not the hub CA: it is read here (the hub cluster has it). A
/// Secret that cannot be read leaves the hub CA, and the SuperNodes' TLS errors say so.
async fn with_user_cas(client: &Client, federations: &Store<Federation>, work: &mut ClusterWork) {
    for fw in &mut work.federations {
        let Some(fed) = federations.get(&ObjectRef::new(&fw.name).within(&fw.namespace)) else {
            continue;
        };
        let Some(secret) = fed.spec.tls.as_ref().and_then(|t| t.secret_name.as_deref()) else {
            continue;
        };
        if fed.spec.insecure {
            continue;
        }
        match Api::<Secret>::namespaced(client.clone(), &fw.namespace)
            .get_opt(secret)
            .await
        {
            Ok(Some(s)) => {
                if let Some(ca) = s.data.as_ref().and_then(|d| d.get("ca.crt")) {
                    fw.ca_bundle_pem = String::from_utf8_lossy(&ca.0).into_owned();
                }
            }
            Ok(None) => {
                tracing::warn!(namespace = %fw.namespace, federation = %fw.name, %secret, "spec.tls.secretName: Secret not found; the SuperNodes trust the hub CA until it exists")
            }
            Err(error) => {
                tracing::warn!(namespace = %fw.namespace, federation = %fw.name, %secret, %error, "cannot read spec.tls.secretName")
            }
        }
    }
}

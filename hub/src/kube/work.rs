//! [`WorkSource`] of the Kubernetes-mode hub: per-cluster work computed from the Federations
//! with a `placementRef` and the `PlacementDecision`s of their Placements on the hub apiserver.
//!
//! Three reflectors (Federations, PlacementDecisions, ManagedClusters) feed one recompute loop;
//! each pass splits every Federation's pools over the clusters its Placement decided
//! ([`crate::core::work::federation_work`], pool `clusterSelector` on the ManagedCluster's labels) and hands
//! the clusters whose content changed to an [`InMemoryWorkSource`] (which versions the snapshots).
//! Nothing is computed before every reflector has listed once ([`KubeWorkSource::start`] waits),
//! so a restarted hub never sends a cluster an empty snapshot that would prune its workloads.
//! A Federation the hub cannot turn into work (invalid spec, no external address) keeps the work
//! it had: running SuperNodes keep running while the spec is fixed.
//!
//! Beside the recompute run the status writer (`status`: the agents' reports into each
//! Federation's `status.clusters`) and the node-key sync (`keys`: the SuperNode keys each
//! SuperLink holds).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use flower_addon_crds::policy::{Admin, PodPolicy};
use flower_addon_crds::{Federation, ManagedCluster, PLACEMENT_LABEL, PlacementDecision};
use flower_addon_proto::{ClusterWork, FederationWork, Status as AgentStatus};
use futures::StreamExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::channel::source::{InMemoryWorkSource, WorkSource};
use crate::core::HUB_CLUSTER;
use crate::core::render::in_cluster_fleet_address;
use crate::core::render::{federation_dialect, spoke_fleet_address};
use crate::core::work::{WorkInputs, placed_on};
use crate::flower::registry::NodeKeyRegistry;
use crate::kube::backoff::ShortBackoff;
use crate::kube::controller::placement::cluster_view;
use crate::registration::ca::HubCa;
use recompute::State;
pub use recompute::federation_work;

mod changes;
mod hold;
mod keys;
mod recompute;
mod status;

pub use hold::HOLD_MAX;
pub use status::CLUSTER_STATUS_FIELD_MANAGER;

/// The least time between two recomputes during a burst of events (coalesces them).
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Upper bound of the coalescing delay.
const MAX_DELAY: Duration = Duration::from_secs(1);
/// How long [`KubeWorkSource::start`] waits for the first lists.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the work source could not start.
#[derive(Debug, thiserror::Error)]
pub enum KubeWorkError {
    /// The reflectors did not list within the timeout (apiserver down, RBAC missing).
    #[error(
        "the hub apiserver did not list Federations, PlacementDecisions and ManagedClusters in {0:?}"
    )]
    NotReady(Duration),
}

/// The work of every cluster, kept current from the hub apiserver.
pub struct KubeWorkSource {
    inner: Arc<InMemoryWorkSource>,
    reports: Arc<DashMap<String, Report>>,
    reported: watch::Sender<u64>,
    task: JoinHandle<()>,
    status_task: JoinHandle<()>,
    keys_task: JoinHandle<()>,
    registry: Arc<NodeKeyRegistry>,
    federations: Store<Federation>,
    clusters: Store<ManagedCluster>,
}

/// The last status report of a cluster and when it arrived (Unix seconds).
#[derive(Clone, Debug)]
struct Report {
    status: AgentStatus,
    at: i64,
}

impl Drop for KubeWorkSource {
    fn drop(&mut self) {
        self.task.abort();
        self.status_task.abort();
        self.keys_task.abort();
    }
}

impl std::fmt::Debug for KubeWorkSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeWorkSource").finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct Stores {
    federations: Store<Federation>,
    decisions: Store<PlacementDecision>,
    clusters: Store<ManagedCluster>,
    /// The SuperLink StatefulSets the hub applied (their rollout holds work, [`hold`]).
    superlinks: Store<k8s_openapi::api::apps::v1::StatefulSet>,
    /// Open Cluster Management's decisions and clusters, when OCM was installed at start.
    ocm: Option<OcmStores>,
}

/// OCM's PlacementDecisions and ManagedClusters ([`crate::kube::ocm`]).
#[derive(Clone)]
struct OcmStores {
    decisions: Store<DynamicObject>,
    clusters: Store<DynamicObject>,
}

/// Labels by cluster name.
type ClusterLabels = BTreeMap<String, BTreeMap<String, String>>;

/// What every Placement decided, of both APIs, read once per pass.
pub(super) struct Decided {
    ours: Vec<Arc<PlacementDecision>>,
    /// OCM's decisions and cluster labels, when OCM is installed.
    ocm: Option<(Vec<PlacementDecision>, ClusterLabels)>,
}

impl Decided {
    fn of(stores: &Stores) -> Self {
        Self {
            ours: stores.decisions.state(),
            ocm: stores.ocm.as_ref().map(|ocm| {
                let decisions = ocm
                    .decisions
                    .state()
                    .iter()
                    .map(|d| crate::kube::ocm::decision_of(d))
                    .collect();
                let clusters = ocm.clusters.state();
                (
                    decisions,
                    crate::kube::ocm::cluster_labels(clusters.iter().map(AsRef::as_ref)),
                )
            }),
        }
    }

    /// The clusters `fed` runs pools in: its Placement's decisions from the API its
    /// `placementRef` names, among the `known` clusters. An OCM Placement on a hub without OCM
    /// decides nothing.
    pub(super) fn placed_on(&self, fed: &Federation, known: impl Fn(&str) -> bool) -> Vec<String> {
        if fed.spec.placement_ref.as_ref().is_some_and(|r| r.is_ocm()) {
            match &self.ocm {
                Some((decisions, _)) => placed_on(fed, decisions.iter(), known),
                None => Vec::new(),
            }
        } else {
            placed_on(fed, self.ours.iter().map(AsRef::as_ref), known)
        }
    }

    /// The cluster labels `fed`'s pool `clusterSelector`s and `clusterOverrides` match: OCM's
    /// `ManagedCluster` labels for an OCM-placed Federation, else `ours`.
    pub(super) fn labels<'a>(
        &'a self,
        fed: &Federation,
        ours: &'a BTreeMap<String, BTreeMap<String, String>>,
    ) -> &'a BTreeMap<String, BTreeMap<String, String>> {
        match &self.ocm {
            Some((_, labels)) if fed.spec.placement_ref.as_ref().is_some_and(|r| r.is_ocm()) => {
                labels
            }
            _ => ours,
        }
    }
}

impl KubeWorkSource {
    /// Starts the reflectors on `client`, waits until each has listed, computes the first work
    /// and returns. `ca` is the Flower CA: each Federation's SuperNodes verify its SuperLink with
    /// the Federation's own CA derived from it.
    pub async fn start(client: Client, ca: Arc<HubCa>) -> Result<Self, KubeWorkError> {
        Self::start_with_policy(client, ca, PodPolicy::new(Admin::Hub)).await
    }

    /// [`Self::start`] judging Federations by the hub admin's pod `policy` (a Federation whose
    /// hub-cluster pods it refuses gets no work anywhere: [`crate::core::problems`]).
    pub async fn start_with_policy(
        client: Client,
        ca: Arc<HubCa>,
        policy: PodPolicy,
    ) -> Result<Self, KubeWorkError> {
        let (stores, streams) = reflectors(&client).await;
        let events = futures::stream::select_all(streams);
        let inner = Arc::new(InMemoryWorkSource::new());
        let (ready_tx, mut ready_rx) = watch::channel(false);
        let reports: Arc<DashMap<String, Report>> = Arc::new(DashMap::new());
        let (reported, reported_rx) = watch::channel(0u64);
        let registry = Arc::new(NodeKeyRegistry::new());
        let (keys_changed, keys_rx) = watch::channel(0u64);
        let status_task = tokio::spawn(status::write_cluster_statuses(
            client.clone(),
            stores.clone(),
            reports.clone(),
            registry.clone(),
            reported_rx.clone(),
        ));
        let keys_task = tokio::spawn(keys::sync_node_keys(
            client,
            stores.clone(),
            reports.clone(),
            registry.clone(),
            ca.clone(),
            reported_rx,
            keys_changed,
        ));
        let state = State {
            ca,
            policy,
            registry: registry.clone(),
            sent: BTreeMap::new(),
            last_good: BTreeMap::new(),
            memo: BTreeMap::new(),
            holds: hold::Holds::default(),
        };
        let (federations, clusters) = (stores.federations.clone(), stores.clusters.clone());
        let task = tokio::spawn(recompute_loop(
            events,
            keys_rx,
            stores,
            inner.clone(),
            state,
            ready_tx,
        ));
        let waited = tokio::time::timeout(READY_TIMEOUT, ready_rx.wait_for(|r| *r)).await;
        if !matches!(waited, Ok(Ok(_))) {
            task.abort();
            status_task.abort();
            keys_task.abort();
            return Err(KubeWorkError::NotReady(READY_TIMEOUT));
        }
        Ok(Self {
            inner,
            reports,
            reported,
            task,
            status_task,
            keys_task,
            registry,
            federations,
            clusters,
        })
    }

    /// The ManagedClusters as the work source's reflector holds them.
    pub fn clusters(&self) -> Store<ManagedCluster> {
        self.clusters.clone()
    }

    /// The Federations as the work source's reflector holds them.
    pub fn federations(&self) -> Store<Federation> {
        self.federations.clone()
    }

    /// The SuperNode keys each Federation's SuperLink holds and lists online.
    pub fn node_keys(&self) -> &Arc<NodeKeyRegistry> {
        &self.registry
    }

    /// The in-memory source behind this one (acks and last status per cluster).
    pub fn inner(&self) -> &Arc<InMemoryWorkSource> {
        &self.inner
    }
}

fn is_ready(stores: &Stores) -> bool {
    use futures::FutureExt;
    // A store is ready once its first list is complete.
    let ocm = stores.ocm.iter().flat_map(|o| {
        [
            o.decisions.wait_until_ready().boxed().now_or_never(),
            o.clusters.wait_until_ready().boxed().now_or_never(),
        ]
    });
    [
        stores.federations.wait_until_ready().boxed().now_or_never(),
        stores.decisions.wait_until_ready().boxed().now_or_never(),
        stores.clusters.wait_until_ready().boxed().now_or_never(),
        stores.superlinks.wait_until_ready().boxed().now_or_never(),
    ]
    .into_iter()
    .chain(ocm)
    .all(|r| matches!(r, Some(Ok(()))))
}

/// The reflectors the work is computed from (Federations, PlacementDecisions, ManagedClusters,
/// the hub's SuperLink StatefulSets, and OCM's kinds when it is installed), each waking the
/// recompute only for what can change the work ([`changes`]).
async fn reflectors(client: &Client) -> (Stores, Vec<futures::stream::BoxStream<'static, ()>>) {
    let (federations, fed_writer) = reflector::store::<Federation>();
    let (decisions, dec_writer) = reflector::store::<PlacementDecision>();
    let (clusters, mc_writer) = reflector::store::<ManagedCluster>();
    let (superlinks, sts_writer) = reflector::store::<k8s_openapi::api::apps::v1::StatefulSet>();
    let feds = changes::relevant(
        reflector::reflector(
            fed_writer,
            watcher(Api::<Federation>::all(client.clone()), Default::default()),
        )
        .backoff(ShortBackoff::default()),
        changes::federation_inputs,
    )
    .boxed();
    let decs = changes::relevant(
        reflector::reflector(
            dec_writer,
            watcher(
                Api::<PlacementDecision>::all(client.clone()),
                watcher::Config::default().labels(PLACEMENT_LABEL),
            ),
        )
        .backoff(ShortBackoff::default()),
        changes::decision_inputs,
    )
    .boxed();
    let mcs = changes::relevant(
        reflector::reflector(
            mc_writer,
            watcher(
                Api::<ManagedCluster>::all(client.clone()),
                Default::default(),
            )
            .modify(super::strip_managed_fields),
        )
        .backoff(ShortBackoff::default()),
        changes::cluster_inputs,
    )
    .boxed();
    let applied = format!(
        "{}={}",
        crate::kube::controller::APPLIED_BY_LABEL,
        crate::kube::controller::HUB_FIELD_MANAGER
    );
    let stss = changes::relevant(
        reflector::reflector(
            sts_writer,
            watcher(
                Api::<k8s_openapi::api::apps::v1::StatefulSet>::all(client.clone()),
                watcher::Config::default().labels(&applied),
            )
            .modify(super::strip_managed_fields),
        )
        .backoff(ShortBackoff::default()),
        hold::statefulset_inputs,
    )
    .boxed();
    let mut streams = vec![feds, decs, mcs, stss];
    let ocm = if crate::kube::ocm::installed(client).await {
        let (ocm, ocm_streams) = ocm_reflectors(client);
        streams.extend(ocm_streams);
        tracing::info!("Open Cluster Management is installed: Federations may name its Placements");
        Some(ocm)
    } else {
        None
    };
    let stores = Stores {
        federations,
        decisions,
        clusters,
        superlinks,
        ocm,
    };
    (stores, streams)
}

/// Recomputes every cluster's work on a reflector event, on SuperLinks now holding other keys
/// (work carries them) or on a hold running out ([`hold::HOLD_MAX`]), once every reflector has
/// listed; `ready` turns true after the first pass. Ends when the watches do.
async fn recompute_loop(
    mut events: futures::stream::SelectAll<futures::stream::BoxStream<'static, ()>>,
    mut keys_rx: watch::Receiver<u64>,
    stores: Stores,
    work: Arc<InMemoryWorkSource>,
    mut state: State,
    ready_tx: watch::Sender<bool>,
) {
    let mut hold_ends: Option<tokio::time::Instant> = None;
    let mut ready = false;
    let mut last_pass: Option<tokio::time::Instant> = None;
    loop {
        let hold_end = async {
            match hold_ends {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let next = tokio::select! {
            event = events.next() => event.is_some(),
            changed = keys_rx.changed() => changed.is_ok(),
            () = hold_end => true,
        };
        if !next {
            break;
        }
        // The first change after a quiet spell is computed at once (a user's edit reaches its
        // clusters without a debounce); during a burst, passes are at least DEBOUNCE apart and
        // the events in between are coalesced into the next one (bounded by MAX_DELAY, so a
        // steady stream of heartbeats cannot starve the recompute).
        if last_pass.is_some_and(|t| t.elapsed() < DEBOUNCE) {
            let deadline = tokio::time::Instant::now() + MAX_DELAY;
            while let Ok(Some(_)) = tokio::time::timeout_at(
                deadline.min(tokio::time::Instant::now() + DEBOUNCE),
                events.next(),
            )
            .await
            {}
        }
        // Whatever is already queued belongs to this pass.
        while let Some(Some(_)) = futures::FutureExt::now_or_never(events.next()) {}
        if !ready {
            ready = is_ready(&stores);
            if !ready {
                continue;
            }
        }
        let started = std::time::Instant::now();
        hold_ends = state.recompute(&stores, &work);
        tracing::debug!(
            took_us = started.elapsed().as_micros() as u64,
            "work recomputed"
        );
        last_pass = Some(tokio::time::Instant::now());
        let _ = ready_tx.send(true);
    }
    tracing::warn!("work source watches ended");
}

/// Reflectors on OCM's PlacementDecisions and ManagedClusters; every event wakes the recompute
/// (OCM writes neither often: cluster heartbeats go to Leases).
fn ocm_reflectors(client: &Client) -> (OcmStores, Vec<futures::stream::BoxStream<'static, ()>>) {
    let mut streams = Vec::new();
    let mut store = |resource: kube::api::ApiResource, config: watcher::Config| {
        let writer = reflector::store::Writer::<DynamicObject>::new(resource.clone());
        let reader = writer.as_reader();
        streams.push(
            reflector::reflector(
                writer,
                watcher(
                    Api::<DynamicObject>::all_with(client.clone(), &resource),
                    config,
                )
                .modify(|o| o.metadata.managed_fields = None),
            )
            .backoff(ShortBackoff::default())
            .filter_map(|event| futures::future::ready(event.ok().map(|_| ())))
            .boxed(),
        );
        reader
    };
    let decisions = store(
        crate::kube::ocm::decision_resource(),
        watcher::Config::default().labels(PLACEMENT_LABEL),
    );
    let clusters = store(
        crate::kube::ocm::cluster_resource(),
        watcher::Config::default(),
    );
    (
        OcmStores {
            decisions,
            clusters,
        },
        streams,
    )
}

type FedKey = (String, String);

impl WorkSource for KubeWorkSource {
    fn snapshot(&self, cluster: &str) -> ClusterWork {
        self.inner.snapshot(cluster)
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes()
    }

    fn on_ack(&self, cluster: &str, version: u64) {
        self.inner.on_ack(cluster, version);
    }

    fn on_status(&self, cluster: &str, status: &AgentStatus) {
        self.inner.on_status(cluster, status);
        // A report that repeats the last one changes nothing, not even its time: an idle
        // Federation's status is not rewritten every report.
        if self
            .reports
            .get(cluster)
            .is_some_and(|old| old.status == *status)
        {
            return;
        }
        let report = Report {
            status: status.clone(),
            at: k8s_openapi::jiff::Timestamp::now().as_second(),
        };
        self.reports.insert(cluster.to_owned(), report);
        self.reported.send_modify(|n| *n = n.wrapping_add(1));
    }
}

#[cfg(test)]
pub(crate) mod tests;

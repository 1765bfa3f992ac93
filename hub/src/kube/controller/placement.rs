//! The hub's Kubernetes-mode Placement controller (kube-runtime).
//!
//! A `Placement` is evaluated with the pure [`crate::core::placement::evaluate`] against the
//! `ManagedCluster`s of the `ManagedClusterSet`s bound to its namespace by
//! `ManagedClusterSetBinding`s ([`crate::core::clustersets`]; labels: `metadata.labels`, the admin's — from the token, `flower-hub accept
//! --label` or `kubectl label managedcluster`; claims, what the agent asserts, from
//! `status.clusterClaims`; only
//! `spec.hubAcceptsClient` clusters are eligible; taints from `spec.taints` with `timeAdded`).
//! The previous selection (read back from the decisions) keeps Steady clusters selected.
//!
//! The result is written as `PlacementDecision`s `<placement>-decision-<n>` (at most
//! [`DECISIONS_PER_PAGE`] each, label [`PLACEMENT_LABEL`]`=<placement>`, controller owner
//! reference to the Placement) with server-side apply, decisions in the status subresource;
//! surplus pages are deleted. One page always exists, empty when nothing is selected, so
//! consumers can watch it. The Placement status carries `numberOfSelectedClusters`,
//! `PlacementSatisfied`, `PlacementMisconfigured` and, for clusters left out, the reason.
//! A toleration with `tolerationSeconds` requeues the Placement when it expires.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use flower_addon_crds::{
    API_VERSION, ClusterDecision, ManagedCluster, ManagedClusterSet, ManagedClusterSetBinding,
    PLACEMENT_LABEL, Placement, PlacementDecision, validate_placement,
};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use super::{Error, HUB_FIELD_MANAGER, RESYNC, Result};
use crate::core::clustersets::{ClusterSetView, binding_pairs};
use crate::core::placement::{
    ClusterView, DECISIONS_PER_PAGE, TaintEffect, TaintView, evaluate, paginate, placement_policy,
};
use crate::kube::backoff::ShortBackoff;
mod reconcile;
pub use reconcile::reconcile;

/// Condition type: the selection has every cluster the Placement asks for.
pub const CONDITION_SATISFIED: &str = "PlacementSatisfied";
/// Condition type: the Placement spec is invalid (nothing is decided while it is).
pub const CONDITION_MISCONFIGURED: &str = "PlacementMisconfigured";

/// What every reconcile shares.
pub struct PlacementContext {
    /// Client of the hub cluster.
    pub client: Client,
    /// Event recorder (reporting controller [`HUB_FIELD_MANAGER`]).
    pub recorder: Recorder,
    /// Every ManagedCluster, kept by one watch (no list per reconcile).
    pub clusters: Store<ManagedCluster>,
    /// Every PlacementDecision (label-selected), kept by the watch that also triggers the
    /// reconcile of their Placement (no list per reconcile).
    pub decisions: Store<PlacementDecision>,
    /// Every ManagedClusterSet.
    pub sets: Store<ManagedClusterSet>,
    /// Every ManagedClusterSetBinding.
    pub bindings: Store<ManagedClusterSetBinding>,
}

/// The reflector stores the Placement controller reads.
pub struct PlacementStores {
    /// Every ManagedCluster.
    pub clusters: Store<ManagedCluster>,
    /// Every PlacementDecision (label-selected).
    pub decisions: Store<PlacementDecision>,
    /// Every ManagedClusterSet.
    pub sets: Store<ManagedClusterSet>,
    /// Every ManagedClusterSetBinding.
    pub bindings: Store<ManagedClusterSetBinding>,
}

/// The placement-relevant view of every cluster seen on the watch, to tell changes that matter
/// to placement (labels, claims, acceptance, taints; a cluster added or deleted) from those that
/// do not (heartbeats, conditions): with N agents heartbeating, re-evaluating every Placement
/// on each heartbeat would cost N × (Placements × N) per lease period.
#[derive(Debug, Default)]
pub struct ClusterViews {
    views: BTreeMap<String, ClusterView>,
}

impl ClusterViews {
    /// Records `cluster`; whether its placement view is new or changed.
    pub fn apply(&mut self, cluster: &ManagedCluster) -> bool {
        let view = cluster_view(cluster);
        match self.views.get(&view.name) {
            Some(old) if *old == view => false,
            _ => {
                self.views.insert(view.name.clone(), view);
                true
            }
        }
    }

    /// Forgets `name`; whether it was known.
    pub fn delete(&mut self, name: &str) -> bool {
        self.views.remove(name).is_some()
    }

    /// Forgets everything (the watch re-lists).
    pub fn clear(&mut self) {
        self.views.clear();
    }

    /// Whether watch event `event` should re-evaluate every Placement.
    pub fn on_event(&mut self, event: &watcher::Event<ManagedCluster>) -> bool {
        match event {
            watcher::Event::Apply(mc) => self.apply(mc),
            watcher::Event::Delete(mc) => self.delete(&mc.name_any()),
            watcher::Event::Init => {
                self.clear();
                false
            }
            watcher::Event::InitApply(mc) => {
                self.apply(mc);
                false
            }
            watcher::Event::InitDone => true,
        }
    }
}

impl PlacementContext {
    /// A context for `client`, reading clusters, decisions and cluster sets from `stores`.
    pub fn new(client: Client, stores: PlacementStores) -> Self {
        let recorder = super::apply::recorder(client.clone());
        Self {
            client,
            recorder,
            clusters: stores.clusters,
            decisions: stores.decisions,
            sets: stores.sets,
            bindings: stores.bindings,
        }
    }

    async fn publish(&self, placement: &Placement, type_: EventType, reason: &str, note: String) {
        super::apply::publish(&self.recorder, placement, type_, "Schedule", reason, note).await;
    }
}

/// Runs the Placement controller until `shutdown` resolves. A ManagedCluster change that
/// matters to placement ([`ClusterViews`]) reconciles every Placement (placement is cheap;
/// writes happen only on change); heartbeats do not. So does every change of a
/// ManagedClusterSet or ManagedClusterSetBinding.
/// `health` gets the check [`READY_CHECK`], passing once the ManagedClusters and decisions have
/// listed.
pub async fn run(
    client: Client,
    health: Arc<flower_addon_runtime::ops::Health>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let listed = crate::kube::list_gate::ListGate::new(
        health,
        READY_CHECK,
        &[
            "managedclusters",
            "placementdecisions",
            "managedclustersets",
            "managedclustersetbindings",
        ],
    );
    let controller = Controller::new(
        Api::<Placement>::all(client.clone()),
        watcher::Config::default(),
    );
    let (clusters, writer) = reflector::store::<ManagedCluster>();
    let mut views = ClusterViews::default();
    let cluster_changes = listed
        .watch(
            "managedclusters",
            watcher(
                Api::<ManagedCluster>::all(client.clone()),
                watcher::Config::default(),
            )
            .modify(crate::kube::strip_managed_fields)
            .backoff(ShortBackoff::default()),
        )
        .reflect(writer)
        .filter_map(move |event| {
            let fire = match &event {
                Ok(event) => views.on_event(event),
                Err(error) => {
                    tracing::warn!(%error, "ManagedCluster watch");
                    false
                }
            };
            std::future::ready(fire.then_some(()))
        });
    let (decisions, decision_writer) = reflector::store::<PlacementDecision>();
    let decision_events = listed
        .watch(
            "placementdecisions",
            watcher(
                Api::<PlacementDecision>::all(client.clone()),
                watcher::Config::default().labels(PLACEMENT_LABEL),
            )
            .backoff(ShortBackoff::default()),
        )
        .reflect(decision_writer)
        .touched_objects();
    let (sets, set_changes) =
        reflect_all::<ManagedClusterSet>(&listed, "managedclustersets", &client);
    let (bindings, binding_changes) =
        reflect_all::<ManagedClusterSetBinding>(&listed, "managedclustersetbindings", &client);
    let stores = PlacementStores {
        clusters,
        decisions,
        sets,
        bindings,
    };
    controller
        .owns_stream(decision_events)
        .reconcile_all_on(futures::stream::select(
            futures::stream::select(cluster_changes, decided_elsewhere(&client)),
            futures::stream::select(set_changes, binding_changes),
        ))
        .trigger_backoff(ShortBackoff::default())
        .graceful_shutdown_on(shutdown)
        .run(
            |placement, ctx| super::measured("placement", reconcile(placement, ctx)),
            error_policy,
            Arc::new(PlacementContext::new(client, stores)),
        )
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(placement = %object, "reconciled"),
                Err(error) => tracing::warn!(%error, "placement reconcile failed"),
            }
        })
        .await;
    tracing::info!("placement controller stopped");
}

/// One item whenever the clusters some Placement decided change (a new decision page, other
/// clusters in one, a page deleted), not for the status writes around them. `Balance` spreads a
/// Placement by how many *other* Placements selected each cluster, so another Placement's new
/// decisions can change this one's: every Placement is then evaluated again, as the standalone
/// hub evaluates every Placement on each pass, and both modes end on the same clusters whichever
/// Placement decided first. A Placement whose result does not change writes nothing.
fn decided_elsewhere(client: &Client) -> impl futures::Stream<Item = ()> + Send + use<> {
    use kube::runtime::reflector::ObjectRef;
    use std::hash::{Hash, Hasher};
    let mut seen: std::collections::HashMap<ObjectRef<PlacementDecision>, u64> =
        std::collections::HashMap::new();
    let decided = |d: &PlacementDecision| {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        d.labels().get(PLACEMENT_LABEL).hash(&mut hasher);
        for decision in d.status.iter().flat_map(|s| s.decisions.iter()) {
            decision.cluster_name.hash(&mut hasher);
        }
        hasher.finish()
    };
    watcher(
        Api::<PlacementDecision>::all(client.clone()),
        watcher::Config::default().labels(PLACEMENT_LABEL),
    )
    .backoff(ShortBackoff::default())
    .filter_map(move |event| {
        let fire = match event {
            Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) => {
                let hash = decided(&d);
                seen.insert(ObjectRef::from_obj(&d), hash) != Some(hash)
            }
            Ok(watcher::Event::Delete(d)) => seen.remove(&ObjectRef::from_obj(&d)).is_some(),
            Ok(watcher::Event::Init | watcher::Event::InitDone) => false,
            Err(error) => {
                tracing::warn!(%error, "PlacementDecision watch (other Placements' decisions)");
                false
            }
        };
        std::future::ready(fire.then_some(()))
    })
}

/// A reflector of every `K` (recorded in `listed` as watch `name`): its store, and a stream with
/// one item per change (for `reconcile_all_on`).
fn reflect_all<K>(
    listed: &Arc<crate::kube::list_gate::ListGate>,
    name: &'static str,
    client: &Client,
) -> (Store<K>, impl futures::Stream<Item = ()> + Send + use<K>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let changes = listed
        .watch(
            name,
            watcher(Api::<K>::all(client.clone()), watcher::Config::default())
                .backoff(ShortBackoff::default()),
        )
        .reflect(writer)
        .touched_objects()
        .filter_map(|r| std::future::ready(r.ok().map(|_| ())));
    (store, changes)
}

/// The readiness check of the Placement controller.
pub const READY_CHECK: &str = "placement-controller";

/// Requeue with a delay after a failed reconcile.
pub fn error_policy(
    placement: Arc<Placement>,
    error: &Error,
    _ctx: Arc<PlacementContext>,
) -> Action {
    tracing::warn!(
        placement = %placement.name_any(),
        namespace = placement.namespace().unwrap_or_default(),
        kind = error.metric_label(),
        %error,
        "placement reconcile error"
    );
    Action::requeue(Duration::from_secs(10))
}

/// The placement view of a ManagedCluster.
pub fn cluster_view(cluster: &ManagedCluster) -> ClusterView {
    let status = cluster.status.as_ref();
    // Only what placement reads is copied (not the conditions or the rest of the status).
    let allocatable: BTreeMap<String, String> = status
        .into_iter()
        .flat_map(|s| &s.allocatable)
        .filter(|(k, _)| *k == "cpu" || *k == "memory")
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    let (allocatable_cpu_millis, allocatable_memory_bytes) =
        crate::core::placement::allocatable_view(&allocatable);
    ClusterView {
        name: cluster.name_any(),
        // The admin's labels only (an agent must not place itself); what the agent asserts is in
        // the claims.
        labels: cluster.labels().clone(),
        claims: status
            .into_iter()
            .flat_map(|s| &s.cluster_claims)
            .map(|c| (c.name.clone(), c.value.clone()))
            .collect(),
        accepted: cluster.spec.hub_accepts_client,
        taints: cluster
            .spec
            .taints
            .iter()
            .map(|t| TaintView {
                key: t.key.clone(),
                value: t.value.clone().unwrap_or_default(),
                effect: match t.effect {
                    flower_addon_crds::TaintEffect::NoSelect => TaintEffect::NoSelect,
                    flower_addon_crds::TaintEffect::PreferNoSelect => TaintEffect::PreferNoSelect,
                    flower_addon_crds::TaintEffect::NoSelectIfNew => TaintEffect::NoSelectIfNew,
                },
                time_added: t.time_added.as_ref().map(|t| t.0.as_second()),
            })
            .collect(),
        allocatable_cpu_millis,
        allocatable_memory_bytes,
        other_decisions: 0,
    }
}

fn kube_err(action: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube { action, source }
}

fn now_seconds() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

fn time_at(seconds: i64) -> Time {
    Time(
        k8s_openapi::jiff::Timestamp::from_second(seconds)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

mod status;
pub use status::{placement_status, unselected};
use status::{set_condition, write_status};

#[cfg(test)]
mod tests;

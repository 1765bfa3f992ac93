//! The hub's Kubernetes-mode `FlowerRun` controller (kube-runtime), beside the Federation
//! controller. It loads, stores and watches; the reconcile is [`crate::runs::reconcile`] — the
//! same as the standalone hub's ([`crate::standalone`]'s `runs`), so both modes do the same for
//! the same input (`hub/tests/run_parity.rs` compares their statuses).
//!
//! - Watches: FlowerRuns in every namespace (a reconcile on a new run, a spec change —
//!   `suspend` — and a deletion; its own status writes trigger nothing), Federations (a change of
//!   `Ready` wakes the runs waiting for it) and ConfigMaps, metadata only (one created or changed
//!   wakes the runs waiting for their FAB). A run in progress is polled at
//!   [`Decision::requeue`](crate::core::run::Decision::requeue); a finished one costs no Control
//!   call and no write.
//! - Facts: the Federation from the watch's cache (its `Ready` condition), the FAB from the
//!   ConfigMap (read only while the run has no Flower run), the SuperLink's runs through the
//!   Control API at the SuperLink Service ([`crate::kube::control::in_cluster_endpoint`]), and
//!   the Flower run ids other FlowerRuns of the Federation hold.
//! - Writes: the status with server-side apply under [`HUB_FIELD_MANAGER`](super::HUB_FIELD_MANAGER), conditional on the
//!   resourceVersion read (a reconcile on a cache behind the apiserver writes nothing and
//!   looks again); the finalizer [`RUN_FINALIZER`] added before the first submission and
//!   removed once the Flower run is stopped; the status holding the pending submission stored
//!   before `StartRun` is sent; events for each transition.
mod reconcile;
mod store;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flower_addon_crds::run::FlowerRun;
use flower_addon_crds::{Federation, RUN_FINALIZER};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};

use super::{Error, measured};
use crate::core::run::{SuperLinkState, needs_app};
use crate::flower::control::{ControlClient, ControlEndpoint};
use crate::flower::fab_url::FabUrlCache;
use crate::flower::runs::LogFollowers;
use crate::kube::backoff::ShortBackoff;
use crate::registration::ca::HubCa;

pub use reconcile::reconcile;

/// `(namespace, name)` of a FlowerRun.
type RunKey = (String, String);
/// `(namespace, name)` of a Federation.
type FedKey = (String, String);

/// How a run's Federation's SuperLink is reached (the in-cluster Service in the hub; a stand-in
/// in tests).
pub type EndpointOf = Arc<dyn Fn(&Federation) -> Option<ControlEndpoint> + Send + Sync>;

/// How soon a reconcile whose write met a newer object (its cache was behind) looks again.
const CONFLICT_RETRY: Duration = Duration::from_secs(1);
/// Requeue after a failed reconcile.
const ERROR_RETRY: Duration = Duration::from_secs(15);

/// What every FlowerRun reconcile shares.
pub struct RunContext {
    /// Client of the hub cluster.
    pub client: Client,
    /// Event recorder (reporting controller [`super::HUB_FIELD_MANAGER`]).
    pub recorder: Recorder,
    /// Every Federation (the watch's cache).
    pub federations: Store<Federation>,
    /// Every FlowerRun (the controller's cache), for the run ids other runs hold.
    pub runs: Store<FlowerRun>,
    endpoint: EndpointOf,
    clients: Mutex<HashMap<FedKey, (ControlEndpoint, Arc<ControlClient>)>>,
    followers: Mutex<LogFollowers<RunKey>>,
    /// FABs downloaded from `spec.app.fab.url` (once per URL and hash).
    fab_urls: FabUrlCache,
    /// Each Federation's last run list, shared by the runs reconciled within
    /// [`LIST_SHARED_FOR`]: one `ListRuns` per SuperLink, not one per FlowerRun.
    lists: Mutex<HashMap<FedKey, SharedList>>,
    /// [`LIST_SHARED_FOR`], or what a test sets.
    list_shared_for: Duration,
    /// Now, for the runs' statuses.
    clock: crate::runs::Clock,
    /// The restarts this hub wrote (Federation → Flower run), so a cache that does not show the
    /// write yet neither writes nor announces it again.
    restarts: Mutex<HashMap<FedKey, u64>>,
}

/// The field manager of `status.supernodeRestartAfterRun` (the Federation controller's and the
/// work source's status writes leave it alone).
pub const RESTART_FIELD_MANAGER: &str = "flower-addon-hub-restarts";

/// One Federation's last run list and when it was asked.
type SharedList = Arc<tokio::sync::Mutex<Option<(std::time::Instant, SuperLinkState)>>>;

/// How long one `ListRuns` answer serves every run of its Federation (runs in progress are
/// polled every 2 s; a submission or stop by any of them drops it at once).
pub const LIST_SHARED_FOR: Duration = Duration::from_secs(1);

impl RunContext {
    /// Downloads FAB URLs only where `egress` allows ([`crate::flower::fab_url::Egress`]).
    pub fn with_fab_egress(mut self, egress: crate::flower::fab_url::Egress) -> Self {
        self.fab_urls = FabUrlCache::with_egress(egress);
        self
    }

    /// A context reading `federations` and `runs`, dialling each Federation's SuperLink where
    /// `endpoint` says.
    pub fn new(
        client: Client,
        federations: Store<Federation>,
        runs: Store<FlowerRun>,
        endpoint: EndpointOf,
    ) -> Self {
        Self {
            recorder: super::apply::recorder(client.clone()),
            client,
            federations,
            runs,
            endpoint,
            clients: Mutex::default(),
            followers: Mutex::new(LogFollowers::new()),
            fab_urls: FabUrlCache::new(),
            lists: Mutex::default(),
            list_shared_for: LIST_SHARED_FOR,
            clock: crate::runs::wall_clock(),
            restarts: Mutex::default(),
        }
    }

    /// Reads the time from `clock` instead of the wall clock.
    pub fn with_clock(mut self, clock: crate::runs::Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Shares a Federation's run list for `window` instead of [`LIST_SHARED_FOR`] (zero: every
    /// reconcile asks).
    pub fn with_list_shared_for(mut self, window: Duration) -> Self {
        self.list_shared_for = window;
        self
    }

    /// The run list of `key`'s SuperLink: the one asked less than [`LIST_SHARED_FOR`] ago, or
    /// a new one (runs reconciled at once wait for one answer instead of asking each).
    async fn list_runs(&self, key: &FedKey, client: &ControlClient) -> SuperLinkState {
        let slot = self
            .lists
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        let mut slot = slot.lock().await;
        if let Some((at, state)) = slot.as_ref()
            && at.elapsed() < self.list_shared_for
        {
            return state.clone();
        }
        let state = crate::flower::runs::list(client).await;
        *slot = Some((std::time::Instant::now(), state.clone()));
        state
    }

    /// Records `status.supernodeRestartAfterRun` of Federation `key` (under
    /// [`RESTART_FIELD_MANAGER`], a field no other writer of the status owns); `Ok(false)` when
    /// the Federation shows it already or this hub wrote it before.
    async fn restart_supernodes(
        &self,
        key: &FedKey,
        fed: Option<&Federation>,
        after_run: u64,
    ) -> Result<bool, super::Error> {
        let value = after_run.to_string();
        let shown = fed
            .and_then(|f| f.status.as_ref())
            .and_then(|s| s.supernode_restart_after_run.as_deref())
            == Some(value.as_str());
        let written = self
            .restarts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            == Some(&after_run);
        if shown || written || fed.is_none() {
            return Ok(false);
        }
        let body = serde_json::json!({
            "apiVersion": flower_addon_crds::API_VERSION,
            "kind": "Federation",
            "status": {"supernodeRestartAfterRun": value},
        });
        kube::api::Api::<Federation>::namespaced(self.client.clone(), &key.0)
            .patch_status(
                &key.1,
                &kube::api::PatchParams::apply(RESTART_FIELD_MANAGER).force(),
                &kube::api::Patch::Apply(&body),
            )
            .await
            .map_err(|source| super::Error::Kube {
                action: format!(
                    "record the SuperNode restart of Federation {}/{}",
                    key.0, key.1
                ),
                source,
            })?;
        self.restarts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), after_run);
        Ok(true)
    }

    /// Drops `key`'s shared run list: a run was submitted or stopped, so the next pass asks.
    fn forget_list(&self, key: &FedKey) {
        self.lists
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// The Control client of `fed` (kept while its endpoint stays the same); `None` when it has
    /// no endpoint.
    fn control_client(&self, key: &FedKey, fed: &Federation) -> Option<Arc<ControlClient>> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let Some(wanted) = (self.endpoint)(fed) else {
            clients.remove(key);
            return None;
        };
        if let Some((have, client)) = clients.get(key)
            && *have == wanted
        {
            return Some(client.clone());
        }
        match ControlClient::new(wanted.clone()) {
            Ok(client) => {
                let client = Arc::new(client);
                clients.insert(key.clone(), (wanted, client.clone()));
                Some(client)
            }
            Err(error) => {
                tracing::warn!(federation = %key.1, namespace = %key.0, %error, "no Control client");
                None
            }
        }
    }

    fn followers(&self) -> std::sync::MutexGuard<'_, LogFollowers<RunKey>> {
        self.followers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What triggers a reconcile of a FlowerRun: its spec (generation: `suspend` is the field that
/// may change) and its deletion. The controller's own status writes change neither.
fn run_inputs(run: &FlowerRun) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    run.metadata.generation.hash(&mut hasher);
    run.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    Some(hasher.finish())
}

/// What of a Federation a waiting run depends on: its `Ready` condition (status and message)
/// and its deletion.
fn federation_inputs(fed: &Federation) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let ready = fed.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| (c.status.clone(), c.message.clone()))
    });
    ready.hash(&mut hasher);
    fed.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    Some(hasher.finish())
}

/// The runs of namespace `namespace` that still wait to be submitted (no Flower run yet, not
/// finished) and that `wanted` picks.
fn waiting_runs(
    runs: &Store<FlowerRun>,
    namespace: Option<String>,
    wanted: impl Fn(&FlowerRun) -> bool,
) -> Vec<ObjectRef<FlowerRun>> {
    runs.state()
        .iter()
        .filter(|r| r.namespace() == namespace)
        .filter(|r| {
            let status = r.status.clone().unwrap_or_default();
            needs_app(&status, r.metadata.deletion_timestamp.is_some())
        })
        .filter(|r| wanted(r))
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect()
}

/// Runs the FlowerRun controller until `shutdown` resolves (graceful: running reconciles end).
/// SuperLinks are verified with each Federation's own CA, derived from the Flower CA `ca`.
pub async fn run(
    client: Client,
    ca: Arc<HubCa>,
    egress: crate::flower::fab_url::Egress,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (federations, fed_writer) = reflector::store::<Federation>();
    let (runs, run_writer) = reflector::store::<FlowerRun>();
    let run_events = watcher(Api::<FlowerRun>::all(client.clone()), Default::default())
        .backoff(ShortBackoff::default())
        .reflect(run_writer)
        .applied_objects()
        .predicate_filter(run_inputs, PredicateConfig::default());
    let fed_events = watcher(Api::<Federation>::all(client.clone()), Default::default())
        .backoff(ShortBackoff::default())
        .reflect(fed_writer)
        .applied_objects()
        .predicate_filter(federation_inputs, PredicateConfig::default());
    let config_map_events = watcher(
        Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()),
        watcher::Config::default(),
    )
    .backoff(ShortBackoff::default())
    .touched_objects();
    let forward = crate::kube::control::port_forward(client.clone());
    let endpoint: EndpointOf =
        Arc::new(move |fed| crate::kube::control::in_cluster_endpoint(fed, &ca, &forward));
    let context =
        RunContext::new(client, federations, runs.clone(), endpoint).with_fab_egress(egress);
    let (for_feds, for_config_maps) = (runs.clone(), runs.clone());
    Controller::for_stream(run_events, runs)
        .watches_stream(fed_events, move |fed: Federation| {
            let name = fed.name_any();
            waiting_runs(&for_feds, fed.namespace(), |r| {
                r.spec.federation_ref.name == name
            })
        })
        .watches_stream(
            config_map_events,
            move |config_map: PartialObjectMeta<ConfigMap>| {
                let name = config_map.name_any();
                waiting_runs(&for_config_maps, config_map.namespace(), |r| {
                    r.spec
                        .app
                        .fab
                        .config_map_ref
                        .as_ref()
                        .is_some_and(|c| c.name == name)
                })
            },
        )
        .trigger_backoff(ShortBackoff::default())
        .graceful_shutdown_on(shutdown)
        .run(
            |run, ctx| measured("flowerrun", reconcile(run, ctx)),
            error_policy,
            Arc::new(context),
        )
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(run = %object, "reconciled"),
                Err(error) => tracing::warn!(%error, "FlowerRun reconcile failed"),
            }
        })
        .await;
    tracing::info!("FlowerRun controller stopped");
}

/// Requeue with a delay after a failed reconcile.
pub fn error_policy(run: Arc<FlowerRun>, error: &Error, _ctx: Arc<RunContext>) -> Action {
    tracing::warn!(
        run = %run.name_any(),
        namespace = run.namespace().unwrap_or_default(),
        kind = error.metric_label(),
        %error,
        "FlowerRun reconcile error"
    );
    Action::requeue(ERROR_RETRY)
}

/// Whether the finalizer of a run is on.
fn has_finalizer(run: &FlowerRun) -> bool {
    run.finalizers().iter().any(|f| f == RUN_FINALIZER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flower_addon_crds::run::FlowerRunStatus;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn run(name: &str, namespace: &str, status: serde_json::Value) -> FlowerRun {
        serde_json::from_value(json!({
            "apiVersion": "flower-addon.io/v1alpha1",
            "kind": "FlowerRun",
            "metadata": {"name": name, "namespace": namespace, "generation": 1},
            "spec": {
                "federationRef": {"name": "fed"},
                "app": {"fab": {"configMapRef": {"name": "fab", "key": "app.fab"}}},
            },
            "status": status,
        }))
        .expect("FlowerRun")
    }

    #[test]
    fn only_spec_and_deletion_trigger_a_run_not_its_status() {
        // Invariant: the controller's own status writes (log lines every poll) do not trigger
        // another reconcile; a spec change (suspend) and a deletion do.
        let waiting = run("r", "team", json!({}));
        let mut written = waiting.clone();
        written.status = Some(FlowerRunStatus {
            log_tail: vec!["round 1/2".into()],
            ..FlowerRunStatus::default()
        });
        assert_eq!(run_inputs(&waiting), run_inputs(&written));
        let mut suspended = waiting.clone();
        suspended.metadata.generation = Some(2);
        assert_ne!(run_inputs(&waiting), run_inputs(&suspended));
        let mut deleted = waiting.clone();
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_ne!(run_inputs(&waiting), run_inputs(&deleted));
    }

    #[test]
    fn a_federation_or_config_map_wakes_only_the_runs_still_waiting_in_its_namespace() {
        // Invariant: a Federation's (or ConfigMap's) change re-triggers the runs of its
        // namespace that have no Flower run yet; runs in progress poll anyway, finished ones
        // cost nothing.
        use flower_addon_crds::run::RUN_COMPLETE;
        let (store, mut writer) = reflector::store::<FlowerRun>();
        writer.apply_watcher_event(&Event::Init);
        for r in [
            run("waiting", "team", json!({})),
            run("other-namespace", "elsewhere", json!({})),
            run(
                "running",
                "team",
                json!({"runId": "7", "flowerStatus": "running"}),
            ),
            run(
                "complete",
                "team",
                json!({"conditions": [{"type": RUN_COMPLETE, "status": "True", "reason": "Completed", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
            ),
        ] {
            writer.apply_watcher_event(&Event::InitApply(r));
        }
        writer.apply_watcher_event(&Event::InitDone);
        let woken: Vec<String> = waiting_runs(&store, Some("team".into()), |_| true)
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(woken, ["waiting"]);
        assert!(
            waiting_runs(&store, Some("team".into()), |r| r.spec.federation_ref.name
                == "other")
            .is_empty()
        );
    }

    #[test]
    fn a_federation_triggers_its_runs_when_ready_changes_not_on_every_status_write() {
        // Invariant: SuperNode counts and other status writes of a Federation wake no run; a
        // change of its Ready condition does.
        let fed = |ready: &str, supernodes: &str| -> Federation {
            let mut fed: Federation = serde_json::from_value(json!({
                "apiVersion": "flower-addon.io/v1alpha1",
                "kind": "Federation",
                "metadata": {"name": "fed", "namespace": "team"},
                "spec": {
                    "mode": "StatefulSet", "isolationMode": "subprocess", "insecure": true,
                    "superlink": {"image": "flwr/superlink:1.42.0"},
                    "supernodes": {"image": "flwr/supernode:1.42.0", "pools": [{"name": "a", "replicas": 1}]},
                },
            }))
            .expect("Federation");
            fed.status = Some(
                serde_json::from_value(json!({
                    "supernodes": supernodes,
                    "conditions": [{"type": "Ready", "status": ready, "reason": "R", "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                }))
                .expect("status"),
            );
            fed
        };
        assert_eq!(
            federation_inputs(&fed("False", "0/1")),
            federation_inputs(&fed("False", "1/2"))
        );
        assert_ne!(
            federation_inputs(&fed("False", "0/1")),
            federation_inputs(&fed("True", "0/1"))
        );
    }
}

//! The standalone hub: no Kubernetes. Federations and Placements come from YAML files in a
//! directory (re-read when they change), clusters and the CA live in the state directory, each
//! Federation's SuperLink runs as a supervised child process, and status is written to
//! `<state>/status.json` (read by `flower-hub status`).
//!
//! One reconcile pass (every second, and at once when something changes):
//! manifests → placement → per-cluster work (sent over the channel when it changed) →
//! SuperLinks (started, restarted on argument change, stopped when their Federation goes) →
//! node keys registered → status.
pub mod manifests;
pub mod netns;
mod nodes;
mod placements;
mod running;
mod views;

pub use views::federation_dialect;
use views::*;
pub mod runs;
pub mod status;
pub mod superlink;

use crate::channel::source::InMemoryWorkSource;
use crate::core::HUB_CLUSTER;
use crate::core::placement::{self, ClusterView, TaintEffect, TaintView};
use crate::core::superlink::SuperLinkPorts;
use crate::core::work::WorkInputs;
use crate::registration::ca::HubCa;
use crate::registration::store::{ClusterRecord, ClusterStore};
use flower_addon_crds::Federation;
use flower_addon_crds::render::{FlowerDialect, FlowerVersion};
use flower_addon_proto::{ClusterWork, FederationWork};
use manifests::Manifests;
use running::{RunningSuperLink, SuperLinkError, stop_superlink};
use status::{ClusterSummary, FederationSummary, HubStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use superlink::SuperLinkPaths;

/// How often a pass runs while work is held back for a starting SuperLink.
const HOLD_POLL: Duration = Duration::from_millis(200);

/// Settings of the standalone hub controller.
#[derive(Clone, Debug)]
pub struct StandaloneConfig {
    /// State directory (shared with the file store).
    pub state_dir: PathBuf,
    /// Directory of Federation/Placement YAML files.
    pub manifests_dir: PathBuf,
    /// Directory holding `flower-superlink` and `flower-superexec` (and `flower-supernode` for
    /// the hub machine's own pools); None: PATH.
    pub flower_bin: Option<PathBuf>,
    /// Host SuperLinks listen on.
    pub superlink_host: String,
    /// Addresses agents dial to reach this machine (first one is used in Fleet addresses).
    pub advertise: Vec<String>,
    /// Validity of the SuperLink certificates the hub issues (renewed at 80 %).
    pub superlink_cert_validity: Duration,
    /// First local port tried for the hub machine's own SuperNodes (`--local-port-base`).
    pub local_port_base: u16,
    /// Whether SuperLinks and the hub machine's SuperNodes run with `state_dir` hidden but for
    /// their own directory ([`flower_addon_runtime::sandbox`]).
    pub sandbox: bool,
    /// With `sandbox`: each SuperLink (and its ServerApps) in a network namespace of its own,
    /// bridged by `bridge_program` ([`netns`]); `None`: on the hub machine's network.
    pub superlink_network: Option<NetnsBridge>,
    /// With `sandbox`: each of the hub machine's own SuperNodes (with its ClientApps) in a
    /// network namespace of its own ([`flower_addon_runtime::process_runtime`]); `None`: on the
    /// hub machine's network.
    pub supernode_network: Option<NetnsBridge>,
    /// Names a Federation may ask for in its SuperLink certificate
    /// ([`crate::core::sans`]: `--advertise-address`es and `--superlink-name`).
    pub superlink_names: crate::core::sans::SuperLinkNames,
    /// The hub admin's pod policy: a Federation is judged as the Kubernetes hub judges it
    /// ([`crate::core::problems`]), so the same input is refused the same way in both modes.
    pub pod_policy: flower_addon_crds::policy::PodPolicy,
    /// Where FlowerRuns' FAB URLs may be downloaded from ([`crate::flower::fab_url::Egress`]).
    pub fab_egress: crate::flower::fab_url::Egress,
}

/// How SuperLinks get a network namespace of their own ([`netns`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetnsBridge {
    /// The `flower-hub` binary that runs `netns-bridge` (the running hub's own executable).
    pub program: PathBuf,
}

type FedKey = (String, String);

/// Fleet and Control addresses of a standalone SuperLink (`host:port`).
struct StandaloneEndpoints {
    fleet: String,
    control: Option<String>,
}

pub struct StandaloneHub<S: ClusterStore> {
    store: Arc<S>,
    work: Arc<InMemoryWorkSource>,
    /// The Flower CA: signs the SuperLink certificates (never the CA agents pin).
    ca: Arc<HubCa>,
    config: StandaloneConfig,
    manifests: Manifests,
    superlinks: BTreeMap<FedKey, RunningSuperLink>,
    /// What each Placement selected last ([`placements`]).
    selections: BTreeMap<placements::PlacementKey, BTreeSet<String>>,
    sent: BTreeMap<String, ClusterWork>,
    /// The SuperNode keys each SuperLink holds and lists online.
    keys: Arc<crate::flower::registry::NodeKeyRegistry>,
    /// The key sync under way ([`Self::sync_node_keys`]): it runs beside the passes, so
    /// SuperLinks slow to answer (or many keys to register) delay no other Federation's work.
    key_sync: Option<tokio::task::JoinHandle<()>>,
    /// Process runtime for the pools of Federations without `placementRef` (started on need).
    local: Option<Arc<flower_addon_runtime::process_runtime::ProcessRuntime>>,
    /// The readiness check passed after the first pass.
    ready: Option<(Arc<flower_addon_runtime::ops::Health>, &'static str)>,
    /// Federations whose work the last pass held back ([`crate::core::hold`]).
    held: BTreeSet<FedKey>,
    /// The FlowerRuns ([`runs`]).
    runs: runs::StandaloneRuns,
    /// SuperLink certificate renewals waiting for runs in progress.
    renewals: crate::flower::renewal::RenewalHolds,
}

impl<S: ClusterStore> StandaloneHub<S> {
    /// A controller with nothing running yet; `flower_ca` signs the SuperLink certificates
    /// ([`crate::registration::ca::CaRole::Flower`]).
    pub fn new(
        store: Arc<S>,
        work: Arc<InMemoryWorkSource>,
        ca: Arc<HubCa>,
        config: StandaloneConfig,
    ) -> Self {
        let manifests = Manifests::new(config.manifests_dir.clone(), config.pod_policy.clone());
        let runs = runs::StandaloneRuns::new(&config.state_dir, config.fab_egress.clone());
        Self {
            runs,
            store,
            work,
            ca,
            config,
            manifests,
            superlinks: BTreeMap::new(),
            selections: BTreeMap::new(),
            sent: BTreeMap::new(),
            keys: Arc::new(crate::flower::registry::NodeKeyRegistry::new()),
            key_sync: None,
            local: None,
            ready: None,
            held: BTreeSet::new(),
            renewals: Default::default(),
        }
    }

    /// Sets readiness check `check` of `health` once the first pass over the manifests is done.
    pub fn with_health(
        mut self,
        health: Arc<flower_addon_runtime::ops::Health>,
        check: &'static str,
    ) -> Self {
        health.set(check, false);
        self.ready = Some((health, check));
        self
    }

    /// Runs reconcile passes until `shutdown` resolves, then stops every SuperLink.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut store_changes = self.store.changes();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // While work is held back for a starting SuperLink, look again soon.
            let soon = async {
                if self.held.is_empty() {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(HOLD_POLL).await;
            };
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tick.tick() => {}
                _ = store_changes.recv() => {}
                _ = soon => {}
            }
            self.reconcile().await;
            if let Some((health, check)) = self.ready.take() {
                health.set(check, true);
            }
        }
        if let Some(sync) = self.key_sync.take() {
            sync.abort();
        }
        if let Some(local) = self.local.take() {
            local.shutdown().await;
        }
        for (_, sl) in std::mem::take(&mut self.superlinks) {
            stop_superlink(sl).await;
        }
    }

    /// One reconcile pass.
    pub async fn reconcile(&mut self) {
        if self.manifests.refresh() {
            for problem in self.manifests.problems() {
                tracing::warn!(%problem, "manifest problem");
            }
        }
        let clusters = match self.store.list_clusters().await {
            Ok(c) => c,
            Err(error) => {
                tracing::warn!(%error, "cannot list clusters");
                return;
            }
        };
        let now = crate::registration::tokens::unix_now() as i64;
        let views: Vec<ClusterView> = clusters.iter().map(cluster_view).collect();
        let decisions = self.decide_placements(&views, now);
        let federations = self.federations_with_restarts();
        let mut per_cluster: BTreeMap<String, Vec<FederationWork>> = BTreeMap::new();
        let mut summaries = Vec::new();
        for fed in &federations {
            summaries.push(
                self.summarize_federation(fed, &views, &decisions, &mut per_cluster)
                    .await,
            );
        }
        let live: BTreeSet<FedKey> = federations.iter().map(fed_key).collect();
        self.stop_removed(&live).await;
        self.update_held(&live).await;
        let local_work = per_cluster.remove(HUB_CLUSTER);
        self.run_local(local_work).await;
        self.send_work(&clusters, per_cluster);
        self.sync_node_keys(&federations, &views).await;

        let mut status = self.hub_status(summaries, &clusters, &views);
        let endpoints: BTreeMap<FedKey, crate::flower::control::ControlEndpoint> = federations
            .iter()
            .filter_map(|f| Some((fed_key(f), self.control_endpoint(f)?)))
            .collect();
        self.runs.set_superlinks_started(self.superlink_starts());
        status.runs = self
            .runs
            .reconcile(&self.manifests, &status.federations, |k| {
                endpoints.get(k).cloned()
            })
            .await;
        status.problems.extend(self.runs.problems().iter().cloned());
        self.record_metrics(&status, &clusters);
        if let Err(error) = status.write(&self.config.state_dir) {
            tracing::warn!(%error, "cannot write status.json");
        }
    }

    /// The manifests' Federations, each with the hub's own restart of its SuperNodes in its
    /// status, as in Kubernetes mode.
    fn federations_with_restarts(&self) -> Vec<Federation> {
        self.manifests
            .federations()
            .cloned()
            .map(|mut fed| {
                if let Some(after) = self.runs.restarted_after(&fed_key(&fed)) {
                    fed.status
                        .get_or_insert_default()
                        .supernode_restart_after_run = Some(after.to_string());
                }
                fed
            })
            .collect()
    }

    /// Reconciles one Federation (its work added to `per_cluster`), timed in the metrics; its
    /// summary for `status.json`.
    async fn summarize_federation(
        &mut self,
        fed: &Federation,
        views: &[ClusterView],
        decisions: &BTreeMap<placements::PlacementKey, placements::Decision>,
        per_cluster: &mut BTreeMap<String, Vec<FederationWork>>,
    ) -> FederationSummary {
        let mut summary = FederationSummary::new(fed);
        if let Ok((_, dialect)) = crate::core::render::federation_dialect(fed) {
            let endpoints = self.endpoints(fed, dialect);
            summary.fleet = Some(endpoints.fleet);
            summary.control = endpoints.control;
        }
        let started = std::time::Instant::now();
        let result = self
            .reconcile_federation(fed, views, decisions, per_cluster)
            .await;
        crate::metrics::hub().reconciled(
            "federation",
            started.elapsed(),
            result.as_ref().err().map(|_| "reconcile"),
        );
        match result {
            Ok(placed) => {
                summary.selected = placed.selected;
                summary.unplaced_pools = placed.unplaced;
                summary.placement = placed.placement_problem;
                summary.error = placed.refused;
            }
            Err(error) => summary.error = Some(error.to_string()),
        }
        summary
    }

    /// Stops the SuperLinks of Federations no longer in the manifests (`live`).
    async fn stop_removed(&mut self, live: &BTreeSet<FedKey>) {
        let gone: Vec<FedKey> = self
            .superlinks
            .keys()
            .filter(|k| !live.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.renewals.forget(&key);
            if let Some(sl) = self.superlinks.remove(&key) {
                tracing::info!(namespace = %key.0, federation = %key.1, "Federation removed: stopping its SuperLink");
                stop_superlink(sl).await;
            }
        }
    }

    /// `status.json` of this pass but its runs: each Federation's summary finished against the
    /// work and the SuperLinks, the clusters, the manifests' problems.
    fn hub_status(
        &self,
        summaries: Vec<FederationSummary>,
        clusters: &[ClusterRecord],
        views: &[ClusterView],
    ) -> HubStatus {
        // The hub machine's own pools are always reachable; agents by their Available condition.
        let available: BTreeSet<&str> = clusters
            .iter()
            .filter(|c| {
                c.status
                    .condition(crate::registration::store::CONDITION_AVAILABLE)
                    .is_some_and(|a| a.status == "True")
            })
            .map(|c| c.registration.name.as_str())
            .chain([HUB_CLUSTER])
            .collect();
        let superlinks = self.superlinks_state();
        HubStatus {
            federations: summaries
                .into_iter()
                .map(|s| {
                    let keys = self
                        .keys
                        .get(&(s.namespace.clone(), s.name.clone()))
                        .filter(|k| k.listed);
                    s.finish(&self.work, &superlinks, keys.as_ref(), |c| {
                        available.contains(c)
                    })
                })
                .collect(),
            clusters: clusters
                .iter()
                .zip(views)
                .map(|(c, v)| ClusterSummary::new(c, v))
                .collect(),
            problems: self.manifests.problems().to_vec(),
            runs: Vec::new(),
            manifests_dir: Some(self.config.manifests_dir.display().to_string()),
        }
    }

    /// Replaces the per-Federation and per-cluster gauges with this pass's status.
    fn record_metrics(&self, status: &HubStatus, clusters: &[ClusterRecord]) {
        let metrics = crate::metrics::hub();
        metrics.set_federations(status.federations.iter().map(|f| {
            let key = (f.namespace.clone(), f.name.clone());
            let mut sample = crate::metrics::FederationSample::of(
                i32::try_from(f.desired_supernodes).unwrap_or(i32::MAX),
                i32::try_from(f.ready_supernodes).unwrap_or(i32::MAX),
                &f.cluster_totals,
            );
            sample.superlink_restarts = self
                .superlinks
                .get(&key)
                .map(|sl| i64::from(sl.superlink.state().restarts));
            let labels = crate::metrics::FederationLabels {
                namespace: key.0,
                federation: key.1,
            };
            (labels, sample)
        }));
        metrics.set_clusters(clusters.iter().map(|c| {
            c.status
                .condition(crate::registration::store::CONDITION_AVAILABLE)
                .map(|a| a.status.as_str())
        }));
    }

    fn superlinks_state(&self) -> BTreeMap<FedKey, bool> {
        self.superlinks
            .iter()
            .map(|(k, sl)| (k.clone(), sl.superlink.state().pid.is_some()))
            .collect()
    }

    async fn reconcile_federation(
        &mut self,
        fed: &Federation,
        views: &[ClusterView],
        decisions: &BTreeMap<placements::PlacementKey, placements::Decision>,
        per_cluster: &mut BTreeMap<String, Vec<FederationWork>>,
    ) -> Result<Placed, FederationError> {
        let key = fed_key(fed);
        let (version, dialect) = crate::core::render::federation_dialect(fed)?;
        let paths = SuperLinkPaths::new(&self.config.state_dir, &key.0, &key.1);
        // Certificate names the hub may not issue (every SuperNode trusts the one Flower CA, so a
        // name is the admin's to allow, not the Federation author's): the SuperLink and its
        // certificate are left as they are, as the Kubernetes controller leaves a Degraded
        // Federation's objects, and the status says why; the pools follow the spec in both modes.
        let refused = crate::core::sans::san_problems(fed, &self.config.superlink_names);
        if refused.is_empty() {
            let certificate = if fed.spec.insecure {
                String::new()
            } else {
                self.ensure_superlink_tls(fed, &paths).await?
            };
            self.ensure_superlink(fed, version, dialect, &paths, certificate)
                .await?;
        }

        // Without placementRef the pools run on this machine, next to the SuperLink (the
        // standalone counterpart of "in the hub cluster"): the virtual cluster HUB_CLUSTER.
        let mut placement_problem = None;
        let selected: Vec<String> = match &fed.spec.placement_ref {
            None => vec![HUB_CLUSTER.to_owned()],
            Some(placement_ref) if placement_ref.is_ocm() => {
                return Err(FederationError::OcmPlacement);
            }
            Some(placement_ref) => {
                let placed = (key.0.clone(), placement_ref.name.clone());
                let decision =
                    decisions
                        .get(&placed)
                        .ok_or_else(|| FederationError::PlacementMissing {
                            namespace: key.0.clone(),
                            name: placement_ref.name.clone(),
                        })?;
                placement_problem = decision.problem.clone();
                decision.selected.clone()
            }
        };
        let ca_pem = if fed.spec.insecure {
            String::new()
        } else if !refused.is_empty() {
            self.ca
                .federation(&key.0, &key.1)
                .map_err(SuperLinkError::Ca)?
                .bundle_pem()
                .to_owned()
        } else {
            std::fs::read_to_string(&paths.ca).map_err(|source| SuperLinkError::File {
                path: paths.ca.clone(),
                source,
            })?
        };
        let fleet = self.endpoints(fed, dialect).fleet;
        let labels: BTreeMap<String, BTreeMap<String, String>> = views
            .iter()
            .map(|v| (v.name.clone(), v.labels.clone()))
            .collect();
        let registered = self.keys.registered(&key);
        let retired = self.keys.retired(&key);
        let works = crate::core::work::federation_work(
            fed,
            version,
            &WorkInputs {
                selected: &selected,
                labels: &labels,
                fleet_address: &fleet,
                ca_pem: &ca_pem,
                registered_node_keys: &registered,
                retired_node_keys: &retired,
            },
        )?;
        for (cluster, work) in works.per_cluster {
            per_cluster.entry(cluster).or_default().push(work);
        }
        Ok(Placed {
            selected,
            unplaced: works.unplaced_pools,
            placement_problem,
            refused: (!refused.is_empty()).then(|| crate::core::problems::joined(&refused)),
        })
    }

    /// Where the Federation's SuperLink process is reached: hub-local pools dial loopback;
    /// spokes dial `externalAddress` (the same rule as Kubernetes mode,
    /// [`crate::core::render::external_endpoints`]) or, without it, the first `--advertise-address`
    /// at the Fleet port (the process listens on the hub machine's own ports, as a NodePort
    /// would on a node). `flwr` reaches Control at the advertised host (or the SuperLink host
    /// when it is bound to one address).
    fn endpoints(&self, fed: &Federation, dialect: FlowerDialect) -> StandaloneEndpoints {
        let addr = SuperLinkPorts::from_spec(fed, dialect);
        let advertised = self
            .config
            .advertise
            .first()
            .cloned()
            .unwrap_or_else(|| "127.0.0.1".into());
        let control_host = match self.config.superlink_host.as_str() {
            _ if crate::core::superlink::separate_control(fed) => "127.0.0.1".to_owned(),
            "0.0.0.0" | "::" | "" => advertised.clone(),
            bound => bound.to_owned(),
        };
        let control = Some(crate::core::render::with_default_port(
            &control_host,
            i32::from(addr.control),
        ));
        if fed.spec.placement_ref.is_none() {
            return StandaloneEndpoints {
                fleet: format!("127.0.0.1:{}", addr.fleet),
                control,
            };
        }
        match crate::core::render::external_endpoints(fed, dialect, None, None) {
            Ok(external) if fed.spec.superlink.external_address.is_some() => StandaloneEndpoints {
                fleet: external.fleet,
                control: if crate::core::superlink::separate_control(fed) {
                    control
                } else {
                    external.control.or(control)
                },
            },
            _ => StandaloneEndpoints {
                fleet: crate::core::render::with_default_port(&advertised, i32::from(addr.fleet)),
                control,
            },
        }
    }

    /// Which Federations' work is held back this pass: those whose SuperLink was started and
    /// does not listen yet ([`RunningSuperLink::holding`]).
    async fn update_held(&mut self, live: &BTreeSet<FedKey>) {
        let mut held = BTreeSet::new();
        for key in live {
            if let Some(sl) = self.superlinks.get_mut(key)
                && sl.holding().await
            {
                held.insert(key.clone());
            }
        }
        for key in held.difference(&self.held) {
            tracing::info!(namespace = %key.0, federation = %key.1, "holding back this Federation's work until its SuperLink listens (at most {} s): no SuperNode is started or restarted while it cannot reach it", running::LISTEN_HOLD.as_secs());
        }
        for key in self.held.difference(&held) {
            match self.superlinks.get(key) {
                Some(sl) if sl.listening => {
                    tracing::info!(namespace = %key.0, federation = %key.1, after_ms = sl.started.elapsed().as_millis() as u64, "the SuperLink listens: sending its Federation's work");
                }
                Some(_) => {
                    tracing::warn!(namespace = %key.0, federation = %key.1, "the SuperLink does not listen after {} s: sending its Federation's work anyway", running::LISTEN_HOLD.as_secs());
                }
                None => {}
            }
        }
        self.held = held;
    }

    fn send_work(
        &mut self,
        clusters: &[ClusterRecord],
        per_cluster: BTreeMap<String, Vec<FederationWork>>,
    ) {
        let mut changed = Vec::new();
        for cluster in clusters {
            let name = &cluster.registration.name;
            let wanted = per_cluster.get(name).cloned().unwrap_or_default();
            let Some(federations) =
                crate::core::hold::hold(wanted, self.sent.get(name), &self.held)
            else {
                continue;
            };
            let content = ClusterWork {
                version: 0,
                cluster_name: name.clone(),
                federations,
            };
            if self.sent.get(name) != Some(&content) {
                self.sent.insert(name.clone(), content.clone());
                changed.push((name.clone(), content));
            }
        }
        if !changed.is_empty() {
            let names: Vec<String> = changed.iter().map(|(n, _)| n.clone()).collect();
            tracing::info!(clusters = names.len(), changed = %crate::core::status::name_few(&names), "work changed: sending new snapshots");
            self.work.set_many(changed);
        }
    }
}

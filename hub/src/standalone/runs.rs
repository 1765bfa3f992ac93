//! `FlowerRun`s in standalone mode: the manifests come from the manifests directory (with the
//! ConfigMaps holding their FABs: the same files `kubectl apply -f` takes), and each run's status
//! is kept in `<state>/runs/<namespace>/<name>.json`, written before every submission (it holds
//! the pending submission a restarted hub adopts instead of submitting twice). The reconcile is
//! [`crate::runs::reconcile`], the same as the Kubernetes mode's; this loads and stores.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flower_addon_crds::run::{FlowerRun, FlowerRunSpec, FlowerRunStatus, RunOutput};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::manifests::Manifests;
use super::status::FederationSummary;
pub use super::status::RunEntry;
use crate::core::run::{OutputDir, OutputsFailure, RunEvent, SuperLinkState};
use crate::flower::control::{ControlClient, ControlEndpoint};
use crate::flower::fab_url::FabUrlCache;
use crate::flower::outputs;
use crate::flower::runs::{self as flower_runs, ConfigMapSource, LogFollowers};
use crate::runs::{Outcome, RunHost, Stored as PendingStored};

mod host;
use host::StandaloneRunHost;

type RunKey = (String, String);
type FedKey = (String, String);

/// Directory of the runs' state under the state directory.
pub const RUNS_DIR: &str = "runs";

/// What is stored per run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Stored {
    /// The spec first seen: the spec is immutable but for `suspend`, as the CRD's rule says.
    spec: Option<FlowerRunSpec>,
    status: FlowerRunStatus,
    /// `ttlSecondsAfterFinished` passed: the run is neither shown nor started again while its
    /// manifest stays (Kubernetes deletes the object; here the file is the user's).
    #[serde(default)]
    expired: bool,
}

/// The standalone FlowerRun controller's state between passes.
pub struct StandaloneRuns {
    dir: PathBuf,
    /// The hub's state directory (absolute): Federations' outputs are under it.
    state_dir: PathBuf,
    stored: BTreeMap<RunKey, Stored>,
    followers: LogFollowers<RunKey>,
    clients: BTreeMap<FedKey, (ControlEndpoint, Arc<ControlClient>)>,
    /// Runs whose stored state cannot be read: left alone (never submitted again) until the
    /// file is fixed or removed.
    broken: BTreeMap<RunKey, String>,
    problems: Vec<String>,
    /// FABs downloaded from `spec.app.fab.url` (once per URL and hash).
    fab_urls: FabUrlCache,
    /// Now, for the runs' statuses.
    clock: crate::runs::Clock,
    /// Per Federation, the Flower run after which the hub last restarted its SuperNodes (the
    /// Kubernetes mode's `status.supernodeRestartAfterRun`), kept in [`RESTARTS_FILE`].
    restarts: BTreeMap<FedKey, u64>,
    /// Per Federation, when its SuperLink process last started
    /// ([`crate::runs::Run::superlink_started_at`]), as of the hub's last pass.
    superlinks_started: BTreeMap<FedKey, Timestamp>,
}

/// File under the state directory holding [`StandaloneRuns::restarted_after`].
pub const RESTARTS_FILE: &str = "supernode-restarts.json";

impl StandaloneRuns {
    /// Loads every stored run under `<state_dir>/runs/`. A file that cannot be read is reported
    /// and its run left alone until the file is fixed or removed (see [`load`]).
    pub fn new(state_dir: &Path, egress: crate::flower::fab_url::Egress) -> Self {
        let dir = state_dir.join(RUNS_DIR);
        let mut broken = BTreeMap::new();
        let stored = load(&dir, &mut broken);
        for problem in broken.values() {
            tracing::warn!(%problem, "stored FlowerRun state");
        }
        Self {
            dir,
            state_dir: std::path::absolute(state_dir).unwrap_or_else(|_| state_dir.to_owned()),
            stored,
            followers: LogFollowers::new(),
            clients: BTreeMap::new(),
            broken,
            problems: Vec::new(),
            fab_urls: FabUrlCache::with_egress(egress),
            clock: crate::runs::wall_clock(),
            restarts: load_restarts(&state_dir.join(RESTARTS_FILE)),
            superlinks_started: BTreeMap::new(),
        }
    }

    /// The Flower run after which the hub last restarted Federation `key`'s SuperNodes: the
    /// hub puts it in the Federation's `status.supernodeRestartAfterRun` before computing its
    /// work, as the Kubernetes hub's FlowerRun controller writes it.
    pub fn restarted_after(&self, key: &FedKey) -> Option<u64> {
        self.restarts.get(key).copied()
    }

    /// When each Federation's SuperLink process last started (the hub runs and restarts them).
    pub fn set_superlinks_started(&mut self, started: BTreeMap<FedKey, Timestamp>) {
        self.superlinks_started = started;
    }

    /// Reads the time from `clock` instead of the wall clock.
    pub fn with_clock(mut self, clock: crate::runs::Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Problems of the last pass (`FILE: field: message`), for `status.json`.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// One pass over every FlowerRun: the manifests' runs and the stored ones whose manifest was
    /// removed (their Flower runs are stopped, then they are forgotten).
    pub async fn reconcile(
        &mut self,
        manifests: &Manifests,
        federations: &[FederationSummary],
        endpoint: impl Fn(&FedKey) -> Option<ControlEndpoint>,
    ) -> Vec<RunEntry> {
        self.problems = self.broken.values().cloned().collect();
        let runs: Vec<FlowerRun> = manifests.flower_runs().cloned().collect();
        let live: BTreeSet<RunKey> = runs.iter().map(run_key).collect();
        let mut lists: BTreeMap<FedKey, SuperLinkState> = BTreeMap::new();
        let mut entries = Vec::new();
        for run in &runs {
            let key = run_key(run);
            let fed_key = (key.0.clone(), run.spec.federation_ref.name.clone());
            if self.broken.contains_key(&key) {
                continue;
            }
            let mut stored = self.stored.get(&key).cloned().unwrap_or_default();
            if stored.expired {
                continue;
            }
            let spec = match &stored.spec {
                Some(first) if !same_but_suspend(first, &run.spec) => {
                    self.problems.push(format!(
                        "FlowerRun {}/{}: {}",
                        key.0,
                        key.1,
                        flower_addon_crds::rules::MSG_RUN_IMMUTABLE
                    ));
                    let mut spec = first.clone();
                    spec.suspend = run.spec.suspend;
                    spec.run_config = run.spec.run_config.clone();
                    spec
                }
                _ => run.spec.clone(),
            };
            stored.spec = Some(spec.clone());
            let status = self
                .pass(
                    manifests,
                    federations,
                    &endpoint,
                    &mut lists,
                    &key,
                    &fed_key,
                    &spec,
                    &stored.status,
                    false,
                )
                .await;
            match status {
                Outcome::Store { status, .. } => stored.status = status,
                Outcome::Delete { status, .. } => {
                    stored.status = status;
                    stored.expired = true;
                }
                // Only a deleted run is released; nothing was stored on a stale pass.
                Outcome::Release { .. } | Outcome::Stale => {}
            }
            self.store(&key, stored.clone());
            if !stored.expired {
                entries.push(RunEntry {
                    namespace: key.0.clone(),
                    name: key.1.clone(),
                    federation: fed_key.1.clone(),
                    status: stored.status,
                });
            }
        }
        // Runs whose manifest is gone: stop what runs, then forget them.
        let gone: Vec<RunKey> = self
            .stored
            .keys()
            .filter(|k| !live.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            let Some(stored) = self.stored.get(&key).cloned() else {
                continue;
            };
            let Some(spec) = stored.spec.clone() else {
                self.forget(&key);
                continue;
            };
            let fed_key = (key.0.clone(), spec.federation_ref.name.clone());
            let outcome = self
                .pass(
                    manifests,
                    federations,
                    &endpoint,
                    &mut lists,
                    &key,
                    &fed_key,
                    &spec,
                    &stored.status,
                    true,
                )
                .await;
            match outcome {
                Outcome::Release { .. } => self.forget(&key),
                Outcome::Store { status, .. } | Outcome::Delete { status, .. } => {
                    self.store(&key, Stored { status, ..stored });
                }
                Outcome::Stale => {}
            }
        }
        self.followers.retain(|k| live.contains(k));
        entries
    }

    /// Reconciles one run ([`crate::runs::reconcile`]) with this mode's [`RunHost`].
    #[allow(clippy::too_many_arguments)]
    async fn pass(
        &mut self,
        manifests: &Manifests,
        federations: &[FederationSummary],
        endpoint: &impl Fn(&FedKey) -> Option<ControlEndpoint>,
        lists: &mut BTreeMap<FedKey, SuperLinkState>,
        key: &RunKey,
        fed_key: &FedKey,
        spec: &FlowerRunSpec,
        current: &FlowerRunStatus,
        deleting: bool,
    ) -> Outcome {
        let summary = federations
            .iter()
            .find(|f| f.namespace == fed_key.0 && f.name == fed_key.1);
        let restarting = summary.and_then(|f| {
            crate::core::status::restart_pending_of(f.supernode_restart.as_deref(), &f.clusters)
        });
        let federation = crate::runs::federation_state(summary.map(|f| {
            let why = f.error.as_deref().or(f.message.as_deref()).unwrap_or("");
            (f.ready, why, "")
        }));
        let client = self.client(fed_key, endpoint);
        let outputs = manifests
            .federations()
            .find(|f| {
                f.metadata.namespace.as_deref() == Some(fed_key.0.as_str())
                    && f.metadata.name.as_deref() == Some(fed_key.1.as_str())
            })
            .and_then(|f| f.spec.outputs.clone());
        let claimed = self
            .stored
            .iter()
            .filter(|(k, s)| {
                *k != key
                    && s.spec
                        .as_ref()
                        .is_some_and(|sp| sp.federation_ref.name == fed_key.1)
                    && k.0 == fed_key.0
            })
            .filter_map(|(_, s)| s.status.run_id.as_deref()?.parse().ok())
            .collect();
        let outputs_root = self.outputs_root(fed_key);
        let restarted_after = self.restarted_after(fed_key);
        let superlink_started_at = self.superlinks_started.get(fed_key).copied();
        let mut host = StandaloneRunHost {
            manifests,
            key,
            fed_key,
            spec,
            outputs: outputs.as_ref(),
            outputs_root,
            lists,
            runs: self,
        };
        let outcome = crate::runs::reconcile(
            &mut host,
            crate::runs::Run {
                key,
                spec,
                generation: None,
                current,
                deleting,
                federation,
                keeps_outputs: outputs.is_some(),
                client,
                claimed,
                restarted_after,
                restarting,
                superlink_started_at,
            },
        )
        .await;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(never) => match never {},
        };
        if let Outcome::Store { events, .. }
        | Outcome::Release { events }
        | Outcome::Delete { events, .. } = &outcome
        {
            crate::runs::log_events(key, events);
        }
        outcome
    }

    /// `<state>/federations/<ns>/<fed>/outputs`: inside the directory the Federation's
    /// SuperLink (and its ServerApps) may see in the sandbox.
    pub fn outputs_root(&self, fed_key: &FedKey) -> PathBuf {
        outputs_root(&self.state_dir, &fed_key.0, &fed_key.1)
    }

    fn client(
        &mut self,
        fed_key: &FedKey,
        endpoint: &impl Fn(&FedKey) -> Option<ControlEndpoint>,
    ) -> Option<Arc<ControlClient>> {
        let Some(wanted) = endpoint(fed_key) else {
            self.clients.remove(fed_key);
            return None;
        };
        if let Some((have, client)) = self.clients.get(fed_key)
            && *have == wanted
        {
            return Some(client.clone());
        }
        let client = Arc::new(ControlClient::new(wanted.clone()).ok()?);
        self.clients
            .insert(fed_key.clone(), (wanted, client.clone()));
        Some(client)
    }

    /// Stores a run's state when it changed (write-then-rename: never half a file).
    fn store(&mut self, key: &RunKey, stored: Stored) {
        if self.stored.get(key) == Some(&stored) {
            return;
        }
        let path = self.dir.join(&key.0).join(format!("{}.json", key.1));
        if let Err(error) = write_atomically(&path, &stored) {
            tracing::warn!(path = %path.display(), %error, "cannot store FlowerRun state");
        }
        self.stored.insert(key.clone(), stored);
    }

    /// Records a restart of Federation `key`'s SuperNodes (written before it is acted on, so a
    /// restarted hub does not restart them again); `false` when it was recorded already.
    fn restart_supernodes(&mut self, key: &FedKey, after_run: u64) -> bool {
        if self.restarts.get(key) == Some(&after_run) {
            return false;
        }
        self.restarts.insert(key.clone(), after_run);
        let path = self.state_dir.join(RESTARTS_FILE);
        let entries: Vec<(&str, &str, u64)> = self
            .restarts
            .iter()
            .map(|((ns, name), id)| (ns.as_str(), name.as_str(), *id))
            .collect();
        if let Err(error) = write_json_atomically(&path, &entries) {
            tracing::warn!(path = %path.display(), %error, "cannot store the SuperNode restarts");
        }
        true
    }

    fn forget(&mut self, key: &RunKey) {
        self.followers.stop(key);
        self.stored.remove(key);
        let _ = std::fs::remove_file(self.dir.join(&key.0).join(format!("{}.json", key.1)));
    }
}

/// Where a standalone Federation `namespace/name` keeps its runs' outputs
/// (`<state>/federations/<ns>/<fed>/outputs`).
pub fn outputs_root(state_dir: &Path, namespace: &str, name: &str) -> PathBuf {
    super::superlink::SuperLinkPaths::new(state_dir, namespace, name)
        .dir
        .join("outputs")
}

fn run_key(run: &FlowerRun) -> RunKey {
    (
        run.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        run.metadata.name.clone().unwrap_or_default(),
    )
}

/// Equal but for `suspend` and `runConfig`: the fields the CRD's CEL rule holds immutable
/// (`runConfig` is the core's to hold, in both modes).
fn same_but_suspend(a: &FlowerRunSpec, b: &FlowerRunSpec) -> bool {
    let mut a = a.clone();
    a.suspend = b.suspend;
    a.run_config = b.run_config.clone();
    a == *b
}

/// Reads every `<dir>/<namespace>/<name>.json`; unreadable ones go to `broken` with what to do.
fn load(dir: &Path, broken: &mut BTreeMap<RunKey, String>) -> BTreeMap<RunKey, Stored> {
    let mut out = BTreeMap::new();
    let Ok(namespaces) = std::fs::read_dir(dir) else {
        return out;
    };
    for ns in namespaces.flatten() {
        let Ok(files) = std::fs::read_dir(ns.path()) else {
            continue;
        };
        for file in files.flatten() {
            let path = file.path();
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            let key = (
                ns.file_name().to_string_lossy().into_owned(),
                name.to_owned(),
            );
            match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Stored>(&b).map_err(|e| e.to_string()))
            {
                Ok(stored) => {
                    out.insert(key, stored);
                }
                Err(e) => {
                    let problem = format!(
                        "{}: {e}: FlowerRun {}/{} is left alone (not submitted again); check the \
                         SuperLink's runs (`flwr ls`), then remove the file to start it afresh",
                        path.display(),
                        key.0,
                        key.1
                    );
                    broken.insert(key, problem);
                }
            }
        }
    }
    out
}

/// [`RESTARTS_FILE`] as `[[namespace, name, run id], …]`; absent or unreadable: none (the
/// next run that ends without completing restarts the SuperNodes, which is harmless).
fn load_restarts(path: &Path) -> BTreeMap<FedKey, u64> {
    let Ok(bytes) = std::fs::read(path) else {
        return BTreeMap::new();
    };
    match serde_json::from_slice::<Vec<(String, String, u64)>>(&bytes) {
        Ok(entries) => entries
            .into_iter()
            .map(|(ns, name, id)| ((ns, name), id))
            .collect(),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "ignoring unreadable SuperNode restarts");
            BTreeMap::new()
        }
    }
}

fn write_atomically(path: &Path, stored: &Stored) -> std::io::Result<()> {
    write_json_atomically(path, stored)
}

fn write_json_atomically(path: &Path, stored: &impl Serialize) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec_pretty(stored).map_err(std::io::Error::other)?;
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

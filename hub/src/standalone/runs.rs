//! `FlowerRun`s in standalone mode: the manifests come from the manifests directory (with the
//! ConfigMaps holding their FABs: the same files `kubectl apply -f` takes), and each run's status
//! is kept in `<state>/runs/<namespace>/<name>.json`, written before every submission (it holds
//! the pending submission a restarted hub adopts instead of submitting twice). What to do is
//! [`crate::core::run::decide`]'s; this only loads, stores and calls.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flower_addon_crds::run::{FlowerRun, FlowerRunSpec, FlowerRunStatus};
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::manifests::Manifests;
use super::status::FederationSummary;
use crate::core::run::{
    self as core_run, Action, FederationState, SuperLinkState, SuperNodesState,
};
use crate::flower::control::{ControlClient, ControlEndpoint};
use crate::flower::fab_url::FabUrlCache;
use crate::flower::outputs;
use crate::flower::runs::{self as flower_runs, CheckedApp, ConfigMapSource, LogFollowers};

type RunKey = (String, String);
type FedKey = (String, String);

/// Directory of the runs' state under the state directory.
pub const RUNS_DIR: &str = "runs";

/// One FlowerRun in `status.json` (`flower-hub status`, `flower-hub run list`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunEntry {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The Federation it runs on.
    pub federation: String,
    /// Its status, as a FlowerRun's `status` in Kubernetes mode.
    pub status: FlowerRunStatus,
}

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
}

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
        }
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
            let (status, action) = status;
            stored.status = status;
            stored.expired = action == Action::Delete;
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
            let (status, action) = self
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
            if action == Action::Release {
                self.forget(&key);
            } else {
                self.store(&key, Stored { status, ..stored });
            }
        }
        self.followers.retain(|k| live.contains(k));
        entries
    }

    /// Decides and acts for one run; the status to store and the action taken.
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
    ) -> (FlowerRunStatus, Action) {
        let run_name = format!("FlowerRun {}/{}", key.0, key.1);
        let federation = match federations
            .iter()
            .find(|f| f.namespace == fed_key.0 && f.name == fed_key.1)
        {
            None => FederationState::Missing,
            Some(f) if f.ready => FederationState::Ready,
            Some(f) => FederationState::NotReady(
                f.error
                    .clone()
                    .or_else(|| f.message.clone())
                    .unwrap_or_else(|| "not ready".into()),
            ),
        };
        let client = self.client(fed_key, endpoint);
        let needs_superlink = core_run::needs_superlink(current, deleting);
        let superlink = match (&client, needs_superlink) {
            (_, false) => SuperLinkState::NotAsked,
            (None, true) => SuperLinkState::Unreachable(format!(
                "Federation {} has no SuperLink to reach",
                fed_key.1
            )),
            (Some(client), true) => match lists.get(fed_key) {
                Some(state) => state.clone(),
                None => {
                    let state = flower_runs::list(client).await;
                    lists.insert(fed_key.clone(), state.clone());
                    state
                }
            },
        };
        let outputs_root = manifests
            .federations()
            .find(|f| {
                f.metadata.namespace.as_deref() == Some(fed_key.0.as_str())
                    && f.metadata.name.as_deref() == Some(fed_key.1.as_str())
            })
            .and_then(|f| f.spec.outputs.as_ref())
            .map(|outputs| (outputs, self.outputs_root(fed_key)));
        let mut checked: Option<CheckedApp> = None;
        let app = if core_run::needs_app(current, deleting) {
            let config_map = spec
                .app
                .fab
                .config_map_ref
                .as_ref()
                .and_then(|r| manifests.config_map(&key.0, &r.name));
            let (source, bytes) = flower_runs::fab_bytes_from(
                &key.0,
                &spec.app.fab,
                config_map,
                ConfigMapSource::ManifestsDirectory,
                &self.fab_urls,
            )
            .await;
            let output = outputs_root.as_ref().map(|(outputs, root)| {
                // The root exists, as the volume's mount does in Kubernetes; the app makes
                // its run's directory.
                // The SuperLink's directory holds it: its confined ServerApps write there.
                let made = std::fs::create_dir_all(root).and_then(|()| match root.parent() {
                    Some(superlink_dir) => {
                        flower_addon_agent::sandbox::hand_over(root, superlink_dir)
                    }
                    None => Ok(()),
                });
                if let Err(e) = made {
                    tracing::warn!(dir = %root.display(), error = %e, "cannot make the outputs directory");
                }
                core_run::OutputDir::new(outputs, &root.to_string_lossy(), &key.0, &key.1)
            });
            let (state, app) =
                flower_runs::check_app(&source, bytes, &spec.run_config, output.as_ref());
            checked = app;
            Some(state)
        } else {
            None
        };
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
        let supernodes = match &client {
            Some(client)
                if federation == FederationState::Ready
                    && core_run::needs_supernodes(current, deleting) =>
            {
                flower_runs::supernodes(client).await
            }
            _ => SuperNodesState::NotAsked,
        };
        let facts = core_run::Facts {
            run_name: &run_name,
            spec,
            generation: None,
            deleting,
            federation,
            app,
            superlink,
            supernodes,
            config_text: flower_runs::config_text(&spec.run_config, checked.as_ref()),
            run_config_hash: core_run::run_config_hash(spec),
            claimed,
            now: Timestamp::now(),
        };
        let decision = core_run::decide(current, &facts);
        for event in &decision.events {
            if event.warning {
                tracing::warn!(run = %run_name, reason = event.reason, "{}", event.message);
            } else {
                tracing::info!(run = %run_name, reason = event.reason, "{}", event.message);
            }
        }
        let mut status = decision.status;
        match (&decision.action, &client) {
            (Action::Submit, Some(client)) => {
                if let Some(app) = &checked {
                    // Stored before it is sent: a crash from here on is adopted, not resent.
                    self.store(
                        key,
                        Stored {
                            spec: Some(spec.clone()),
                            status: status.clone(),
                            expired: false,
                        },
                    );
                    status = flower_runs::submit(client, &status, app).await;
                    lists.remove(fed_key);
                    if let Some(id) = &status.run_id {
                        tracing::info!(run = %run_name, run_id = %id, attempt = status.attempts, "submitted");
                    }
                }
            }
            (Action::Stop(run_id) | Action::StopAndRelease(run_id), Some(client)) => {
                if let Err(why) = flower_runs::stop(client, *run_id).await {
                    status.details = Some(format!("stopping Flower run {run_id}: {why}"));
                    return (status, Action::Nothing);
                }
                lists.remove(fed_key);
            }
            _ => {}
        }
        // The log: followed while the run goes on; the rest read once when it finished.
        if let Some(client) = &client
            && let Some(run_id) = status
                .run_id
                .as_deref()
                .and_then(|id| id.parse::<u64>().ok())
        {
            let after = status.log_timestamp.unwrap_or(0.0);
            let chunks = if core_run::active_run(&status).is_some() && !deleting {
                self.followers.drain(key, client, run_id, after)
            } else if core_run::active_run(current).is_some() || current.run_id != status.run_id {
                self.followers.stop(key);
                flower_runs::final_log(client, run_id, after, Duration::from_secs(5)).await
            } else {
                Vec::new()
            };
            for chunk in chunks {
                core_run::add_log(&mut status, &chunk.text, chunk.timestamp);
            }
        }
        if !deleting && core_run::outputs_to_list(&status, outputs_root.is_some()) {
            let dir = self.outputs_root(fed_key).join(&key.0).join(&key.1);
            let max_bytes = outputs_root
                .and_then(|(spec, _)| spec.size_limit_bytes())
                .unwrap_or(u64::MAX);
            // Off the hub's task, and bounded: at most the size limit is read, within a minute.
            let listing = tokio::task::spawn_blocking(move || outputs::list_dir(&dir, max_bytes));
            let listed = match tokio::time::timeout(core_run::OUTPUTS_LIST_TIMEOUT, listing).await {
                Ok(Ok(Ok(files))) => Ok(files),
                Ok(Ok(Err(outputs::OutputsError::OverQuota { message }))) => {
                    Err(core_run::OutputsFailure::OverQuota(message))
                }
                Ok(Ok(Err(e))) => Err(core_run::OutputsFailure::Retry(e.to_string())),
                Ok(Err(e)) => Err(core_run::OutputsFailure::Retry(e.to_string())),
                Err(_) => Err(core_run::OutputsFailure::Retry(format!(
                    "listing took longer than {} s",
                    core_run::OUTPUTS_LIST_TIMEOUT.as_secs()
                ))),
            };
            // Retried on the next pass while it fails (for the core's window).
            let _ = core_run::record_outputs(&mut status, listed, Timestamp::now());
        }
        (status, decision.action)
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

fn write_atomically(path: &Path, stored: &Stored) -> std::io::Result<()> {
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

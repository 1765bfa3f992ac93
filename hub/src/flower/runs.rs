//! The Flower side of `FlowerRun`s, shared by both hub modes: the FAB read from its ConfigMap
//! ([`fab_bytes`]) or downloaded from its URL ([`fab_bytes_from`]) and checked against the run
//! config ([`check_app`]), the SuperLink's run list in the core's terms ([`list`]), the calls an
//! [`crate::core::run::Action`] needs ([`submit`], [`stop`]) and the log followers
//! ([`LogFollowers`]), for [`crate::runs::reconcile`].
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use flower_addon_crds::run::{FabSource, FlowerRunStatus, RunConfigValue, reason};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;

use super::control::{ControlClient, ControlError, LogChunk};
use super::fab::{self, ConfigValue};
use super::fab_url::FabUrlCache;
use crate::core::run::{self as core_run, AppState, ListedRun, SuperLinkState, SuperNodesState};

/// An app ready to submit: the FAB and the checked run config.
#[derive(Clone, Debug)]
pub struct CheckedApp {
    /// The FAB's bytes.
    pub fab: Vec<u8>,
    /// Its SHA-256.
    pub hash: String,
    /// `override_config`, checked against the app's `[tool.flwr.app.config]`.
    pub config: BTreeMap<String, ConfigValue>,
}

/// A run's FAB as an adapter found it ([`fab_bytes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FabBytes {
    /// The FAB's bytes.
    Found(Vec<u8>),
    /// Not there yet (its ConfigMap or key does not exist, or its URL does not answer yet): the
    /// run waits (what to add, or what failed).
    Missing(String),
    /// Cannot be had (why): the run fails.
    Unusable(String),
}

/// Where an adapter finds the ConfigMaps holding FABs, for the message about a missing one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigMapSource {
    /// The standalone hub's manifests directory.
    ManifestsDirectory,
    /// The Kubernetes API (the run's namespace).
    Cluster,
}

/// The FAB of a run whose spec says `fab`, in `namespace`, with `config_map` the ConfigMap its
/// `configMapRef` names (`None` when it does not exist): where it came from (for messages) and
/// its bytes, from `binaryData[key]`, else `data[key]`. Both hub modes read FABs here, so they
/// wait for, and refuse, the same things with the same words. A `url` is downloaded by
/// [`fab_bytes_from`]; here it only waits.
pub fn fab_bytes(
    namespace: &str,
    fab: &FabSource,
    config_map: Option<&ConfigMap>,
    found_in: ConfigMapSource,
) -> (String, FabBytes) {
    let Some(reference) = &fab.config_map_ref else {
        let Some(url) = &fab.url else {
            return (
                "spec.app.fab".into(),
                FabBytes::Unusable("spec.app.fab: set configMapRef (or url)".into()),
            );
        };
        return (
            url.clone(),
            FabBytes::Missing(format!(
                "spec.app.fab.url: {url} is not downloaded yet; the run starts once it is"
            )),
        );
    };
    let (name, key) = (&reference.name, &reference.key);
    let source = format!("ConfigMap {namespace}/{name} key {key}");
    let Some(config_map) = config_map else {
        let (missing, add) = match found_in {
            ConfigMapSource::ManifestsDirectory => (
                "is not in the manifests directory",
                format!(
                    "add it (`kubectl create configmap {name} --from-file={key}=APP.fab \
                     --dry-run=client -o yaml`)"
                ),
            ),
            ConfigMapSource::Cluster => (
                "does not exist",
                format!(
                    "create it (`kubectl create configmap {name} -n {namespace} \
                     --from-file={key}=APP.fab`)"
                ),
            ),
        };
        return (
            source,
            FabBytes::Missing(format!(
                "spec.app.fab.configMapRef: ConfigMap {namespace}/{name} {missing}; the run \
                 starts once it is there: {add}"
            )),
        );
    };
    let bytes = config_map
        .binary_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            config_map
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|s| s.clone().into_bytes())
        });
    let found = match bytes {
        Some(b) => FabBytes::Found(b),
        None => FabBytes::Missing(format!(
            "spec.app.fab.configMapRef.key: ConfigMap {namespace}/{name} has no key {key:?} in \
             binaryData or data; the run starts once it has"
        )),
    };
    (source, found)
}

/// [`fab_bytes`], downloading a `url` through `cache` (both hub modes share one per hub, so a
/// FAB is downloaded once, and a failing URL is retried at most every
/// [`super::fab_url::RETRY_AFTER`]). A `configMapRef` is read as [`fab_bytes`] reads it.
pub async fn fab_bytes_from(
    namespace: &str,
    fab: &FabSource,
    config_map: Option<&ConfigMap>,
    found_in: ConfigMapSource,
    cache: &FabUrlCache,
) -> (String, FabBytes) {
    let (None, Some(url)) = (&fab.config_map_ref, &fab.url) else {
        return fab_bytes(namespace, fab, config_map, found_in);
    };
    let Some(sha256) = &fab.sha256 else {
        return (
            url.clone(),
            FabBytes::Unusable(
                "spec.app.fab.sha256: required with url: set it to the FAB's SHA-256 \
                 (`sha256sum APP.fab`)"
                    .into(),
            ),
        );
    };
    // A slow download goes on in the background (filling the cache) while the pass moves on:
    // a URL that does not answer must not hold up every other run.
    let mut download = tokio::spawn({
        let (cache, url, sha256) = (cache.clone(), url.clone(), sha256.clone());
        async move { cache.get(&url, &sha256).await }
    });
    let bytes = match tokio::time::timeout(DOWNLOAD_WAIT, &mut download).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => FabBytes::Missing(format!(
            "spec.app.fab.url: downloading {url} failed ({e}); retried"
        )),
        Err(_) => FabBytes::Missing(format!(
            "spec.app.fab.url: downloading {url}; the run starts once it is downloaded and its \
             SHA-256 checked"
        )),
    };
    (url.clone(), bytes)
}

/// How long a pass waits for a FAB download before moving on (it continues in the background).
pub const DOWNLOAD_WAIT: Duration = Duration::from_secs(2);

/// Checks a run's FAB ([`fab_bytes`]) and run config: the core's [`AppState`], and the app to
/// submit when it is usable. `source` names where the FAB came from in messages.
///
/// With `output` (the Federation keeps outputs), an app that declares its key gets the run's
/// directory there; a `runConfig` setting that key itself is refused (the hub owns it).
pub fn check_app(
    source: &str,
    bytes: FabBytes,
    run_config: &BTreeMap<String, RunConfigValue>,
    output: Option<&core_run::OutputDir>,
) -> (AppState, Option<CheckedApp>) {
    let invalid =
        |reason: &'static str, message: String| (AppState::Invalid { reason, message }, None);
    let bytes = match bytes {
        FabBytes::Found(b) => b,
        FabBytes::Missing(message) => return (AppState::Missing { message }, None),
        FabBytes::Unusable(why) => return invalid(reason::INVALID_APP, why),
    };
    let app = match fab::read(&bytes) {
        Ok(app) => app,
        Err(e) => return invalid(reason::INVALID_APP, format!("{source}: {e}")),
    };
    let mut overrides = BTreeMap::new();
    for (key, value) in run_config {
        let value = match value {
            RunConfigValue::Bool(b) => ConfigValue::Bool(*b),
            RunConfigValue::Int(i) => ConfigValue::Int(*i),
            RunConfigValue::Float(x) => ConfigValue::Float(*x),
            RunConfigValue::Str(s) => ConfigValue::Str(s.clone()),
            RunConfigValue::Other(v) => {
                return invalid(
                    reason::INVALID_RUN_CONFIG,
                    format!(
                        "spec.runConfig.{key}: {v} is not a string, integer, float or boolean \
                         (Flower's run-config types)"
                    ),
                );
            }
        };
        overrides.insert(key.clone(), value);
    }
    if let Some(output) = output
        && app.config.contains_key(&output.key)
    {
        if overrides.contains_key(&output.key) {
            return invalid(
                reason::INVALID_RUN_CONFIG,
                format!(
                    "spec.runConfig.{key}: the hub sets {key} to the run's output directory \
                     (the Federation's spec.outputs); remove it from runConfig",
                    key = output.key
                ),
            );
        }
        overrides.insert(output.key.clone(), ConfigValue::Str(output.dir.clone()));
    }
    let config = match fab::check_overrides(&app.config, &overrides) {
        Ok(c) => c,
        Err(e) => {
            return invalid(
                reason::INVALID_RUN_CONFIG,
                format!("spec.runConfig: {e} (app {} {})", app.fab_id, app.version),
            );
        }
    };
    (
        AppState::Ready {
            fab_hash: app.hash.clone(),
        },
        Some(CheckedApp {
            fab: app.bytes,
            hash: app.hash,
            config,
        }),
    )
}

/// The run config of a spec as the SuperLink lists it (to recognise a submitted run); values
/// that are not scalars are left out (such a run is refused before any call).
pub fn config_text(
    run_config: &BTreeMap<String, RunConfigValue>,
    app: Option<&CheckedApp>,
) -> BTreeMap<String, String> {
    if let Some(app) = app {
        return app
            .config
            .iter()
            .map(|(k, v)| (k.clone(), super::control::config_text(v)))
            .collect();
    }
    run_config
        .iter()
        .filter_map(|(k, v)| {
            let v = match v {
                RunConfigValue::Bool(b) => ConfigValue::Bool(*b),
                RunConfigValue::Int(i) => ConfigValue::Int(*i),
                RunConfigValue::Float(x) => ConfigValue::Float(*x),
                RunConfigValue::Str(s) => ConfigValue::Str(s.clone()),
                RunConfigValue::Other(_) => return None,
            };
            Some((k.clone(), super::control::config_text(&v)))
        })
        .collect()
}

/// The SuperLink's runs in the core's terms, or why it did not answer.
pub async fn list(client: &ControlClient) -> SuperLinkState {
    match client.list_runs().await {
        Ok(runs) => SuperLinkState::Runs(
            runs.into_iter()
                .map(|r| ListedRun {
                    run_id: r.run_id,
                    status: r.status,
                    details: r.details,
                    fab_hash: r.fab_hash,
                    config: r.config,
                    finished_at: r.finished_at,
                })
                .collect(),
        ),
        Err(e) => SuperLinkState::Unreachable(e.to_string()),
    }
}

/// The SuperNodes the SuperLink lists `online`, with how long ago each last reached it.
pub async fn supernodes(client: &ControlClient) -> SuperNodesState {
    match client.list_nodes().await {
        Ok(nodes) => SuperNodesState::Online(
            nodes
                .into_iter()
                .filter(|n| n.online())
                .map(|n| (n.node_id, n.last_contact_age))
                .collect(),
        ),
        Err(e) => SuperNodesState::Unreachable(e.to_string()),
    }
}

/// Sends the pending submission of `status` (already stored) and returns the status to store
/// next: with the run id, failed (refused), or still pending (no answer), as of `now` (the
/// caller's clock: the answer's time is when it is recorded).
pub async fn submit(
    client: &ControlClient,
    status: &FlowerRunStatus,
    app: &CheckedApp,
    now: impl Fn() -> Timestamp,
) -> FlowerRunStatus {
    match client.start_run(&app.fab, &app.config).await {
        Ok(run_id) => core_run::submitted(status, run_id, now()),
        Err(e @ (ControlError::Connect { .. } | ControlError::Protocol { .. })) => {
            core_run::submit_unanswered(status, &e.to_string(), now())
        }
        Err(ControlError::Refused { detail, .. }) => {
            core_run::submit_refused(status, &detail, now())
        }
        Err(e) => core_run::submit_refused(status, &e.to_string(), now()),
    }
}

/// Asks the SuperLink to stop `run_id`; an error is returned for the status' details (the next
/// pass asks again).
pub async fn stop(client: &ControlClient, run_id: u64) -> Result<(), String> {
    client
        .stop_run(run_id)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Reads the rest of a finished run's log (the SuperLink sends it and ends the stream), at most
/// `wait` long.
pub async fn final_log(
    client: &ControlClient,
    run_id: u64,
    after: f64,
    wait: Duration,
) -> Vec<LogChunk> {
    let mut chunks = Vec::new();
    let read = async {
        if let Ok(mut stream) = client.stream_logs(run_id, after).await {
            while let Some(Ok(chunk)) = stream.next().await {
                chunks.push(chunk);
            }
        }
    };
    let _ = tokio::time::timeout(wait, read).await;
    chunks
}

/// One log-streaming task per active run: it reads the SuperLink's log stream (reopened after
/// the last timestamp when it ends while the run goes on) into a channel the adapter drains each
/// pass into `status.logTail`.
#[derive(Default)]
pub struct LogFollowers<K: std::hash::Hash + Eq + Clone> {
    tasks: HashMap<K, Follower>,
}

struct Follower {
    run_id: u64,
    task: tokio::task::JoinHandle<()>,
    chunks: mpsc::Receiver<LogChunk>,
}

impl<K: std::hash::Hash + Eq + Clone> LogFollowers<K> {
    /// No followers.
    pub fn new() -> Self {
        Self {
            tasks: HashMap::new(),
        }
    }

    /// Follows `run_id` for `key` from Flower timestamp `after` (a follower of another run of
    /// the same key is replaced), and returns what arrived since the last call.
    pub fn drain(
        &mut self,
        key: &K,
        client: &Arc<ControlClient>,
        run_id: u64,
        after: f64,
    ) -> Vec<LogChunk> {
        if self
            .tasks
            .get(key)
            .is_none_or(|f| f.run_id != run_id || f.task.is_finished())
        {
            self.stop(key);
            let (tx, rx) = mpsc::channel(256);
            let task = tokio::spawn(follow(client.clone(), run_id, after, tx));
            self.tasks.insert(
                key.clone(),
                Follower {
                    run_id,
                    task,
                    chunks: rx,
                },
            );
        }
        let mut out = Vec::new();
        if let Some(f) = self.tasks.get_mut(key) {
            while let Ok(chunk) = f.chunks.try_recv() {
                out.push(chunk);
            }
        }
        out
    }

    /// Stops following `key`.
    pub fn stop(&mut self, key: &K) {
        if let Some(f) = self.tasks.remove(key) {
            f.task.abort();
        }
    }

    /// Stops every follower whose key `keep` refuses.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.tasks.retain(|k, f| {
            let kept = keep(k);
            if !kept {
                f.task.abort();
            }
            kept
        });
    }
}

async fn follow(
    client: Arc<ControlClient>,
    run_id: u64,
    mut after: f64,
    tx: mpsc::Sender<LogChunk>,
) {
    loop {
        if let Ok(mut stream) = client.stream_logs(run_id, after).await {
            while let Some(Ok(chunk)) = stream.next().await {
                after = after.max(chunk.timestamp);
                if tx.send(chunk).await.is_err() {
                    return;
                }
            }
        }
        // Ended: the run finished (the adapter stops this task) or the SuperLink went away.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests;

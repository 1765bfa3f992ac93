//! The Flower side of `FlowerRun`s, shared by both hub modes: the app checked against the run
//! config ([`check_app`]), the SuperLink's run list in the core's terms ([`list`]), the calls an
//! [`Action`] needs ([`submit`], [`stop`]) and the log followers ([`LogFollowers`]). The adapters
//! load the FAB, store the status and call [`crate::core::run::decide`].
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use flower_addon_crds::run::{FlowerRunStatus, RunConfigValue, reason};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;

use super::control::{ControlClient, ControlError, LogChunk};
use super::fab::{self, ConfigValue};
use crate::core::run::{self as core_run, AppState, ListedRun, SuperLinkState};

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

/// Checks a run's FAB (`bytes`, or why it could not be had) and run config: the core's
/// [`AppState`], and the app to submit when it is usable. `source` names where the FAB came
/// from in messages.
pub fn check_app(
    source: &str,
    bytes: Result<Vec<u8>, String>,
    run_config: &BTreeMap<String, RunConfigValue>,
) -> (AppState, Option<CheckedApp>) {
    let invalid =
        |reason: &'static str, message: String| (AppState::Invalid { reason, message }, None);
    let bytes = match bytes {
        Ok(b) => b,
        Err(why) => return invalid(reason::INVALID_APP, why),
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
                })
                .collect(),
        ),
        Err(e) => SuperLinkState::Unreachable(e.to_string()),
    }
}

/// Sends the pending submission of `status` (already stored) and returns the status to store
/// next: with the run id, failed (refused), or still pending (no answer).
pub async fn submit(
    client: &ControlClient,
    status: &FlowerRunStatus,
    app: &CheckedApp,
) -> FlowerRunStatus {
    match client.start_run(&app.fab, &app.config).await {
        Ok(run_id) => core_run::submitted(status, run_id, Timestamp::now()),
        Err(e @ (ControlError::Connect { .. } | ControlError::Protocol { .. })) => {
            core_run::submit_unanswered(status, &e.to_string(), Timestamp::now())
        }
        Err(ControlError::Refused { detail, .. }) => {
            core_run::submit_refused(status, &detail, Timestamp::now())
        }
        Err(e) => core_run::submit_refused(status, &e.to_string(), Timestamp::now()),
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

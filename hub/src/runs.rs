//! The one FlowerRun reconcile of both modes: the facts a run needs → [`core_run::decide`] →
//! the calls it asks for, in the order that keeps `StartRun` from being sent twice (the status
//! holding the pending submission stored first) → the log → the outputs.
//!
//! A mode is a [`RunHost`]: where a run's ConfigMap, outputs and stored status live, how its
//! Federation's run list is shared, and what "now" is. The Kubernetes FlowerRun controller
//! (`kube::controller::runs`) and the standalone hub (`standalone::runs`) load the run and
//! its Federation, call [`reconcile`], and store or release what it returns; neither decides.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use flower_addon_crds::run::{
    FlowerRunSpec, FlowerRunStatus, RUN_FAILED, RUN_SUBMITTED, RunOutput, reason,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;

use crate::core::run::{
    self as core_run, ACTIVE_POLL, Action, AppState, FederationState, OutputDir, OutputsFailure,
    Restart, RunEvent, SuperLinkState, SuperNodesState, UNREACHABLE_RETRY,
};
use crate::flower::control::ControlClient;
use crate::flower::fab_url::FabUrlCache;
use crate::flower::runs::{self as flower_runs, CheckedApp, ConfigMapSource, LogFollowers};

/// `(namespace, name)` of a FlowerRun.
pub type RunKey = (String, String);

/// How soon a run whose FAB is being downloaded from its URL is looked at again.
pub const DOWNLOAD_RETRY: Duration = Duration::from_secs(3);
/// How long the rest of a finished run's log is read.
pub const FINAL_LOG_WAIT: Duration = Duration::from_secs(5);
/// A pause (milliseconds) after each step of a submission that a crash can interrupt: after the
/// pending submission is stored and after Flower answered. For the crash-window tests, which
/// kill the hub inside those windows; unset (the default) there is none.
pub const SUBMISSION_PAUSE_ENV: &str = "FLOWER_HUB_TEST_SUBMISSION_PAUSE_MS";

/// What a mode provides to [`reconcile`] for one run.
#[allow(async_fn_in_trait)]
pub trait RunHost {
    /// A read or write of the mode's store that failed (the pass is retried; never a verdict on
    /// the run).
    type Error;

    /// The ConfigMap `name` of the run's namespace (`Ok(None)`: there is none).
    async fn config_map(&mut self, name: &str) -> Result<Option<ConfigMap>, Self::Error>;
    /// Where ConfigMaps come from in this mode (for the messages that name them).
    fn config_map_source(&self) -> ConfigMapSource;
    /// FABs downloaded from URLs (once per URL and hash).
    fn fab_urls(&self) -> &FabUrlCache;
    /// The run's outputs directory as its ServerApp sees it (`None`: the Federation keeps no
    /// outputs).
    fn output_dir(&mut self) -> Option<OutputDir>;
    /// The Federation's SuperLink's runs (one list shared by the runs reconciled together).
    async fn list_runs(&mut self, client: &ControlClient) -> SuperLinkState;
    /// A run was submitted or stopped: the next list is asked anew.
    fn forget_list(&mut self);
    /// Stores `status` (holding the pending submission) before `StartRun` is sent, so that a
    /// hub restarted after the call adopts the run instead of sending it again; then records
    /// `events`. [`Stored::Stale`]: the run changed meanwhile, nothing is sent.
    async fn store_pending(
        &mut self,
        status: &FlowerRunStatus,
        events: Vec<RunEvent>,
    ) -> Result<Stored, Self::Error>;
    /// The log followers of every run.
    fn with_followers<T>(&mut self, f: impl FnOnce(&mut LogFollowers<RunKey>) -> T) -> T;
    /// The files the finished run left in its outputs directory, bounded by the Federation's
    /// size limit (the caller bounds the time: [`core_run::OUTPUTS_LIST_TIMEOUT`]).
    async fn list_outputs(&mut self) -> Result<Vec<RunOutput>, OutputsFailure>;
    /// Now, to the second (what a Kubernetes status keeps of a time, so an unchanged run
    /// computes the status it read).
    fn now(&self) -> Timestamp;
    /// Restarts the Federation's SuperNodes after Flower run `after_run` ended without
    /// completing ([`core_run::restart_after`]): records it as the Federation's
    /// `supernodeRestartAfterRun`, which changes the restart mark of its work. `Ok(false)`: this
    /// hub already asked for that restart (nothing written, nothing to say again).
    async fn restart_supernodes(&mut self, after_run: u64) -> Result<bool, Self::Error>;
}

/// Whether [`RunHost::store_pending`] stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// Stored: `StartRun` may be sent.
    Yes,
    /// The run changed since it was read: look again.
    Stale,
}

/// One run as its mode read it.
pub struct Run<'a> {
    /// Its namespace and name.
    pub key: &'a RunKey,
    /// Its spec.
    pub spec: &'a FlowerRunSpec,
    /// `metadata.generation` (Kubernetes; `None` in standalone mode).
    pub generation: Option<i64>,
    /// Its status as stored.
    pub current: &'a FlowerRunStatus,
    /// Being deleted (Kubernetes: the finalizer still on; standalone: its manifest removed).
    pub deleting: bool,
    /// Its Federation, as [`federation_state`] says.
    pub federation: FederationState,
    /// The Federation keeps its runs' outputs (`spec.outputs`).
    pub keeps_outputs: bool,
    /// The Control client of the Federation's SuperLink (`None`: no SuperLink to reach).
    pub client: Option<Arc<ControlClient>>,
    /// Flower run ids other FlowerRuns of the same Federation hold.
    pub claimed: BTreeSet<u64>,
    /// The Flower run after which the hub last restarted the Federation's SuperNodes
    /// (`status.supernodeRestartAfterRun`).
    pub restarted_after: Option<u64>,
    /// Why the Federation's SuperNodes are not all back from a restart yet
    /// ([`crate::core::status::restart_pending`]); `None` when they are.
    pub restarting: Option<String>,
    /// When the Federation's SuperLink last started, when the mode knows
    /// ([`core_run::Facts::superlink_started_at`]).
    pub superlink_started_at: Option<Timestamp>,
}

/// What the mode does after [`reconcile`].
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Store `status` (when it differs from what is stored), record `events`, look again after
    /// `requeue` (`None`: on the next change).
    Store {
        /// The status.
        status: FlowerRunStatus,
        /// The events.
        events: Vec<RunEvent>,
        /// When to look again.
        requeue: Option<Duration>,
    },
    /// The Flower run is stopped or there is none: remove the finalizer / forget the run.
    Release {
        /// The events.
        events: Vec<RunEvent>,
    },
    /// `ttlSecondsAfterFinished` passed: delete the run (standalone: hide it), with `status`.
    Delete {
        /// The status.
        status: FlowerRunStatus,
        /// The events.
        events: Vec<RunEvent>,
    },
    /// A write met a newer run: nothing was sent; look again soon.
    Stale,
}

/// The Federation as a run sees it, from its `Ready` condition as both modes write it: missing,
/// Ready, or not Ready with its message (its reason when the message is empty).
pub fn federation_state(ready: Option<(bool, &str, &str)>) -> FederationState {
    match ready {
        None => FederationState::Missing,
        Some((true, _, _)) => FederationState::Ready,
        Some((false, message, _)) if !message.is_empty() => {
            FederationState::NotReady(message.to_owned())
        }
        Some((false, _, reason)) if !reason.is_empty() => {
            FederationState::NotReady(reason.to_owned())
        }
        Some((false, _, _)) => FederationState::NotReady("it is not Ready yet".into()),
    }
}

/// Reconciles one run: facts → [`core_run::decide`] → act → log → outputs.
pub async fn reconcile<H: RunHost>(host: &mut H, run: Run<'_>) -> Result<Outcome, H::Error> {
    let Run {
        key,
        spec,
        generation,
        current,
        deleting,
        federation,
        keeps_outputs,
        claimed,
        restarted_after,
        restarting,
        superlink_started_at,
        ..
    } = run;
    let run_name = format!("FlowerRun {}/{}", key.0, key.1);
    // A finished run is not followed any more: it gets no client, so it makes no call.
    let client = run
        .client
        .filter(|_| deleting || !core_run::is_finished(current));
    let mut checked: Option<CheckedApp> = None;
    let app = if core_run::needs_app(current, deleting)
        && (federation == FederationState::Ready || current.pending_submission.is_some())
    {
        let (state, app) = load_app(host, &key.0, spec).await?;
        checked = app;
        Some(state)
    } else {
        None
    };
    let superlink = if asks_superlink(current, spec, deleting, &federation, app.as_ref()) {
        match &client {
            Some(client) => host.list_runs(client).await,
            None => SuperLinkState::Unreachable(format!(
                "Federation {} has no SuperLink to reach",
                spec.federation_ref.name
            )),
        }
    } else {
        SuperLinkState::NotAsked
    };
    let (mut restart, mut restart_events) =
        restart_if_due(host, &superlink, restarted_after, &spec.federation_ref.name).await?;
    if let (Restart::None, Some(why)) = (&restart, restarting) {
        restart = Restart::Rolling(why);
    }
    let supernodes = match &client {
        Some(client)
            if federation == FederationState::Ready
                && core_run::needs_supernodes(
                    current,
                    deleting,
                    superlink_started_at.is_some(),
                ) =>
        {
            flower_runs::supernodes(client).await
        }
        _ => SuperNodesState::NotAsked,
    };
    let facts = core_run::Facts {
        run_name: &run_name,
        spec,
        generation,
        deleting,
        federation,
        app,
        superlink,
        supernodes,
        superlink_started_at,
        config_text: flower_runs::config_text(&spec.run_config, checked.as_ref()),
        run_config_hash: core_run::run_config_hash(spec),
        claimed,
        restart,
        now: host.now(),
    };
    let decision = core_run::decide(current, &facts);
    let mut events = decision.events;
    events.append(&mut restart_events);
    let status = decision.status;
    let mut requeue = decision.requeue;
    // A FAB still downloading (or whose URL failed for now) wakes no watch: look again.
    if spec.app.fab.url.is_some() && matches!(facts.app, Some(AppState::Missing { .. })) {
        requeue = Some(requeue.map_or(DOWNLOAD_RETRY, |r| r.min(DOWNLOAD_RETRY)));
    }
    let acted = act(
        host,
        key,
        &run_name,
        &decision.action,
        client.as_ref(),
        checked.as_ref(),
        Acted {
            status,
            events,
            requeue,
        },
    )
    .await?;
    let Acted {
        mut status,
        events,
        mut requeue,
    } = match acted {
        Ok(acted) => acted,
        Err(outcome) => return Ok(outcome),
    };
    if let Some(client) = &client {
        read_log(host, client, key, current, &mut status, deleting).await;
    }
    if !deleting
        && core_run::outputs_to_list(&status, keeps_outputs)
        && let Some(retry) = record_outputs(host, &mut status).await
    {
        requeue = Some(requeue.map_or(retry, |r| r.min(retry)));
    }
    Ok(Outcome::Store {
        status,
        events,
        requeue,
    })
}

/// Lists the run's outputs (within [`core_run::OUTPUTS_LIST_TIMEOUT`]) into `status`; when to
/// look again if the listing failed for now.
async fn record_outputs<H: RunHost>(
    host: &mut H,
    status: &mut FlowerRunStatus,
) -> Option<Duration> {
    let listed =
        match tokio::time::timeout(core_run::OUTPUTS_LIST_TIMEOUT, host.list_outputs()).await {
            Ok(listed) => listed,
            Err(_) => Err(OutputsFailure::Retry(format!(
                "the outputs were not listed within {} s",
                core_run::OUTPUTS_LIST_TIMEOUT.as_secs()
            ))),
        };
    core_run::record_outputs(status, listed, host.now())
}

/// The restart the SuperLink's run list asks for ([`core_run::restart_after`]), asked of the
/// host when it is due, with the event that says so.
async fn restart_if_due<H: RunHost>(
    host: &mut H,
    superlink: &SuperLinkState,
    restarted_after: Option<u64>,
    federation: &str,
) -> Result<(Restart, Vec<RunEvent>), H::Error> {
    let SuperLinkState::Runs(runs) = superlink else {
        return Ok((Restart::None, Vec::new()));
    };
    let restart = core_run::restart_after(runs, restarted_after);
    let mut events = Vec::new();
    if let Restart::Due { after, status } = &restart
        && host.restart_supernodes(*after).await?
    {
        tracing::info!(
            federation,
            after_run = after,
            reason = reason::SUPERNODES_RESTARTING,
            "restarting the Federation's SuperNodes after a Flower run that ended {status}"
        );
        events.push(RunEvent {
            warning: false,
            reason: reason::SUPERNODES_RESTARTING,
            message: format!(
                "Flower run {after} ended {status}: restarting Federation {federation}'s \
                 SuperNodes, keys kept (a SuperNode working on its messages takes no other)"
            ),
        });
    }
    Ok((restart, events))
}

/// What a pass carries from the decision to the log and outputs.
struct Acted {
    status: FlowerRunStatus,
    events: Vec<RunEvent>,
    requeue: Option<Duration>,
}

/// The call the decision asks for, in the order that keeps `StartRun` from being sent twice (the
/// status holding the pending submission stored first); `Err` with the outcome when the pass ends
/// here (released, deleted, stale, or an app gone missing before its submission).
async fn act<H: RunHost>(
    host: &mut H,
    key: &RunKey,
    run_name: &str,
    action: &Action,
    client: Option<&Arc<ControlClient>>,
    checked: Option<&CheckedApp>,
    acted: Acted,
) -> Result<Result<Acted, Outcome>, H::Error> {
    let Acted {
        mut status,
        mut events,
        mut requeue,
    } = acted;
    match (action, client) {
        (Action::Submit, Some(client)) => {
            let Some(app) = checked else {
                // The app went missing between the submission and its retry: stored, not sent.
                return Ok(Err(Outcome::Store {
                    status,
                    events,
                    requeue,
                }));
            };
            // Stored before it is sent: a crash from here on is adopted, not sent again.
            if host
                .store_pending(&status, std::mem::take(&mut events))
                .await?
                == Stored::Stale
            {
                return Ok(Err(Outcome::Stale));
            }
            submission_step(run_name, "submission: pending stored", true).await;
            submission_step(run_name, "submission: sending", false).await;
            status = flower_runs::submit(client, &status, app, || host.now()).await;
            host.forget_list();
            submission_step(run_name, "submission: answered", true).await;
            events.push(submission_event(&status));
            requeue = Some(if status.run_id.is_some() {
                ACTIVE_POLL
            } else {
                UNREACHABLE_RETRY
            });
        }
        (Action::Stop(run_id) | Action::StopAndRelease(run_id), Some(client)) => {
            let stopped = flower_runs::stop(client, *run_id).await;
            host.forget_list();
            if let Err(why) = stopped {
                status.details = Some(format!("stopping Flower run {run_id}: {why}"));
                requeue = Some(UNREACHABLE_RETRY);
            } else if matches!(action, Action::StopAndRelease(_)) {
                tracing::info!(run = %run_name, run_id, "stopped; releasing");
                host.with_followers(|f| f.stop(key));
                return Ok(Err(Outcome::Release { events }));
            }
        }
        (Action::Release, _) => {
            host.with_followers(|f| f.stop(key));
            return Ok(Err(Outcome::Release { events }));
        }
        (Action::Delete, _) => {
            host.with_followers(|f| f.stop(key));
            tracing::info!(run = %run_name, "deleted: ttlSecondsAfterFinished passed");
            return Ok(Err(Outcome::Delete { status, events }));
        }
        _ => {}
    }
    Ok(Ok(Acted {
        status,
        events,
        requeue,
    }))
}

/// Logs a step of a submission (the windows a crash can fall into: after the pending submission
/// was stored, while `StartRun` is in flight, after Flower answered and before the status is
/// written), then, with `pause` and [`SUBMISSION_PAUSE_ENV`] set, waits that long.
async fn submission_step(run_name: &str, step: &'static str, pause: bool) {
    static PAUSE: std::sync::LazyLock<Option<Duration>> = std::sync::LazyLock::new(|| {
        std::env::var(SUBMISSION_PAUSE_ENV)
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map(Duration::from_millis)
    });
    tracing::info!(run = %run_name, "{step}");
    if pause && let Some(pause) = *PAUSE {
        tokio::time::sleep(pause).await;
    }
}

/// Whether the SuperLink's run list is asked for: when [`core_run::needs_superlink`] says so,
/// except for a run not submitted yet that the core decides on without it (held by `suspend`,
/// its Federation not Ready, its app missing or invalid) — the same decision, without a call.
fn asks_superlink(
    current: &FlowerRunStatus,
    spec: &FlowerRunSpec,
    deleting: bool,
    federation: &FederationState,
    app: Option<&AppState>,
) -> bool {
    if !core_run::needs_superlink(current, deleting) {
        return false;
    }
    deleting
        || current.run_id.is_some()
        || current.pending_submission.is_some()
        || (*federation == FederationState::Ready
            && !spec.suspended()
            && matches!(app, Some(AppState::Ready { .. })))
}

/// The run's app from the ConfigMap or URL its spec names (absent: the run waits for it),
/// checked against its run config. A store error is an error (retried), never a verdict on the
/// app.
async fn load_app<H: RunHost>(
    host: &mut H,
    namespace: &str,
    spec: &FlowerRunSpec,
) -> Result<(AppState, Option<CheckedApp>), H::Error> {
    let config_map = match &spec.app.fab.config_map_ref {
        Some(reference) => host.config_map(&reference.name).await?,
        None => None,
    };
    let output = host.output_dir();
    let (source, bytes) = flower_runs::fab_bytes_from(
        namespace,
        &spec.app.fab,
        config_map.as_ref(),
        host.config_map_source(),
        host.fab_urls(),
    )
    .await;
    Ok(flower_runs::check_app(
        &source,
        bytes,
        &spec.run_config,
        output.as_ref(),
    ))
}

/// The event of a submission's answer (the core's `submitted`, `submit_refused` or
/// `submit_unanswered` wrote it into the conditions).
fn submission_event(status: &FlowerRunStatus) -> RunEvent {
    let condition = |type_: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    if status.run_id.is_some() {
        let message = condition(RUN_SUBMITTED).map_or_else(String::new, |c| c.message.clone());
        return RunEvent {
            warning: false,
            reason: "Submitted",
            message: format!("submitted: {message}"),
        };
    }
    let (reason, message) = match condition(RUN_FAILED) {
        Some(c) if c.reason == reason::INVALID_APP => (reason::INVALID_APP, c.message.clone()),
        Some(c) => (reason::FLOWER_FAILED, c.message.clone()),
        None => (
            reason::SUPERLINK_UNAVAILABLE,
            status.details.clone().unwrap_or_default(),
        ),
    };
    RunEvent {
        warning: true,
        reason,
        message,
    }
}

/// The log: followed while the run goes on; the rest read once when it finished.
async fn read_log<H: RunHost>(
    host: &mut H,
    client: &Arc<ControlClient>,
    key: &RunKey,
    current: &FlowerRunStatus,
    status: &mut FlowerRunStatus,
    deleting: bool,
) {
    let Some(run_id) = status
        .run_id
        .as_deref()
        .and_then(|id| id.parse::<u64>().ok())
    else {
        return;
    };
    let after = status.log_timestamp.unwrap_or(0.0);
    let chunks = if core_run::active_run(status).is_some() && !deleting {
        host.with_followers(|f| f.drain(key, client, run_id, after))
    } else if core_run::active_run(current).is_some() || current.run_id != status.run_id {
        host.with_followers(|f| f.stop(key));
        flower_runs::final_log(client, run_id, after, FINAL_LOG_WAIT).await
    } else {
        Vec::new()
    };
    for chunk in chunks {
        core_run::add_log(status, &chunk.text, chunk.timestamp);
    }
}

/// Logs `events` on the hub's log (the Kubernetes mode records them as events too).
pub fn log_events(run: &RunKey, events: &[RunEvent]) {
    let name = format!("{}/{}", run.0, run.1);
    for event in events {
        if event.warning {
            tracing::warn!(run = %name, reason = event.reason, "{}", event.message);
        } else {
            tracing::info!(run = %name, reason = event.reason, "{}", event.message);
        }
    }
}

/// What "now" is to a run's reconcile: [`wall_clock`] in the hub; a test sets a fixed one to
/// compare the two modes' statuses byte for byte.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// The wall clock, to the second.
pub fn wall_clock() -> Clock {
    Arc::new(now_to_the_second)
}

/// Now, to the second.
pub fn now_to_the_second() -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH)
}

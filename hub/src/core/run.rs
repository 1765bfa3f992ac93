//! What to do next for a `FlowerRun`: submit, adopt, wait, stop, retry, finish or delete — one
//! pure function of the run's spec and status and of what the hub knows about its Federation, its
//! app and its SuperLink. Both hub modes call it; they only load, store and watch.
//!
//! Flower's `StartRun` is not idempotent, so a submission is recorded in the status
//! (`pendingSubmission`, with the runs of the same app and config that existed before it) before
//! it is sent. When the answer is lost (a hub crash, a leader change, a timeout), the next pass
//! finds the run in the SuperLink's run list and adopts it instead of starting a second one.
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use flower_addon_crds::run::{
    FlowerRunSpec, FlowerRunStatus, LOG_TAIL_LINES, PendingSubmission, RUN_COMPLETE, RUN_FAILED,
    RUN_RUNNING, RUN_SUBMITTED, RUN_SUSPENDED, RunProgress, reason,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

mod conditions;
mod follow;
mod log;
mod outputs;
mod restart;
mod submission;

use conditions::*;
use follow::*;
pub use follow::{RETRY_BACKOFF, RETRY_BACKOFF_MAX};
pub use log::{add_log, round_of};
pub use outputs::{
    OUTPUTS_LIST_TIMEOUT, OUTPUTS_LIST_WINDOW, OUTPUTS_LISTED, OUTPUTS_RETRY, OutputDir,
    OutputsFailure, outputs_to_list, record_outputs,
};
pub use restart::{Restart, restart_after};
use submission::*;

/// How soon to look again while the SuperLink does not answer.
pub const UNREACHABLE_RETRY: Duration = Duration::from_secs(5);
/// How often a run in progress is polled (its log stream wakes the hub sooner).
pub const ACTIVE_POLL: Duration = Duration::from_secs(2);
/// Most run ids remembered in a pending submission.
const MAX_KNOWN_RUNS: usize = 100;

/// What the hub knows about the run's Federation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FederationState {
    /// No Federation of that name in the run's namespace.
    Missing,
    /// It exists but is not Ready (why).
    NotReady(String),
    /// Ready: its SuperLink takes runs.
    Ready,
}

/// The run's app, checked against its run config (needed only before a submission).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppState {
    /// Usable: the FAB's SHA-256.
    Ready {
        /// Hex SHA-256 of the FAB.
        fab_hash: String,
    },
    /// Not there yet (its ConfigMap or key does not exist): the run waits for it, as a Pod
    /// waits for a ConfigMap volume, with `Submitted=False` reason [`reason::INVALID_APP`].
    Missing {
        /// What is missing and how to add it.
        message: String,
    },
    /// Unusable for good: `reason` is [`reason::INVALID_APP`] or
    /// [`reason::INVALID_RUN_CONFIG`].
    Invalid {
        /// The Failed reason.
        reason: &'static str,
        /// What is wrong and how to fix it.
        message: String,
    },
}

/// One run the SuperLink lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedRun {
    /// Flower's run id.
    pub run_id: u64,
    /// `pending`, `starting`, `running`, `finished:<sub-status>`.
    pub status: String,
    /// Flower's details (the error of a failed run).
    pub details: String,
    /// SHA-256 of its FAB.
    pub fab_hash: String,
    /// Its run config, each value as text (see `flower::control::scalar_text`).
    pub config: BTreeMap<String, String>,
    /// When it finished, as Flower writes it (ISO 8601 in UTC, so text order is time order;
    /// empty before).
    pub finished_at: String,
}

/// What the SuperLink said, when asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SuperLinkState {
    /// Not asked ([`needs_superlink`] was false).
    NotAsked,
    /// Its Control API did not answer (why).
    Unreachable(String),
    /// Its run list.
    Runs(Vec<ListedRun>),
}

/// The SuperNodes the SuperLink lists `online`, when asked ([`needs_supernodes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SuperNodesState {
    /// Not asked.
    NotAsked,
    /// Its Control API did not answer (why).
    Unreachable(String),
    /// Each SuperNode the SuperLink lists `online`: its node id and how long before the listing
    /// it last reached the SuperLink (`None`: the SuperLink does not say).
    Online(Vec<(u64, Option<Duration>)>),
}

/// Everything [`decide`] looks at besides the run's status.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    /// `namespace/name` of the run, for messages.
    pub run_name: &'a str,
    /// The run's spec.
    pub spec: &'a FlowerRunSpec,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The run is being deleted (its finalizer is still on).
    pub deleting: bool,
    /// The Federation.
    pub federation: FederationState,
    /// The app; `None` when not loaded (not needed: see [`needs_app`]).
    pub app: Option<AppState>,
    /// The SuperLink.
    pub superlink: SuperLinkState,
    /// Its SuperNodes; asked only while a submission waits for them ([`needs_supernodes`]).
    pub supernodes: SuperNodesState,
    /// When the Federation's SuperLink last started, when the hub knows (standalone: it runs
    /// it); `None` otherwise. A submission waits until every SuperNode the SuperLink lists online
    /// reached it since then: a SuperLink started again (crashed, or with a hub that crashed)
    /// still lists the sessions it had before, for up to two heartbeat intervals, and
    /// SuperNodes that died with it (the hub's own) connect again only once those end.
    pub superlink_started_at: Option<Timestamp>,
    /// The spec's run config as Flower lists it (`flower::control::config_text`).
    pub config_text: BTreeMap<String, String>,
    /// [`run_config_hash`] of the spec.
    pub run_config_hash: String,
    /// Flower run ids other FlowerRuns of the same Federation hold (never adopted here).
    pub claimed: BTreeSet<u64>,
    /// Whether the Federation's SuperNodes are to be restarted first ([`restart_after`] of the
    /// SuperLink's run list; [`Restart::None`] when it was not asked).
    pub restart: Restart,
    /// Now.
    pub now: Timestamp,
}

/// What the adapter does after storing [`Decision::status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing to call.
    Nothing,
    /// `StartRun`; then [`submitted`], [`submit_refused`] or [`submit_unanswered`]. The status
    /// holding the pending submission must be stored first.
    Submit,
    /// `StopRun` of this Flower run (a run already finished is success).
    Stop(u64),
    /// `StopRun` of this Flower run, then remove the finalizer.
    StopAndRelease(u64),
    /// Remove the finalizer (nothing to stop).
    Release,
    /// Delete the FlowerRun (`ttlSecondsAfterFinished` passed).
    Delete,
}

/// One event to record (Kubernetes events; the standalone hub logs them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunEvent {
    /// A warning (`Warning`) or not (`Normal`).
    pub warning: bool,
    /// CamelCase reason.
    pub reason: &'static str,
    /// What happened.
    pub message: String,
}

/// The outcome of [`decide`].
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The status to store (unchanged when nothing changed).
    pub status: FlowerRunStatus,
    /// What to call.
    pub action: Action,
    /// Events for the transitions made.
    pub events: Vec<RunEvent>,
    /// When to look again without a change (a watch, a log line or the SuperLink's answer
    /// may come sooner).
    pub requeue: Option<Duration>,
}

/// Whether the run ended for good (`Complete` or `Failed`).
pub fn is_finished(status: &FlowerRunStatus) -> bool {
    has_true(status, RUN_COMPLETE) || has_true(status, RUN_FAILED)
}

/// The Flower run of the current attempt while Flower may still be running it.
pub fn active_run(status: &FlowerRunStatus) -> Option<u64> {
    if is_finished(status) {
        return None;
    }
    let finished = status
        .flower_status
        .as_deref()
        .is_some_and(|s| s.starts_with("finished"));
    status
        .run_id
        .as_deref()
        .and_then(|id| id.parse().ok())
        .filter(|_| !finished)
}

/// Whether [`decide`] needs the SuperLink's run list: a run that is not finished (or is being
/// deleted while its Flower run may be going). A finished run costs no Control call.
pub fn needs_superlink(status: &FlowerRunStatus, deleting: bool) -> bool {
    if deleting {
        return active_run(status).is_some();
    }
    !is_finished(status)
}

/// Whether [`decide`] needs the SuperLink's SuperNodes ([`SuperNodesState`]): a run waits to
/// be submitted after a failed attempt, a restart of its SuperNodes, or when the hub knows when
/// its SuperLink started (`superlink_started`: [`Facts::superlink_started_at`] is set). It goes
/// only to SuperNodes that reached the SuperLink since the last of those ([`retry_failed_at`]).
pub fn needs_supernodes(status: &FlowerRunStatus, deleting: bool, superlink_started: bool) -> bool {
    // A pending submission is asked too: one that never reached the SuperLink is sent again.
    !deleting
        && !is_finished(status)
        && status.run_id.is_none()
        && (retry_failed_at(status).is_some()
            || status.supernodes_restarted_at.is_some()
            || superlink_started)
}

/// When the attempt that a pending retry follows failed: the `Running=False` condition with
/// reason `Retrying`.
pub fn retry_failed_at(status: &FlowerRunStatus) -> Option<Timestamp> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == RUN_RUNNING && c.status == "False" && c.reason == "Retrying")
        .map(|c| c.last_transition_time.0)
}

/// How often a retry waiting for SuperNodes looks again (a live SuperNode sends a heartbeat
/// every 24 s).
pub const SUPERNODES_POLL: Duration = Duration::from_secs(3);

/// Whether [`decide`] needs the app checked: no Flower run yet for the current attempt.
pub fn needs_app(status: &FlowerRunStatus, deleting: bool) -> bool {
    !deleting && !is_finished(status) && status.run_id.is_none()
}

/// What to do next for a run whose stored status is `current`.
pub fn decide(current: &FlowerRunStatus, facts: &Facts<'_>) -> Decision {
    let mut d = Decision {
        status: current.clone(),
        action: Action::Nothing,
        events: Vec::new(),
        requeue: None,
    };
    d.status.observed_generation = facts.generation;
    if facts.deleting {
        deleting(&mut d, facts);
        return d;
    }
    if is_finished(&d.status) {
        expire(&mut d, facts);
        return d;
    }
    // runConfig is free-form, which CEL cannot hold immutable: the first value seen holds.
    match &d.status.run_config_hash {
        None => d.status.run_config_hash = Some(facts.run_config_hash.clone()),
        Some(first) if *first != facts.run_config_hash => {
            let message = flower_addon_crds::rules::MSG_RUN_CONFIG_CHANGED;
            if let Some(run_id) = active_run(&d.status) {
                d.action = Action::Stop(run_id);
            }
            fail(
                &mut d.status,
                reason::INVALID_RUN_CONFIG,
                message,
                facts.now,
            );
            d.events.push(warning(reason::INVALID_RUN_CONFIG, message));
            return d;
        }
        Some(_) => {}
    }
    if d.status.run_id.is_none() {
        if let Some(pending) = d.status.pending_submission.clone() {
            adopt_or_resubmit(&mut d, facts, &pending);
        } else {
            before_submission(&mut d, facts);
        }
        if d.status.run_id.is_none() {
            return d;
        }
    }
    follow(&mut d, facts);
    d
}

/// After `StartRun` answered with a run id.
pub fn submitted(status: &FlowerRunStatus, run_id: u64, now: Timestamp) -> FlowerRunStatus {
    let mut s = status.clone();
    let pending = s.pending_submission.take();
    s.supernodes_restarted_at = None;
    s.attempts = pending.as_ref().map_or(s.attempts + 1, |p| p.attempt);
    s.fab_hash = pending.map(|p| p.fab_hash).or(s.fab_hash);
    record_run(&mut s, run_id, now);
    s
}

/// After `StartRun` was refused: nothing was started; the run fails with Flower's words.
pub fn submit_refused(status: &FlowerRunStatus, why: &str, now: Timestamp) -> FlowerRunStatus {
    let mut s = status.clone();
    s.pending_submission = None;
    let reason = if why.contains("FAB") || why.contains("fab") {
        reason::INVALID_APP
    } else {
        reason::FLOWER_FAILED
    };
    fail(
        &mut s,
        reason,
        &format!("the SuperLink refused the run: {why}"),
        now,
    );
    s
}

/// After `StartRun` got no answer (a timeout, a dropped connection): the run may exist. The
/// pending submission stays; the next pass adopts it or submits again.
pub fn submit_unanswered(status: &FlowerRunStatus, why: &str, now: Timestamp) -> FlowerRunStatus {
    let mut s = status.clone();
    s.details = Some(format!(
        "no answer to the submission ({why}); the next pass adopts the run if the SuperLink started it"
    ));
    set(
        &mut s,
        RUN_SUBMITTED,
        false,
        reason::SUPERLINK_UNAVAILABLE,
        &format!("no answer from the SuperLink: {why}"),
        now,
    );
    s
}

fn deleting(d: &mut Decision, facts: &Facts<'_>) {
    let Some(run_id) = active_run(&d.status) else {
        d.action = Action::Release;
        return;
    };
    match (&facts.federation, &facts.superlink) {
        // No Federation, no SuperLink: nothing is left to stop.
        (FederationState::Missing, _) => d.action = Action::Release,
        (_, SuperLinkState::Unreachable(why)) => {
            d.status.details = Some(format!(
                "deleting: waiting to stop Flower run {run_id}, the SuperLink does not answer \
                 ({why}); remove the finalizer {} to delete without stopping",
                flower_addon_crds::RUN_FINALIZER
            ));
            d.requeue = Some(UNREACHABLE_RETRY);
        }
        _ => d.action = Action::StopAndRelease(run_id),
    }
}

fn expire(d: &mut Decision, facts: &Facts<'_>) {
    let (Some(ttl), Some(finished)) = (
        facts.spec.ttl_seconds_after_finished,
        d.status.finished_at.as_ref(),
    ) else {
        return;
    };
    let due = finished.0 + SignedDuration::from_secs(i64::from(ttl));
    if facts.now >= due {
        d.action = Action::Delete;
    } else {
        d.requeue = Some(until(facts.now, due));
    }
}

/// SHA-256 (hex) of a spec's `runConfig`, keys sorted (`BTreeMap`), values as JSON.
pub fn run_config_hash(spec: &FlowerRunSpec) -> String {
    use sha2::Digest;
    let json = serde_json::to_vec(&spec.run_config).unwrap_or_default();
    hex::encode(sha2::Sha256::digest(json))
}

#[cfg(test)]
mod tests;

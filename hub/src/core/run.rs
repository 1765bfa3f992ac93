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
    /// Its SuperNodes; asked only while a retry waits for them ([`needs_supernodes`]).
    pub supernodes: SuperNodesState,
    /// The spec's run config as Flower lists it (`flower::control::config_text`).
    pub config_text: BTreeMap<String, String>,
    /// [`run_config_hash`] of the spec.
    pub run_config_hash: String,
    /// Flower run ids other FlowerRuns of the same Federation hold (never adopted here).
    pub claimed: BTreeSet<u64>,
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

/// Whether [`decide`] needs the SuperLink's SuperNodes ([`SuperNodesState`]): a failed attempt
/// waits to be submitted again. A retry goes only to SuperNodes that reached the SuperLink after
/// the failure ([`retry_failed_at`]).
pub fn needs_supernodes(status: &FlowerRunStatus, deleting: bool) -> bool {
    !deleting
        && !is_finished(status)
        && status.run_id.is_none()
        && status.pending_submission.is_none()
        && retry_failed_at(status).is_some()
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

fn before_submission(d: &mut Decision, facts: &Facts<'_>) {
    let now = facts.now;
    let s = &mut d.status;
    if facts.spec.suspended() {
        if !has_true(s, RUN_SUSPENDED) {
            d.events
                .push(normal("Suspended", "held by spec.suspend: not submitted"));
        }
        set(
            s,
            RUN_SUSPENDED,
            true,
            "Suspended",
            "spec.suspend holds the run",
            now,
        );
        s.details = Some("held by spec.suspend; set it to false to start the run".into());
        return;
    }
    if has_true(s, RUN_SUSPENDED) {
        set(
            s,
            RUN_SUSPENDED,
            false,
            "Resumed",
            "spec.suspend is false",
            now,
        );
        d.events
            .push(normal("Resumed", "spec.suspend is false: submitting"));
    }
    if deadline_passed(s, facts) {
        fail(s, reason::DEADLINE_EXCEEDED, &deadline_message(facts), now);
        d.events
            .push(warning(reason::DEADLINE_EXCEEDED, deadline_message(facts)));
        return;
    }
    let waiting = match &facts.federation {
        FederationState::Missing => Some(format!(
            "Federation {} does not exist in this namespace; the run starts when it exists and is Ready",
            facts.spec.federation_ref.name
        )),
        FederationState::NotReady(why) => Some(format!(
            "Federation {} is not Ready ({why}); the run starts when it is",
            facts.spec.federation_ref.name
        )),
        FederationState::Ready => None,
    };
    if let Some(message) = waiting {
        wait(d, reason::FEDERATION_NOT_READY, message, None, facts.now);
        return;
    }
    let fab_hash = match &facts.app {
        Some(AppState::Ready { fab_hash }) => fab_hash.clone(),
        Some(AppState::Missing { message }) => {
            wait(d, reason::INVALID_APP, message.clone(), None, now);
            return;
        }
        Some(AppState::Invalid { reason, message }) => {
            fail(&mut d.status, reason, message, now);
            d.events.push(warning(reason, message.clone()));
            return;
        }
        None => return,
    };
    let runs = match &facts.superlink {
        SuperLinkState::Runs(runs) => runs,
        SuperLinkState::Unreachable(why) => {
            let message = format!("the SuperLink's Control API does not answer: {why}");
            wait(
                d,
                reason::SUPERLINK_UNAVAILABLE,
                message,
                Some(UNREACHABLE_RETRY),
                now,
            );
            return;
        }
        SuperLinkState::NotAsked => return,
    };
    // A retry waits as a Job's pod does: 10 s after the first failure, doubling up to 6 min
    // (a SuperLink that just came back still lists SuperNodes that have not reconnected).
    if let Some(due) = retry_due(&d.status)
        && now < due
    {
        d.requeue = Some(until(now, due));
        return;
    }
    if let Some(failed_at) = retry_failed_at(&d.status)
        && !supernodes_serving_since(d, facts, failed_at)
    {
        return;
    }
    let attempt = d.status.attempts + 1;
    d.status.pending_submission = Some(PendingSubmission {
        attempt,
        known_run_ids: same_app(runs, &fab_hash, &facts.config_text)
            .map(|r| r.run_id.to_string())
            .take(MAX_KNOWN_RUNS)
            .collect(),
        fab_hash,
        since: Time(now),
    });
    d.status.details = Some(format!("submitting attempt {attempt}"));
    d.action = Action::Submit;
}

/// Whether every SuperNode the SuperLink lists `online` reached it after `failed_at` (the
/// failure a retry follows); otherwise the run waits, saying which. Flower keeps a SuperNode
/// that died without a goodbye (its pod killed, its node powered off) listed `online` for up to
/// two heartbeat intervals, and a restarted one cannot connect until that session ends: a
/// retry sent before then gives that SuperNode's messages to nobody and fails as the last
/// attempt did. A live SuperNode sends a heartbeat every 24 s, so this waits at most that long
/// for SuperNodes that are serving.
fn supernodes_serving_since(d: &mut Decision, facts: &Facts<'_>, failed_at: Timestamp) -> bool {
    let since_failure = facts
        .now
        .duration_since(failed_at)
        .try_into()
        .unwrap_or(Duration::ZERO);
    let online = match &facts.supernodes {
        SuperNodesState::Online(online) => online,
        SuperNodesState::Unreachable(why) => {
            let message = format!("the SuperLink's Control API does not answer: {why}");
            wait(
                d,
                reason::SUPERLINK_UNAVAILABLE,
                message,
                Some(UNREACHABLE_RETRY),
                facts.now,
            );
            return false;
        }
        SuperNodesState::NotAsked => {
            d.requeue = Some(SUPERNODES_POLL);
            return false;
        }
    };
    let silent: Vec<u64> = online
        .iter()
        .filter(|(_, age)| age.is_some_and(|age| age >= since_failure))
        .map(|(id, _)| *id)
        .collect();
    if silent.is_empty() {
        return true;
    }
    let shown: Vec<String> = silent.iter().take(5).map(u64::to_string).collect();
    let more = if silent.len() > shown.len() {
        format!(" and {} more", silent.len() - shown.len())
    } else {
        String::new()
    };
    let message = format!(
        "attempt {} failed; the next one waits until every SuperNode the SuperLink lists online has reached it since then: {} of {} have not (node {}{more}). A SuperNode that stopped without a goodbye stays listed online for up to 60 s, and one restarted meanwhile connects only after that",
        d.status.attempts,
        silent.len(),
        online.len(),
        shown.join(", "),
    );
    wait(
        d,
        reason::SUPERNODES_NOT_SERVING,
        message,
        Some(SUPERNODES_POLL),
        facts.now,
    );
    false
}

fn adopt_or_resubmit(d: &mut Decision, facts: &Facts<'_>, pending: &PendingSubmission) {
    let runs = match &facts.superlink {
        SuperLinkState::Runs(runs) => runs,
        SuperLinkState::Unreachable(why) => {
            let message = format!(
                "a submission (attempt {}) is unanswered and the SuperLink does not answer ({why}): \
                 it is adopted, not sent again, once the SuperLink answers",
                pending.attempt
            );
            wait(
                d,
                reason::SUPERLINK_UNAVAILABLE,
                message,
                Some(UNREACHABLE_RETRY),
                facts.now,
            );
            return;
        }
        SuperLinkState::NotAsked => return,
    };
    let known: BTreeSet<&str> = pending.known_run_ids.iter().map(String::as_str).collect();
    let found = same_app(runs, &pending.fab_hash, &facts.config_text)
        .filter(|r| !known.contains(r.run_id.to_string().as_str()))
        .filter(|r| !facts.claimed.contains(&r.run_id))
        .map(|r| r.run_id)
        .min();
    match found {
        Some(run_id) => {
            d.status = submitted(&d.status, run_id, pending.since.0);
            d.events.push(normal(
                "Adopted",
                format!(
                    "found Flower run {run_id} of the unanswered submission (attempt {}) instead of submitting again",
                    pending.attempt
                ),
            ));
        }
        None => {
            // It never reached the SuperLink: send it again, as the same attempt.
            d.status.details = Some(format!(
                "the submission of attempt {} never reached the SuperLink: submitting again",
                pending.attempt
            ));
            d.action = Action::Submit;
        }
    }
}

fn follow(d: &mut Decision, facts: &Facts<'_>) {
    let now = facts.now;
    let Some(run_id) = d
        .status
        .run_id
        .as_deref()
        .and_then(|id| id.parse::<u64>().ok())
    else {
        return;
    };
    let runs = match &facts.superlink {
        SuperLinkState::Runs(runs) => runs,
        SuperLinkState::Unreachable(why) => {
            d.status.details = Some(format!(
                "the SuperLink does not answer ({why}); Flower run {run_id} is followed again when it does"
            ));
            d.requeue = Some(UNREACHABLE_RETRY);
            return;
        }
        SuperLinkState::NotAsked => return,
    };
    let Some(run) = runs.iter().find(|r| r.run_id == run_id) else {
        let message = format!(
            "the SuperLink no longer lists Flower run {run_id}: its state was lost (a SuperLink \
             restart without a database volume?)"
        );
        attempt_failed(d, facts, reason::FLOWER_FAILED, &message);
        return;
    };
    let previous = d.status.flower_status.clone();
    d.status.flower_status = Some(run.status.clone());
    // What the ServerApp raised: bounded and stripped of control characters, so no app can make
    // a status write fail or drive the terminal of whoever reads it.
    let details = crate::core::text::bounded(&run.details, crate::core::text::MAX_DETAILS);
    if !details.is_empty() {
        d.status.details = Some(details.clone());
    }
    let changed = previous.as_deref() != Some(run.status.as_str());
    match run.status.as_str() {
        "running" => {
            if d.status.started_at.is_none() {
                d.status.started_at = Some(Time(now));
            }
            set(
                &mut d.status,
                RUN_RUNNING,
                true,
                "Running",
                &format!("Flower run {run_id} is running"),
                now,
            );
            if changed {
                d.events
                    .push(normal("Running", format!("Flower run {run_id} is running")));
            }
        }
        "finished:completed" => {
            set(
                &mut d.status,
                RUN_RUNNING,
                false,
                "Finished",
                "the run finished",
                now,
            );
            set(
                &mut d.status,
                RUN_COMPLETE,
                true,
                "Completed",
                &format!("Flower run {run_id} finished:completed"),
                now,
            );
            d.status.finished_at = Some(Time(now));
            d.status.stop_reason = None;
            d.events.push(normal(
                "Completed",
                format!("Flower run {run_id} finished:completed"),
            ));
            expire(d, facts);
            return;
        }
        "finished:stopped" => {
            let why = d
                .status
                .stop_reason
                .take()
                .unwrap_or_else(|| reason::STOPPED.to_owned());
            let message = if why == reason::DEADLINE_EXCEEDED {
                deadline_message(facts)
            } else {
                format!("Flower run {run_id} was stopped")
            };
            let why = static_reason(&why);
            fail(&mut d.status, why, &message, now);
            d.events.push(warning(why, message));
            expire(d, facts);
            return;
        }
        status if status.starts_with("finished") => {
            let message = format!(
                "Flower run {run_id} ended {status}{}",
                if details.is_empty() {
                    String::new()
                } else {
                    format!(": {details}")
                }
            );
            attempt_failed(d, facts, reason::FLOWER_FAILED, &message);
            return;
        }
        _ => {}
    }
    // Still going: stop it when asked to or when its time is up.
    if d.status.stop_reason.is_none() {
        let stop = if facts.spec.suspended() {
            Some((
                reason::STOPPED,
                "spec.suspend is true: stopping the run".to_owned(),
            ))
        } else if deadline_passed(&d.status, facts) {
            Some((reason::DEADLINE_EXCEEDED, deadline_message(facts)))
        } else {
            None
        };
        if let Some((why, message)) = stop {
            d.status.stop_reason = Some(why.to_owned());
            d.events.push(warning(why, message));
        }
    }
    if d.status.stop_reason.is_some() {
        d.action = Action::Stop(run_id);
    }
    d.requeue = Some(match deadline_at(&d.status, facts) {
        Some(due) if due > now => ACTIVE_POLL.min(until(now, due)),
        _ => ACTIVE_POLL,
    });
}

/// The first delay before a failed attempt is submitted again (then doubled per failure).
pub const RETRY_BACKOFF: Duration = Duration::from_secs(10);
/// The longest delay before a retry.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(360);

/// When the next attempt of a run whose last attempt failed may be submitted: `RETRY_BACKOFF`
/// after the failure, doubled per failed attempt, at most `RETRY_BACKOFF_MAX`.
fn retry_due(s: &FlowerRunStatus) -> Option<Timestamp> {
    let retrying = s
        .conditions
        .iter()
        .find(|c| c.type_ == RUN_SUBMITTED && c.status == "False" && c.reason == "Retrying")?;
    retrying
        .last_transition_time
        .0
        .checked_add(SignedDuration::try_from(retry_delay(s.attempts)).ok()?)
        .ok()
}

/// The delay before the attempt after `attempts` (the failed ones so far, ≥ 1).
fn retry_delay(attempts: i32) -> Duration {
    let doublings = u32::try_from(attempts.max(1) - 1).unwrap_or(0).min(8);
    RETRY_BACKOFF
        .saturating_mul(1 << doublings)
        .min(RETRY_BACKOFF_MAX)
}

/// A Flower run of this attempt ended without completing: retry under `backoffLimit`, or fail.
fn attempt_failed(d: &mut Decision, facts: &Facts<'_>, why: &'static str, message: &str) {
    let now = facts.now;
    let allowed = 1 + facts.spec.backoff_limit();
    if d.status.attempts < allowed && !facts.spec.suspended() && !deadline_passed(&d.status, facts)
    {
        d.events.push(warning(
            "Retrying",
            format!(
                "{message}; submitting attempt {} of {allowed} (backoffLimit {}) in {} s",
                d.status.attempts + 1,
                facts.spec.backoff_limit(),
                retry_delay(d.status.attempts).as_secs()
            ),
        ));
        d.status.details = Some(format!("attempt {} failed: {message}", d.status.attempts));
        d.status.run_id = None;
        d.status.flower_status = None;
        d.status.started_at = None;
        d.status.progress = None;
        d.status.log_timestamp = None;
        set(&mut d.status, RUN_RUNNING, false, "Retrying", message, now);
        set(
            &mut d.status,
            RUN_SUBMITTED,
            false,
            "Retrying",
            "a new attempt is being submitted",
            now,
        );
        d.requeue = Some(retry_delay(d.status.attempts));
        return;
    }
    let (why, message) = if d.status.attempts > 1 {
        (
            reason::BACKOFF_LIMIT_EXCEEDED,
            format!(
                "{message} (attempt {} of {allowed}: backoffLimit reached)",
                d.status.attempts
            ),
        )
    } else {
        (why, message.to_owned())
    };
    fail(&mut d.status, why, &message, now);
    d.events.push(warning(why, message));
    expire(d, facts);
}

/// Runs of the SuperLink with this FAB and run config.
fn same_app<'r>(
    runs: &'r [ListedRun],
    fab_hash: &'r str,
    config: &'r BTreeMap<String, String>,
) -> impl Iterator<Item = &'r ListedRun> {
    runs.iter()
        .filter(move |r| r.fab_hash == fab_hash && &r.config == config)
}

fn record_run(s: &mut FlowerRunStatus, run_id: u64, at: Timestamp) {
    s.run_id = Some(run_id.to_string());
    s.flower_status = Some("pending".into());
    s.submitted_at = Some(Time(at));
    if s.first_submitted_at.is_none() {
        s.first_submitted_at = Some(Time(at));
    }
    s.started_at = None;
    s.progress = None;
    s.log_timestamp = None;
    s.details = None;
    set(
        s,
        RUN_SUBMITTED,
        true,
        "Submitted",
        &format!("Flower run {run_id} (attempt {})", s.attempts),
        at,
    );
}

fn wait(
    d: &mut Decision,
    why: &'static str,
    message: String,
    requeue: Option<Duration>,
    now: Timestamp,
) {
    let already = d
        .status
        .conditions
        .iter()
        .any(|c| c.type_ == RUN_SUBMITTED && c.reason == why && c.message == message);
    set(&mut d.status, RUN_SUBMITTED, false, why, &message, now);
    if !already {
        d.events.push(warning(why, message.clone()));
    }
    d.status.details = Some(message);
    d.requeue = requeue;
}

fn fail(s: &mut FlowerRunStatus, why: &str, message: &str, now: Timestamp) {
    s.pending_submission = None;
    s.stop_reason = None;
    s.details = Some(message.to_owned());
    if s.finished_at.is_none() {
        s.finished_at = Some(Time(now));
    }
    set(s, RUN_RUNNING, false, "Finished", "the run ended", now);
    set(s, RUN_FAILED, true, why, message, now);
}

fn deadline_at(s: &FlowerRunStatus, facts: &Facts<'_>) -> Option<Timestamp> {
    let seconds = facts.spec.active_deadline_seconds?;
    let first = s.first_submitted_at.as_ref()?;
    Some(first.0 + SignedDuration::from_secs(seconds))
}

fn deadline_passed(s: &FlowerRunStatus, facts: &Facts<'_>) -> bool {
    deadline_at(s, facts).is_some_and(|due| facts.now >= due)
}

fn deadline_message(facts: &Facts<'_>) -> String {
    format!(
        "{} ran longer than activeDeadlineSeconds ({} s from its first submission)",
        facts.run_name,
        facts.spec.active_deadline_seconds.unwrap_or_default()
    )
}

fn static_reason(why: &str) -> &'static str {
    match why {
        reason::DEADLINE_EXCEEDED => reason::DEADLINE_EXCEEDED,
        _ => reason::STOPPED,
    }
}

fn until(now: Timestamp, due: Timestamp) -> Duration {
    Duration::try_from(due.duration_since(now)).unwrap_or(Duration::ZERO)
}

fn has_true(s: &FlowerRunStatus, type_: &str) -> bool {
    s.conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// Sets condition `type_`, keeping its transition time when its status did not change.
fn set(
    s: &mut FlowerRunStatus,
    type_: &str,
    status: bool,
    why: &str,
    message: &str,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" };
    let generation = s.observed_generation;
    let kept = s
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone());
    s.conditions.retain(|c| c.type_ != type_);
    s.conditions.push(Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: why.to_owned(),
        message: message.to_owned(),
        last_transition_time: kept.unwrap_or(Time(now)),
        observed_generation: generation,
    });
    s.conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

fn normal(reason: &'static str, message: impl Into<String>) -> RunEvent {
    RunEvent {
        warning: false,
        reason,
        message: message.into(),
    }
}

fn warning(reason: &'static str, message: impl Into<String>) -> RunEvent {
    RunEvent {
        warning: true,
        reason,
        message: message.into(),
    }
}

/// How long after a run finished the hub keeps trying to list its outputs (the SuperLink pod
/// may be restarting); then `status.details` says why there is no list.
pub const OUTPUTS_LIST_WINDOW: Duration = Duration::from_secs(600);
/// How soon to try listing outputs again after a failure.
pub const OUTPUTS_RETRY: Duration = Duration::from_secs(15);

/// Where a run's outputs go (its Federation's `spec.outputs`): the run-config key and the
/// directory, as the ServerApp sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputDir {
    /// The run-config key (`spec.outputs.runConfigKey`).
    pub key: String,
    /// `<outputs root>/<namespace>/<run name>`.
    pub dir: String,
}

impl OutputDir {
    /// The run `namespace/name`'s directory under `root` for a Federation with `outputs`.
    pub fn new(
        outputs: &flower_addon_crds::OutputsSpec,
        root: &str,
        namespace: &str,
        name: &str,
    ) -> Self {
        Self {
            key: outputs.run_config_key().to_owned(),
            dir: format!("{}/{namespace}/{name}", root.trim_end_matches('/')),
        }
    }
}

/// Whether the run's outputs are to be listed now: it finished after a Flower run, its
/// Federation declares outputs and they were not listed yet. A finished run is listed once.
pub fn outputs_to_list(status: &FlowerRunStatus, declared: bool) -> bool {
    declared && is_finished(status) && status.run_id.is_some() && status.outputs_listed_at.is_none()
}

/// Why a run's outputs could not be listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputsFailure {
    /// For now (the SuperLink pod is restarting, the listing timed out): tried again.
    Retry(String),
    /// The run's files are over the Federation's `spec.outputs.sizeLimit`: for good.
    OverQuota(String),
}

/// How long listing a finished run's outputs may take, in both hub modes.
pub const OUTPUTS_LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// The condition a run gets when its outputs are not listed for good.
pub const OUTPUTS_LISTED: &str = "OutputsListed";

/// Records a listing of the run's outputs (or why there is none); returns when to try again
/// (`None`: done). Failures are retried for [`OUTPUTS_LIST_WINDOW`] after the run finished.
pub fn record_outputs(
    status: &mut FlowerRunStatus,
    listed: Result<Vec<flower_addon_crds::run::RunOutput>, OutputsFailure>,
    now: Timestamp,
) -> Option<Duration> {
    let listed = match listed {
        Ok(files) => Ok(files),
        Err(OutputsFailure::OverQuota(message)) => {
            // Over the Federation's limit it stays: not retried; said by a condition.
            let message = crate::core::text::bounded(&message, crate::core::text::MAX_DETAILS);
            status.outputs_listed_at = Some(Time(now));
            status.details = Some(message.clone());
            set(
                status,
                OUTPUTS_LISTED,
                false,
                reason::OUTPUTS_OVER_QUOTA,
                &message,
                now,
            );
            return None;
        }
        Err(OutputsFailure::Retry(why)) => Err(why),
    };
    match listed {
        Ok(files) => {
            // File names are the app's: bounded and stripped like its log.
            status.outputs = files
                .into_iter()
                .map(|f| flower_addon_crds::run::RunOutput {
                    path: crate::core::text::bounded_line(
                        &f.path,
                        crate::core::text::MAX_OUTPUT_PATH,
                    ),
                    ..f
                })
                .collect();
            status.outputs_listed_at = Some(Time(now));
            None
        }
        Err(why) => {
            let finished = status.finished_at.as_ref().map_or(now, |t| t.0);
            let waited = now.duration_since(finished);
            if waited >= SignedDuration::try_from(OUTPUTS_LIST_WINDOW).unwrap_or_default() {
                status.outputs_listed_at = Some(Time(now));
                status.details = Some(format!(
                    "outputs not listed: {why} (gave up {} s after the run finished;                      `flower-hub run fetch` still tries)",
                    OUTPUTS_LIST_WINDOW.as_secs()
                ));
                None
            } else {
                status.details = Some(format!("listing outputs: {why}; retried"));
                Some(OUTPUTS_RETRY)
            }
        }
    }
}

/// SHA-256 (hex) of a spec's `runConfig`, keys sorted (`BTreeMap`), values as JSON.
pub fn run_config_hash(spec: &FlowerRunSpec) -> String {
    use sha2::Digest;
    let json = serde_json::to_vec(&spec.run_config).unwrap_or_default();
    hex::encode(sha2::Sha256::digest(json))
}

/// Adds log text the SuperLink streamed: the last [`LOG_TAIL_LINES`] lines are kept, the
/// timestamp to resume after is stored and the round progress read from the new lines.
pub fn add_log(s: &mut FlowerRunStatus, text: &str, timestamp: f64) {
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if let Some((current, total)) = round_of(line) {
            let previous = s.progress.as_ref().map_or(0, |p| p.current);
            let total = total.or(s.progress.as_ref().and_then(|p| p.total));
            if current >= previous {
                s.progress = Some(RunProgress {
                    current,
                    total,
                    text: match total {
                        Some(t) => format!("{current}/{t}"),
                        None => current.to_string(),
                    },
                });
            }
        }
        s.log_tail.push(crate::core::text::bounded_line(
            line,
            crate::core::text::MAX_LOG_LINE,
        ));
    }
    let excess = s.log_tail.len().saturating_sub(LOG_TAIL_LINES);
    s.log_tail.drain(..excess);
    if timestamp.is_finite() && s.log_timestamp.is_none_or(|t| timestamp > t) {
        s.log_timestamp = Some(timestamp);
    }
}

/// The round a log line reports: Flower's strategies log `[ROUND 2/3]` (1.42's message API) or
/// `[ROUND 2]` (the legacy server); apps like examples/fedavg print `round 2/3: …`.
pub fn round_of(line: &str) -> Option<(i32, Option<i32>)> {
    let lower = line.to_ascii_lowercase();
    let start = if let Some(i) = lower.find("[round ") {
        i + "[round ".len()
    } else {
        let i = lower.find("round ")?;
        // Only at the start of the message: after a log prefix (`INFO :      `) or nothing.
        let before = lower[..i].trim_end();
        if !(before.is_empty() || before.ends_with(':')) {
            return None;
        }
        i + "round ".len()
    };
    let rest = &lower[start..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let current: i32 = digits.parse().ok()?;
    let after = &rest[digits.len()..];
    let total = after.strip_prefix('/').and_then(|t| {
        let d: String = t.chars().take_while(char::is_ascii_digit).collect();
        d.parse().ok()
    });
    Some((current, total))
}

#[cfg(test)]
mod tests;

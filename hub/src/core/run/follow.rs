//! While a run has its Flower run: its status followed, its attempts retried under the
//! backoff limit, its deadline enforced.
use super::*;

pub(super) fn follow(d: &mut Decision, facts: &Facts<'_>) {
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
        "running" => running(d, run_id, changed, now),
        "finished:completed" => return completed(d, facts, run_id),
        "finished:stopped" => return stopped(d, facts, run_id),
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
    still_going(d, facts, run_id);
}

/// Flower run `run_id` runs: the run's start time (once) and its Running condition (an event
/// when it `changed` to running).
fn running(d: &mut Decision, run_id: u64, changed: bool, now: Timestamp) {
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

/// Flower run `run_id` finished:completed: the run is Complete.
fn completed(d: &mut Decision, facts: &Facts<'_>, run_id: u64) {
    let now = facts.now;
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
}

/// Flower run `run_id` finished:stopped: the run failed for the reason it was stopped (the
/// deadline, or a stop).
fn stopped(d: &mut Decision, facts: &Facts<'_>, run_id: u64) {
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
    fail(&mut d.status, why, &message, facts.now);
    d.events.push(warning(why, message));
    expire(d, facts);
}

/// A run still going: stopped when asked to (`spec.suspend`) or when its time is up, and
/// followed again within `ACTIVE_POLL` (sooner when its deadline comes first).
fn still_going(d: &mut Decision, facts: &Facts<'_>, run_id: u64) {
    let now = facts.now;
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
pub(super) fn retry_due(s: &FlowerRunStatus) -> Option<Timestamp> {
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
pub(super) fn retry_delay(attempts: i32) -> Duration {
    let doublings = u32::try_from(attempts.max(1) - 1).unwrap_or(0).min(8);
    RETRY_BACKOFF
        .saturating_mul(1 << doublings)
        .min(RETRY_BACKOFF_MAX)
}

/// A Flower run of this attempt ended without completing: retry under `backoffLimit`, or fail.
pub(super) fn attempt_failed(
    d: &mut Decision,
    facts: &Facts<'_>,
    why: &'static str,
    message: &str,
) {
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
pub(super) fn same_app<'r>(
    runs: &'r [ListedRun],
    fab_hash: &'r str,
    config: &'r BTreeMap<String, String>,
) -> impl Iterator<Item = &'r ListedRun> {
    runs.iter()
        .filter(move |r| r.fab_hash == fab_hash && &r.config == config)
}

pub(super) fn record_run(s: &mut FlowerRunStatus, run_id: u64, at: Timestamp) {
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

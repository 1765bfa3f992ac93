//! The status' conditions, waits, failures and events, as every phase writes them.
use super::*;

pub(super) fn wait(
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

pub(super) fn fail(s: &mut FlowerRunStatus, why: &str, message: &str, now: Timestamp) {
    s.pending_submission = None;
    s.stop_reason = None;
    s.details = Some(message.to_owned());
    if s.finished_at.is_none() {
        s.finished_at = Some(Time(now));
    }
    set(s, RUN_RUNNING, false, "Finished", "the run ended", now);
    set(s, RUN_FAILED, true, why, message, now);
}

pub(super) fn deadline_at(s: &FlowerRunStatus, facts: &Facts<'_>) -> Option<Timestamp> {
    let seconds = facts.spec.active_deadline_seconds?;
    let first = s.first_submitted_at.as_ref()?;
    Some(first.0 + SignedDuration::from_secs(seconds))
}

pub(super) fn deadline_passed(s: &FlowerRunStatus, facts: &Facts<'_>) -> bool {
    deadline_at(s, facts).is_some_and(|due| facts.now >= due)
}

pub(super) fn deadline_message(facts: &Facts<'_>) -> String {
    format!(
        "{} ran longer than activeDeadlineSeconds ({} s from its first submission)",
        facts.run_name,
        facts.spec.active_deadline_seconds.unwrap_or_default()
    )
}

pub(super) fn static_reason(why: &str) -> &'static str {
    match why {
        reason::DEADLINE_EXCEEDED => reason::DEADLINE_EXCEEDED,
        _ => reason::STOPPED,
    }
}

pub(super) fn until(now: Timestamp, due: Timestamp) -> Duration {
    Duration::try_from(due.duration_since(now)).unwrap_or(Duration::ZERO)
}

pub(super) fn has_true(s: &FlowerRunStatus, type_: &str) -> bool {
    s.conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// Sets condition `type_`, keeping its transition time when its status did not change.
pub(super) fn set(
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

pub(super) fn normal(reason: &'static str, message: impl Into<String>) -> RunEvent {
    RunEvent {
        warning: false,
        reason,
        message: message.into(),
    }
}

pub(super) fn warning(reason: &'static str, message: impl Into<String>) -> RunEvent {
    RunEvent {
        warning: true,
        reason,
        message: message.into(),
    }
}

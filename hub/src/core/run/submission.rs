//! Before a run has its Flower run: held, waiting (Federation, app, SuperNodes), submitted,
//! or a lost submission adopted or sent again.
use super::*;

pub(super) fn before_submission(d: &mut Decision, facts: &Facts<'_>) {
    if held(d, facts) || waits_for_restart(d, facts) || waits_for_federation(d, facts) {
        return;
    }
    let Some(fab_hash) = app_hash(d, facts) else {
        return;
    };
    let Some(runs) = listed_runs(d, facts) else {
        return;
    };
    if !submission_may_go(d, facts) {
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
        since: Time(facts.now),
    });
    d.status.details = Some(format!("submitting attempt {attempt}"));
    d.action = Action::Submit;
}

/// Whether the run is held: by `spec.suspend` (said once), or failed by its deadline. A run no
/// longer suspended says it resumed.
fn held(d: &mut Decision, facts: &Facts<'_>) -> bool {
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
        return true;
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
        return true;
    }
    false
}

/// Whether the run waits for its Federation's SuperNodes being restarted (checked before the
/// Federation's readiness: it is not Ready meanwhile, for that). Once back from such a wait,
/// the time is recorded: from then on, every SuperNode listed online must reach the SuperLink
/// before the run is sent (an old session stays listed for a while).
fn waits_for_restart(d: &mut Decision, facts: &Facts<'_>) -> bool {
    if let Some(message) = facts
        .restart
        .waiting_message(&facts.spec.federation_ref.name)
    {
        wait(
            d,
            reason::SUPERNODES_RESTARTING,
            message,
            Some(SUPERNODES_POLL),
            facts.now,
        );
        d.status.supernodes_restarted_at = None;
        return true;
    }
    if d.status.supernodes_restarted_at.is_none()
        && d.status.conditions.iter().any(|c| {
            c.type_ == RUN_SUBMITTED
                && c.status == "False"
                && c.reason == reason::SUPERNODES_RESTARTING
        })
    {
        d.status.supernodes_restarted_at = Some(Time(facts.now));
    }
    false
}

/// Whether the run waits for its Federation to exist and be Ready.
fn waits_for_federation(d: &mut Decision, facts: &Facts<'_>) -> bool {
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
    match waiting {
        Some(message) => {
            wait(d, reason::FEDERATION_NOT_READY, message, None, facts.now);
            true
        }
        None => false,
    }
}

/// The app's FAB hash once it is ready; otherwise the run waits (missing), fails (invalid), or
/// the app was not loaded this pass.
fn app_hash(d: &mut Decision, facts: &Facts<'_>) -> Option<String> {
    match &facts.app {
        Some(AppState::Ready { fab_hash }) => Some(fab_hash.clone()),
        Some(AppState::Missing { message }) => {
            wait(d, reason::INVALID_APP, message.clone(), None, facts.now);
            None
        }
        Some(AppState::Invalid { reason, message }) => {
            fail(&mut d.status, reason, message, facts.now);
            d.events.push(warning(reason, message.clone()));
            None
        }
        None => None,
    }
}

/// The SuperLink's run list; the run waits while its Control API does not answer.
fn listed_runs<'f>(d: &mut Decision, facts: &'f Facts<'_>) -> Option<&'f [ListedRun]> {
    match &facts.superlink {
        SuperLinkState::Runs(runs) => Some(runs),
        SuperLinkState::Unreachable(why) => {
            let message = format!("the SuperLink's Control API does not answer: {why}");
            wait(
                d,
                reason::SUPERLINK_UNAVAILABLE,
                message,
                Some(UNREACHABLE_RETRY),
                facts.now,
            );
            None
        }
        SuperLinkState::NotAsked => None,
    }
}

/// Whether a retry (or a run back from a SuperNode restart) may be sent now. A retry waits as a
/// Job's pod does: 10 s after the first failure, doubling up to 6 min (a SuperLink that just
/// came back still lists SuperNodes that have not reconnected); then, after a failure, a
/// restart of the SuperNodes or the SuperLink's start, whichever came last, until every
/// SuperNode listed online reached the SuperLink since.
fn submission_may_go(d: &mut Decision, facts: &Facts<'_>) -> bool {
    let now = facts.now;
    if let Some(due) = retry_due(&d.status)
        && now < due
    {
        d.requeue = Some(until(now, due));
        return false;
    }
    // The last of them; a later one in this order wins a tie.
    let mut since: Option<(Timestamp, Since)> = None;
    for (at, why) in [
        (retry_failed_at(&d.status), Since::Failure),
        (
            d.status.supernodes_restarted_at.as_ref().map(|t| t.0),
            Since::Restart,
        ),
        (facts.superlink_started_at, Since::Start),
    ] {
        if let Some(at) = at
            && since.is_none_or(|(last, _)| at >= last)
        {
            since = Some((at, why));
        }
    }
    match since {
        Some((since, why)) => supernodes_serving_since(d, facts, since, why),
        None => true,
    }
}

/// What a submission waits on the SuperNodes after ([`supernodes_serving_since`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Since {
    /// The last attempt failed.
    Failure,
    /// The hub restarted the Federation's SuperNodes.
    Restart,
    /// The SuperLink started.
    Start,
}

/// Whether every SuperNode the SuperLink lists `online` reached it after `failed_at` (the
/// failure a retry follows); otherwise the run waits, saying which. Flower keeps a SuperNode
/// that died without a goodbye (its pod killed, its node powered off) listed `online` for up to
/// two heartbeat intervals, and a restarted one cannot connect until that session ends: a
/// retry sent before then gives that SuperNode's messages to nobody and fails as the last
/// attempt did. A live SuperNode sends a heartbeat every 24 s, so this waits at most that long
/// for SuperNodes that are serving.
pub(super) fn supernodes_serving_since(
    d: &mut Decision,
    facts: &Facts<'_>,
    failed_at: Timestamp,
    why: Since,
) -> bool {
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
    let what = match why {
        Since::Restart => "the hub restarted the Federation's SuperNodes; the run waits until every SuperNode the SuperLink lists online has reached it since they were back".to_owned(),
        Since::Start => "the Federation's SuperLink started again; the run waits until every SuperNode it lists online has reached it since (it still lists the sessions it had before)".to_owned(),
        Since::Failure => format!(
            "attempt {} failed; the next one waits until every SuperNode the SuperLink lists online has reached it since then",
            d.status.attempts
        ),
    };
    let message = format!(
        "{what}: {} of {} have not (node {}{more}). A SuperNode that stopped without a goodbye stays listed online for up to 60 s, and one restarted meanwhile connects only after that",
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

pub(super) fn adopt_or_resubmit(d: &mut Decision, facts: &Facts<'_>, pending: &PendingSubmission) {
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
            // It never reached the SuperLink: send it again, as the same attempt, to SuperNodes
            // that serve (the hub, and maybe the SuperLink, restarted meanwhile).
            if !submission_may_go(d, facts) {
                return;
            }
            d.status.details = Some(format!(
                "the submission of attempt {} never reached the SuperLink: submitting again",
                pending.attempt
            ));
            d.action = Action::Submit;
        }
    }
}

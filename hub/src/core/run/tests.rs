use super::*;
use flower_addon_crds::run::{FabSource, FederationRef, RunApp};

fn spec() -> FlowerRunSpec {
    FlowerRunSpec {
        federation_ref: FederationRef { name: "fed".into() },
        app: RunApp {
            fab: FabSource::default(),
        },
        run_config: BTreeMap::new(),
        suspend: None,
        active_deadline_seconds: None,
        backoff_limit: None,
        ttl_seconds_after_finished: None,
    }
}

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn listed(run_id: u64, status: &str, hash: &str) -> ListedRun {
    ListedRun {
        run_id,
        status: status.into(),
        details: String::new(),
        fab_hash: hash.into(),
        config: BTreeMap::new(),
        finished_at: String::new(),
    }
}

fn facts<'a>(spec: &'a FlowerRunSpec, runs: Vec<ListedRun>, now: i64) -> Facts<'a> {
    Facts {
        run_name: "ns/run",
        spec,
        generation: Some(1),
        deleting: false,
        federation: FederationState::Ready,
        app: Some(AppState::Ready {
            fab_hash: "h".into(),
        }),
        superlink: SuperLinkState::Runs(runs),
        supernodes: SuperNodesState::Online(Vec::new()),
        superlink_started_at: None,
        config_text: BTreeMap::new(),
        run_config_hash: run_config_hash(spec),
        claimed: BTreeSet::new(),
        restart: Restart::None,
        now: at(now),
    }
}

fn condition<'s>(s: &'s FlowerRunStatus, type_: &str) -> Option<&'s Condition> {
    s.conditions.iter().find(|c| c.type_ == type_)
}

fn is(s: &FlowerRunStatus, type_: &str, status: &str, reason: &str) -> bool {
    condition(s, type_).is_some_and(|c| c.status == status && c.reason == reason)
}

/// Submits (the pending submission stored) and records the run id the SuperLink answered.
fn submit(
    spec: &FlowerRunSpec,
    status: &FlowerRunStatus,
    runs: Vec<ListedRun>,
    run_id: u64,
    now: i64,
) -> FlowerRunStatus {
    let d = decide(status, &facts(spec, runs, now));
    assert_eq!(d.action, Action::Submit, "{d:?}");
    assert!(d.status.pending_submission.is_some());
    submitted(&d.status, run_id, at(now))
}

#[test]
fn a_run_waits_for_its_federation_and_says_which() {
    let spec = spec();
    let mut f = facts(&spec, vec![], 0);
    f.federation = FederationState::Missing;
    let d = decide(&FlowerRunStatus::default(), &f);
    assert_eq!(d.action, Action::Nothing);
    assert!(is(
        &d.status,
        RUN_SUBMITTED,
        "False",
        reason::FEDERATION_NOT_READY
    ));
    assert!(
        d.status
            .details
            .as_deref()
            .unwrap()
            .contains("Federation fed does not exist")
    );
    assert_eq!(d.events.len(), 1);
    // The same wait again records no second event.
    let again = decide(&d.status, &f);
    assert!(again.events.is_empty(), "{:?}", again.events);
    f.federation = FederationState::NotReady("0/2 SuperNodes online".into());
    let d = decide(&d.status, &f);
    assert!(
        d.status
            .details
            .as_deref()
            .unwrap()
            .contains("0/2 SuperNodes online")
    );
    f.federation = FederationState::Ready;
    assert_eq!(decide(&d.status, &f).action, Action::Submit);
}

#[test]
fn a_missing_app_waits_and_starts_once_it_exists() {
    // Invariant: a FAB whose ConfigMap (or key) does not exist yet holds the run, as a Pod waits
    // for its ConfigMap volume: no failure (the spec is immutable, a Failed run could never
    // start), no call, one event; the run is submitted once the app is there.
    let spec = spec();
    let mut f = facts(&spec, vec![], 0);
    f.app = Some(AppState::Missing {
        message: "ConfigMap ns/fab does not exist".into(),
    });
    let d = decide(&FlowerRunStatus::default(), &f);
    assert_eq!(d.action, Action::Nothing);
    assert!(!is_finished(&d.status), "{:?}", d.status);
    assert!(
        is(&d.status, RUN_SUBMITTED, "False", reason::INVALID_APP),
        "{:?}",
        d.status
    );
    assert_eq!(
        d.status.details.as_deref(),
        Some("ConfigMap ns/fab does not exist")
    );
    assert!(d.status.pending_submission.is_none());
    assert_eq!(d.events.len(), 1, "{:?}", d.events);
    assert!(d.events[0].warning);
    assert_eq!(d.requeue, None, "the ConfigMap watch wakes it, not a timer");
    let again = decide(&d.status, &f);
    assert_eq!(again.status, d.status, "the same wait changes nothing");
    assert!(again.events.is_empty(), "{:?}", again.events);
    f.app = Some(AppState::Ready {
        fab_hash: "h".into(),
    });
    assert_eq!(decide(&d.status, &f).action, Action::Submit);
}

#[test]
fn bad_apps_and_configs_fail_before_any_flower_call() {
    let spec = spec();
    for reason in [reason::INVALID_APP, reason::INVALID_RUN_CONFIG] {
        let mut f = facts(&spec, vec![], 0);
        f.app = Some(AppState::Invalid {
            reason,
            message: "run-config key `x` is not in the app".into(),
        });
        let d = decide(&FlowerRunStatus::default(), &f);
        assert_eq!(d.action, Action::Nothing);
        assert!(is(&d.status, RUN_FAILED, "True", reason), "{:?}", d.status);
        assert!(is_finished(&d.status));
        assert!(
            !needs_superlink(&d.status, false),
            "a finished run costs no call"
        );
    }
}

#[test]
fn suspend_holds_a_run_before_it_starts() {
    let mut spec = spec();
    spec.suspend = Some(true);
    let d = decide(&FlowerRunStatus::default(), &facts(&spec, vec![], 0));
    assert_eq!(d.action, Action::Nothing);
    assert!(is(&d.status, RUN_SUSPENDED, "True", "Suspended"));
    spec.suspend = Some(false);
    let d = decide(&d.status, &facts(&spec, vec![], 1));
    assert_eq!(d.action, Action::Submit);
    assert!(is(&d.status, RUN_SUSPENDED, "False", "Resumed"));
}

#[test]
fn a_submission_is_recorded_before_it_is_sent_and_adopted_after_a_crash() {
    let spec = spec();
    // Another run of the same app and config existed before: it is never adopted.
    let old = listed(7, "finished:completed", "h");
    let d = decide(
        &FlowerRunStatus::default(),
        &facts(&spec, vec![old.clone()], 0),
    );
    assert_eq!(d.action, Action::Submit);
    let pending = d.status.pending_submission.clone().unwrap();
    assert_eq!(pending.attempt, 1);
    assert_eq!(pending.known_run_ids, ["7"]);
    // The hub dies after sending: the stored status still has the pending submission. The new
    // hub finds the run (id 3, random ids are not increasing) and adopts it; no second StartRun.
    let after_crash = decide(
        &d.status,
        &facts(
            &spec,
            vec![
                old.clone(),
                listed(3, "running", "h"),
                listed(9, "running", "other"),
            ],
            10,
        ),
    );
    assert_eq!(
        after_crash.action,
        Action::Nothing,
        "adopted, not submitted again"
    );
    assert_eq!(after_crash.status.run_id.as_deref(), Some("3"));
    assert_eq!(after_crash.status.attempts, 1);
    assert!(after_crash.status.pending_submission.is_none());
    assert!(is(&after_crash.status, RUN_RUNNING, "True", "Running"));
    assert!(after_crash.events.iter().any(|e| e.reason == "Adopted"));
    // A run another FlowerRun holds is not adopted either; nothing found: sent again as the
    // same attempt.
    let mut f = facts(&spec, vec![old, listed(3, "running", "h")], 10);
    f.claimed.insert(3);
    let d = decide(&d.status, &f);
    assert_eq!(d.action, Action::Submit);
    assert_eq!(d.status.pending_submission.unwrap().attempt, 1);
}

#[test]
fn an_unanswered_submission_waits_for_the_superlink_instead_of_sending_again() {
    let spec = spec();
    let d = decide(&FlowerRunStatus::default(), &facts(&spec, vec![], 0));
    let s = submit_unanswered(&d.status, "timed out", at(1));
    let mut f = facts(&spec, vec![], 5);
    f.superlink = SuperLinkState::Unreachable("connection refused".into());
    let d = decide(&s, &f);
    assert_eq!(d.action, Action::Nothing);
    assert_eq!(d.requeue, Some(UNREACHABLE_RETRY));
    assert!(d.status.pending_submission.is_some());
}

#[test]
fn a_run_is_followed_to_complete_and_deleted_after_its_ttl() {
    let mut spec = spec();
    spec.ttl_seconds_after_finished = Some(60);
    let s = submit(&spec, &FlowerRunStatus::default(), vec![], 42, 0);
    assert_eq!(s.run_id.as_deref(), Some("42"));
    assert!(is(&s, RUN_SUBMITTED, "True", "Submitted"));
    let d = decide(&s, &facts(&spec, vec![listed(42, "running", "h")], 2));
    assert!(is(&d.status, RUN_RUNNING, "True", "Running"));
    assert_eq!(d.status.started_at, Some(Time(at(2))));
    assert_eq!(d.requeue, Some(ACTIVE_POLL));
    let d = decide(
        &d.status,
        &facts(&spec, vec![listed(42, "finished:completed", "h")], 30),
    );
    assert!(is(&d.status, RUN_COMPLETE, "True", "Completed"));
    assert!(is(&d.status, RUN_RUNNING, "False", "Finished"));
    assert_eq!(d.status.finished_at, Some(Time(at(30))));
    assert_eq!(d.requeue, Some(Duration::from_secs(60)));
    assert!(!needs_superlink(&d.status, false));
    let mut f = facts(&spec, vec![], 91);
    f.superlink = SuperLinkState::NotAsked;
    assert_eq!(decide(&d.status, &f).action, Action::Delete);
}

#[test]
fn a_failed_run_is_retried_under_backoff_limit_then_fails() {
    let mut spec = spec();
    spec.backoff_limit = Some(1);
    let s = submit(&spec, &FlowerRunStatus::default(), vec![], 1, 0);
    let mut failed = listed(1, "finished:failed", "h");
    failed.details = "ServerApp raised".into();
    let d = decide(&s, &facts(&spec, vec![failed.clone()], 5));
    assert_eq!(d.status.run_id, None, "a new attempt is due");
    assert!(!is_finished(&d.status));
    assert!(d.events.iter().any(|e| e.reason == "Retrying"));
    // Attempt 2 waits 10 s after the failure, as a Job's pod does.
    let early = decide(&d.status, &facts(&spec, vec![failed.clone()], 9));
    assert_eq!(early.action, Action::Nothing);
    assert_eq!(early.requeue, Some(Duration::from_secs(6)));
    // Then a pass submits it; run 1 (same app) is known and never adopted.
    let d2 = decide(&d.status, &facts(&spec, vec![failed.clone()], 15));
    assert_eq!(d2.action, Action::Submit);
    assert_eq!(d2.status.pending_submission.as_ref().unwrap().attempt, 2);
    let s2 = submitted(&d2.status, 2, at(16));
    assert_eq!(s2.attempts, 2);
    assert_eq!(
        s2.first_submitted_at,
        Some(Time(at(0))),
        "the deadline counts from the first"
    );
    let mut failed2 = listed(2, "finished:failed", "h");
    failed2.details = "again".into();
    let d3 = decide(&s2, &facts(&spec, vec![failed, failed2], 19));
    assert!(
        is(
            &d3.status,
            RUN_FAILED,
            "True",
            reason::BACKOFF_LIMIT_EXCEEDED
        ),
        "{:?}",
        d3.status.conditions
    );
    assert!(d3.status.details.unwrap().contains("again"));
}

#[test]
fn a_retry_waits_for_supernodes_that_reached_the_superlink_since_the_failure() {
    // Invariant: a retry is not submitted while a SuperNode the SuperLink lists online has not
    // reached it since the failed attempt (a dead SuperNode's session Flower still lists, or a
    // restarted one that cannot connect yet); it says which, looks again soon, and goes once
    // every listed SuperNode has. SuperNodes are listed only while a retry waits.
    let mut spec = spec();
    spec.backoff_limit = Some(1);
    let s = submit(&spec, &FlowerRunStatus::default(), vec![], 1, 0);
    assert!(
        !needs_supernodes(&s, false, false),
        "a run in progress lists no SuperNodes"
    );
    let failed = listed(1, "finished:failed", "h");
    let d = decide(&s, &facts(&spec, vec![failed.clone()], 5));
    assert_eq!(retry_failed_at(&d.status), Some(at(5)));
    assert!(needs_supernodes(&d.status, false, false));
    assert!(
        !needs_supernodes(&d.status, true, false),
        "not while deleting"
    );
    // 15 s after the failure: node 7 last reached the SuperLink 20 s ago (before the
    // failure), node 8 3 s ago.
    let mut f = facts(&spec, vec![failed.clone()], 20);
    f.supernodes = SuperNodesState::Online(vec![
        (7, Some(Duration::from_secs(20))),
        (8, Some(Duration::from_secs(3))),
        (9, None),
    ]);
    let waiting = decide(&d.status, &f);
    assert_eq!(waiting.action, Action::Nothing);
    assert_eq!(waiting.requeue, Some(SUPERNODES_POLL));
    assert!(
        is(
            &waiting.status,
            RUN_SUBMITTED,
            "False",
            reason::SUPERNODES_NOT_SERVING
        ),
        "{:?}",
        waiting.status.conditions
    );
    let message = waiting.status.details.clone().unwrap();
    assert!(message.contains("1 of 3 have not (node 7)"), "{message}");
    assert!(
        waiting
            .events
            .iter()
            .any(|e| e.reason == reason::SUPERNODES_NOT_SERVING)
    );
    // Asked again with the same answer: no second event.
    let again = decide(&waiting.status, &f);
    assert!(again.events.is_empty());
    // The adapter did not ask: nothing is sent, and it looks again soon.
    let mut unasked = facts(&spec, vec![failed.clone()], 21);
    unasked.supernodes = SuperNodesState::NotAsked;
    let d_unasked = decide(&waiting.status, &unasked);
    assert_eq!(d_unasked.action, Action::Nothing);
    assert_eq!(d_unasked.requeue, Some(SUPERNODES_POLL));
    // The Control API does not answer: it waits, saying so.
    let mut down = facts(&spec, vec![failed.clone()], 21);
    down.supernodes = SuperNodesState::Unreachable("refused".into());
    let d_down = decide(&waiting.status, &down);
    assert_eq!(d_down.action, Action::Nothing);
    assert!(is(
        &d_down.status,
        RUN_SUBMITTED,
        "False",
        reason::SUPERLINK_UNAVAILABLE
    ));
    // Node 7 came back (activated 2 s ago): attempt 2 goes.
    let mut back = facts(&spec, vec![failed], 30);
    back.supernodes = SuperNodesState::Online(vec![
        (7, Some(Duration::from_secs(2))),
        (8, Some(Duration::from_secs(13))),
    ]);
    let go = decide(&waiting.status, &back);
    assert_eq!(go.action, Action::Submit);
    assert_eq!(go.status.pending_submission.as_ref().unwrap().attempt, 2);
    assert!(
        needs_supernodes(&go.status, false, false),
        "pending: a submission that never reached the SuperLink is sent again after the same wait"
    );
    let answered = submitted(&go.status, 2, at(31));
    assert!(
        !needs_supernodes(&answered, false, false),
        "submitted: no more listing"
    );
}

#[test]
fn a_first_submission_waits_for_supernodes_that_reached_the_superlink_since_it_started() {
    // Invariant: when the hub knows its SuperLink (re)started, a submission goes only when
    // every SuperNode the SuperLink lists online reached it since then (the sessions it had
    // before stay listed until Flower ends them; SuperNodes that died with it connect again
    // only after that). A hub that does not know asks nothing.
    let mut spec = spec();
    spec.backoff_limit = Some(1);
    let fresh = FlowerRunStatus::default();
    assert!(!needs_supernodes(&fresh, false, false));
    assert!(needs_supernodes(&fresh, false, true));
    assert!(!needs_supernodes(&fresh, true, true), "not while deleting");
    // Started at 10; at 25, node 7 last reached the SuperLink 20 s ago (an earlier hub's).
    let mut f = facts(&spec, vec![], 25);
    f.superlink_started_at = Some(at(10));
    f.supernodes = SuperNodesState::Online(vec![
        (7, Some(Duration::from_secs(20))),
        (8, Some(Duration::from_secs(4))),
    ]);
    let waiting = decide(&fresh, &f);
    assert_eq!(waiting.action, Action::Nothing);
    assert_eq!(waiting.requeue, Some(SUPERNODES_POLL));
    assert!(
        is(
            &waiting.status,
            RUN_SUBMITTED,
            "False",
            reason::SUPERNODES_NOT_SERVING
        ),
        "{:?}",
        waiting.status.conditions
    );
    let message = waiting.status.details.clone().unwrap();
    assert!(
        message.contains("SuperLink started again") && message.contains("(node 7)"),
        "{message}"
    );
    // Not asked: nothing is sent.
    let mut unasked = facts(&spec, vec![], 26);
    unasked.superlink_started_at = Some(at(10));
    unasked.supernodes = SuperNodesState::NotAsked;
    assert_eq!(decide(&waiting.status, &unasked).action, Action::Nothing);
    // Flower ended node 7's session; the new SuperNodes reached it since the start: it goes.
    let mut back = facts(&spec, vec![], 40);
    back.superlink_started_at = Some(at(10));
    back.supernodes = SuperNodesState::Online(vec![
        (8, Some(Duration::from_secs(3))),
        (9, Some(Duration::from_secs(1))),
    ]);
    let go = decide(&waiting.status, &back);
    assert_eq!(go.action, Action::Submit);
    assert_eq!(go.status.pending_submission.as_ref().unwrap().attempt, 1);
    // The hub died with that submission pending and a new one started the SuperLink at 50:
    // it never had the run, so it is sent again, once node 8 and 9's sessions from before
    // ended and the SuperNodes reached the new SuperLink.
    let mut restarted = facts(&spec, vec![], 60);
    restarted.superlink_started_at = Some(at(50));
    restarted.supernodes = SuperNodesState::Online(vec![
        (8, Some(Duration::from_secs(20))),
        (9, Some(Duration::from_secs(21))),
    ]);
    let held = decide(&go.status, &restarted);
    assert_eq!(held.action, Action::Nothing, "{:?}", held.status.details);
    assert!(held.status.pending_submission.is_some(), "still pending");
    restarted.now = at(90);
    restarted.supernodes = SuperNodesState::Online(vec![(10, Some(Duration::from_secs(2)))]);
    let resent = decide(&held.status, &restarted);
    assert_eq!(resent.action, Action::Submit);
    assert_eq!(resent.status.pending_submission.unwrap().attempt, 1);
    // A start long before a failure: the failure is what a retry waits after.
    let s = submit(&spec, &FlowerRunStatus::default(), vec![], 1, 41);
    let failed = decide(
        &s,
        &facts(&spec, vec![listed(1, "finished:failed", "h")], 50),
    );
    let mut later = facts(&spec, vec![listed(1, "finished:failed", "h")], 70);
    later.superlink_started_at = Some(at(10));
    later.supernodes = SuperNodesState::Online(vec![(8, Some(Duration::from_secs(22)))]);
    let d = decide(&failed.status, &later);
    assert_eq!(d.action, Action::Nothing);
    let message = d.status.details.clone().unwrap();
    assert!(message.contains("attempt 1 failed"), "{message}");
}

#[test]
fn suspend_while_running_stops_the_run_and_it_ends_stopped() {
    let mut spec = spec();
    let s = submit(&spec, &FlowerRunStatus::default(), vec![], 5, 0);
    spec.suspend = Some(true);
    let d = decide(&s, &facts(&spec, vec![listed(5, "running", "h")], 3));
    assert_eq!(d.action, Action::Stop(5));
    assert_eq!(d.status.stop_reason.as_deref(), Some(reason::STOPPED));
    // Flower has not stopped it yet: asked again, no second event.
    let again = decide(&d.status, &facts(&spec, vec![listed(5, "running", "h")], 4));
    assert_eq!(again.action, Action::Stop(5));
    assert!(again.events.is_empty());
    let done = decide(
        &again.status,
        &facts(&spec, vec![listed(5, "finished:stopped", "h")], 5),
    );
    assert!(is(&done.status, RUN_FAILED, "True", reason::STOPPED));
    assert_eq!(done.action, Action::Nothing);
}

#[test]
fn the_deadline_stops_a_run_and_names_itself() {
    let mut spec = spec();
    spec.active_deadline_seconds = Some(10);
    spec.backoff_limit = Some(3);
    let s = submit(&spec, &FlowerRunStatus::default(), vec![], 5, 0);
    let d = decide(&s, &facts(&spec, vec![listed(5, "running", "h")], 4));
    assert_eq!(d.action, Action::Nothing);
    assert_eq!(d.requeue, Some(ACTIVE_POLL));
    let d = decide(
        &d.status,
        &facts(&spec, vec![listed(5, "running", "h")], 10),
    );
    assert_eq!(d.action, Action::Stop(5));
    let done = decide(
        &d.status,
        &facts(&spec, vec![listed(5, "finished:stopped", "h")], 12),
    );
    assert!(
        is(&done.status, RUN_FAILED, "True", reason::DEADLINE_EXCEEDED),
        "{:?}",
        done.status.conditions
    );
    // A failure past the deadline is not retried.
    let s = submit(&spec, &FlowerRunStatus::default(), vec![], 6, 0);
    let d = decide(
        &s,
        &facts(&spec, vec![listed(6, "finished:failed", "h")], 11),
    );
    assert!(is_finished(&d.status));
}

#[test]
fn deleting_stops_the_flower_run_first() {
    let spec = spec();
    let s = submit(&spec, &FlowerRunStatus::default(), vec![], 5, 0);
    let mut f = facts(&spec, vec![listed(5, "running", "h")], 1);
    f.deleting = true;
    assert!(needs_superlink(&s, true));
    assert_eq!(decide(&s, &f).action, Action::StopAndRelease(5));
    f.superlink = SuperLinkState::Unreachable("refused".into());
    let d = decide(&s, &f);
    assert_eq!(
        d.action,
        Action::Nothing,
        "the finalizer stays while the stop cannot be sent"
    );
    assert!(
        d.status
            .details
            .unwrap()
            .contains(flower_addon_crds::RUN_FINALIZER)
    );
    f.federation = FederationState::Missing;
    assert_eq!(decide(&s, &f).action, Action::Release);
    let finished = decide(
        &s,
        &facts(&spec, vec![listed(5, "finished:completed", "h")], 2),
    )
    .status;
    assert!(!needs_superlink(&finished, true));
    let mut f = facts(&spec, vec![], 3);
    f.deleting = true;
    assert_eq!(decide(&finished, &f).action, Action::Release);
}

#[test]
fn a_run_the_superlink_forgot_is_an_attempt_that_failed() {
    let mut spec = spec();
    let s = submit(&spec, &FlowerRunStatus::default(), vec![], 5, 0);
    let d = decide(&s, &facts(&spec, vec![], 3));
    assert!(is(&d.status, RUN_FAILED, "True", reason::FLOWER_FAILED));
    assert!(
        d.status
            .details
            .unwrap()
            .contains("no longer lists Flower run 5")
    );
    spec.backoff_limit = Some(1);
    let d = decide(&s, &facts(&spec, vec![], 3));
    assert_eq!(d.status.run_id, None);
    assert!(!is_finished(&d.status));
}

#[test]
fn refusals_fail_the_run_with_flowers_words() {
    let spec = spec();
    let d = decide(&FlowerRunStatus::default(), &facts(&spec, vec![], 0));
    let s = submit_refused(
        &d.status,
        "FAB (abc) hash from request doesn't match contents",
        at(1),
    );
    assert!(is(&s, RUN_FAILED, "True", reason::INVALID_APP));
    assert!(s.pending_submission.is_none());
}

#[test]
fn the_log_tail_keeps_the_last_lines_and_reads_rounds() {
    let mut s = FlowerRunStatus::default();
    let text: String = (1..=60).map(|i| format!("line {i}\n")).collect();
    add_log(&mut s, &text, 1.5);
    assert_eq!(s.log_tail.len(), LOG_TAIL_LINES);
    assert_eq!(s.log_tail[0], "line 11");
    assert_eq!(s.log_timestamp, Some(1.5));
    add_log(&mut s, "INFO :      [ROUND 2/3]\n", 2.0);
    assert_eq!(s.progress.as_ref().unwrap().text, "2/3");
    add_log(&mut s, "round 3/3: replies=2 loss=0.1\n", 1.0);
    assert_eq!(s.progress.as_ref().unwrap().text, "3/3");
    assert_eq!(s.log_timestamp, Some(2.0), "never goes back");
    add_log(&mut s, "[ROUND 1]\n", 3.0);
    assert_eq!(
        s.progress.as_ref().unwrap().current,
        3,
        "progress never goes back"
    );
}

#[test]
fn rounds_are_read_only_where_a_line_states_them() {
    assert_eq!(round_of("INFO :      [ROUND 2/10]"), Some((2, Some(10))));
    assert_eq!(round_of("[ROUND 4]"), Some((4, None)));
    assert_eq!(round_of("round 1/2: replies=2"), Some((1, Some(2))));
    assert_eq!(
        round_of("INFO :      round 1/2: replies=2"),
        Some((1, Some(2)))
    );
    assert_eq!(round_of("the second round 2 of x"), None);
    assert_eq!(round_of("round trip"), None);
    assert_eq!(round_of(""), None);
}

#[test]
fn a_run_config_changed_after_creation_stops_and_fails_the_run() {
    let spec = spec();
    let s = submit(&spec, &FlowerRunStatus::default(), vec![], 5, 0);
    assert_eq!(s.run_config_hash, Some(run_config_hash(&spec)));
    let mut changed = spec.clone();
    changed.run_config.insert(
        "num-server-rounds".into(),
        flower_addon_crds::RunConfigValue::Int(9),
    );
    let d = decide(&s, &facts(&changed, vec![listed(5, "running", "h")], 3));
    assert_eq!(d.action, Action::Stop(5), "nothing keeps running untracked");
    assert!(is(
        &d.status,
        RUN_FAILED,
        "True",
        reason::INVALID_RUN_CONFIG
    ));
    assert_eq!(
        condition(&d.status, RUN_FAILED).unwrap().message,
        flower_addon_crds::rules::MSG_RUN_CONFIG_CHANGED
    );
    // Unchanged: nothing happens.
    let d = decide(&s, &facts(&spec, vec![listed(5, "running", "h")], 3));
    assert!(!is_finished(&d.status));
}

#[test]
fn outputs_are_listed_once_after_a_finished_flower_run_and_retried_for_a_while() {
    use flower_addon_crds::run::RunOutput;
    let mut status = FlowerRunStatus {
        run_id: Some("7".into()),
        finished_at: Some(Time(at(0))),
        ..FlowerRunStatus::default()
    };
    assert!(!outputs_to_list(&status, true), "not finished yet");
    set(&mut status, RUN_COMPLETE, true, "Completed", "done", at(0));
    assert!(
        !outputs_to_list(&status, false),
        "the Federation keeps none"
    );
    assert!(outputs_to_list(&status, true));
    // A failure within the window: details say so, retried soon.
    let retry = record_outputs(
        &mut status,
        Err(OutputsFailure::Retry("pod not running".into())),
        at(30),
    );
    assert_eq!(retry, Some(OUTPUTS_RETRY));
    assert!(
        status
            .details
            .as_deref()
            .unwrap_or_default()
            .contains("pod not running")
    );
    assert!(outputs_to_list(&status, true));
    // Listed: recorded once, never asked again.
    let file = RunOutput {
        path: "model.npz".into(),
        size: 3,
        sha256: "ab".into(),
    };
    assert_eq!(
        record_outputs(&mut status, Ok(vec![file.clone()]), at(40)),
        None
    );
    assert_eq!(status.outputs, [file]);
    assert!(!outputs_to_list(&status, true));
    // Past the window a failure gives up, saying so.
    let mut late = FlowerRunStatus {
        run_id: Some("8".into()),
        finished_at: Some(Time(at(0))),
        ..FlowerRunStatus::default()
    };
    set(&mut late, RUN_FAILED, true, "FlowerFailed", "failed", at(0));
    let secs = OUTPUTS_LIST_WINDOW.as_secs() as i64;
    assert_eq!(
        record_outputs(
            &mut late,
            Err(OutputsFailure::Retry("gone".into())),
            at(secs + 1)
        ),
        None
    );
    assert!(late.outputs_listed_at.is_some());
    assert!(
        late.details
            .as_deref()
            .unwrap_or_default()
            .contains("gave up")
    );
    // A run that failed before reaching Flower has nothing to list.
    let mut early = FlowerRunStatus::default();
    set(&mut early, RUN_FAILED, true, "InvalidApp", "bad", at(0));
    assert!(!outputs_to_list(&early, true));
}

#[test]
fn a_run_gets_its_output_directory_under_the_federations_root() {
    let outputs = flower_addon_crds::OutputsSpec::default();
    let dir = OutputDir::new(&outputs, "/var/lib/flwr/outputs/", "team", "run-1");
    assert_eq!(dir.key, "output-dir");
    assert_eq!(dir.dir, "/var/lib/flwr/outputs/team/run-1");
    let named = flower_addon_crds::OutputsSpec {
        run_config_key: Some("save-to".into()),
        ..Default::default()
    };
    assert_eq!(OutputDir::new(&named, "/o", "a", "b").key, "save-to");
}

#[test]
fn what_a_serverapp_raises_and_logs_is_bounded_and_stripped() {
    // Invariant: a ServerApp's 3 MB exception with terminal escapes, its hostile log lines and
    // output file names reach the status bounded and without control characters, so the status
    // stays far under the apiserver's object size limit and prints safely.
    let spec = spec();
    let s = submit(&spec, &FlowerRunStatus::default(), vec![], 1, 0);
    let mut failed = listed(1, "finished:failed", "h");
    failed.details = format!("\u{1b}]0;owned\u{7}{}\u{1b}[2J", "x".repeat(3 << 20));
    let d = decide(&s, &facts(&spec, vec![failed], 5));
    let details = d.status.details.clone().unwrap();
    assert!(
        details.len() < crate::core::text::MAX_DETAILS + 100,
        "{}",
        details.len()
    );
    assert!(!details.contains('\u{1b}') && !details.contains('\u{7}'));
    let message = &condition(&d.status, RUN_FAILED).unwrap().message;
    assert!(message.len() < crate::core::text::MAX_DETAILS + 200);
    assert!(
        d.events
            .iter()
            .all(|e| e.message.len() < crate::core::text::MAX_DETAILS + 200)
    );
    let serialized = serde_json::to_vec(&d.status).unwrap();
    assert!(serialized.len() < 16 << 10, "{} bytes", serialized.len());

    let mut logged = FlowerRunStatus::default();
    add_log(
        &mut logged,
        &format!(
            "\u{1b}[31m[ROUND 1/3]\u{1b}[0m\rspoof\n{}\n",
            "y".repeat(1 << 20)
        ),
        1.0,
    );
    assert_eq!(logged.progress.as_ref().map(|p| p.current), Some(1));
    assert!(
        logged.log_tail.iter().all(
            |l| !l.contains(['\u{1b}', '\r']) && l.len() < crate::core::text::MAX_LOG_LINE + 40
        )
    );

    let mut outputs = FlowerRunStatus::default();
    record_outputs(
        &mut outputs,
        Ok(vec![flower_addon_crds::run::RunOutput {
            path: format!("a\u{1b}[2Jb{}", "z".repeat(10_000)),
            size: 1,
            sha256: "00".into(),
        }]),
        at(1),
    );
    let path = &outputs.outputs[0].path;
    assert!(path.starts_with("ab") && path.len() < crate::core::text::MAX_OUTPUT_PATH + 40);
}

#[test]
fn outputs_over_the_size_limit_end_with_a_condition_and_no_retry() {
    // Invariant: a run whose outputs are over the Federation's limit gets OutputsListed=False
    // (OutputsOverQuota) with the message, is not listed again, and keeps no file list.
    let mut status = FlowerRunStatus::default();
    let retry = record_outputs(
        &mut status,
        Err(OutputsFailure::OverQuota(
            "8796093022210 bytes, more than 1Gi".into(),
        )),
        at(30),
    );
    assert_eq!(retry, None);
    assert!(status.outputs_listed_at.is_some());
    assert!(status.outputs.is_empty());
    assert!(is(
        &status,
        OUTPUTS_LISTED,
        "False",
        reason::OUTPUTS_OVER_QUOTA
    ));
    assert!(status.details.unwrap().contains("more than 1Gi"));
}

// === SuperNode restarts after a run that ended without completing ===

fn ended(run_id: u64, status: &str, finished_at: &str) -> ListedRun {
    ListedRun {
        finished_at: finished_at.into(),
        ..listed(run_id, status, "h")
    }
}

#[test]
fn a_run_that_ended_without_completing_restarts_the_supernodes_once_nothing_runs() {
    // Invariant: the latest stopped or failed run asks for one restart, after the runs still
    // going end; a completed run asks for none; the restart done is not asked for again.
    let runs = vec![
        ended(9, "finished:completed", "2026-12-06T08:00:09+00:00"),
        ended(3, "finished:failed", "2026-12-06T08:00:03+00:00"),
        ended(5, "finished:stopped", "2026-12-06T08:00:05+00:00"),
    ];
    assert_eq!(
        restart_after(&runs, None),
        Restart::Due {
            after: 5,
            status: "finished:stopped".into()
        }
    );
    assert_eq!(restart_after(&runs, Some(5)), Restart::None);
    assert_eq!(restart_after(&runs, Some(3)), restart_after(&runs, None));
    let mut going = runs.clone();
    going.push(listed(11, "running", "h"));
    going.push(listed(12, "pending", "h"));
    assert_eq!(
        restart_after(&going, Some(3)),
        Restart::Waiting {
            after: 5,
            status: "finished:stopped".into(),
            active: vec![11, 12]
        }
    );
    assert_eq!(
        restart_after(&[ended(9, "finished:completed", "x")], None),
        Restart::None
    );
    assert_eq!(restart_after(&[], None), Restart::None);
}

#[test]
fn a_run_waits_for_the_supernodes_restart_before_it_is_submitted() {
    // A new run (or a retry) is not sent to SuperNodes that may be wedged: it waits, saying so,
    // and is submitted once the restart is no longer asked for.
    let s = spec();
    let runs = vec![ended(5, "finished:stopped", "2026-12-06T08:00:05+00:00")];
    for restart in [
        restart_after(&runs, None),
        Restart::Waiting {
            after: 5,
            status: "finished:stopped".into(),
            active: vec![11],
        },
    ] {
        let mut f = facts(&s, runs.clone(), 100);
        f.restart = restart;
        let d = decide(&FlowerRunStatus::default(), &f);
        assert_eq!(d.action, Action::Nothing);
        assert!(
            is(
                &d.status,
                RUN_SUBMITTED,
                "False",
                reason::SUPERNODES_RESTARTING
            ),
            "{:?}",
            d.status.conditions
        );
        assert!(
            d.status
                .details
                .unwrap()
                .contains("Flower run 5 ended finished:stopped")
        );
        assert_eq!(d.requeue, Some(SUPERNODES_POLL));
    }
    let f = facts(&s, runs, 100);
    assert_eq!(
        decide(&FlowerRunStatus::default(), &f).action,
        Action::Submit
    );
}

#[test]
fn back_from_a_restart_a_run_waits_for_every_supernode_to_reach_the_superlink_again() {
    // A restarted SuperNode's old session stays listed online (and counted ready) for up to
    // 60 s; a message for it then fails `Node Unavailable`. So a run that waited for a restart
    // is sent only once every SuperNode listed online reached the SuperLink since it saw them
    // back.
    let s = spec();
    let mut f = facts(&s, Vec::new(), 100);
    f.restart = Restart::Rolling("its SuperNodes are restarting: cluster s1: 2/3 ready".into());
    let rolling = decide(&FlowerRunStatus::default(), &f);
    assert!(is(
        &rolling.status,
        RUN_SUBMITTED,
        "False",
        reason::SUPERNODES_RESTARTING
    ));
    assert!(
        rolling
            .status
            .details
            .as_deref()
            .unwrap()
            .contains("2/3 ready")
    );
    assert_eq!(rolling.action, Action::Nothing);

    // Back (at 110 s): an old session last heard of 30 s before is still listed.
    let mut f = facts(&s, Vec::new(), 110);
    f.supernodes = SuperNodesState::NotAsked;
    let back = decide(&rolling.status, &f);
    assert_eq!(back.status.supernodes_restarted_at, Some(Time(at(110))));
    assert_eq!(back.action, Action::Nothing);
    assert!(needs_supernodes(&back.status, false, false));
    let mut f = facts(&s, Vec::new(), 115);
    f.supernodes = SuperNodesState::Online(vec![
        (1, Some(Duration::from_secs(2))),
        (2, Some(Duration::from_secs(35))),
    ]);
    let old_session = decide(&back.status, &f);
    assert_eq!(old_session.action, Action::Nothing);
    assert!(is(
        &old_session.status,
        RUN_SUBMITTED,
        "False",
        reason::SUPERNODES_NOT_SERVING
    ));
    assert!(
        old_session
            .status
            .details
            .as_deref()
            .unwrap()
            .contains("restarted the Federation's SuperNodes"),
        "{:?}",
        old_session.status.details
    );
    // Every one heard of since: submitted, and the mark of the restart goes.
    let mut f = facts(&s, Vec::new(), 150);
    f.supernodes = SuperNodesState::Online(vec![
        (1, Some(Duration::from_secs(3))),
        (2, Some(Duration::from_secs(10))),
    ]);
    let sent = decide(&old_session.status, &f);
    assert_eq!(sent.action, Action::Submit);
    let recorded = submitted(&sent.status, 42, at(151));
    assert_eq!(recorded.supernodes_restarted_at, None);
}

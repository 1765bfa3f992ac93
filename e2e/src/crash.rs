//! A standalone hub SIGKILLed around a FlowerRun's submission: where to aim a kill, where it
//! fell (by what the killed hub logged and stored), and what must hold after each one: exactly
//! one Flower run per attempt of that FlowerRun (none sent twice, none lost), all finished.
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rand::Rng;
use serde_json::Value;

/// How long the hub pauses in each window of a submission (the hub's
/// `FLOWER_HUB_TEST_SUBMISSION_PAUSE_MS`), so that a kill can fall inside it.
pub const PAUSE_MS: u64 = 1500;

/// How many kills a crash-window test makes: `FLOWER_ADDON_CRASH_KILLS`, else `default`.
pub fn kills(default: usize) -> usize {
    std::env::var("FLOWER_ADDON_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Kill `i`'s aim, in turn: just after the pending submission is stored, as soon as `StartRun`
/// is sent, inside the pause after Flower's answer, or anywhere in the whole submission. The
/// hub log line to wait for, and how long to wait after it before the kill.
pub fn aim(i: usize, rng: &mut impl Rng) -> (&'static str, Duration) {
    let pause = PAUSE_MS;
    let (marker, ms) = match i % 4 {
        0 => ("submission: pending stored", rng.random_range(0..pause)),
        1 => ("submission: sending", 0),
        2 => ("submission: answered", rng.random_range(0..pause)),
        _ => ("submission: pending stored", rng.random_range(0..3 * pause)),
    };
    (marker, Duration::from_millis(ms))
}

/// Whether the hub `log` has a line with `what` about FlowerRun `default/run` (the run's name
/// ends the line, as in the submission steps, or is followed by more fields, as in events).
pub fn logged(log: &str, what: &str, run: &str) -> bool {
    let name = format!("default/{run}");
    log.lines().any(|l| {
        l.contains(what)
            && l.match_indices(&name).any(|(at, _)| {
                l[at + name.len()..]
                    .chars()
                    .next()
                    .is_none_or(char::is_whitespace)
            })
    })
}

/// Where a kill fell in FlowerRun `run`'s submission, by the killed hub's `log` and the run's
/// `stored` state file (`runs/default/<run>.json`, null when there was none).
pub fn window(log: &str, stored: &Value, run: &str) -> &'static str {
    if stored["status"]["runId"].is_string() || stored["status"]["runId"].is_u64() {
        "after the status write"
    } else if logged(log, "submission: answered", run) {
        "Flower answered, status not written"
    } else if logged(log, "submission: sending", run) {
        "StartRun in flight"
    } else if logged(log, "submission: pending stored", run) {
        "pending stored, StartRun not sent"
    } else {
        "before the submission"
    }
}

/// SIGKILLs `hub` (state directory `state`) and waits for it to exit and for nothing of `state`
/// to be left running (its guard ends them all). Returns where the kill fell in FlowerRun
/// `run`'s submission, by the killed hub's `log` and the run's stored state.
pub fn kill(
    hub: &mut crate::process::Proc,
    state: &Path,
    run: &str,
    log: impl Fn() -> String,
) -> Result<&'static str> {
    use crate::harness::{Wait, processes_of};
    hub.signal(nix::sys::signal::Signal::SIGKILL)?;
    Wait::new("the killed hub to exit", Duration::from_secs(10))
        .every(Duration::from_millis(20))
        .until_blocking(|| Ok(hub.exited().is_some()))?;
    let stored: Value = std::fs::read(state.join(format!("runs/default/{run}.json")))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let window = window(&log(), &stored, run);
    Wait::new(
        "no process of the killed hub's state directory",
        Duration::from_secs(10),
    )
    .every(Duration::from_millis(100))
    .detail(|| format!("{:?}", processes_of(state)))
    .until_blocking(|| Ok(processes_of(state).is_empty()))?;
    Ok(window)
}

/// What the kills of one test came to.
#[derive(Debug, Default)]
pub struct Tally {
    /// Kills per window.
    pub hits: BTreeMap<&'static str, usize>,
    /// Runs the restarted hub adopted (found in the SuperLink's list, not sent again).
    pub adopted: usize,
    /// Runs sent again after a kill while `StartRun` was in flight or just answered.
    pub resubmitted: usize,
    /// Runs that completed on a later attempt.
    pub retried: usize,
}

impl Tally {
    /// Checks FlowerRun `name` after a kill in `window`, ended as `done` (its status), with
    /// the SuperLink's runs `before` the FlowerRun was written and `after` it ended, and counts
    /// it; `hub_log` is the restarted hub's. Returns the attempts it took.
    pub fn check(
        &mut self,
        name: &str,
        window: &'static str,
        done: &Value,
        before: &BTreeMap<u64, String>,
        after: &BTreeMap<u64, String>,
        hub_log: &str,
    ) -> Result<u64> {
        *self.hits.entry(window).or_default() += 1;
        let complete = done["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Complete" && c["status"] == "True")
        });
        ensure!(
            complete,
            "{name} (killed: {window}) did not complete: {done:#}"
        );
        let new: Vec<u64> = after
            .keys()
            .filter(|id| !before.contains_key(id))
            .copied()
            .collect();
        let attempts = done["attempts"].as_u64().unwrap_or(0);
        let run_id: u64 = done["runId"]
            .as_str()
            .and_then(|id| id.parse().ok())
            .or_else(|| done["runId"].as_u64())
            .context("runId of the completed run")?;
        ensure!(
            new.len() as u64 == attempts && new.contains(&run_id),
            "{name} (killed: {window}): {} Flower run(s) started ({new:?}) for {attempts} attempt(s), the run's id {run_id}: a submission was sent twice or lost; SuperLink runs {after:?}",
            new.len()
        );
        ensure!(
            new.iter().all(|id| after[id].starts_with("finished")),
            "{name} (killed: {window}): a Flower run of it is still going: {after:?}"
        );
        if logged(hub_log, "Adopted", name) {
            self.adopted += 1;
        } else if matches!(
            window,
            "StartRun in flight" | "Flower answered, status not written"
        ) {
            self.resubmitted += 1;
        }
        if attempts > 1 {
            self.retried += 1;
        }
        Ok(attempts)
    }

    /// The lines of `hub_log` about FlowerRun `default/run` (the last `n`), for a kill that
    /// took more than one attempt: why the first failed.
    pub fn run_lines(hub_log: &str, run: &str, n: usize) -> String {
        let suffix = format!("default/{run}");
        let lines: Vec<&str> = hub_log.lines().filter(|l| l.contains(&suffix)).collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// One line for the test's output.
    pub fn summary(&self, kills: usize, took: Duration) -> String {
        format!(
            "{kills} hub kills around submissions in {:.1}s: windows hit {:?}; {} adopted by the restarted hub, {} sent again after a kill in flight, {} completed on a retry; 0 sent twice, 0 lost",
            took.as_secs_f64(),
            self.hits,
            self.adopted,
            self.resubmitted,
            self.retried
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_is_placed_by_what_the_hub_logged_and_stored() {
        let log = "x submission: pending stored default/a\nx submission: sending default/a\n";
        assert_eq!(window(log, &Value::Null, "a"), "StartRun in flight");
        assert_eq!(window(log, &Value::Null, "b"), "before the submission");
        let stored = serde_json::json!({"status": {"runId": "7"}});
        assert_eq!(window(log, &stored, "a"), "after the status write");
    }

    #[test]
    fn a_run_is_found_in_the_log_by_its_whole_name() {
        let log = "x INFO Adopted: found Flower run 3 run=default/crash01-run reason=\"Adopted\"\n";
        assert!(logged(log, "Adopted", "crash01-run"));
        assert!(!logged(log, "Adopted", "crash01"));
        assert!(!logged(log, "Submitted", "crash01-run"));
    }

    #[test]
    fn a_run_sent_twice_or_lost_fails_the_check() {
        let done = serde_json::json!({
            "attempts": 1, "runId": "2",
            "conditions": [{"type": "Complete", "status": "True"}]
        });
        let before: BTreeMap<u64, String> = [(1, "finished:completed".into())].into();
        let once: BTreeMap<u64, String> = [
            (1, "finished:completed".into()),
            (2, "finished:completed".into()),
        ]
        .into();
        let mut tally = Tally::default();
        assert_eq!(tally.check("a", "x", &done, &before, &once, "").unwrap(), 1);
        let mut twice = once.clone();
        twice.insert(3, "finished:completed".into());
        assert!(tally.check("a", "x", &done, &before, &twice, "").is_err());
        assert!(tally.check("a", "x", &done, &before, &before, "").is_err());
        let mut going = once.clone();
        going.insert(2, "running".into());
        assert!(tally.check("a", "x", &done, &before, &going, "").is_err());
    }
}

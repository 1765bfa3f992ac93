//! Flower's stop defect, and the hub's remedy: a SuperNode whose ClientApp was working on a
//! message of a run that then ended without completing (stopped, or failed: a ServerApp that
//! raised at a round timeout) has its reply refused by the SuperLink (`Run ID … is not in RUNNING
//! status`, or a 401 on `push-task-output`) and waits for it for ever (Flower 1.42's
//! `_push_messages`): still heartbeating, so listed online, it takes no further message, and every
//! later run gets one reply fewer from it. Nothing Flower exposes tells such a SuperNode from a
//! healthy one, so after every run that ended without completing the hub restarts the
//! Federation's SuperNodes (keys and identities kept) once no run of the SuperLink is pending,
//! starting or running, and runs wait until that restart is done.
use super::ListedRun;

/// Whether a Federation's SuperNodes are to be restarted, from its SuperLink's run list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Restart {
    /// No: no run ended without completing since the last restart.
    None,
    /// After Flower run `after` (`status` is how it ended), once the `active` runs end.
    Waiting {
        /// The run that ended without completing.
        after: u64,
        /// How it ended (`finished:stopped`, `finished:failed`).
        status: String,
        /// Runs still pending, starting or running (at most 5 listed).
        active: Vec<u64>,
    },
    /// Now, after Flower run `after`.
    Due {
        /// The run that ended without completing.
        after: u64,
        /// How it ended.
        status: String,
    },
    /// Under way: not every cluster reports its pools back under the Federation's restart mark
    /// (what is missing; `core::status::restart_pending`).
    Rolling(String),
}

/// Whether the SuperNodes are to be restarted: the latest run that ended without completing
/// (by Flower's `finished_at`) is not `done` (the run after which the hub last restarted them).
pub fn restart_after(runs: &[ListedRun], done: Option<u64>) -> Restart {
    let Some(latest) = runs
        .iter()
        .filter(|r| r.status.starts_with("finished:") && r.status != "finished:completed")
        .max_by(|a, b| (a.finished_at.as_str(), a.run_id).cmp(&(b.finished_at.as_str(), b.run_id)))
    else {
        return Restart::None;
    };
    if Some(latest.run_id) == done {
        return Restart::None;
    }
    let active: Vec<u64> = runs
        .iter()
        .filter(|r| matches!(r.status.as_str(), "pending" | "starting" | "running"))
        .map(|r| r.run_id)
        .take(5)
        .collect();
    if active.is_empty() {
        Restart::Due {
            after: latest.run_id,
            status: latest.status.clone(),
        }
    } else {
        Restart::Waiting {
            after: latest.run_id,
            status: latest.status.clone(),
            active,
        }
    }
}

impl Restart {
    /// Why a run not yet submitted waits, when it does.
    pub fn waiting_message(&self, federation: &str) -> Option<String> {
        match self {
            Restart::None => None,
            Restart::Waiting {
                after,
                status,
                active,
            } => Some(format!(
                "Flower run {after} ended {status}: Federation {federation}'s SuperNodes are \
                 restarted (a SuperNode working on its messages takes no other) once Flower \
                 run(s) {} end; the run is submitted after that",
                active
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Restart::Due { after, status } => Some(format!(
                "Flower run {after} ended {status}: restarting Federation {federation}'s \
                 SuperNodes (keys kept; a SuperNode working on its messages takes no other); \
                 the run is submitted when they are back"
            )),
            Restart::Rolling(why) => Some(format!(
                "Federation {federation}: {why}; the run is submitted when they are back"
            )),
        }
    }
}

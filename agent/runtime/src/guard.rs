//! `guard`: the small process every supervised program runs under, so that no program of ours
//! outlives the hub or agent that started it.
//!
//! A supervisor ([`crate::supervise`]) asks the kernel to SIGTERM its child when it dies, but a
//! SuperNode killed that way does not end its `flwr-clientapp` processes, and a child of a
//! child is re-parented to PID 1 and runs on for ever. So each program is started by
//! `flower-agent guard NAME` (or `flower-hub guard NAME`), which
//!
//! - becomes a *child subreaper*: whatever its program leaves behind is re-parented to the guard,
//!   not to PID 1;
//! - is SIGTERMed by the kernel when its supervisor dies (and checks its parent besides, in case
//!   the supervisor died before it could ask), and by its supervisor to stop: the guard alone,
//!   which passes the SIGTERM on once (Flower's SuperNode exits without deactivating on a
//!   second one);
//! - starts the program (its argv arrives in [`EXEC_ENV`], so the guard's own command line
//!   names only the supervised process and `ps`/`pgrep` find the program once) and waits;
//! - when the program exits, when asked to stop, or when its supervisor died, ends everything
//!   left: SIGTERM to its process group and its children, then SIGKILL after a grace
//!   ([`ORPHAN_GRACE`] when the supervisor died: nothing is left 5 s after a SIGKILLed hub or
//!   agent; [`STOP_GRACE`] otherwise), and exits as its program did.
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// The program and its arguments, as a JSON array of strings (not on the command line).
pub const EXEC_ENV: &str = "FLOWER_ADDON_GUARD_EXEC";
/// The pid of the supervisor that started the guard.
pub const PARENT_ENV: &str = "FLOWER_ADDON_GUARD_PARENT";
/// Set (to a uid) by a supervisor whose sandbox confines its program
/// ([`crate::sandbox::Sandbox::confine`]): the guard starts the program as the first process of a
/// PID namespace of its own, with its own `/proc`, as that uid without any privilege.
pub const RUN_AS_ENV: &str = "FLOWER_ADDON_GUARD_RUN_AS";
/// How long what is left gets between SIGTERM and SIGKILL once the supervisor died.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(3);
/// … and on a normal stop or after the program exited (the supervisor itself SIGKILLs the
/// guard's group 5 s after its SIGTERM).
pub const STOP_GRACE: Duration = Duration::from_millis(4_500);
/// How often the guard looks at its parent and its children while waiting.
const TICK: Duration = Duration::from_millis(100);

/// Why the guard ended its program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The program exited by itself.
    Exited,
    /// A stop was asked (SIGTERM, SIGINT, SIGHUP, SIGQUIT).
    Stopped(Signal),
    /// The supervisor died.
    Orphaned,
}

/// Runs the guard for the supervised process `name`; returns only after everything it started
/// is gone.
pub fn run(name: &str) -> ExitCode {
    match guard(name) {
        Ok(code) => code,
        Err(why) => {
            eprintln!("flower-addon guard {name}: {why}");
            ExitCode::from(1)
        }
    }
}

fn guard(name: &str) -> Result<ExitCode, String> {
    let argv: Vec<String> = std::env::var(EXEC_ENV)
        .map_err(|_| format!("{EXEC_ENV} is not set: the guard runs only under a supervisor"))
        .and_then(|json| {
            serde_json::from_str(&json).map_err(|e| format!("{EXEC_ENV} is not a JSON list: {e}"))
        })?;
    let Some((program, args)) = argv.split_first() else {
        return Err(format!("{EXEC_ENV} names no program"));
    };
    let parent: i32 = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("{PARENT_ENV} is not a pid"))?;
    // A process group of its own (a supervisor starts it as one already): the group the guard
    // ends is only ever what it started.
    let me = nix::unistd::getpid();
    if nix::unistd::getpgrp() != me {
        nix::unistd::setpgid(me, me).map_err(|e| format!("own process group: {e}"))?;
    }
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| format!("subreaper: {e}"))?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(|e| format!("pdeathsig: {e}"))?;
    if nix::unistd::getppid().as_raw() != parent {
        return Err("the supervisor is gone already; not starting".into());
    }
    let mut signals = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        signals.add(s);
    }
    // Blocked before any thread exists, so every thread has them blocked and only the waiter
    // below takes them.
    signals
        .thread_block()
        .map_err(|e| format!("blocking signals: {e}"))?;
    // The waiter starts before a PID namespace for the program exists: after it, the guard can
    // no longer start threads (they would have to share a PID namespace with its children).
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        while let Ok(signal) = signals.wait() {
            if tx.send(signal).is_err() {
                return;
            }
        }
    });
    let run_as = match std::env::var(RUN_AS_ENV) {
        Ok(uid) => Some(
            uid.parse::<u32>()
                .map_err(|_| format!("{RUN_AS_ENV}={uid:?} is not a uid"))?,
        ),
        Err(_) => None,
    };
    if run_as.is_some() {
        // The program is the first process of the new namespace: it and what it starts see
        // only each other. The guard stays outside, able to end them all.
        #[allow(unsafe_code)]
        // SAFETY: a plain system call; the guard forks once, after it.
        let result = unsafe { nix::libc::unshare(nix::libc::CLONE_NEWPID) };
        if result != 0 {
            return Err(format!(
                "PID namespace: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    let child = spawn(program, args, run_as)?;
    let mut status = None;
    let end = loop {
        reap(child, &mut status);
        if status.is_some() {
            break End::Exited;
        }
        if nix::unistd::getppid().as_raw() != parent {
            break End::Orphaned;
        }
        match rx.recv_timeout(TICK) {
            Ok(Signal::SIGCHLD) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Ok(signal) => {
                // pdeathsig is a SIGTERM too: tell the two apart by the parent.
                break if nix::unistd::getppid().as_raw() == parent {
                    End::Stopped(signal)
                } else {
                    End::Orphaned
                };
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break End::Stopped(Signal::SIGTERM),
        }
    };
    let grace = if end == End::Orphaned {
        ORPHAN_GRACE
    } else {
        STOP_GRACE
    };
    end_all(child, grace, &mut status);
    if end != End::Exited {
        eprintln!("flower-addon guard {name}: {end:?}; ended {program} and everything it started");
    }
    Ok(exit_as(status))
}

#[allow(unsafe_code)]
fn spawn(program: &str, args: &[String], run_as: Option<u32>) -> Result<Pid, String> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .env_remove(EXEC_ENV)
        .env_remove(PARENT_ENV)
        .env_remove(RUN_AS_ENV);
    // SAFETY: between fork and exec only async-signal-safe calls (sigprocmask, prctl, unshare,
    // mount, set*id); nothing is allocated.
    unsafe {
        cmd.pre_exec(move || {
            SigSet::empty()
                .thread_set_mask()
                .map_err(std::io::Error::from)?;
            if let Some(uid) = run_as {
                crate::sandbox::own_proc()?;
                crate::sandbox::drop_privileges(uid)?;
            }
            // Should the guard itself be SIGKILLed, its program goes with it.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    let pid = Pid::from_raw(i32::try_from(child.id()).map_err(|e| e.to_string())?);
    // Reaped with waitpid below, not through the handle.
    std::mem::forget(child);
    Ok(pid)
}

/// Reaps every child that exited; the program's status goes to `status`. True when no child
/// is left.
fn reap(program: Pid, status: &mut Option<WaitStatus>) -> bool {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return false,
            Ok(s) => {
                if s.pid() == Some(program)
                    && matches!(s, WaitStatus::Exited(..) | WaitStatus::Signaled(..))
                {
                    *status = Some(s);
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return true,
        }
    }
}

/// Processes to end: the members of the guard's process group and its own children (orphans
/// re-parented to it may have left the group), but for the guard itself.
fn leftovers() -> Vec<Pid> {
    let me = std::process::id();
    let group = nix::unistd::getpgrp().as_raw();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (ppid, pgrp) = parent_and_group(&stat)?;
            (pgrp == group || ppid == me as i32).then_some(Pid::from_raw(pid as i32))
        })
        .collect()
}

/// `(ppid, pgrp)` from a `/proc/PID/stat` line (the command may hold spaces and parentheses:
/// the fields follow its last `)`).
fn parent_and_group(stat: &str) -> Option<(i32, i32)> {
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace();
    let _state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((ppid, pgrp))
}

/// SIGTERM to everything left (once: a second SIGTERM makes Flower's SuperNode exit without
/// deactivating), up to `grace` for it to go, then SIGKILL; reaps them all.
fn end_all(program: Pid, grace: Duration, status: &mut Option<WaitStatus>) {
    let signal_all = |signal: Signal| {
        for pid in leftovers() {
            let _ = nix::sys::signal::kill(pid, signal);
        }
    };
    signal_all(Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if reap(program, status) && leftovers().is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGKILLed until nothing is left (a process forking meanwhile is caught on the next turn).
    for _ in 0..50 {
        signal_all(Signal::SIGKILL);
        std::thread::sleep(Duration::from_millis(20));
        if reap(program, status) && leftovers().is_empty() {
            return;
        }
    }
}

/// The guard's exit: the program's code; killed by a signal, the same signal (raised on the
/// guard itself, so the supervisor sees what the program got); never started or never reaped, 1.
fn exit_as(status: Option<WaitStatus>) -> ExitCode {
    match status {
        Some(WaitStatus::Exited(_, code)) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Some(WaitStatus::Signaled(_, signal, _)) => {
            let mut only = SigSet::empty();
            only.add(signal);
            #[allow(unsafe_code)]
            // SAFETY: restoring the default action of one signal; no handler is installed.
            unsafe {
                let _ = nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigDfl);
            }
            let _ = only.thread_unblock();
            let _ = nix::sys::signal::raise(signal);
            ExitCode::from(128 + signal as u8)
        }
        _ => ExitCode::from(1),
    }
}

/// What a supervisor runs instead of `program args…` to have it guarded: `guard_program guard
/// NAME`, with the program's argv in [`EXEC_ENV`] and the supervisor's pid in [`PARENT_ENV`].
pub fn wrap(
    guard_program: &std::path::Path,
    name: &str,
    program: &std::path::Path,
    args: &[String],
) -> (std::path::PathBuf, Vec<String>, Vec<(String, String)>) {
    let argv: Vec<String> = std::iter::once(program.display().to_string())
        .chain(args.iter().cloned())
        .collect();
    let json = serde_json::to_string(&argv).unwrap_or_else(|_| "[]".to_owned());
    (
        guard_program.to_path_buf(),
        vec!["guard".to_owned(), name.to_owned()],
        vec![
            (EXEC_ENV.to_owned(), json),
            (PARENT_ENV.to_owned(), std::process::id().to_string()),
        ],
    )
}

/// Arguments of the hidden `guard` subcommand of both binaries.
#[derive(clap::Args, Debug)]
pub struct GuardArgs {
    /// The supervised process (for `ps` and messages).
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_parent_and_group() {
        // Invariant: a command with spaces and parentheses does not shift the fields.
        assert_eq!(
            parent_and_group("1234 (flwr (client) app) S 77 1200 1200 0 -1"),
            Some((77, 1200))
        );
        assert_eq!(parent_and_group("garbage"), None);
    }
}

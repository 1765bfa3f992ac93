//! `flower-agent guard` with real processes: whatever a supervised program leaves behind —
//! children in its group, and grandchildren that left it with `setsid` — is ended when the
//! program exits, when the guard is stopped, and within 5 s when its supervisor is SIGKILLed;
//! the guard exits as its program did.
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flower_addon_agent::guard::{EXEC_ENV, PARENT_ENV};

const AGENT: &str = env!("CARGO_BIN_EXE_flower-agent");

/// Pids of live (non-zombie) `sleep MARKER…` processes (or, for a marker that is not a number,
/// of processes with an argument containing it).
fn alive_with(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        // The sleeps, or (with a marker that is not a number) any process naming it.
        let sleeping = args.first().is_some_and(|a| a == "sleep")
            && args.get(1).is_some_and(|a| a.starts_with(marker));
        let named = marker.parse::<f64>().is_err() && args.iter().any(|a| a.contains(marker));
        if !zombie && (sleeping || named) {
            out.push(pid);
        }
    }
    out
}

fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !ok() {
        assert!(
            t.elapsed() < limit,
            "{what}: not within {limit:?}\n{}",
            String::from_utf8_lossy(
                &Command::new("ps")
                    .args(["-eo", "pid,ppid,pgid,stat,args"])
                    .output()
                    .map(|o| o.stdout)
                    .unwrap_or_default()
            )
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    t.elapsed()
}

/// Waits until the program's two `sleep`s run (see [`script`]).
fn started(marker: &str) {
    wait_until(
        "the program and its children started",
        Duration::from_secs(10),
        || alive_with(marker).len() == 2,
    );
}

/// A marker no other run can share: `sleep` seconds made of `n` and this test process's pid.
fn marker(n: u32) -> String {
    format!("{n}{}.5", std::process::id())
}

/// A shell script as the program: it starts `sleep <marker>` in its group and one in a session
/// of its own, then runs `tail`.
fn script(marker: &str, tail: &str) -> String {
    format!(
        "sleep {marker} & setsid sleep {marker}1 & {tail}",
        marker = marker,
        tail = tail
    )
}

/// `flower-agent guard NAME` for `sh -c SCRIPT`, as the supervisor `parent` (this process unless
/// given) starts it.
fn guard(script: &str, parent: Option<u32>) -> Command {
    let mut cmd = Command::new(AGENT);
    cmd.args(["guard", "guard-under-test"])
        .env(
            EXEC_ENV,
            serde_json::to_string(&["/bin/sh", "-c", script]).unwrap(),
        )
        .env(
            PARENT_ENV,
            parent.unwrap_or_else(std::process::id).to_string(),
        )
        .stdin(Stdio::null());
    cmd
}

#[test]
fn what_an_exited_program_left_is_ended_and_its_code_kept() {
    // Invariant: the guard exits with its program's code only once the program's leftovers (in
    // its group, and in a session of their own) are gone.
    let marker = &marker(3001);
    let status = guard(&script(marker, "sleep 0.3; exit 7"), None)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(7));
    assert!(alive_with(marker).is_empty(), "{:?}", alive_with(marker));
}

#[test]
fn a_stopped_guard_ends_everything_and_exits_as_its_program() {
    // Invariant: SIGTERM to the guard reaches the program; a program that ignores it is SIGKILLed
    // after the stop grace; the guard then dies by the program's signal.
    let marker = &marker(3002);
    let mut child = guard(
        &script(marker, "trap '' TERM; while :; do sleep 0.1; done"),
        None,
    )
    .spawn()
    .unwrap();
    started(marker);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}");
    assert!(alive_with(marker).is_empty(), "{:?}", alive_with(marker));
}

#[test]
fn a_sigkilled_supervisor_leaves_nothing_within_five_seconds() {
    // Invariant: when the supervisor dies without a word (SIGKILL), the guard ends its program
    // and everything the program started, even a program that ignores SIGTERM, within 5 s.
    let marker = &marker(3003);
    let inner = script(marker, "trap '' TERM; while :; do sleep 0.1; done");
    let exec = serde_json::to_string(&["/bin/sh", "-c", inner.as_str()]).unwrap();
    // The supervisor: a shell that starts the guard with itself as the parent, then waits.
    let supervisor = Command::new("/bin/sh")
        .args([
            "-c",
            &format!("{PARENT_ENV}=$$ \"$0\" guard guard-of-{marker} & wait"),
            AGENT,
        ])
        .env(EXEC_ENV, exec)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    started(marker);
    let mut supervisor = supervisor;
    supervisor.kill().unwrap();
    let _ = supervisor.wait();
    let gone = wait_until(
        "everything of the killed supervisor gone",
        Duration::from_secs(5),
        || alive_with(marker).is_empty() && alive_with(&format!("guard-of-{marker}")).is_empty(),
    );
    eprintln!("gone {gone:?} after the supervisor's SIGKILL");
}

#[test]
fn a_guard_whose_supervisor_is_gone_starts_nothing() {
    // Invariant: a guard started for a supervisor that is not its parent (it died before the
    // guard ran) refuses to start the program.
    let marker = &marker(3004);
    let out = guard(&script(marker, "sleep 5"), Some(1)).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("supervisor is gone"));
    assert!(alive_with(marker).is_empty());
}

#[tokio::test]
async fn a_confined_program_runs_unprivileged_alone_in_its_namespaces() {
    // Invariant: supervised as root with a confining sandbox, the program runs as its directory's
    // own uid, with no capability and no_new_privs, as the first process of a PID namespace of
    // its own (it sees its own processes only and signals nothing outside), cannot mount, reads
    // nothing of the hidden state directory, and writes its own directory, which is its uid's;
    // its network namespace has the addresses asked for on its loopback and its own /etc/hosts.
    use flower_addon_agent::sandbox::{Network, Sandbox, confined_uid};
    use flower_addon_agent::supervise::{ProcessSpec, Supervised, guard_with};
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test confines as root does: run the suite as root (./test.sh does)"
    );
    guard_with(AGENT.into());
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let own = state.join("federations/team/fed");
    std::fs::create_dir_all(own.join("mnt")).unwrap();
    std::fs::write(state.join("ca.key"), "SECRET").unwrap();
    let hosts = own.join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n198.18.7.7 superlink.test\n").unwrap();
    let me = std::process::id();
    let script = format!(
        "echo uid=$(id -u) pid=$$ procs=$(ls /proc | grep -c '^[0-9]'); \
         grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; \
         cat {state}/ca.key || echo HIDDEN; \
         kill -0 {me} 2>/dev/null && echo SIGNALLED || echo NO_SIGNAL; \
         mount -t tmpfs x {own}/mnt 2>/dev/null && echo MOUNTED || echo NO_MOUNT; \
         echo W > {own}/written; echo HOME=$HOME; \
         grep -q '198.18.7.7 superlink.test' /etc/hosts && echo OWN_HOSTS; \
         grep -c '198.18.7.7' /proc/net/fib_trie | sed 's/^/ADDRESS_ROUTES=/'; \
         echo DONE; sleep 30",
        state = state.display(),
        own = own.display()
    );
    let log_file = dir.path().join("confined.log");
    let sup = Supervised::start(ProcessSpec {
        name: "confined".into(),
        program: "/bin/sh".into(),
        args: vec!["-c".into(), script],
        env: Default::default(),
        cwd: None,
        log_file: log_file.clone(),
        sandbox: Some(Sandbox {
            hide: state.clone(),
            keep: own.clone(),
            network: Some(Network {
                addresses: vec![std::net::Ipv4Addr::new(198, 18, 7, 7)],
                hosts: Some(hosts.clone()),
            }),
            confine: true,
        }),
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let log = loop {
        let log = std::fs::read_to_string(&log_file).unwrap_or_default();
        if log.contains("DONE") {
            break log;
        }
        assert!(
            Instant::now() < deadline,
            "no output: {log:?} {:?}",
            sup.state()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The program still runs under its guard: nothing failed on the way.
    let state = sup.state();
    assert_eq!(state.restarts, 0, "{state:?}\n{log}");
    assert!(state.pid.is_some(), "{state:?}\n{log}");
    sup.stop().await;
    let uid = confined_uid(&std::fs::canonicalize(&own).unwrap());
    let line = log
        .lines()
        .find(|l| l.starts_with("uid="))
        .unwrap_or_default();
    assert!(
        line.starts_with(&format!("uid={uid} pid=1 procs=")),
        "{log}"
    );
    let procs: u32 = line.rsplit('=').next().unwrap().parse().unwrap();
    assert!(procs <= 4, "sees {procs} processes: {log}");
    for expected in [
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "NoNewPrivs:\t1",
        "HIDDEN",
        "NO_SIGNAL",
        "NO_MOUNT",
        "OWN_HOSTS",
    ] {
        assert!(log.contains(expected), "{expected:?} not in {log}");
    }
    assert!(!log.contains("SECRET"), "{log}");
    assert!(
        !log.contains("ADDRESS_ROUTES=0") && log.contains("ADDRESS_ROUTES="),
        "the loopback lacks 198.18.7.7: {log}"
    );
    assert!(
        !std::fs::read_to_string("/etc/hosts")
            .unwrap_or_default()
            .contains("superlink.test"),
        "the host's /etc/hosts changed"
    );
    assert!(
        log.contains(&format!("HOME={}", own.canonicalize().unwrap().display())),
        "{log}"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(own.join("written")).unwrap().uid(), uid);
}

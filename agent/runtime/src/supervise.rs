//! Supervised child processes: started, logged to a file, restarted with capped exponential
//! backoff and jitter, and stopped with their whole process group (no orphans).
//!
//! The hub supervises its SuperLink with this, the process runtime its SuperNodes and SuperExecs.
use backon::{BackoffBuilder, ExponentialBuilder};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Environment for Flower processes: no telemetry, no update check, unbuffered output, and
/// `flower_bin` first on PATH (Flower starts its helpers — `flower-superexec`, `flwr-clientapp`,
/// `flwr-serverapp` — by bare name).
pub fn flower_env(flower_bin: Option<&std::path::Path>) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("FLWR_TELEMETRY_ENABLED".into(), "0".into());
    env.insert("FLWR_DISABLE_UPDATE_CHECK".into(), "1".into());
    env.insert("PYTHONUNBUFFERED".into(), "1".into());
    if let Some(dir) = flower_bin {
        let path = std::env::var("PATH").unwrap_or_default();
        env.insert("PATH".into(), format!("{}:{path}", dir.display()));
    }
    env
}

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSpec {
    /// Short name for logs (`supernode/fed/pool-0`).
    pub name: String,
    /// Program (a path, or a name looked up in `PATH`).
    pub program: PathBuf,
    /// Arguments, passed as they are (never through a shell).
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: BTreeMap<String, String>,
    /// Working directory.
    pub cwd: Option<PathBuf>,
    /// File that receives stdout and stderr (appended).
    pub log_file: PathBuf,
    /// A directory hidden from the process, but for one subdirectory ([`crate::sandbox`]).
    pub sandbox: Option<crate::sandbox::Sandbox>,
}

/// Observable state of a supervised process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessState {
    /// Pid of the running child, if one runs.
    pub pid: Option<u32>,
    /// How many times it was restarted.
    pub restarts: u32,
    /// Exit status of the last run (`exit 1`, `signal 9`), if any.
    pub last_exit: Option<String>,
    /// When the current child started.
    pub started_at: Option<Instant>,
}

/// A running supervisor. Dropping it stops the process too (best effort, without waiting).
pub struct Supervised {
    spec: ProcessSpec,
    state: Arc<Mutex<ProcessState>>,
    stop_tx: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

/// The binary whose `guard` subcommand every supervised program runs under ([`crate::guard`]);
/// set once by `flower-agent` and `flower-hub` at start ([`guard_with`]). Unset (a library
/// user, a test), programs run without a guard: they are SIGTERMed when the supervisor dies, but
/// what they start is not.
static GUARD: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Runs every program supervised from now on under `program guard` ([`crate::guard`]):
/// `program` is the running `flower-agent` or `flower-hub` itself.
pub fn guard_with(program: PathBuf) {
    let _ = GUARD.set(program);
}

/// A run that lasted this long resets the backoff.
const STABLE_AFTER: Duration = Duration::from_secs(30);
/// How long a process gets to exit after SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

impl Supervised {
    /// Starts supervising `spec`. Must be called from within a Tokio runtime.
    pub fn start(spec: ProcessSpec) -> Self {
        let state = Arc::new(Mutex::new(ProcessState::default()));
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(supervise(spec.clone(), state.clone(), stop_rx));
        Self {
            spec,
            state,
            stop_tx,
            task: Some(task),
        }
    }

    /// The spec this supervisor runs.
    pub fn spec(&self) -> &ProcessSpec {
        &self.spec
    }

    /// Current state.
    pub fn state(&self) -> ProcessState {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stops the process group (SIGTERM, then SIGKILL after a grace period) and waits.
    pub async fn stop(mut self) {
        let _ = self.stop_tx.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        let _ = self.stop_tx.send(true);
        if self.task.is_some()
            && let Ok(state) = self.state.lock()
            && let Some(pid) = state.pid
        {
            kill_group(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

async fn supervise(
    spec: ProcessSpec,
    state: Arc<Mutex<ProcessState>>,
    mut stop_rx: watch::Receiver<bool>,
) {
    let builder = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times();
    let mut backoff = builder.build();
    let metrics = crate::metrics::agent();
    let program = crate::metrics::program_label(&spec.program, &spec.args);
    loop {
        if *stop_rx.borrow() {
            return;
        }
        let started = Instant::now();
        match spawn(&spec) {
            Ok(mut child) => {
                let pid = child.id();
                tracing::info!(process = %spec.name, pid, "started");
                if let Ok(mut s) = state.lock() {
                    s.pid = pid;
                    s.started_at = Some(started);
                }
                metrics.supervised.get_or_create(&program).inc();
                let exit = tokio::select! {
                    status = child.wait() => Some(status),
                    _ = stop_rx.changed() => None,
                };
                metrics.supervised.get_or_create(&program).dec();
                match exit {
                    Some(status) => {
                        let text = match status {
                            Ok(st) => describe_exit(st),
                            Err(err) => format!("wait failed: {err}"),
                        };
                        tracing::warn!(process = %spec.name, exit = %text, "exited; restarting");
                        metrics.restarts.get_or_create(&program).inc();
                        if let Ok(mut s) = state.lock() {
                            s.pid = None;
                            s.last_exit = Some(text);
                            s.restarts += 1;
                        }
                    }
                    None => {
                        terminate(&mut child).await;
                        if let Ok(mut s) = state.lock() {
                            s.pid = None;
                            s.last_exit = Some("stopped".into());
                        }
                        tracing::info!(process = %spec.name, "stopped");
                        return;
                    }
                }
            }
            Err(err) => {
                tracing::error!(process = %spec.name, program = %spec.program.display(), %err, "cannot start");
                metrics.restarts.get_or_create(&program).inc();
                if let Ok(mut s) = state.lock() {
                    s.last_exit = Some(format!("cannot start: {err}"));
                    s.restarts += 1;
                }
            }
        }
        if started.elapsed() >= STABLE_AFTER {
            backoff = builder.build();
        }
        let delay = backoff.next().unwrap_or(Duration::from_secs(30));
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop_rx.changed() => return,
        }
    }
}

fn spawn(spec: &ProcessSpec) -> std::io::Result<Child> {
    if let Some(dir) = spec.log_file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log_file)?;
    // What a confined child must still read: the program (and its interpreter, its Python), a
    // program it is given to start (`netns-bridge … -- flower-superlink`), and the guard.
    let prepared = match &spec.sandbox {
        Some(sandbox) => {
            let mut reach = crate::sandbox::reach_for(&resolve(&spec.program, &spec.env));
            for arg in spec.args.iter().map(std::path::Path::new) {
                if arg.is_absolute() && arg.is_file() {
                    reach.extend(crate::sandbox::reach_for(arg));
                }
            }
            if let Some(guard) = GUARD.get() {
                reach.extend(crate::sandbox::reach_for(guard));
            }
            let mut prepared = sandbox.prepare(&reach)?;
            if GUARD.get().is_some() {
                prepared.leave_privileges_to_the_guard();
            }
            Some((prepared, sandbox.keep.clone()))
        }
        None => None,
    };
    let mut cmd = match GUARD.get() {
        Some(guard) => {
            let (program, args, env) =
                crate::guard::wrap(guard, &spec.name, &spec.program, &spec.args);
            let mut cmd = Command::new(program);
            cmd.args(args).envs(env);
            cmd
        }
        None => {
            let mut cmd = Command::new(&spec.program);
            cmd.args(&spec.args);
            cmd
        }
    };
    cmd.envs(&spec.env)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    die_with_parent(&mut cmd);
    if let Some((prepared, keep)) = prepared {
        if let Some(uid) = prepared.run_as() {
            // Its home is its own directory (Python and Flower write under $HOME).
            cmd.env("HOME", keep);
            if GUARD.get().is_some() {
                cmd.env(crate::guard::RUN_AS_ENV, uid.to_string());
            }
        }
        enter_sandbox(&mut cmd, prepared);
    }
    cmd.spawn()
}

/// `program` as the child's `PATH` finds it (`env`'s over the supervisor's).
fn resolve(program: &std::path::Path, env: &BTreeMap<String, String>) -> PathBuf {
    if program.components().count() > 1 {
        return program.to_path_buf();
    }
    let path = env
        .get("PATH")
        .cloned()
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| program.to_path_buf())
}

/// Makes the child enter `prepared` ([`crate::sandbox`]) before it runs the program.
#[allow(unsafe_code)]
fn enter_sandbox(cmd: &mut Command, prepared: crate::sandbox::Prepared) {
    // SAFETY: `enter` makes only system calls on data prepared before fork (no allocation, no
    // lock).
    unsafe {
        let mut prepared = prepared;
        cmd.pre_exec(move || prepared.enter());
    }
}

/// Asks the kernel to SIGTERM the child when the supervising thread's process dies, so a killed
/// agent or hub leaves no SuperNode or SuperLink behind (also for what a child such as
/// `flower-hub netns-bridge` starts in turn).
#[allow(unsafe_code)]
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
    // async-signal-safe; it allocates nothing and touches no lock.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                .map_err(std::io::Error::from)
        });
    }
}

async fn terminate(child: &mut Child) {
    if let Some(pid) = child.id() {
        if GUARD.get().is_some() {
            // The guard passes the SIGTERM on to its program's group once: a second SIGTERM
            // makes Flower's SuperNode exit without deactivating, which leaves its session
            // online on the SuperLink for a minute.
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        } else {
            kill_group(pid, nix::sys::signal::Signal::SIGTERM);
        }
        if tokio::time::timeout(GRACE, child.wait()).await.is_ok() {
            // Helpers (flwr-clientapp, superexec) share the group; make sure they are gone too.
            kill_group(pid, nix::sys::signal::Signal::SIGKILL);
            return;
        }
        kill_group(pid, nix::sys::signal::Signal::SIGKILL);
    }
    let _ = child.wait().await;
}

fn kill_group(pid: u32, signal: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), signal);
    }
}

fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => "unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(name: &str, dir: &std::path::Path, script: &str) -> ProcessSpec {
        ProcessSpec {
            name: name.into(),
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            env: BTreeMap::new(),
            cwd: None,
            log_file: dir.join(format!("{name}.log")),
            sandbox: None,
        }
    }

    fn alive(pid: u32) -> bool {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
    }

    #[tokio::test]
    async fn restarts_a_crashing_process_and_logs_its_output() {
        // A process that exits is started again, and its output lands in the log file.
        let dir = tempfile::tempdir().unwrap();
        let sup = Supervised::start(sh("crash", dir.path(), "echo hello; exit 3"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while sup.state().restarts < 2 {
            assert!(
                Instant::now() < deadline,
                "no restart seen: {:?}",
                sup.state()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(sup.state().last_exit.as_deref(), Some("exit 3"));
        sup.stop().await;
        let log = std::fs::read_to_string(dir.path().join("crash.log")).unwrap();
        assert!(log.matches("hello").count() >= 2, "log: {log}");
    }

    #[tokio::test]
    async fn a_sandboxed_child_sees_only_its_own_directory_of_the_hidden_one() {
        // The hidden directory's secret is gone for the child, its own directory is there and
        // writable, and nothing is mounted on the host.
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let own = state.join("federations/team/fed");
        std::fs::create_dir_all(&own).unwrap();
        std::fs::write(state.join("ca.key"), "SECRET").unwrap();
        std::fs::write(own.join("tls.key"), "OWN").unwrap();
        let script = format!(
            "cat {state}/ca.key || echo HIDDEN; cat {own}/tls.key; echo W > {own}/written; ls {state}; sleep 30",
            state = state.display(),
            own = own.display()
        );
        let mut spec = sh("boxed", dir.path(), &script);
        spec.sandbox = Some(crate::sandbox::Sandbox {
            network: None,
            hide: state.clone(),
            keep: own.clone(),
            confine: false,
        });
        let sup = Supervised::start(spec);
        let log_file = dir.path().join("boxed.log");
        let deadline = Instant::now() + Duration::from_secs(10);
        let log = loop {
            let log = std::fs::read_to_string(&log_file).unwrap_or_default();
            if log.contains("federations") {
                break log;
            }
            assert!(
                Instant::now() < deadline,
                "no output: {log:?} {:?}",
                sup.state()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        sup.stop().await;
        assert!(!log.contains("SECRET"), "{log}");
        assert!(log.contains("HIDDEN") && log.contains("OWN"), "{log}");
        // `ls` of the state directory shows only the path to its own directory.
        assert!(!log.contains("ca.key\n"), "{log}");
        assert_eq!(std::fs::read_to_string(own.join("written")).unwrap(), "W\n");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(&state.display().to_string()), "{mounts}");
    }

    #[tokio::test]
    async fn stop_ends_the_whole_process_group() {
        // Children of the supervised process (Flower's helpers) do not outlive a stop.
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
        let sup = Supervised::start(sh("group", dir.path(), &script));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pidfile.exists() || std::fs::read_to_string(&pidfile).unwrap().trim().is_empty() {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let grandchild: u32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let child = sup.state().pid.unwrap();
        assert!(alive(grandchild));
        sup.stop().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Reap-independent check: /proc entry gone or zombie.
        for pid in [child, grandchild] {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            assert!(
                stat.is_empty() || stat.contains(") Z "),
                "pid {pid} still running: {stat}"
            );
        }
    }

    #[tokio::test]
    async fn a_missing_program_is_reported_not_fatal() {
        // A wrong program path is reported in the state and retried, never a panic.
        let dir = tempfile::tempdir().unwrap();
        let mut spec = sh("missing", dir.path(), "");
        spec.program = dir.path().join("no-such-binary");
        let sup = Supervised::start(spec);
        let deadline = Instant::now() + Duration::from_secs(5);
        while sup.state().last_exit.is_none() {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(sup.state().last_exit.unwrap().starts_with("cannot start"));
        sup.stop().await;
    }
}

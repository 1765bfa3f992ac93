//! Child processes of the harness: spawned so that they die with the test process, logged to a
//! file each, and ended by their pid (or their process group) when the owning [`Processes`] is
//! dropped, also when the test fails.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// How long a process gets between SIGTERM and SIGKILL when the harness ends it.
const TERM_GRACE: Duration = Duration::from_secs(5);

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Makes the child receive SIGKILL when the thread that forked it ends, so that a test killed
/// from outside (SIGKILL, a crashed harness) leaves no control-plane process behind.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child between fork and exec. It only calls prctl(2)
    // and getppid(2), both async-signal-safe, touches no lock and allocates nothing
    // (`io::Error::from_raw_os_error` stores an integer).
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
                .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
            // The parent may have died before prctl took effect: then nobody would kill us.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child ends, not the process. Test
/// threads and tokio workers come and go, so every child is forked from one dedicated thread that
/// lives as long as the process.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        // The thread ends only when the process does (the sender is never dropped).
        let spawn_thread = std::thread::Builder::new()
            .name("e2e-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            });
        if let Err(e) = spawn_thread {
            // Without the thread every spawn fails with a clear error below.
            eprintln!("e2e: cannot start the spawner thread: {e}");
        }
        Mutex::new(tx)
    })
}

fn spawn_die_with_parent(mut cmd: Command) -> Result<Child> {
    die_with_parent(&mut cmd);
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner()
        .lock()
        .map_err(|_| anyhow::anyhow!("spawner lock poisoned"))?
        .send((cmd, reply_tx))
        .map_err(|_| anyhow::anyhow!("the spawner thread is gone"))?;
    Ok(reply_rx
        .recv()
        .context("the spawner thread did not answer")??)
}

/// How a process was started (program, arguments, environment changes, working directory), to
/// start it again the same way.
#[derive(Clone, Debug)]
struct Recipe {
    program: std::ffi::OsString,
    args: Vec<std::ffi::OsString>,
    envs: Vec<(std::ffi::OsString, Option<std::ffi::OsString>)>,
    dir: Option<PathBuf>,
}

impl Recipe {
    fn of(cmd: &Command) -> Self {
        Self {
            program: cmd.get_program().to_owned(),
            args: cmd.get_args().map(ToOwned::to_owned).collect(),
            envs: cmd
                .get_envs()
                .map(|(k, v)| (k.to_owned(), v.map(ToOwned::to_owned)))
                .collect(),
            dir: cmd.get_current_dir().map(Path::to_path_buf),
        }
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (key, value) in &self.envs {
            match value {
                Some(value) => cmd.env(key, value),
                None => cmd.env_remove(key),
            };
        }
        if let Some(dir) = &self.dir {
            cmd.current_dir(dir);
        }
        cmd
    }
}

/// A process ended by [`Processes::take_down`] (an outage), to be started again as it was by
/// [`Processes::bring_up`]: same program, arguments, environment and log file (the previous log
/// is kept as `log.N`).
#[derive(Debug)]
pub struct Downed {
    name: String,
    log: PathBuf,
    recipe: Recipe,
    group: bool,
}

impl Downed {
    /// The process's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// One process started by the harness.
#[derive(Debug)]
pub struct Proc {
    /// Short name for messages, e.g. `spoke-1/kube-apiserver`.
    pub name: String,
    /// File receiving the process's stdout and stderr.
    pub log: PathBuf,
    child: Child,
    /// Leads a process group of its own: ended with everything it started.
    group: bool,
    recipe: Recipe,
}

impl Proc {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the process alone (not its group), e.g. to test a graceful stop.
    pub fn signal(&self, signal: Signal) -> Result<()> {
        kill(Pid::from_raw(self.pid() as i32), signal)
            .with_context(|| format!("sending {signal} to {} ({})", self.name, self.pid()))
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Resident set size in KiB (`VmRSS` from `/proc/<pid>/status`), `None` if unavailable.
    pub fn rss_kib(&self) -> Option<u64> {
        rss_kib(self.pid())
    }
}

/// `VmRSS` of a pid in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The last `lines` lines of a file (for failure messages).
pub fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Error lines (klog `E…`/`F…`, or containing "error") followed by the last 20 lines of a log:
/// Go components often print their fatal error well before their last line.
pub fn excerpt(path: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return tail(path, 20);
    };
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with('E') || l.starts_with('F') || l.to_ascii_lowercase().contains("error")
        })
        .collect();
    let errors = &errors[errors.len().saturating_sub(5)..];
    format!(
        "[last error lines]\n{}\n[last lines]\n{}",
        errors.join("\n"),
        tail(path, 20)
    )
}

/// The processes of one harness; all are ended by pid (SIGTERM, then SIGKILL) on drop, newest
/// first.
#[derive(Debug, Default)]
pub struct Processes {
    procs: Vec<Proc>,
}

impl Processes {
    /// Starts `program args…` with stdout and stderr to `log` (a previous run's log is kept as
    /// `log.1`, `log.2`, …); it dies with the harness.
    pub fn start(&mut self, name: &str, program: &Path, args: &[String], log: &Path) -> Result<()> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        self.spawn(name, cmd, log, false)
    }

    /// Starts `cmd` (program, arguments, environment, working dir as the caller set them) with
    /// stdout and stderr to `log`; it dies with the harness.
    pub fn start_command(&mut self, name: &str, cmd: Command, log: &Path) -> Result<()> {
        self.spawn(name, cmd, log, false)
    }

    /// [`Processes::start_command`] in a process group of its own, for a daemon that starts
    /// children (the hub's SuperLink, an agent's SuperNodes): the whole group is ended with it.
    pub fn start_group(&mut self, name: &str, mut cmd: Command, log: &Path) -> Result<()> {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        self.spawn(name, cmd, log, true)
    }

    fn spawn(&mut self, name: &str, mut cmd: Command, log: &Path, group: bool) -> Result<()> {
        keep_previous_log(log);
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let program = cmd.get_program().to_string_lossy().into_owned();
        let recipe = Recipe::of(&cmd);
        let child =
            spawn_die_with_parent(cmd).with_context(|| format!("starting {name} ({program})"))?;
        self.procs.push(Proc {
            name: name.to_string(),
            log: log.to_path_buf(),
            child,
            group,
            recipe,
        });
        Ok(())
    }

    /// Kills process `name` (SIGKILL, and its group if it leads one: a crash, or a machine that
    /// lost power) and returns how to start it again with [`Processes::bring_up`]: an outage of
    /// a daemon, e.g. an apiserver or etcd.
    pub fn take_down(&mut self, name: &str) -> Result<Downed> {
        let idx = self
            .procs
            .iter()
            .position(|p| p.name == name)
            .with_context(|| format!("no process named {name}"))?;
        let mut p = self.procs.remove(idx);
        let downed = Downed {
            name: p.name.clone(),
            log: p.log.clone(),
            recipe: p.recipe.clone(),
            group: p.group,
        };
        let pid = Pid::from_raw(p.pid() as i32);
        let _ = if p.group {
            killpg(pid, Signal::SIGKILL)
        } else {
            kill(pid, Signal::SIGKILL)
        };
        let _ = p.child.kill();
        let _ = p.child.wait();
        Ok(downed)
    }

    /// Starts a process ended by [`Processes::take_down`] again, as it was started.
    pub fn bring_up(&mut self, downed: Downed) -> Result<()> {
        use std::os::unix::process::CommandExt;
        let mut cmd = downed.recipe.command();
        if downed.group {
            cmd.process_group(0);
        }
        self.spawn(&downed.name, cmd, &downed.log, downed.group)
    }

    /// Fails, with the tail of its log, if any process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for p in &mut self.procs {
            if let Some(status) = p.exited() {
                bail!(
                    "{} (pid {}) exited with {status}; tail of {}:\n{}",
                    p.name,
                    p.pid(),
                    p.log.display(),
                    excerpt(&p.log)
                );
            }
        }
        Ok(())
    }

    /// Waits until `probe` says true (every 250 ms), failing at once if one of the processes
    /// has exited, and after `timeout` with the probe's last error and the log tails of the
    /// processes named in `show` (every process when `None`).
    pub async fn wait_for<F, Fut>(
        &mut self,
        what: &str,
        show: Option<&[&str]>,
        timeout: Duration,
        mut probe: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        let waited = crate::harness::wait_until(what, timeout, || {
            let alive = self.check_alive().map_err(crate::harness::fatal);
            let fut = probe();
            async move {
                alive?;
                fut.await
            }
        })
        .await;
        match waited {
            Ok(_) => Ok(()),
            Err(e) if crate::harness::is_fatal(&e) => Err(e),
            Err(e) => bail!("{e:#}{}", self.log_tails(show)),
        }
    }

    /// The log tails of the processes named in `show` (every process when `None`).
    pub fn log_tails(&self, show: Option<&[&str]>) -> String {
        let mut msg = String::new();
        let shown = self
            .procs
            .iter()
            .filter(|p| show.is_none_or(|names| names.contains(&p.name.as_str())));
        for p in shown {
            msg.push_str(&format!(
                "\n--- tail of {} ({}):\n{}",
                p.log.display(),
                p.name,
                excerpt(&p.log)
            ));
        }
        msg
    }

    /// The process named `name`.
    pub fn get(&self, name: &str) -> Option<&Proc> {
        self.procs.iter().find(|p| p.name == name)
    }

    /// The process named `name`, or an error naming it.
    pub fn get_mut(&mut self, name: &str) -> Result<&mut Proc> {
        self.procs
            .iter_mut()
            .find(|p| p.name == name)
            .with_context(|| format!("no process named {name}"))
    }

    /// All processes, in start order.
    pub fn all(&self) -> &[Proc] {
        &self.procs
    }

    /// Ends one process by pid and forgets it (e.g. to simulate a crash or a restart).
    pub fn stop(&mut self, name: &str) -> Result<()> {
        let idx = self
            .procs
            .iter()
            .position(|p| p.name == name)
            .with_context(|| format!("no process named {name}"))?;
        let p = self.procs.remove(idx);
        end_all(vec![p]);
        Ok(())
    }

    /// Ends every process (also done on drop).
    pub fn stop_all(&mut self) {
        let mut procs = std::mem::take(&mut self.procs);
        procs.reverse();
        end_all(procs);
    }
}

/// Moves an earlier process's `log` (a restarted daemon's) to the first free `log.N`, so every
/// instance's log is left to read after a failure.
fn keep_previous_log(log: &Path) {
    if !std::fs::metadata(log).is_ok_and(|m| m.len() > 0) {
        return;
    }
    let Some(name) = log.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return;
    };
    if let Some(free) = (1..1000)
        .map(|n| log.with_file_name(format!("{name}.{n}")))
        .find(|p| !p.exists())
    {
        let _ = std::fs::rename(log, free);
    }
}

/// Ends processes one by one, in the given order: SIGTERM, up to [`TERM_GRACE`], then SIGKILL;
/// a group leader's signals go to its whole group, and what is left of the group after the
/// leader exited is killed. One at a time because an apiserver whose etcd vanished at the same
/// moment hangs in shutdown.
fn end_all(procs: Vec<Proc>) {
    for mut p in procs {
        let t = Instant::now();
        let (pid, group) = (Pid::from_raw(p.pid() as i32), p.group);
        let signal = |s: Signal| {
            let _ = if group { killpg(pid, s) } else { kill(pid, s) };
        };
        if p.exited().is_none() {
            signal(Signal::SIGTERM);
            let deadline = Instant::now() + TERM_GRACE;
            while p.exited().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if p.exited().is_none() {
            eprintln!(
                "e2e: {} ignored SIGTERM for {TERM_GRACE:?}: SIGKILL",
                p.name
            );
            signal(Signal::SIGKILL);
            let _ = p.child.kill();
            let _ = p.child.wait();
        } else if t.elapsed() > Duration::from_secs(1) {
            eprintln!(
                "e2e: {} took {:.1}s to stop",
                p.name,
                t.elapsed().as_secs_f64()
            );
        }
        if group {
            // Children that outlived their leader (the pgid stays theirs while any is alive).
            let _ = killpg(pid, Signal::SIGKILL);
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        self.stop_all();
    }
}

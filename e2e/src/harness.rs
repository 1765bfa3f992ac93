//! What every e2e test needs around the product, in one place: free loopback ports, waits (async
//! and blocking, with the last probe error and extra detail on timeout), the built product
//! binaries and Flower venvs, the child processes ([`Processes`]: logged, ended by pid or process
//! group on drop, dying with the test process) and the processes they started (found by command
//! line), and the lock that serialises control-plane boots
//! across test threads and test processes (the suite runs on 2 cores).

use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

pub use crate::process::{Proc, Processes, excerpt, tail};

/// How often a wait probes.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

// === retries ===

/// Records that a test retried something it allows to fail once (a known Flower bug, a port
/// race): prints it, and appends one line `KIND\tWHAT` to the file `FLOWER_ADDON_RETRY_LOG`
/// names (`test.sh` sets it and counts the lines in its summary, so a rising count is visible
/// although passing tests' output is captured).
pub fn retried(kind: &str, what: impl std::fmt::Display) {
    let line = format!("{kind}\t{what}");
    eprintln!("e2e: retry ({kind}): {what}");
    if let Some(path) = std::env::var_os("FLOWER_ADDON_RETRY_LOG") {
        use std::io::Write;
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "{}", line.replace('\n', " ")));
        if let Err(e) = written {
            eprintln!(
                "e2e: cannot record the retry in {}: {e}",
                path.to_string_lossy()
            );
        }
    }
}

// === ports ===

/// A free loopback port (the listener that found it is dropped before it returns).
pub fn free_port() -> Result<u16> {
    Ok(free_ports(1)?[0])
}

/// `n` distinct free loopback ports, all held at once while they are picked.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..n {
        let (port, listeners) = hold_run(1, |_| true)?;
        ports.push(port);
        held.push(listeners);
    }
    Ok(ports)
}

/// Where test ports come from: below the kernel's ephemeral range (`ip_local_port_range`, from
/// 32768 by default), so that no outgoing connection of another process (an apiserver's, a
/// kubelet's, a SuperNode's) is given a port between a test choosing it and its program binding
/// it, which is what a port from `bind(0)` risked under real_node's load ("Address already in
/// use" from an agent started 2 s after its port was chosen); and above the product's default
/// port bases (19100, 19500) and the services a test cluster runs.
fn test_port_range() -> std::ops::Range<u16> {
    const FIRST: u16 = 20000;
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    FIRST..ephemeral.max(FIRST + 4096)
}

/// Ports this process handed out already: never handed out twice, so two tests of one binary
/// cannot be given the same port while neither has bound it yet.
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A random port `p` of [`test_port_range`] with `p..p + len` all free (bound, and held by the
/// returned listeners) and none handed out before by this process, for which `wanted(p)` holds.
fn hold_run(len: u16, wanted: impl Fn(u16) -> bool) -> Result<(u16, Vec<TcpListener>)> {
    let range = test_port_range();
    let span = range.end - range.start - len;
    let mut random = [0u8; 2 * 400];
    {
        use std::io::Read;
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut random))
            .context("reading /dev/urandom to choose test ports")?;
    }
    for pair in random.chunks_exact(2) {
        let port = range.start + u16::from_le_bytes([pair[0], pair[1]]) % span;
        let mut given = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
        if !wanted(port) || given.range(port..port + len).next().is_some() {
            continue;
        }
        let held: std::io::Result<Vec<TcpListener>> = (port..port + len)
            .map(|p| TcpListener::bind(("127.0.0.1", p)))
            .collect();
        if let Ok(listeners) = held {
            given.extend(port..port + len);
            return Ok((port, listeners));
        }
    }
    bail!("no {len} free loopback ports in a row in {range:?} after 400 tries")
}

/// Free loopback ports at least `spacing` apart from each other and below 60000, for programs
/// that use a range of ports from a base (the process runtime's `--port-base`).
#[derive(Debug, Clone)]
pub struct SpacedPorts {
    spacing: u16,
    given: Vec<u16>,
}

impl SpacedPorts {
    /// Hands out ports at least `spacing` apart.
    pub fn new(spacing: u16) -> Self {
        Self {
            spacing,
            given: Vec::new(),
        }
    }

    /// Another free port, away from every port handed out before.
    pub fn take(&mut self) -> Result<u16> {
        self.take_run(1)
    }

    /// Another free port whose next `len - 1` ports are free too (all bound at once to check),
    /// away from every port handed out before: for a program given a base port that also
    /// listens on the ports after it (`--metrics-bind-address` P and `--health-probe-bind-address`
    /// P+1, the process runtime's `--port-base`). An ephemeral port held by some connection
    /// would otherwise make it fail with "address already in use".
    pub fn take_run(&mut self, len: u16) -> Result<u16> {
        let spacing = self.spacing;
        let given = &self.given;
        let (port, _held) = hold_run(len, |port| given.iter().all(|g| g.abs_diff(port) > spacing))
            .with_context(|| format!("no {len} free ports {spacing} away from {given:?}"))?;
        self.given.push(port);
        Ok(port)
    }
}

// === waits ===

/// An error that ends a wait at once instead of being retried until the timeout (a process that
/// died, a pod that failed). Make one with [`fatal`]; it stays recognisable under `context`.
#[derive(Debug)]
pub struct Fatal(anyhow::Error);

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for Fatal {}

/// Marks `err` as [`Fatal`]: a wait whose probe returns it fails at once.
pub fn fatal(err: impl Into<anyhow::Error>) -> anyhow::Error {
    anyhow::Error::new(Fatal(err.into()))
}

/// Whether `err` (or an error it wraps) is [`Fatal`].
pub fn is_fatal(err: &anyhow::Error) -> bool {
    err.downcast_ref::<Fatal>().is_some()
}

/// One wait: what for (in messages), how long, how often, and what to add to a timeout error.
/// A probe says `Ok(Some(v))` (done), `Ok(None)` (not yet) or `Err` (retried, and reported on
/// timeout, unless [`Fatal`]).
pub struct Wait<'d> {
    what: String,
    timeout: Duration,
    interval: Duration,
    detail: Option<Box<dyn Fn() -> String + 'd>>,
}

impl std::fmt::Debug for Wait<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wait")
            .field("what", &self.what)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The state of a running wait, shared by the async and the blocking loop.
struct Attempts<'w, 'd> {
    wait: &'w Wait<'d>,
    start: Instant,
    last_err: Option<anyhow::Error>,
}

impl Attempts<'_, '_> {
    /// `Some` once the wait is over: the value, a fatal error, or the timeout.
    fn judge<T>(&mut self, outcome: Result<Option<T>>) -> Option<Result<T>> {
        match outcome {
            Ok(Some(v)) => return Some(Ok(v)),
            Ok(None) => {}
            Err(e) if is_fatal(&e) => {
                return Some(Err(
                    e.context(format!("while waiting for {}", self.wait.what))
                ));
            }
            Err(e) => self.last_err = Some(e),
        }
        (self.start.elapsed() > self.wait.timeout).then(|| Err(self.timed_out()))
    }

    fn timed_out(&mut self) -> anyhow::Error {
        let w = self.wait;
        let mut msg = format!("timed out after {:?} waiting for {}", w.timeout, w.what);
        if let Some(e) = self.last_err.take() {
            msg.push_str(&format!("; last error: {e:#}"));
        }
        if let Some(detail) = &w.detail {
            msg.push('\n');
            msg.push_str(&detail());
        }
        anyhow::anyhow!(msg)
    }
}

impl<'d> Wait<'d> {
    /// Waits up to `timeout` for `what`, probing every [`POLL_INTERVAL`].
    pub fn new(what: impl Into<String>, timeout: Duration) -> Self {
        Self {
            what: what.into(),
            timeout,
            interval: POLL_INTERVAL,
            detail: None,
        }
    }

    /// Probes every `interval` instead.
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Appends `detail()` (log tails, a status file) to the timeout error.
    pub fn detail(mut self, detail: impl Fn() -> String + 'd) -> Self {
        self.detail = Some(Box::new(detail));
        self
    }

    fn attempts(&self) -> Attempts<'_, 'd> {
        Attempts {
            wait: self,
            start: Instant::now(),
            last_err: None,
        }
    }

    /// Until `probe` returns a value; returns it.
    pub async fn for_value<T, F, Fut>(self, mut probe: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        let mut attempts = self.attempts();
        loop {
            if let Some(done) = attempts.judge(probe().await) {
                return done;
            }
            tokio::time::sleep(self.interval).await;
        }
    }

    /// Until `probe` says true; returns how long that took.
    pub async fn until<F, Fut>(self, mut probe: F) -> Result<Duration>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<bool>>,
    {
        let start = Instant::now();
        self.for_value(|| {
            let fut = probe();
            async move { Ok(fut.await?.then_some(())) }
        })
        .await?;
        Ok(start.elapsed())
    }

    /// [`Wait::for_value`] for tests without a runtime: sleeps the thread between probes.
    pub fn for_value_blocking<T>(self, mut probe: impl FnMut() -> Result<Option<T>>) -> Result<T> {
        let mut attempts = self.attempts();
        loop {
            if let Some(done) = attempts.judge(probe()) {
                return done;
            }
            std::thread::sleep(self.interval);
        }
    }

    /// [`Wait::until`] for tests without a runtime.
    pub fn until_blocking(self, mut probe: impl FnMut() -> Result<bool>) -> Result<Duration> {
        let start = Instant::now();
        self.for_value_blocking(|| Ok(probe()?.then_some(())))?;
        Ok(start.elapsed())
    }
}

/// Polls `probe` until it returns `Ok(true)`; fails after `timeout` with the last probe error.
/// Returns how long it took.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, probe: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    Wait::new(what, timeout).until(probe).await
}

/// Polls `probe` until it returns `Ok(Some(v))`; returns `v`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    Wait::new(what, timeout).for_value(probe).await
}

/// [`wait_until`] for tests without a runtime.
pub fn wait_until_blocking(
    what: &str,
    timeout: Duration,
    probe: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    Wait::new(what, timeout).until_blocking(probe)
}

/// [`wait_for`] for tests without a runtime.
pub fn wait_for_blocking<T>(
    what: &str,
    timeout: Duration,
    probe: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    Wait::new(what, timeout).for_value_blocking(probe)
}

// === binaries ===

/// The directory cargo put this crate's binaries in (`target/debug` when run by `cargo test` or
/// `cargo run`), where `cargo build --bins` put flower-hub and flower-agent too.
fn cargo_bin_dir() -> PathBuf {
    let from_exe = std::env::current_exe().ok().and_then(|exe| {
        let dir = exe.parent()?;
        // Test binaries live in target/debug/deps, `cargo run` ones in target/debug.
        Some(if dir.ends_with("deps") {
            dir.parent()?.to_path_buf()
        } else {
            dir.to_path_buf()
        })
    });
    from_exe.unwrap_or_else(|| crate::repo_root().join("target/debug"))
}

/// The built product binary `name` (`flower-hub`, `flower-agent`), or an error telling to build
/// it.
pub fn binary(name: &str) -> Result<PathBuf> {
    // FLOWER_ADDON_E2E_BIN_DIR: binaries of another profile (e.g. target/dist for a bench of
    // what ships).
    let dir =
        std::env::var_os("FLOWER_ADDON_E2E_BIN_DIR").map_or_else(cargo_bin_dir, PathBuf::from);
    let path = dir.join(name);
    ensure!(
        path.is_file(),
        "{} is missing: run `cargo build --bins` first (test.sh does)",
        path.display()
    );
    Ok(path)
}

/// A path a build script made: `$env` when set, else the last line the script (relative to the
/// repository) prints on stdout (scripts build once, then print their cache); an error naming
/// the variable and the script when it fails.
pub fn built_by(env: &str, script: &str) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Ok(PathBuf::from(path));
    }
    let path = crate::repo_root().join(script);
    let out = std::process::Command::new(&path)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", path.display()))?;
    ensure!(
        out.status.success(),
        "{env} is not set and {script} failed: run it and export {env}=<its output> (test.sh does)"
    );
    Ok(PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim(),
    ))
}

/// The Flower venv for `version` from `e2e/flower/venv.sh` (built from PyPI on the first call,
/// cached after); fails unless it holds `flower-superlink`.
pub fn flower_venv(version: &str) -> Result<PathBuf> {
    let script = crate::repo_root().join("e2e/flower/venv.sh");
    let out = std::process::Command::new(&script)
        .arg(version)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    ensure!(out.status.success(), "e2e/flower/venv.sh {version} failed");
    let venv = PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim(),
    );
    ensure!(
        venv.join("bin/flower-superlink").is_file(),
        "no flower-superlink in {} (e2e/flower/venv.sh {version})",
        venv.display()
    );
    Ok(venv)
}

// === processes by command line ===

/// `(pid, argv)` of every live process but this one (zombies, whose cmdline is empty, are
/// skipped): to find what a daemon under test started, by a path in its arguments.
pub fn live_processes() -> Vec<(u32, Vec<String>)> {
    let me = std::process::id();
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if raw.is_empty() {
            continue;
        }
        let args = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        out.push((pid, args));
    }
    out
}

/// Pids of the live processes whose whole command line (arguments joined by spaces) contains
/// `needle`.
pub fn processes_mentioning_line(needle: &str) -> Vec<u32> {
    live_processes()
        .into_iter()
        .filter(|(_, args)| args.join(" ").contains(needle))
        .map(|(pid, _)| pid)
        .collect()
}

/// `(pid, argv)` of the live processes of directory `dir`: an argument mentions it, or their
/// working directory is in it (a `flwr-clientapp` started by a SuperNode there names no path).
pub fn processes_of(dir: &Path) -> Vec<(u32, Vec<String>)> {
    let needle = dir.display().to_string();
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    live_processes()
        .into_iter()
        .filter(|(pid, args)| {
            args.iter().any(|a| a.contains(&needle))
                || std::fs::read_link(format!("/proc/{pid}/cwd"))
                    .is_ok_and(|cwd| cwd.starts_with(&canonical) || cwd.starts_with(dir))
        })
        .collect()
}

/// Pids of the live processes with an argument containing `needle` (e.g. a test's work dir).
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    live_processes()
        .into_iter()
        .filter(|(_, args)| args.iter().any(|a| a.contains(needle)))
        .map(|(pid, _)| pid)
        .collect()
}

// === the boot lock ===

/// File whose lock serialises control-plane boots on this machine.
fn boot_lock_path() -> PathBuf {
    std::env::temp_dir().join("flower-addon-e2e-boot.lock")
}

/// Held while a control plane boots: cargo runs the test functions of one binary in parallel,
/// and several apiservers, controller-managers and kubelets starting at once on 2 cores miss
/// their readiness timeouts. A `flock(2)` on a file in the temp dir, so it also orders boots of
/// other test processes and checkouts; released on drop, and by the kernel if the test dies.
#[derive(Debug)]
pub struct BootLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
    /// How long the boot waited for others.
    pub waited: Duration,
}

impl BootLock {
    /// Blocks until no other control plane is booting.
    pub fn acquire() -> Result<Self> {
        let path = boot_lock_path();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let t = Instant::now();
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .with_context(|| format!("locking {}", path.display()))?;
        Ok(Self {
            _lock: lock,
            waited: t.elapsed(),
        })
    }

    /// [`BootLock::acquire`] without blocking a runtime worker.
    pub async fn acquire_async() -> Result<Self> {
        tokio::task::spawn_blocking(Self::acquire)
            .await
            .context("the boot-lock task panicked")?
    }
}

/// The load average (1, 5, 15 min) and the CPU count, for a bench's report.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
        + &format!(
            " ({} CPUs)",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        )
}

/// A tmpfs mounted for a test, lazily unmounted when dropped (also on failure).
pub struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `16m`, mode 1777: any container user writes to it) at `at`
    /// (made if missing). Needs root: fails naming that otherwise.
    pub fn mount(at: &std::path::Path, size: &str) -> Result<Self> {
        std::fs::create_dir_all(at)?;
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=1777"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .context("mount (a tmpfs for a test: needs root)")?;
        ensure!(
            out.status.success(),
            "mount -t tmpfs at {} (needs root): {}",
            at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(Self(at.to_owned()))
    }

    /// Fills it with a file until the filesystem refuses a write; the bytes written.
    pub fn fill(&self) -> Result<u64> {
        use std::io::Write;
        let mut file = std::fs::File::create(self.0.join("filler"))?;
        let chunk = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(written)
    }

    /// Removes what [`Self::fill`] wrote.
    pub fn empty(&self) -> Result<()> {
        Ok(std::fs::remove_file(self.0.join("filler"))?)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ports_come_from_below_the_ephemeral_range_and_never_twice() {
        // Invariant: no port handed out lies where the kernel gives outgoing connections their
        // local port, a run's ports are free and in a row, and no port is handed out twice.
        let range = test_port_range();
        let first = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
        let ephemeral: u16 = first.split_whitespace().next().unwrap().parse().unwrap();
        assert!(
            range.start >= 20000 && range.end <= ephemeral.max(24096),
            "{range:?}"
        );
        let mut seen = std::collections::BTreeSet::new();
        for port in free_ports(50).unwrap() {
            assert!(range.contains(&port), "{port} outside {range:?}");
            assert!(seen.insert(port), "{port} handed out twice");
        }
        let mut spaced = SpacedPorts::new(12);
        let bases = [spaced.take_run(12).unwrap(), spaced.take_run(12).unwrap()];
        assert!(bases[0].abs_diff(bases[1]) > 12, "{bases:?}");
        for base in bases {
            for port in base..base + 12 {
                assert!(seen.insert(port), "{port} handed out twice");
                TcpListener::bind(("127.0.0.1", port)).unwrap();
            }
        }
    }

    #[test]
    fn a_fatal_error_ends_the_wait_at_once() {
        // Invariant: a probe's Fatal error is not retried until the timeout.
        let t = Instant::now();
        let err = wait_until_blocking("never", Duration::from_secs(30), || {
            Err(fatal(anyhow::anyhow!("process died")))
        })
        .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(is_fatal(&err), "{err:#}");
        assert!(format!("{err:#}").contains("process died"), "{err:#}");
    }

    #[test]
    fn a_timeout_names_the_last_error_and_the_detail() {
        // Invariant: a timed-out wait says what it waited for, the probe's last error and the
        // detail (log tails) it was given.
        let err = Wait::new("the answer", Duration::from_millis(50))
            .every(Duration::from_millis(10))
            .detail(|| "--- log tail".to_string())
            .until_blocking(|| Err(anyhow::anyhow!("connection refused")))
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(!is_fatal(&err));
        assert!(
            msg.contains("waiting for the answer")
                && msg.contains("connection refused")
                && msg.contains("--- log tail"),
            "{msg}"
        );
    }

    #[test]
    fn spaced_ports_keep_their_distance() {
        // Invariant: ports handed out for base-port ranges never overlap.
        let mut ports = SpacedPorts::new(12);
        let got: Vec<u16> = (0..4).map(|_| ports.take().unwrap()).collect();
        for (i, a) in got.iter().enumerate() {
            for b in &got[i + 1..] {
                assert!(a.abs_diff(*b) > 12, "{got:?}");
            }
        }
    }
}

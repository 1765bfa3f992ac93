//! FlowerRun figures of `flower-hub`: how soon a run Flower finished shows `Complete`, how soon
//! a ServerApp log line reaches `status.logTail` (standalone hub, real Flower), and what idle
//! FlowerRuns cost in Kubernetes mode (hub CPU and apiserver requests per minute). It prints
//! figures and targets; a missed target is reported (MISS), not an error.
//!
//! ```text
//! cargo build --bins
//! FLOWER_ADDON_K8S_BIN=$(e2e/k8s/build.sh) nice -n 19 cargo run -p e2e --bin run_bench -- \
//!     [--runs 10] [--rounds 1] [--poll-ms 50] [--kube-runs 100] [--idle-seconds 120] \
//!     [--apart] [--skip-standalone] [--skip-kube]
//! ```
//!
//! Standalone: `flower-hub serve --standalone` with Flower from `e2e/flower/venv.sh` (1.42.0),
//! the quickstart Federation without placement (two pools of one SuperNode on this machine) and
//! examples/fedavg as a FAB ConfigMap in the manifests directory; `--runs` FlowerRuns of
//! `--rounds` rounds, one after the other. Every `--poll-ms` the bench reads `<state>/status.json`
//! (what `flower-hub status` and `run list` print) and the run's stored state
//! `<state>/runs/default/<name>.json`, timestamping what it sees first.
//! - run finished → Complete: from Flower's own `finished_at` (the SuperLink's ListRuns, read
//!   after the run) to the first read showing condition `Complete=True`.
//! - log line → logTail: the bench follows the run's log itself (Control API StreamLogs); each
//!   chunk carries Flower's timestamp of its newest line (when the SuperLink stored it). That
//!   line is in `status.logTail` once `status.logTimestamp` (Flower's timestamp of the last line
//!   the hub added) has reached it: latency = the first read where it has − the line's
//!   timestamp. The leg before (the ServerApp's log uploader pushes every 0.2 s) is not seen.
//!   The bench's own stream gives the floor of any Control API follower (Flower polls its log
//!   store every 0.5 s for a stream).
//!
//! Kubernetes: a real control plane from the e2e harness and the hub as `manifests/hub` runs it
//! (its ServiceAccount, `--leader-elect`), as reconcile_bench starts it. Requests are the hub's
//! own, counted by the apiserver: FlowSchemas that match only the hub's ServiceAccount, one per
//! verb and resource, read from `apiserver_flowcontrol_dispatched_requests_total` on `/metrics`
//! (watches count when they are opened). `apiserver_request_total` is printed beside it for
//! FlowerRuns (every client; only the hub touches FlowerRuns in a window; watches count there
//! when they close) and for everything (every component of the control plane).
//! - (a) `--kube-runs` finished runs: FlowerRuns created (their Federation does not exist, so
//!   the hub only records that they wait), then set `Complete` through the status subresource as
//!   the hub would have written it; the hub is restarted so that it starts with them finished
//!   (its start-up cost is printed too); then `--idle-seconds` of idleness.
//! - (b) `--kube-runs` runs waiting for a Federation that is not Ready (its placementRef names a
//!   Placement that does not exist), created and settled; then `--idle-seconds` of idleness.
//!
//! By default the standalone runs take place during window (a) (it lasts until both are done):
//! its CPU time and request counts do not depend on the machine's load, and the default run
//! stays within 6 minutes. `--apart` runs the standalone part first, alone.
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail, ensure};
use base64::Engine;
use clap::Parser;
use e2e::ControlPlane;
use e2e::addon::{Addon, AddonOptions};
use e2e::bench::{
    apiserver_metrics, binary_age, counter_deltas, cpu_time, hub_requests, install_flow_schemas,
    metric_value, per_resource, percentile, requests_on, sorted, validate_counting, verdict,
};
use e2e::harness::{Processes, binary, flower_venv, free_ports};
use e2e::scrape::Samples;
use flower_addon_crds::Federation;
use flower_addon_crds::run::{FlowerRun, FlowerRunStatus};
use flower_addon_hub::flower::control::{ControlClient, ControlEndpoint};
use flower_addon_hub::standalone::status::{HubStatus, STATUS_FILE};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "flower-hub FlowerRun latencies (standalone) and idle cost (Kubernetes)")]
struct Args {
    /// Standalone FlowerRuns timed, one after the other.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// `num-server-rounds` of each standalone run.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// How often the bench reads the standalone hub's status files, in milliseconds.
    #[arg(long, default_value_t = 50)]
    poll_ms: u64,
    /// Flower version of the standalone part (`e2e/flower/venv.sh VERSION`).
    #[arg(long, default_value = "1.42.0")]
    flower: String,
    /// FlowerRuns of each Kubernetes window.
    #[arg(long, default_value_t = 100)]
    kube_runs: usize,
    /// Seconds of each Kubernetes window over which requests and CPU are counted.
    #[arg(long, default_value_t = 120)]
    idle_seconds: u64,
    /// Run the standalone part first, alone, instead of during Kubernetes window (a).
    #[arg(long)]
    apart: bool,
    /// Skip the standalone part.
    #[arg(long)]
    skip_standalone: bool,
    /// Skip the Kubernetes part.
    #[arg(long)]
    skip_kube: bool,
}

/// Target: p50 of run finished → `Complete`.
const TARGET_COMPLETE_P50: Duration = Duration::from_secs(2);
/// Target: the hub's apiserver requests per finished run per minute.
const TARGET_REQUESTS_PER_RUN_MINUTE: f64 = 1.0;
/// How long one standalone run may take before the setup counts as broken.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the hub must have made no request (but Lease renewals and watches) to be settled.
const QUIET: Duration = Duration::from_secs(5);
/// The hub's process name in the harness ([`Addon::install`]).
const HUB_PROC: &str = "flower-hub";
/// Namespaces of the two Kubernetes windows.
const NS_FINISHED: &str = "bench-finished";
const NS_WAITING: &str = "bench-waiting";
/// Resources counted apart (any API group); the rest of a verb's requests count as `other`.
const RESOURCES: [&str; 11] = [
    "flowerruns",
    "flowerruns/status",
    "federations",
    "federations/status",
    "configmaps",
    "leases",
    "secrets",
    "services",
    "statefulsets",
    "managedclusters",
    "placementdecisions",
];

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    e2e::install_crypto();
    let args = Args::parse();
    ensure!(
        args.runs > 0 || args.skip_standalone,
        "--runs must be at least 1"
    );
    ensure!(
        args.kube_runs > 0 || args.skip_kube,
        "--kube-runs must be at least 1"
    );
    let started = Instant::now();
    START.get_or_init(Instant::now);
    let hub_bin = binary("flower-hub")?;
    println!("hub binary: {}", describe_binary(&hub_bin));
    println!("load at start: {}", e2e::harness::loadavg());

    let mut standalone: Option<Result<StandaloneReport>> = None;
    let mut kube: Option<Result<KubeReport>> = None;
    if args.skip_kube || args.apart {
        if !args.skip_standalone {
            standalone = Some(standalone_bench(&args).await);
        }
        if !args.skip_kube {
            kube = Some(kube_bench(&args, None).await.map(|(k, _)| k));
        }
    } else {
        let during_a: During<'_> = if args.skip_standalone {
            None
        } else {
            Some(Box::pin(standalone_bench(&args)))
        };
        match kube_bench(&args, during_a).await {
            Ok((k, s)) => {
                kube = Some(Ok(k));
                standalone = s;
            }
            Err(e) => kube = Some(Err(e)),
        }
    }

    println!();
    println!(
        "== run_bench: FlowerRun figures of flower-hub ({} in all) ==",
        secs(started.elapsed())
    );
    let standalone_failed = print_part("standalone", &standalone, |r| r.print(&args));
    let kube_failed = print_part("Kubernetes", &kube, |r| r.print(&args));
    println!("load at end: {}", e2e::harness::loadavg());
    if standalone_failed || kube_failed {
        bail!("a part of the bench failed (above)");
    }
    Ok(())
}

/// Prints a part's report, or how it failed; whether it failed (a part not run did not).
fn print_part<R>(name: &str, part: &Option<Result<R>>, print: impl FnOnce(&R)) -> bool {
    match part {
        Some(Ok(report)) => {
            print(report);
            false
        }
        Some(Err(e)) => {
            println!("{name} part FAILED: {e:#}");
            true
        }
        None => false,
    }
}

// === Progress and numbers ===

static START: OnceLock<Instant> = OnceLock::new();

/// Prints a progress line with the time since the bench started.
fn progress(message: impl std::fmt::Display) {
    let t = START.get_or_init(Instant::now).elapsed();
    println!("[{:>6.1} s] {message}", t.as_secs_f64());
}

/// Seconds since the Unix epoch, as Flower's timestamps are.
fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// Flower's timestamp text (`datetime.isoformat()`, e.g. `2026-01-02T03:04:05.123456+00:00`)
/// as seconds since the epoch.
fn flower_time(text: &str) -> Option<f64> {
    let text = text.trim().replace(' ', "T");
    let t: Timestamp = text
        .parse()
        .ok()
        .or_else(|| format!("{text}Z").parse().ok())?;
    Some(t.as_microsecond() as f64 / 1e6)
}

/// `later − earlier` (seconds since the epoch) as a duration, 0 when negative.
fn between(earlier: f64, later: f64) -> Duration {
    Duration::from_secs_f64((later - earlier).max(0.0))
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn s3(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

/// Path, size and age of a binary, and the profile its directory suggests.
fn describe_binary(path: &Path) -> String {
    let age = binary_age(path);
    let profile = path
        .parent()
        .and_then(Path::file_name)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let note = if profile == "debug" {
        "; a debug build: its CPU figures are higher than a release hub's \
         (FLOWER_ADDON_E2E_BIN_DIR=target/release for those)"
    } else {
        ""
    };
    format!("{} ({age}, profile {profile}{note})", path.display())
}

// === Standalone ===

/// What the standalone part measured.
struct StandaloneReport {
    /// Hub start → the Federation Ready.
    federation_ready: Duration,
    /// Flower's `finished_at` → `status.json` shows Complete.
    complete: Vec<Duration>,
    /// Flower's `finished_at` → the run's stored state shows Complete.
    complete_stored: Vec<Duration>,
    /// Flower's `running_at` → `finished_at`.
    run_length: Vec<Duration>,
    /// Manifest written → `status.json` shows Complete.
    manifest_to_complete: Vec<Duration>,
    /// A line's Flower timestamp → `status.json`'s logTimestamp covers it.
    log: Vec<Duration>,
    /// A line's Flower timestamp → the bench's own StreamLogs received it.
    log_stream: Vec<Duration>,
    /// Lines the bench streamed that the hub's status never covered.
    log_unseen: usize,
    /// The whole standalone part.
    wall: Duration,
}

/// The standalone hub under test and how to read it.
struct Standalone {
    state: PathBuf,
    manifests: PathBuf,
    log: PathBuf,
    procs: Processes,
    control: Arc<ControlClient>,
}

async fn standalone_bench(args: &Args) -> Result<StandaloneReport> {
    let t0 = Instant::now();
    progress(format!(
        "standalone: Flower {} venv (e2e/flower/venv.sh)",
        args.flower
    ));
    let venv = flower_venv(&args.flower)?;
    let dir = tempfile::Builder::new().prefix("run-bench-").tempdir()?;
    let state = dir.path().join("state");
    let manifests = dir.path().join("manifests");
    let log = dir.path().join("hub.log");
    std::fs::create_dir_all(&manifests)?;
    let ports = free_ports(3)?;
    std::fs::write(
        manifests.join("federation.yaml"),
        e2e::standalone::federation_without_placement(&ports)?
            .replace(":1.42.0", &format!(":{}", args.flower))
            .replace("\"1.42.0\"", &format!("\"{}\"", args.flower)),
    )?;
    let fab =
        flower_addon_hub::flower::fab::build_from_dir(&e2e::repo_root().join("examples/fedavg"))?;
    std::fs::write(manifests.join("fab.yaml"), fab_config_map(&fab.bytes))?;
    let mut procs = Processes::default();
    let serve =
        e2e::standalone::serve_command(&binary("flower-hub")?, &state, &manifests, &venv, &[]);
    procs.start_group("hub", serve, &log)?;
    progress(
        "standalone: flower-hub serve --standalone started; waiting for the Federation to be Ready",
    );
    let waited = wait_federation_ready(&state, &mut procs).await;
    if let Err(e) = waited {
        bail!(
            "{e:#}\nhub log ({}):\n{}",
            log.display(),
            e2e::process::tail(&log, 40)
        );
    }
    let federation_ready = t0.elapsed();
    let version = flower_addon_crds::render::FlowerVersion::parse(&args.flower)
        .context("a Flower version")?;
    let ca = std::fs::read_to_string(state.join("federations/default/quickstart/tls/ca.crt"))?;
    let control = Arc::new(ControlClient::new(ControlEndpoint {
        dialect: flower_addon_crds::render::FlowerDialect::of(version),
        address: format!("127.0.0.1:{}", ports[1]),
        server_name: "127.0.0.1".into(),
        ca_pem: Some(ca),
        tunnel: None,
    })?);
    let mut hub = Standalone {
        state,
        manifests,
        log,
        procs,
        control,
    };
    let mut report = StandaloneReport {
        federation_ready,
        complete: Vec::new(),
        complete_stored: Vec::new(),
        run_length: Vec::new(),
        manifest_to_complete: Vec::new(),
        log: Vec::new(),
        log_stream: Vec::new(),
        log_unseen: 0,
        wall: Duration::ZERO,
    };
    progress(format!(
        "standalone: Federation Ready in {}; {} runs of examples/fedavg, {} round(s) each, one after the other",
        secs(federation_ready),
        args.runs,
        args.rounds
    ));
    for i in 0..args.runs {
        let name = format!("bench-{i:02}");
        let run = match one_run(&mut hub, &name, args).await {
            Ok(run) => run,
            Err(e) => bail!(
                "{name}: {e:#}\nhub log ({}):\n{}",
                hub.log.display(),
                e2e::process::tail(&hub.log, 40)
            ),
        };
        progress(format!(
            "standalone: run {}/{} (Flower run {}): ran {}, manifest → Complete {}; finished → Complete {} (stored state {}); {} log lines timed, logTail p50 {}",
            i + 1,
            args.runs,
            run.run_id,
            secs(run.run_length),
            secs(run.manifest_to_complete),
            secs(run.complete),
            secs(run.complete_stored),
            run.log.len(),
            secs(percentile(&sorted(&run.log), 0.5))
        ));
        report.complete.push(run.complete);
        report.complete_stored.push(run.complete_stored);
        report.run_length.push(run.run_length);
        report.manifest_to_complete.push(run.manifest_to_complete);
        report.log.extend(run.log);
        report.log_stream.extend(run.log_stream);
        report.log_unseen += run.log_unseen;
    }
    report.wall = t0.elapsed();
    progress("standalone: done; stopping the hub and its Flower processes");
    hub.procs.stop_all();
    Ok(report)
}

/// The FAB ConfigMap `fedavg-fab`, as `kubectl create configmap --from-file` writes it.
fn fab_config_map(fab: &[u8]) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fedavg-fab\nbinaryData:\n  app.fab: {}\n",
        base64::engine::general_purpose::STANDARD.encode(fab)
    )
}

/// The standalone hub's `status.json` (None while it is missing or half-read).
fn read_status(state: &Path) -> Option<HubStatus> {
    let text = std::fs::read(state.join(STATUS_FILE)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Whether the run's stored state (`<state>/runs/default/<name>.json`) says Complete.
fn stored_complete(state: &Path, name: &str) -> bool {
    let path = state
        .join(flower_addon_hub::standalone::runs::RUNS_DIR)
        .join("default")
        .join(format!("{name}.json"));
    let Some(stored) = std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
    else {
        return false;
    };
    stored["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Complete" && c["status"] == "True")
    })
}

fn condition_true(status: &FlowerRunStatus, type_: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

async fn wait_federation_ready(state: &Path, procs: &mut Processes) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        procs.check_alive()?;
        if read_status(state).is_some_and(|s| s.federations.first().is_some_and(|f| f.ready)) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the Federation is not Ready after 180 s: {:?}",
            read_status(state).map(|s| s.federations)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What one standalone run measured.
struct RunFigures {
    run_id: u64,
    complete: Duration,
    complete_stored: Duration,
    run_length: Duration,
    manifest_to_complete: Duration,
    log: Vec<Duration>,
    log_stream: Vec<Duration>,
    log_unseen: usize,
}

/// Chunks the bench's own log stream received: Flower's timestamp of the chunk's newest line
/// and when the bench received it (seconds since the epoch).
type Chunks = Arc<Mutex<Vec<(f64, f64)>>>;

/// Writes FlowerRun `name`'s manifest and watches the status files until it is Complete.
async fn one_run(hub: &mut Standalone, name: &str, args: &Args) -> Result<RunFigures> {
    std::fs::write(
        hub.manifests.join(format!("run-{name}.yaml")),
        format!(
            "apiVersion: flower-addon.io/v1alpha1\nkind: FlowerRun\nmetadata:\n  name: {name}\nspec:\n  federationRef:\n    name: quickstart\n  app:\n    fab:\n      configMapRef: {{name: fedavg-fab, key: app.fab}}\n  runConfig: {{num-server-rounds: {}, min-nodes: 2}}\n",
            args.rounds
        ),
    )?;
    let written = Instant::now();
    let poll = Duration::from_millis(args.poll_ms.max(1));
    let chunks: Chunks = Arc::default();
    let mut follower: Option<tokio::task::JoinHandle<()>> = None;
    // (when the bench read it, status.logTimestamp) at each change.
    let mut seen_timestamps: Vec<(f64, f64)> = Vec::new();
    let mut last_timestamp = None;
    let mut run_id = None;
    let mut stored_at = None;
    let (complete_at, complete_after) = loop {
        ensure!(
            written.elapsed() < RUN_TIMEOUT,
            "not Complete after {} s: {:?}",
            RUN_TIMEOUT.as_secs(),
            read_status(&hub.state).and_then(|s| s.runs.into_iter().find(|r| r.name == name))
        );
        hub.procs.check_alive()?;
        // The stored state is written first in a pass, status.json at its end.
        if stored_at.is_none() && stored_complete(&hub.state, name) {
            stored_at = Some(epoch_now());
        }
        let status = read_status(&hub.state)
            .and_then(|s| s.runs.into_iter().find(|r| r.name == name))
            .map(|r| r.status);
        let now = epoch_now();
        if let Some(status) = status {
            if run_id.is_none()
                && let Some(id) = status.run_id.as_deref().and_then(|id| id.parse().ok())
            {
                run_id = Some(id);
                follower = Some(tokio::spawn(follow_log(
                    hub.control.clone(),
                    id,
                    chunks.clone(),
                )));
            }
            if status.log_timestamp != last_timestamp {
                last_timestamp = status.log_timestamp;
                if let Some(ts) = last_timestamp {
                    seen_timestamps.push((now, ts));
                }
            }
            if condition_true(&status, "Complete") {
                break (now, written.elapsed());
            }
            if condition_true(&status, "Failed") {
                bail!(
                    "the run failed: {}",
                    serde_json::to_string(&status).unwrap_or_default()
                );
            }
        }
        tokio::time::sleep(poll).await;
    };
    let stored_at = stored_at.unwrap_or(complete_at);
    let run_id = run_id.context("Complete without a run id")?;
    let listed = hub
        .control
        .list_runs()
        .await?
        .into_iter()
        .find(|r| r.run_id == run_id)
        .with_context(|| format!("the SuperLink does not list run {run_id}"))?;
    let finished = flower_time(&listed.finished_at)
        .with_context(|| format!("Flower's finished_at {:?}", listed.finished_at))?;
    let running = flower_time(&listed.running_at).unwrap_or(finished);
    // Flower ends the stream once the run finished and its log was sent.
    if let Some(follower) = follower {
        let abort = follower.abort_handle();
        if tokio::time::timeout(Duration::from_secs(10), follower)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
    let chunks = chunks.lock().map(|c| c.clone()).unwrap_or_default();
    let mut log = Vec::new();
    let mut log_stream = Vec::new();
    let mut log_unseen = 0;
    for (ts, received) in chunks {
        log_stream.push(between(ts, received));
        match seen_timestamps.iter().find(|(_, t)| *t >= ts - 1e-6) {
            Some((seen, _)) => log.push(between(ts, *seen)),
            None => log_unseen += 1,
        }
    }
    Ok(RunFigures {
        run_id,
        complete: between(finished, complete_at),
        complete_stored: between(finished, stored_at),
        run_length: between(running, finished),
        manifest_to_complete: complete_after,
        log,
        log_stream,
        log_unseen,
    })
}

/// Follows run `run_id`'s log as the hub does (StreamLogs, reopened after the last timestamp
/// while it ends with news), recording each chunk's timestamp and arrival.
async fn follow_log(client: Arc<ControlClient>, run_id: u64, chunks: Chunks) {
    let mut after = 0.0_f64;
    loop {
        let Ok(mut stream) = client.stream_logs(run_id, after).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut news = false;
        while let Some(Ok(chunk)) = stream.next().await {
            let at = epoch_now();
            after = after.max(chunk.timestamp);
            news = true;
            if let Ok(mut c) = chunks.lock() {
                c.push((chunk.timestamp, at));
            }
        }
        if !news {
            return;
        }
    }
}

impl StandaloneReport {
    fn print(&self, args: &Args) {
        let complete = sorted(&self.complete);
        let p50 = percentile(&complete, 0.5);
        println!();
        println!(
            "standalone hub, Flower {}: {} runs of examples/fedavg ({} round(s), 2 SuperNodes), status files read every {} ms; Federation Ready in {}; part took {}",
            args.flower,
            self.complete.len(),
            args.rounds,
            args.poll_ms,
            secs(self.federation_ready),
            secs(self.wall)
        );
        println!(
            "{:<58} {:>7} {:>7} {:>7} {:>5}   {:<12} result",
            "latency (s)", "p50", "p90", "max", "n", "target"
        );
        let row = |what: &str, v: &[Duration], target: &str, result: &str| {
            let v = sorted(v);
            println!(
                "{what:<58} {:>7} {:>7} {:>7} {:>5}   {target:<12} {result}",
                s3(percentile(&v, 0.5)),
                s3(percentile(&v, 0.9)),
                s3(percentile(&v, 1.0)),
                v.len()
            );
        };
        row(
            "run finished (Flower finished_at) → Complete in status.json",
            &self.complete,
            &format!("p50 ≤ {} s", TARGET_COMPLETE_P50.as_secs()),
            verdict(p50 <= TARGET_COMPLETE_P50),
        );
        row(
            "  → Complete in the run's stored state (runs/…json)",
            &self.complete_stored,
            "",
            "",
        );
        row(
            "SuperLink stored a log line → in status.json logTail",
            &self.log,
            "(none)",
            "",
        );
        row(
            "  floor: → the bench's own StreamLogs received it",
            &self.log_stream,
            "",
            "",
        );
        row(
            "(context) Flower running_at → finished_at",
            &self.run_length,
            "",
            "",
        );
        row(
            "(context) manifest written → Complete in status.json",
            &self.manifest_to_complete,
            "",
            "",
        );
        if self.log_unseen > 0 {
            println!(
                "  {} streamed log line(s) never covered by status.logTimestamp",
                self.log_unseen
            );
        }
        println!(
            "  method: Flower's timestamps (SuperLink clock = this machine's) against the bench's first read of \
             status.json (every {} ms) that shows Complete / a logTimestamp ≥ the line's; the log lines timed are \
             the newest line of each chunk of the bench's own StreamLogs; the ServerApp → SuperLink upload \
             (every 0.2 s) comes before and is not counted",
            args.poll_ms
        );
    }
}

// === Kubernetes ===

/// What the Kubernetes part measured.
struct KubeReport {
    /// The hub's restart with the finished runs present, until it settled.
    startup: Window,
    /// Window (a): finished runs.
    finished: Window,
    /// Window (b): runs waiting for a Federation that is not Ready.
    waiting: Window,
    /// Runs that were Complete after the restart / waiting after (b)'s set-up.
    complete_runs: usize,
    waiting_runs: usize,
    /// The not-Ready Federation's Ready message.
    federation_message: String,
    /// Whether the standalone part ran during window (a).
    standalone_during_a: bool,
}

/// Counters at one moment.
struct Mark {
    requests: BTreeMap<String, u64>,
    apiserver: ApiserverCounts,
    cpu: Duration,
    reconciles: f64,
    at: Instant,
}

/// Sums of `apiserver_request_total`.
#[derive(Clone, Copy, Default)]
struct ApiserverCounts {
    /// Every client, every resource.
    all: f64,
    /// Every client, FlowerRuns (and their status).
    flowerruns: f64,
}

/// Counter deltas over a window.
#[derive(Default)]
struct Window {
    requests: BTreeMap<String, u64>,
    apiserver: ApiserverCounts,
    cpu: Duration,
    reconciles: f64,
    wall: Duration,
    rss_kib: u64,
}

type During<'a> = Option<Pin<Box<dyn Future<Output = Result<StandaloneReport>> + 'a>>>;

/// Runs the Kubernetes part; `during_a` (the standalone part) runs during window (a).
async fn kube_bench(
    args: &Args,
    during_a: During<'_>,
) -> Result<(KubeReport, Option<Result<StandaloneReport>>)> {
    progress(
        "kubernetes: starting a control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)",
    );
    let options = e2e::Options {
        nodes_per_cluster: 1,
        ..Default::default()
    };
    let mut cp = ControlPlane::start_with(&["hub"], options).await?;
    let result = kube_windows(&mut cp, args, during_a).await;
    cp.log_tails_on_error(&result, &[HUB_PROC]);
    progress("kubernetes: stopping the control plane");
    drop(cp);
    result
}

async fn kube_windows(
    cp: &mut ControlPlane,
    args: &Args,
    during_a: During<'_>,
) -> Result<(KubeReport, Option<Result<StandaloneReport>>)> {
    let n = args.kube_runs;
    let idle = Duration::from_secs(args.idle_seconds);
    let admin = cp.cluster("hub")?.client.clone();
    progress(
        "kubernetes: FlowSchemas that count the hub's requests, CRDs, namespaces, FAB ConfigMaps",
    );
    install_flow_schemas(&admin, &RESOURCES, "run-bench").await?;
    e2e::install_crds(&admin).await?;
    let fab =
        flower_addon_hub::flower::fab::build_from_dir(&e2e::repo_root().join("examples/fedavg"))?;
    for ns in [NS_FINISHED, NS_WAITING] {
        Api::<Namespace>::all(admin.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
            )
            .await
            .with_context(|| format!("creating namespace {ns}"))?;
        let config_map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "fedavg-fab", "namespace": ns},
            "binaryData": {"app.fab": base64::engine::general_purpose::STANDARD.encode(&fab.bytes)},
        }))?;
        Api::<ConfigMap>::namespaced(admin.clone(), ns)
            .create(&PostParams::default(), &config_map)
            .await
            .with_context(|| format!("creating ConfigMap {ns}/fedavg-fab"))?;
    }
    progress("kubernetes: installing the hub (manifests/hub, its ServiceAccount, --leader-elect)");
    let addon = Addon::install(cp, &[], &AddonOptions::default()).await?;
    let metrics = addon
        .ops
        .get(HUB_PROC)
        .context("the hub's metrics address")?
        .metrics;
    let startup_counts = validate_counting(cp, &admin).await?;
    progress(format!(
        "kubernetes: counting validated: the hub's start-up made {}",
        per_resource(&startup_counts, 1.0).join("; ")
    ));

    // (a) Finished runs.
    progress(format!(
        "kubernetes (a): creating {n} FlowerRuns (Federation `trained` does not exist: they wait), then setting them Complete through the status subresource"
    ));
    create_runs(cp, &admin, metrics, NS_FINISHED, "finished", "trained", n).await?;
    let runs_a = Api::<FlowerRun>::namespaced(admin.clone(), NS_FINISHED);
    let now = Timestamp::from_second(Timestamp::now().as_second())?;
    for i in 0..n {
        let name = format!("finished-{i:03}");
        let spec = runs_a.get(&name).await?.spec;
        runs_a
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(complete_status(i, &spec, &fab.hash, now)),
            )
            .await
            .with_context(|| format!("setting FlowerRun {name} Complete"))?;
    }
    progress(format!(
        "kubernetes (a): restarting the hub so that it starts with {n} finished runs"
    ));
    let start = mark(&admin, cp, metrics).await?;
    cp.processes().stop(HUB_PROC)?;
    addon.start(cp, HUB_PROC)?;
    settle(cp, &admin, metrics, n as f64).await?;
    let mut startup = window(&start, &admin, cp, metrics).await?;
    // CPU and reconciles of the new process since it started (the first mark was the old one's).
    startup.cpu = cpu_time(hub_pid(cp)?)?;
    startup.reconciles = hub_reconciles(metrics);
    let complete_runs = count_runs(&runs_a, |s| condition_true(s, "Complete")).await?;
    ensure!(
        complete_runs == n,
        "only {complete_runs} of {n} FlowerRuns are Complete after the hub's restart"
    );
    progress(format!(
        "kubernetes (a): window of {} s with {n} finished runs{}",
        args.idle_seconds,
        if during_a.is_some() {
            " (the standalone part runs meanwhile; the window lasts until it is done too)"
        } else {
            ""
        }
    ));
    let standalone_during_a = during_a.is_some();
    let start = mark(&admin, cp, metrics).await?;
    let idle_window = async {
        tokio::time::sleep(idle).await;
        Ok::<_, anyhow::Error>(())
    };
    let standalone = match during_a {
        Some(during) => {
            let (waited, report) = tokio::join!(idle_window, during);
            waited?;
            Some(report)
        }
        None => {
            idle_window.await?;
            None
        }
    };
    cp.processes().check_alive()?;
    let finished = window(&start, &admin, cp, metrics).await?;

    // (b) Runs waiting for a Federation that is not Ready.
    progress(format!(
        "kubernetes (b): Federation `waiting` (placementRef names a Placement that does not exist) and {n} FlowerRuns waiting for it"
    ));
    let feds = Api::<Federation>::namespaced(admin.clone(), NS_WAITING);
    feds.create(&PostParams::default(), &not_ready_federation()?)
        .await
        .context("creating Federation waiting")?;
    let federation_message = e2e::wait_for(
        "Federation waiting: Ready=False",
        Duration::from_secs(60),
        || async {
            let fed = feds.get("waiting").await?;
            Ok(fed.status.and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == "Ready" && c.status == "False")
                    .map(|c| c.message.clone())
            }))
        },
    )
    .await?;
    create_runs(cp, &admin, metrics, NS_WAITING, "waiting", "waiting", n).await?;
    let runs_b = Api::<FlowerRun>::namespaced(admin.clone(), NS_WAITING);
    let waiting_runs = count_runs(&runs_b, |s| {
        s.conditions.iter().any(|c| {
            c.type_ == "Submitted"
                && c.status == "False"
                && c.reason == flower_addon_crds::run::reason::FEDERATION_NOT_READY
        })
    })
    .await?;
    ensure!(
        waiting_runs == n,
        "only {waiting_runs} of {n} FlowerRuns say they wait for their Federation"
    );
    progress(format!(
        "kubernetes (b): window of {} s with {n} waiting runs (and the {n} finished ones)",
        args.idle_seconds
    ));
    let start = mark(&admin, cp, metrics).await?;
    tokio::time::sleep(idle).await;
    cp.processes().check_alive()?;
    let waiting = window(&start, &admin, cp, metrics).await?;
    Ok((
        KubeReport {
            startup,
            finished,
            waiting,
            complete_runs,
            waiting_runs,
            federation_message,
            standalone_during_a,
        },
        standalone,
    ))
}

/// Creates FlowerRuns `<prefix>-000`, `<prefix>-001` … (`n` of them) in namespace `ns` on
/// Federation `federation`, then waits until the hub has reconciled each and settled.
async fn create_runs(
    cp: &mut ControlPlane,
    admin: &Client,
    metrics: std::net::SocketAddr,
    ns: &str,
    prefix: &str,
    federation: &str,
    n: usize,
) -> Result<()> {
    let runs = Api::<FlowerRun>::namespaced(admin.clone(), ns);
    let base = hub_reconciles(metrics);
    for i in 0..n {
        let name = format!("{prefix}-{i:03}");
        runs.create(&PostParams::default(), &flower_run(&name, ns, federation)?)
            .await
            .with_context(|| format!("creating FlowerRun {name}"))?;
    }
    settle(cp, admin, metrics, base + n as f64).await
}

/// How many FlowerRuns of `runs` have a status for which `holds` is true.
async fn count_runs(
    runs: &Api<FlowerRun>,
    holds: impl Fn(&FlowerRunStatus) -> bool,
) -> Result<usize> {
    Ok(runs
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|r| r.status.as_ref().is_some_and(&holds))
        .count())
}

/// A FlowerRun of examples/fedavg (ConfigMap `fedavg-fab`) on Federation `federation`.
fn flower_run(name: &str, namespace: &str, federation: &str) -> Result<FlowerRun> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "FlowerRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "federationRef": {"name": federation},
            "app": {"fab": {"configMapRef": {"name": "fedavg-fab", "key": "app.fab"}}},
            "runConfig": {"num-server-rounds": 1, "min-nodes": 2},
        }
    }))?)
}

/// The status the hub writes for a run Flower completed (one round), as a merge patch.
fn complete_status(
    i: usize,
    spec: &flower_addon_crds::run::FlowerRunSpec,
    fab_hash: &str,
    at: Timestamp,
) -> serde_json::Value {
    let run_id = 7_000_000 + i as u64;
    let at = at.to_string();
    let condition = |type_: &str, status: &str, reason: &str, message: String| {
        json!({
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": at, "observedGeneration": 1,
        })
    };
    json!({"status": {
        "runId": run_id.to_string(),
        "flowerStatus": "finished:completed",
        "details": null,
        "pendingSubmission": null,
        "attempts": 1,
        "submittedAt": at,
        "firstSubmittedAt": at,
        "startedAt": at,
        "finishedAt": at,
        "runConfigHash": flower_addon_hub::core::run::run_config_hash(spec),
        "fabHash": fab_hash,
        "progress": {"current": 1, "total": 1, "text": "1/1"},
        "logTail": ["round 1/1: replies=2 nodes=2 loss=0.5", "final: rounds=1"],
        "logTimestamp": epoch_now(),
        "observedGeneration": 1,
        "conditions": [
            condition("Complete", "True", "Completed", format!("Flower run {run_id} finished:completed")),
            condition("Running", "False", "Finished", "the run finished".into()),
            condition("Submitted", "True", "Submitted", format!("Flower run {run_id} (attempt 1)")),
        ],
    }})
}

/// A Federation that stays not Ready: its placementRef names a Placement that does not exist
/// (its SuperLink is exposed by NodePort, so that this is the only reason).
fn not_ready_federation() -> Result<Federation> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "Federation",
        "metadata": {"name": "waiting", "namespace": NS_WAITING},
        "spec": {
            "mode": "StatefulSet",
            "isolationMode": "subprocess",
            "insecure": true,
            "placementRef": {"name": "nowhere"},
            "superlink": {"image": "flwr/superlink:1.42.0", "service": {"type": "NodePort"}},
            "supernodes": {
                "image": "flwr/supernode:1.42.0",
                "pools": [{"name": "a", "replicas": 1}]
            }
        }
    }))?)
}

fn hub_pid(cp: &mut ControlPlane) -> Result<u32> {
    Ok(cp
        .processes()
        .get(HUB_PROC)
        .context("the hub process is not running")?
        .pid())
}

/// The hub's FlowerRun reconciles so far (0 while its metrics do not answer).
fn hub_reconciles(metrics: std::net::SocketAddr) -> f64 {
    Samples::scrape(metrics)
        .map(|s| {
            s.count(
                "flower_addon_hub_reconciles_total",
                &[("controller", "flowerrun")],
            )
        })
        .unwrap_or(0.0)
}

/// Waits until the hub has made at least `reconciles` FlowerRun reconciles and then no request
/// but Lease renewals and watches for [`QUIET`].
async fn settle(
    cp: &mut ControlPlane,
    admin: &Client,
    metrics: std::net::SocketAddr,
    reconciles: f64,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last: Option<(u64, Instant)> = None;
    loop {
        cp.processes().check_alive()?;
        let done = hub_reconciles(metrics);
        let busy = busy_requests(&hub_requests(admin).await?);
        if done >= reconciles {
            match last {
                Some((n, since)) if n == busy => {
                    if since.elapsed() >= QUIET {
                        return Ok(());
                    }
                }
                _ => last = Some((busy, Instant::now())),
            }
        }
        ensure!(
            Instant::now() < deadline,
            "the hub did not settle within 120 s ({done} of {reconciles} FlowerRun reconciles)"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Requests other than Lease renewals and watches.
fn busy_requests(requests: &BTreeMap<String, u64>) -> u64 {
    requests
        .iter()
        .filter(|(k, _)| {
            let mut parts = k.split('/');
            let verb = parts.next();
            let resource = parts.next();
            verb != Some("watch") && resource != Some("leases")
        })
        .map(|(_, n)| n)
        .sum()
}

async fn mark(
    admin: &Client,
    cp: &mut ControlPlane,
    metrics: std::net::SocketAddr,
) -> Result<Mark> {
    Ok(Mark {
        requests: hub_requests(admin).await?,
        apiserver: apiserver_counts(admin).await?,
        cpu: cpu_time(hub_pid(cp)?)?,
        reconciles: hub_reconciles(metrics),
        at: Instant::now(),
    })
}

async fn window(
    start: &Mark,
    admin: &Client,
    cp: &mut ControlPlane,
    metrics: std::net::SocketAddr,
) -> Result<Window> {
    let end = mark(admin, cp, metrics).await?;
    let pid = hub_pid(cp)?;
    Ok(Window {
        requests: counter_deltas(&start.requests, &end.requests),
        apiserver: ApiserverCounts {
            all: end.apiserver.all - start.apiserver.all,
            flowerruns: end.apiserver.flowerruns - start.apiserver.flowerruns,
        },
        cpu: end.cpu.saturating_sub(start.cpu),
        reconciles: end.reconciles - start.reconciles,
        wall: end.at - start.at,
        rss_kib: e2e::process::rss_kib(pid).unwrap_or(0),
    })
}

/// `apiserver_request_total` summed: every request, and those on FlowerRuns.
async fn apiserver_counts(admin: &Client) -> Result<ApiserverCounts> {
    const METRIC: &str = "apiserver_request_total{";
    let text = apiserver_metrics(admin).await?;
    let mut counts = ApiserverCounts::default();
    for line in text.lines().filter(|l| l.starts_with(METRIC)) {
        let value = metric_value(line)?;
        counts.all += value;
        if line.contains("resource=\"flowerruns\"") {
            counts.flowerruns += value;
        }
    }
    ensure!(counts.all > 0.0, "the apiserver's /metrics has no {METRIC}");
    Ok(counts)
}

impl Window {
    fn minutes(&self) -> f64 {
        self.wall.as_secs_f64() / 60.0
    }

    fn total(&self) -> u64 {
        self.requests.values().sum()
    }

    /// Requests on FlowerRuns (and their status), any verb.
    fn flowerrun_requests(&self) -> u64 {
        requests_on(&self.requests, "flowerruns")
    }

    /// Leader election's requests (Lease get/update/create).
    fn lease_requests(&self) -> u64 {
        requests_on(&self.requests, "leases")
    }
}

impl KubeReport {
    fn print(&self, args: &Args) {
        let n = args.kube_runs;
        println!();
        println!(
            "Kubernetes mode: the hub under its ServiceAccount with --leader-elect, {n} FlowerRuns per window; requests are the hub's own (FlowSchemas on its ServiceAccount), per minute"
        );
        println!(
            "{:<38} {:>6} {:>9} {:>8} {:>9} {:>9} {:>8} {:>10} {:>8}   {:<16} result",
            "window",
            "min",
            "hub req",
            "/run",
            "/run -L",
            "frun req",
            "leases",
            "hub CPU s",
            "% core",
            "target"
        );
        let row = |what: &str, w: &Window, target: bool| {
            let minutes = w.minutes().max(1e-9);
            let per_minute = w.total() as f64 / minutes;
            let per_run = per_minute / n as f64;
            let cpu = w.cpu.as_secs_f64();
            let target_text = if target {
                format!("≤ {TARGET_REQUESTS_PER_RUN_MINUTE} /run/min")
            } else {
                String::from("(same bar)")
            };
            let result = verdict(per_run <= TARGET_REQUESTS_PER_RUN_MINUTE);
            println!(
                "{what:<38} {:>6.2} {:>9.2} {:>8.3} {:>9.3} {:>9.2} {:>8.2} {:>10.2} {:>7.2}%   {target_text:<16} {result}",
                minutes,
                per_minute,
                per_run,
                (w.total() - w.lease_requests()) as f64 / minutes / n as f64,
                w.flowerrun_requests() as f64 / minutes,
                w.lease_requests() as f64 / minutes,
                cpu,
                cpu / w.wall.as_secs_f64().max(1e-9) * 100.0,
            );
        };
        row(
            &format!("(a) {n} finished runs, idle"),
            &self.finished,
            true,
        );
        row(
            &format!("(b) {n} waiting + {n} finished, idle"),
            &self.waiting,
            false,
        );
        println!(
            "  columns: window length (min); the hub's requests per minute: all, per run, per run without Lease requests, on FlowerRuns, Lease requests (leader election's renewals, whatever the runs); hub CPU (utime+stime) in the window and its share of one core; the verdict counts every request, Leases included"
        );
        for (what, w) in [("(a)", &self.finished), ("(b)", &self.waiting)] {
            let minutes = w.minutes().max(1e-9);
            println!(
                "  {what} hub requests per minute: {}",
                per_resource(&w.requests, minutes).join("; ")
            );
            println!(
                "  {what} apiserver_request_total per minute: FlowerRuns {:.2} (any client: only the hub's; watches count when they close), everything {:.1} (every component); hub FlowerRun reconciles {:.0}; hub RSS {:.1} MiB",
                w.apiserver.flowerruns / minutes,
                w.apiserver.all / minutes,
                w.reconciles,
                w.rss_kib as f64 / 1024.0
            );
        }
        if self.standalone_during_a {
            println!(
                "  (a) ran beside the standalone part (other processes): the hub's own CPU time and requests do not depend on that load"
            );
        }
        println!(
            "  hub restart with {n} finished runs: {} requests until settled ({}), {:.2} s CPU, {:.0} FlowerRun reconciles; {} Complete after it",
            self.startup.total(),
            per_resource(&self.startup.requests, 1.0).join("; "),
            self.startup.cpu.as_secs_f64(),
            self.startup.reconciles,
            self.complete_runs
        );
        println!(
            "  (b) runs: {} say Submitted=False FederationNotReady; the Federation's Ready message: {}",
            self.waiting_runs, self.federation_message
        );
    }
}

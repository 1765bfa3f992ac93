//! Agent and hub memory: the resident set of `flower-agent` (a) joined with no work, (b)
//! supervising two real SuperNodes in standalone mode (the demo's set-up: two agents, the
//! quickstart Federation, 2 SuperNodes each), (c) in Kubernetes mode with a Federation applied
//! (real kube-apiservers from the e2e harness, kwok pods), and the hub's idle RSS with 0
//! Federations in both modes. Every daemon is a child process, so each figure is its own.
//!
//! `cargo build --release --bins && cargo run --release -p e2e --bin agent_rss -- [--settle 15s]
//! [--skip-standalone] [--skip-kube] [--mappings]`. The binaries measured are the ones of
//! the bench's own profile (`target/release` with `--release`); the profile is printed. Targets
//! (the memory budget of small devices): agent ≤ 15 MiB in (b) and (c), hub ≤ 20 MiB idle.
//!
//! RSS is `VmRSS` after `--settle` (sampled every second, the largest sample printed too), split
//! into `RssAnon` (heap, stacks) and `RssFile` (mostly the binary's own code pages), with the
//! thread count. The daemons inherit the environment: `TOKIO_WORKER_THREADS=N cargo run …` shows
//! what a machine with N cores would cost a multi-thread runtime, on this one.
use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use e2e::addon::{Addon, AddonOptions, Bootstrap, Spoke};
use e2e::harness::{Processes, SpacedPorts, Wait, binary, flower_venv, tail};
use e2e::{ControlPlane, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const FLOWER_VERSION: &str = "1.42.0";
/// Target for the agent in (b) and (c), KiB.
const AGENT_TARGET_KIB: u64 = 15 * 1024;
/// Target for the idle hub, KiB.
const HUB_TARGET_KIB: u64 = 20 * 1024;

#[derive(Parser, Debug)]
#[command(about = "flower-addon agent and hub RSS benchmark")]
struct Args {
    /// How long each state settles before it is measured (sampled every second).
    #[arg(long, default_value = "15s", value_parser = humantime_duration)]
    settle: Duration,
    /// Skip the standalone cases (a, b).
    #[arg(long)]
    skip_standalone: bool,
    /// Skip the Kubernetes case (c).
    #[arg(long)]
    skip_kube: bool,
    /// Also print where each process's file-backed RSS lies (its largest mappings, from
    /// `/proc/<pid>/smaps`).
    #[arg(long)]
    mappings: bool,
}

/// Set from `--mappings`.
static MAPPINGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The resident KiB of `pid`'s file mappings, by path, largest first.
fn file_mappings(pid: u32) -> Vec<(String, u64)> {
    let Ok(smaps) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) else {
        return Vec::new();
    };
    let mut by_path: std::collections::BTreeMap<String, u64> = Default::default();
    let mut path: Option<String> = None;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: "start-end perms offset dev inode [path]".
            path = line
                .split_whitespace()
                .nth(5)
                .filter(|p| p.starts_with('/'))
                .map(str::to_owned);
        } else if first == "Rss:"
            && let Some(p) = &path
        {
            let kib: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            *by_path.entry(p.clone()).or_default() += kib;
        }
    }
    let mut sorted: Vec<(String, u64)> = by_path.into_iter().filter(|(_, k)| *k > 0).collect();
    sorted.sort_by_key(|m| std::cmp::Reverse(m.1));
    sorted
}

fn humantime_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().map_err(|e| format!("{s}: {e}"))?;
    match unit {
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("{s}: use seconds (15s) or minutes (1m)")),
    }
}

// === measuring ===

/// One process's memory from `/proc/<pid>/status`, KiB.
#[derive(Clone, Copy, Debug, Default)]
struct Mem {
    rss: u64,
    anon: u64,
    file: u64,
    hwm: u64,
    threads: u64,
}

fn mem(pid: u32) -> Result<Mem> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("process {pid} is gone"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(Mem {
        rss: field("VmRSS:"),
        anon: field("RssAnon:"),
        file: field("RssFile:"),
        hwm: field("VmHWM:"),
        threads: field("Threads:"),
    })
}

/// Samples `pids` every second for `settle`; the last sample of each and the largest RSS seen.
fn settle_and_measure(pids: &[(String, u32)], settle: Duration) -> Result<Vec<(String, Mem, u64)>> {
    let start = Instant::now();
    let mut peak = vec![0u64; pids.len()];
    loop {
        let now: Vec<Mem> = pids.iter().map(|(_, p)| mem(*p)).collect::<Result<_>>()?;
        for (p, m) in peak.iter_mut().zip(&now) {
            *p = (*p).max(m.rss);
        }
        if start.elapsed() >= settle {
            if MAPPINGS.load(std::sync::atomic::Ordering::Relaxed) {
                for (name, pid) in pids {
                    let shown: Vec<String> = file_mappings(*pid)
                        .into_iter()
                        .take(4)
                        .map(|(p, k)| format!("{p} {:.1} MiB", mib(k)))
                        .collect();
                    println!("    {name}: file-backed {}", shown.join(", "));
                }
            }
            return Ok(pids
                .iter()
                .zip(now)
                .zip(peak)
                .map(|(((name, _), m), p)| (name.clone(), m, p))
                .collect());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// One result line; `target` (KiB) adds a verdict.
fn report(case: &str, name: &str, m: &Mem, peak: u64, target: Option<u64>) -> bool {
    let verdict = match target {
        Some(t) if m.rss <= t => format!("  ok (≤ {:.0} MiB)", mib(t)),
        Some(t) => format!(
            "  OVER by {:.1} MiB (target {:.0} MiB)",
            mib(m.rss - t),
            mib(t)
        ),
        None => String::new(),
    };
    println!(
        "{case:<44} {name:<10} rss={:>5.1} MiB (anon {:>4.1}, file {:>4.1}) peak={:>5.1} hwm={:>5.1} threads={}{verdict}",
        mib(m.rss),
        mib(m.anon),
        mib(m.file),
        mib(peak),
        mib(m.hwm),
        m.threads
    );
    target.is_none_or(|t| m.rss <= t)
}

// === standalone (a, b) ===

/// `program args…` with the environment every Flower-side process of the demo gets.
fn flower_command(program: &Path, args: &[String]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("FLWR_TELEMETRY_ENABLED", "0")
        .env("FLWR_DISABLE_UPDATE_CHECK", "1");
    cmd
}

fn run_ok(mut cmd: Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    ensure!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The demo: standalone hub, two agents joined, accepted and running the process runtime; then
/// the quickstart Federation (2 SuperNodes per agent). Returns whether the targets were met.
fn standalone(args: &Args) -> Result<bool> {
    let hub_bin = binary("flower-hub")?;
    let agent_bin = binary("flower-agent")?;
    let venv = flower_venv(FLOWER_VERSION)?;
    let work = tempfile::Builder::new()
        .prefix("flower-addon-agent-rss.")
        .tempdir()?;
    let dir = work.path();
    let (hub_dir, manifests) = (dir.join("hub"), dir.join("manifests"));
    std::fs::create_dir_all(&manifests)?;
    let mut ports = SpacedPorts::new(12);
    let hub_port = ports.take()?;
    let mut procs = Processes::default();
    let s = |p: &Path| p.display().to_string();
    let hub_args: Vec<String> = vec![
        "serve".into(),
        "--standalone".into(),
        "--state-dir".into(),
        s(&hub_dir),
        "--manifests".into(),
        s(&manifests),
        "--listen".into(),
        format!("127.0.0.1:{hub_port}"),
        "--advertise-address".into(),
        "127.0.0.1".into(),
        "--flower-bin".into(),
        s(&venv.join("bin")),
    ];
    procs.start_group(
        "hub",
        flower_command(&hub_bin, &hub_args),
        &dir.join("hub.log"),
    )?;
    let logs = |procs: &Processes| procs.log_tails(None);
    Wait::new("the hub's address file", Duration::from_secs(30))
        .for_value_blocking(|| Ok(hub_dir.join("hub-address").is_file().then_some(())))
        .with_context(|| logs(&procs))?;
    let hub = |args: &[&str]| {
        let mut cmd = Command::new(&hub_bin);
        cmd.args(args).arg("--state-dir").arg(&hub_dir);
        run_ok(cmd, &format!("flower-hub {}", args.join(" ")))
    };
    let token: Value = serde_json::from_str(&hub(&[
        "token", "create", "--ttl", "1h", "--output", "json",
    ])?)?;
    let (token, ca_hash) = (
        token["token"].as_str().context("token")?.to_owned(),
        token["caHash"].as_str().context("caHash")?.to_owned(),
    );
    let mut agents = Vec::new();
    for (i, site) in [(1, "a"), (2, "b")] {
        let state = dir.join(format!("agent-{i}"));
        let join_log = dir.join(format!("join-{i}.log"));
        let join: Vec<String> = vec![
            "join".into(),
            "--hub".into(),
            format!("127.0.0.1:{hub_port}"),
            "--token".into(),
            token.clone(),
            "--ca-hash".into(),
            ca_hash.clone(),
            "--cluster-name".into(),
            format!("edge-{i}"),
            "--state-dir".into(),
            s(&state),
        ];
        procs.start_command(
            &format!("join-{i}"),
            flower_command(&agent_bin, &join),
            &join_log,
        )?;
        Wait::new(
            format!("edge-{i} waiting for acceptance"),
            Duration::from_secs(30),
        )
        .detail(|| tail(&join_log, 10))
        .until_blocking(|| {
            Ok(std::fs::read_to_string(&join_log)?.contains("waiting for the hub to accept"))
        })?;
        hub(&[
            "accept",
            &format!("edge-{i}"),
            "--label",
            &format!("site={site}"),
            "--label",
            "demo=quickstart",
        ])?;
        let joined = procs.get_mut(&format!("join-{i}"))?;
        let status = Wait::new(
            format!("edge-{i}'s join to finish"),
            Duration::from_secs(30),
        )
        .detail(|| tail(&join_log, 10))
        .for_value_blocking(|| Ok(joined.exited()))?;
        ensure!(
            status.success(),
            "join of edge-{i}: {}",
            tail(&join_log, 10)
        );
        let run: Vec<String> = vec![
            "run".into(),
            "--state-dir".into(),
            s(&state),
            "--runtime".into(),
            "process".into(),
            "--flower-bin".into(),
            s(&venv.join("bin")),
            "--port-base".into(),
            ports.take()?.to_string(),
        ];
        let log = dir.join(format!("agent-{i}.log"));
        procs.start_group(
            &format!("agent-{i}"),
            flower_command(&agent_bin, &run),
            &log,
        )?;
        Wait::new(format!("edge-{i}'s work stream"), Duration::from_secs(30))
            .detail(|| tail(&log, 10))
            .until_blocking(|| Ok(std::fs::read_to_string(&log)?.contains("work stream open")))?;
        agents.push((
            format!("agent-{i}"),
            procs.get(&format!("agent-{i}")).context("agent")?.pid(),
        ));
    }
    let hub_pid = ("hub".to_string(), procs.get("hub").context("hub")?.pid());
    let mut ok = true;

    // (a) joined, no work; the standalone hub idle with 0 Federations.
    let mut pids = agents.clone();
    pids.push(hub_pid.clone());
    for (name, m, peak) in settle_and_measure(&pids, args.settle)? {
        let (case, target) = if name == "hub" {
            ("standalone hub idle, 0 Federations", None)
        } else {
            ("(a) standalone agent joined, no work", None)
        };
        ok &= report(case, &name, &m, peak, target);
    }

    // (b) the quickstart Federation: 2 SuperNodes on each agent.
    let fed_ports = [ports.take()?, ports.take()?, ports.take()?];
    let fed =
        std::fs::read_to_string(e2e::repo_root().join("examples/quickstart/federation.yaml"))?
            .replace("grpc: 19092", &format!("grpc: {}", fed_ports[0]))
            .replace("extra: 19093", &format!("extra: {}", fed_ports[1]))
            .replace(
                "serverAppIO: 19091",
                &format!("serverAppIO: {}", fed_ports[2]),
            );
    std::fs::write(manifests.join("federation.yaml"), fed)?;
    std::fs::copy(
        e2e::repo_root().join("examples/quickstart/placement.yaml"),
        manifests.join("placement.yaml"),
    )?;
    let t = Instant::now();
    Wait::new("4 SuperNodes connected", Duration::from_secs(180))
        .every(Duration::from_secs(1))
        .detail(|| logs(&procs))
        .until_blocking(|| {
            procs_alive(&pids)?;
            let status: Value = serde_json::from_str(&hub(&["status", "-o", "json"])?)?;
            Ok(status["federations"]
                .as_array()
                .and_then(|f| f.iter().find(|f| f["name"] == "quickstart"))
                .is_some_and(|f| f["ready"] == true && f["readySupernodes"] == 4))
        })?;
    eprintln!(
        "agent_rss: 4 SuperNodes connected {:.1}s after the Federation was applied",
        t.elapsed().as_secs_f64()
    );
    for (name, m, peak) in settle_and_measure(&agents, args.settle)? {
        ok &= report(
            "(b) standalone agent, 2 SuperNodes running",
            &name,
            &m,
            peak,
            Some(AGENT_TARGET_KIB),
        );
    }
    drop(procs);
    Ok(ok)
}

/// Fails if any of `pids` has exited.
fn procs_alive(pids: &[(String, u32)]) -> Result<()> {
    for (name, pid) in pids {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            bail!(e2e::harness::fatal(anyhow::anyhow!("{name} exited")));
        }
    }
    Ok(())
}

// === Kubernetes (c) ===

const NS: &str = "bench";

/// A hub cluster and one spoke on real kube-apiservers, the addon installed as the README says;
/// the hub idle with 0 Federations, then a Federation (one StatefulSet pool of 2) on the spoke.
async fn kubernetes(args: &Args) -> Result<bool> {
    e2e::install_crypto();
    let mut cp = ControlPlane::start(&["hub", "spoke-1"])
        .await
        .context("control plane (run e2e/k8s/build.sh if binaries are missing)")?;
    let client = cp.cluster("hub")?.client.clone();
    e2e::install_crds(&client).await?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": NS}}))?,
        )
        .await?;
    let options = AddonOptions {
        // The agent Deployment's own interval (the e2e default of 1 s only speeds tests up).
        status_interval: "3s".into(),
        ..AddonOptions::default()
    };
    let addon = Addon::install(
        &mut cp,
        &[Spoke::new("spoke-1", &[("env", "prod")], Bootstrap::Cli)],
        &options,
    )
    .await?;
    eprintln!(
        "agent_rss: spoke-1 joined in {:.1}s",
        addon.joined_in.as_secs_f64()
    );
    let pid = |cp: &mut ControlPlane, name: &str| -> Result<(String, u32)> {
        Ok((
            name.to_string(),
            cp.processes().get(name).context("daemon")?.pid(),
        ))
    };
    let pids = vec![pid(&mut cp, "flower-hub")?, pid(&mut cp, "agent-spoke-1")?];
    let mut ok = true;
    let settle = args.settle;
    let idle = tokio::task::spawn_blocking({
        let pids = pids.clone();
        move || settle_and_measure(&pids, settle)
    })
    .await??;
    for (name, m, peak) in idle {
        if name == "flower-hub" {
            ok &= report(
                "kubernetes hub idle, 0 Federations",
                "hub",
                &m,
                peak,
                Some(HUB_TARGET_KIB),
            );
        } else {
            ok &= report("kubernetes agent joined, no work", "agent", &m, peak, None);
        }
    }

    e2e::addon::bind_every_cluster(&client, NS).await?;
    let placement = serde_json::json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "Placement",
        "metadata": {"name": "all", "namespace": NS},
        "spec": {"predicates": [
            {"requiredClusterSelector": {"labelSelector": {"matchLabels": {"env": "prod"}}}}
        ]}
    });
    Api::<flower_addon_crds::Placement>::namespaced(client.clone(), NS)
        .patch(
            "all",
            &PatchParams::apply("agent-rss").force(),
            &Patch::Apply(&placement),
        )
        .await
        .context("apply Placement")?;
    // As kube_multicluster's: no key can be registered with a kwok SuperLink from a host-run hub.
    let fed = serde_json::json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "Federation",
        "metadata": {"name": "fed", "namespace": NS},
        "spec": {
            "mode": "StatefulSet",
            "isolationMode": "subprocess",
            "insecure": false,
            "supernodeAuthentication": false,
            "placementRef": {"name": "all"},
            "superlink": {"image": "flwr/superlink:1.42.0", "service": {"type": "NodePort"}},
            "supernodes": {"image": "flwr/supernode:1.42.0",
                           "pools": [{"name": "a", "replicas": 2, "images": {}}]},
        }
    });
    Api::<flower_addon_crds::Federation>::namespaced(client.clone(), NS)
        .patch(
            "fed",
            &PatchParams::apply("agent-rss").force(),
            &Patch::Apply(&fed),
        )
        .await
        .context("apply Federation")?;
    let spoke = Api::<StatefulSet>::namespaced(cp.cluster("spoke-1")?.client.clone(), NS);
    let t = Instant::now();
    let alive = std::sync::Mutex::new(&mut cp);
    wait_until(
        "pool a 2/2 ready on spoke-1",
        Duration::from_secs(120),
        || async {
            if let Ok(mut cp) = alive.lock() {
                cp.processes().check_alive().map_err(e2e::harness::fatal)?;
            }
            Ok(spoke
                .get_opt("fed-supernode-a")
                .await?
                .is_some_and(|s| s.status.and_then(|st| st.ready_replicas) == Some(2)))
        },
    )
    .await?;
    eprintln!(
        "agent_rss: pool a ready on spoke-1 {:.1}s after the Federation was applied",
        t.elapsed().as_secs_f64()
    );
    let running = tokio::task::spawn_blocking({
        let pids = pids.clone();
        move || settle_and_measure(&pids, settle)
    })
    .await??;
    for (name, m, peak) in running {
        if name == "flower-hub" {
            ok &= report("kubernetes hub, 1 Federation", "hub", &m, peak, None);
        } else {
            ok &= report(
                "(c) kubernetes agent, Federation applied",
                "agent",
                &m,
                peak,
                Some(AGENT_TARGET_KIB),
            );
        }
    }
    Ok(ok)
}

fn main() -> Result<()> {
    let args = Args::parse();
    MAPPINGS.store(args.mappings, std::sync::atomic::Ordering::Relaxed);
    let agent = binary("flower-agent")?;
    let bin_dir: PathBuf = agent.parent().map(Path::to_path_buf).unwrap_or_default();
    let profile = bin_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "agent_rss: build profile {profile} ({}), {} cores, TOKIO_WORKER_THREADS={}, load {}",
        bin_dir.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::env::var("TOKIO_WORKER_THREADS").unwrap_or_else(|_| "unset".into()),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut ok = true;
    if !args.skip_standalone {
        ok &= standalone(&args)?;
    }
    if !args.skip_kube {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        ok &= runtime.block_on(kubernetes(&args))?;
    }
    // A missed target fails the run, as in channel_bench: a script cannot miss it.
    ensure!(ok, "agent_rss: a target was missed (see OVER above)");
    println!("agent_rss: all targets met");
    Ok(())
}

//! `--store kube --flap SECONDS`: the flapping soak. N simulated agents (real mTLS streams, in
//! this process) against `flower-hub serve` on a real kube-apiserver, each holding its stream for
//! a random while (up to `--flap-hold-max`, at least a twelfth of it), then dropping it (half of
//! them by a graceful stop, half by aborting the stream) and re-opening it after a random pause
//! of up to a tenth of that, for `--flap` seconds; meanwhile the Federation's replicas and the
//! Placement's `numberOfClusters` change every `--flap-change-every` seconds, so clusters gain
//! and lose work while their agents are away.
//!
//! At the end every agent keeps its stream, and the soak checks:
//! - every agent holds exactly its current work: what its runtime last applied equals the
//!   core's answer, from a `KubeWorkSource` started in this process on the same apiserver;
//! - the hub holds every stream again (`flower_addon_hub_connected_agents`);
//! - the hub's RSS and open file descriptors are flat over the last 5 minutes of flapping (the
//!   last half of a shorter soak): the least-squares slope, and the growth it implies over that
//!   window, within 10 % of the window's mean (+ 10 descriptors);
//! - the apiserver's write requests (every client) while flapping ≤ 20/s.
//!
//! The bench's simulated Federation has SuperNode authentication off (its SuperLink is a kwok
//! pod, which cannot register a key), so keys are not part of this soak; the real-node
//! partition test checks that a cut-off cluster's keys are unregistered and none is left twice.
use super::kube::{apiserver_writes, federation, hub_samples, placement_of};
use super::{Args, Credentials, provision_into};
use anyhow::{Context, ensure};
use e2e::ControlPlane;
use e2e::addon::HUB_NS;
use flower_addon_agent::channel::{RunOptions, run};
use flower_addon_agent::runtime::{MemoryRuntime, Runtime};
use flower_addon_hub::channel::source::WorkSource;
use flower_addon_hub::kube::store::KubeStore;
use flower_addon_hub::registration::ca::CaRole;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Apiserver writes a second the steady state may cost (every client).
const WRITES_TARGET: f64 = 20.0;
/// The window whose RSS and descriptor slopes must be flat (or the last half of a shorter soak).
const FLAT_WINDOW: Duration = Duration::from_secs(300);

/// One sample of the hub process and the apiserver.
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: f64,
    rss_kib: f64,
    fds: f64,
    writes: f64,
    connected: f64,
}

/// Least-squares slope of `y` over `x` (per unit of `x`).
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

fn fd_count(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// One simulated agent: holds its stream, drops it, re-opens it, until `flapping` is false; then
/// keeps its stream until `stop`.
#[allow(clippy::too_many_arguments)]
async fn flapping_agent(
    options: RunOptions,
    runtime: Arc<dyn Runtime>,
    mut rng: StdRng,
    hold_max: Duration,
    mut flapping: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
    drops: Arc<AtomicU64>,
) {
    let hold_min = hold_max / 12;
    loop {
        let (agent_stop, agent_stop_rx) = watch::channel(false);
        let mut task = tokio::spawn(run(options.clone(), runtime.clone(), agent_stop_rx));
        let hold = rng.random_range(hold_min.as_secs_f64()..=hold_max.as_secs_f64());
        let keep = tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs_f64(hold)) => false,
            _ = flapping.wait_for(|f| !*f) => true,
            _ = stop.wait_for(|s| *s) => true,
        };
        if keep {
            let _ = stop.wait_for(|s| *s).await;
            let _ = agent_stop.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut task).await;
            return;
        }
        if rng.random_bool(0.5) {
            let _ = agent_stop.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut task).await;
        }
        task.abort();
        drops.fetch_add(1, Ordering::Relaxed);
        let pause = rng.random_range(0.5..=(hold_max.as_secs_f64() / 10.0).max(1.0));
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs_f64(pause)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

pub(super) async fn soak(cp: &mut ControlPlane, args: &Args) -> anyhow::Result<()> {
    let n = args.agents;
    let flap = Duration::from_secs(args.flap);
    let hold_max = Duration::from_secs(args.flap_hold_max.max(2));
    let change_every = Duration::from_secs(args.flap_change_every.max(1));
    let admin = cp.cluster("hub")?.client.clone();
    let (addon, hub_pid, hub_metrics) = super::kube::install_hub(cp, args, &admin).await?;

    eprintln!("provisioning {n} ManagedClusters and their client certificates…");
    let store = KubeStore::without_watch(admin.clone(), HUB_NS);
    let creds: Vec<Credentials> = provision_into(&store, n, 16).await?;
    let names: Vec<String> = creds
        .iter()
        .map(|c| c.config.cluster_name.clone())
        .collect();

    eprintln!(
        "{n} agents flapping for {} s (streams held {:.1}–{} s, changes every {} s)…",
        flap.as_secs(),
        (hold_max / 12).as_secs_f64(),
        hold_max.as_secs(),
        change_every.as_secs()
    );
    let (flapping_tx, flapping_rx) = watch::channel(true);
    let (stop_tx, stop_rx) = watch::channel(false);
    let drops = Arc::new(AtomicU64::new(0));
    let mut runtimes = Vec::with_capacity(n);
    let mut tasks = Vec::with_capacity(n);
    for (i, mut c) in creds.into_iter().enumerate() {
        c.config.hub = addon.hub_address.clone();
        let mut options = RunOptions::new(c, None);
        options.local_ip = Some(IpAddr::V4(Ipv4Addr::new(
            127,
            0,
            0,
            1 + (i % usize::from(args.source_ips.max(1))) as u8,
        )));
        options.status_interval = Duration::from_secs(3600);
        let runtime = Arc::new(MemoryRuntime::new());
        runtimes.push(runtime.clone());
        tasks.push(tokio::spawn(flapping_agent(
            options,
            runtime,
            StdRng::seed_from_u64(args.seed.wrapping_add(i as u64)),
            hold_max,
            flapping_rx.clone(),
            stop_rx.clone(),
            drops.clone(),
        )));
        if (i + 1) % args.batch.max(1) == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let every = (flap / 60).clamp(Duration::from_secs(2), Duration::from_secs(10));
    let mut samples: Vec<Sample> = Vec::new();
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut changes = Vec::new();
    let t = Instant::now();
    let mut next_change = change_every;
    let mut next_sample = Duration::ZERO;
    while t.elapsed() < flap {
        if t.elapsed() >= next_sample {
            let writes: f64 = apiserver_writes(&admin).await?.0.values().sum();
            let connected = hub_samples(hub_metrics)
                .await?
                .value("flower_addon_hub_connected_agents", &[])
                .unwrap_or(0.0);
            samples.push(Sample {
                at: t.elapsed().as_secs_f64(),
                rss_kib: e2e::process::rss_kib(hub_pid).unwrap_or(0) as f64,
                fds: fd_count(hub_pid) as f64,
                writes,
                connected,
            });
            next_sample += every;
        }
        if t.elapsed() >= next_change {
            let change = if rng.random_bool(0.5) {
                let replicas = rng.random_range(1..=3);
                super::kube::apply(&admin, "Federation", &federation(replicas)).await?;
                format!("replicas {replicas}")
            } else {
                let count = rng.random_range(n.div_ceil(2)..=n);
                super::kube::apply(&admin, "Placement", &placement_of(Some(count))).await?;
                format!("numberOfClusters {count}")
            };
            changes.push(change);
            next_change += change_every;
        }
        cp.processes().check_alive()?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let flapped = t.elapsed();
    let writes_end: f64 = apiserver_writes(&admin).await?.0.values().sum();
    let _ = flapping_tx.send(false);
    eprintln!(
        "flapping over after {:.0} s ({} streams dropped, {} changes); every agent reconnects…",
        flapped.as_secs_f64(),
        drops.load(Ordering::Relaxed),
        changes.len()
    );

    // The core's answer, computed in this process from the same apiserver.
    let flower_ca =
        flower_addon_hub::registration::store::load_or_create_ca_for(&store, CaRole::Flower)
            .await
            .context("the hub's Flower CA")?;
    let core =
        flower_addon_hub::kube::work::KubeWorkSource::start(admin.clone(), Arc::new(flower_ca))
            .await
            .context("starting a KubeWorkSource in the bench")?;
    let t_settle = Instant::now();
    let mut mismatched: Vec<String> = Vec::new();
    let mut connected = 0.0;
    while t_settle.elapsed() < Duration::from_secs(180) {
        connected = hub_samples(hub_metrics)
            .await?
            .value("flower_addon_hub_connected_agents", &[])
            .unwrap_or(0.0);
        mismatched = names
            .iter()
            .zip(&runtimes)
            .filter(|(name, runtime)| {
                !core.decided(name)
                    || runtime.current().map(|w| w.federations)
                        != Some(core.snapshot(name).federations)
            })
            .map(|(name, _)| name.clone())
            .collect();
        if connected as usize >= n && mismatched.is_empty() {
            break;
        }
        cp.processes().check_alive()?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let settled = t_settle.elapsed();
    let placed = names
        .iter()
        .filter(|name| !core.snapshot(name).federations.is_empty())
        .count();
    let client_rss = super::rss_kib();
    let _ = stop_tx.send(true);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    report(
        args,
        &Outcome {
            flapped,
            drops: drops.load(Ordering::Relaxed),
            changes,
            samples,
            writes_end,
            settled,
            connected,
            mismatched,
            placed,
            client_rss,
        },
    )
}

struct Outcome {
    flapped: Duration,
    drops: u64,
    changes: Vec<String>,
    samples: Vec<Sample>,
    writes_end: f64,
    settled: Duration,
    connected: f64,
    mismatched: Vec<String>,
    placed: usize,
    client_rss: u64,
}

/// Prints the figures and checks the invariants; an error names each one broken.
fn report(args: &Args, o: &Outcome) -> anyhow::Result<()> {
    let n = args.agents;
    let flapped = o.flapped.as_secs_f64();
    let first = o.samples.first().copied();
    let writes_per_s = first.map_or(0.0, |s| {
        (o.writes_end - s.writes) / (flapped - s.at).max(1e-9)
    });
    let window = FLAT_WINDOW.as_secs_f64().min(flapped / 2.0);
    let tail: Vec<Sample> = o
        .samples
        .iter()
        .copied()
        .filter(|s| s.at >= flapped - window)
        .collect();
    let mean = |f: fn(&Sample) -> f64| tail.iter().map(f).sum::<f64>() / tail.len().max(1) as f64;
    let rss_slope = slope(
        &tail
            .iter()
            .map(|s| (s.at / 60.0, s.rss_kib))
            .collect::<Vec<_>>(),
    );
    let fd_slope = slope(
        &tail
            .iter()
            .map(|s| (s.at / 60.0, s.fds))
            .collect::<Vec<_>>(),
    );
    let (rss_mean, fd_mean) = (mean(|s| s.rss_kib), mean(|s| s.fds));
    let rss_growth = rss_slope * window / 60.0;
    let fd_growth = fd_slope * window / 60.0;
    println!();
    println!(
        "== channel_bench --store kube --flap {}: {n} agents flapping ==",
        args.flap
    );
    println!(
        "{:.0} s of flapping: {} streams dropped and re-opened ({:.1}/s), {} work changes ({})",
        flapped,
        o.drops,
        o.drops as f64 / flapped.max(1e-9),
        o.changes.len(),
        o.changes.join(", ")
    );
    println!("samples (s: hub RSS MiB, hub fds, streams held by the hub, apiserver writes):");
    for s in &o.samples {
        println!(
            "  {:>5.0}: {:>6.1} MiB {:>6.0} fds {:>6.0} streams {:>8.0} writes",
            s.at,
            s.rss_kib / 1024.0,
            s.fds,
            s.connected,
            s.writes
        );
    }
    println!(
        "apiserver writes while flapping: {writes_per_s:.2}/s (every client: hub, controller-manager, scheduler, kwok)"
    );
    println!(
        "last {:.0} s: hub RSS slope {:+.2} MiB/min (mean {:.1} MiB, {:+.2} MiB over the window); fds slope {:+.2}/min (mean {:.0}, {:+.1} over the window)",
        window,
        rss_slope / 1024.0,
        rss_mean / 1024.0,
        rss_growth / 1024.0,
        fd_slope,
        fd_mean,
        fd_growth
    );
    println!(
        "after the flapping: {} of {n} streams held, {} of {n} agents holding exactly the core's work ({placed} placed) after {:.1} s",
        o.connected,
        n - o.mismatched.len(),
        o.settled.as_secs_f64(),
        placed = o.placed
    );
    if !o.mismatched.is_empty() {
        println!(
            "  differing: {}",
            o.mismatched
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!(
        "bench process (all {n} agents) RSS {} MiB",
        o.client_rss / 1024
    );
    let checks = [
        (
            format!(
                "every agent holds exactly its current work ({} differ)",
                o.mismatched.len()
            ),
            o.mismatched.is_empty(),
        ),
        (
            format!("{} of {n} streams held after the flapping", o.connected),
            o.connected as usize >= n,
        ),
        (
            format!("apiserver writes {writes_per_s:.2}/s ≤ {WRITES_TARGET}/s"),
            writes_per_s <= WRITES_TARGET,
        ),
        (
            format!(
                "hub RSS flat over the last {window:.0} s: {:+.1} MiB ≤ 10 % of {:.1} MiB",
                rss_growth / 1024.0,
                rss_mean / 1024.0
            ),
            rss_growth <= rss_mean * 0.10,
        ),
        (
            format!(
                "hub fds flat over the last {window:.0} s: {fd_growth:+.1} ≤ 10 % of {fd_mean:.0} + 10"
            ),
            fd_growth <= fd_mean * 0.10 + 10.0,
        ),
        (
            format!(
                "streams were dropped ({}) and work changed ({})",
                o.drops,
                o.changes.len()
            ),
            o.drops > 0 && !o.changes.is_empty(),
        ),
    ];
    let mut missed = Vec::new();
    for (what, ok) in &checks {
        println!("{} {what}", if *ok { "PASS" } else { "MISS" });
        if !ok {
            missed.push(what.clone());
        }
    }
    ensure!(
        missed.is_empty(),
        "soak invariants broken: {}",
        missed.join("; ")
    );
    Ok(())
}

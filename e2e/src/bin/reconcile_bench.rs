//! Reconcile latency and apiserver requests of `flower-hub serve` in Kubernetes mode:
//! a real control plane from the e2e harness, the release hub as a child process under its
//! least-privilege ServiceAccount (as `manifests/hub/deployment.yaml` runs it), Federations with
//! no placementRef (the hub cluster runs the SuperLink and, through the hub's embedded runtime,
//! the pool), timed by a watch on StatefulSets.
//!
//! ```text
//! cargo build --release --bins
//! FLOWER_ADDON_K8S_BIN=$(e2e/k8s/build.sh) cargo run --release -p e2e --bin reconcile_bench -- \
//!     [--federations 20] [--changes 20] [--idle 50] [--idle-seconds 60]
//! FLOWER_ADDON_K8S_BIN=$(e2e/k8s/build.sh) cargo run --release -p e2e --bin reconcile_bench -- \
//!     --spokes [--changes 20]
//! ```
//!
//! The hub RSS figure is meant for the binary that ships (profile `dist`, LTO): build it with
//! `cargo build --profile dist -p flower-addon-hub` and run the bench with
//! `FLOWER_ADDON_E2E_BIN_DIR=target/dist`.
//!
//! Steps: `--idle` Federations are created and settled first; then `--federations` creates, each
//! timed from just before the create call until the watch has seen both the SuperLink and the
//! pool StatefulSet; then `--changes` replica changes (pool `a` 2 → 3 → 2 …), each timed until
//! the pool StatefulSet's `spec.replicas` has the new value; then `--idle-seconds` of idleness.
//! Each operation waits for the previous one, with `--pause-ms` between them.
//!
//! Requests are the hub's own, counted by the apiserver: FlowSchemas that match only the hub's
//! ServiceAccount, one per verb and resource (`flower-hub-patch-statefulsets`, …, a
//! `flower-hub-<verb>-other` after them, `flower-hub-events` before them), all at priority level
//! `workload-low` (where the built-in `service-accounts` schema would put them anyway), read from
//! `apiserver_flowcontrol_dispatched_requests_total{flow_schema="flower-hub-…"}` on the hub
//! apiserver's `/metrics`. The objects the hub changed are counted by this bench's watches: new,
//! deleted and modified Services and Secrets, StatefulSets whose generation or metadata changed
//! (not the controller-manager's status writes), and Federation writes other than the bench's
//! own. "Requests per changed object" divides the first (without watches, Events and leader
//! election's Lease renewals, which are printed on a line of their own) by the second: 1.00
//! means no read and no no-op write.
//!
//! With `--spokes`, the bench measures the multi-cluster path instead: two spoke clusters joined
//! by agents (Kubernetes runtime, as `kube_multicluster` runs them), one Federation placed on both
//! through a Placement; `--changes` replica changes, each timed from just before the patch until
//! the pool StatefulSet on *both* spokes has the new `spec.replicas` (watches on the spokes), then
//! the hub's and the agents' RSS once everything has settled. `--federations`, `--idle` and
//! `--idle-seconds` do not apply there, and no request counting is done.
//!
//! A missed target is reported (MISS), not an error; a broken setup (no metric, a StatefulSet
//! that never appears, a hub that exits) is.
use anyhow::{Context, Result, ensure};
use clap::Parser;
use e2e::ControlPlane;
use e2e::addon::{Addon, AddonOptions, Bootstrap, Spoke};
use e2e::bench::{
    binary_age, by_group, counter_deltas, cpu_time, hub_requests, install_flow_schemas,
    per_resource, percentile, requests_on, sorted, validate_counting, verdict,
};
use flower_addon_crds::Federation;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Parser, Debug)]
#[command(about = "flower-hub reconcile latency and apiserver requests")]
struct Args {
    /// Federations created and timed.
    #[arg(long, default_value_t = 20)]
    federations: usize,
    /// Replica changes timed (round-robin over the timed Federations).
    #[arg(long, default_value_t = 20)]
    changes: usize,
    /// Federations created and settled before anything is timed (present throughout).
    #[arg(long, default_value_t = 50)]
    idle: usize,
    /// Seconds of idleness, with every Federation present, over which requests are counted.
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
    /// Pause between two timed operations, in milliseconds.
    #[arg(long, default_value_t = 300)]
    pause_ms: u64,
    /// Seconds a StatefulSet may take to appear or change before the setup counts as broken.
    #[arg(long, default_value_t = 15)]
    timeout: u64,
    /// Print each timed operation's start (UTC, to match the hub's log with
    /// FLOWER_ADDON_E2E_HUB_LOG and FLOWER_ADDON_E2E_KEEP=1) and latency.
    #[arg(long)]
    trace: bool,
    /// Measure a Federation placed on two spokes instead: `--changes` replica changes, each
    /// until both spokes' pool StatefulSets have the new replicas, and the settled RSS of the
    /// hub and the agents (see the module doc).
    #[arg(long)]
    spokes: bool,
}

/// `at` as the hub's log writes times (UTC, microseconds).
fn rfc3339(at: std::time::SystemTime) -> String {
    let micros = at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as i128;
    k8s_openapi::jiff::Timestamp::from_microsecond(micros as i64)
        .map(|t| format!("{t:.6}"))
        .unwrap_or_default()
}

/// Namespace of the user's Federations.
const NAMESPACE: &str = "bench";
/// The hub's process name in the harness ([`Addon::install`]).
const HUB_PROC: &str = "flower-hub";
/// The groups that are writes.
const WRITES: [&str; 4] = ["create", "update", "patch", "delete"];
/// Resources counted apart (any API group), so that each verb's requests are told by resource;
/// the rest of a verb's requests count as `other`.
const RESOURCES: [&str; 16] = [
    "federations",
    "federations/status",
    "placements",
    "placements/status",
    "placementdecisions",
    "placementdecisions/status",
    "managedclusters",
    "managedclusters/status",
    "statefulsets",
    "daemonsets",
    "services",
    "secrets",
    "configmaps",
    "leases",
    "pods",
    "namespaces",
];
/// How long the hub must have changed nothing for the cluster to count as settled; longer than
/// the embedded runtime's observation period (5 s).
const QUIET: Duration = Duration::from_secs(6);

/// Its targets.
const TARGET_CREATE_P50: Duration = Duration::from_millis(15);
const TARGET_CHANGE_P50: Duration = Duration::from_millis(7);
const TARGET_REQUESTS_PER_CHANGE: f64 = 1.0;
/// Hub idle RSS with 0 Federations.
const TARGET_IDLE_RSS_MIB: f64 = 20.0;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    e2e::install_crypto();
    let args = Args::parse();
    ensure!(
        !cfg!(debug_assertions),
        "a debug build measures a debug hub: run with `cargo run --release` after \
         `cargo build --release --bins`"
    );
    ensure!(args.federations > 0, "--federations must be at least 1");
    let load_start = e2e::harness::loadavg();
    let hub_bin = e2e::binary("flower-hub")?;
    ensure_fresh(&hub_bin, &["hub", "agent", "crds", "proto"])?;
    println!("hub binary: {}", describe_binary(&hub_bin));
    println!("hub sources: {}", describe_sources());
    println!("load at start: {load_start}");
    if args.spokes {
        ensure!(args.changes > 0, "--changes must be at least 1");
        let agent_bin = e2e::binary("flower-agent")?;
        ensure_fresh(&agent_bin, &["agent", "crds", "proto"])?;
        println!("agent binary: {}", describe_binary(&agent_bin));
        let mut cp = ControlPlane::start(&SPOKE_CLUSTERS).await?;
        let result = spokes_bench(&mut cp, &args).await;
        cp.log_tails_on_error(&result, &[HUB_PROC, "agent-spoke-1", "agent-spoke-2"]);
        drop(cp);
        result?.print(&args, &load_start, &e2e::harness::loadavg());
        return Ok(());
    }

    // Pods: 3 per Federation (SuperLink and a pool of 2), one more per Federation scaled to 3;
    // a kwok node takes 110.
    let pods = (args.idle + args.federations) * 3 + args.changes.min(args.federations);
    let options = e2e::Options {
        nodes_per_cluster: pods / 100 + 1,
        ..Default::default()
    };
    let mut cp = ControlPlane::start_with(&["hub"], options).await?;
    let result = bench(&mut cp, &args).await;
    cp.log_tails_on_error(&result, &[HUB_PROC]);
    drop(cp);
    let report = result?;
    report.print(&args, &load_start, &e2e::harness::loadavg());
    Ok(())
}

/// Everything measured.
struct Report {
    create_latency: Vec<Duration>,
    create_call: Vec<Duration>,
    superlink_latency: Vec<Duration>,
    pool_latency: Vec<Duration>,
    change_latency: Vec<Duration>,
    change_call: Vec<Duration>,
    floor_apply: Vec<Duration>,
    creates: Phase,
    changes: Phase,
    idle: Phase,
    rss_empty_kib: u64,
    rss_idle_feds_kib: u64,
    rss_end_kib: u64,
    federations_present: usize,
    objects_per_federation: BTreeMap<String, usize>,
}

/// Requests, changed objects and hub CPU over one phase.
#[derive(Default)]
struct Phase {
    requests: BTreeMap<String, u64>,
    changes: BTreeMap<&'static str, u64>,
    cpu: Duration,
    wall: Duration,
}

/// A point to take [`Phase`] deltas from.
struct Mark {
    requests: BTreeMap<String, u64>,
    changes: BTreeMap<&'static str, u64>,
    cpu: Duration,
    at: Instant,
}

async fn bench(cp: &mut ControlPlane, args: &Args) -> Result<Report> {
    let admin = cp.cluster("hub")?.client.clone();
    install_flow_schemas(&admin, &RESOURCES, "reconcile-bench").await?;
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await
        .context("creating the bench namespace")?;
    // The CRDs first, so that the Federation watch starts at once (the hub's install re-applies
    // them unchanged).
    e2e::install_crds(&admin).await?;
    let (tx, mut rx) = watch::channel(Observed::default());
    let tx = std::sync::Arc::new(tx);
    let _watches = WatchTasks(vec![
        spawn_watch::<StatefulSet>(&admin, "StatefulSet", sts_fingerprint, track_sts, &tx),
        spawn_watch::<Service>(&admin, "Service", rv_fingerprint, ignore, &tx),
        spawn_watch::<Secret>(&admin, "Secret", rv_fingerprint, ignore, &tx),
        spawn_watch::<Federation>(&admin, "Federation", rv_fingerprint, ignore, &tx),
    ]);

    Addon::install(cp, &[], &AddonOptions::default()).await?;
    let hub_pid = cp
        .processes()
        .get(HUB_PROC)
        .context("the hub process is not running")?
        .pid();
    let startup_counts = validate_counting(cp, &admin).await?;
    println!(
        "counting validated: the hub's start-up made {}",
        per_resource(&startup_counts, 1.0).join("; ")
    );
    // Let start-up finish (CA Secrets, initial lists) before the empty hub's RSS is taken.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_empty_kib = e2e::process::rss_kib(hub_pid).unwrap_or(0);

    let feds = Api::<Federation>::namespaced(admin.clone(), NAMESPACE);
    let timeout = Duration::from_secs(args.timeout);
    let t = Instant::now();
    for i in 0..args.idle {
        let name = format!("idle-{i:03}");
        feds.create(&PostParams::default(), &federation(&name)?)
            .await
            .with_context(|| format!("creating Federation {name}"))?;
        wait_created(&mut rx, &name, Instant::now(), timeout).await?;
        cp.processes().check_alive()?;
    }
    settle(&admin, &rx).await?;
    println!(
        "{} idle Federations created and settled in {:.1} s",
        args.idle,
        t.elapsed().as_secs_f64()
    );
    let rss_idle_feds_kib = e2e::process::rss_kib(hub_pid).unwrap_or(0);

    // Creates.
    let pause = Duration::from_millis(args.pause_ms);
    let start = mark(&admin, &rx, hub_pid).await?;
    let mut names = Vec::new();
    let (mut create_latency, mut create_call) = (Vec::new(), Vec::new());
    let (mut superlink_latency, mut pool_latency) = (Vec::new(), Vec::new());
    for i in 0..args.federations {
        let name = format!("bench-{i:02}");
        let fed = federation(&name)?;
        let (t0, at) = (Instant::now(), std::time::SystemTime::now());
        feds.create(&PostParams::default(), &fed)
            .await
            .with_context(|| format!("creating Federation {name}"))?;
        create_call.push(t0.elapsed());
        let (superlink, pool) = wait_created(&mut rx, &name, t0, timeout).await?;
        if args.trace {
            println!(
                "trace: create {name} at {}: SuperLink {superlink:?}, pool {pool:?}",
                rfc3339(at)
            );
        }
        create_latency.push(superlink.max(pool));
        superlink_latency.push(superlink);
        pool_latency.push(pool);
        cp.processes().check_alive()?;
        names.push(name);
        tokio::time::sleep(pause).await;
    }
    settle(&admin, &rx).await?;
    let creates = phase(&start, &admin, &rx, hub_pid).await?;

    // Replica changes, round-robin over the timed Federations.
    let start = mark(&admin, &rx, hub_pid).await?;
    let mut replicas: HashMap<String, i32> = names.iter().map(|n| (n.clone(), 2)).collect();
    let (mut change_latency, mut change_call) = (Vec::new(), Vec::new());
    for j in 0..args.changes {
        let name = &names[j % names.len()];
        let want = if replicas[name] == 2 { 3 } else { 2 };
        let patch = json!({"spec": {"supernodes": {"pools": [{"name": "a", "replicas": want}]}}});
        let (t0, at) = (Instant::now(), std::time::SystemTime::now());
        feds.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("patching Federation {name}"))?;
        change_call.push(t0.elapsed());
        let took = wait_replicas(&mut rx, &pool_sts(name), want, t0, timeout).await?;
        if args.trace {
            println!(
                "trace: change {name} → {want} at {} took {took:?}",
                rfc3339(at)
            );
        }
        change_latency.push(took);
        cp.processes().check_alive()?;
        replicas.insert(name.clone(), want);
        tokio::time::sleep(pause).await;
    }
    settle(&admin, &rx).await?;
    let changes = phase(&start, &admin, &rx, hub_pid).await?;

    // The floor: the same StatefulSet change written by the bench itself, without the hub.
    let floor_apply = floor(
        &admin,
        &mut rx,
        &pool_sts(&names[0]),
        args.changes,
        pause,
        timeout,
    )
    .await?;
    settle(&admin, &rx).await?;

    // Idle.
    let start = mark(&admin, &rx, hub_pid).await?;
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    cp.processes().check_alive()?;
    let idle = phase(&start, &admin, &rx, hub_pid).await?;
    let rss_end_kib = e2e::process::rss_kib(hub_pid).unwrap_or(0);

    Ok(Report {
        create_latency,
        create_call,
        superlink_latency,
        pool_latency,
        change_latency,
        change_call,
        floor_apply,
        creates,
        changes,
        idle,
        rss_empty_kib,
        rss_idle_feds_kib,
        rss_end_kib,
        federations_present: args.idle + args.federations,
        objects_per_federation: objects_per_federation(&admin, args.idle + args.federations)
            .await?,
    })
}

// === Two spokes (--spokes) ===

/// The control plane of `--spokes`: the hub and two spoke clusters.
const SPOKE_CLUSTERS: [&str; 3] = ["hub", "spoke-1", "spoke-2"];

/// What `--spokes` measured.
struct SpokesReport {
    /// Patch → both spokes' pool StatefulSets have the new replicas.
    change_latency: Vec<Duration>,
    /// The patch call alone.
    change_call: Vec<Duration>,
    /// Patch → each spoke's pool StatefulSet has the new replicas.
    per_spoke: [Vec<Duration>; 2],
    /// How long the Federation took from create to its pool StatefulSet on both spokes.
    first_placement: Duration,
    /// Settled RSS (KiB) of the hub and each agent.
    rss_kib: Vec<(&'static str, Option<u64>)>,
}

/// Installs the hub and two agents, places a Federation on both spokes and times `--changes`
/// replica changes until both spokes have them.
async fn spokes_bench(cp: &mut ControlPlane, args: &Args) -> Result<SpokesReport> {
    const SPOKES: [&str; 2] = ["spoke-1", "spoke-2"];
    let admin = cp.cluster("hub")?.client.clone();
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await
        .context("creating the bench namespace")?;
    let spokes: Vec<Spoke> = SPOKES
        .iter()
        .map(|name| Spoke::new(name, &[("env", "prod")], Bootstrap::Cli))
        .collect();
    let addon = Addon::install(cp, &spokes, &AddonOptions::default()).await?;
    println!(
        "both spokes joined in {:.1} s",
        addon.joined_in.as_secs_f64()
    );
    e2e::addon::bind_every_cluster(&admin, NAMESPACE).await?;
    let placement = json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "Placement",
        "metadata": {"name": "both", "namespace": NAMESPACE},
        "spec": {"predicates": [
            {"requiredClusterSelector": {"labelSelector": {"matchLabels": {"env": "prod"}}}}
        ]},
    });
    Api::<flower_addon_crds::Placement>::namespaced(admin.clone(), NAMESPACE)
        .patch(
            "both",
            &PatchParams::apply("reconcile-bench").force(),
            &Patch::Apply(&placement),
        )
        .await
        .context("applying Placement both")?;

    // The bench's watches on each spoke.
    let mut spoke_clients = Vec::new();
    let mut rxs = Vec::new();
    let mut tasks = Vec::new();
    for name in SPOKES {
        let client = cp.cluster(name)?.client.clone();
        let (tx, rx) = watch::channel(Observed::default());
        let tx = std::sync::Arc::new(tx);
        tasks.push(spawn_watch::<StatefulSet>(
            &client,
            "StatefulSet",
            sts_fingerprint,
            track_sts,
            &tx,
        ));
        spoke_clients.push(client);
        rxs.push(rx);
    }
    let _watches = WatchTasks(tasks);

    let feds = Api::<Federation>::namespaced(admin.clone(), NAMESPACE);
    let name = "placed";
    let pool = pool_sts(name);
    let t0 = Instant::now();
    feds.create(&PostParams::default(), &placed_federation(name)?)
        .await
        .context("creating the placed Federation")?;
    for rx in &mut rxs {
        wait_observed(
            rx,
            &format!("StatefulSet {pool} on the spoke"),
            Duration::from_secs(90),
            |o| o.statefulsets.get(&pool).map(|_| ()),
        )
        .await?;
    }
    let first_placement = t0.elapsed();
    for client in &spoke_clients {
        e2e::wait_statefulsets_settled(client, NAMESPACE).await?;
    }
    cp.processes().check_alive()?;

    let timeout = Duration::from_secs(args.timeout);
    let pause = Duration::from_millis(args.pause_ms);
    let (mut change_latency, mut change_call) = (Vec::new(), Vec::new());
    let mut per_spoke: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut replicas = 2;
    for _ in 0..args.changes {
        replicas = if replicas == 2 { 3 } else { 2 };
        let patch =
            json!({"spec": {"supernodes": {"pools": [{"name": "a", "replicas": replicas}]}}});
        let (t0, at) = (Instant::now(), std::time::SystemTime::now());
        feds.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .context("patching the placed Federation")?;
        change_call.push(t0.elapsed());
        let mut slowest = Duration::ZERO;
        for (i, rx) in rxs.iter_mut().enumerate() {
            let took = wait_replicas(rx, &pool, replicas, t0, timeout)
                .await
                .with_context(|| format!("on {}", SPOKES[i]))?;
            per_spoke[i].push(took);
            slowest = slowest.max(took);
        }
        if args.trace {
            println!(
                "trace: change → {replicas} at {} took {slowest:?}",
                rfc3339(at)
            );
        }
        change_latency.push(slowest);
        cp.processes().check_alive()?;
        tokio::time::sleep(pause).await;
    }

    // Settled: the spokes' StatefulSets final and the hub and agents idle.
    for client in &spoke_clients {
        e2e::wait_statefulsets_settled(client, NAMESPACE).await?;
    }
    let rss_kib = [HUB_PROC, "agent-spoke-1", "agent-spoke-2"]
        .into_iter()
        .map(|p| (p, cp.processes().get(p).and_then(|proc| proc.rss_kib())))
        .collect();
    Ok(SpokesReport {
        change_latency,
        change_call,
        per_spoke,
        first_placement,
        rss_kib,
    })
}

/// The Federation `--spokes` places on both spokes (as `kube_multicluster` runs it): StatefulSet
/// mode, subprocess isolation, TLS without SuperNode authentication (kwok pods run no Flower, so
/// no key could be registered), a NodePort SuperLink, one pool `a` of 2 per spoke.
fn placed_federation(name: &str) -> Result<Federation> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "Federation",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "mode": "StatefulSet",
            "isolationMode": "subprocess",
            "insecure": false,
            "supernodeAuthentication": false,
            "placementRef": {"name": "both"},
            "superlink": {"image": "flwr/superlink:1.42.0", "service": {"type": "NodePort"}},
            "supernodes": {
                "image": "flwr/supernode:1.42.0",
                "pools": [{"name": "a", "replicas": 2}]
            }
        }
    }))?)
}

impl SpokesReport {
    fn print(&self, args: &Args, load_start: &str, load_end: &str) {
        println!();
        println!(
            "== flower-hub reconcile bench --spokes: {} replica changes of a Federation placed on 2 spokes ==",
            args.changes
        );
        println!(
            "Federation created → pool StatefulSet on both spokes: {} ms",
            ms(self.first_placement)
        );
        println!(
            "{:<46} {:>8} {:>8} {:>8}",
            "latency (ms, no target)", "p50", "p95", "max"
        );
        print_parts(&[
            (
                "replica change → both spokes updated",
                &sorted(&self.change_latency),
            ),
            ("  the patch call returned", &sorted(&self.change_call)),
            ("  spoke-1", &sorted(&self.per_spoke[0])),
            ("  spoke-2", &sorted(&self.per_spoke[1])),
        ]);
        let rss: Vec<String> = self
            .rss_kib
            .iter()
            .map(|(who, kib)| match kib {
                Some(kib) => format!("{who} {:.1} MiB", *kib as f64 / 1024.0),
                None => format!("{who} unknown"),
            })
            .collect();
        println!(
            "settled RSS: {} (targets of what ships: agent_rss)",
            rss.join(", ")
        );
        println!("load at start: {load_start}; at end: {load_end}");
    }
}

// === Federations ===

/// The Federation of the comparison: StatefulSet mode, subprocess isolation, insecure, one
/// pool `a` of 2, no placementRef (the hub cluster runs everything).
fn federation(name: &str) -> Result<Federation> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "Federation",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "mode": "StatefulSet",
            "isolationMode": "subprocess",
            "insecure": true,
            "superlink": {"image": "flwr/superlink:1.42.0"},
            "supernodes": {
                "image": "flwr/supernode:1.42.0",
                "pools": [{"name": "a", "replicas": 2}]
            }
        }
    }))?)
}

/// The SuperLink StatefulSet the Federation controller applies.
fn superlink_sts(fed: &str) -> String {
    format!("{fed}-superlink")
}

/// The pool StatefulSet the hub's embedded runtime applies.
fn pool_sts(fed: &str) -> String {
    flower_addon_crds::render::pool_workload_name(fed, "a")
}

/// Objects of each kind in the bench namespace per Federation (what one create makes).
async fn objects_per_federation(
    admin: &Client,
    federations: usize,
) -> Result<BTreeMap<String, usize>> {
    let lp = kube::api::ListParams::default();
    let count = |n: usize| n.div_ceil(federations.max(1));
    let mut out = BTreeMap::new();
    out.insert(
        "StatefulSet".into(),
        count(
            Api::<StatefulSet>::namespaced(admin.clone(), NAMESPACE)
                .list(&lp)
                .await?
                .items
                .len(),
        ),
    );
    out.insert(
        "Service".into(),
        count(
            Api::<Service>::namespaced(admin.clone(), NAMESPACE)
                .list(&lp)
                .await?
                .items
                .len(),
        ),
    );
    out.insert(
        "Secret".into(),
        count(
            Api::<Secret>::namespaced(admin.clone(), NAMESPACE)
                .list(&lp)
                .await?
                .items
                .len(),
        ),
    );
    Ok(out)
}

// === Watches ===

/// What the bench's watches saw; the waits read it through a `tokio::sync::watch` channel.
#[derive(Default)]
struct Observed {
    /// StatefulSets by name.
    statefulsets: BTreeMap<String, SeenStatefulSet>,
    /// Objects changed, by kind (Federation writes include the bench's own).
    changes: BTreeMap<&'static str, u64>,
    /// When an object was last changed.
    last_change: Option<Instant>,
}

/// One StatefulSet as the watch saw it.
#[derive(Clone, Copy)]
struct SeenStatefulSet {
    /// When it was first seen.
    since: Instant,
    /// `spec.replicas`.
    replicas: i32,
    /// When `spec.replicas` was first seen with this value.
    replicas_since: Instant,
}

type Fingerprint<K> = fn(&K) -> String;
type Track<K> = fn(&mut Observed, &K, Instant);

fn rv_fingerprint<K: Resource>(o: &K) -> String {
    o.meta().resource_version.clone().unwrap_or_default()
}

/// A StatefulSet changes when its spec (generation) or metadata does; the controller-manager's
/// status writes are not the hub's.
fn sts_fingerprint(s: &StatefulSet) -> String {
    let m = &s.metadata;
    serde_json::to_string(&(m.generation, &m.labels, &m.annotations, &m.owner_references))
        .unwrap_or_default()
}

fn track_sts(observed: &mut Observed, s: &StatefulSet, at: Instant) {
    let replicas = s.spec.replicas.unwrap_or(1);
    let seen = observed
        .statefulsets
        .entry(s.name_any())
        .or_insert(SeenStatefulSet {
            since: at,
            replicas,
            replicas_since: at,
        });
    if seen.replicas != replicas {
        seen.replicas = replicas;
        seen.replicas_since = at;
    }
}

fn ignore<K>(_: &mut Observed, _: &K, _: Instant) {}

/// The bench's watch tasks, ended before the control plane stops (also on errors).
struct WatchTasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for WatchTasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Watches kind `K` in the bench namespace, timestamping each event as it arrives.
fn spawn_watch<K>(
    admin: &Client,
    kind: &'static str,
    fingerprint: Fingerprint<K>,
    track: Track<K>,
    tx: &std::sync::Arc<watch::Sender<Observed>>,
) -> tokio::task::JoinHandle<()>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api = Api::<K>::namespaced(admin.clone(), NAMESPACE);
    let tx = tx.clone();
    tokio::spawn(async move {
        let mut stream = Box::pin(watcher(api, watcher::Config::default()).default_backoff());
        let mut last: HashMap<String, String> = HashMap::new();
        while let Some(event) = next_item(&mut stream).await {
            let at = Instant::now();
            let (object, deleted) = match event {
                Ok(Event::Apply(o) | Event::InitApply(o)) => (o, false),
                Ok(Event::Delete(o)) => (o, true),
                Ok(Event::Init | Event::InitDone) => continue,
                Err(error) => {
                    eprintln!("bench watch of {kind}: {error}");
                    continue;
                }
            };
            let name = object.name_any();
            let changed = if deleted {
                last.remove(&name).is_some()
            } else {
                let print = fingerprint(&object);
                last.insert(name, print.clone()).as_ref() != Some(&print)
            };
            tx.send_modify(|observed| {
                if !deleted {
                    track(observed, &object, at);
                }
                if changed {
                    *observed.changes.entry(kind).or_default() += 1;
                    observed.last_change = Some(at);
                }
            });
        }
    })
}

/// The next item of a watch stream. `e2e` has no `futures` dependency: the `Stream` methods
/// are reached through [`WatchStreamExt`]'s supertrait bound.
async fn next_item<S: WatchStreamExt + ?Sized>(stream: &mut Pin<Box<S>>) -> Option<S::Item> {
    std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await
}

/// Waits until `probe` returns a value for what the watches saw.
async fn wait_observed<T>(
    rx: &mut watch::Receiver<Observed>,
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut(&Observed) -> Option<T>,
) -> Result<T> {
    let mut found = None;
    tokio::time::timeout(
        timeout,
        rx.wait_for(|observed| {
            found = probe(observed);
            found.is_some()
        }),
    )
    .await
    .map_err(|_| anyhow::anyhow!("{what}: not seen within {} s", timeout.as_secs()))?
    .context("the bench's watches stopped")?;
    found.with_context(|| format!("{what}: lost"))
}

/// Times from `t0` until the SuperLink and the pool StatefulSet of Federation `fed` were seen.
async fn wait_created(
    rx: &mut watch::Receiver<Observed>,
    fed: &str,
    t0: Instant,
    timeout: Duration,
) -> Result<(Duration, Duration)> {
    let (superlink, pool) = (superlink_sts(fed), pool_sts(fed));
    wait_observed(
        rx,
        &format!("StatefulSets {superlink} and {pool}"),
        timeout,
        |o| {
            let a = o.statefulsets.get(&superlink)?.since;
            let b = o.statefulsets.get(&pool)?.since;
            Some((
                a.saturating_duration_since(t0),
                b.saturating_duration_since(t0),
            ))
        },
    )
    .await
}

/// Time from `t0` until StatefulSet `name` has `spec.replicas` = `want`.
/// How long one server-side apply of a StatefulSet's replicas takes until the bench's watch
/// sees it, with no hub in the path: a copy of the pool StatefulSet `template` (no owner, no
/// labels the hub watches, so the hub ignores it) scaled 0 → 1 → 0 … `n` times, then deleted.
/// With the Federation patch call, this is the least a replica change can take here.
async fn floor(
    admin: &Client,
    rx: &mut watch::Receiver<Observed>,
    template: &str,
    n: usize,
    pause: Duration,
    timeout: Duration,
) -> Result<Vec<Duration>> {
    const NAME: &str = "bench-floor";
    let api = Api::<StatefulSet>::namespaced(admin.clone(), NAMESPACE);
    let source = api
        .get(template)
        .await
        .with_context(|| format!("reading StatefulSet {template}"))?;
    let mut spec = source.spec;
    let labels = json!({"app.kubernetes.io/name": NAME});
    spec.selector = serde_json::from_value(json!({"matchLabels": labels}))?;
    if let Some(meta) = spec.template.metadata.as_mut() {
        meta.labels = serde_json::from_value(labels)?;
    }
    let params = PatchParams::apply("reconcile-bench-floor").force();
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let replicas = (i % 2) as i32;
        spec.replicas = Some(replicas);
        let body = json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": spec,
        });
        let t0 = Instant::now();
        api.patch(NAME, &params, &Patch::Apply(&body))
            .await
            .context("applying the floor StatefulSet")?;
        let seen = wait_replicas(rx, NAME, replicas, t0, timeout).await;
        // The first apply creates it: not a change of replicas the watch can time.
        if i > 0 {
            took.push(seen?);
        }
        tokio::time::sleep(pause).await;
    }
    api.delete(NAME, &Default::default())
        .await
        .context("deleting the floor StatefulSet")?;
    Ok(took)
}

async fn wait_replicas(
    rx: &mut watch::Receiver<Observed>,
    name: &str,
    want: i32,
    t0: Instant,
    timeout: Duration,
) -> Result<Duration> {
    wait_observed(
        rx,
        &format!("StatefulSet {name} with replicas {want}"),
        timeout,
        |o| {
            let s = o.statefulsets.get(name)?;
            (s.replicas == want && s.replicas_since >= t0)
                .then(|| s.replicas_since.duration_since(t0))
        },
    )
    .await
}

/// Waits until every StatefulSet's status has settled and the hub has changed nothing for
/// [`QUIET`].
async fn settle(admin: &Client, rx: &watch::Receiver<Observed>) -> Result<()> {
    e2e::wait_statefulsets_settled(admin, NAMESPACE).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let last = rx.borrow().last_change;
        match last {
            Some(at) if at.elapsed() < QUIET => {
                ensure!(
                    Instant::now() < deadline,
                    "the hub still changes objects after 120 s"
                );
                tokio::time::sleep(QUIET - at.elapsed()).await;
            }
            _ => return Ok(()),
        }
    }
}

async fn mark(admin: &Client, rx: &watch::Receiver<Observed>, pid: u32) -> Result<Mark> {
    Ok(Mark {
        requests: hub_requests(admin).await?,
        changes: rx.borrow().changes.clone(),
        cpu: cpu_time(pid)?,
        at: Instant::now(),
    })
}

async fn phase(
    start: &Mark,
    admin: &Client,
    rx: &watch::Receiver<Observed>,
    pid: u32,
) -> Result<Phase> {
    let end = mark(admin, rx, pid).await?;
    Ok(Phase {
        requests: counter_deltas(&start.requests, &end.requests),
        changes: counter_deltas(&start.changes, &end.changes),
        cpu: end.cpu.saturating_sub(start.cpu),
        wall: end.at - start.at,
    })
}

impl Phase {
    /// The requests without leader election's (Lease renewals: their own line, not reconciles).
    fn without_leases(&self) -> BTreeMap<String, u64> {
        self.requests
            .iter()
            .filter(|(k, _)| k.split('/').nth(1) != Some("leases"))
            .map(|(k, n)| (k.clone(), *n))
            .collect()
    }

    /// Leader election's requests (Lease get/update/create).
    fn lease_requests(&self) -> u64 {
        requests_on(&self.requests, "leases")
    }

    /// Requests other than watches, Events and leader election (what reconciles cost).
    fn reconcile_requests(&self) -> u64 {
        by_group(&self.without_leases())
            .iter()
            .filter(|(g, _)| **g != "watch" && **g != "events")
            .map(|(_, n)| n)
            .sum()
    }

    /// Objects the hub changed: every counted change but the bench's own `ops` Federation writes.
    fn hub_changes(&self, ops: usize) -> u64 {
        self.changes
            .values()
            .sum::<u64>()
            .saturating_sub(ops as u64)
    }

    fn writes(&self) -> u64 {
        let groups = by_group(&self.without_leases());
        WRITES.iter().map(|w| groups[*w]).sum()
    }
}

// === Process and machine ===

/// Path, size and age of the hub binary.
fn describe_binary(path: &std::path::Path) -> String {
    format!("{} ({})", path.display(), binary_age(path))
}

/// Fails when a source file of the crates `binary` builds from (`crates`: directories of the
/// workspace) is newer than it: the figures would be those of older code.
fn ensure_fresh(binary: &std::path::Path, crates: &[&str]) -> Result<()> {
    fn newest(
        dir: &std::path::Path,
        found: &mut Option<(std::time::SystemTime, std::path::PathBuf)>,
    ) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                newest(&path, found);
            } else if let Ok(modified) = entry.metadata().and_then(|m| m.modified())
                && found.as_ref().is_none_or(|(t, _)| modified > *t)
            {
                *found = Some((modified, path));
            }
        }
    }
    let built = std::fs::metadata(binary)?.modified()?;
    let root = e2e::repo_root();
    let mut found = None;
    for dir in crates {
        newest(&root.join(dir).join("src"), &mut found);
    }
    if let Some((modified, path)) = found {
        ensure!(
            modified <= built,
            "{} is older than {}: run `cargo build --release --bins` first",
            binary.display(),
            path.display()
        );
    }
    Ok(())
}

/// The commit the sources are at and whether the hub's crates have uncommitted changes (the
/// binary is what `cargo build --release --bins` made of the work tree).
fn describe_sources() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(e2e::repo_root())
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let head = git(&["log", "-1", "--format=%h %s"]);
    let dirty = git(&[
        "status",
        "--porcelain",
        "--",
        "hub",
        "crds",
        "proto",
        "agent",
        "Cargo.lock",
    ]);
    if dirty.is_empty() {
        format!("HEAD {head} (hub, crds, proto, agent clean)")
    } else {
        format!(
            "HEAD {head} + uncommitted: {}",
            dirty.lines().map(str::trim).collect::<Vec<_>>().join(", ")
        )
    }
}

// === Report ===

/// One line per part of a latency: its p50, p95 and worst (each list sorted).
fn print_parts(parts: &[(&str, &Vec<Duration>)]) {
    for (what, sorted) in parts {
        println!(
            "{what:<46} {:>8} {:>8} {:>8}",
            ms(percentile(sorted, 0.5)),
            ms(percentile(sorted, 0.95)),
            ms(percentile(sorted, 1.0)),
        );
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

impl Report {
    fn print(&self, args: &Args, load_start: &str, load_end: &str) {
        let create = sorted(&self.create_latency);
        let call = sorted(&self.create_call);
        let change = sorted(&self.change_latency);
        let p50_create = percentile(&create, 0.5);
        let p50_change = percentile(&change, 0.5);
        println!();
        println!(
            "== flower-hub reconcile bench: {} creates, {} replica changes, {} Federations present, {} s idle ==",
            args.federations, args.changes, self.federations_present, args.idle_seconds
        );
        println!(
            "{:<46} {:>8} {:>8} {:>8}   {:<10} result",
            "latency (ms)", "p50", "p95", "max", "target"
        );
        println!(
            "{:<46} {:>8} {:>8} {:>8}   {:<10} {}",
            "create → SuperLink + pool StatefulSets exist",
            ms(p50_create),
            ms(percentile(&create, 0.95)),
            ms(percentile(&create, 1.0)),
            format!("p50 ≤ {}", TARGET_CREATE_P50.as_millis()),
            verdict(p50_create <= TARGET_CREATE_P50)
        );
        let superlink = sorted(&self.superlink_latency);
        let pool = sorted(&self.pool_latency);
        print_parts(&[
            ("  the create call returned", &call),
            (
                "  SuperLink StatefulSet (Federation controller)",
                &superlink,
            ),
            ("  pool StatefulSet (embedded runtime)", &pool),
        ]);
        if !change.is_empty() {
            println!(
                "{:<46} {:>8} {:>8} {:>8}   {:<10} {}",
                "replica change → pool StatefulSet updated",
                ms(p50_change),
                ms(percentile(&change, 0.95)),
                ms(percentile(&change, 1.0)),
                format!("p50 ≤ {}", TARGET_CHANGE_P50.as_millis()),
                verdict(p50_change <= TARGET_CHANGE_P50)
            );
            let call = sorted(&self.change_call);
            let floor = sorted(&self.floor_apply);
            print_parts(&[
                ("  the patch call returned", &call),
                ("  floor: one StatefulSet apply, no hub", &floor),
            ]);
            println!(
                "  floor of a replica change here (patch call + StatefulSet apply, p50): {} ms",
                ms(percentile(&call, 0.5) + percentile(&floor, 0.5))
            );
        }
        println!();
        println!(
            "objects per Federation in the namespace: {}",
            self.objects_per_federation
                .iter()
                .map(|(k, n)| format!("{n} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let ops = [
            ("create", &self.creates, args.federations),
            ("replica change", &self.changes, args.changes),
        ];
        for (what, phase, n) in ops {
            if n == 0 {
                continue;
            }
            let requests = phase.reconcile_requests();
            let changed = phase.hub_changes(n);
            let ratio = requests as f64 / changed.max(1) as f64;
            println!(
                "per {what} (until settled, {n} ops in {:.1} s, hub CPU {:.2} s):",
                phase.wall.as_secs_f64(),
                phase.cpu.as_secs_f64()
            );
            println!("  hub requests per op:");
            for line in per_resource(&phase.requests, n as f64) {
                println!("    {line}");
            }
            println!(
                "  objects the hub changed per op: {:.2} ({})",
                changed as f64 / n as f64,
                phase
                    .changes
                    .iter()
                    .map(|(k, c)| {
                        // The bench's own write of each Federation is not the hub's.
                        let c = if *k == "Federation" {
                            c.saturating_sub(n as u64)
                        } else {
                            *c
                        };
                        format!("{k} {:.2}", c as f64 / n as f64)
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            println!(
                "  requests (no watches, Events or leader election) per changed object: {ratio:.2} ({requests} / {changed}; writes {}, reads {})   target ≤ {TARGET_REQUESTS_PER_CHANGE}   {}",
                phase.writes(),
                requests - phase.writes().min(requests),
                verdict(ratio <= TARGET_REQUESTS_PER_CHANGE)
            );
        }
        let idle_requests = self.idle.reconcile_requests();
        println!(
            "leader election (--leader-elect, as deployed): {} Lease requests in {} s idle ({:.2}/s; one renewal per retry period)",
            self.idle.lease_requests(),
            args.idle_seconds,
            self.idle.lease_requests() as f64 / args.idle_seconds.max(1) as f64
        );
        println!(
            "idle {} s with {} Federations (hub CPU {:.2} s): hub requests {}; objects changed {}   target 0 besides watches and leader election   {}",
            args.idle_seconds,
            self.federations_present,
            self.idle.cpu.as_secs_f64(),
            per_resource(&self.idle.requests, 1.0).join("; "),
            self.idle.hub_changes(0),
            verdict(idle_requests == 0)
        );
        let mib = |kib: u64| kib as f64 / 1024.0;
        println!(
            "hub RSS: {:.1} MiB with 0 Federations (target ≤ {TARGET_IDLE_RSS_MIB} {}), {:.1} MiB with {}, {:.1} MiB with {} at the end",
            mib(self.rss_empty_kib),
            verdict(mib(self.rss_empty_kib) <= TARGET_IDLE_RSS_MIB),
            mib(self.rss_idle_feds_kib),
            args.idle,
            mib(self.rss_end_kib),
            self.federations_present
        );
        println!("load at start: {load_start}; at end: {load_end}");
    }
}

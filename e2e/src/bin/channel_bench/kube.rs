//! `--store kube`: the work channel at scale in Kubernetes mode (the hub's memory and apiserver
//! writes at 10,000 clusters, and a connection storm with `--batch N --agent-backoff`).
//!
//! A real kube-apiserver from the e2e harness; `flower-hub serve` installed as the README tells
//! an admin (manifests, ServiceAccount, `--lease-duration`), as a child process with its own
//! RSS; N accepted `ManagedCluster`s with client certificates signed by the hub's CA (the
//! `flower-hub-ca` Secret), written by this bench through the hub's own `KubeStore` (joining is
//! not what is measured); a Placement that selects every cluster and one Federation on it. Then
//! N simulated agents (real mTLS streams, in this process) connect, and the bench reports:
//!
//! - the time until the hub holds every stream (its `flower_addon_hub_connected_agents`) and
//!   until every agent has its work;
//! - fan-out: `--rounds` changes of the Federation's pool (its replicas, which also moves every
//!   cluster's partitions), each timed from the apply call to each agent's runtime being handed
//!   the new pool spec: apiserver → hub watch → placement and work → stream → agent;
//! - steady state: once every cluster's first heartbeat of its stream is written, the
//!   apiserver's write requests (`apiserver_request_total`, verbs POST, PUT, PATCH, APPLY,
//!   DELETE) over `--steady-seconds`, in total (every client: hub, controller-manager,
//!   scheduler, kwok) and by resource;
//! - the hub's RSS at each step, and its mean Placement reconcile time.
use super::{Args, Credentials, provision_into, rss_kib, spawn_agents};
use anyhow::{Context, ensure};
use e2e::ControlPlane;
use e2e::addon::{Addon, AddonOptions, HUB_NS};
use e2e::scrape::Samples;
use flower_addon_agent::runtime::{BoxFuture, MemoryRuntime, Runtime, RuntimeError};
use flower_addon_hub::kube::store::KubeStore;
use flower_addon_hub::registration::store::{CONDITION_AVAILABLE, CONDITION_HUB_ACCEPTED};
use flower_addon_proto::ClusterWork;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Namespace of the bench's Placement and Federation.
pub(super) const NS: &str = "bench";
/// The Federation placed on every cluster.
const FED: &str = "fed";
/// Field manager of the bench's applies.
const MANAGER: &str = "channel-bench";
/// The hub's process name in the harness.
pub(super) const HUB_PROC: &str = "flower-hub";
/// Verbs of `apiserver_request_total` that write.
const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// Targets at scale: the hub's RSS, apiserver writes a second, fan-out p99 and how long a storm
/// takes to settle (the storm with `--batch N --agent-backoff`).
const RSS_TARGET_KIB: u64 = 1024 * 1024;
const WRITES_TARGET: f64 = 20.0;
const FANOUT_P99_TARGET: Duration = Duration::from_secs(5);
const STORM_TARGET: Duration = Duration::from_secs(60);
/// The steady-state write rate is also shown per slice of this length.
const STEADY_SLICE: Duration = Duration::from_secs(15);

pub(super) async fn driver(args: Args) -> anyhow::Result<()> {
    e2e::install_crypto();
    // The soak's invariants hold for any build (its short variant runs in the debug suite);
    // the scale figures need a release hub.
    ensure!(
        !cfg!(debug_assertions) || args.flap > 0,
        "a debug build measures a debug hub: run `cargo build --release --bins` and then \
         `target/release/channel_bench --store kube`"
    );
    let hub_bin = e2e::binary("flower-hub")?;
    println!("hub binary: {}", hub_bin.display());
    println!("load at start: {}", e2e::harness::loadavg());
    let options = e2e::Options {
        nodes_per_cluster: 1,
        ..Default::default()
    };
    eprintln!("starting the control plane (etcd, kube-apiserver, controller-manager, kwok)…");
    let mut cp = ControlPlane::start_with(&["hub"], options).await?;
    if args.flap > 0 {
        let result = super::soak::soak(&mut cp, &args).await;
        cp.log_tails_on_error(&result, &[HUB_PROC]);
        return result;
    }
    let result = bench(&mut cp, &args).await;
    cp.log_tails_on_error(&result, &[HUB_PROC]);
    drop(cp);
    let report = result?;
    report.print(&args);
    report.verdict(&args)
}

/// Everything measured.
#[derive(Default)]
struct Report {
    provision: Duration,
    connected: u64,
    connect_all: Duration,
    work_all: Duration,
    rounds: Vec<Round>,
    steady_wait: Duration,
    steady: Duration,
    writes: BTreeMap<String, f64>,
    writes_by_resource: BTreeMap<String, f64>,
    steady_slices: Vec<f64>,
    agents: String,
    connect_requests: String,
    rss_empty_kib: u64,
    rss_clusters_kib: u64,
    rss_connected_kib: u64,
    rss_end_kib: u64,
    client_rss_kib: u64,
    placement_mean_ms: f64,
    placement_reconciles: f64,
    load_connected: String,
    load_end: String,
}

/// One fan-out.
struct Round {
    replicas: i64,
    apply_call: Duration,
    latencies: Vec<Duration>,
    missing: usize,
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted
        .get(((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(Duration::MAX)
}

fn ms(d: Duration) -> String {
    if d == Duration::MAX {
        "-".into()
    } else {
        format!("{:.0}", d.as_secs_f64() * 1000.0)
    }
}

impl Report {
    fn writes_per_second(&self) -> f64 {
        self.writes.values().sum::<f64>() / self.steady.as_secs_f64().max(1e-9)
    }

    fn print(&self, args: &Args) {
        let n = args.agents;
        println!();
        println!("== channel_bench --store kube, {n} clusters ==");
        println!(
            "provisioned {n} ManagedClusters (+ client certificates) in {:.1} s",
            self.provision.as_secs_f64()
        );
        println!(
            "connect: {} of {n} streams held after {:.1} s (batches of {} every 100 ms{}); every agent had its work after {:.1} s",
            self.connected,
            self.connect_all.as_secs_f64(),
            args.batch,
            if args.agent_backoff {
                ", the agent's own backoff"
            } else {
                ""
            },
            self.work_all.as_secs_f64()
        );
        println!("agents when all were connected (or not): {}", self.agents);
        println!(
            "apiserver requests per cluster while connecting: {}",
            self.connect_requests
        );
        for (i, r) in self.rounds.iter().enumerate() {
            println!(
                "fan-out {}: replicas → {}: apply call {} ms; agents with the new pool {} of {n}: p50 {} ms, p99 {} ms, max {} ms",
                i + 1,
                r.replicas,
                ms(r.apply_call),
                r.latencies.len(),
                ms(pct(&r.latencies, 0.5)),
                ms(pct(&r.latencies, 0.99)),
                ms(pct(&r.latencies, 1.0)),
            );
            if r.missing > 0 {
                println!("  {} agents never got it", r.missing);
            }
        }
        println!(
            "steady state: reached {:.0} s after the last fan-out; {:.0} s counted: {:.2} writes/s in total ({})",
            self.steady_wait.as_secs_f64(),
            self.steady.as_secs_f64(),
            self.writes_per_second(),
            self.writes
                .iter()
                .filter(|(_, n)| **n > 0.0)
                .map(|(v, n)| format!("{v} {n:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!(
            "  per {} s: {} writes/s",
            STEADY_SLICE.as_secs(),
            self.steady_slices
                .iter()
                .map(|r| format!("{r:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let mut by_resource: Vec<_> = self.writes_by_resource.iter().collect();
        by_resource.sort_by(|a, b| b.1.total_cmp(a.1));
        println!(
            "  by resource: {}",
            by_resource
                .iter()
                .filter(|(_, n)| **n > 0.0)
                .map(|(r, n)| format!("{r} {:.2}/s", **n / self.steady.as_secs_f64().max(1e-9)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!(
            "hub RSS: {} MiB started, {} MiB with {n} ManagedClusters, {} MiB holding {n} streams, {} MiB at the end",
            self.rss_empty_kib / 1024,
            self.rss_clusters_kib / 1024,
            self.rss_connected_kib / 1024,
            self.rss_end_kib / 1024
        );
        println!(
            "hub Placement reconciles: {:.0}, mean {:.1} ms (one Placement over {n} clusters; `cargo bench -p flower-addon-hub --bench placement` times evaluation alone)",
            self.placement_reconciles, self.placement_mean_ms
        );
        println!(
            "bench process (all {n} agents) RSS {} MiB",
            self.client_rss_kib / 1024
        );
        println!(
            "load: {} when connected, {} at the end",
            self.load_connected, self.load_end
        );
    }

    /// Checks the targets; an error names each one missed.
    fn verdict(&self, args: &Args) -> anyhow::Result<()> {
        let n = args.agents;
        let p99 = self
            .rounds
            .iter()
            .map(|r| pct(&r.latencies, 0.99))
            .max()
            .unwrap_or(Duration::MAX);
        let rss = self.rss_connected_kib.max(self.rss_end_kib);
        let mut checks = vec![
            (
                format!("{n} clusters connected"),
                self.connected == n as u64,
            ),
            (
                format!("hub RSS {} MiB ≤ 1024 MiB", rss / 1024),
                rss <= RSS_TARGET_KIB,
            ),
            (
                format!(
                    "steady writes {:.2}/s ≤ {WRITES_TARGET}/s",
                    self.writes_per_second()
                ),
                self.writes_per_second() <= WRITES_TARGET,
            ),
            (
                format!("fan-out p99 {} ms ≤ 5000 ms", ms(p99)),
                p99 <= FANOUT_P99_TARGET && self.rounds.iter().all(|r| r.missing == 0),
            ),
        ];
        if args.batch >= n && args.agent_backoff {
            checks.push((
                format!(
                    "storm: all {n} connected within {:.1} s ≤ 60 s",
                    self.connect_all.as_secs_f64()
                ),
                self.connect_all <= STORM_TARGET,
            ));
        }
        let mut missed = Vec::new();
        for (what, ok) in &checks {
            println!("{} {what}", if *ok { "PASS" } else { "MISS" });
            if !ok {
                missed.push(what.clone());
            }
        }
        ensure!(missed.is_empty(), "targets missed: {}", missed.join("; "));
        Ok(())
    }
}

/// The agents' view of the fan-out: when each runtime was first handed the pool with
/// `target` replicas.
struct Fanout {
    target: AtomicI64,
    started: Mutex<Instant>,
    seen: Mutex<Vec<Duration>>,
    changed: watch::Sender<usize>,
}

impl Fanout {
    fn new() -> Self {
        Self {
            target: AtomicI64::new(-1),
            started: Mutex::new(Instant::now()),
            seen: Mutex::new(Vec::new()),
            changed: watch::channel(0).0,
        }
    }

    /// Starts counting the agents handed `replicas`, from now.
    fn start(&self, replicas: i64) {
        if let (Ok(mut started), Ok(mut seen)) = (self.started.lock(), self.seen.lock()) {
            *started = Instant::now();
            seen.clear();
            self.target.store(replicas, Ordering::SeqCst);
        }
        self.changed.send_replace(0);
    }

    fn record(&self, replicas: i64) {
        if replicas != self.target.load(Ordering::SeqCst) {
            return;
        }
        if let (Ok(started), Ok(mut seen)) = (self.started.lock(), self.seen.lock()) {
            seen.push(started.elapsed());
            self.changed.send_replace(seen.len());
        }
    }

    /// Waits until `n` agents have it (or `timeout`); the sorted latencies.
    async fn wait(&self, n: usize, timeout: Duration) -> Vec<Duration> {
        let mut rx = self.changed.subscribe();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|seen| *seen >= n)).await;
        let mut seen = self.seen.lock().map(|s| s.clone()).unwrap_or_default();
        seen.sort();
        seen
    }
}

/// [`MemoryRuntime`] that tells [`Fanout`] when it is first handed each pool size.
struct BenchRuntime {
    inner: MemoryRuntime,
    fanout: Arc<Fanout>,
    last: AtomicI64,
}

impl Runtime for BenchRuntime {
    fn apply<'a>(&'a self, work: &'a ClusterWork) -> BoxFuture<'a, Result<(), RuntimeError>> {
        if let Some(replicas) = pool_replicas(work)
            && self.last.swap(replicas, Ordering::SeqCst) != replicas
        {
            self.fanout.record(replicas);
        }
        self.inner.apply(work)
    }

    fn status(&self) -> BoxFuture<'_, Vec<flower_addon_proto::FederationStatus>> {
        self.inner.status()
    }
}

/// The replicas of the bench Federation's pool in `work`.
fn pool_replicas(work: &ClusterWork) -> Option<i64> {
    let fed = work
        .federations
        .iter()
        .find(|f| f.namespace == NS && f.name == FED)?;
    let spec: serde_json::Value = serde_json::from_str(&fed.pools.first()?.spec_json).ok()?;
    spec.get("replicas")?.as_i64()
}

fn placement() -> serde_json::Value {
    placement_of(None)
}

/// The Placement `everywhere`: every cluster, or `numberOfClusters` of them.
pub(super) fn placement_of(number_of_clusters: Option<usize>) -> serde_json::Value {
    let spec = match number_of_clusters {
        Some(n) => serde_json::json!({"numberOfClusters": n}),
        None => serde_json::json!({}),
    };
    serde_json::json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "Placement",
        "metadata": {"name": "everywhere", "namespace": NS},
        "spec": spec,
    })
}

pub(super) fn federation(replicas: i64) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "Federation",
        "metadata": {"name": FED, "namespace": NS},
        "spec": {
            "mode": "StatefulSet",
            "isolationMode": "subprocess",
            "insecure": false,
            // The SuperLink is a kwok pod: no key can be registered with it.
            "supernodeAuthentication": false,
            "placementRef": {"name": "everywhere"},
            "superlink": {"image": "flwr/superlink:1.42.0",
                          "externalAddress": "hub.example:30092",
                          "service": {"type": "NodePort"}},
            "supernodes": {"image": "flwr/supernode:1.42.0",
                           "pools": [{"name": "a", "replicas": replicas}]},
        }
    })
}

pub(super) async fn apply(
    client: &Client,
    kind: &str,
    body: &serde_json::Value,
) -> anyhow::Result<()> {
    let name = body["metadata"]["name"].as_str().unwrap_or_default();
    let params = PatchParams::apply(MANAGER).force();
    match kind {
        "Placement" => {
            Api::<flower_addon_crds::Placement>::namespaced(client.clone(), NS)
                .patch(name, &params, &Patch::Apply(body))
                .await?;
        }
        _ => {
            Api::<flower_addon_crds::Federation>::namespaced(client.clone(), NS)
                .patch(name, &params, &Patch::Apply(body))
                .await?;
        }
    }
    Ok(())
}

/// Scrapes the hub's `/metrics` (off the runtime: the scrape is a blocking read).
pub(super) async fn hub_samples(addr: SocketAddr) -> anyhow::Result<Samples> {
    tokio::task::spawn_blocking(move || Samples::scrape(addr)).await?
}

/// The apiserver's `apiserver_request_total` summed by (verb, resource[/subresource]).
async fn request_counts(admin: &Client) -> anyhow::Result<BTreeMap<(String, String), f64>> {
    let text = admin
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await
        .context("GET /metrics from the hub apiserver")?;
    let samples = Samples::parse(&text)?;
    let series = samples.series("apiserver_request_total");
    ensure!(
        !series.is_empty(),
        "the apiserver's /metrics has no apiserver_request_total"
    );
    let mut out = BTreeMap::new();
    for (labels, value) in series {
        let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
        let resource = match labels.get("subresource").filter(|s| !s.is_empty()) {
            Some(sub) => format!("{}/{sub}", get("resource")),
            None => get("resource"),
        };
        *out.entry((get("verb"), resource)).or_insert(0.0) += value;
    }
    Ok(out)
}

/// The apiserver's write requests by verb, and by resource.
pub(super) async fn apiserver_writes(
    admin: &Client,
) -> anyhow::Result<(BTreeMap<String, f64>, BTreeMap<String, f64>)> {
    let mut by_verb: BTreeMap<String, f64> =
        WRITE_VERBS.iter().map(|v| (v.to_string(), 0.0)).collect();
    let mut by_resource = BTreeMap::new();
    for ((verb, resource), value) in request_counts(admin).await? {
        if let Some(n) = by_verb.get_mut(&verb) {
            *n += value;
            *by_resource.entry(resource).or_insert(0.0) += value;
        }
    }
    Ok((by_verb, by_resource))
}

/// The requests between two [`request_counts`], the most frequent first, per cluster.
fn requests_per_cluster(
    after: &BTreeMap<(String, String), f64>,
    before: &BTreeMap<(String, String), f64>,
    clusters: usize,
) -> String {
    let mut counts: Vec<(String, f64)> = after
        .iter()
        .map(|((verb, resource), v)| {
            let d = v - before
                .get(&(verb.clone(), resource.clone()))
                .copied()
                .unwrap_or(0.0);
            (format!("{verb} {resource}"), d)
        })
        .filter(|(_, d)| *d >= clusters as f64 / 10.0)
        .collect();
    counts.sort_by(|a, b| b.1.total_cmp(&a.1));
    counts
        .iter()
        .map(|(what, n)| format!("{what} {:.2}", n / clusters.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

fn delta(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// The hub as the README tells an admin to install it (`--lease-duration` from the arguments),
/// the bench namespace bound to every cluster, the Placement over every cluster and the
/// Federation with one replica: the addon, the hub's pid and its metrics address.
pub(super) async fn install_hub(
    cp: &mut ControlPlane,
    args: &Args,
    admin: &Client,
) -> anyhow::Result<(Addon, u32, SocketAddr)> {
    eprintln!("installing the hub (CRDs, manifests/hub, flower-hub serve)…");
    let addon = Addon::install(
        cp,
        &[],
        &AddonOptions {
            lease: args.lease.clone(),
            ..Default::default()
        },
    )
    .await?;
    let hub_pid = cp
        .processes()
        .get(HUB_PROC)
        .context("the hub process is not running")?
        .pid();
    let hub_metrics = addon
        .ops
        .get(HUB_PROC)
        .context("the hub's metrics address")?
        .metrics;
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": NS}}))?,
        )
        .await
        .context("creating the bench namespace")?;
    e2e::addon::bind_every_cluster(admin, NS).await?;
    apply(admin, "Placement", &placement()).await?;
    apply(admin, "Federation", &federation(1)).await?;
    Ok((addon, hub_pid, hub_metrics))
}

async fn bench(cp: &mut ControlPlane, args: &Args) -> anyhow::Result<Report> {
    let n = args.agents;
    let mut report = Report::default();
    let admin = cp.cluster("hub")?.client.clone();
    let (addon, hub_pid, hub_metrics) = install_hub(cp, args, &admin).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    report.rss_empty_kib = e2e::process::rss_kib(hub_pid).unwrap_or(0);

    eprintln!("provisioning {n} ManagedClusters and their client certificates…");
    let store = KubeStore::without_watch(admin.clone(), HUB_NS);
    let t = Instant::now();
    let creds: Vec<Credentials> = provision_into(&store, n, 16).await?;
    report.provision = t.elapsed();
    eprintln!("  done in {:.1} s", report.provision.as_secs_f64());
    cp.processes().check_alive()?;
    report.rss_clusters_kib = e2e::process::rss_kib(hub_pid).unwrap_or(0);

    eprintln!("connecting {n} agents…");
    let fanout = Arc::new(Fanout::new());
    fanout.start(1);
    let (stop_tx, stop_rx) = watch::channel(false);
    let requests_before = request_counts(&admin).await?;
    let connect_unix = flower_addon_hub::registration::tokens::unix_now();
    let t = Instant::now();
    let (tasks, tally) = spawn_agents(creds, &addon.hub_address, args, &stop_rx, |_| {
        Arc::new(BenchRuntime {
            inner: MemoryRuntime::new(),
            fanout: fanout.clone(),
            last: AtomicI64::new(-1),
        }) as Arc<dyn Runtime>
    })
    .await;
    let deadline = t + Duration::from_secs(300);
    let mut last_note = 0;
    while Instant::now() < deadline {
        let samples = hub_samples(hub_metrics).await?;
        report.connected = samples
            .value("flower_addon_hub_connected_agents", &[])
            .unwrap_or(0.0) as u64;
        if report.connected >= n as u64 {
            break;
        }
        if t.elapsed().as_secs() / 10 != last_note {
            last_note = t.elapsed().as_secs() / 10;
            eprintln!(
                "  {} connected after {} s",
                report.connected,
                t.elapsed().as_secs()
            );
        }
        cp.processes().check_alive()?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    report.connect_all = t.elapsed();
    report.agents = tally.summary();
    report.connect_requests =
        requests_per_cluster(&request_counts(&admin).await?, &requests_before, n);
    report.rss_connected_kib = e2e::process::rss_kib(hub_pid).unwrap_or(0);
    report.load_connected = e2e::harness::loadavg();
    eprintln!(
        "  {} connected in {:.1} s",
        report.connected,
        report.connect_all.as_secs_f64()
    );
    let had_work = fanout.wait(n, Duration::from_secs(180)).await;
    report.work_all = t.elapsed();
    eprintln!(
        "  {} of {n} agents had their work after {:.1} s",
        had_work.len(),
        report.work_all.as_secs_f64()
    );

    for round in 1..=args.rounds {
        let replicas = 1 + round as i64;
        eprintln!("fan-out {round}: pool a → {replicas} replicas on every cluster…");
        fanout.start(replicas);
        let t = Instant::now();
        apply(&admin, "Federation", &federation(replicas)).await?;
        let apply_call = t.elapsed();
        let latencies = fanout.wait(n, Duration::from_secs(120)).await;
        report.rounds.push(Round {
            replicas,
            apply_call,
            missing: n - latencies.len(),
            latencies,
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Steady state: what connecting makes the hub write is written: each cluster's acceptance
    // conditions, its availability and the first heartbeat of its stream.
    eprintln!(
        "waiting for every cluster's acceptance, availability and first heartbeat to be written…"
    );
    let t = Instant::now();
    let clusters = Api::<flower_addon_crds::ManagedCluster>::all(admin.clone());
    e2e::wait_until(
        "every ManagedCluster HubAcceptedManagedCluster=True, Available=True and its \
         lastHeartbeat written since its agent connected",
        Duration::from_secs(600),
        || async {
            let list = clusters.list(&ListParams::default()).await?;
            let written = list
                .items
                .iter()
                .filter_map(|mc| mc.status.as_ref())
                .filter(|s| {
                    let is_true = |t: &str| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == t && c.status == "True")
                    };
                    is_true(CONDITION_HUB_ACCEPTED)
                        && is_true(CONDITION_AVAILABLE)
                        && s.last_heartbeat
                            .as_ref()
                            .is_some_and(|t| t.0.as_second() >= connect_unix as i64)
                })
                .count();
            Ok(written >= n)
        },
    )
    .await?;
    report.steady_wait = t.elapsed();
    eprintln!("counting writes for {} s…", args.steady_seconds);
    let (verbs_before, resources_before) = apiserver_writes(&admin).await?;
    let t = Instant::now();
    // In slices, so that a rate still falling (not yet steady) shows.
    let mut last = verbs_before.clone();
    let mut last_at = t;
    while t.elapsed() < Duration::from_secs(args.steady_seconds) {
        let left = Duration::from_secs(args.steady_seconds).saturating_sub(t.elapsed());
        tokio::time::sleep(left.min(STEADY_SLICE)).await;
        let (now, _) = apiserver_writes(&admin).await?;
        let writes: f64 = delta(&now, &last).values().sum();
        report
            .steady_slices
            .push(writes / last_at.elapsed().as_secs_f64().max(1e-9));
        (last, last_at) = (now, Instant::now());
    }
    let (verbs_after, resources_after) = apiserver_writes(&admin).await?;
    report.steady = t.elapsed();
    report.writes = delta(&verbs_after, &verbs_before);
    report.writes_by_resource = delta(&resources_after, &resources_before);
    cp.processes().check_alive()?;
    report.rss_end_kib = e2e::process::rss_kib(hub_pid).unwrap_or(0);
    report.load_end = e2e::harness::loadavg();
    let samples = hub_samples(hub_metrics).await?;
    let labels = [("controller", "placement")];
    report.placement_reconciles =
        samples.count("flower_addon_hub_reconcile_duration_seconds_count", &labels);
    report.placement_mean_ms =
        samples.count("flower_addon_hub_reconcile_duration_seconds_sum", &labels) * 1000.0
            / report.placement_reconciles.max(1.0);
    report.client_rss_kib = rss_kib();

    let _ = stop_tx.send(true);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    Ok(report)
}

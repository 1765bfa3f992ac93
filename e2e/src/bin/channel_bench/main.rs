//! Work-channel scale benchmark: N simulated agents (real mTLS streams, all in this process)
//! against one standalone hub running as a child process (so its RSS is its own).
//!
//! `cargo run --release -p e2e --bin channel_bench -- --agents 10000 [--store kube]`
//!
//! `--store file` (the default): provision N accepted clusters and their client certificates
//! directly in a fresh state directory (joining is not what is measured), start the hub child
//! (this binary, the file store and an in-memory work source), connect the agents in batches,
//! then change every cluster's work `--rounds` times and measure, in the hub, the time from the
//! change to each agent's ack (fan-out latency). Prints held connections, hub RSS and
//! p50/p99/max fan-out.
//!
//! `--store kube`: the same agents against `flower-hub serve` in Kubernetes mode on a real
//! kube-apiserver (see [`kube`]); with `--flap SECONDS` the flapping soak instead (see [`soak`]).
use anyhow::{Context, bail};
use clap::Parser;
use flower_addon_agent::channel::{RunOptions, run};
use flower_addon_agent::credentials::{AgentConfig, Credentials, make_csr};
use flower_addon_agent::runtime::MemoryRuntime;
use flower_addon_hub::channel::source::{InMemoryWorkSource, WorkSource};
use flower_addon_hub::channel::{ChannelConfig, ChannelServer};
use flower_addon_hub::registration::store::file::FileStore;
use flower_addon_hub::registration::store::{ClusterRegistration, ClusterStore, load_or_create_ca};
use flower_addon_proto::{ClusterWork, FederationWork, PoolWork, Status};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{Notify, watch};

mod kube;
mod soak;

/// Where the hub keeps its clusters.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Store {
    /// The standalone hub's state directory, the work from an in-memory source.
    File,
    /// `flower-hub serve` on a real kube-apiserver: ManagedClusters, and the work of a
    /// Federation placed on every cluster.
    Kube,
}

#[derive(Parser, Debug)]
#[command(about = "flower-addon work channel scale benchmark")]
struct Args {
    /// Number of simulated agents.
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// The hub's store.
    #[arg(long, value_enum, default_value_t = Store::File)]
    store: Store,
    /// `--store kube`: seconds of steady state over which the apiserver's write requests are
    /// counted, once every cluster's first heartbeat after connecting is written.
    #[arg(long, default_value_t = 120)]
    steady_seconds: u64,
    /// `--store kube`: the hub's `--lease-duration` (its default: 60s).
    #[arg(long, default_value = "60s")]
    lease: String,
    /// Work changes to measure.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Loopback source addresses the agents spread over (127.0.0.1 … 127.0.0.K).
    #[arg(long, default_value_t = 4)]
    source_ips: u8,
    /// Agents started per batch (one batch every 100 ms).
    #[arg(long, default_value_t = 250)]
    batch: usize,
    /// After the fan-out, open this many TCP connections without TLS from 127.0.1.x (a flood
    /// by someone without a certificate), then measure the hub's RSS and descriptors, a join and
    /// a reconnecting agent while they are held (0: no flood).
    #[arg(long, default_value_t = 0)]
    flood: usize,
    /// Agents reconnect with the agent's own backoff (1 s doubling to 30 s, with jitter)
    /// instead of the bench's quicker 0.5 s to 5 s: what a real fleet does in a connect storm
    /// (`--batch` = `--agents` starts every agent at once).
    #[arg(long)]
    agent_backoff: bool,
    /// `--store kube`: the flapping soak instead of the scale bench: every agent drops and
    /// re-opens its stream at random for this many seconds while the work changes, then the
    /// soak checks each agent's work, the hub's RSS and descriptors, and apiserver writes
    /// (0: no soak). Runs in a debug build too (the suite's short variant).
    #[arg(long, default_value_t = 0)]
    flap: u64,
    /// `--flap`: longest time an agent holds its stream before dropping it, seconds (the
    /// shortest is a twelfth of it; the pause before re-opening up to a tenth).
    #[arg(long, default_value_t = 120)]
    flap_hold_max: u64,
    /// `--flap`: seconds between changes of the Federation's replicas or the Placement's
    /// numberOfClusters.
    #[arg(long, default_value_t = 15)]
    flap_change_every: u64,
    /// `--flap`: seed of the random holds, pauses and changes (a run can be repeated).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Internal: run as the hub child on this state dir.
    #[arg(long, hide = true)]
    serve_hub: Option<PathBuf>,
    /// Internal: hub child listen address.
    #[arg(long, hide = true, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match args.serve_hub.clone() {
        Some(dir) => runtime.block_on(hub_child(dir, args.listen)),
        None if args.store == Store::Kube => runtime.block_on(kube::driver(args)),
        None => runtime.block_on(driver(args)),
    }
}

/// Raises RLIMIT_NOFILE as far as allowed (root may lift the hard limit too).
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let want = 1_048_576;
    if setrlimit(Resource::RLIMIT_NOFILE, want, want).is_err()
        && let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

// === hub child ===

/// Wraps the in-memory source and timestamps acks of the current round.
struct BenchWork {
    inner: InMemoryWorkSource,
    round: Mutex<Round>,
    done: Notify,
}

#[derive(Default)]
struct Round {
    started: Option<Instant>,
    targets: HashMap<String, u64>,
    latencies: Vec<Duration>,
}

impl WorkSource for BenchWork {
    fn snapshot(&self, cluster: &str) -> ClusterWork {
        self.inner.snapshot(cluster)
    }
    fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes()
    }
    fn on_ack(&self, cluster: &str, version: u64) {
        if let Ok(mut round) = self.round.lock()
            && let Some(started) = round.started
            && round.targets.get(cluster) == Some(&version)
        {
            round.targets.remove(cluster);
            round.latencies.push(started.elapsed());
            if round.targets.is_empty() {
                self.done.notify_one();
            }
        }
    }
    fn on_status(&self, cluster: &str, status: &Status) {
        self.inner.on_status(cluster, status)
    }
}

fn bench_work(round: usize) -> ClusterWork {
    ClusterWork {
        federations: vec![FederationWork {
            namespace: "bench".into(),
            name: "fed".into(),
            flower_version: "1.20.0".into(),
            superlink_fleet_address: "127.0.0.1:9092".into(),
            partitions_total: 2,
            pools: vec![PoolWork {
                name: "p0".into(),
                partition_offset: 0,
                spec_json: format!(r#"{{"name":"p0","replicas":2,"round":{round}}}"#),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn hub_child(dir: PathBuf, listen: SocketAddr) -> anyhow::Result<()> {
    let store = Arc::new(FileStore::open(&dir)?);
    let ca = Arc::new(load_or_create_ca(store.as_ref()).await?);
    let names: Vec<String> = store
        .list_clusters()
        .await?
        .into_iter()
        .map(|c| c.registration.name)
        .collect();
    let work = Arc::new(BenchWork {
        inner: InMemoryWorkSource::new(),
        round: Mutex::new(Round::default()),
        done: Notify::new(),
    });
    let config = ChannelConfig {
        lease_duration: Duration::from_secs(600),
        auto_accept: [("bench".to_owned(), "yes".to_owned())].into(),
        ..ChannelConfig::default()
    };
    let store_for_tokens = store.clone();
    let ca_hash = ca.hash().to_owned();
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let server = ChannelServer::new(store, work.clone(), ca, config);
    let connected = server.connected_counter();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve(vec![listener], async {
        let _ = stop_rx.await;
    }));
    println!("ready {addr}");
    // Commands on stdin (read on a plain thread: tokio's stdin needs a feature we do not enable).
    let (line_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if line_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut round_no = 0;
    while let Some(line) = lines.recv().await {
        match line.trim() {
            "stats" => println!(
                "stats connected={} rss_kib={} fds={}",
                connected(),
                rss_kib(),
                std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
            ),
            "token" => {
                let new = flower_addon_hub::registration::tokens::generate_scoped(
                    Duration::from_secs(3600),
                    "flood bench",
                    flower_addon_hub::registration::tokens::TokenScope {
                        labels: [("bench".to_owned(), "yes".to_owned())].into(),
                        ..Default::default()
                    },
                );
                store_for_tokens.put_token(&new.record).await?;
                println!("token {} ca_hash={}", new.token, ca_hash);
            }
            "bump" => {
                round_no += 1;
                let works = names.iter().map(|n| (n.clone(), bench_work(round_no)));
                {
                    // Hold the round lock while publishing, so every target is recorded before
                    // any ack for it can be counted.
                    let mut round = work.round.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                    *round = Round::default();
                    round.started = Some(Instant::now());
                    let versions = work.inner.set_many(works);
                    round.targets = names.iter().cloned().zip(versions).collect();
                }
                let waited =
                    tokio::time::timeout(Duration::from_secs(120), work.done.notified()).await;
                let mut round = work.round.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                let mut l = std::mem::take(&mut round.latencies);
                l.sort();
                let pct = |p: f64| {
                    l.get(((l.len() as f64 * p).ceil() as usize).saturating_sub(1))
                        .map(|d| d.as_secs_f64() * 1000.0)
                        .unwrap_or(f64::NAN)
                };
                println!(
                    "fanout acked={} missing={} p50_ms={:.1} p99_ms={:.1} max_ms={:.1} timeout={}",
                    l.len(),
                    round.targets.len(),
                    pct(0.50),
                    pct(0.99),
                    pct(1.0),
                    waited.is_err()
                );
            }
            "quit" => break,
            other => println!("error unknown command {other:?}"),
        }
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), serving).await;
    Ok(())
}

// === driver ===

async fn driver(args: Args) -> anyhow::Result<()> {
    let n = args.agents;
    let dir = tempfile::tempdir()?;
    let t = Instant::now();
    let creds = provision(dir.path().to_path_buf(), n).await?;
    eprintln!(
        "provisioned {n} clusters in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .arg("--serve-hub")
        .arg(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("start the hub child")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let mut out = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let ready = out.next_line().await?.context("hub child exited")?;
    let addr = ready
        .strip_prefix("ready ")
        .context("unexpected hub output")?
        .to_string();
    let mut ask = async |cmd: &str| -> anyhow::Result<String> {
        stdin.write_all(format!("{cmd}\n").as_bytes()).await?;
        out.next_line().await?.context("hub child exited")
    };

    let idle_rss = ask("stats").await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let t = Instant::now();
    let (tasks, tally) = spawn_agents(creds, &addr, &args, &stop_rx, |_| {
        Arc::new(MemoryRuntime::new())
    })
    .await;
    let mut connected = 0;
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        let stats = ask("stats").await?;
        connected = field(&stats, "connected").unwrap_or(0);
        if connected >= n as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let connect_secs = t.elapsed().as_secs_f64();
    if connected < n as u64 {
        eprintln!("only {connected}/{n} agents connected after {connect_secs:.0}s");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = ask("stats").await?;
    println!("agents={n} connected={connected} connect_all_s={connect_secs:.1}");
    println!("agents: {}", tally.summary());
    println!("hub idle (no agents): {idle_rss}");
    println!("hub holding streams:  {held}");
    let mut results = Vec::new();
    for round in 1..=args.rounds {
        let line = ask("bump").await?;
        println!("round {round}: {line}");
        results.push(line);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let after = ask("stats").await?;
    println!("hub after fan-out:    {after}");
    if args.flood > 0 {
        let token_line = ask("token").await?;
        flood(&args, &addr, &token_line, &mut ask).await?;
    }
    println!("client process rss_kib={} (all {n} agents)", rss_kib());
    // Agents first (so the hub's departure is not logged as 10,000 reconnects), then the hub.
    let _ = stop_tx.send(true);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    stdin.write_all(b"quit\n").await?;
    let _ = stdin_quit(&mut child).await;
    if connected < n as u64 {
        bail!("not every agent connected");
    }
    Ok(())
}

/// What the agents went through: which ever held a stream, and why streams ended.
#[derive(Default)]
struct Tally {
    connected: Vec<std::sync::atomic::AtomicBool>,
    ended: Mutex<std::collections::BTreeMap<String, usize>>,
}

impl Tally {
    /// Agents that never held a stream, and the commonest reasons streams ended.
    fn summary(&self) -> String {
        let never = self
            .connected
            .iter()
            .filter(|c| !c.load(std::sync::atomic::Ordering::Relaxed))
            .count();
        let ended = self.ended.lock().map(|e| e.clone()).unwrap_or_default();
        let mut reasons: Vec<(String, usize)> = ended.into_iter().collect();
        reasons.sort_by_key(|r| std::cmp::Reverse(r.1));
        let total: usize = reasons.iter().map(|(_, n)| n).sum();
        let top: Vec<String> = reasons
            .iter()
            .take(3)
            .map(|(why, n)| format!("{n}× {why}"))
            .collect();
        format!(
            "{never} agents never held a stream; {total} streams or attempts ended{}{}",
            if top.is_empty() { "" } else { ": " },
            top.join("; ")
        )
    }
}

/// Starts one agent per credential against the hub at `addr`, `args.batch` every 100 ms, each
/// on the runtime `runtime(i)` made.
async fn spawn_agents(
    creds: Vec<Credentials>,
    addr: &str,
    args: &Args,
    stop: &watch::Receiver<bool>,
    runtime: impl Fn(usize) -> Arc<dyn flower_addon_agent::runtime::Runtime>,
) -> (Vec<tokio::task::JoinHandle<()>>, Arc<Tally>) {
    let tally = Arc::new(Tally {
        connected: (0..creds.len())
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect(),
        ..Tally::default()
    });
    let mut tasks = Vec::with_capacity(creds.len());
    for (i, mut c) in creds.into_iter().enumerate() {
        c.config.hub = addr.to_owned();
        let mut options = RunOptions::new(c, None);
        options.local_ip = Some(IpAddr::V4(Ipv4Addr::new(
            127,
            0,
            0,
            1 + (i % usize::from(args.source_ips.max(1))) as u8,
        )));
        if !args.agent_backoff {
            options.reconnect_min = Duration::from_millis(500);
            options.reconnect_max = Duration::from_secs(5);
        }
        options.status_interval = Duration::from_secs(3600);
        let (events, mut rx) = tokio::sync::mpsc::unbounded_channel();
        options.events = Some(events);
        let runtime = runtime(i);
        let stop = stop.clone();
        let seen = tally.clone();
        tasks.push(tokio::spawn(async move {
            let watch_events = async move {
                use flower_addon_agent::channel::AgentEvent;
                while let Some(event) = rx.recv().await {
                    match event {
                        AgentEvent::Connected => {
                            seen.connected[i].store(true, std::sync::atomic::Ordering::Relaxed)
                        }
                        AgentEvent::Disconnected { code, message } => {
                            let why: String =
                                format!("{code:?}: {message}").chars().take(160).collect();
                            if let Ok(mut ended) = seen.ended.lock() {
                                *ended.entry(why).or_default() += 1;
                            }
                        }
                        _ => {}
                    }
                }
            };
            let _ = tokio::join!(run(options, runtime, stop), watch_events);
        }));
        if (i + 1) % args.batch.max(1) == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    (tasks, tally)
}

/// Holds `args.flood` TCP connections that never start TLS, spread over 127.0.1.1 … 127.0.1.250,
/// and measures what the hub does meanwhile: its RSS and descriptors, how many connections it
/// closed at once (over its caps), how long a new agent's join takes.
async fn flood(
    args: &Args,
    addr: &str,
    token_line: &str,
    ask: &mut impl AsyncFnMut(&str) -> anyhow::Result<String>,
) -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt;
    let hub: SocketAddr = addr.parse()?;
    let before = ask("stats").await?;
    let t = Instant::now();
    let mut held = Vec::with_capacity(args.flood);
    let mut failed = 0;
    for i in 0..args.flood {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::from(([127, 0, 1, 1 + (i % 250) as u8], 0)))?;
        match socket.connect(hub).await {
            Ok(stream) => held.push(stream),
            Err(_) => failed += 1,
        }
    }
    let opened = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Within the handshake timeout (10 s) of the last ones: the hub holds what it admitted.
    let during = ask("stats").await?;
    // A new agent joins (auto-accepted by its token's label) while the flood is held.
    let token = token_line
        .split_whitespace()
        .nth(1)
        .context("token from the hub child")?;
    let ca_hash = token_line
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("ca_hash="))
        .context("ca hash")?;
    let join_dir = tempfile::tempdir()?;
    let mut options = flower_addon_agent::join::JoinOptions::new(
        addr,
        token,
        ca_hash,
        "flood-joiner",
        join_dir.path().to_path_buf(),
    );
    options.max_wait = Some(Duration::from_secs(60));
    let t = Instant::now();
    let joined = flower_addon_agent::join::join(&options, &mut |_| {}).await;
    let join_ms = t.elapsed().as_secs_f64() * 1000.0;
    // Closed by the hub: a read returns at once (EOF or reset).
    let mut closed = 0;
    for stream in &mut held {
        let mut buf = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(1), stream.read(&mut buf)).await
        {
            closed += 1;
        }
    }
    println!(
        "flood: {} connections held from 250 addresses in {opened:.1}s ({failed} failed to connect); {closed} of them closed by the hub by the end (over a cap, or at their handshake timeout)",
        held.len()
    );
    println!("hub before the flood: {before}");
    println!("hub during the flood: {during}");
    println!(
        "join during the flood: {} in {join_ms:.0} ms",
        if joined.is_ok() { "ok" } else { "FAILED" }
    );
    drop(held);
    if let Err(error) = joined {
        bail!("a join during the flood failed: {error}");
    }
    Ok(())
}

async fn stdin_quit(child: &mut tokio::process::Child) -> anyhow::Result<()> {
    let _ = tokio::time::timeout(Duration::from_secs(15), child.wait()).await;
    child.kill().await.ok();
    Ok(())
}

fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
}

/// Creates the CA, N accepted clusters and their client certificates.
async fn provision(dir: PathBuf, n: usize) -> anyhow::Result<Vec<Credentials>> {
    let store = FileStore::open(&dir)?;
    provision_into(&store, n, 1).await
}

/// Creates (or loads) the CA in `store` and N accepted clusters `bench-00000`… with their client
/// certificates, `parallel` at a time.
async fn provision_into<S: ClusterStore>(
    store: &S,
    n: usize,
    parallel: usize,
) -> anyhow::Result<Vec<Credentials>> {
    use futures::{StreamExt, TryStreamExt};
    let ca = load_or_create_ca(store).await?;
    let ca = &ca;
    futures::stream::iter(0..n)
        .map(|i| async move {
            let name = format!("bench-{i:05}");
            let key = rcgen::KeyPair::generate()?;
            let csr = make_csr(&key, &name)?;
            let issued = ca.sign_client_csr(&csr, &name, Duration::from_secs(86400))?;
            store
                .create_cluster(
                    &ClusterRegistration {
                        name: name.clone(),
                        labels: Default::default(),
                        claims: Default::default(),
                        key_fingerprint: issued.key_fingerprint.clone(),
                        previous_key_fingerprint: None,
                        agent_version: "bench".into(),
                        token_id: String::new(),
                        created_unix: 0,
                    },
                    true,
                )
                .await
                .with_context(|| format!("creating cluster {name}"))?;
            anyhow::Ok(Credentials {
                config: AgentConfig {
                    cluster_name: name,
                    hub: String::new(),
                    server_name: "127.0.0.1".into(),
                },
                ca_pem: ca.cert_pem().to_string(),
                cert_pem: issued.cert_pem,
                key_pem: key.serialize_pem(),
            })
        })
        .buffered(parallel.max(1))
        .try_collect()
        .await
}

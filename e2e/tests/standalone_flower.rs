//! The README quickstart, for real: a standalone `flower-hub`, two `flower-agent`s with the process
//! runtime and the real Flower 1.42 packages from PyPI (no mocks), then the failure modes the
//! product promises to handle: a scale-up without restarts, an unregistered node key, a wrong CA,
//! a killed SuperLink and a killed agent.
//!
//! Needs `target/debug/flower-hub` and `target/debug/flower-agent` (`cargo build --bins`; test.sh
//! builds first) and `e2e/flower/venv.sh` (python3 + network on the first run, cached after).
use anyhow::{Context, Result, anyhow, bail, ensure};
use e2e::flwr::{flower_env, json_of};
use e2e::harness::{Processes, SpacedPorts, Wait, binary, flower_venv, live_processes, tail};
use e2e::scrape::Samples;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const FLOWER_VERSION: &str = "1.42.0";
const NS: &str = "default";
const FED: &str = "quickstart";
const KEY_FLAG: &str = "--auth-supernode-private-key";

#[path = "standalone_flower/crash.rs"]
mod crash;

/// Everything one run of the scenarios shares.
struct World {
    work: Option<tempfile::TempDir>,
    dir: PathBuf,
    venv: PathBuf,
    hub_bin: PathBuf,
    agent_bin: PathBuf,
    hub_dir: PathBuf,
    manifests: PathBuf,
    agents: [PathBuf; 2],
    hub_port: u16,
    grpc_port: u16,
    extra_port: u16,
    serverappio_port: u16,
    port_bases: [u16; 2],
    /// `--metrics-bind-address` ports of the hub and the two agents; each one's
    /// `--health-probe-bind-address` is the next port.
    ops_ports: [u16; 3],
    ports: SpacedPorts,
    /// Hub, agents, joins and hand-started SuperNodes, each in its own process group.
    procs: Processes,
    /// Environment of the hub process besides Flower's (scenario 10's submission pause).
    hub_env: Vec<(&'static str, String)>,
}

/// `program args…` with the environment every Flower-side process of this test gets.
fn command(program: &Path, args: &[String]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args);
    flower_env(&mut cmd);
    cmd
}

/// Whether `pid` is a live (non-zombie) process.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Pids of the SuperNodes started with `--auth-supernode-private-key key` (the SuperNode itself,
/// not the `flower-agent netns-bridge` that runs it in its own network namespace).
fn supernode_pids(key: &Path) -> Vec<u32> {
    let key = key.display().to_string();
    live_processes()
        .into_iter()
        .filter(|(_, a)| {
            a.windows(2).any(|w| w[0] == KEY_FLAG && w[1] == key)
                && !a.iter().any(|x| x == "netns-bridge")
        })
        .map(|(p, _)| p)
        .collect()
}

fn one_pid(pids: Vec<u32>, what: &str) -> Result<u32> {
    match pids.as_slice() {
        [p] => Ok(*p),
        _ => bail!("expected exactly one process for {what}, found {pids:?}"),
    }
}

fn status_of<'a>(status: &'a Value, federation: &str) -> Option<&'a Value> {
    status["federations"]
        .as_array()?
        .iter()
        .find(|f| f["name"] == federation)
}

fn tainted(cluster: &Value) -> bool {
    cluster["taints"]
        .as_array()
        .is_some_and(|t| t.iter().any(|k| k == "cluster.flower-addon.io/unreachable"))
}

fn cluster_of<'a>(status: &'a Value, name: &str) -> Option<&'a Value> {
    status["clusters"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

impl World {
    fn start() -> Result<Self> {
        let hub_bin = binary("flower-hub")?;
        let agent_bin = binary("flower-agent")?;
        let venv = flower_venv(FLOWER_VERSION)?;
        let work = tempfile::Builder::new()
            .prefix("flower-addon-standalone.")
            .tempdir()?;
        let dir = work.path().to_path_buf();
        // Agents use a range of ports from their base: keep every port 12 away from the others.
        let mut ports = SpacedPorts::new(12);
        let (hub_port, grpc_port, extra_port, serverappio_port) =
            (ports.take()?, ports.take()?, ports.take()?, ports.take()?);
        let port_bases = [ports.take_run(12)?, ports.take_run(12)?];
        // Metrics on the port, probes on the next one.
        let ops_ports = [ports.take_run(2)?, ports.take_run(2)?, ports.take_run(2)?];
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests)?;
        std::fs::create_dir_all(dir.join("flwr-home"))?;
        Ok(Self {
            work: Some(work),
            hub_dir: dir.join("hub"),
            agents: [dir.join("agent-1"), dir.join("agent-2")],
            manifests,
            dir,
            venv,
            hub_bin,
            agent_bin,
            hub_port,
            grpc_port,
            extra_port,
            serverappio_port,
            port_bases,
            ops_ports,
            ports,
            procs: Processes::default(),
            hub_env: Vec::new(),
        })
    }

    /// `--metrics-bind-address` and `--health-probe-bind-address` of the hub (0) or agent `i`.
    fn ops_args(&self, who: usize) -> [String; 4] {
        let port = self.ops_ports[who];
        [
            "--metrics-bind-address".into(),
            format!("127.0.0.1:{port}"),
            "--health-probe-bind-address".into(),
            format!("127.0.0.1:{}", port + 1),
        ]
    }

    /// Scrapes the hub's (0) or agent `i`'s `/metrics`.
    fn scrape(&self, who: usize) -> Result<Samples> {
        Samples::scrape(([127, 0, 0, 1], self.ops_ports[who]).into())
    }

    /// Waits until `/readyz` of the hub (0) or agent `i` answers 200.
    fn wait_probes(&self, who: usize) -> Result<()> {
        let addr = ([127, 0, 0, 1], self.ops_ports[who] + 1).into();
        Wait::new("/healthz and /readyz to pass", Duration::from_secs(30))
            .detail(|| format!("{:?}\n{}", e2e::scrape::get(addr, "/readyz"), self.logs()))
            .until_blocking(|| {
                let up = |path| e2e::scrape::get(addr, path).is_ok_and(|(code, _)| code == 200);
                Ok(up("/healthz") && up("/readyz"))
            })
            .map(|_| ())
    }

    /// Waits until the metric `name{labels}` of the hub (0) or agent `i` satisfies `ok`; returns
    /// its value.
    fn wait_metric(
        &self,
        who: usize,
        name: &str,
        labels: &[(&str, &str)],
        what: &str,
        ok: impl Fn(f64) -> bool,
    ) -> Result<f64> {
        let last = std::cell::Cell::new(None);
        Wait::new(what, Duration::from_secs(30))
            .detail(|| format!("{name}{labels:?} = {:?}", last.get()))
            .for_value_blocking(|| {
                let v = self.scrape(who)?.count(name, labels);
                last.set(Some(v));
                Ok(ok(v).then_some(v))
            })
    }

    /// Starts `program args…` as `name` in its own process group, logging to `<name>.log`.
    fn start_daemon(&mut self, name: &str, program: &Path, args: &[String]) -> Result<PathBuf> {
        let log = self.dir.join(format!("{name}.log"));
        self.procs.start_group(name, command(program, args), &log)?;
        Ok(log)
    }

    /// Waits up to `timeout` for process `name` to exit; ends its group if it does not.
    fn wait_exit(&mut self, name: &str, timeout: Duration) -> Result<ExitStatus> {
        let proc = self.procs.get_mut(name)?;
        let log = proc.log.clone();
        let status = Wait::new(format!("{name} to exit"), timeout)
            .detail(|| tail(&log, 20))
            .for_value_blocking(|| Ok(proc.exited()));
        if status.is_err() {
            self.procs.stop(name)?;
        }
        status
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for p in self.procs.all() {
            s += &format!(
                "--- {} ({}):\n{}\n",
                p.name,
                p.log.display(),
                tail(&p.log, 20)
            );
        }
        s += &format!(
            "--- status.json:\n{}\n",
            std::fs::read_to_string(self.hub_dir.join("status.json")).unwrap_or_default()
        );
        s
    }

    fn hub(&self, args: &[&str]) -> Result<std::process::Output> {
        let mut cmd = Command::new(&self.hub_bin);
        cmd.args(args)
            .arg("--state-dir")
            .arg(&self.hub_dir)
            .stdin(Stdio::null());
        flower_env(&mut cmd);
        let out = cmd.output()?;
        ensure!(
            out.status.success(),
            "flower-hub {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(out)
    }

    fn status(&self) -> Result<Value> {
        let text = std::fs::read_to_string(self.hub_dir.join("status.json"))?;
        Ok(serde_json::from_str(&text)?)
    }

    /// A Control API client of the quickstart SuperLink, trusting its CA as it is on disk now.
    fn control_client(&self) -> Result<flower_addon_hub::flower::control::ControlClient> {
        Ok(flower_addon_hub::flower::control::ControlClient::new(
            flower_addon_hub::flower::control::ControlEndpoint {
                dialect: flower_addon_crds::render::FlowerDialect::Unified,
                address: format!("127.0.0.1:{}", self.extra_port),
                server_name: "127.0.0.1".into(),
                ca_pem: Some(std::fs::read_to_string(self.hub_ca())?),
                tunnel: None,
            },
        )?)
    }

    fn hub_ca(&self) -> PathBuf {
        self.hub_dir
            .join("federations")
            .join(NS)
            .join(FED)
            .join("tls/ca.crt")
    }

    /// Whether SuperNode `pool-index` of agent `agent` activated with the SuperLink since its
    /// last start: its log shows Flower's `SuperNode ID:` after the runtime's start marker. (The
    /// SuperLink alone cannot tell: it lists a restarted SuperNode's key as online while it still
    /// holds its previous session.)
    fn activated(&self, agent: usize, pool: &str, index: u32) -> bool {
        let log = self.agents[agent]
            .join("logs")
            .join(NS)
            .join(format!("{FED}-{pool}-{index}.supernode.log"));
        std::fs::read_to_string(log).is_ok_and(|text| {
            text.rsplit("=== flower-agent: starting")
                .next()
                .is_some_and(|since| since.contains("SuperNode ID: "))
        })
    }

    /// The pids of edge-1's 3 site-a SuperNodes.
    fn site_a_pids(&self) -> Vec<u32> {
        (0..3)
            .flat_map(|i| supernode_pids(&self.key(0, "site-a", i)))
            .collect()
    }

    /// edge-1's 3 site-a SuperNodes' pids once none is one of `before` and each has activated
    /// since its start.
    fn site_a_restarted(&self, before: &[u32]) -> Option<Vec<u32>> {
        let now = self.site_a_pids();
        let fresh = now.len() == 3 && !now.iter().any(|p| before.contains(p));
        let activated = (0..3).all(|i| self.activated(0, "site-a", i));
        (fresh && activated).then_some(now)
    }

    fn key(&self, agent: usize, pool: &str, index: u32) -> PathBuf {
        self.agents[agent]
            .join("federations")
            .join(NS)
            .join(FED)
            .join("keys")
            .join(format!("{pool}-{index}.key"))
    }

    fn supernode_log(&self, agent: usize, pool: &str, index: u32) -> PathBuf {
        self.agents[agent]
            .join("logs")
            .join(NS)
            .join(format!("{FED}-{pool}-{index}.supernode.log"))
    }

    fn federation_yaml(&self, site_a_replicas: u32) -> Result<String> {
        let root = e2e::repo_root();
        let text = std::fs::read_to_string(root.join("examples/quickstart/federation.yaml"))?;
        let mut out = text.clone();
        for (from, to) in [
            ("grpc: 19092", format!("grpc: {}", self.grpc_port)),
            ("extra: 19093", format!("extra: {}", self.extra_port)),
            (
                "serverAppIO: 19091",
                format!("serverAppIO: {}", self.serverappio_port),
            ),
            (
                "- name: site-a\n        replicas: 2",
                format!("- name: site-a\n        replicas: {site_a_replicas}"),
            ),
            // Flower reads node config only at start: a value that depends on the size of the
            // federation ({partitions}) changes when it is scaled, and the agent then restarts
            // the SuperNodes it applies to, by design. A fixed partition count keeps the running
            // SuperNodes' arguments unchanged, which is what scenario 2 checks.
            (
                "num-partitions: \"{partitions}\"",
                "num-partitions: \"8\"".to_string(),
            ),
        ] {
            ensure!(
                out.contains(from),
                "examples/quickstart/federation.yaml: no `{from}`"
            );
            out = out.replace(from, &to);
        }
        Ok(out)
    }

    /// Waits until status.json shows the Federation ready with `n`/`n` SuperNodes.
    fn wait_ready(&self, n: u64, timeout: Duration) -> Result<Value> {
        Wait::new(format!("{FED} ready with {n}/{n} SuperNodes"), timeout)
            .detail(|| self.logs())
            .for_value_blocking(|| {
                let s = self.status()?;
                let f = status_of(&s, FED).ok_or_else(|| anyhow!("no {FED} in status"))?;
                Ok((f["ready"] == true
                    && f["readySupernodes"].as_u64() == Some(n)
                    && f["desiredSupernodes"].as_u64() == Some(n))
                .then(|| f.clone()))
            })
    }

    fn host_flwr(&self) -> e2e::flwr::HostFlwr {
        e2e::flwr::HostFlwr {
            venv: self.venv.clone(),
            home: self.dir.join("flwr-home"),
            cwd: self.dir.clone(),
            app_connections: false,
        }
    }

    /// `flwr run` of examples/fedavg (2 rounds, `min_nodes`), judged by `flwr ls` reaching
    /// `finished:completed`. Returns the run id.
    fn flwr_run(&self, min_nodes: u64) -> Result<String> {
        self.host_flwr()
            .run_to_completion(&self.dir.join("app"), FED, min_nodes, || self.logs())
    }

    /// Starts a `flower-supernode` by hand against the hub SuperLink and waits for it to exit.
    fn rogue_supernode(&mut self, name: &str, ca: &Path) -> Result<(ExitStatus, String, Duration)> {
        let dir = self.dir.join(name);
        std::fs::create_dir_all(dir.join("flwr-home"))?;
        let key = dir.join("node.key");
        flower_addon_agent::process_runtime::ensure_node_key(&key)
            .map_err(|e| anyhow!("ensure_node_key: {e}"))?;
        let port = self.ports.take()?;
        let args: Vec<String> = vec![
            "--superlink".into(),
            format!("127.0.0.1:{}", self.grpc_port),
            "--root-certificates".into(),
            ca.display().to_string(),
            KEY_FLAG.into(),
            key.display().to_string(),
            "--isolation".into(),
            "subprocess".into(),
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port.to_string(),
            "--node-config".into(),
            "partition-id=0 num-partitions=4".into(),
        ];
        let log = dir.join("supernode.log");
        let path = format!(
            "{}:{}",
            self.venv.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let t0 = Instant::now();
        let mut cmd = command(&self.venv.join("bin/flower-supernode"), &args);
        cmd.env("FLWR_HOME", dir.join("flwr-home"))
            .env("PATH", path);
        self.procs.start_group(name, cmd, &log)?;
        let status = self.wait_exit(name, Duration::from_secs(60))?;
        // Its superexec helper leaves by --parent-pid; do not wait for it.
        Ok((status, std::fs::read_to_string(&log)?, t0.elapsed()))
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Each process group: SIGTERM, then SIGKILL after a grace period.
        self.procs.stop_all();
        // Anything left that was started on our files (SuperLink, SuperNodes, helpers): by pid.
        let marker = self.dir.display().to_string();
        for (pid, args) in live_processes() {
            if args.iter().any(|a| a.contains(&marker)) {
                eprintln!(
                    "standalone_flower: killing leftover {pid}: {}",
                    args.join(" ")
                );
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
        // Kept after a failure, or when asked for (as the cluster tests do).
        let asked = std::env::var("FLOWER_ADDON_E2E_KEEP").is_ok_and(|v| v == "1");
        if (std::thread::panicking() || asked)
            && let Some(work) = self.work.take()
        {
            eprintln!("standalone_flower: keeping {}", work.keep().display());
        }
    }
}

// === scenarios ===

const FANOUT_COUNT: &str = "flower_addon_hub_work_fanout_seconds_count";
const SUPERNODES: &str = "flower_addon_hub_supernodes";
const SUPERVISED: &str = "flower_addon_agent_supervised_processes";
const CLUSTERS: &str = "flower_addon_hub_clusters";

/// After the quickstart: the hub counts 2 connected agents, 2 accepted joins (each first told to
/// wait), 2 available clusters and the Federation's 4 SuperNodes desired, ready and online; each
/// agent is connected, has applied work and supervises its 2 SuperNodes.
fn quickstart_metrics(w: &World) -> Result<()> {
    let fed = [("namespace", NS), ("federation", FED)];
    w.wait_metric(
        0,
        "flower_addon_hub_connected_agents",
        &[],
        "2 agents connected",
        |v| v == 2.0,
    )?;
    w.wait_metric(
        0,
        CLUSTERS,
        &[("available", "True")],
        "2 clusters available",
        |v| v == 2.0,
    )?;
    for state in ["desired", "ready", "online"] {
        let labels = [fed[0], fed[1], ("state", state)];
        w.wait_metric(
            0,
            SUPERNODES,
            &labels,
            &format!("4 SuperNodes {state}"),
            |v| v == 4.0,
        )?;
    }
    let hub = w.scrape(0)?;
    let accepted = hub.count("flower_addon_hub_joins_total", &[("result", "accepted")]);
    let pending = hub.count("flower_addon_hub_joins_total", &[("result", "pending")]);
    ensure!(
        accepted == 2.0 && pending >= 2.0,
        "joins: accepted {accepted}, pending {pending} (want 2 and >= 2)"
    );
    let reconciles = hub.count(
        "flower_addon_hub_reconciles_total",
        &[("controller", "federation")],
    );
    ensure!(reconciles > 0.0, "no Federation reconcile counted");
    ensure!(
        hub.count("process_resident_memory_bytes", &[]) > 0.0,
        "no resident memory reported"
    );
    for agent in 1..=2 {
        let m = w.scrape(agent)?;
        let connected = m.count("flower_addon_agent_hub_connected", &[]);
        let applied = m.count("flower_addon_agent_applies_total", &[("result", "ok")]);
        let supervised = m.count(SUPERVISED, &[("program", "flower-supernode")]);
        ensure!(
            connected == 1.0 && applied >= 1.0 && supervised == 2.0,
            "agent-{agent}: connected {connected}, applies {applied}, supervised SuperNodes {supervised} (want 1, >= 1, 2)"
        );
    }
    eprintln!(
        "  metrics: 2 agents connected, joins {accepted} accepted / {pending} pending, {reconciles} Federation reconciles, 4 SuperNodes desired/ready/online"
    );
    Ok(())
}

fn to_strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// `flower-hub serve --standalone` on the world's hub port, waited for until it wrote its
/// address.
fn start_hub(w: &mut World) -> Result<()> {
    let hub_bin = w.hub_bin.clone();
    let args = to_strings(&[
        "serve",
        "--standalone",
        "--state-dir",
        &w.hub_dir.display().to_string(),
        "--manifests",
        &w.manifests.display().to_string(),
        "--listen",
        &format!("127.0.0.1:{}", w.hub_port),
        "--advertise-address",
        "127.0.0.1",
        "--superlink-host",
        "127.0.0.1",
        "--flower-bin",
        &w.venv.join("bin").display().to_string(),
        "--lease-duration",
        "2s",
    ]);
    let args: Vec<String> = args.into_iter().chain(w.ops_args(0)).collect();
    let mut cmd = command(&hub_bin, &args);
    cmd.envs(w.hub_env.iter().map(|(k, v)| (k, v)));
    w.procs.start_group("hub", cmd, &w.dir.join("hub.log"))?;
    let hub_addr = w.hub_dir.join("hub-address");
    Wait::new("the hub to write hub-address", Duration::from_secs(20))
        .detail(|| w.logs())
        .until_blocking(|| Ok(hub_addr.is_file()))?;
    w.wait_probes(0)?;
    Ok(())
}

/// Both agents `flower-agent join` with one token, each labelled (site=a, site=b) and accepted
/// by the admin once it waits for acceptance; every join must succeed.
fn join_agents(w: &mut World) -> Result<()> {
    let token = json_of(
        &w.hub(&["token", "create", "--ttl", "1h", "--output", "json"])?
            .stdout,
    )?;
    let (tok, ca_hash) = (
        token["token"].as_str().context("token")?.to_owned(),
        token["caHash"].as_str().context("caHash")?.to_owned(),
    );
    let mut joins = Vec::new();
    for (i, site) in [(1, "a"), (2, "b")] {
        let args = to_strings(&[
            "join",
            "--hub",
            &format!("127.0.0.1:{}", w.hub_port),
            "--token",
            &tok,
            "--ca-hash",
            &ca_hash,
            "--cluster-name",
            &format!("edge-{i}"),
            // What the agent says about itself is a claim; the labels are the admin's (below).
            "--label",
            &format!("site={site}"),
            "--state-dir",
            &w.agents[i - 1].display().to_string(),
        ]);
        let agent_bin = w.agent_bin.clone();
        let name = format!("join-{i}");
        joins.push((name.clone(), w.start_daemon(&name, &agent_bin, &args)?));
    }
    for (i, (name, log)) in joins.iter().enumerate() {
        Wait::new("the join to wait for acceptance", Duration::from_secs(20))
            .detail(|| tail(log, 20))
            .until_blocking(|| {
                Ok(std::fs::read_to_string(log)
                    .unwrap_or_default()
                    .contains("waiting for the hub to accept"))
            })?;
        let site = if i == 0 { "site=a" } else { "site=b" };
        w.hub(&[
            "accept",
            &format!("edge-{}", i + 1),
            "--label",
            site,
            "--label",
            "demo=quickstart",
        ])?;
        let st = w
            .wait_exit(name, Duration::from_secs(30))
            .context("the join to finish")?;
        ensure!(
            st.success(),
            "join edge-{} failed: {}",
            i + 1,
            tail(log, 10)
        );
    }
    Ok(())
}

/// Both agents `flower-agent run` with the process runtime, each on its own port range.
fn start_agents(w: &mut World) -> Result<()> {
    for i in 0..2 {
        let agent_bin = w.agent_bin.clone();
        let args = to_strings(&[
            "run",
            "--state-dir",
            &w.agents[i].display().to_string(),
            "--runtime",
            "process",
            "--flower-bin",
            &w.venv.join("bin").display().to_string(),
            "--port-base",
            &w.port_bases[i].to_string(),
            "--status-interval",
            "1s",
        ]);
        let args: Vec<String> = args.into_iter().chain(w.ops_args(i + 1)).collect();
        w.start_daemon(&format!("agent-{}", i + 1), &agent_bin, &args)?;
    }
    for i in 1..=2 {
        w.wait_probes(i)?;
    }
    Ok(())
}

/// Hub + 2 agents + quickstart → 4/4 ready, and a real `flwr run` completes.
fn s1_quickstart(w: &mut World) -> Result<()> {
    start_hub(w)?;
    join_agents(w)?;
    start_agents(w)?;
    std::fs::write(w.manifests.join("federation.yaml"), w.federation_yaml(2)?)?;
    std::fs::copy(
        e2e::repo_root().join("examples/quickstart/placement.yaml"),
        w.manifests.join("placement.yaml"),
    )?;
    let t = Instant::now();
    let f = w.wait_ready(4, Duration::from_secs(180))?;
    eprintln!(
        "  4/4 SuperNodes ready after {:.1}s: pools {}",
        t.elapsed().as_secs_f64(),
        f["pools"]
    );
    let expected: BTreeMap<String, String> = [("edge-1/site-a", "2/2"), ("edge-2/site-b", "2/2")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let pools: BTreeMap<String, String> = serde_json::from_value(f["pools"].clone())?;
    ensure!(pools == expected, "pools {pools:?} != {expected:?}");
    quickstart_metrics(w)?;

    // flwr's connection as `flower-hub connect` writes it: the Control address from the
    // hub's status and the SuperLink's CA in a file; the runs below prove flwr accepts it.
    let flwr_home = w.dir.join("flwr-home");
    let ca_file = w.dir.join("quickstart-ca.crt");
    let flwr_home_s = flwr_home.display().to_string();
    let ca_file_s = ca_file.display().to_string();
    let out = w.hub(&[
        "connect",
        FED,
        "--flwr-home",
        &flwr_home_s,
        "--ca-file",
        &ca_file_s,
    ])?;
    let printed = String::from_utf8_lossy(&out.stdout);
    ensure!(
        printed.contains(&format!("FLWR_HOME={flwr_home_s}")),
        "flower-hub connect printed: {printed}"
    );
    let config: toml::Table =
        toml::from_str(&std::fs::read_to_string(flwr_home.join("config.toml"))?)?;
    ensure!(
        config["superlink"]["default"].as_str() == Some(FED)
            && config["superlink"][FED]["address"].as_str()
                == Some(format!("127.0.0.1:{}", w.extra_port).as_str()),
        "config.toml: {config}"
    );
    ensure!(
        std::fs::read(&ca_file)? == std::fs::read(w.hub_ca())?,
        "connect wrote another CA than the SuperLink's"
    );
    let status = Command::new("cp")
        .arg("-r")
        .arg(e2e::repo_root().join("examples/fedavg"))
        .arg(w.dir.join("app"))
        .status()?;
    ensure!(status.success(), "cp examples/fedavg");
    let _ = std::fs::remove_dir_all(w.dir.join("app/.flwr"));
    let t = Instant::now();
    let run = w.flwr_run(4)?;
    eprintln!(
        "  run {run} finished:completed in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// site-a replicas 2 → 3: a third SuperNode connects, the two others keep their pids.
fn s2_scale_up(w: &mut World) -> Result<()> {
    let fanouts = w.scrape(0)?.count(FANOUT_COUNT, &[]);
    let before: Vec<u32> = (0..2)
        .map(|i| {
            one_pid(
                supernode_pids(&w.key(0, "site-a", i)),
                &format!("site-a-{i}"),
            )
        })
        .collect::<Result<_>>()?;
    std::fs::write(w.manifests.join("federation.yaml"), w.federation_yaml(3)?)?;
    let f = w.wait_ready(5, Duration::from_secs(90))?;
    ensure!(
        f["pools"]["edge-1/site-a"] == "3/3",
        "pools after scale-up: {}",
        f["pools"]
    );
    let third = one_pid(supernode_pids(&w.key(0, "site-a", 2)), "site-a-2")?;
    let log = std::fs::read_to_string(w.supernode_log(0, "site-a", 2))?;
    ensure!(
        log.contains("SuperNode ID: "),
        "site-a-2 never connected:\n{log}"
    );
    let after: Vec<u32> = (0..2)
        .map(|i| {
            one_pid(
                supernode_pids(&w.key(0, "site-a", i)),
                &format!("site-a-{i}"),
            )
        })
        .collect::<Result<_>>()?;
    ensure!(
        before == after,
        "site-a-0/1 were restarted: pids {before:?} -> {after:?}\n--- site-a-0 log:\n{}",
        tail(&w.supernode_log(0, "site-a", 0), 15)
    );
    eprintln!("  site-a-2 pid {third} connected; site-a-0/1 kept pids {after:?}");
    // The change reached edge-1 and was acked: one more fan-out; the gauges follow the spec.
    w.wait_metric(0, FANOUT_COUNT, &[], "a fan-out recorded", |v| v > fanouts)?;
    w.wait_metric(
        0,
        SUPERNODES,
        &[("federation", FED), ("state", "desired")],
        "5 desired",
        |v| v == 5.0,
    )?;
    w.wait_metric(
        1,
        SUPERVISED,
        &[("program", "flower-supernode")],
        "3 SuperNodes on edge-1",
        |v| v == 3.0,
    )?;
    eprintln!("  metrics: one more fan-out, 5 desired SuperNodes, 3 supervised on edge-1");
    Ok(())
}

/// The last `SuperNode ID: <id>` a SuperNode log shows from byte `from` on.
fn node_id_in(log: &Path, from: u64) -> Option<u64> {
    let text = std::fs::read(log).ok()?;
    let text = String::from_utf8_lossy(text.get(from as usize..)?).into_owned();
    text.lines()
        .rev()
        .find_map(|l| l.split("SuperNode ID: ").nth(1)?.trim().parse().ok())
}

/// site-a-0's SuperNode SIGKILLed (no goodbye to the SuperLink, as in a crash or a power cut)
/// and started again at once by its agent, while Flower still holds its session
/// for up to 60 s and refuses the new one. Expected: the Fleet front answers that refusal 503
/// (logged), so the new SuperNode retries instead of exiting: it is restarted exactly once,
/// comes back as the same node id, serving (a fresh heartbeat, not the old session), and a run
/// that needs every SuperNode completes.
fn s2b_supernode_killed_without_goodbye(w: &mut World) -> Result<()> {
    let key = w.key(0, "site-a", 0);
    let log = w.supernode_log(0, "site-a", 0);
    let old = one_pid(supernode_pids(&key), "site-a-0")?;
    let id = node_id_in(&log, 0).context("site-a-0 logged no node id")?;
    let from = std::fs::metadata(&log)?.len();
    let hub_log = w.dir.join("hub.log");
    let hub_from = std::fs::metadata(&hub_log)?.len();
    let restarts = |w: &World| -> Result<f64> {
        Ok(w.scrape(1)?.count(
            "flower_addon_agent_process_restarts_total",
            &[("program", "flower-supernode")],
        ))
    };
    let restarts_before = restarts(w)?;
    // The SuperNode alone, as the kernel's OOM killer would: its guard ends what it started
    // and the agent starts it again.
    kill(Pid::from_raw(old as i32), Signal::SIGKILL)?;
    let t = Instant::now();
    let client = w.control_client()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let new = Wait::new(
        format!("site-a-0 (node {id}) restarted and serving again as itself"),
        Duration::from_secs(150),
    )
    .detail(|| format!("{}\n--- site-a-0:\n{}", w.logs(), tail(&log, 30)))
    .for_value_blocking(|| {
        let pid = match supernode_pids(&key).as_slice() {
            [p] if *p != old => *p,
            _ => return Ok(None),
        };
        let serving = rt
            .block_on(client.list_nodes())
            .is_ok_and(|nodes| nodes.iter().any(|n| n.node_id == id && n.serving()));
        Ok((node_id_in(&log, from) == Some(id) && serving).then_some(pid))
    })?;
    let back = t.elapsed();
    let since = String::from_utf8_lossy(&std::fs::read(&log)?[from as usize..]).into_owned();
    ensure!(
        !since.contains("Failed to activate"),
        "the restarted site-a-0 was refused and exited:\n{since}"
    );
    ensure!(
        supernode_pids(&key) == [new],
        "site-a-0 restarted more than once: {:?}",
        supernode_pids(&key)
    );
    let restarted = restarts(w)? - restarts_before;
    ensure!(
        restarted == 1.0,
        "edge-1 restarted flower-supernode {restarted} times after one kill"
    );
    let hub_text =
        String::from_utf8_lossy(&std::fs::read(&hub_log)?[hub_from as usize..]).into_owned();
    ensure!(
        hub_text.contains("still holds its last session"),
        "the front did not hold the restarted SuperNode off (was its old session already gone?):\n{}",
        tail(&hub_log, 20)
    );
    let n = status_of(&w.status()?, FED)
        .and_then(|f| f["desiredSupernodes"].as_u64())
        .context("desiredSupernodes")?;
    w.wait_ready(n, Duration::from_secs(90))?;
    let run = w.flwr_run(n)?;
    eprintln!(
        "  site-a-0 (node {id}) killed without a goodbye: restarted once (pid {old} -> {new}), held off by the front until Flower let its old session go, serving again as node {id} after {:.1}s; run {run} with min-nodes={n} completed",
        back.as_secs_f64()
    );
    Ok(())
}

/// A SuperNode whose key the hub never registered is refused by the SuperLink.
fn s3_unregistered_key(w: &mut World) -> Result<()> {
    let ca = w.hub_ca();
    let (status, log, took) = w.rogue_supernode("unregistered", &ca)?;
    ensure!(
        !status.success(),
        "unregistered SuperNode exited {status}:\n{log}"
    );
    ensure!(
        log.contains("Failed to activate SuperNode") || log.contains("No SuperNode found"),
        "unregistered SuperNode exited {status} for another reason:\n{log}"
    );
    eprintln!("  refused: {status} after {:.1}s", took.as_secs_f64());
    Ok(())
}

/// A SuperNode trusting another CA does not talk to the hub SuperLink.
fn s4_wrong_ca(w: &mut World) -> Result<()> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "not the hub CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let cert = params.self_signed(&key)?;
    let ca = w.dir.join("other-ca.crt");
    std::fs::write(&ca, cert.pem())?;
    let (status, log, took) = w.rogue_supernode("wrong-ca", &ca)?;
    ensure!(
        !status.success(),
        "wrong-CA SuperNode exited {status}:\n{log}"
    );
    ensure!(
        log.contains("CERTIFICATE_VERIFY_FAILED"),
        "wrong-CA SuperNode exited {status} for another reason:\n{log}"
    );
    eprintln!("  refused: {status} after {:.1}s", took.as_secs_f64());
    Ok(())
}

/// SIGKILLed SuperLink → the hub restarts it, SuperNodes reconnect, a new run completes.
fn s5_superlink_killed(w: &mut World) -> Result<()> {
    let db = format!(
        "--database={}",
        w.hub_dir
            .join("federations")
            .join(NS)
            .join(FED)
            .join("superlink.db")
            .display()
    );
    // The SuperLink process itself, not the `flower-hub netns-bridge` that runs it in its own
    // network namespace (its command line carries the SuperLink's).
    let find = || -> Vec<u32> {
        live_processes()
            .into_iter()
            .filter(|(_, a)| a.contains(&db) && !a.iter().any(|x| x == "netns-bridge"))
            .map(|(p, _)| p)
            .collect()
    };
    let old = one_pid(find(), "the SuperLink")?;
    kill(Pid::from_raw(old as i32), Signal::SIGKILL)?;
    let t = Instant::now();
    let new = Wait::new("the hub to restart the SuperLink", Duration::from_secs(60))
        .detail(|| w.logs())
        .for_value_blocking(|| {
            let p = find();
            Ok(match p.as_slice() {
                [p] if *p != old => Some(*p),
                _ => None,
            })
        })?;
    eprintln!(
        "  SuperLink {old} killed; restarted as {new} after {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let restarts = w.wait_metric(
        0,
        "flower_addon_hub_superlink_restarts",
        &[("federation", FED)],
        "the SuperLink restart counted",
        |v| v >= 1.0,
    )?;
    eprintln!("  metrics: flower_addon_hub_superlink_restarts = {restarts}");
    let n = status_of(&w.status()?, FED)
        .and_then(|f| f["desiredSupernodes"].as_u64())
        .context("desiredSupernodes")?;
    w.wait_ready(n, Duration::from_secs(90))?;
    // min-nodes = every SuperNode: the run proves each one reconnected to the new SuperLink.
    let t = Instant::now();
    let run = w.flwr_run(n)?;
    eprintln!(
        "  run {run} with min-nodes={n} finished:completed in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// SIGKILLed agent → its SuperNodes die, the hub marks the cluster unreachable after the lease,
/// and the Federation is no longer ready.
fn s6_agent_killed(w: &mut World) -> Result<()> {
    let pids: Vec<u32> = (0..2)
        .map(|i| {
            one_pid(
                supernode_pids(&w.key(1, "site-b", i)),
                &format!("site-b-{i}"),
            )
        })
        .collect::<Result<_>>()?;
    let s = w.status()?;
    let c = cluster_of(&s, "edge-2").context("edge-2 in status")?;
    ensure!(
        c["available"] == "True" && !tainted(c),
        "edge-2 not healthy before the kill: {c}"
    );
    let of_edge2 = |w: &World| e2e::harness::processes_of(&w.agents[1]);
    ensure!(
        !of_edge2(w).is_empty(),
        "no process of edge-2's state directory before the kill"
    );
    // SIGKILL to the agent alone (not its group): the guard of each program it supervised
    // (`flower-agent guard`) ends that program and everything it started, within 5 s.
    w.procs.get_mut("agent-2")?.signal(Signal::SIGKILL)?;
    w.wait_exit("agent-2", Duration::from_secs(30))?;
    let t = Instant::now();
    Wait::new(
        "every process of edge-2's state directory gone within 5 s of its agent's SIGKILL",
        Duration::from_secs(5),
    )
    .detail(|| format!("still alive: {:?}", of_edge2(w)))
    .until_blocking(|| Ok(of_edge2(w).is_empty() && pids.iter().all(|p| !alive(*p))))?;
    eprintln!(
        "  SuperNodes {pids:?} and every other process of edge-2's state directory gone {:.1}s after the agent",
        t.elapsed().as_secs_f64()
    );
    let t_lease = Wait::new(
        "the hub to mark edge-2 not Available",
        Duration::from_secs(20),
    )
    .detail(|| w.logs())
    .for_value_blocking(|| {
        let s = w.status()?;
        let c = cluster_of(&s, "edge-2").context("edge-2 in status")?;
        Ok((c["available"] != "True").then(|| t.elapsed()))
    })?;
    let c = Wait::new(
        "the hub to taint edge-2 unreachable",
        Duration::from_secs(40),
    )
    .detail(|| w.logs())
    .for_value_blocking(|| {
        let s = w.status()?;
        let c = cluster_of(&s, "edge-2").context("edge-2 in status")?;
        Ok(tainted(c).then(|| c.clone()))
    })?;
    eprintln!(
        "  edge-2 not Available after {:.1}s, tainted unreachable after {:.1}s: {c}",
        t_lease.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    w.wait_metric(
        0,
        "flower_addon_hub_connected_agents",
        &[],
        "1 agent connected",
        |v| v == 1.0,
    )?;
    w.wait_metric(
        0,
        CLUSTERS,
        &[("available", "Unknown")],
        "edge-2 counted Unknown",
        |v| v == 1.0,
    )?;
    w.wait_metric(
        0,
        CLUSTERS,
        &[("available", "True")],
        "edge-1 counted True",
        |v| v == 1.0,
    )?;
    eprintln!("  metrics: 1 agent connected; clusters True 1, Unknown 1");
    // Let edge-1 settle (all its SuperNodes connected again), then the Federation, whose pool
    // site-b has no live cluster left, must still not be ready.
    let f = Wait::new(
        "edge-1's pools to be fully connected",
        Duration::from_secs(60),
    )
    .detail(|| w.logs())
    .for_value_blocking(|| {
        let s = w.status()?;
        let f = status_of(&s, FED).context("federation")?;
        let pools = f["pools"].as_object().context("pools")?;
        let edge1_ok = pools
            .iter()
            .filter(|(k, _)| k.starts_with("edge-1/"))
            .all(|(_, v)| {
                v.as_str()
                    .and_then(|v| v.split_once('/'))
                    .is_some_and(|(a, b)| a == b)
            });
        Ok(edge1_ok.then(|| f.clone()))
    })?;
    ensure!(
        f["ready"] == false,
        "{FED} reports ready without edge-2 (pool site-b has no live cluster): {f}"
    );
    eprintln!("  {FED} not ready: {}", f["message"]);
    Ok(())
}

/// On real Flower: revoking a cluster unregisters its SuperNodes' keys
/// from the SuperLink (read back through the hub's own Control API client) and its SuperNodes
/// stop.
fn s7_revoked_cluster_keys_leave_the_superlink(w: &mut World) -> Result<()> {
    use flower_addon_hub::flower::control::{ControlClient, ControlEndpoint};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = ControlClient::new(ControlEndpoint {
        dialect: flower_addon_crds::render::FlowerDialect::Unified,
        address: format!("127.0.0.1:{}", w.extra_port),
        server_name: "127.0.0.1".into(),
        ca_pem: Some(std::fs::read_to_string(w.hub_ca())?),
        tunnel: None,
    })?;
    // The Fleet port SuperNodes dial (the hub's Fleet front) serves no Control API.
    let through_fleet = ControlClient::new(ControlEndpoint {
        address: format!("127.0.0.1:{}", w.grpc_port),
        ..client.endpoint().clone()
    })?;
    let refused = rt.block_on(through_fleet.list_nodes());
    ensure!(
        matches!(&refused, Err(e) if e.to_string().contains("Fleet API")),
        "ListNodes at the Fleet port {}: {refused:?}",
        w.grpc_port
    );
    let edge1: Vec<Vec<u8>> = (0..3)
        .map(|i| {
            let line = std::fs::read_to_string(w.key(0, "site-a", i).with_extension("key.pub"))?;
            Ok(flower_addon_hub::flower::keys::openssh_to_spki_der(&line)?)
        })
        .collect::<Result<_>>()?;
    let held = |client: &ControlClient| -> Result<usize> {
        let nodes = rt.block_on(client.list_nodes())?;
        Ok(nodes
            .iter()
            .filter(|n| n.status != "unregistered")
            .filter(|n| n.public_key_der.as_ref().is_some_and(|d| edge1.contains(d)))
            .count())
    };
    ensure!(
        held(&client)? == 3,
        "edge-1's 3 keys are not all registered before the revoke"
    );
    let pids: Vec<u32> = (0..3)
        .flat_map(|i| supernode_pids(&w.key(0, "site-a", i)))
        .collect();
    ensure!(
        pids.len() == 3,
        "edge-1 SuperNodes before the revoke: {pids:?}"
    );
    w.hub(&["revoke", "edge-1"])?;
    let t = Instant::now();
    Wait::new(
        "edge-1's keys to leave the SuperLink",
        Duration::from_secs(30),
    )
    .detail(|| w.logs())
    .until_blocking(|| Ok(held(&client)? == 0))?;
    let unregistered = t.elapsed();
    Wait::new("edge-1's SuperNodes to stop", Duration::from_secs(30))
        .detail(|| {
            format!(
                "alive: {:?}",
                pids.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
            )
        })
        .until_blocking(|| Ok(pids.iter().all(|p| !alive(*p))))?;
    eprintln!(
        "  edge-1 revoked: its 3 keys unregistered after {:.1}s, its SuperNodes gone after {:.1}s",
        unregistered.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    // Accepted again, edge-1 runs its SuperNodes again. Flower never registers an unregistered
    // key a second time, so the hub marks the old keys retired and the agent makes new ones.
    let old_keys: Vec<String> = (0..3)
        .map(|i| std::fs::read_to_string(w.key(0, "site-a", i)))
        .collect::<std::io::Result<_>>()?;
    w.hub(&["accept", "edge-1"])?;
    let t = Instant::now();
    let online_with_new_keys = || -> Result<bool> {
        let mut new_keys = Vec::new();
        for (i, old) in old_keys.iter().enumerate() {
            let path = w.key(0, "site-a", i as u32);
            match std::fs::read_to_string(&path) {
                Ok(now) if now != *old => {
                    let line = std::fs::read_to_string(path.with_extension("key.pub"))?;
                    new_keys.push(flower_addon_hub::flower::keys::openssh_to_spki_der(&line)?);
                }
                _ => return Ok(false),
            }
        }
        let nodes = rt.block_on(client.list_nodes())?;
        Ok(new_keys.iter().all(|k| {
            nodes
                .iter()
                .any(|n| n.serving() && n.public_key_der.as_ref() == Some(k))
        }))
    };
    Wait::new(
        "edge-1's SuperNodes online again with new keys",
        Duration::from_secs(120),
    )
    .detail(|| w.logs())
    .until_blocking(online_with_new_keys)?;
    eprintln!(
        "  edge-1 accepted again: its retired keys replaced, 3 SuperNodes online with new keys after {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The Federation's restart mark (`flower-addon.io/supernode-restart`) set in its manifest:
/// edge-1's 3 SuperNodes are started again (new pids) and activated with their own keys: the
/// same node ids are online at the SuperLink afterwards.
fn s9_restart_mark(w: &mut World) -> Result<()> {
    let t = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let online_ids = |w: &World| -> Result<std::collections::BTreeSet<u64>> {
        let client = w.control_client()?;
        Ok(rt
            .block_on(client.list_nodes())?
            .iter()
            .filter(|n| n.serving())
            .map(|n| n.node_id)
            .collect())
    };
    let before = w.site_a_pids();
    ensure!(before.len() == 3, "edge-1's SuperNodes: {before:?}");
    let ids_before = online_ids(w)?;
    // edge-1's 3 (the other agent was killed in scenario 6).
    ensure!(
        ids_before.len() >= 3,
        "edge-1's 3 SuperNodes online before: {ids_before:?}"
    );
    let marked = |mark: &str| -> Result<String> {
        Ok(w.federation_yaml(3)?.replacen(
            "metadata:\n  name: quickstart\n",
            &format!(
                "metadata:\n  name: quickstart\n  annotations: {{flower-addon.io/supernode-restart: \"{mark}\"}}\n"
            ),
            1,
        ))
    };
    let yaml = marked("2026-12-06T06:00:00Z")?;
    ensure!(
        yaml.contains("supernode-restart"),
        "the quickstart manifest's metadata moved: {yaml}"
    );
    std::fs::write(w.manifests.join("federation.yaml"), yaml)?;
    let after = Wait::new(
        "edge-1's 3 SuperNodes restarted, activated, and the same node ids online",
        Duration::from_secs(180),
    )
    .detail(|| w.logs())
    .for_value_blocking(|| {
        let restarted = w.site_a_restarted(&before);
        Ok(restarted.filter(|_| online_ids(w).is_ok_and(|ids| ids == ids_before)))
    })?;
    eprintln!(
        "  restart mark set: edge-1's SuperNodes restarted (pids {before:?} -> {after:?}) and the same node ids online after {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// On real Flower: the Flower CA rotated in three steps, the hub restarted after
/// each (`flower-hub ca rotate` says so). Staged, both CAs are trusted and edge-1's SuperNodes
/// restart on the new bundle; promoted, the SuperLink serves a certificate of the new CA and
/// the SuperNodes, trusting both, come back online and a run completes; retired, only the new
/// CA is left and the SuperNodes restart on it. A client trusting only the old CA is refused.
fn s8_flower_ca_rotation(w: &mut World) -> Result<()> {
    use flower_addon_hub::flower::control::{ControlClient, ControlEndpoint};
    // A runtime that keeps running between `block_on`s: the Control clients' pooled keep-alive
    // connections must answer the SuperLink's TLS close when the hub restarts it, as a live
    // client's would. Unpolled (a current-thread runtime), they kept each stopping SuperLink
    // "waiting for connections to close" until the hub SIGKILLed it 5 s later.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    fn control(w: &World, ca_pem: String) -> Result<ControlClient> {
        Ok(ControlClient::new(ControlEndpoint {
            dialect: flower_addon_crds::render::FlowerDialect::Unified,
            address: format!("127.0.0.1:{}", w.extra_port),
            server_name: "127.0.0.1".into(),
            ca_pem: Some(ca_pem),
            tunnel: None,
        })?)
    }
    fn bundle(w: &World) -> Result<Vec<String>> {
        let pem = std::fs::read_to_string(w.hub_ca())?;
        Ok(pem
            .split_inclusive("-----END CERTIFICATE-----")
            .map(str::trim)
            .filter(|c| c.starts_with("-----BEGIN"))
            .map(|c| format!("{c}\n"))
            .collect())
    }
    fn online(rt: &tokio::runtime::Runtime, client: &ControlClient) -> usize {
        rt.block_on(client.list_nodes())
            .map(|nodes| nodes.iter().filter(|n| n.serving()).count())
            .unwrap_or(0)
    }
    // Three SuperNodes, none of them `before`, each activated since its restart and online at
    // the SuperLink (asked trusting `ca`).
    let online_again = |w: &World, what: &str, before: &[u32], ca: String| -> Result<Vec<u32>> {
        let client = control(w, ca)?;
        Wait::new(
            format!("{what}: edge-1's 3 SuperNodes restarted, activated and online"),
            Duration::from_secs(120),
        )
        .detail(|| w.logs())
        .for_value_blocking(|| {
            let restarted = w.site_a_restarted(before);
            Ok(restarted.filter(|_| online(&rt, &client) == 3))
        })
    };
    let restart_hub = |w: &mut World| -> Result<()> {
        w.procs.stop("hub")?;
        start_hub(w)
    };
    let old = bundle(w)?;
    ensure!(old.len() == 1, "one CA before the rotation: {old:?}");
    let before = w.site_a_pids();
    ensure!(before.len() == 3, "edge-1's SuperNodes: {before:?}");

    let t = Instant::now();
    let out = w.hub(&["ca", "rotate", "stage"])?;
    ensure!(
        String::from_utf8_lossy(&out.stdout).contains("restart `flower-hub serve`"),
        "stage did not say to restart the hub: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    restart_hub(w)?;
    let staged = Wait::new(
        "the staged bundle in the SuperLink's CA file",
        Duration::from_secs(30),
    )
    .detail(|| w.logs())
    .for_value_blocking(|| Ok(bundle(w).ok().filter(|b| b.len() == 2)))?;
    ensure!(
        staged[0] == old[0],
        "staged: the old CA still signs first: {staged:?}"
    );
    let next = staged[1].clone();
    let after_stage = online_again(w, "staged", &before, staged.concat())?;
    eprintln!(
        "  staged: both CAs trusted, SuperNodes restarted and online after {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    w.hub(&["ca", "rotate", "promote"])?;
    restart_hub(w)?;
    Wait::new(
        "the promoted bundle (new CA first)",
        Duration::from_secs(30),
    )
    .detail(|| w.logs())
    .until_blocking(|| Ok(bundle(w).is_ok_and(|b| b == [next.clone(), old[0].clone()])))?;
    // The SuperLink now serves a certificate of the new CA: a client trusting only it works,
    // one trusting only the old CA is refused at the handshake.
    let only_new = control(w, next.clone())?;
    Wait::new(
        "the SuperLink on a certificate of the new CA",
        Duration::from_secs(60),
    )
    .detail(|| w.logs())
    .until_blocking(|| Ok(rt.block_on(only_new.list_nodes()).is_ok()))?;
    let refused = rt.block_on(control(w, old[0].clone())?.list_nodes());
    ensure!(
        refused.is_err(),
        "a client trusting only the old CA was served: {refused:?}"
    );
    // The SuperNodes kept running (the bundle did not change) and reconnected.
    let client = control(w, next.clone())?;
    Wait::new(
        "edge-1's 3 SuperNodes online on the new certificate",
        Duration::from_secs(120),
    )
    .detail(|| w.logs())
    .until_blocking(|| {
        Ok(rt
            .block_on(client.list_nodes())
            .is_ok_and(|nodes| nodes.iter().filter(|n| n.serving()).count() == 3))
    })?;
    // flwr users take the new CA file from `flower-hub connect`.
    let flwr_home = w.dir.join("flwr-home").display().to_string();
    let ca_file = w.dir.join("quickstart-ca.crt").display().to_string();
    w.hub(&[
        "connect",
        FED,
        "--flwr-home",
        &flwr_home,
        "--ca-file",
        &ca_file,
    ])?;
    let run = w.flwr_run(3)?;
    // The SuperNodes trust the same two CAs (the new one now first): none restarted.
    ensure!(
        w.site_a_pids() == after_stage,
        "promote restarted SuperNodes whose CAs did not change"
    );
    eprintln!(
        "  promoted: new CA signs, SuperNodes online and run {run} completed after {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    w.hub(&["ca", "rotate", "retire"])?;
    restart_hub(w)?;
    Wait::new(
        "the retired bundle (the new CA only)",
        Duration::from_secs(30),
    )
    .detail(|| w.logs())
    .until_blocking(|| Ok(bundle(w).is_ok_and(|b| b == [next.clone()])))?;
    online_again(w, "retired", &after_stage, next.clone())?;
    let out = w.hub(&["ca", "status"])?;
    let status = String::from_utf8_lossy(&out.stdout);
    ensure!(
        status.contains("rotation:   idle"),
        "ca status after retire: {status}"
    );
    eprintln!(
        "  retired: the old CA left every bundle, SuperNodes restarted on the new one and online after {:.1}s",
        t.elapsed().as_secs_f64()
    );

    // The SuperLink's key garbled on disk (the certificate, SANs marker and CA untouched): the
    // restarted hub issues a new pair instead of starting a SuperLink that cannot load it, and
    // the SuperNodes (same CA) come back online.
    let t = Instant::now();
    let key = w.hub_ca().with_file_name("tls.key");
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n",
    )?;
    let cert_before = std::fs::read(w.hub_ca().with_file_name("tls.crt"))?;
    restart_hub(w)?;
    let client = control(w, next.clone())?;
    Wait::new(
        "a new SuperLink pair and edge-1's 3 SuperNodes online",
        Duration::from_secs(120),
    )
    .detail(|| w.logs())
    .until_blocking(|| {
        let cert = std::fs::read(w.hub_ca().with_file_name("tls.crt"))?;
        let key = std::fs::read(&key)?;
        Ok(cert != cert_before
            && flower_addon_hub::core::renewal::pair_is_usable(&cert, &key)
            && online(&rt, &client) == 3)
    })?;
    eprintln!(
        "  garbled SuperLink key: issued again, SuperNodes online after {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

type Scenario = fn(&mut World) -> Result<()>;

#[test]
fn standalone_hub_agents_and_real_flower() {
    // Invariant: with the real binaries and real Flower, the quickstart federation runs, scales
    // without restarts, refuses unknown keys and foreign CAs, survives a SuperLink crash, and
    // notices a dead agent.
    e2e::install_crypto();
    let t0 = Instant::now();
    let mut w = World::start().expect("setup");
    eprintln!(
        "standalone_flower: work dir {} (venv {})",
        w.dir.display(),
        w.venv.display()
    );
    const SCENARIOS: usize = 11;
    let scenarios: [(&str, Scenario, bool); SCENARIOS] = [
        (
            "1 quickstart: 4/4 ready, flwr run completes",
            s1_quickstart,
            true,
        ),
        ("2 site-a 2 -> 3 without restarts", s2_scale_up, false),
        (
            "2b a SuperNode killed without a goodbye comes back as itself, without a crash loop",
            s2b_supernode_killed_without_goodbye,
            false,
        ),
        ("3 unregistered key refused", s3_unregistered_key, false),
        ("4 wrong CA refused", s4_wrong_ca, false),
        (
            "5 SuperLink killed, restarted, run completes",
            s5_superlink_killed,
            false,
        ),
        (
            "6 agent killed: SuperNodes gone, cluster unavailable",
            s6_agent_killed,
            false,
        ),
        (
            "7 revoked cluster: keys unregistered, SuperNodes stop; accepted again: new keys",
            s7_revoked_cluster_keys_leave_the_superlink,
            false,
        ),
        (
            "8 Flower CA rotated: staged, promoted, retired; SuperNodes and runs follow; a garbled SuperLink key issued again",
            s8_flower_ca_rotation,
            false,
        ),
        (
            "9 restart mark: every SuperNode restarted as itself",
            s9_restart_mark,
            false,
        ),
        (
            "10 hub SIGKILLed around FlowerRun submissions: none sent twice, none lost",
            crash::s10_hub_killed_around_submissions,
            false,
        ),
    ];
    let mut results = Vec::new();
    for (name, run, fatal) in scenarios {
        eprintln!("==> [{:6.1}s] scenario {name}", t0.elapsed().as_secs_f64());
        let t = Instant::now();
        let r = run(&mut w);
        let took = t.elapsed().as_secs_f64();
        match &r {
            Ok(()) => eprintln!("<== scenario {name}: PASS in {took:.1}s"),
            Err(e) => eprintln!("<== scenario {name}: FAIL in {took:.1}s: {e:#}"),
        }
        let failed = r.is_err();
        results.push((name, r, took));
        if failed && fatal {
            break;
        }
    }
    eprintln!(
        "standalone_flower: total {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    let failures: Vec<String> = results
        .iter()
        .filter_map(|(n, r, _)| r.as_ref().err().map(|e| format!("{n}: {e:#}")))
        .collect();
    assert!(
        failures.is_empty() && results.len() == SCENARIOS,
        "failed scenarios:\n{}",
        failures.join("\n\n")
    );
}

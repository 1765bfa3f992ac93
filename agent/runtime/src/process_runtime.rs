//! The process runtime: SuperNodes as supervised local processes, for edge devices without a
//! cluster and for the local demo.
//!
//! One `flower-supernode` per replica (and one `flower-superexec` beside it in process
//! isolation), with arguments from the same renderer as Kubernetes ([`crate::render`]), every
//! placeholder expanded natively. Each replica has its own Runtime API port on 127.0.0.1, its own
//! log file and, with TLS on, its own OpenSSH EC P-384 key for Flower's SuperNode authentication;
//! the public keys are reported to the hub, which registers them with the SuperLink.
//!
//! A replica is ready when its process runs and its log, since the last start, shows Flower's
//! `SuperNode ID: <n>` line (the SuperNode is connected to the SuperLink).
/// Kept here for callers of the process runtime's key files; made in [`crate::node_key`].
pub use crate::node_key::ensure_node_key;

use crate::render::{self, ClusterContext, FlowerDialect, SuperNodePoolInput};
use crate::runtime::{BoxFuture, Runtime, RuntimeError};
use crate::supervise::{ProcessSpec, Supervised};
use flower_addon_crds::{FederationSpec, SuperNodePoolSpec};
use flower_addon_proto::{ClusterWork, FederationStatus, PoolStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use tokio::sync::Mutex;

/// Log line with which a SuperNode says it is connected (both dialects).
pub const CONNECTED_LINE: &str = "SuperNode ID: ";
/// Line the runtime writes into a replica's log before each start.
const START_MARKER: &str = "=== flower-agent: starting";

/// Settings of the process runtime.
#[derive(Clone, Debug)]
pub struct ProcessRuntimeConfig {
    /// State directory (keys, CA bundles, logs live under it).
    pub state_dir: PathBuf,
    /// Directory holding `flower-supernode` and `flower-superexec` (a venv's `bin/`); None: PATH.
    pub flower_bin: Option<PathBuf>,
    /// First port tried for Runtime/ClientAppIO APIs on 127.0.0.1.
    pub port_base: u16,
    /// `{node}`: this device's name.
    pub node_name: String,
    /// A directory (containing `state_dir`) hidden from the SuperNodes but for their
    /// Federation's own directory ([`crate::sandbox`]); None: not hidden.
    pub hide: Option<PathBuf>,
    /// With `hide`: the program (this binary) whose `netns-bridge` runs each replica in a
    /// network namespace of its own ([`network`]); None: the host network.
    pub bridge: Option<PathBuf>,
}

/// Identity of one replica.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct ReplicaKey {
    namespace: String,
    federation: String,
    pool: String,
    index: u32,
}

impl ReplicaKey {
    fn slug(&self) -> String {
        format!(
            "{}/{}/{}-{}",
            self.namespace, self.federation, self.pool, self.index
        )
    }
}

struct Replica {
    argv: Vec<String>,
    /// The pool's environment for this replica (see [`render::process_env`]).
    env: BTreeMap<String, String>,
    port: u16,
    log_file: PathBuf,
    public_key: Option<String>,
    supernode: Supervised,
    superexec: Option<Supervised>,
    /// In a network namespace of its own: the runtime's end of its Fleet socket.
    forwarder: Option<network::FleetForwarder>,
    /// How far its log has been read for readiness ([`readiness::LogScan`]).
    log_scan: std::sync::Mutex<readiness::LogScan>,
}

/// Desired state of one replica, computed from a work snapshot.
struct DesiredReplica {
    key: ReplicaKey,
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    superexec_argv: Option<Vec<String>>,
    public_key: Option<String>,
    /// False while the hub has not registered this replica's key with the SuperLink: starting
    /// it would only get it refused (and restarted with backoff).
    registered: bool,
    port: u16,
    /// The SuperLink's Fleet address (`HOST:PORT`) and, in a network namespace of its own,
    /// where the SuperNode finds it inside.
    fleet_address: String,
    fleet_inside: Option<network::FleetInside>,
}

/// Desired replicas per pool, in work order, keyed by (namespace, federation), with the pool's
/// resource fields this runtime cannot enforce (reported in its Ready condition).
type PoolCounts = BTreeMap<(String, String), Vec<PoolCount>>;
/// One pool of a Federation: its name, replicas, and the resource limits the runtime does not
/// enforce.
type PoolCount = (String, u32, Vec<&'static str>);

#[derive(Default)]
struct State {
    replicas: BTreeMap<ReplicaKey, Replica>,
    /// desired replica count per (namespace, federation, pool), in work order.
    pools: PoolCounts,
    /// Replicas waiting for the hub to register their key, with that public key.
    pending: BTreeMap<ReplicaKey, String>,
    /// The restart mark each Federation's SuperNodes were last started under.
    marks: BTreeMap<(String, String), String>,
}

/// SuperNodes as local processes.
pub struct ProcessRuntime {
    config: ProcessRuntimeConfig,
    state: Mutex<State>,
}

impl ProcessRuntime {
    /// A runtime running nothing yet. Fails when `flower-supernode` cannot be found.
    pub fn new(config: ProcessRuntimeConfig) -> Result<Self, RuntimeError> {
        let runtime = Self {
            config,
            state: Mutex::new(State::default()),
        };
        let program = runtime.program(render::SUPERNODE_PROGRAM);
        if program.components().count() > 1 && !program.exists() {
            return Err(RuntimeError::Apply(format!(
                "{} not found: install Flower (pip install flwr) and pass --flower-bin DIR",
                program.display()
            )));
        }
        if program.components().count() == 1 && which(&program).is_none() {
            return Err(RuntimeError::Apply(format!(
                "{} is not on PATH: install Flower (pip install flwr) or pass --flower-bin DIR",
                program.display()
            )));
        }
        Ok(runtime)
    }

    /// What a replica's processes do not see: [`ProcessRuntimeConfig::hide`] but for its
    /// Federation's directory; in `network`, when they run in a network namespace of their own.
    fn sandbox(
        &self,
        key: &ReplicaKey,
        network: Option<crate::sandbox::Network>,
    ) -> Option<crate::sandbox::Sandbox> {
        self.config
            .hide
            .as_ref()
            .map(|hide| crate::sandbox::Sandbox {
                network,
                confine: true,
                hide: hide.clone(),
                keep: self.fed_dir(key),
            })
    }

    fn fed_dir(&self, key: &ReplicaKey) -> PathBuf {
        self.config
            .state_dir
            .join("federations")
            .join(&key.namespace)
            .join(&key.federation)
    }

    /// The bridge program when replicas run in network namespaces of their own.
    fn bridge(&self) -> Option<&Path> {
        self.config
            .bridge
            .as_deref()
            .filter(|_| self.config.hide.is_some())
    }

    /// A Flower program by absolute path where it can be found (a bridge runs it as an argument,
    /// and the sandbox shows what absolute arguments need).
    fn absolute_program(&self, name: &str) -> PathBuf {
        let program = self.program(name);
        if program.components().count() == 1 {
            return which(&program).unwrap_or(program);
        }
        program
    }

    fn program(&self, name: &str) -> PathBuf {
        match &self.config.flower_bin {
            Some(dir) => dir.join(name),
            None => PathBuf::from(name),
        }
    }

    fn env(&self) -> BTreeMap<String, String> {
        crate::supervise::flower_env(self.config.flower_bin.as_deref())
    }
}

impl Runtime for ProcessRuntime {
    fn apply<'a>(&'a self, work: &'a ClusterWork) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let mut state = self.state.lock().await;
            let taken: BTreeMap<ReplicaKey, u16> = state
                .replicas
                .iter()
                .map(|(k, r)| (k.clone(), r.port))
                .collect();
            // Everything is computed before anything changes: a bad snapshot changes nothing.
            let (desired, pools) = self.desired(work, &taken)?;
            let wanted: BTreeSet<ReplicaKey> = desired.iter().map(|d| d.key.clone()).collect();
            let stale: Vec<ReplicaKey> = state
                .replicas
                .keys()
                .filter(|k| !wanted.contains(*k))
                .cloned()
                .collect();
            for key in stale {
                if let Some(replica) = state.replicas.remove(&key) {
                    tracing::info!(replica = %key.slug(), "stopping removed SuperNode");
                    stop_replica(replica).await;
                }
            }
            state.pending.clear();
            for d in desired {
                if let Some(existing) = state.replicas.get(&d.key)
                    && existing.argv == d.argv
                    && existing.env == d.env
                    && existing.public_key == d.public_key
                {
                    continue;
                }
                // A new key (the old one retired by the SuperLink) waits for its registration
                // like a new replica; the process with the old key is refused anyway.
                let rekeyed = state
                    .replicas
                    .get(&d.key)
                    .is_some_and(|r| r.public_key != d.public_key);
                if !d.registered && (rekeyed || !state.replicas.contains_key(&d.key)) {
                    if let Some(old) = state.replicas.remove(&d.key) {
                        tracing::info!(replica = %d.key.slug(), "SuperNode key replaced: stopped until the hub registers the new one");
                        stop_replica(old).await;
                    }
                    if let Some(public_key) = d.public_key {
                        tracing::info!(replica = %d.key.slug(), "waiting for the hub to register this SuperNode's key");
                        state.pending.insert(d.key, public_key);
                    }
                    continue;
                }
                if let Some(old) = state.replicas.remove(&d.key) {
                    tracing::info!(replica = %d.key.slug(), "SuperNode arguments or environment changed; restarting");
                    stop_replica(old).await;
                }
                let log_dir = self.config.state_dir.join("logs").join(&d.key.namespace);
                let name = format!("{}-{}-{}", d.key.federation, d.key.pool, d.key.index);
                let log_file = log_dir.join(format!("{name}.supernode.log"));
                append_marker(&log_file)?;
                // Flower installs FABs under FLWR_HOME: one per SuperNode.
                // The pool's env over the runtime's (Flower's PATH, telemetry off); FLWR_HOME is
                // per replica.
                let mut env = self.env();
                env.extend(d.env.clone());
                let home = self
                    .config
                    .state_dir
                    .join("federations")
                    .join(&d.key.namespace)
                    .join(&d.key.federation)
                    .join("homes")
                    .join(format!("{}-{}", d.key.pool, d.key.index));
                env.insert("FLWR_HOME".into(), home.display().to_string());
                let started = self.start_replica(&d, &env, &log_dir, &name, &log_file)?;
                tracing::info!(replica = %d.key.slug(), port = d.port, own_network = started.forwarder.is_some(), "started SuperNode");
                state.replicas.insert(
                    d.key,
                    Replica {
                        argv: d.argv,
                        env: d.env,
                        port: d.port,
                        log_file,
                        public_key: d.public_key,
                        supernode: started.supernode,
                        superexec: started.superexec,
                        forwarder: started.forwarder,
                        log_scan: Default::default(),
                    },
                );
            }
            state.pools = pools;
            state.marks = work
                .federations
                .iter()
                .map(|f| {
                    (
                        (f.namespace.clone(), f.name.clone()),
                        f.supernode_restart.trim().to_owned(),
                    )
                })
                .collect();
            Ok(())
        })
    }

    fn allocatable(&self) -> BoxFuture<'_, crate::runtime::Allocatable> {
        Box::pin(async { crate::runtime::machine_allocatable() })
    }

    fn status(&self) -> BoxFuture<'_, Vec<FederationStatus>> {
        Box::pin(async move {
            let state = self.state.lock().await;
            state
                .pools
                .iter()
                .map(|((namespace, name), pools)| FederationStatus {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    supernode_restart: state
                        .marks
                        .get(&(namespace.clone(), name.clone()))
                        .cloned()
                        .unwrap_or_default(),
                    pools: pools
                        .iter()
                        .map(|(pool, desired, unenforced)| {
                            let replicas: Vec<&Replica> = state
                                .replicas
                                .iter()
                                .filter(|(k, _)| {
                                    &k.namespace == namespace
                                        && &k.federation == name
                                        && &k.pool == pool
                                })
                                .map(|(_, r)| r)
                                .collect();
                            let ready = replicas.iter().filter(|r| replica_ready(r)).count() as u32;
                            let pending: Vec<String> = state
                                .pending
                                .iter()
                                .filter(|(k, _)| {
                                    &k.namespace == namespace
                                        && &k.federation == name
                                        && &k.pool == pool
                                })
                                .map(|(_, public_key)| public_key.clone())
                                .collect();
                            let keys = replicas
                                .iter()
                                .filter_map(|r| r.public_key.clone())
                                .chain(pending)
                                .collect();
                            PoolStatus {
                                name: pool.clone(),
                                desired: *desired,
                                ready,
                                conditions: vec![ready_condition(
                                    ready, *desired, &replicas, unenforced,
                                )],
                                node_public_keys: keys,
                            }
                        })
                        .collect(),
                })
                .collect()
        })
    }
}

impl ProcessRuntime {
    /// Stops every SuperNode (the agent is shutting down; no orphans).
    pub async fn shutdown(&self) {
        let mut state = self.state.lock().await;
        let replicas = std::mem::take(&mut state.replicas);
        for (_, replica) in replicas {
            stop_replica(replica).await;
        }
    }
}

async fn stop_replica(replica: Replica) {
    if let Some(se) = replica.superexec {
        se.stop().await;
    }
    replica.supernode.stop().await;
    drop(replica.forwarder);
}

/// Writes the marker before a (re)start so readiness only looks at the current run's output.
fn append_marker(log_file: &Path) -> Result<(), RuntimeError> {
    use std::io::Write;
    if let Some(dir) = log_file.parent() {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_file)
        .map_err(io_err(log_file))?;
    writeln!(f, "{START_MARKER}").map_err(io_err(log_file))
}

fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<(), RuntimeError> {
    crate::files::write_if_changed(path, bytes, crate::files::PUBLIC)
        .map(drop)
        .map_err(io_err(path))
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> RuntimeError + '_ {
    move |e| RuntimeError::Apply(format!("{}: {e}", path.display()))
}

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn which(program: &Path) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

mod desired;
mod input;
mod network;
mod readiness;
mod start;
use readiness::{ready_condition, replica_ready};
#[cfg(test)]
mod tests;

//! What the agent does with its work: one trait, implemented by the Kubernetes and process
//! runtimes (later) and by [`MemoryRuntime`], which only records snapshots (tests, `--runtime
//! noop`).
//!
//! Contract: `apply` receives the complete desired work (level-triggered) and must converge to
//! it idempotently; federations absent from the snapshot are to be removed. The channel never
//! calls anything when the hub is unreachable, so applied work keeps running.
use flower_addon_proto::{ClusterWork, FederationStatus, PoolStatus};
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use tokio::sync::watch;

/// A boxed future, so [`Runtime`] can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a runtime could not apply a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The work cannot be rendered or applied; the message is reported to the hub.
    #[error("{0}")]
    Apply(String),
}

/// Applies work snapshots and reports the observed state.
pub trait Runtime: Send + Sync {
    /// Converges to `work` (the full desired state of this cluster).
    fn apply<'a>(&'a self, work: &'a ClusterWork) -> BoxFuture<'a, Result<(), RuntimeError>>;
    /// The observed state of every federation, for the status report.
    fn status(&self) -> BoxFuture<'_, Vec<FederationStatus>>;
    /// Allocatable resources of the cluster or device (`cpu`, `memory` as Kubernetes
    /// quantities) for the hub's `ResourceAllocatable*` prioritizers; empty when unknown.
    fn allocatable(&self) -> BoxFuture<'_, Allocatable> {
        Box::pin(async { Allocatable::new() })
    }
}

/// Allocatable resources by name, as Kubernetes quantities (the wire type of
/// `Status.allocatable`).
pub type Allocatable = std::collections::HashMap<String, String>;

/// This machine's allocatable resources: CPUs the process may use and total memory
/// (`/proc/meminfo`), for runtimes that run SuperNodes on the machine itself.
pub fn machine_allocatable() -> Allocatable {
    let mut out = Allocatable::new();
    if let Ok(cpus) = std::thread::available_parallelism() {
        out.insert("cpu".to_owned(), cpus.get().to_string());
    }
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        });
    if let Some(kib) = mem_kib {
        out.insert("memory".to_owned(), format!("{kib}Ki"));
    }
    out
}

/// A runtime that only remembers what it was asked to run and reports every pool as ready.
#[derive(Debug)]
pub struct MemoryRuntime {
    applied: Mutex<Vec<ClusterWork>>,
    versions: watch::Sender<Option<u64>>,
}

impl Default for MemoryRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryRuntime {
    /// A runtime that has applied nothing.
    pub fn new() -> Self {
        Self {
            applied: Mutex::new(Vec::new()),
            versions: watch::channel(None).0,
        }
    }

    /// Every snapshot applied so far, oldest first.
    pub fn applied(&self) -> Vec<ClusterWork> {
        self.applied.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// The last snapshot applied.
    pub fn current(&self) -> Option<ClusterWork> {
        self.applied.lock().ok().and_then(|a| a.last().cloned())
    }

    /// A receiver of the last applied version.
    pub fn versions(&self) -> watch::Receiver<Option<u64>> {
        self.versions.subscribe()
    }
}

impl Runtime for MemoryRuntime {
    fn apply<'a>(&'a self, work: &'a ClusterWork) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            if let Ok(mut applied) = self.applied.lock() {
                applied.push(work.clone());
            }
            self.versions.send_replace(Some(work.version));
            Ok(())
        })
    }

    fn status(&self) -> BoxFuture<'_, Vec<FederationStatus>> {
        Box::pin(async move {
            let Some(work) = self.current() else {
                return Vec::new();
            };
            work.federations
                .iter()
                .map(|f| FederationStatus {
                    namespace: f.namespace.clone(),
                    name: f.name.clone(),
                    supernode_restart: f.supernode_restart.trim().to_owned(),
                    pools: f
                        .pools
                        .iter()
                        .map(|p| {
                            let replicas = serde_json::from_str::<serde_json::Value>(&p.spec_json)
                                .ok()
                                .and_then(|v| v.get("replicas").and_then(|r| r.as_u64()))
                                .and_then(|r| u32::try_from(r).ok())
                                .unwrap_or(0);
                            PoolStatus {
                                name: p.name.clone(),
                                desired: replicas,
                                ready: replicas,
                                conditions: Vec::new(),
                                node_public_keys: Vec::new(),
                            }
                        })
                        .collect(),
                })
                .collect()
        })
    }
}

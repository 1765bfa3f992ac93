//! Where each cluster's work comes from: the [`WorkSource`] trait the channel serves from, and
//! [`InMemoryWorkSource`], the versioned in-memory index both hub modes fill.
use dashmap::DashMap;
use flower_addon_proto::{ClusterWork, Status as AgentStatus};
use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// Where the hub gets each cluster's desired work, and where acks and status reports go.
///
/// `snapshot` must be cheap (an in-memory index): it is called for every connected cluster on
/// every change. The hub sends a snapshot when its version differs from the last one sent on that
/// stream, so versions must change whenever the content does.
pub trait WorkSource: Send + Sync + 'static {
    /// The complete current work of `cluster` (an empty list of federations if none).
    fn snapshot(&self, cluster: &str) -> ClusterWork;
    /// Whether `cluster`'s work is decided: a stream sends no work, not even an empty list,
    /// until it is (a list the hub has not computed yet would stop the agent's SuperNodes).
    fn decided(&self, cluster: &str) -> bool {
        let _ = cluster;
        true
    }
    /// A receiver whose value changes whenever any cluster's work may have changed.
    fn changes(&self) -> watch::Receiver<u64>;
    /// `cluster` applied the snapshot with `version`.
    fn on_ack(&self, cluster: &str, version: u64) {
        let _ = (cluster, version);
    }
    /// `cluster` reported the observed state of its work.
    fn on_status(&self, cluster: &str, status: &AgentStatus) {
        let _ = (cluster, status);
    }
}

/// A [`WorkSource`] held in memory, driven by [`InMemoryWorkSource::set`]. Used by the standalone
/// hub and by tests; records acks and the last status per cluster.
#[derive(Debug)]
pub struct InMemoryWorkSource {
    works: RwLock<HashMap<String, ClusterWork>>,
    base_version: u64,
    next_version: AtomicU64,
    changes: watch::Sender<u64>,
    acks: DashMap<String, u64>,
    statuses: DashMap<String, AgentStatus>,
    /// Only clusters given work are decided ([`InMemoryWorkSource::gated`]).
    gated: bool,
}

impl Default for InMemoryWorkSource {
    fn default() -> Self {
        Self::new()
    }
}

// === impl InMemoryWorkSource ===

impl InMemoryWorkSource {
    /// An empty source. Versions start at the current Unix time in milliseconds, so a restarted
    /// hub never reuses a version an agent saw from the previous run.
    pub fn new() -> Self {
        let base = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(1);
        Self {
            works: RwLock::new(HashMap::new()),
            base_version: base,
            next_version: AtomicU64::new(base + 1),
            changes: watch::channel(base).0,
            acks: DashMap::new(),
            statuses: DashMap::new(),
            gated: false,
        }
    }

    /// A source whose clusters have no work, not even an empty list, until [`Self::set`] gives
    /// them some: the standalone hub's, so an agent that connects to a restarted hub keeps what
    /// it runs until the hub has decided what it should run (the Kubernetes work source is
    /// ready only after its first pass for the same reason).
    pub fn gated() -> Self {
        Self {
            gated: true,
            ..Self::new()
        }
    }

    /// Replaces `cluster`'s work (its `version` and `cluster_name` are overwritten) and notifies
    /// the streams. Returns the new version.
    pub fn set(&self, cluster: &str, mut work: ClusterWork) -> u64 {
        let version = self.next_version.fetch_add(1, Ordering::SeqCst);
        work.version = version;
        work.cluster_name = cluster.to_string();
        if let Ok(mut works) = self.works.write() {
            works.insert(cluster.to_string(), work);
        }
        self.changes.send_replace(version);
        version
    }

    /// Sets the work of many clusters at once with one notification; returns the versions.
    pub fn set_many(&self, works: impl IntoIterator<Item = (String, ClusterWork)>) -> Vec<u64> {
        let mut versions = Vec::new();
        let mut last = 0;
        if let Ok(mut map) = self.works.write() {
            for (cluster, mut work) in works {
                let version = self.next_version.fetch_add(1, Ordering::SeqCst);
                work.version = version;
                work.cluster_name = cluster.clone();
                map.insert(cluster, work);
                versions.push(version);
                last = version;
            }
        }
        self.changes.send_replace(last);
        versions
    }

    /// The last version `cluster` acked.
    pub fn acked(&self, cluster: &str) -> Option<u64> {
        self.acks.get(cluster).map(|v| *v)
    }

    /// The last status `cluster` reported.
    pub fn last_status(&self, cluster: &str) -> Option<AgentStatus> {
        self.statuses.get(cluster).map(|s| s.clone())
    }
}

impl WorkSource for InMemoryWorkSource {
    fn snapshot(&self, cluster: &str) -> ClusterWork {
        self.works
            .read()
            .ok()
            .and_then(|w| w.get(cluster).cloned())
            .unwrap_or_else(|| ClusterWork {
                version: self.base_version,
                cluster_name: cluster.to_string(),
                ..Default::default()
            })
    }

    fn decided(&self, cluster: &str) -> bool {
        !self.gated || self.works.read().is_ok_and(|w| w.contains_key(cluster))
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn on_ack(&self, cluster: &str, version: u64) {
        self.acks.insert(cluster.to_string(), version);
    }

    fn on_status(&self, cluster: &str, status: &AgentStatus) {
        self.statuses.insert(cluster.to_string(), status.clone());
    }
}

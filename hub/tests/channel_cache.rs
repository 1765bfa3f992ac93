//! A store with a cache (like the Kubernetes store's ManagedCluster watch): the channel takes a
//! cached "yes" without reading the store, confirms every "no" with a fresh read, closes a stream
//! the cached "yes" let in once the revoking change is announced, and writes again a heartbeat
//! whose write failed. Real mTLS on loopback, the file store underneath.
mod channel_support;

use channel_support::{any_port, config, eventually};
use flower_addon_agent::channel::{AgentEvent, RunOptions, run};
use flower_addon_agent::credentials::Credentials;
use flower_addon_agent::runtime::MemoryRuntime;
use flower_addon_hub::registration::ca::{CaMaterial, CaRole};
use flower_addon_hub::registration::store::file::FileStore;
use flower_addon_hub::registration::store::{
    CONDITION_AVAILABLE, CONDITION_HUB_ACCEPTED, ClusterRecord, ClusterRegistration, ClusterStatus,
    ClusterStore, StoreError,
};
use flower_addon_hub::registration::tokens::TokenRecord;
use flower_addon_proto::{ClusterWork, FederationWork};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};
use tonic::Code;

/// The file store behind a cache that changes only when the test delivers a change, and that
/// announces a change only after caching it (the contract of `ClusterStore::cached_cluster`).
struct CachedStore {
    inner: FileStore,
    cache: Mutex<HashMap<String, ClusterRecord>>,
    changes: broadcast::Sender<String>,
    /// Fresh reads of a cluster.
    gets: AtomicUsize,
    /// The names of those reads, in order.
    read_names: Mutex<Vec<String>>,
    /// While set, status writes fail (and are counted in `failed_writes`).
    fail_status_writes: AtomicBool,
    failed_writes: AtomicUsize,
    /// While set, status writes wait (a store that has stopped answering).
    hold_status_writes: AtomicBool,
}

impl CachedStore {
    fn open(dir: &std::path::Path) -> Self {
        Self {
            inner: FileStore::open(dir).expect("open store"),
            cache: Mutex::new(HashMap::new()),
            changes: broadcast::channel(64).0,
            gets: AtomicUsize::new(0),
            read_names: Mutex::new(Vec::new()),
            fail_status_writes: AtomicBool::new(false),
            failed_writes: AtomicUsize::new(0),
            hold_status_writes: AtomicBool::new(false),
        }
    }

    /// The cache takes the stored record of `name`, then the change is announced.
    async fn deliver(&self, name: &str) {
        let record = self.inner.get_cluster(name).await.expect("get");
        {
            let mut cache = self.cache.lock().expect("cache");
            match record {
                Some(record) => cache.insert(name.to_owned(), record),
                None => cache.remove(name),
            };
        }
        let _ = self.changes.send(name.to_owned());
    }

    /// How many fresh reads of `name` there were.
    fn reads_of(&self, name: &str) -> usize {
        let names = self.read_names.lock().expect("read names");
        names.iter().filter(|n| *n == name).count()
    }

    async fn status_write(&self) -> Result<(), StoreError> {
        while self.hold_status_writes.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if self.fail_status_writes.load(Ordering::SeqCst) {
            self.failed_writes.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Io {
                path: "status".into(),
                source: std::io::Error::other("injected failure"),
            });
        }
        Ok(())
    }
}

impl ClusterStore for CachedStore {
    async fn load_ca_for(&self, role: CaRole) -> Result<Option<CaMaterial>, StoreError> {
        self.inner.load_ca_for(role).await
    }
    async fn create_ca_for(&self, role: CaRole, ca: &CaMaterial) -> Result<CaMaterial, StoreError> {
        self.inner.create_ca_for(role, ca).await
    }
    async fn replace_ca_for(
        &self,
        role: CaRole,
        current: &CaMaterial,
        new: &CaMaterial,
    ) -> Result<(), StoreError> {
        self.inner.replace_ca_for(role, current, new).await
    }
    async fn put_token(&self, token: &TokenRecord) -> Result<(), StoreError> {
        self.inner.put_token(token).await
    }
    async fn get_token(&self, id: &str) -> Result<Option<TokenRecord>, StoreError> {
        self.inner.get_token(id).await
    }
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        self.inner.list_tokens().await
    }
    async fn delete_token(&self, id: &str) -> Result<bool, StoreError> {
        self.inner.delete_token(id).await
    }
    async fn use_token(&self, id: &str) -> Result<bool, StoreError> {
        self.inner.use_token(id).await
    }
    async fn create_cluster(
        &self,
        registration: &ClusterRegistration,
        hub_accepts_client: bool,
    ) -> Result<(), StoreError> {
        self.inner
            .create_cluster(registration, hub_accepts_client)
            .await
    }
    async fn update_registration(
        &self,
        registration: &ClusterRegistration,
    ) -> Result<(), StoreError> {
        self.inner.update_registration(registration).await
    }
    async fn set_accepted(&self, name: &str, accepted: bool) -> Result<(), StoreError> {
        self.inner.set_accepted(name, accepted).await
    }
    async fn put_status(&self, name: &str, status: &ClusterStatus) -> Result<(), StoreError> {
        self.status_write().await?;
        self.inner.put_status(name, status).await
    }
    async fn update_status<F>(&self, name: &str, update: F) -> Result<(), StoreError>
    where
        F: FnMut(&mut ClusterStatus) + Send,
    {
        self.status_write().await?;
        self.inner.update_status(name, update).await
    }
    async fn get_cluster(&self, name: &str) -> Result<Option<ClusterRecord>, StoreError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.read_names
            .lock()
            .expect("read names")
            .push(name.to_owned());
        self.inner.get_cluster(name).await
    }
    fn cached_cluster(&self, name: &str) -> Option<ClusterRecord> {
        self.cache.lock().expect("cache").get(name).cloned()
    }
    fn cached_clusters(&self) -> Option<Vec<ClusterRecord>> {
        Some(
            self.cache
                .lock()
                .expect("cache")
                .values()
                .cloned()
                .collect(),
        )
    }
    async fn list_clusters(&self) -> Result<Vec<ClusterRecord>, StoreError> {
        self.inner.list_clusters().await
    }
    async fn delete_cluster(&self, name: &str) -> Result<bool, StoreError> {
        self.inner.delete_cluster(name).await
    }
    fn changes(&self) -> broadcast::Receiver<String> {
        self.changes.subscribe()
    }
}

type Hub = channel_support::Hub<CachedStore>;

/// A cluster name nobody registers: announced to see that the revocation watcher reads it.
const PROBE: &str = "probe-not-registered";

/// A hub on a [`CachedStore`] in a new directory (kept while the returned guard lives).
async fn start_hub() -> (Hub, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tmp");
    let store = Arc::new(CachedStore::open(dir.path()));
    let hub = Hub::start_with(store, dir.path(), any_port(), config()).await;
    (hub, dir)
}

struct Agent {
    stop: watch::Sender<bool>,
    events: mpsc::UnboundedReceiver<AgentEvent>,
    task: tokio::task::JoinHandle<()>,
}

fn spawn_agent(creds: Credentials) -> Agent {
    let (stop, stop_rx) = watch::channel(false);
    let (ev_tx, events) = mpsc::unbounded_channel();
    let mut options = RunOptions::new(creds, None);
    options.reconnect_min = Duration::from_millis(50);
    options.reconnect_max = Duration::from_millis(300);
    options.status_interval = Duration::from_millis(200);
    options.events = Some(ev_tx);
    let runtime = Arc::new(MemoryRuntime::new());
    let task = tokio::spawn(async move {
        run(options, runtime, stop_rx).await.expect("agent run");
    });
    Agent { stop, events, task }
}

impl Agent {
    /// The code the next disconnection ends with; it must come within `within` from now.
    async fn disconnected(&mut self, within: Duration) -> Option<Code> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .unwrap_or_else(|_| panic!("no disconnection within {within:?}"))
                .expect("events open")
            {
                AgentEvent::Disconnected { code, .. } => return code,
                _ => continue,
            }
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.expect("agent");
    }
}

fn some_work() -> ClusterWork {
    ClusterWork {
        federations: vec![FederationWork {
            namespace: "default".into(),
            name: "fed".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn a_cached_yes_costs_no_read_and_the_announced_revocation_closes_the_stream() {
    let (hub, _dir) = start_hub().await;
    let agent_dir = tempfile::tempdir().expect("tmp");
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    hub.store.deliver("edge-1").await;
    // Revoked in the store, not yet in the cache (the watch is behind).
    hub.store
        .set_accepted("edge-1", false)
        .await
        .expect("revoke");
    let v1 = hub.work.set("edge-1", some_work());
    let gets = hub.store.gets.load(Ordering::SeqCst);
    let mut agent = spawn_agent(creds);
    let work = hub.work.clone();
    eventually(
        "the stream authorized by the cache gets its work",
        Duration::from_secs(5),
        async || work.acked("edge-1") == Some(v1),
    )
    .await;
    assert_eq!(
        hub.store.gets.load(Ordering::SeqCst),
        gets,
        "a connection the cache authorizes costs no read"
    );
    // The watch catches up: the stream closes at once, and reconnects are refused. Only the
    // announced change closes it (the agent's heartbeats keep its lease, and nothing re-checks
    // an open stream on a timer): a hub that missed it keeps the stream open for good, so a
    // bound far above the milliseconds the close takes (10 s, for a loaded runner) still tells
    // the two apart.
    hub.store.deliver("edge-1").await;
    assert_eq!(
        agent.disconnected(Duration::from_secs(10)).await,
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        agent.disconnected(Duration::from_secs(10)).await,
        Some(Code::PermissionDenied),
        "refused again on reconnect"
    );
    assert_eq!((hub.connected)(), 0);
    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn a_cached_no_is_confirmed_with_a_fresh_read() {
    let (hub, _dir) = start_hub().await;
    let agent_dir = tempfile::tempdir().expect("tmp");
    // The cache saw the cluster before it was accepted; the store has it accepted.
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    hub.store
        .set_accepted("edge-1", false)
        .await
        .expect("unaccept");
    hub.store.deliver("edge-1").await;
    hub.store
        .set_accepted("edge-1", true)
        .await
        .expect("accept");
    let v1 = hub.work.set("edge-1", some_work());
    let agent = spawn_agent(creds.clone());
    let work = hub.work.clone();
    eventually(
        "a stale cached refusal does not keep an accepted cluster out",
        Duration::from_secs(5),
        async || work.acked("edge-1") == Some(v1),
    )
    .await;
    agent.stop().await;
    // Negative: refused in the store as in the cache.
    hub.store
        .set_accepted("edge-1", false)
        .await
        .expect("revoke");
    hub.store.deliver("edge-1").await;
    let mut agent = spawn_agent(creds.clone());
    assert_eq!(
        agent.disconnected(Duration::from_secs(5)).await,
        Some(Code::PermissionDenied)
    );
    agent.stop().await;
    // Negative: a cluster the cache does not hold is read, and a deleted one refused.
    hub.store
        .set_accepted("edge-1", true)
        .await
        .expect("accept");
    hub.store.deliver("edge-1").await;
    assert!(hub.store.delete_cluster("edge-1").await.expect("delete"));
    hub.store.cache.lock().expect("cache").clear();
    let mut agent = spawn_agent(creds);
    assert_eq!(
        agent.disconnected(Duration::from_secs(5)).await,
        Some(Code::PermissionDenied),
        "a cluster missing from the cache is read, and a deleted one refused"
    );
    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn a_heartbeat_whose_write_failed_is_written_with_a_later_message() {
    let (hub, _dir) = start_hub().await;
    let agent_dir = tempfile::tempdir().expect("tmp");
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    hub.store.deliver("edge-1").await;
    hub.store.fail_status_writes.store(true, Ordering::SeqCst);
    let agent = spawn_agent(creds);
    let store = hub.store.clone();
    eventually(
        "the first heartbeat's write failed",
        Duration::from_secs(5),
        async || store.failed_writes.load(Ordering::SeqCst) > 0,
    )
    .await;
    hub.store.fail_status_writes.store(false, Ordering::SeqCst);
    eventually(
        "Available=True written once the store works again",
        Duration::from_secs(5),
        async || {
            store
                .inner
                .get_cluster("edge-1")
                .await
                .ok()
                .flatten()
                .and_then(|r| r.status.condition(CONDITION_AVAILABLE).cloned())
                .is_some_and(|c| c.status == "True")
        },
    )
    .await;
    assert_eq!((hub.connected)(), 1, "the stream stayed open meanwhile");
    agent.stop().await;
    hub.stop().await;
}

/// Drops the HubAcceptedManagedCluster condition Join wrote, as for a cluster created accepted
/// by an admin (or the benchmark) rather than through Join.
async fn forget_acceptance(store: &CachedStore, name: &str) {
    store
        .inner
        .update_status(name, |st| {
            st.conditions.retain(|c| c.type_ != CONDITION_HUB_ACCEPTED)
        })
        .await
        .expect("status");
}

/// The `(Available, HubAcceptedManagedCluster)` statuses stored for `name`.
async fn conditions(store: &CachedStore, name: &str) -> (Option<String>, Option<String>) {
    let Some(record) = store.inner.get_cluster(name).await.ok().flatten() else {
        return (None, None);
    };
    let of = |t: &str| record.status.condition(t).map(|c| c.status.clone());
    (of(CONDITION_AVAILABLE), of(CONDITION_HUB_ACCEPTED))
}

#[tokio::test]
async fn the_first_heartbeat_write_records_the_acceptance_too() {
    // Accepted in the store, never announced: the stream's first write carries
    // HubAcceptedManagedCluster=True with Available=True.
    let (hub, _dir) = start_hub().await;
    let agent_dir = tempfile::tempdir().expect("tmp");
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    forget_acceptance(&hub.store, "edge-1").await;
    assert_eq!(conditions(&hub.store, "edge-1").await.1, None);
    let agent = spawn_agent(creds);
    let store = hub.store.clone();
    let both = (Some("True".to_string()), Some("True".to_string()));
    eventually(
        "Available=True and HubAcceptedManagedCluster=True",
        Duration::from_secs(5),
        async || conditions(&store, "edge-1").await == both,
    )
    .await;
    agent.stop().await;
    hub.stop().await;
}

#[tokio::test(flavor = "current_thread")]
async fn changes_missed_in_a_burst_are_made_up_for_every_cluster() {
    // A burst of announcements larger than the channel (64 here) while the hub is busy: the
    // watcher misses some, and checks every cluster the cache holds instead, also those with
    // no stream (here: an accepted cluster whose agent never connected).
    let (hub, _dir) = start_hub().await;
    let agent_dir = tempfile::tempdir().expect("tmp");
    let _creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    forget_acceptance(&hub.store, "edge-1").await;
    // Wait until the watcher has finished its start-up pass, so only the burst below can
    // record acceptance: it handles announcements only after that pass, so once it has read a
    // cluster announced now (one the cache does not hold, so it is read from the store), the
    // pass is over.
    let _ = hub.store.changes.send(PROBE.into());
    let store = hub.store.clone();
    eventually(
        "the watcher handles announcements (its start-up pass is over)",
        Duration::from_secs(10),
        async || store.reads_of(PROBE) > 0,
    )
    .await;
    assert_eq!(conditions(&hub.store, "edge-1").await.1, None);
    // One runtime thread: nothing reads the channel until this burst is sent.
    let record = hub.store.inner.get_cluster("edge-1").await.expect("get");
    hub.store
        .cache
        .lock()
        .expect("cache")
        .insert("edge-1".into(), record.expect("joined"));
    let _ = hub.store.changes.send("edge-1".into());
    for i in 0..200 {
        let _ = hub.store.changes.send(format!("ghost-{i}"));
    }
    let store = hub.store.clone();
    eventually(
        "HubAcceptedManagedCluster=True after the missed announcement",
        Duration::from_secs(5),
        async || conditions(&store, "edge-1").await.1.as_deref() == Some("True"),
    )
    .await;
    hub.stop().await;
}

#[tokio::test]
async fn work_reaches_the_stream_while_the_store_does_not_answer() {
    // Status writes hang (an apiserver swamped by 10,000 first heartbeats): the stream still
    // gets its work, and every new version of it.
    let (hub, _dir) = start_hub().await;
    let agent_dir = tempfile::tempdir().expect("tmp");
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    hub.store.deliver("edge-1").await;
    hub.store.hold_status_writes.store(true, Ordering::SeqCst);
    let v1 = hub.work.set("edge-1", some_work());
    let agent = spawn_agent(creds);
    let work = hub.work.clone();
    eventually("v1 acked", Duration::from_secs(5), async || {
        work.acked("edge-1") == Some(v1)
    })
    .await;
    // Heartbeats keep coming and their writes keep hanging; a new version still goes out.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut next = some_work();
    next.federations[0].name = "fed-2".into();
    let v2 = hub.work.set("edge-1", next);
    eventually("v2 acked", Duration::from_secs(5), async || {
        work.acked("edge-1") == Some(v2)
    })
    .await;
    assert_eq!(
        conditions(&hub.store, "edge-1").await.0,
        None,
        "nothing was written meanwhile"
    );
    hub.store.hold_status_writes.store(false, Ordering::SeqCst);
    let store = hub.store.clone();
    eventually(
        "Available=True once the store answers",
        Duration::from_secs(5),
        async || conditions(&store, "edge-1").await.0.as_deref() == Some("True"),
    )
    .await;
    agent.stop().await;
    hub.stop().await;
}

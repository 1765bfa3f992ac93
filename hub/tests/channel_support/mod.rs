//! Shared harness for the channel tests: a real hub (file store, in-memory work, real TLS on
//! loopback) and helpers to join agents and to snapshot the store.
#![allow(dead_code)]
use flower_addon_agent::credentials::Credentials;
use flower_addon_agent::join::{JoinError, JoinOptions, join};
use flower_addon_hub::channel::source::InMemoryWorkSource;
use flower_addon_hub::channel::{ChannelConfig, ChannelServer};
use flower_addon_hub::registration::ca::HubCa;
use flower_addon_hub::registration::store::file::FileStore;
use flower_addon_hub::registration::store::{ClusterRecord, ClusterStore, load_or_create_ca};
use flower_addon_hub::registration::tokens::{self, TokenRecord};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running hub, on the file store unless a test brings its own store.
pub struct Hub<S = FileStore> {
    pub dir: PathBuf,
    pub store: Arc<S>,
    pub work: Arc<InMemoryWorkSource>,
    pub ca: Arc<HubCa>,
    pub addr: SocketAddr,
    pub connected: Box<dyn Fn() -> usize + Send + Sync>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Hub {
    /// Starts a hub in `dir` on `addr` (port 0: any).
    pub async fn start_in(dir: &Path, addr: SocketAddr, config: ChannelConfig) -> Hub {
        let store = Arc::new(FileStore::open(dir).expect("open store"));
        Hub::start_with(store, dir, addr, config).await
    }
}

impl<S: ClusterStore> Hub<S> {
    /// Starts a hub on `store` (kept in `dir`) on `addr` (port 0: any).
    pub async fn start_with(
        store: Arc<S>,
        dir: &Path,
        addr: SocketAddr,
        config: ChannelConfig,
    ) -> Hub<S> {
        Hub::start_with_work(store, dir, addr, config, InMemoryWorkSource::new()).await
    }

    /// [`Hub::start_with`] serving from `work` (e.g. [`InMemoryWorkSource::gated`]).
    pub async fn start_with_work(
        store: Arc<S>,
        dir: &Path,
        addr: SocketAddr,
        config: ChannelConfig,
        work: InMemoryWorkSource,
    ) -> Hub<S> {
        let ca = Arc::new(load_or_create_ca(store.as_ref()).await.expect("ca"));
        let work = Arc::new(work);
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = ChannelServer::new(store.clone(), work.clone(), ca.clone(), config);
        let connected = Box::new(server.connected_counter());
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .serve(vec![listener], async {
                    let _ = stop_rx.await;
                })
                .await
                .expect("serve");
        });
        Hub {
            dir: dir.to_path_buf(),
            store,
            work,
            ca,
            addr,
            connected,
            stop: Some(stop_tx),
            task: Some(task),
        }
    }

    /// `127.0.0.1:PORT` of the hub.
    pub fn hub(&self) -> String {
        self.addr.to_string()
    }

    /// Stops the hub and waits until it is down.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("hub stops within 10 s")
                .expect("hub task");
        }
    }

    /// A valid token for this hub.
    pub async fn token(&self) -> String {
        self.scoped_token(tokens::TokenScope::default()).await
    }

    /// A valid token for this hub, bound to `scope` (`token create --cluster-name/--label/--uses`).
    pub async fn scoped_token(&self, scope: tokens::TokenScope) -> String {
        let new = tokens::generate_scoped(Duration::from_secs(3600), "test", scope);
        self.store.put_token(&new.record).await.expect("put token");
        new.token
    }

    /// Join options for `name`, giving up after `wait`, with short backoff.
    pub fn join_options(&self, token: &str, name: &str, state_dir: &Path) -> JoinOptions {
        let mut options = JoinOptions::new(
            &self.hub(),
            token,
            self.ca.hash(),
            name,
            state_dir.to_path_buf(),
        );
        options.max_wait = Some(Duration::from_secs(3));
        options.max_backoff = Duration::from_millis(200);
        options
    }

    /// Joins `name` from `state_dir` and accepts it on the hub meanwhile.
    pub async fn join_accepted(&self, name: &str, state_dir: &Path) -> Credentials {
        let token = self.token().await;
        let mut options = self.join_options(&token, name, state_dir);
        options.max_wait = Some(Duration::from_secs(20));
        let store = self.store.clone();
        let accept_name = name.to_string();
        let accepter = tokio::spawn(async move {
            for _ in 0..200 {
                if store.set_accepted(&accept_name, true).await.is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let creds = join(&options, &mut |_| {}).await.expect("join");
        accepter.await.expect("accepter");
        creds
    }

    /// Everything the store holds that a refusal must not change.
    pub async fn snapshot(&self) -> (Vec<ClusterRecord>, Vec<TokenRecord>) {
        (
            self.store.list_clusters().await.expect("clusters"),
            self.store.list_tokens().await.expect("tokens"),
        )
    }
}

/// Joins without waiting for acceptance and returns the error.
pub async fn join_err(options: &JoinOptions) -> JoinError {
    join(options, &mut |_| {})
        .await
        .expect_err("join must fail")
}

/// Waits until `check` holds, polling, or panics after `timeout`.
pub async fn eventually(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Default config with fast leases for tests.
pub fn config() -> ChannelConfig {
    ChannelConfig {
        lease_duration: Duration::from_secs(3),
        ..ChannelConfig::default()
    }
}

/// A loopback address with any port.
pub fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

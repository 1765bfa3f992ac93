//! The hub side of the work channel: the gRPC server for `Registration` (Join, Renew) and `Work`
//! (Connect), over mTLS on our own tokio-rustls streams.
//!
//! Why not tonic's TLS: Join must accept clients without a certificate while Connect/Renew need
//! the verified client certificate of the connection, and agents pin the CA by hash. We accept
//! TLS ourselves ([`tls`]) and hand tonic connections whose connect-info carries the verified
//! identity ([`tls::PeerInfo`]); handlers read it from the request extensions.
use crate::registration::ca::HubCa;
use crate::registration::store::{ClusterRecord, ClusterStatus, ClusterStore, StoreError};
use dashmap::DashMap;
use flower_addon_proto::registration_server::RegistrationServer;
use flower_addon_proto::work_server::WorkServer;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tonic::Status;

mod acceptance;
pub mod conns;
mod lease;
pub mod limits;
pub(crate) mod registration;
pub mod report;
pub mod source;
pub mod tls;
pub mod work;

use crate::channel::source::WorkSource;
pub(crate) use registration::validate_cluster_name;

/// Errors starting or running the channel server.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// rustls refused the configuration.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// Some setting is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// The CA could not issue the server certificate.
    #[error("certificate authority: {0}")]
    Ca(#[from] crate::registration::ca::CaError),
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The gRPC server stopped with an error.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Settings of the channel server. [`ChannelConfig::default`] gives the documented defaults.
#[derive(Clone, Debug)]
pub struct ChannelConfig {
    /// Names or IP addresses agents dial (server certificate SANs; 127.0.0.1 and localhost are
    /// always added).
    pub advertise: Vec<String>,
    /// Validity of agent client certificates (default 30 days).
    pub cert_validity: Duration,
    /// Validity of the hub's own server certificate, issued at each start (default 365 days).
    pub server_cert_validity: Duration,
    /// Cluster lease: without a heartbeat for this long the cluster becomes unavailable
    /// (default 60 s). The hub pings every third of it.
    pub lease_duration: Duration,
    /// Clusters whose labels contain all of these pairs are accepted at join (empty: none).
    pub auto_accept: BTreeMap<String, String>,
    /// Largest message the hub decodes (default 4 MiB); larger ones fail with OUT_OF_RANGE.
    pub max_message_bytes: usize,
    /// Deadline for Join and Renew (default 10 s).
    pub unary_deadline: Duration,
    /// HTTP/2 keepalive ping interval (default 30 s) and timeout (default 10 s).
    pub keepalive_interval: Duration,
    /// See `keepalive_interval`.
    pub keepalive_timeout: Duration,
    /// Bound on one TLS handshake (default 10 s).
    pub handshake_timeout: Duration,
    /// Join rate limit: immediate burst per token and per peer address (default 20).
    pub join_burst: u32,
    /// Join rate limit: sustained rate per token and per peer address (default 2/s).
    pub join_per_second: f64,
    /// Caps on open connections ([`conns`]).
    pub connections: conns::ConnLimits,
    /// Clusters that may wait for acceptance at once; a join that would register one more is
    /// refused with RESOURCE_EXHAUSTED (default 1,000).
    pub max_pending_clusters: usize,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        Self {
            advertise: Vec::new(),
            cert_validity: Duration::from_secs(30 * 24 * 3600),
            server_cert_validity: Duration::from_secs(365 * 24 * 3600),
            lease_duration: Duration::from_secs(60),
            auto_accept: BTreeMap::new(),
            max_message_bytes: 4 * 1024 * 1024,
            unary_deadline: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            join_burst: 20,
            join_per_second: 2.0,
            connections: conns::ConnLimits::default(),
            max_pending_clusters: 1000,
        }
    }
}

/// State shared by the services of one server.
pub(crate) struct Shared<S, W> {
    pub(crate) store: Arc<S>,
    pub(crate) work: Arc<W>,
    pub(crate) ca: Arc<HubCa>,
    /// [`HubCa::bundle_sha256`], sent in every `Ping`.
    pub(crate) ca_bundle_sha256: String,
    pub(crate) config: ChannelConfig,
    pub(crate) limiter: limits::RateLimiter,
    /// The open stream of each cluster.
    pub(crate) streams: DashMap<String, work::StreamEntry>,
    pub(crate) next_stream_id: AtomicU64,
    /// Lease bookkeeping per cluster.
    pub(crate) leases: DashMap<String, lease::Lease>,
    /// Serializes status read-modify-write per cluster.
    status_locks: DashMap<String, Arc<tokio::sync::Mutex<()>>>,
    /// Allocatable resources last stored per cluster, so unchanged reports cost no write.
    pub(crate) known_allocatable: DashMap<String, std::collections::BTreeMap<String, String>>,
    /// Serializes joins per cluster name, so two keys cannot both adopt a pre-created cluster.
    join_locks: DashMap<String, Arc<tokio::sync::Mutex<()>>>,
    /// Bounds the status writes that streams start beside themselves (heartbeats, allocatable
    /// resources), so 10,000 connecting clusters queue here rather than at the store.
    pub(crate) store_writes: tokio::sync::Semaphore,
}

impl<S, W> Shared<S, W> {
    /// Whether `stream` is still the registered stream of `name` (not revoked, replaced or
    /// closed).
    pub(crate) fn is_current(&self, name: &str, stream: u64) -> bool {
        self.streams.get(name).is_some_and(|e| e.id == stream)
    }
}

/// Status writes started by streams that run at once ([`Shared::store_writes`]).
const CONCURRENT_STORE_WRITES: usize = 32;

/// `PERMISSION_DENIED` for a cluster the hub no longer trusts, with
/// [`flower_addon_proto::CLUSTER_STATE_KEY`] = `state` so the agent stops its SuperNodes.
pub(crate) fn refused(state: &'static str, message: String) -> Status {
    let mut metadata = tonic::metadata::MetadataMap::new();
    metadata.insert(
        flower_addon_proto::CLUSTER_STATE_KEY,
        tonic::metadata::MetadataValue::from_static(state),
    );
    Status::with_metadata(tonic::Code::PermissionDenied, message, metadata)
}

// === impl Shared ===

impl<S: ClusterStore, W: WorkSource> Shared<S, W> {
    /// Checks that a verified certificate still speaks for an accepted cluster bound to its key.
    /// The store's cache answers "yes" without a request (a connect storm of 10,000 agents costs
    /// no reads); a "no", or a cluster the cache does not hold, is decided by a fresh read.
    pub(crate) async fn authorize(
        &self,
        identity: Option<&tls::PeerIdentity>,
    ) -> Result<ClusterRecord, Status> {
        let Some(identity) = identity else {
            return Err(Status::unauthenticated(
                "this call needs the client certificate from `flower-agent join`; none was presented",
            ));
        };
        if let Some(record) = self.store.cached_cluster(&identity.cluster_name)
            && check_authorized(&record, identity).is_ok()
        {
            return Ok(record);
        }
        self.authorize_fresh(identity).await
    }

    /// [`Shared::authorize`] from a fresh read of the store.
    async fn authorize_fresh(&self, identity: &tls::PeerIdentity) -> Result<ClusterRecord, Status> {
        let name = &identity.cluster_name;
        let record = self
            .store
            .get_cluster(name)
            .await
            .map_err(|e| internal("reading the cluster", e))?
            .ok_or_else(|| {
                refused(
                    flower_addon_proto::CLUSTER_DELETED,
                    format!(
                        "cluster {name:?} is not registered with this hub (deleted?): join again with a new token"
                    ),
                )
            })?;
        check_authorized(&record, identity)?;
        Ok(record)
    }

    /// Holds the join lock of cluster `name` while the guard lives.
    pub(crate) async fn lock_join(&self, name: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self
            .join_locks
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
            .clone();
        lock.lock_owned().await
    }

    /// Read-modify-write of a cluster's status, serialized per cluster
    /// ([`ClusterStore::update_status`]).
    pub(crate) async fn update_status(
        &self,
        name: &str,
        update: impl FnMut(&mut ClusterStatus) + Send,
    ) -> Result<(), StoreError> {
        let lock = self
            .status_locks
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
            .clone();
        let _guard = lock.lock().await;
        self.store.update_status(name, update).await
    }
}

/// Whether `record` lets the holder of `identity` in: bound to its key, and accepted.
fn check_authorized(record: &ClusterRecord, identity: &tls::PeerIdentity) -> Result<(), Status> {
    let name = &identity.cluster_name;
    if !record.registration.binds(&identity.key_fingerprint) {
        return Err(refused(
            flower_addon_proto::CLUSTER_REKEYED,
            format!(
                "this certificate's key is not the one cluster {name:?} is registered with: join again"
            ),
        ));
    }
    if !record.hub_accepts_client {
        return Err(refused(
            flower_addon_proto::CLUSTER_NOT_ACCEPTED,
            format!(
                "cluster {name:?} is not accepted by the hub: run `flower-hub accept {name}` on the hub"
            ),
        ));
    }
    Ok(())
}

/// Maps an internal failure to an INTERNAL status, logging the detail.
pub(crate) fn internal(what: &str, error: impl std::fmt::Display) -> Status {
    tracing::error!(%error, "{what} failed");
    Status::internal(format!("{what} failed on the hub; see the hub log"))
}

/// The channel server, generic over the store and the work source.
pub struct ChannelServer<S, W> {
    shared: Arc<Shared<S, W>>,
}

impl<S: ClusterStore, W: WorkSource> ChannelServer<S, W> {
    /// A server over `store` and `work`, signing with `ca`.
    pub fn new(store: Arc<S>, work: Arc<W>, ca: Arc<HubCa>, config: ChannelConfig) -> Self {
        let limiter = limits::RateLimiter::new(config.join_burst, config.join_per_second);
        Self {
            shared: Arc::new(Shared {
                store,
                work,
                ca_bundle_sha256: ca.bundle_sha256(),
                ca,
                config,
                limiter,
                streams: DashMap::new(),
                next_stream_id: AtomicU64::new(1),
                leases: DashMap::new(),
                status_locks: DashMap::new(),
                known_allocatable: DashMap::new(),
                join_locks: DashMap::new(),
                store_writes: tokio::sync::Semaphore::new(CONCURRENT_STORE_WRITES),
            }),
        }
    }

    /// Number of clusters with an open work stream.
    pub fn connected(&self) -> usize {
        self.shared.streams.len()
    }

    /// A handle that reports the number of open work streams, usable after `serve` took `self`.
    pub fn connected_counter(&self) -> impl Fn() -> usize + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.streams.len()
    }

    /// Serves on `listeners` until `shutdown` completes; then closes every work stream
    /// (UNAVAILABLE, agents reconnect) and the listeners, and returns.
    pub async fn serve(
        self,
        listeners: Vec<TcpListener>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ChannelError> {
        let shared = self.shared;
        let config = &shared.config;
        let server_cert = shared
            .ca
            .issue_server_cert(&config.advertise, config.server_cert_validity)?;
        let tls_config = tls::server_config(&shared.ca, &server_cert)?;
        let addresses: Vec<String> = listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .map(|a| a.to_string())
            .collect();

        let (stop_tx, stop_rx) = watch::channel(false);
        let (conn_tx, conn_rx) = mpsc::channel(1024);
        tls::spawn_acceptors(
            listeners,
            tls_config,
            config.handshake_timeout,
            conns::Gate::new(config.connections.clone()),
            conn_tx,
            stop_rx.clone(),
        );
        work::spawn_revocation_watcher(shared.clone(), stop_rx.clone());
        lease::spawn_lease_checker(shared.clone(), stop_rx.clone());
        {
            let shared = shared.clone();
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(60));
                loop {
                    tokio::select! {
                        _ = stop.wait_for(|s| *s) => break,
                        _ = tick.tick() => shared.limiter.forget_idle(Duration::from_secs(600)),
                    }
                }
            });
        }

        let registration = RegistrationServer::new(registration::RegistrationService {
            shared: shared.clone(),
        })
        .max_decoding_message_size(config.max_message_bytes);
        let work_service = WorkServer::new(work::WorkService {
            shared: shared.clone(),
        })
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes.max(16 * 1024 * 1024));

        tracing::info!(addresses = ?addresses, ca_hash = %shared.ca.hash(), "work channel listening");
        let shared_for_stop = shared.clone();
        let signal = async move {
            shutdown.await;
            let _ = stop_tx.send(true);
            // Close every work stream so graceful shutdown does not wait for them.
            let names: Vec<String> = shared_for_stop
                .streams
                .iter()
                .map(|e| e.key().clone())
                .collect();
            for name in names {
                if let Some((_, entry)) = shared_for_stop.streams.remove(&name) {
                    entry.stop(Status::unavailable(
                        "the hub is shutting down; reconnect later",
                    ));
                }
            }
        };
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(config.keepalive_interval))
            .http2_keepalive_timeout(Some(config.keepalive_timeout))
            .max_concurrent_streams(Some(64))
            .add_service(registration)
            .add_service(work_service)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::ReceiverStream::new(conn_rx),
                signal,
            )
            .await?;
        tracing::info!("work channel stopped");
        Ok(())
    }
}

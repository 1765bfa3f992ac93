//! A client for the SuperLink's Control API, in both of Flower's dialects, so the hub registers
//! and unregisters SuperNode keys and reads node and run state without spawning `flwr`.
//!
//! - classic (Flower < 1.35): gRPC service `flwr.proto.Control` on `--control-api-address`;
//! - unified (Control on HTTP from 1.37; everything on one port from 1.40): the same protobuf
//!   messages as the body of `POST /v1/control/<method>` (`content-type: application/protobuf`),
//!   errors as JSON `{"code": N, "detail": "…"}` with an HTTP status (Flower's
//!   `supercore/protobuf/translation.py` and `supercore/error/http.py`).
//!
//! TLS is verified against the CA that signed the SuperLink certificate (the hub's), with the
//! name the hub dials; an insecure Federation's SuperLink is spoken to in plaintext.
use super::keys::{self, KeyError};
pub use crate::core::nodekeys::ListedNode;
use flower_addon_crds::render::FlowerDialect;
use flower_addon_proto::flwr;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use prost::Message;
use prost::bytes::Bytes;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use std::sync::{Arc, Mutex};
use std::time::Duration;
mod over_http;
use over_http::{HttpTransport, http_error};

/// How long one Control call (connect included) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest Control response read (a node list of ~100k entries).
const MAX_RESPONSE: usize = 64 << 20;
/// Concurrent calls when registering or unregistering many keys. Measured with
/// `control_bench` (1,000 keys): Flower 1.42 took 5.9 s at 1, 6.2 s at 2, 6.9 s at 4, 11.1 s at
/// 64 (its Python handlers serialise on SQLite); 1.25 took 2.7 s at 1 and 1.8 s at 2.
pub const BATCH_CONCURRENCY: usize = 2;

/// Where and how to reach one SuperLink's Control API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlEndpoint {
    /// Which API shape the SuperLink speaks.
    pub dialect: FlowerDialect,
    /// `host:port` of the Control API.
    pub address: String,
    /// The name verified in the SuperLink certificate (a DNS name or an IP address).
    pub server_name: String,
    /// PEM of the CA that signed the SuperLink certificate; `None` for an insecure SuperLink.
    pub ca_pem: Option<String>,
    /// How to reach `address` when it is not a TCP address the hub can dial: a port-forward
    /// through the Kubernetes API server to a SuperLink that listens on its pod's loopback only.
    /// `None`: TCP to `address`.
    pub tunnel: Option<Tunnel>,
}

/// A stream being opened by an [`Opener`].
pub type Opening<'a> =
    std::pin::Pin<Box<dyn Future<Output = std::io::Result<Box<dyn IoStream>>> + Send + 'a>>;

/// Opens byte streams to a Control API the hub cannot dial over TCP (TLS, when the endpoint has
/// a CA, runs over the stream as it would over TCP).
pub trait Opener: Send + Sync {
    /// One new stream to the Control API.
    fn open(&self) -> Opening<'_>;
}

/// An [`Opener`] with the text that identifies where it leads (endpoints compare by it).
#[derive(Clone)]
pub struct Tunnel {
    /// Where the tunnel leads, e.g. `port-forward team/fed-superlink-0:9093`.
    pub describe: String,
    /// Opens the streams.
    pub opener: Arc<dyn Opener>,
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe)
    }
}

impl PartialEq for Tunnel {
    fn eq(&self, other: &Self) -> bool {
        self.describe == other.describe
    }
}

impl Eq for Tunnel {}

/// A refused or failed Control call.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The SuperLink could not be reached (not running yet, wrong address, TLS failure).
    #[error("cannot reach the SuperLink Control API at {address}: {detail}")]
    Connect {
        /// `host:port` dialled.
        address: String,
        /// What failed.
        detail: String,
    },
    /// The SuperLink answered with an error.
    #[error("SuperLink Control API {method} at {address}: {detail}")]
    Refused {
        /// The method.
        method: &'static str,
        /// `host:port`.
        address: String,
        /// What kind of refusal.
        kind: Refusal,
        /// The SuperLink's message.
        detail: String,
    },
    /// The answer could not be decoded.
    #[error("SuperLink Control API {method} at {address}: unreadable answer: {detail}")]
    Protocol {
        /// The method.
        method: &'static str,
        /// `host:port`.
        address: String,
        /// What was wrong.
        detail: String,
    },
    /// The endpoint's TLS settings are unusable.
    #[error("SuperLink Control API TLS settings: {0}")]
    Tls(String),
    /// A reported key cannot be registered.
    #[error(transparent)]
    Key(#[from] KeyError),
}

impl ControlError {
    /// Whether the SuperLink failed the call unexpectedly ([`Refusal::Internal`]).
    pub fn is_internal(&self) -> bool {
        matches!(
            self,
            Self::Refused {
                kind: Refusal::Internal,
                ..
            }
        )
    }
}

/// What kind of refusal the SuperLink gave (both dialects map onto these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The key is registered already (`Public key already in use`).
    AlreadyExists,
    /// No such node (or run).
    NotFound,
    /// The SuperLink failed unexpectedly (HTTP 500, gRPC `INTERNAL`/`UNKNOWN`): it logged the
    /// cause and answered a bare "Internal server error" ([`super::diagnose`] reads the log).
    Internal,
    /// Anything else.
    Other,
}

/// The outcome of registering one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registration {
    /// Newly registered with this node id.
    Registered(u64),
    /// The SuperLink knew the key already (idempotent success).
    AlreadyRegistered,
}

/// One run the SuperLink lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSummary {
    /// The run id.
    pub run_id: u64,
    /// `pending`, `starting`, `running` or `finished:<sub-status>`.
    pub status: String,
    /// The app (`publisher/name`).
    pub fab_id: String,
    /// SHA-256 of the run's FAB.
    pub fab_hash: String,
    /// Flower's details of the status (the error of a failed run).
    pub details: String,
    /// When Flower set the run running (Flower's timestamp text; empty before).
    pub running_at: String,
    /// When it finished (empty before).
    pub finished_at: String,
    /// The run config it was started with (`override_config`), each value as text.
    pub config: std::collections::BTreeMap<String, String>,
}

/// A Control API client for one SuperLink. Cheap to keep; connections are reused.
pub struct ControlClient {
    endpoint: ControlEndpoint,
    transport: Transport,
}

enum Transport {
    Grpc(flwr::control_client::ControlClient<tonic::transport::Channel>),
    Http(HttpTransport),
}

impl ControlClient {
    /// A client for `endpoint`; nothing is dialled until the first call.
    pub fn new(endpoint: ControlEndpoint) -> Result<Self, ControlError> {
        let tls = match &endpoint.ca_pem {
            Some(ca) => Some((
                tls_config(ca, endpoint.dialect)?,
                ServerName::try_from(endpoint.server_name.clone()).map_err(|e| {
                    ControlError::Tls(format!(
                        "invalid server name {:?}: {e}",
                        endpoint.server_name
                    ))
                })?,
            )),
            None => None,
        };
        let transport = if endpoint.dialect.control_over_http() {
            Transport::Http(HttpTransport {
                address: endpoint.address.clone(),
                tunnel: endpoint.tunnel.clone(),
                tls,
                idle: Mutex::new(Vec::new()),
            })
        } else {
            Transport::Grpc(grpc_client(
                &endpoint.address,
                endpoint.tunnel.clone(),
                tls,
            )?)
        };
        Ok(Self {
            endpoint,
            transport,
        })
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &ControlEndpoint {
        &self.endpoint
    }

    /// Registers one SuperNode public key (an OpenSSH line). A key the SuperLink already knows
    /// is success ([`Registration::AlreadyRegistered`]).
    pub async fn register_node(&self, openssh_line: &str) -> Result<Registration, ControlError> {
        let pem = keys::openssh_to_spki_pem(openssh_line)?;
        let request = flwr::RegisterNodeRequest {
            public_key: pem.into_bytes(),
        };
        let answer: Result<flwr::RegisterNodeResponse, _> = match &self.transport {
            Transport::Grpc(c) => {
                let mut c = c.clone();
                self.grpc("RegisterNode", c.register_node(request)).await
            }
            Transport::Http(h) => h.call("register-node", &request).await,
        };
        match answer {
            Ok(r) => Ok(Registration::Registered(r.node_id)),
            Err(ControlError::Refused {
                kind: Refusal::AlreadyExists,
                ..
            }) => Ok(Registration::AlreadyRegistered),
            Err(e) => Err(e),
        }
    }

    /// Unregisters a node; one the SuperLink does not know is success.
    pub async fn unregister_node(&self, node_id: u64) -> Result<(), ControlError> {
        let request = flwr::UnregisterNodeRequest { node_id };
        let answer: Result<flwr::UnregisterNodeResponse, _> = match &self.transport {
            Transport::Grpc(c) => {
                let mut c = c.clone();
                self.grpc("UnregisterNode", c.unregister_node(request))
                    .await
            }
            Transport::Http(h) => h.call("unregister-node", &request).await,
        };
        match answer {
            Ok(_)
            | Err(ControlError::Refused {
                kind: Refusal::NotFound,
                ..
            }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every node the SuperLink knows, with its state.
    pub async fn list_nodes(&self) -> Result<Vec<ListedNode>, ControlError> {
        let request = flwr::ListNodesRequest {};
        let answer: flwr::ListNodesResponse = match &self.transport {
            Transport::Grpc(c) => {
                let mut c = c.clone();
                self.grpc("ListNodes", c.list_nodes(request)).await?
            }
            Transport::Http(h) => h.call("list-nodes", &request).await?,
        };
        let now = answer.now;
        Ok(answer
            .nodes_info
            .into_iter()
            .map(|n| ListedNode {
                node_id: n.node_id,
                status: n.status,
                public_key_der: keys::pem_to_der(&n.public_key),
                last_contact_age: crate::core::nodekeys::contact_age(
                    &now,
                    n.online_until,
                    n.heartbeat_interval,
                ),
                heartbeat_interval: (n.heartbeat_interval.is_finite()
                    && n.heartbeat_interval > 0.0)
                    .then(|| Duration::try_from_secs_f64(n.heartbeat_interval).ok())
                    .flatten(),
            })
            .collect())
    }

    /// Every run the SuperLink knows, oldest id first.
    pub async fn list_runs(&self) -> Result<Vec<RunSummary>, ControlError> {
        let request = flwr::ListRunsRequest { run_id: None };
        let answer: flwr::ListRunsResponse = match &self.transport {
            Transport::Grpc(c) => {
                let mut c = c.clone();
                self.grpc("ListRuns", c.list_runs(request)).await?
            }
            Transport::Http(h) => h.call("list-runs", &request).await?,
        };
        let mut runs: Vec<RunSummary> = answer
            .run_dict
            .into_iter()
            .map(|(id, run)| {
                let status = run.status.unwrap_or_default();
                RunSummary {
                    run_id: id,
                    status: match status.sub_status.as_str() {
                        "" => status.status,
                        sub => format!("{}:{sub}", status.status),
                    },
                    fab_id: run.fab_id,
                    fab_hash: run.fab_hash,
                    details: status.details,
                    running_at: run.running_at,
                    finished_at: run.finished_at,
                    config: run
                        .override_config
                        .into_iter()
                        .map(|(k, v)| (k, runs::scalar_text(&v)))
                        .collect(),
                }
            })
            .collect();
        runs.sort_by_key(|r| r.run_id);
        Ok(runs)
    }

    async fn grpc<T>(
        &self,
        method: &'static str,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, ControlError> {
        let address = self.endpoint.address.clone();
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Err(_) => Err(ControlError::Connect {
                address,
                detail: format!("{method} timed out after {} s", CALL_TIMEOUT.as_secs()),
            }),
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(status)) => Err(grpc_error(method, address, &status)),
        }
    }
}

fn grpc_error(method: &'static str, address: String, status: &tonic::Status) -> ControlError {
    use tonic::Code;
    let detail = status.message().to_owned();
    let kind = match status.code() {
        Code::Unavailable => {
            return ControlError::Connect {
                address,
                detail: flower_addon_runtime::tls::error_chain(status),
            };
        }
        // Flower < 1.35 says "Public key already in use" with FAILED_PRECONDITION.
        Code::AlreadyExists => Refusal::AlreadyExists,
        Code::FailedPrecondition if detail.contains("already in use") => Refusal::AlreadyExists,
        Code::NotFound => Refusal::NotFound,
        Code::Internal | Code::Unknown => Refusal::Internal,
        _ => Refusal::Other,
    };
    ControlError::Refused {
        method,
        address,
        kind,
        detail,
    }
}

fn tls_config(
    ca_pem: &str,
    dialect: FlowerDialect,
) -> Result<Arc<rustls::ClientConfig>, ControlError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| ControlError::Tls(format!("CA bundle: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| ControlError::Tls(format!("CA bundle: {e}")))?;
    }
    if roots.is_empty() {
        return Err(ControlError::Tls(
            "the CA bundle holds no certificate".into(),
        ));
    }
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ControlError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = if dialect.control_over_http() {
        vec![b"http/1.1".to_vec()]
    } else {
        vec![b"h2".to_vec()]
    };
    Ok(Arc::new(config))
}

/// Dials `address` (TCP, no delay), then TLS with `tls` when given; the Control client and the
/// Fleet front's upstream connections both use it.
/// Opens a stream to `address` (`host:port`, or `unix:<path>` for a Unix socket), TLS on top
/// when `tls` is given.
pub(super) async fn dial(
    address: &str,
    tls: &Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
) -> std::io::Result<Box<dyn IoStream>> {
    dial_via(None, address, tls).await
}

/// [`dial`], through `tunnel` when there is one.
async fn dial_via(
    tunnel: Option<&Tunnel>,
    address: &str,
    tls: &Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
) -> std::io::Result<Box<dyn IoStream>> {
    let stream: Box<dyn IoStream> = match (tunnel, address.strip_prefix("unix:")) {
        (Some(tunnel), _) => tunnel.opener.open().await?,
        // A standalone SuperLink in its own network namespace, through its bridge's socket.
        (None, Some(path)) => Box::new(tokio::net::UnixStream::connect(path).await?),
        (None, None) => {
            let tcp = tokio::net::TcpStream::connect(address).await?;
            tcp.set_nodelay(true)?;
            Box::new(tcp)
        }
    };
    Ok(match tls {
        Some((config, name)) => Box::new(
            tokio_rustls::TlsConnector::from(config.clone())
                .connect(name.clone(), stream)
                .await?,
        ),
        None => stream,
    })
}

/// A byte stream a Control client speaks over (TCP, TLS, a port-forward).
pub trait IoStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> IoStream for T {}

fn grpc_client(
    address: &str,
    tunnel: Option<Tunnel>,
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
) -> Result<flwr::control_client::ControlClient<tonic::transport::Channel>, ControlError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{address}"))
        .map_err(|e| ControlError::Tls(format!("address {address:?}: {e}")))?
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT);
    let address = address.to_owned();
    let tls = Arc::new(tls);
    let connector = tower::service_fn(move |_uri: http::Uri| {
        let (address, tunnel, tls) = (address.clone(), tunnel.clone(), tls.clone());
        async move {
            let io = dial_via(tunnel.as_ref(), &address, &tls).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(io))
        }
    });
    let channel = endpoint.connect_with_connector_lazy(connector);
    Ok(flwr::control_client::ControlClient::new(channel))
}

mod runs;
pub use runs::{LogChunk, LogStream, config_text, scalar_text};

#[cfg(test)]
mod tests;

//! The Fleet front: what SuperNodes reach of a unified-dialect SuperLink.
//!
//! From Flower 1.40 one HTTP(S) server serves the Fleet, Control and Runtime APIs. Whoever reaches
//! the Control API can run code on every SuperNode of the Federation (open-source Flower does not
//! authenticate it), so the port SuperNodes dial must not serve it. The front listens where
//! SuperNodes dial, with the SuperLink's own certificate, passes Fleet API requests
//! (`/v1/fleet/<method>`) and `GET /health` to the SuperLink, and answers everything else `403`
//! without contacting it. The classic dialect needs no front: Fleet and Control are separate
//! ports there, and only Fleet is exposed.
//!
//! It runs as a sidecar of the SuperLink pod (`flower-hub fleet-front`) and as a task of the
//! standalone hub. One upstream connection per SuperNode connection (HTTP/1.1 is sequential per
//! connection); bodies stream through untouched (SuperNode authentication signs requests, not
//! TLS sessions, so it passes as is).
//!
//! # Bounds
//!
//! The port is open to anyone on the network, so the front holds every client to
//! [`FrontLimits`] (the defaults are quoted below; `flower-hub fleet-front --help` names the
//! flags that change them):
//!
//! - **Per address.** Connections are counted by [`PeerKey`]: the IPv4 address, or the /64 of an
//!   IPv6 address (a host holds a whole /64, so counting single IPv6 addresses would cap
//!   nothing); an IPv4-mapped IPv6 peer counts as its IPv4 address. An address holds at most 64
//!   connections at once, or 1,024 once it is *known* (below): many SuperNodes may share one
//!   address behind NAT. A connection over the cap is closed at once, before any TLS.
//! - **Bodies.** A request body larger than Flower's own largest message (2 GiB - 1,
//!   [`limits::FLOWER_MAX_MESSAGE_BYTES`]) is answered `413`: by its `Content-Length` before
//!   the SuperLink is contacted, or, streamed, as soon as it passes the limit, with the upstream
//!   request aborted and no byte beyond the limit passed on. A body must complete within 120 s
//!   of its first read and may go at most 30 s without a byte; otherwise `408` and the upstream
//!   request is aborted. Either way the connection is closed after the answer.
//! - **Idle and slow clients.** A connection waits at most 30 s for the complete headers of its
//!   next request (so an idle kept-alive connection is closed after 30 s), 10 s for its TLS
//!   handshake, and a client that takes no byte of its response for 30 s is disconnected.
//! - **Reserve.** 16,384 connections at once in all. An address is known for 24 h after the
//!   SuperLink answered one of its Fleet requests (not `/health`) with a 2xx — with SuperNode
//!   authentication only a registered SuperNode's signed requests get one. Addresses that are
//!   not known share 16,384 - 4,096 connections; the 4,096 left are for known addresses only,
//!   so a flood from new addresses cannot lock out SuperNodes that were working before it.
//!   Known addresses live in memory (at most 65,536, the oldest forgotten first), so a
//!   restarted front starts with an empty reserve.
//!
//! Note that behind a source NAT (a `NodePort`/`LoadBalancer` Service with
//! `externalTrafficPolicy: Cluster` rewrites client addresses to a node's) every client looks
//! like the node: the per-address caps then apply to all of them together.
mod admission;
mod body;
pub mod limits;
pub mod sessions;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1 as client;
use hyper::server::conn::http1 as server;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prost::bytes::Bytes;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::JoinSet;

pub use admission::PeerKey;
use admission::{Admission, Refusal, Slot};
pub use body::BodyCut;
use body::{LimitedBody, StallGuard};
pub use limits::{FrontLimits, LimitsError};
use sessions::RecentKeys;

/// How often at most the front logs a summary of the connections it refused.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Whether the front passes a request for `path` on: the Fleet API (`/v1/fleet/<method>`,
/// lowercase letters, digits, `-` and `_`) and `/health`. Anything else — the Control API
/// (`/v1/control/…`), the Runtime API, dot segments, percent-encodings — is refused.
pub fn allowed(path: &str) -> bool {
    if path == "/health" {
        return true;
    }
    path.strip_prefix("/v1/fleet/").is_some_and(|method| {
        !method.is_empty()
            && method
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    })
}

/// A front's TLS: the SuperLink's own certificate towards SuperNodes, and its CA to verify the
/// SuperLink behind it.
#[derive(Clone)]
pub struct FrontTls {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    upstream_name: ServerName<'static>,
}

impl std::fmt::Debug for FrontTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontTls")
            .field("upstream_name", &self.upstream_name)
            .finish_non_exhaustive()
    }
}

/// Unusable front settings.
#[derive(Debug, thiserror::Error)]
#[error("fleet front TLS: {0}")]
pub struct FrontError(String);

impl FrontTls {
    /// TLS from the SuperLink's PEM files (`ca.crt`, `tls.crt`, `tls.key` of its Secret); the
    /// SuperLink behind the front is verified as `upstream_name` (its certificate has
    /// `127.0.0.1`).
    pub fn from_pem(
        ca: &str,
        cert: &str,
        key: &str,
        upstream_name: &str,
    ) -> Result<Self, FrontError> {
        let bad = |what: &str, e: &dyn std::fmt::Display| FrontError(format!("{what}: {e}"));
        let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("certificate", &e))?;
        if chain.is_empty() {
            return Err(FrontError(
                "the certificate file holds no certificate".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| bad("key", &e))?;
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("protocol versions", &e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| bad("certificate and key", &e))?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(ca.as_bytes()) {
            roots
                .add(ca.map_err(|e| bad("CA bundle", &e))?)
                .map_err(|e| bad("CA bundle", &e))?;
        }
        if roots.is_empty() {
            return Err(FrontError("the CA bundle holds no certificate".into()));
        }
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("protocol versions", &e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        let upstream_name =
            ServerName::try_from(upstream_name.to_owned()).map_err(|e| bad("upstream name", &e))?;
        Ok(Self {
            server: Arc::new(server),
            client: Arc::new(client),
            upstream_name,
        })
    }
}

/// What one front serves (its bounds are [`FrontLimits`], given to [`serve_with_limits`]).
#[derive(Clone, Debug)]
pub struct FrontConfig {
    /// The SuperLink's own server (`host:port`), normally on loopback.
    pub upstream: String,
    /// `None` for an insecure Federation (plaintext on both sides).
    pub tls: Option<FrontTls>,
}

type Body = BoxBody<Bytes, hyper::Error>;
/// The request body as it goes to the SuperLink.
type Upstream = client::SendRequest<LimitedBody<Incoming>>;

/// What every connection of one front shares.
struct Front {
    config: FrontConfig,
    limits: FrontLimits,
    admission: Arc<Admission>,
    sessions: RecentKeys,
}

/// Serves `listener` with the default [`FrontLimits`] until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    config: FrontConfig,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with_limits(listener, config, FrontLimits::default(), shutdown).await
}

/// Serves `listener` within `limits` until `shutdown` completes; then the connections still
/// open are closed too. Limits that fail [`FrontLimits::check`] are an `InvalidInput` error.
pub async fn serve_with_limits(
    listener: TcpListener,
    config: FrontConfig,
    limits: FrontLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    limits
        .check()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let admission = Arc::new(Admission::new(&limits));
    let front = Arc::new(Front {
        config,
        limits,
        admission: admission.clone(),
        sessions: RecentKeys::default(),
    });
    // Dropped on return, which aborts every connection still open.
    let mut connections = JoinSet::new();
    let mut refusals = Refusals::default();
    tokio::pin!(shutdown);
    loop {
        // With every place taken nobody can be admitted: leave new connections in the listen
        // backlog until one is freed, as a full server would.
        if admission.is_full() {
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                () = admission.freed() => {}
                Some(_) = connections.join_next() => {}
            }
            continue;
        }
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            Some(_) = connections.join_next() => continue,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "fleet front: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let key = PeerKey::of(peer.ip());
        match admission.admit(key) {
            Ok(slot) => {
                let front = front.clone();
                connections.spawn(connection(tcp, peer, slot, front));
            }
            Err(refusal) => {
                tracing::debug!(%peer, address = %key, ?refusal, "fleet front: connection refused");
                drop(tcp);
                refusals.count(refusal);
            }
        }
    }
}

/// Refused connections, logged as a summary (at most every [`REFUSAL_LOG_EVERY`]) so a flood
/// does not flood the log.
#[derive(Debug, Default)]
struct Refusals {
    address_full: u64,
    shared_full: u64,
    logged: Option<tokio::time::Instant>,
}

impl Refusals {
    fn count(&mut self, refusal: Refusal) {
        match refusal {
            Refusal::AddressFull => self.address_full += 1,
            Refusal::SharedFull => self.shared_full += 1,
        }
        let now = tokio::time::Instant::now();
        if self
            .logged
            .is_some_and(|at| now.duration_since(at) < REFUSAL_LOG_EVERY)
        {
            return;
        }
        tracing::warn!(
            over_address_cap = self.address_full,
            shared_share_full = self.shared_full,
            "fleet front: connections refused (an address over its cap, or the share open to addresses without a recent successful Fleet request taken)"
        );
        *self = Self {
            logged: Some(now),
            ..Self::default()
        };
    }
}

async fn connection(tcp: TcpStream, peer: SocketAddr, slot: Slot, front: Arc<Front>) {
    let _ = tcp.set_nodelay(true);
    let limits = &front.limits;
    let io = StallGuard::new(tcp, limits.stall_timeout);
    match &front.config.tls {
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
            match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(io)).await {
                Ok(Ok(stream)) => http(stream, peer, slot.key(), front.clone()).await,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "fleet front: TLS handshake failed")
                }
                Err(_) => tracing::debug!(%peer, "fleet front: TLS handshake timed out"),
            }
        }
        None => http(io, peer, slot.key(), front.clone()).await,
    }
    drop(slot);
}

async fn http<S>(io: S, peer: SocketAddr, key: PeerKey, front: Arc<Front>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let idle_timeout = front.limits.idle_timeout;
    let upstream: Arc<Mutex<Option<Upstream>>> = Arc::default();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let (front, upstream) = (front.clone(), upstream.clone());
        async move { Ok::<_, Infallible>(forward(request, peer, key, &front, &upstream).await) }
    });
    let served = server::Builder::new()
        .timer(TokioTimer::new())
        // hyper starts this clock when it waits for a request's head, so it is the idle limit
        // of a kept-alive connection too.
        .header_read_timeout(idle_timeout)
        .serve_connection(TokioIo::new(io), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "fleet front: connection ended");
    }
}

async fn forward(
    request: Request<Incoming>,
    peer: SocketAddr,
    key: PeerKey,
    front: &Front,
    upstream: &Mutex<Option<Upstream>>,
) -> Response<Body> {
    let (config, limits) = (&front.config, &front.limits);
    let path = request.uri().path();
    if !allowed(path) {
        tracing::info!(%peer, method = %request.method(), path, "fleet front: refused (not a Fleet API request)");
        return answer(
            StatusCode::FORBIDDEN,
            format!(
                "{path} is not served here: this endpoint serves Flower's Fleet API (SuperNodes) only. Reach the Control API (flwr) with `flower-hub connect`.\n"
            ),
        );
    }
    let fleet = path != "/health";
    let activation = path == sessions::ACTIVATE_PATH;
    let node_key = request
        .headers()
        .get(sessions::PUBLIC_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // A Content-Length over the limit is refused before the SuperLink hears of it.
    if request.body().size_hint().lower() > limits.max_body_bytes {
        let cut = BodyCut::TooLarge {
            max: limits.max_body_bytes,
        };
        tracing::info!(%peer, path, length = request.body().size_hint().lower(), "fleet front: refused: {cut}");
        return closing(answer(cut.status(), format!("{cut}\n")));
    }
    let cut = Arc::new(OnceLock::new());
    let request = request.map(|body| {
        LimitedBody::new(
            body,
            limits.max_body_bytes,
            limits.stall_timeout,
            limits.body_timeout,
            cut.clone(),
        )
    });
    let mut sender = upstream.lock().await;
    // Reuse the connection to the SuperLink unless it closed (the SuperLink restarted).
    let reusable = match sender.as_mut() {
        Some(s) => s.ready().await.is_ok(),
        None => false,
    };
    if !reusable {
        match open(config, limits.handshake_timeout).await {
            Ok(s) => *sender = Some(s),
            Err(e) => {
                tracing::warn!(upstream = %config.upstream, error = %e, "fleet front: cannot reach the SuperLink");
                return answer(
                    StatusCode::BAD_GATEWAY,
                    "the SuperLink is not reachable yet\n".into(),
                );
            }
        }
    }
    let Some(s) = sender.as_mut() else {
        unreachable!("set above");
    };
    match s.send_request(request).await {
        Ok(response) => {
            if fleet && response.status().is_success() {
                front.admission.mark_known(key);
                if let Some(node_key) = &node_key {
                    front.sessions.seen(node_key);
                }
            }
            if activation
                && response.status() == StatusCode::PRECONDITION_FAILED
                && let Some(ago) = node_key.as_deref().and_then(|k| front.sessions.recent(k))
            {
                return held_off(response, peer, ago).await;
            }
            response.map(|b| b.boxed())
        }
        Err(e) => {
            *sender = None;
            if let Some(cut) = cut.get() {
                // The body error aborted the upstream request (hyper closes that connection).
                tracing::info!(%peer, "fleet front: request cut off: {cut}");
                return closing(answer(cut.status(), format!("{cut}\n")));
            }
            tracing::warn!(upstream = %config.upstream, error = %e, "fleet front: the SuperLink did not answer");
            answer(
                StatusCode::BAD_GATEWAY,
                "the SuperLink did not answer\n".into(),
            )
        }
    }
}

/// Largest refusal body read to tell Flower's activation refusal from other answers.
const REFUSAL_BODY_MAX: usize = 64 << 10;

/// A refused activation of a key that was connected `ago`: when it is Flower's activation
/// refusal, `503` with `Retry-After`, so the SuperNode asks again by itself instead of exiting
/// ([`sessions`]); anything else as the SuperLink gave it.
async fn held_off(response: Response<Incoming>, peer: SocketAddr, ago: Duration) -> Response<Body> {
    let (parts, body) = response.into_parts();
    let read = tokio::time::timeout(
        Duration::from_secs(10),
        http_body_util::Limited::new(body, REFUSAL_BODY_MAX).collect(),
    )
    .await;
    let bytes = match read {
        Ok(Ok(collected)) => collected.to_bytes(),
        _ => {
            return answer(
                StatusCode::BAD_GATEWAY,
                "the SuperLink's answer could not be read\n".into(),
            );
        }
    };
    if !sessions::is_activation_refusal(&bytes) {
        return Response::from_parts(
            parts,
            Full::new(bytes).map_err(|never| match never {}).boxed(),
        );
    }
    tracing::info!(
        %peer,
        last_seen_secs = ago.as_secs(),
        "fleet front: a SuperNode that was connected {} s ago is starting again while the SuperLink still holds its last session (Flower lets it go 60 s after its last heartbeat): answering 503 so it retries instead of exiting",
        ago.as_secs()
    );
    let mut held = answer(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "this SuperNode's previous session is still held by the SuperLink (it was connected {} s ago and stopped without a goodbye); Flower lets it go 60 s after its last heartbeat: retry\n",
            ago.as_secs()
        ),
    );
    held.headers_mut().insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from(sessions::RETRY_AFTER_SECS),
    );
    held
}

fn answer(status: StatusCode, text: String) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(text))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// `response`, after which the connection is closed: the rest of the request body is not read.
fn closing(mut response: Response<Body>) -> Response<Body> {
    response.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    response
}

async fn open(config: &FrontConfig, timeout: Duration) -> std::io::Result<Upstream> {
    let tls = config
        .tls
        .as_ref()
        .map(|t| (t.client.clone(), t.upstream_name.clone()));
    let dial = async {
        let io = super::control::dial(&config.upstream, &tls).await?;
        client::handshake(TokioIo::new(io))
            .await
            .map_err(std::io::Error::other)
    };
    let (sender, conn) = tokio::time::timeout(timeout, dial)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "dialling timed out"))??;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fleet_paths_and_health_pass() {
        for ok in [
            "/health",
            "/v1/fleet/activate-node",
            "/v1/fleet/pull-messages",
            "/v1/fleet/get_fab",
        ] {
            assert!(allowed(ok), "{ok}");
        }
        for refused in [
            "/",
            "/v1/control/start-run",
            "/v1/control/list-nodes",
            "/v1/fleet/",
            "/v1/fleet/../control/start-run",
            "/v1/fleet/%2e%2e/control/start-run",
            "/v1/fleet//control",
            "/v1/fleet/Start-Run",
            "/v1/serverappio/pull-messages",
            "/v1/fleetx/a",
            "/healthz",
            "/health/",
        ] {
            assert!(!allowed(refused), "{refused}");
        }
    }
}

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
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1 as client;
use hyper::server::conn::http1 as server;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prost::bytes::Bytes;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Semaphore};

/// Time a client has for its TLS handshake, and the front for dialling the SuperLink.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to send a request's headers (also the idle limit between requests).
const HEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 16_384;

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

/// What one front serves.
#[derive(Clone, Debug)]
pub struct FrontConfig {
    /// The SuperLink's own server (`host:port`), normally on loopback.
    pub upstream: String,
    /// `None` for an insecure Federation (plaintext on both sides).
    pub tls: Option<FrontTls>,
}

type Body = BoxBody<Bytes, hyper::Error>;

/// Serves `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    config: FrontConfig,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let config = Arc::new(config);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => return Ok(()),
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => return Ok(()),
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
        let config = config.clone();
        tokio::spawn(async move {
            connection(tcp, peer, config).await;
            drop(permit);
        });
    }
}

async fn connection(tcp: TcpStream, peer: SocketAddr, config: Arc<FrontConfig>) {
    let _ = tcp.set_nodelay(true);
    match &config.tls {
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => http(stream, peer, config).await,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "fleet front: TLS handshake failed")
                }
                Err(_) => tracing::debug!(%peer, "fleet front: TLS handshake timed out"),
            }
        }
        None => http(tcp, peer, config).await,
    }
}

async fn http<S>(io: S, peer: SocketAddr, config: Arc<FrontConfig>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let upstream: Arc<Mutex<Option<client::SendRequest<Incoming>>>> = Arc::default();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let (config, upstream) = (config.clone(), upstream.clone());
        async move { Ok::<_, Infallible>(forward(request, peer, &config, &upstream).await) }
    });
    let served = server::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(io), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "fleet front: connection ended");
    }
}

async fn forward(
    request: Request<Incoming>,
    peer: SocketAddr,
    config: &FrontConfig,
    upstream: &Mutex<Option<client::SendRequest<Incoming>>>,
) -> Response<Body> {
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
    let mut sender = upstream.lock().await;
    // Reuse the connection to the SuperLink unless it closed (the SuperLink restarted).
    let reusable = match sender.as_mut() {
        Some(s) => s.ready().await.is_ok(),
        None => false,
    };
    if !reusable {
        match open(config).await {
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
        Ok(response) => response.map(|b| b.boxed()),
        Err(e) => {
            *sender = None;
            tracing::warn!(upstream = %config.upstream, error = %e, "fleet front: the SuperLink did not answer");
            answer(
                StatusCode::BAD_GATEWAY,
                "the SuperLink did not answer\n".into(),
            )
        }
    }
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

async fn open(config: &FrontConfig) -> std::io::Result<client::SendRequest<Incoming>> {
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
    let (sender, conn) = tokio::time::timeout(HANDSHAKE_TIMEOUT, dial)
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

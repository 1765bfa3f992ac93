//! TLS for the work channel, on our own tokio-rustls streams so the hub sees the verified peer
//! certificate of each connection (tonic's own TLS features are not used).
//!
//! Client certificates are optional at the TLS layer (Join runs before the agent has one) but,
//! when presented, must chain to the hub CA and be within their validity, or the handshake fails.
//! Each RPC then decides: Join ignores the identity, Renew and Connect require it.
use super::ChannelError;
use crate::registration::ca::{HubCa, IssuedKeyPair};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;

/// The identity proven by a verified client certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The cluster name the hub wrote into the certificate: its common name, or for an agent
    /// installed as an OCM addon its cluster URI SAN.
    pub cluster_name: String,
    /// `sha256:<hex>` of the certificate's SubjectPublicKeyInfo.
    pub key_fingerprint: String,
    /// End of the certificate's validity.
    pub not_after: SystemTime,
}

/// Connection facts handed to every request as a tonic request extension.
#[derive(Clone, Debug)]
pub struct PeerInfo {
    /// Remote socket address.
    pub remote: SocketAddr,
    /// Verified client identity, if the peer presented a certificate.
    pub identity: Option<Arc<PeerIdentity>>,
}

/// An accepted TLS connection that carries its [`PeerInfo`] into tonic, holds its place under
/// the connection caps ([`super::conns`]) and, when anonymous, ends at its deadline.
pub struct TlsConn {
    inner: TlsStream<TcpStream>,
    info: PeerInfo,
    _slot: super::conns::Slot,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Connected for TlsConn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(deadline) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection without a client certificate open too long",
            )));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Builds the hub's rustls server configuration: `server` certificate (chain includes the CA so
/// agents can pin it by hash during Join), optional client certificates verified against the CA,
/// ALPN `h2`.
pub fn server_config(
    ca: &HubCa,
    server: &IssuedKeyPair,
) -> Result<Arc<rustls::ServerConfig>, ChannelError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // Client certificates of every trusted CA: after a rotation's `promote`, agents still hold
    // certificates of the replaced CA until they renew.
    let mut roots = RootCertStore::empty();
    for cert in ca.bundle_der() {
        roots.add(cert).map_err(ChannelError::Tls)?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| ChannelError::Config(format!("client verifier: {e}")))?;
    let cert = CertificateDer::from_pem_slice(server.cert_pem.as_bytes())
        .map_err(|e| ChannelError::Config(format!("server certificate: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes())
        .map_err(|e| ChannelError::Config(format!("server key: {e}")))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(ChannelError::Tls)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert, ca.cert_der().clone()], key)
        .map_err(ChannelError::Tls)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Parses the verified end-entity certificate of a peer into its identity.
pub fn peer_identity(cert: &CertificateDer<'_>) -> Option<PeerIdentity> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let common_name = parsed
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    // An agent installed as an OCM addon: its cluster is in the URI SAN (the common name is the
    // same for every cluster, see `HubCa::sign_ocm_addon_csr`). Only the hub issues
    // certificates this verifier accepts, so the SAN is the hub's own statement.
    let cluster_name = if common_name == flower_addon_proto::OCM_ADDON_AGENT_CN {
        ocm_addon_cluster(&parsed)?
    } else {
        common_name
    };
    let not_after = SystemTime::UNIX_EPOCH
        + Duration::from_secs(u64::try_from(parsed.validity().not_after.timestamp()).ok()?);
    Some(PeerIdentity {
        cluster_name,
        key_fingerprint: crate::registration::ca::spki_fingerprint(
            parsed.tbs_certificate.subject_pki.raw,
        ),
        not_after,
    })
}

/// The cluster named by the URI SAN [`flower_addon_proto::OCM_ADDON_CLUSTER_URI_PREFIX`]`<cluster>`
/// of an addon agent's certificate (exactly one such SAN, or none is taken).
fn ocm_addon_cluster(cert: &x509_parser::certificate::X509Certificate<'_>) -> Option<String> {
    let san = cert.subject_alternative_name().ok()??;
    let mut clusters = san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::URI(uri) => {
                uri.strip_prefix(flower_addon_proto::OCM_ADDON_CLUSTER_URI_PREFIX)
            }
            _ => None,
        });
    let cluster = clusters.next()?;
    (clusters.next().is_none() && !cluster.is_empty()).then(|| cluster.to_string())
}

/// Accepts TCP connections on every listener, runs the TLS handshakes (each bounded by
/// `handshake_timeout`) and sends finished connections to `out`, until `stop` turns true. A
/// connection over a cap of `gate` is closed at once ([`super::conns`]).
pub(crate) fn spawn_acceptors(
    listeners: Vec<TcpListener>,
    config: Arc<rustls::ServerConfig>,
    handshake_timeout: Duration,
    gate: Arc<super::conns::Gate>,
    out: mpsc::Sender<Result<TlsConn, io::Error>>,
    stop: watch::Receiver<bool>,
) {
    let acceptor = TlsAcceptor::from(config);
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for listener in listeners {
        let acceptor = acceptor.clone();
        let out = out.clone();
        let gate = gate.clone();
        let refused = refused.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    accepted = listener.accept() => accepted,
                };
                let (tcp, remote) = match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Some(slot) = gate.accept(remote.ip()) else {
                    // One line per 1,000 refusals: a flood must not become a log flood.
                    let n = refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if n.is_multiple_of(1000) {
                        tracing::warn!(%remote, refused = n + 1, anonymous = gate.anonymous_open(), "connection refused: too many handshakes overall, or connections without a client certificate from this address");
                    }
                    drop(tcp);
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let out = out.clone();
                let gate = gate.clone();
                tokio::spawn(async move {
                    let first_byte = gate.limits().first_byte_timeout;
                    let mut peeked = [0u8; 1];
                    match tokio::time::timeout(first_byte, tcp.peek(&mut peeked)).await {
                        Ok(Ok(n)) if n > 0 => {}
                        // Closed, failed, or silent: a TCP probe or a flood.
                        Ok(_) => return,
                        Err(_) => {
                            tracing::debug!(%remote, "no TLS byte in time; closed");
                            return;
                        }
                    }
                    let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp))
                        .await
                    {
                        Ok(Ok(tls)) => tls,
                        // A connection closed before any TLS byte is a TCP probe (the
                        // Deployment's readiness probe every 10 s, a load balancer's health
                        // check): not worth an INFO line each time.
                        Ok(Err(error)) if error.kind() == std::io::ErrorKind::UnexpectedEof => {
                            tracing::debug!(%remote, %error, "connection closed before the TLS handshake");
                            return;
                        }
                        Ok(Err(error)) => {
                            tracing::info!(%remote, %error, "TLS handshake refused");
                            return;
                        }
                        Err(_) => {
                            tracing::info!(%remote, "TLS handshake timed out");
                            return;
                        }
                    };
                    let identity = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|certs| certs.first())
                        .and_then(peer_identity)
                        .map(Arc::new);
                    let cluster = identity.as_ref().map(|id| id.cluster_name.as_str());
                    let Some(slot) = gate.settle(slot, cluster) else {
                        match cluster {
                            Some(name) => {
                                tracing::info!(%remote, cluster = %name, max = gate.limits().max_per_cluster, "connection refused: too many with this cluster's certificate")
                            }
                            None => {
                                tracing::info!(%remote, max = gate.limits().max_anonymous, "connection refused: too many without a client certificate")
                            }
                        }
                        return;
                    };
                    let deadline = identity
                        .is_none()
                        .then(|| Box::pin(tokio::time::sleep(gate.limits().anonymous_lifetime)));
                    let info = PeerInfo { remote, identity };
                    let conn = TlsConn {
                        inner: tls,
                        info,
                        _slot: slot,
                        deadline,
                    };
                    let _ = out.send(Ok(conn)).await;
                });
            }
        });
    }
}

//! Client TLS for the work channel on our own tokio-rustls streams (tonic's TLS features are not
//! used): pinning the hub CA by hash during Join, mTLS afterwards, ALPN `h2`.
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpSocket, lookup_host};
use tonic::transport::{Channel, Endpoint, Uri};

/// Errors building a TLS client or connecting.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Bad certificate/key material or rustls configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
    /// The channel could not be established.
    #[error("cannot connect to the hub at {hub}: {detail}")]
    Connect {
        /// Hub address.
        hub: String,
        /// Error chain.
        detail: String,
    },
}

/// How to reach the hub.
#[derive(Clone, Debug)]
pub struct HubAddress {
    /// `HOST:PORT` to dial.
    pub hub: String,
    /// Name the server certificate must carry.
    pub server_name: String,
    /// Local address to bind before connecting (benchmarks spread connections over several
    /// loopback addresses); `None` lets the kernel choose.
    pub local_ip: Option<IpAddr>,
}

impl HubAddress {
    /// `hub` verified against its own host name.
    pub fn new(hub: &str) -> Self {
        Self {
            hub: hub.to_string(),
            server_name: crate::render::address::host_of(hub).to_owned(),
            local_ip: None,
        }
    }
}

/// `sha256:<hex>` of a SubjectPublicKeyInfo DER: the one formula of the CA hash (`--ca-hash`,
/// what `flower-hub token create` prints) and of the key fingerprints the hub pins clusters to.
pub fn spki_fingerprint(spki_der: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(spki_der)))
}

/// [`spki_fingerprint`] of a certificate's public key (the `--ca-hash` of a CA certificate).
pub fn spki_hash(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    Some(spki_fingerprint(parsed.tbs_certificate.subject_pki.raw))
}

/// Checks the CA bundle `pem` a hub sent before it becomes the agent's trust root: PEM
/// certificates only, and one of them `trusted` (by [`spki_hash`]): at join the CA pinned with
/// `--ca-hash`, at renewal a CA trusted already. The bundle arrives over a connection whose
/// server certificate was verified against that CA, so it is the hub's word; other CAs in it are
/// the hub publishing the next CA of a rotation, or still trusting the one it replaced. A
/// bundle without any CA the agent trusts would hand its trust to someone else and is refused.
/// The error says what was received.
pub fn check_ca_bundle(pem: &str, trusted: &[String]) -> Result<(), String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the CA bundle is not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("the CA bundle holds no certificate".into());
    }
    let mut hashes = Vec::with_capacity(certs.len());
    for cert in &certs {
        hashes.push(spki_hash(cert).ok_or("a CA bundle certificate does not parse")?);
    }
    if !hashes.iter().any(|h| trusted.contains(h)) {
        return Err(format!(
            "the hub sent a CA bundle with {}, none of them a CA this agent trusts ({}): refused",
            hashes.join(", "),
            trusted.join(", ")
        ));
    }
    Ok(())
}

/// The [`spki_hash`] of every certificate of the PEM bundle `pem` (unparsable ones left out).
pub fn bundle_hashes(pem: &str) -> Vec<String> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .filter_map(Result::ok)
        .filter_map(|c| spki_hash(&c))
        .collect()
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Verifies the hub like `kubeadm join --discovery-token-ca-cert-hash`: some certificate of the
/// presented chain must have the pinned SubjectPublicKeyInfo hash, and the server certificate
/// must chain to it and carry the dialed name. On a mismatch the hashes seen are recorded so the
/// caller can say what the hub presented.
#[derive(Debug)]
pub struct PinnedCaVerifier {
    pin: String,
    provider: Arc<CryptoProvider>,
    mismatch: Arc<Mutex<Option<String>>>,
}

impl PinnedCaVerifier {
    /// A verifier for `pin` (`sha256:<hex>`); mismatches are written to `mismatch`.
    pub fn new(pin: &str, mismatch: Arc<Mutex<Option<String>>>) -> Self {
        Self {
            pin: pin.to_ascii_lowercase(),
            provider: provider(),
            mismatch,
        }
    }
}

impl ServerCertVerifier for PinnedCaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(ca) = intermediates
            .iter()
            .find(|c| spki_hash(c).as_deref() == Some(self.pin.as_str()))
        else {
            let seen: Vec<String> = intermediates.iter().filter_map(|c| spki_hash(c)).collect();
            let detail = format!(
                "the hub's CA does not match --ca-hash {}: it presented {}",
                self.pin,
                if seen.is_empty() {
                    "no CA certificate".to_string()
                } else {
                    seen.join(", ")
                }
            );
            if let Ok(mut m) = self.mismatch.lock() {
                *m = Some(detail.clone());
            }
            return Err(rustls::Error::General(detail));
        };
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let inner =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        inner.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Client config for Join: no client certificate, hub verified by the pinned CA hash.
pub fn pinned_config(
    ca_hash: &str,
    mismatch: Arc<Mutex<Option<String>>>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedCaVerifier::new(ca_hash, mismatch)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Client config for Connect/Renew: the hub CA bundle as the only root, our client certificate.
pub fn mtls_config(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| TlsError::Config(format!("CA bundle: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| TlsError::Config(format!("CA bundle: {e}")))?;
    }
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Config(format!("client certificate: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| TlsError::Config(format!("client key: {e}")))?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("client certificate: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Opens an HTTP/2 channel to the hub over our TLS (connect timeout 10 s, HTTP/2 keepalive
/// every 30 s even when idle, so a dead hub is noticed within ~40 s).
pub async fn connect(
    address: &HubAddress,
    config: Arc<rustls::ClientConfig>,
) -> Result<Channel, TlsError> {
    let err = |detail: String| TlsError::Connect {
        hub: address.hub.clone(),
        detail,
    };
    let server_name = ServerName::try_from(address.server_name.clone()).map_err(|e| {
        err(format!(
            "invalid server name {:?}: {e}",
            address.server_name
        ))
    })?;
    let endpoint = Endpoint::from_shared(format!("https://{}", address.hub))
        .map_err(|e| err(e.to_string()))?
        .connect_timeout(Duration::from_secs(10))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let hub = address.hub.clone();
    let local_ip = address.local_ip;
    let connector = tower::service_fn(move |_uri: Uri| {
        let config = config.clone();
        let server_name = server_name.clone();
        let hub = hub.clone();
        async move {
            let remote = lookup_host(hub.as_str())
                .await?
                .next()
                .ok_or_else(|| std::io::Error::other(format!("{hub} resolves to no address")))?;
            let socket = if remote.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            if let Some(ip) = local_ip {
                socket.bind((ip, 0).into())?;
            }
            let tcp = socket.connect(remote).await?;
            tcp.set_nodelay(true)?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(server_name, tcp)
                .await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    endpoint
        .connect_with_connector(connector)
        .await
        .map_err(|e| err(error_chain(&e)))
}

/// `error: cause: cause…` of an error and its sources.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        source = e.source();
    }
    out
}

#[cfg(test)]
mod bundle_tests {
    use super::*;

    fn ca_pem(name: &str) -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).expect("cert").pem()
    }

    #[test]
    fn a_ca_bundle_must_hold_the_pinned_or_trusted_ca() {
        // What a hub sends becomes the agent's trust root, so it must hold the CA the agent pinned
        // (join) or already trusts (renewal); a bundle of other CAs only is refused. A rotation's
        // next CA beside the trusted one is the hub's word and accepted.
        let pinned = ca_pem("hub");
        let other = ca_pem("other");
        let hash = bundle_hashes(&pinned);
        assert_eq!(hash.len(), 1);
        assert_eq!(check_ca_bundle(&pinned, &hash), Ok(()));
        let err = check_ca_bundle(&other, &hash).unwrap_err();
        assert!(err.contains("none of them a CA this agent trusts"), "{err}");
        let both = format!("{other}{pinned}");
        assert_eq!(check_ca_bundle(&both, &hash), Ok(()), "a rotation's bundle");
        let after_rotation = bundle_hashes(&other);
        assert_eq!(
            check_ca_bundle(&other, &bundle_hashes(&both)),
            Ok(()),
            "retired"
        );
        assert!(check_ca_bundle(&pinned, &after_rotation).is_err());
        assert!(check_ca_bundle("", &hash).is_err());
        assert!(check_ca_bundle("not pem", &hash).is_err());
    }
}

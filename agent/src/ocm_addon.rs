//! The agent installed as an Open Cluster Management addon (`flower-agent run --ocm-addon-dir`,
//! `manifests/ocm/`): it does not join. OCM's klusterlet makes its key and CSR, flower-hub signs
//! it (signer [`flower_addon_proto::OCM_ADDON_SIGNER`]), and the klusterlet keeps the pair in a
//! Secret the addon's Deployment mounts (`tls.crt`, `tls.key`). The agent reads the pair from
//! there, takes its cluster name from the certificate, and pins the hub's CA by hash (the
//! `AddOnDeploymentConfig`'s `FLOWER_HUB_CA_HASH`) as a join would. The klusterlet renews the
//! certificate with a new key before it expires; the agent rereads the pair
//! ([`RELOAD_INTERVAL`]) and uses the new one from its next connection (the hub trusts the
//! previous key meanwhile).
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::credentials::{AgentConfig, Credentials};
use crate::tls::{HubAddress, TlsError, pinned_config, spki_hash};

/// Certificate file in the directory the klusterlet's Secret is mounted at.
pub const CERT_FILE: &str = "tls.crt";
/// Private key file beside it.
pub const KEY_FILE: &str = "tls.key";
/// How often the pair is reread.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// Errors of the addon credentials.
#[derive(Debug, thiserror::Error)]
pub enum OcmAddonError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// File concerned.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The certificate is not one the hub issued to an addon agent.
    #[error("{path}: {detail}")]
    Invalid {
        /// File concerned.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The hub could not be reached, or is not the pinned one.
    #[error("{0}")]
    Hub(#[from] TlsError),
}

/// The certificate and key in `dir`, or `None` while the klusterlet has not written them.
pub fn read_pair(dir: &Path) -> Result<Option<(String, String)>, OcmAddonError> {
    let read = |name: &str| {
        let path = dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(text) if text.trim().is_empty() => Ok(None),
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(OcmAddonError::Io { path, source }),
        }
    };
    match (read(CERT_FILE)?, read(KEY_FILE)?) {
        (Some(cert), Some(key)) => Ok(Some((cert, key))),
        _ => Ok(None),
    }
}

/// The cluster an addon agent's certificate names (its URI SAN
/// [`flower_addon_proto::OCM_ADDON_CLUSTER_URI_PREFIX`]`<cluster>`).
pub fn cluster_of(cert_pem: &str) -> Result<String, String> {
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
        .map_err(|e| format!("not a PEM certificate: {e}"))?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let san = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .ok_or("the certificate names no cluster (no subject alternative name): was it issued by flower-hub for the OCM addon?")?;
    san.value
        .general_names
        .iter()
        .find_map(|name| match name {
            x509_parser::extensions::GeneralName::URI(uri) => {
                uri.strip_prefix(flower_addon_proto::OCM_ADDON_CLUSTER_URI_PREFIX)
            }
            _ => None,
        })
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| {
            format!(
                "the certificate has no URI SAN {}<cluster>: was it issued by flower-hub for the OCM addon?",
                flower_addon_proto::OCM_ADDON_CLUSTER_URI_PREFIX
            )
        })
}

/// The hub's CA certificate (PEM) with hash `ca_hash`, from the chain the hub presents at
/// `address`: the handshake is verified against that hash, as a join's.
pub async fn fetch_ca(address: &HubAddress, ca_hash: &str) -> Result<String, TlsError> {
    let err = |detail: String| TlsError::Connect {
        hub: address.hub.clone(),
        detail,
    };
    let mismatch = std::sync::Arc::new(std::sync::Mutex::new(None));
    let config = pinned_config(ca_hash, mismatch.clone())?;
    let server_name = rustls::pki_types::ServerName::try_from(address.server_name.clone())
        .map_err(|e| {
            err(format!(
                "invalid server name {:?}: {e}",
                address.server_name
            ))
        })?;
    let tcp = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect(address.hub.as_str()),
    )
    .await
    .map_err(|_| err("timed out".into()))?
    .map_err(|e| err(e.to_string()))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(server_name, tcp)
        .await
        .map_err(|e| {
            let seen = mismatch.lock().ok().and_then(|m| m.clone());
            err(seen.unwrap_or_else(|| e.to_string()))
        })?;
    let pin = ca_hash.to_ascii_lowercase();
    let ca = tls
        .get_ref()
        .1
        .peer_certificates()
        .into_iter()
        .flatten()
        .find(|c| spki_hash(c).as_deref() == Some(pin.as_str()))
        .ok_or_else(|| err(format!("the hub presented no CA with hash {pin}")))?;
    Ok(pem_certificate(ca.as_ref()))
}

/// A DER certificate as PEM.
fn pem_certificate(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// Where the addon agent's hub is.
#[derive(Clone, Debug)]
pub struct AddonHub {
    /// `HOST:PORT` of the work channel.
    pub hub: String,
    /// `sha256:<hex>` of the hub CA's public key.
    pub ca_hash: String,
    /// Name the hub's certificate must carry (default: the host of `hub`).
    pub server_name: Option<String>,
}

/// The agent's credentials from the pair in `dir` (waiting for the klusterlet to write it,
/// saying so every 30 s through `progress`) and the CA of `hub`.
pub async fn credentials(
    dir: &Path,
    hub: &AddonHub,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<Credentials, OcmAddonError> {
    let started = std::time::Instant::now();
    let mut said = Duration::ZERO;
    let (cert_pem, key_pem) = loop {
        if let Some(pair) = read_pair(dir)? {
            break pair;
        }
        if started.elapsed() >= said {
            progress(&format!(
                "waiting for OCM's klusterlet to write the addon's certificate to {} (Secret {}-{}-client-cert of the addon's namespace; the hub signs it once OCM accepted the cluster and the addon is enabled)",
                dir.display(),
                flower_addon_proto::OCM_ADDON_NAME,
                flower_addon_proto::OCM_ADDON_SIGNER.replace('/', "-")
            ));
            said += Duration::from_secs(30);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let cluster_name = cluster_of(&cert_pem).map_err(|detail| OcmAddonError::Invalid {
        path: dir.join(CERT_FILE),
        detail,
    })?;
    let mut address = HubAddress::new(&hub.hub);
    if let Some(name) = &hub.server_name {
        address.server_name = name.clone();
    }
    let ca_pem = fetch_ca(&address, &hub.ca_hash).await?;
    Ok(Credentials {
        config: AgentConfig {
            cluster_name,
            hub: hub.hub.clone(),
            server_name: address.server_name,
        },
        ca_pem,
        cert_pem,
        key_pem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pair_is_absent_until_both_files_have_content() {
        let dir = tempfile::tempdir().expect("dir");
        assert!(read_pair(dir.path()).expect("read").is_none());
        std::fs::write(dir.path().join(CERT_FILE), "cert").expect("write");
        assert!(read_pair(dir.path()).expect("read").is_none());
        std::fs::write(dir.path().join(KEY_FILE), "\n").expect("write");
        assert!(read_pair(dir.path()).expect("read").is_none());
        std::fs::write(dir.path().join(KEY_FILE), "key").expect("write");
        assert_eq!(
            read_pair(dir.path()).expect("read"),
            Some(("cert".to_owned(), "key".to_owned()))
        );
    }

    #[test]
    fn the_cluster_comes_from_the_uri_san_only() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = vec![rcgen::SanType::URI(
            format!("{}edge-1", flower_addon_proto::OCM_ADDON_CLUSTER_URI_PREFIX)
                .try_into()
                .expect("uri"),
        )];
        let cert = params.self_signed(&key).expect("cert");
        assert_eq!(cluster_of(&cert.pem()), Ok("edge-1".to_owned()));
        // A join's certificate (cluster in the CN) is not an addon certificate.
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "edge-1");
        let cert = params.self_signed(&key).expect("cert");
        assert!(cluster_of(&cert.pem()).unwrap_err().contains("OCM addon"));
    }

    #[test]
    fn der_becomes_pem_that_parses_back() {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["x".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let pem = pem_certificate(cert.der());
        let back = CertificateDer::from_pem_slice(pem.as_bytes()).expect("parse");
        assert_eq!(back.as_ref(), cert.der().as_ref());
    }
}

//! The agent's identity on disk (standalone / edge mode): its private key, the client certificate
//! the hub issued, the hub CA bundle and where the hub is. Every file is mode 0600 in the state
//! directory and written temp + rename, so a crash never leaves half a key or certificate.
//!
//! ```text
//! DIR/agent.json   {clusterName, hub, serverName}
//! DIR/client.key   PKCS#8 PEM private key (made once, kept across renewals)
//! DIR/client.crt   PEM client certificate
//! DIR/ca.crt       PEM hub CA bundle
//! ```
use rcgen::KeyPair;
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Errors reading or writing the agent's credentials.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// File I/O failed.
    #[error("{path}: {source}")]
    Io {
        /// File concerned.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// A file's content is unusable.
    #[error("{path}: {detail}")]
    Invalid {
        /// File concerned.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The agent has not joined yet.
    #[error(
        "no credentials in {0}: run `flower-agent join --hub HOST:PORT --token T --ca-hash sha256:… --cluster-name NAME --state-dir {0}` first"
    )]
    NotJoined(PathBuf),
}

/// Where the agent's hub is and who the agent is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentConfig {
    /// Cluster name (the CN of the client certificate).
    pub cluster_name: String,
    /// `HOST:PORT` of the hub's work channel.
    pub hub: String,
    /// Name the hub's server certificate must carry (default: the host of `hub`).
    pub server_name: String,
}

/// Everything the agent needs to open the mTLS work channel.
#[derive(Clone)]
pub struct Credentials {
    /// Hub address and cluster name.
    pub config: AgentConfig,
    /// PEM hub CA bundle.
    pub ca_pem: String,
    /// PEM client certificate.
    pub cert_pem: String,
    /// PEM private key. Secret.
    pub key_pem: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("config", &self.config)
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

// === impl Credentials ===

impl Credentials {
    /// Loads the credentials from `dir`; [`CredentialsError::NotJoined`] if the agent never joined.
    pub fn load(dir: &Path) -> Result<Self, CredentialsError> {
        let config_path = dir.join("agent.json");
        if !config_path.exists() || !dir.join("client.crt").exists() {
            return Err(CredentialsError::NotJoined(dir.to_path_buf()));
        }
        let config: AgentConfig =
            serde_json::from_str(&read(&config_path)?).map_err(|e| CredentialsError::Invalid {
                path: config_path.clone(),
                detail: e.to_string(),
            })?;
        Ok(Self {
            config,
            ca_pem: read(&dir.join("ca.crt"))?,
            cert_pem: read(&dir.join("client.crt"))?,
            key_pem: read(&dir.join("client.key"))?,
        })
    }

    /// Writes all the credentials to `dir` (each file atomically, mode 0600).
    pub fn save(&self, dir: &Path) -> Result<(), CredentialsError> {
        ensure_dir(dir)?;
        let config =
            serde_json::to_vec_pretty(&self.config).map_err(|e| CredentialsError::Invalid {
                path: dir.join("agent.json"),
                detail: e.to_string(),
            })?;
        write_atomic(&dir.join("client.key"), self.key_pem.as_bytes())?;
        write_atomic(&dir.join("ca.crt"), self.ca_pem.as_bytes())?;
        write_atomic(&dir.join("client.crt"), self.cert_pem.as_bytes())?;
        // agent.json last: its presence with client.crt means "joined".
        write_atomic(&dir.join("agent.json"), &config)
    }

    /// Replaces the client certificate (and CA bundle) after a renewal.
    pub fn save_renewed(
        &mut self,
        dir: &Path,
        cert_pem: String,
        ca_pem: String,
    ) -> Result<(), CredentialsError> {
        write_atomic(&dir.join("ca.crt"), ca_pem.as_bytes())?;
        write_atomic(&dir.join("client.crt"), cert_pem.as_bytes())?;
        self.cert_pem = cert_pem;
        self.ca_pem = ca_pem;
        Ok(())
    }

    /// Validity window of the client certificate.
    pub fn cert_validity(&self) -> Result<(SystemTime, SystemTime), CredentialsError> {
        cert_validity(&self.cert_pem)
    }
}

/// The agent's private key in `dir`, made (and saved, 0600) on first use. The key is kept for
/// the agent's lifetime: re-joining with it is idempotent, renewals reuse it.
pub fn load_or_generate_key(dir: &Path) -> Result<KeyPair, CredentialsError> {
    let path = dir.join("client.key");
    if path.exists() {
        let pem = read(&path)?;
        return KeyPair::from_pem(&pem).map_err(|e| CredentialsError::Invalid {
            path,
            detail: e.to_string(),
        });
    }
    ensure_dir(dir)?;
    let key = KeyPair::generate().map_err(|e| CredentialsError::Invalid {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    write_atomic(&path, key.serialize_pem().as_bytes())?;
    Ok(key)
}

/// A PEM CSR for `cluster_name` signed with `key` (the hub only uses its public key).
pub fn make_csr(key: &KeyPair, cluster_name: &str) -> Result<String, rcgen::Error> {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cluster_name);
    params.serialize_request(key)?.pem()
}

/// Validity window (`not_before`, `not_after`) of a PEM certificate.
pub fn cert_validity(cert_pem: &str) -> Result<(SystemTime, SystemTime), CredentialsError> {
    let invalid = |detail: String| CredentialsError::Invalid {
        path: PathBuf::from("client.crt"),
        detail,
    };
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|e| invalid(e.to_string()))?;
    let cert = pem.parse_x509().map_err(|e| invalid(e.to_string()))?;
    let to_time =
        |t: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t).unwrap_or(0));
    Ok((
        to_time(cert.validity().not_before.timestamp()),
        to_time(cert.validity().not_after.timestamp()),
    ))
}

fn read(path: &Path) -> Result<String, CredentialsError> {
    fs::read_to_string(path).map_err(|source| CredentialsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn ensure_dir(dir: &Path) -> Result<(), CredentialsError> {
    let io = |source| CredentialsError::Io {
        path: dir.to_path_buf(),
        source,
    };
    fs::create_dir_all(dir).map_err(io)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io)
}

/// Writes `body` to `path` atomically with mode 0600.
fn write_atomic(path: &Path, body: &[u8]) -> Result<(), CredentialsError> {
    let io = |source| CredentialsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    file.write_all(body).map_err(io)?;
    file.sync_all().map_err(io)?;
    fs::rename(&tmp, path).map_err(io)
}

//! The agent's identity: its private key, the client certificate the hub issued, the hub CA
//! bundle and where the hub is. It lives in one of two places ([`CredentialStore`]):
//!
//! - a state directory (standalone / edge mode): every file is mode 0600 and written
//!   temp + rename, so a crash never leaves half a key or certificate;
//! - a Secret in the agent's own namespace (Kubernetes mode), with the same four keys, written
//!   with server-side apply (field manager `flower-agent`).
//!
//! ```text
//! agent.json   {clusterName, hub, serverName}
//! client.key   PKCS#8 PEM private key (made once, kept across renewals and restarts)
//! client.crt   PEM client certificate
//! ca.crt       PEM hub CA bundle
//! ```
//!
//! The key is stored before the first join attempt, so an agent restarted while it waits for
//! `flower-hub accept` comes back with the same key (the hub pins the first key it saw).
use rcgen::KeyPair;
use serde::{Deserialize, Serialize};
use std::fs;
use std::os::unix::fs::PermissionsExt;
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
        "no credentials in {0}: run `flower-agent join --hub HOST:PORT --token-file FILE --ca-hash sha256:… --cluster-name NAME --state-dir {0}` first"
    )]
    NotJoined(PathBuf),
    /// Reading or writing the credential Secret failed.
    #[error("secret {secret}: {source}")]
    Kube {
        /// `namespace/name` of the Secret.
        secret: String,
        /// Underlying error.
        source: kube::Error,
    },
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
    crate::files::write_atomic(path, body, crate::files::PRIVATE).map_err(|source| {
        CredentialsError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// Field manager of the agent's writes to its credential Secret.
pub const FIELD_MANAGER: &str = "flower-agent";

/// Keys of the credential Secret (the same names as the files in a state directory).
const KEY_CONFIG: &str = "agent.json";
const KEY_PRIVATE: &str = "client.key";
const KEY_CERT: &str = "client.crt";
const KEY_CA: &str = "ca.crt";

/// Where the agent keeps its credentials.
#[derive(Clone)]
pub enum CredentialStore {
    /// Files in a state directory (standalone and edge agents).
    Dir(PathBuf),
    /// A Secret in the agent's namespace (agents running in a Kubernetes cluster).
    Secret(Box<SecretStore>),
}

impl std::fmt::Debug for CredentialStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// The credential Secret `namespace/name`.
#[derive(Clone)]
pub struct SecretStore {
    api: kube::Api<k8s_openapi::api::core::v1::Secret>,
    namespace: String,
    name: String,
}

// === impl CredentialStore ===

impl CredentialStore {
    /// The Secret `namespace/name` through `client`.
    pub fn secret(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self::Secret(Box::new(SecretStore {
            api: kube::Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }))
    }

    /// Where the credentials are, for messages: `directory D` or `secret NS/NAME`.
    pub fn describe(&self) -> String {
        match self {
            Self::Dir(dir) => format!("directory {}", dir.display()),
            Self::Secret(s) => format!("secret {}/{}", s.namespace, s.name),
        }
    }

    /// The stored credentials, or `None` when the agent has not joined yet.
    pub async fn load(&self) -> Result<Option<Credentials>, CredentialsError> {
        match self {
            Self::Dir(dir) => match Credentials::load(dir) {
                Ok(c) => Ok(Some(c)),
                Err(CredentialsError::NotJoined(_)) => Ok(None),
                Err(e) => Err(e),
            },
            Self::Secret(s) => {
                let data = s.data().await?;
                if !data.contains_key(KEY_CONFIG) || !data.contains_key(KEY_CERT) {
                    return Ok(None);
                }
                let config: AgentConfig = serde_json::from_str(&s.field(&data, KEY_CONFIG)?)
                    .map_err(|e| s.invalid(KEY_CONFIG, e.to_string()))?;
                Ok(Some(Credentials {
                    config,
                    ca_pem: s.field(&data, KEY_CA)?,
                    cert_pem: s.field(&data, KEY_CERT)?,
                    key_pem: s.field(&data, KEY_PRIVATE)?,
                }))
            }
        }
    }

    /// The agent's private key, made and stored on first use.
    pub async fn load_or_generate_key(&self) -> Result<KeyPair, CredentialsError> {
        match self {
            Self::Dir(dir) => load_or_generate_key(dir),
            Self::Secret(s) => {
                let data = s.data().await?;
                if data.contains_key(KEY_PRIVATE) {
                    let pem = s.field(&data, KEY_PRIVATE)?;
                    return KeyPair::from_pem(&pem)
                        .map_err(|e| s.invalid(KEY_PRIVATE, e.to_string()));
                }
                let key = KeyPair::generate().map_err(|e| s.invalid(KEY_PRIVATE, e.to_string()))?;
                // `create` when the Secret is absent, so two agent processes starting at once
                // end up with one key: the loser reads the winner's.
                if s.create_with_key(&key.serialize_pem()).await? {
                    return Ok(key);
                }
                let data = s.data().await?;
                if data.contains_key(KEY_PRIVATE) {
                    let pem = s.field(&data, KEY_PRIVATE)?;
                    return KeyPair::from_pem(&pem)
                        .map_err(|e| s.invalid(KEY_PRIVATE, e.to_string()));
                }
                s.apply(&[(KEY_PRIVATE, key.serialize_pem())]).await?;
                Ok(key)
            }
        }
    }

    /// Stores all the credentials (`agent.json` last in a directory, so it marks "joined").
    pub async fn save(&self, creds: &Credentials) -> Result<(), CredentialsError> {
        match self {
            Self::Dir(dir) => creds.save(dir),
            Self::Secret(s) => {
                let config = serde_json::to_string_pretty(&creds.config)
                    .map_err(|e| s.invalid(KEY_CONFIG, e.to_string()))?;
                s.apply(&[
                    (KEY_PRIVATE, creds.key_pem.clone()),
                    (KEY_CA, creds.ca_pem.clone()),
                    (KEY_CERT, creds.cert_pem.clone()),
                    (KEY_CONFIG, config),
                ])
                .await
            }
        }
    }

    /// Stores a renewed client certificate and CA bundle.
    pub async fn save_renewed(&self, creds: &Credentials) -> Result<(), CredentialsError> {
        match self {
            Self::Dir(dir) => {
                write_atomic(&dir.join(KEY_CA), creds.ca_pem.as_bytes())?;
                write_atomic(&dir.join(KEY_CERT), creds.cert_pem.as_bytes())
            }
            // Applying every key keeps them all owned by this field manager.
            Self::Secret(_) => self.save(creds).await,
        }
    }
}

// === impl SecretStore ===

impl SecretStore {
    fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn kube(&self) -> impl FnOnce(kube::Error) -> CredentialsError + '_ {
        move |source| CredentialsError::Kube {
            secret: self.label(),
            source,
        }
    }

    fn invalid(&self, key: &str, detail: String) -> CredentialsError {
        CredentialsError::Invalid {
            path: PathBuf::from(format!("secret {}, key {key}", self.label())),
            detail,
        }
    }

    async fn data(
        &self,
    ) -> Result<std::collections::BTreeMap<String, k8s_openapi::ByteString>, CredentialsError> {
        let secret = self.api.get_opt(&self.name).await.map_err(self.kube())?;
        Ok(secret.and_then(|s| s.data).unwrap_or_default())
    }

    fn field(
        &self,
        data: &std::collections::BTreeMap<String, k8s_openapi::ByteString>,
        key: &str,
    ) -> Result<String, CredentialsError> {
        let bytes = data
            .get(key)
            .ok_or_else(|| self.invalid(key, "missing".into()))?;
        String::from_utf8(bytes.0.clone()).map_err(|e| self.invalid(key, e.to_string()))
    }

    /// Creates the Secret holding only `key_pem`; `false` when it already exists.
    async fn create_with_key(&self, key_pem: &str) -> Result<bool, CredentialsError> {
        let mut secret: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(self.object(&[(KEY_PRIVATE, key_pem.to_string())]))
                .map_err(|e| self.invalid(KEY_PRIVATE, e.to_string()))?;
        secret.metadata.namespace = None;
        let params = kube::api::PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match self.api.create(&params, &secret).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(self.kube()(e)),
        }
    }

    /// The Secret holding `entries`, as JSON.
    fn object(&self, entries: &[(&str, String)]) -> serde_json::Value {
        let data: serde_json::Map<String, serde_json::Value> = entries
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_string(),
                    serde_json::to_value(k8s_openapi::ByteString(v.clone().into_bytes()))
                        .unwrap_or_default(),
                )
            })
            .collect();
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {
                    "app.kubernetes.io/name": "flower-agent",
                    "app.kubernetes.io/part-of": "flower-addon",
                },
            },
            "type": "Opaque",
            "data": data,
        })
    }

    /// Server-side apply of `entries` (other keys this manager owns are kept only if listed,
    /// so callers list every key they want to keep after the first join).
    async fn apply(&self, entries: &[(&str, String)]) -> Result<(), CredentialsError> {
        let patch = self.object(entries);
        self.api
            .patch(
                &self.name,
                &kube::api::PatchParams::apply(FIELD_MANAGER).force(),
                &kube::api::Patch::Apply(patch),
            )
            .await
            .map_err(self.kube())?;
        Ok(())
    }
}

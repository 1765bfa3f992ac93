//! `flower-agent join`: make a key and CSR, present a bootstrap token to the hub (pinned by its
//! CA hash), wait with backoff until the hub accepts the cluster, then store the credentials.
use crate::credentials::{self, AgentConfig, CredentialStore, Credentials, CredentialsError};
use crate::tls::{self, HubAddress, TlsError};
use backon::BackoffBuilder;
use flower_addon_proto::registration_client::RegistrationClient;
use flower_addon_proto::{JoinRequest, JoinStatus};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Code;

/// Everything `join` needs.
#[derive(Clone, Debug)]
pub struct JoinOptions {
    /// Where the hub is (and, for benchmarks, which local address to use).
    pub hub: HubAddress,
    /// Bootstrap token `<id>.<secret>`.
    pub token: String,
    /// `sha256:<hex>` of the hub CA's SubjectPublicKeyInfo.
    pub ca_hash: String,
    /// Name to register the cluster under.
    pub cluster_name: String,
    /// Labels reported to the hub.
    pub labels: BTreeMap<String, String>,
    /// Cluster claims reported to the hub.
    pub claims: BTreeMap<String, String>,
    /// Where the key and credentials are kept.
    pub store: CredentialStore,
    /// Give up waiting for acceptance after this long (`None`: wait forever).
    pub max_wait: Option<Duration>,
    /// Longest pause between attempts (default 30 s).
    pub max_backoff: Duration,
}

impl JoinOptions {
    /// Options with no labels or claims, waiting forever, backoff capped at 30 s.
    pub fn new(
        hub: &str,
        token: &str,
        ca_hash: &str,
        cluster_name: &str,
        state_dir: PathBuf,
    ) -> Self {
        Self {
            hub: HubAddress::new(hub),
            token: token.to_string(),
            ca_hash: ca_hash.to_string(),
            cluster_name: cluster_name.to_string(),
            labels: BTreeMap::new(),
            claims: BTreeMap::new(),
            store: CredentialStore::Dir(state_dir),
            max_wait: None,
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// Why joining failed for good.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The hub's CA is not the pinned one: refusing to talk to it.
    #[error(
        "{0}; refusing to join (check --ca-hash, or the bootstrap Secret key caHash, against `flower-hub token create`)"
    )]
    CaMismatch(String),
    /// The hub refused the request (bad token, name taken, invalid input…).
    #[error("the hub refused to join: {code:?}: {message}")]
    Refused {
        /// gRPC status code.
        code: Code,
        /// The hub's message.
        message: String,
    },
    /// Still pending (or unreachable) when `max_wait` ran out.
    #[error("gave up after {0:?}: {1}")]
    Timeout(Duration, String),
    /// Local key or credential files.
    #[error("credentials: {0}")]
    Credentials(#[from] CredentialsError),
    /// Building the CSR.
    #[error("cannot make the certificate signing request: {0}")]
    Csr(#[from] rcgen::Error),
    /// TLS configuration.
    #[error("{0}")]
    Tls(#[from] TlsError),
    /// The hub accepted but sent something unusable.
    #[error("invalid answer from the hub: {0}")]
    BadResponse(String),
}

/// Outcome of one attempt that should be retried.
enum Retry {
    Pending,
    Unreachable(String),
}

/// Joins the hub and stores the credentials in `options.store`. `progress` receives the
/// human-readable progress lines (e.g. "waiting for the hub to accept cluster NAME: run
/// flower-hub accept NAME").
pub async fn join(
    options: &JoinOptions,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<Credentials, JoinError> {
    let key = options.store.load_or_generate_key().await?;
    let csr_pem = credentials::make_csr(&key, &options.cluster_name)?;
    let started = Instant::now();
    let mut backoff = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(options.max_backoff)
        .with_jitter()
        .without_max_times()
        .build();
    let mut last_note = String::new();
    loop {
        let retry = match attempt(options, &csr_pem).await? {
            Ok((cert_pem, ca_pem)) => {
                let creds = Credentials {
                    config: AgentConfig {
                        cluster_name: options.cluster_name.clone(),
                        hub: options.hub.hub.clone(),
                        server_name: options.hub.server_name.clone(),
                    },
                    ca_pem,
                    cert_pem,
                    key_pem: key.serialize_pem(),
                };
                options.store.save(&creds).await?;
                progress(&format!(
                    "cluster {} joined the hub at {}; credentials are in {}",
                    options.cluster_name,
                    options.hub.hub,
                    options.store.describe()
                ));
                return Ok(creds);
            }
            Err(retry) => retry,
        };
        let note = match &retry {
            Retry::Pending => format!(
                "waiting for the hub to accept cluster {0}: run flower-hub accept {0}",
                options.cluster_name
            ),
            Retry::Unreachable(detail) => format!("hub not reachable ({detail}); retrying"),
        };
        if note != last_note {
            progress(&note);
            last_note = note.clone();
        }
        if let Some(max) = options.max_wait
            && started.elapsed() >= max
        {
            return Err(JoinError::Timeout(max, note));
        }
        let delay = backoff.next().unwrap_or(options.max_backoff);
        tokio::time::sleep(delay).await;
    }
}

/// One Join call. Outer error: give up; inner error: retry.
async fn attempt(
    options: &JoinOptions,
    csr_pem: &str,
) -> Result<Result<(String, String), Retry>, JoinError> {
    let mismatch = Arc::new(Mutex::new(None));
    let config = tls::pinned_config(&options.ca_hash, mismatch.clone())?;
    let channel = match tls::connect(&options.hub, config).await {
        Ok(channel) => channel,
        Err(error) => {
            if let Some(detail) = mismatch.lock().ok().and_then(|m| m.clone()) {
                return Err(JoinError::CaMismatch(detail));
            }
            return Ok(Err(Retry::Unreachable(error.to_string())));
        }
    };
    let mut client = RegistrationClient::new(channel);
    let mut request = tonic::Request::new(JoinRequest {
        token: options.token.clone(),
        cluster_name: options.cluster_name.clone(),
        csr_pem: csr_pem.to_string(),
        labels: options.labels.clone().into_iter().collect(),
        claims: options.claims.clone().into_iter().collect(),
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
    });
    request.set_timeout(Duration::from_secs(15));
    match client.join(request).await {
        Ok(response) => {
            let response = response.into_inner();
            match JoinStatus::try_from(response.status) {
                Ok(JoinStatus::Accepted) => {
                    if response.client_cert_pem.is_empty() || response.ca_bundle_pem.is_empty() {
                        return Err(JoinError::BadResponse(
                            "accepted without a certificate or CA bundle".into(),
                        ));
                    }
                    // The hub's CA bundle becomes the agent's trust root: it must hold the CA
                    // pinned with --ca-hash (beside it, a rotation's other CA).
                    tls::check_ca_bundle(
                        &response.ca_bundle_pem,
                        std::slice::from_ref(&options.ca_hash),
                    )
                    .map_err(JoinError::BadResponse)?;
                    Ok(Ok((response.client_cert_pem, response.ca_bundle_pem)))
                }
                Ok(JoinStatus::Pending) => Ok(Err(Retry::Pending)),
                _ => Err(JoinError::BadResponse(format!(
                    "unknown status {}",
                    response.status
                ))),
            }
        }
        Err(status) => match status.code() {
            Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::DeadlineExceeded
            | Code::Unknown => Ok(Err(Retry::Unreachable(format!(
                "{:?}: {}",
                status.code(),
                status.message()
            )))),
            code => Err(JoinError::Refused {
                code,
                message: status.message().to_string(),
            }),
        },
    }
}

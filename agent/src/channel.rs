//! The agent side of the work stream: connect over mTLS, apply each snapshot through the
//! [`Runtime`], ack it, report status and answer pings; reconnect with backoff (exponential,
//! jitter, capped) and resync from the hub's next snapshot. When the hub is unreachable nothing is
//! undone: the runtime keeps running the last applied work. When the hub says it no longer trusts
//! the cluster (deleted, revoked, re-keyed: [`flower_addon_proto::CLUSTER_STATE_KEY`]), the agent
//! stops its SuperNodes and keeps retrying; accepted again, it gets its work back.
//!
//! The client certificate is renewed at 80 % of its life over the same HTTP/2 connection, so the
//! open stream is not interrupted; the renewed certificate is used from the next connection on.
use crate::credentials::{self, CredentialStore, Credentials, CredentialsError};
use crate::runtime::{Allocatable, Runtime};
use crate::tls::{self, HubAddress};
use backon::BackoffBuilder;
use flower_addon_proto::agent_message::Kind as AgentKind;
use flower_addon_proto::hub_message::Kind as HubKind;
use flower_addon_proto::registration_client::RegistrationClient;
use flower_addon_proto::work_client::WorkClient;
use flower_addon_proto::{Ack, AgentMessage, FederationStatus, Heartbeat, RenewRequest, Status};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
mod renew;
use renew::*;

/// Largest message the agent accepts from the hub (a work snapshot).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Settings of [`run`].
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Identity and hub address.
    pub credentials: Credentials,
    /// Where renewed certificates are written (`None`: memory only, for benchmarks).
    pub store: Option<CredentialStore>,
    /// Local address to connect from (benchmarks).
    pub local_ip: Option<IpAddr>,
    /// Shortest reconnect delay (default 1 s; the first is between half of it and it).
    pub reconnect_min: Duration,
    /// Longest reconnect delay (default 15 s): delays double from the shortest up to this, each
    /// drawn between half of its step and the step, so that agents cut off together do not come
    /// back together, and an agent is back at most this long after its hub is.
    pub reconnect_max: Duration,
    /// How often the runtime status is checked and sent if it changed (default 15 s).
    pub status_interval: Duration,
    /// Fraction of the certificate's life after which it is renewed (default 0.8).
    pub renew_at: f64,
    /// Receives what happens, for tests and benchmarks.
    pub events: Option<mpsc::UnboundedSender<AgentEvent>>,
    /// Stop with [`AgentError::CertificateExpired`] once the client certificate has expired (the
    /// hub cannot renew it), so a restart can re-join from a bootstrap Secret. Otherwise the
    /// agent keeps retrying and logs how to re-join.
    pub exit_when_expired: bool,
    /// The agent is an OCM addon: its certificate and key are OCM's klusterlet's, in this
    /// directory ([`crate::ocm_addon`]). They are reread instead of renewed over the channel.
    pub ocm_addon_dir: Option<PathBuf>,
}

impl RunOptions {
    /// Defaults for `credentials`, saving renewals into `state_dir`.
    pub fn new(credentials: Credentials, state_dir: Option<PathBuf>) -> Self {
        Self::with_store(credentials, state_dir.map(CredentialStore::Dir))
    }

    /// Defaults for `credentials`, saving renewals into `store`.
    pub fn with_store(credentials: Credentials, store: Option<CredentialStore>) -> Self {
        Self {
            credentials,
            store,
            local_ip: None,
            reconnect_min: Duration::from_secs(1),
            reconnect_max: Duration::from_secs(15),
            status_interval: Duration::from_secs(15),
            renew_at: 0.8,
            events: None,
            exit_when_expired: false,
            ocm_addon_dir: None,
        }
    }
}

/// Something that happened on the channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentEvent {
    /// The work stream is open.
    Connected,
    /// A snapshot was applied and acked.
    Applied {
        /// Its version.
        version: u64,
    },
    /// The stream ended (the agent will reconnect).
    Disconnected {
        /// gRPC code, if the hub sent one.
        code: Option<tonic::Code>,
        /// Why.
        message: String,
    },
    /// The client certificate was renewed.
    Renewed {
        /// End of the new certificate's validity.
        not_after: SystemTime,
    },
}

/// Errors that stop the agent for good.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Credentials could not be read or written.
    #[error("{0}")]
    Credentials(#[from] CredentialsError),
    /// The client certificate expired while the hub was unreachable; only a new join helps.
    #[error(
        "the client certificate of cluster {cluster} expired at {not_after} and the hub cannot renew an expired certificate: {fix}"
    )]
    CertificateExpired {
        /// Cluster name.
        cluster: String,
        /// When it expired (RFC 3339).
        not_after: String,
        /// How to re-join.
        fix: String,
    },
}

struct State {
    options: RunOptions,
    credentials: Mutex<Credentials>,
}

impl State {
    fn credentials(&self) -> Credentials {
        self.credentials
            .lock()
            .map(|c| c.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    fn emit(&self, event: AgentEvent) {
        if let Some(events) = &self.options.events {
            let _ = events.send(event);
        }
    }

    fn address(&self, creds: &Credentials) -> HubAddress {
        HubAddress {
            hub: creds.config.hub.clone(),
            server_name: creds.config.server_name.clone(),
            local_ip: self.options.local_ip,
        }
    }
}

/// Keeps the work stream open until `shutdown` turns true.
pub async fn run(
    options: RunOptions,
    runtime: Arc<dyn Runtime>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), AgentError> {
    let state = Arc::new(State {
        credentials: Mutex::new(options.credentials.clone()),
        options,
    });
    let new_backoff = |o: &RunOptions| reconnect_delays(o.reconnect_min, o.reconnect_max);
    let mut backoff = new_backoff(&state.options);
    let mut expiry_logged = false;
    let mut stopped_for_refusal = false;
    let mut lockout_logged = false;
    loop {
        let started = Instant::now();
        let End {
            code,
            message,
            cluster_state,
            opened,
        } = match session(&state, runtime.as_ref(), &mut shutdown).await {
            None => return Ok(()),
            Some(end) => end,
        };
        let cluster = state.credentials().config.cluster_name;
        if opened {
            // Trusted again since the last stop: a new refusal stops the SuperNodes again.
            stopped_for_refusal = false;
        }
        match (&cluster_state, code) {
            (Some(cluster_state), _) => {
                // Deleted, revoked or re-keyed: the hub no longer trusts this cluster to run the
                // Federations' code, so its SuperNodes stop (once per refusal); the agent keeps
                // retrying, and an admin who accepts it again gets its work running again.
                if !stopped_for_refusal {
                    let empty = flower_addon_proto::ClusterWork {
                        version: 0,
                        cluster_name: cluster.clone(),
                        federations: Vec::new(),
                    };
                    match runtime.apply(&empty).await {
                        Ok(()) => {
                            stopped_for_refusal = true;
                            tracing::error!(%cluster, %cluster_state, %message, "the hub no longer trusts this cluster: its SuperNodes are stopped; retrying")
                        }
                        Err(error) => {
                            tracing::error!(%cluster, %cluster_state, %error, "the hub no longer trusts this cluster, and its SuperNodes could not be stopped")
                        }
                    }
                }
            }
            (None, _) if let Some(fix) = locked_out(&message, &cluster) => {
                // Not a passing outage: without a new join this agent never connects again.
                crate::metrics::agent().locked_out(true);
                if !lockout_logged {
                    tracing::error!(%cluster, %message, %fix, "this agent and the hub no longer trust each other's certificates; applied work keeps running, retrying");
                    lockout_logged = true;
                }
            }
            (None, Some(tonic::Code::PermissionDenied) | Some(tonic::Code::Unauthenticated)) => {
                tracing::error!(%cluster, %message, "the hub refuses this connection; applied work keeps running, retrying")
            }
            (None, _) => {
                tracing::warn!(%cluster, ?code, %message, "work stream ended; applied work keeps running, reconnecting")
            }
        }
        if opened {
            crate::metrics::agent().locked_out(false);
            lockout_logged = false;
        }
        state.emit(AgentEvent::Disconnected { code, message });
        if let Some(expired) = expired(&state.credentials()) {
            if state.options.exit_when_expired {
                return Err(expired);
            }
            if !expiry_logged {
                tracing::error!(%cluster, "{expired}");
                expiry_logged = true;
            }
        }
        // A stream that lasted, or one the hub closed because it is shutting down (a restart:
        // it is back in seconds), starts the delays afresh. Otherwise the delays grown while
        // an earlier hub was down carry over, and the agent comes back to the restarted hub
        // only after its leases' grace ran out (seen in CI: 13 s after a 10 s grace).
        let restart = opened && code == Some(tonic::Code::Unavailable);
        if restart || started.elapsed() > Duration::from_secs(60) {
            backoff = new_backoff(&state.options);
        }
        let delay = backoff.next().unwrap_or(state.options.reconnect_max);
        tokio::select! {
            _ = stopped(&mut shutdown) => return Ok(()),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// The agent's reconnect delays: doubling from `min` up to `max`, each drawn between half of its
/// step and the step (backon's jitter adds up to the step itself, so the steps are half the
/// bounds: with the bounds themselves as steps a delay reached twice the maximum, 60 s where
/// 30 s was meant, measured after a hub outage).
fn reconnect_delays(min: Duration, max: Duration) -> impl Iterator<Item = Duration> {
    backon::ExponentialBuilder::default()
        .with_min_delay(min / 2)
        .with_max_delay(max / 2)
        .with_jitter()
        .without_max_times()
        .build()
}

/// When a connection failed because this agent and the hub do not trust each other's certificate
/// (the TLS errors of rustls on either side), what recovers it; `None` for any other failure.
/// That happens when the hub's work-channel CA was rotated past what this agent holds (it was
/// offline through a rotation, or a step was forced before it renewed) or replaced: only a new
/// join, which pins the hub's current CA, brings it back.
pub fn locked_out(message: &str, cluster: &str) -> Option<String> {
    const HUB_NOT_TRUSTED: &[&str] = &["invalid peer certificate"];
    const AGENT_REFUSED: &[&str] = &[
        "received fatal alert: BadCertificate",
        "received fatal alert: UnknownCA",
        "received fatal alert: CertificateUnknown",
        "received fatal alert: DecryptError",
        "received fatal alert: CertificateExpired",
    ];
    let why = if HUB_NOT_TRUSTED.iter().any(|p| message.contains(p)) {
        "this agent does not trust the hub's certificate"
    } else if AGENT_REFUSED.iter().any(|p| message.contains(p)) {
        "the hub does not accept this agent's certificate"
    } else {
        return None;
    };
    Some(format!(
        "{why} (the hub's work-channel CA was rotated or replaced since this agent last renewed): join again, keeping the stored key: on the hub run `flower-hub token create --cluster-name {cluster}` (it prints the current --ca-hash); then `flower-agent join --token-file - --ca-hash <that hash> …` with the same state directory, or for an agent in Kubernetes apply the bootstrap Secret of `flower-hub token create --cluster-name {cluster} -o secret` and restart it"
    ))
}

/// [`AgentError::CertificateExpired`] if the client certificate of `creds` has expired.
pub fn expired(creds: &Credentials) -> Option<AgentError> {
    let (_, not_after) = creds.cert_validity().ok()?;
    if not_after > std::time::SystemTime::now() {
        return None;
    }
    let cluster = creds.config.cluster_name.clone();
    Some(AgentError::CertificateExpired {
        not_after: humantime::format_rfc3339_seconds(not_after).to_string(),
        fix: format!(
            "re-join with a fresh token (the stored key is kept, the hub knows it): on the hub run `flower-hub token create --cluster-name {cluster}`; then `flower-agent join …` with the same state directory, or for an agent in Kubernetes apply the printed `-o secret` bootstrap Secret and restart it"
        ),
        cluster,
    })
}

/// Why a connection ended.
struct End {
    code: Option<tonic::Code>,
    message: String,
    /// [`flower_addon_proto::CLUSTER_STATE_KEY`] of a refusal: the hub no longer trusts this
    /// cluster (deleted, not accepted, re-keyed).
    cluster_state: Option<String>,
    /// Whether the stream had opened (the hub trusted the cluster at that time).
    opened: bool,
}

impl End {
    fn other(message: String) -> Self {
        Self {
            code: None,
            message,
            cluster_state: None,
            opened: false,
        }
    }

    fn status(status: &tonic::Status) -> Self {
        Self {
            code: Some(status.code()),
            message: status.message().to_string(),
            cluster_state: (status.code() == tonic::Code::PermissionDenied)
                .then(|| status.metadata().get(flower_addon_proto::CLUSTER_STATE_KEY))
                .flatten()
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            opened: false,
        }
    }

    fn after_open(self) -> Self {
        Self {
            opened: true,
            ..self
        }
    }
}

/// One connection; `None` on shutdown, otherwise why it ended.
async fn session(
    state: &Arc<State>,
    runtime: &dyn Runtime,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<End> {
    if let Some(dir) = &state.options.ocm_addon_dir {
        reload_pair(state, dir);
    }
    let creds = state.credentials();
    let name = creds.config.cluster_name.clone();
    let config = match tls::mtls_config(&creds.ca_pem, &creds.cert_pem, &creds.key_pem) {
        Ok(config) => config,
        Err(e) => return Some(End::other(e.to_string())),
    };
    let address = state.address(&creds);
    let channel = tokio::select! {
        _ = stopped(shutdown) => return None,
        channel = tls::connect(&address, config) => match channel {
            Ok(channel) => channel,
            Err(e) => return Some(End::other(e.to_string())),
        },
    };
    let (tx, rx) = mpsc::channel::<AgentMessage>(32);
    let _ = tx
        .send(message(AgentKind::Heartbeat(Heartbeat {
            cluster_name: name.clone(),
        })))
        .await;
    let mut client = WorkClient::new(channel.clone())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let mut inbound = tokio::select! {
        _ = stopped(shutdown) => return None,
        response = client.connect(ReceiverStream::new(rx)) => match response {
            Ok(response) => response.into_inner(),
            Err(status) => return Some(End::status(&status)),
        },
    };
    tracing::info!(cluster = %name, hub = %creds.config.hub, "work stream open");
    state.emit(AgentEvent::Connected);
    crate::metrics::agent().connected(true);
    let _closed = Disconnect;
    let renew_now = Arc::new(tokio::sync::Notify::new());
    let renewer = AbortOnDrop(match &state.options.ocm_addon_dir {
        // OCM's klusterlet renews: reread what it wrote.
        Some(dir) => tokio::spawn(reload_loop(state.clone(), dir.clone())),
        None => tokio::spawn(renew_loop(state.clone(), channel, renew_now.clone())),
    });
    let mut status_tick = tokio::time::interval(state.options.status_interval);
    let mut last_status: Option<(Vec<FederationStatus>, Allocatable)> = None;
    let mut observed = 0u64;
    // No report before the first work of this stream is applied: a fresh runtime observes
    // nothing, and the hub would take "no SuperNodes, no keys" for the truth and unregister the
    // keys of SuperNodes that are running.
    let mut worked = false;
    let end = loop {
        tokio::select! {
            _ = stopped(shutdown) => break None,
            incoming = inbound.message() => match incoming {
                Ok(Some(msg)) => match msg.kind {
                    Some(HubKind::Work(work)) => {
                        worked = true;
                        let version = work.version;
                        let started = Instant::now();
                        let applied = runtime.apply(&work).await;
                        crate::metrics::agent().applied(applied.is_ok(), started.elapsed());
                        match applied {
                            Ok(()) => {
                                observed = version;
                                tracing::debug!(cluster = %name, version, "work applied");
                                let _ = tx.send(message(AgentKind::Ack(Ack { version, cluster_name: name.clone() }))).await;
                                state.emit(AgentEvent::Applied { version });
                            }
                            Err(error) => tracing::error!(cluster = %name, version, %error, "cannot apply work"),
                        }
                        if let Some(report) = status_report(runtime, &mut last_status, observed, &name, false).await {
                            let _ = tx.send(report).await;
                        }
                    }
                    Some(HubKind::Ping(ping)) => {
                        let _ = tx.send(message(AgentKind::Heartbeat(Heartbeat { cluster_name: name.clone() }))).await;
                        // Another CA bundle at the hub (a CA rotation): renew now, which brings
                        // it and a certificate of the CA that signs now.
                        if !ping.ca_bundle_sha256.is_empty()
                            && state.options.ocm_addon_dir.is_none()
                            && ping.ca_bundle_sha256 != bundle_sha256(&state.credentials().ca_pem)
                        {
                            tracing::info!(cluster = %name, "the hub's CA bundle changed; renewing the client certificate now");
                            renew_now.notify_one();
                        }
                    }
                    None => {}
                },
                Ok(None) => break Some(End::other("the hub closed the stream".to_string()).after_open()),
                Err(status) => break Some(End::status(&status).after_open()),
            },
            _ = status_tick.tick(), if worked => {
                if let Some(report) = status_report(runtime, &mut last_status, observed, &name, true).await {
                    let _ = tx.send(report).await;
                }
            }
        }
    };
    drop(renewer);
    end
}

/// What the runtime observes, as a status message for the hub (`observed` = last applied work
/// version); `None` when `only_if_changed` and it equals `last`, which is updated.
async fn status_report(
    runtime: &dyn Runtime,
    last: &mut Option<(Vec<FederationStatus>, Allocatable)>,
    observed: u64,
    name: &str,
    only_if_changed: bool,
) -> Option<AgentMessage> {
    let report = (runtime.status().await, runtime.allocatable().await);
    if only_if_changed && last.as_ref() == Some(&report) {
        return None;
    }
    *last = Some(report.clone());
    let (federations, allocatable) = report;
    Some(message(AgentKind::Status(Status {
        observed_version: observed,
        federations,
        cluster_name: name.to_owned(),
        allocatable,
    })))
}

/// Resolves once `shutdown` is true (or its sender is gone).
/// Sets the connection gauge to 0 when the session ends, whichever way it ends.
struct Disconnect;

impl Drop for Disconnect {
    fn drop(&mut self) {
        crate::metrics::agent().hub_connected.set(0);
    }
}

async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

fn message(kind: AgentKind) -> AgentMessage {
    AgentMessage { kind: Some(kind) }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod reconnect_tests {
    use super::reconnect_delays;
    use std::time::Duration;

    #[test]
    fn reconnect_delays_stay_within_their_bounds() {
        let (min, max) = (Duration::from_secs(1), Duration::from_secs(15));
        for _ in 0..50 {
            let delays: Vec<Duration> = reconnect_delays(min, max).take(12).collect();
            assert!(
                delays.iter().all(|d| *d >= min / 2 && *d <= max),
                "{delays:?} leave [{:?}, {max:?}]",
                min / 2
            );
            // Grown to the upper half of the bound after a few attempts: no agent hammers a
            // hub that stays down.
            assert!(delays[8..].iter().all(|d| *d >= max / 2), "{delays:?}");
        }
    }
}

#[cfg(test)]
mod lockout_tests {
    use super::locked_out;

    #[test]
    fn only_certificate_trust_failures_are_a_lock_out() {
        for message in [
            "cannot connect to hub 127.0.0.1:1: transport error: invalid peer certificate: BadSignature",
            "transport error: invalid peer certificate: UnknownIssuer",
            "h2 protocol error: received fatal alert: BadCertificate",
            "error reading a body from connection: received fatal alert: UnknownCA",
        ] {
            let fix = locked_out(message, "edge-7").unwrap_or_else(|| panic!("{message}"));
            assert!(
                fix.contains("flower-hub token create --cluster-name edge-7"),
                "{fix}"
            );
        }
        for message in [
            "cannot connect to hub 127.0.0.1:1: transport error: Connection refused (os error 111)",
            "the hub is shutting down",
            "deadline has elapsed",
            "",
        ] {
            assert_eq!(locked_out(message, "edge-7"), None, "{message}");
        }
    }
}

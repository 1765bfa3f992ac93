//! `Registration`: Join (bootstrap token + CSR) and Renew (mTLS + CSR with the same key).
use super::tls::PeerInfo;
use super::{Shared, WorkSource, internal};
use crate::registration::ca::csr_key_fingerprint;
use crate::registration::join::{self, JoinDecision, JoinRefusal, Joining};
use crate::registration::store::{
    CONDITION_HUB_ACCEPTED, CONDITION_JOINED, ClusterStore, StoreError,
};
use crate::registration::tokens::{self, unix_now};
use flower_addon_proto::prost_types::Timestamp;
use flower_addon_proto::registration_server::Registration;
use flower_addon_proto::{JoinRequest, JoinResponse, JoinStatus, RenewRequest, RenewResponse};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tonic::{Request, Response, Status};

/// Most labels or claims a cluster may report.
const MAX_LABELS: usize = 64;
/// Longest label/claim key and value.
const MAX_LABEL_KEY: usize = 317;
const MAX_LABEL_VALUE: usize = 1024;

pub(crate) struct RegistrationService<S, W> {
    pub(crate) shared: Arc<Shared<S, W>>,
}

#[tonic::async_trait]
impl<S: ClusterStore, W: WorkSource> Registration for RegistrationService<S, W> {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let peer = request.extensions().get::<PeerInfo>().cloned();
        let deadline = self.shared.config.unary_deadline;
        let remote = peer.map(|p| p.remote.ip().to_string()).unwrap_or_default();
        let result =
            match tokio::time::timeout(deadline, self.join_inner(&remote, request.into_inner()))
                .await
            {
                Ok(result) => result,
                Err(_) => Err(Status::deadline_exceeded(
                    "join took too long on the hub; retry",
                )),
            };
        let metrics = crate::metrics::hub();
        match &result {
            Ok(r) if r.status == JoinStatus::Accepted as i32 => metrics.joined("accepted", ""),
            Ok(_) => metrics.joined("pending", ""),
            Err(status) => metrics.joined("refused", crate::metrics::code_label(status.code())),
        }
        result.map(Response::new)
    }

    async fn renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<RenewResponse>, Status> {
        let peer = request.extensions().get::<PeerInfo>().cloned();
        let deadline = self.shared.config.unary_deadline;
        let identity = peer.and_then(|p| p.identity);
        let body = request.into_inner();
        match tokio::time::timeout(deadline, self.renew_inner(identity.as_deref(), body)).await {
            Ok(result) => result.map(Response::new),
            Err(_) => Err(Status::deadline_exceeded(
                "renew took too long on the hub; retry",
            )),
        }
    }
}

impl<S: ClusterStore, W: WorkSource> RegistrationService<S, W> {
    /// Refuses a new cluster while [`super::ChannelConfig::max_pending_clusters`] clusters
    /// already wait for acceptance (a token used in a loop cannot fill the store).
    async fn check_pending_room(&self, name: &str) -> Result<(), Status> {
        let max = self.shared.config.max_pending_clusters;
        let pending = self
            .shared
            .store
            .list_clusters()
            .await
            .map_err(|e| internal("counting the clusters waiting for acceptance", e))?
            .iter()
            .filter(|c| !c.hub_accepts_client)
            .count();
        if pending >= max {
            tracing::warn!(cluster = %name, pending, max, "join refused: too many clusters wait for acceptance");
            return Err(Status::resource_exhausted(format!(
                "{pending} clusters already wait for acceptance (the hub's limit is {max}): an \
                 admin must accept (`flower-hub accept NAME`) or delete (`flower-hub revoke NAME \
                 --delete`) some of them first; `flower-hub status` lists them"
            )));
        }
        Ok(())
    }

    async fn join_inner(&self, remote: &str, req: JoinRequest) -> Result<JoinResponse, Status> {
        let shared = &self.shared;
        let (token_id, secret) = self.admit(remote, &req)?;
        let record = shared
            .store
            .get_token(token_id)
            .await
            .map_err(|e| internal("reading the token", e))?;
        if let Err(error) = tokens::verify(record.as_ref(), secret, unix_now()) {
            tracing::info!(token_id, cluster = %req.cluster_name, %remote, %error, "join refused");
            return Err(Status::unauthenticated(error.to_string()));
        }
        let Some(token) = record else {
            return Err(Status::unauthenticated(
                tokens::TokenError::Unknown.to_string(),
            ));
        };
        let refuse = |error| refused(token_id, &req.cluster_name, remote, error);
        token.check_name(&req.cluster_name).map_err(refuse)?;
        let fingerprint = csr_key_fingerprint(&req.csr_pem).map_err(|e| {
            Status::invalid_argument(format!(
                "csr_pem is not a valid PEM PKCS#10 certificate request: {e}"
            ))
        })?;
        let name = req.cluster_name.clone();
        // Identity is the admin's: labels (placement, auto-accept) come from the token or the
        // ManagedCluster; what the agent asserts about itself — its labels and claims — is
        // recorded as claims only (explicit claims win over labels of the same name).
        let mut claims: BTreeMap<String, String> = req.labels.clone().into_iter().collect();
        claims.extend(req.claims.clone());
        let joining = Joining {
            name: name.clone(),
            key_fingerprint: fingerprint,
            claims,
            agent_version: req.agent_version.clone(),
            token_id: token_id.to_string(),
        };

        // One join per name at a time: the check below and the write that binds the key must
        // not interleave with another join of the same name.
        let _join_guard = shared.lock_join(&name).await;
        let existing = shared
            .store
            .get_cluster(&name)
            .await
            .map_err(|e| internal("reading the cluster", e))?;
        let decision = join::decide(
            &token,
            existing.as_ref(),
            &joining,
            &shared.config.auto_accept,
            unix_now(),
        )
        .map_err(|refusal| match refusal {
            JoinRefusal::Token(error) => refuse(error),
            JoinRefusal::NameTaken => {
                tracing::warn!(cluster = %name, %remote, "join refused: name taken by another key");
                Status::already_exists(format!(
                    "cluster {name:?} is already registered with a different key. If that cluster \
                     is gone, delete it on the hub with `flower-hub revoke {name} --delete` and join \
                     again; otherwise choose another --cluster-name"
                ))
            }
        })?;
        let accepted = self.record(decision, &name, token_id, remote).await?;
        // Still under the join lock: the status and certificate follow this join's record.
        self.answer(&name, accepted, &req.csr_pem).await
    }

    /// What a join must pass before the store is read: the rate limits (per address, an IPv6
    /// one by its /64, and per token), a well-formed token, and a valid name, labels, claims and
    /// agent version. The token's id and secret.
    fn admit<'r>(&self, remote: &str, req: &'r JoinRequest) -> Result<(&'r str, &'r str), Status> {
        let limiter = &self.shared.limiter;
        let rated = remote
            .parse::<std::net::IpAddr>()
            .map(|ip| crate::flower::front::PeerKey::of(ip).to_string())
            .unwrap_or_else(|_| remote.to_owned());
        if !limiter.allow(&format!("addr:{rated}")) {
            return Err(Status::resource_exhausted(format!(
                "too many join attempts from {remote}; retry in a few seconds"
            )));
        }
        let (token_id, secret) =
            tokens::parse(&req.token).map_err(|e| Status::invalid_argument(e.to_string()))?;
        if !limiter.allow(&format!("token:{token_id}")) {
            return Err(Status::resource_exhausted(
                "too many join attempts with this token; retry in a few seconds",
            ));
        }
        validate_cluster_name(&req.cluster_name)?;
        validate_map("labels", &req.labels)?;
        validate_map("claims", &req.claims)?;
        validate_agent_version(&req.agent_version)?;
        Ok((token_id, secret))
    }

    /// Records a join's `decision` (registering a cluster, new or pre-created, uses the token
    /// once); whether the cluster is accepted.
    async fn record(
        &self,
        decision: JoinDecision,
        name: &str,
        token_id: &str,
        remote: &str,
    ) -> Result<bool, Status> {
        let store = &self.shared.store;
        let use_token = || async {
            match store.use_token(token_id).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(refused(token_id, name, remote, tokens::TokenError::UsedUp)),
                Err(e) => Err(internal("counting the token's use", e)),
            }
        };
        Ok(match decision {
            JoinDecision::Register {
                registration,
                auto_accepted: auto,
            } => {
                if !auto {
                    self.check_pending_room(name).await?;
                }
                use_token().await?;
                match store.create_cluster(&registration, auto).await {
                    Ok(()) => {}
                    Err(StoreError::AlreadyExists(_)) => {
                        return Err(Status::aborted(format!(
                            "cluster {name:?} was registered concurrently; retry"
                        )));
                    }
                    Err(e) => return Err(internal("recording the cluster", e)),
                }
                tracing::info!(cluster = %name, token_id, %remote, auto_accepted = auto, "cluster registered");
                auto
            }
            JoinDecision::BindPreCreated {
                registration,
                accepted,
            } => {
                use_token().await?;
                store
                    .update_registration(&registration)
                    .await
                    .map_err(|e| internal("binding the pre-created cluster to its key", e))?;
                tracing::info!(
                    cluster = %name, token_id, %remote, accepted,
                    "pre-created cluster bound to the joining key"
                );
                accepted
            }
            JoinDecision::Rejoin { update, accepted } => {
                if let Some(updated) = update {
                    store
                        .update_registration(&updated)
                        .await
                        .map_err(|e| internal("updating the cluster", e))?;
                }
                accepted
            }
        })
    }

    /// The answer to a join of cluster `name` once it is recorded: pending (the condition says
    /// why) until an admin accepted it, else its client certificate signed from `csr_pem`.
    async fn answer(
        &self,
        name: &str,
        accepted: bool,
        csr_pem: &str,
    ) -> Result<JoinResponse, Status> {
        let shared = &self.shared;
        let now = unix_now();
        if !accepted {
            shared
                .update_status(name, |st| {
                    st.set_condition(
                        CONDITION_HUB_ACCEPTED,
                        "False",
                        "WaitingForAcceptance",
                        "run `flower-hub accept` to accept this cluster",
                        now,
                    );
                })
                .await
                .map_err(|e| internal("updating the cluster status", e))?;
            return Ok(JoinResponse {
                status: JoinStatus::Pending as i32,
                message: format!(
                    "waiting for the hub to accept cluster {name}: run `flower-hub accept {name}`"
                ),
                ..Default::default()
            });
        }
        let (issued, not_after) = issue(shared, csr_pem, name)?;
        shared
            .update_status(name, |st| {
                st.set_condition(
                    CONDITION_HUB_ACCEPTED,
                    "True",
                    "HubClusterAdminAccepted",
                    "",
                    now,
                );
                st.set_condition(CONDITION_JOINED, "True", "ClientCertificateIssued", "", now);
                record_issue(st, &shared.ca, not_after);
            })
            .await
            .map_err(|e| internal("updating the cluster status", e))?;
        tracing::info!(cluster = %name, not_after, "client certificate issued");
        Ok(JoinResponse {
            status: JoinStatus::Accepted as i32,
            client_cert_pem: issued.cert_pem,
            ca_bundle_pem: shared.ca.bundle_pem().to_string(),
            valid_until: Some(timestamp(issued.not_after)),
            message: String::new(),
        })
    }

    async fn renew_inner(
        &self,
        identity: Option<&super::tls::PeerIdentity>,
        req: RenewRequest,
    ) -> Result<RenewResponse, Status> {
        let shared = &self.shared;
        let record = shared.authorize(identity).await?;
        let name = record.registration.name;
        let fingerprint = csr_key_fingerprint(&req.csr_pem).map_err(|e| {
            Status::invalid_argument(format!(
                "csr_pem is not a valid PEM PKCS#10 certificate request: {e}"
            ))
        })?;
        if fingerprint != record.registration.key_fingerprint {
            return Err(Status::permission_denied(format!(
                "a renewal must keep the key cluster {name:?} is registered with"
            )));
        }
        let (issued, not_after) = issue(shared, &req.csr_pem, &name)?;
        shared
            .update_status(&name, |st| record_issue(st, &shared.ca, not_after))
            .await
            .map_err(|e| internal("updating the cluster status", e))?;
        tracing::info!(cluster = %name, not_after, "client certificate renewed");
        Ok(RenewResponse {
            client_cert_pem: issued.cert_pem,
            ca_bundle_pem: shared.ca.bundle_pem().to_string(),
            valid_until: Some(timestamp(issued.not_after)),
        })
    }
}

/// Signs `csr_pem` as cluster `name`'s client certificate; returns it and its end (Unix seconds).
fn issue<S, W>(
    shared: &Shared<S, W>,
    csr_pem: &str,
    name: &str,
) -> Result<(crate::registration::ca::IssuedCert, u64), Status> {
    let issued = shared
        .ca
        .sign_client_csr(csr_pem, name, shared.config.cert_validity)
        .map_err(|e| Status::invalid_argument(format!("cannot sign csr_pem: {e}")))?;
    let not_after = unix(issued.not_after);
    Ok((issued, not_after))
}

/// A cluster name must be a DNS-1123 label: it becomes a file name, an object name and a CN.
/// [`crate::core::HUB_CLUSTER`] is the hub's own cluster and cannot be joined.
pub(crate) fn validate_cluster_name(name: &str) -> Result<(), Status> {
    if let Err(why) = flower_addon_crds::dns_label(name) {
        return Err(Status::invalid_argument(format!(
            "cluster_name {name:?} {why}: it must be a DNS-1123 label (1-63 lowercase letters, \
             digits or '-', starting and ending with a letter or digit)"
        )));
    }
    if name == crate::core::HUB_CLUSTER {
        return Err(Status::invalid_argument(format!(
            "cluster_name {name:?} is the hub's own cluster; choose another --cluster-name"
        )));
    }
    Ok(())
}

/// Longest `agent_version` a join may carry (it is stored on the cluster and shown by `status`).
pub const MAX_AGENT_VERSION: usize = 64;

/// `agent_version`: at most [`MAX_AGENT_VERSION`] printable ASCII characters.
fn validate_agent_version(version: &str) -> Result<(), Status> {
    if version.len() > MAX_AGENT_VERSION || !version.chars().all(|c| c.is_ascii_graphic()) {
        return Err(Status::invalid_argument(format!(
            "agent_version must be at most {MAX_AGENT_VERSION} printable ASCII characters without \
             spaces (got {} bytes)",
            version.len()
        )));
    }
    Ok(())
}

fn validate_map(what: &str, map: &std::collections::HashMap<String, String>) -> Result<(), Status> {
    if map.len() > MAX_LABELS {
        return Err(Status::invalid_argument(format!(
            "at most {MAX_LABELS} {what} are allowed, got {}",
            map.len()
        )));
    }
    for (k, v) in map {
        if k.is_empty() || k.len() > MAX_LABEL_KEY || v.len() > MAX_LABEL_VALUE {
            return Err(Status::invalid_argument(format!(
                "{what} key {k:?} must be 1-{MAX_LABEL_KEY} characters and its value at most \
                 {MAX_LABEL_VALUE}"
            )));
        }
    }
    Ok(())
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp {
        seconds: i64::try_from(unix(t)).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// Records in a cluster's status the client certificate just issued: its end of validity, the
/// CA that signed it and the bundle sent with it.
pub(crate) fn record_issue(
    st: &mut crate::registration::store::ClusterStatus,
    ca: &crate::registration::ca::HubCa,
    not_after: u64,
) {
    st.client_cert_not_after_unix = Some(not_after);
    st.client_cert_issuer = Some(ca.hash().to_owned());
    st.channel_bundle = Some(crate::registration::ca::bundle_id(ca.bundle_pem()));
}

/// `PERMISSION_DENIED` for a join the token does not allow, logged.
fn refused(token_id: &str, cluster: &str, remote: &str, error: tokens::TokenError) -> Status {
    tracing::info!(token_id, cluster = %cluster, %remote, %error, "join refused");
    Status::permission_denied(error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_names_are_dns_labels_and_not_the_hubs_own() {
        // A name becomes a path, an object name and a CN; the hub's own cluster is reserved so no
        // agent can receive the work of Federations without placementRef.
        assert!(validate_cluster_name("spoke-1").is_ok());
        for bad in ["", "../x", "Spoke", "-a", crate::core::HUB_CLUSTER] {
            let err = validate_cluster_name(bad).expect_err(bad);
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad}");
            assert!(err.message().contains("cluster_name"), "{}", err.message());
        }
    }
}

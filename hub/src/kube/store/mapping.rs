//! How registration records (with the observed status and the availability taints that follow
//! it), tokens and the CA map onto ManagedClusters and Secrets (pure).
use super::*;

pub(super) fn not_found(kind: &'static str, name: &str) -> StoreError {
    StoreError::NotFound {
        kind,
        name: name.to_owned(),
    }
}

pub(super) fn conflict(name: &str) -> StoreError {
    StoreError::Io {
        path: format!("ManagedCluster {name}"),
        source: std::io::Error::other("too many conflicting concurrent updates"),
    }
}

/// Writes the agent-declared part of `registration` into `status`: its claims and version. The
/// cluster's labels are the admin's and live in `metadata.labels` ([`record_of`]); `status.labels`
/// (where older hubs kept what agents asserted) is cleared.
pub(super) fn set_declared(status: &mut ManagedClusterStatus, registration: &ClusterRegistration) {
    status.labels = BTreeMap::new();
    status.cluster_claims = registration
        .claims
        .iter()
        .map(|(name, value)| ClusterClaim {
            name: name.clone(),
            value: value.clone(),
        })
        .collect();
    let version = status
        .version
        .get_or_insert_with(ManagedClusterVersion::default);
    version.agent =
        (!registration.agent_version.is_empty()).then(|| registration.agent_version.clone());
}

/// The registration annotations of `registration`.
pub(super) fn registration_annotations(
    registration: &ClusterRegistration,
) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::from([
        (
            ANN_KEY_FINGERPRINT.to_owned(),
            registration.key_fingerprint.clone(),
        ),
        (ANN_TOKEN_ID.to_owned(), registration.token_id.clone()),
        (
            ANN_CREATED.to_owned(),
            registration.created_unix.to_string(),
        ),
    ]);
    if let Some(previous) = &registration.previous_key_fingerprint {
        annotations.insert(ANN_PREVIOUS_KEY_FINGERPRINT.to_owned(), previous.clone());
    }
    annotations
}

/// The stored record of a ManagedCluster.
pub fn record_of(mc: &ManagedCluster) -> ClusterRecord {
    let annotations = mc.annotations();
    let ann = |k: &str| annotations.get(k).cloned().unwrap_or_default();
    let status = mc.status.clone().unwrap_or_default();
    let created_unix = ann(ANN_CREATED)
        .parse()
        .ok()
        .or_else(|| mc.creation_timestamp().as_ref().map(unix_of))
        .unwrap_or(0);
    ClusterRecord {
        registration: ClusterRegistration {
            name: mc.name_any(),
            labels: mc.labels().clone(),
            claims: status
                .cluster_claims
                .iter()
                .map(|c| (c.name.clone(), c.value.clone()))
                .collect(),
            key_fingerprint: ann(ANN_KEY_FINGERPRINT),
            previous_key_fingerprint: annotations.get(ANN_PREVIOUS_KEY_FINGERPRINT).cloned(),
            agent_version: status
                .version
                .as_ref()
                .and_then(|v| v.agent.clone())
                .unwrap_or_default(),
            token_id: ann(ANN_TOKEN_ID),
            created_unix,
        },
        hub_accepts_client: mc.spec.hub_accepts_client,
        lease_duration: u64::try_from(mc.spec.lease_duration_seconds)
            .ok()
            .filter(|s| *s > 0)
            .map(std::time::Duration::from_secs),
        status: ClusterStatus {
            last_heartbeat_unix: status.last_heartbeat.as_ref().map(unix_of),
            client_cert_not_after_unix: ann(ANN_CLIENT_CERT_NOT_AFTER).parse().ok(),
            client_cert_issuer: Some(ann(ANN_CLIENT_CERT_ISSUER)).filter(|v| !v.is_empty()),
            channel_bundle: Some(ann(ANN_CHANNEL_BUNDLE)).filter(|v| !v.is_empty()),
            conditions: status
                .conditions
                .iter()
                .map(|c| ClusterCondition {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                    last_transition_unix: unix_of(&c.last_transition_time),
                })
                .collect(),
            allocatable: status
                .allocatable
                .iter()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect(),
        },
    }
}

/// Sets the availability taint the `Available` condition calls for, as OCM does: `Unknown`
/// (lease missed) → [`TAINT_UNREACHABLE`], `False` (e.g. revoked) → [`TAINT_UNAVAILABLE`],
/// `True` or not set → neither. `timeAdded` is the condition's transition time. Other taints are
/// never touched. True if anything changed.
pub(super) fn sync_availability_taints(
    spec: &mut ManagedClusterSpec,
    status: &ClusterStatus,
) -> bool {
    let wanted = status.availability_taint();
    let before = spec.taints.len();
    spec.taints.retain(|t| {
        !(t.key == TAINT_UNREACHABLE || t.key == TAINT_UNAVAILABLE)
            || Some(t.key.as_str()) == wanted.map(|(key, _)| key)
    });
    let mut changed = spec.taints.len() != before;
    if let Some((key, added)) = wanted
        && !spec.taints.iter().any(|t| t.key == key)
    {
        spec.taints.push(Taint {
            key: key.to_owned(),
            value: None,
            effect: TaintEffect::NoSelect,
            time_added: Some(time_of(added)),
        });
        changed = true;
    }
    changed
}

/// The spec and metadata that follow the observed status: the availability taints and the
/// client certificate's end of validity; whether anything changed.
pub(super) fn sync_spec_with_status(mc: &mut ManagedCluster, status: &ClusterStatus) -> bool {
    let not_after = status.client_cert_not_after_unix.map(|t| t.to_string());
    let mut changed = sync_availability_taints(&mut mc.spec, status);
    let annotations = mc.annotations_mut();
    for (key, value) in [
        (ANN_CLIENT_CERT_NOT_AFTER, not_after.as_ref()),
        (ANN_CLIENT_CERT_ISSUER, status.client_cert_issuer.as_ref()),
        (ANN_CHANNEL_BUNDLE, status.channel_bundle.as_ref()),
    ] {
        if annotations.get(key) != value {
            match value {
                Some(v) => annotations.insert(key.to_owned(), v.clone()),
                None => annotations.remove(key),
            };
            changed = true;
        }
    }
    changed
}

/// Writes `status` into the ManagedCluster's status subresource fields it maps to.
pub(super) fn set_observed(observed: &mut ManagedClusterStatus, status: &ClusterStatus) {
    observed.last_heartbeat = status.last_heartbeat_unix.map(time_of);
    observed.allocatable = status
        .allocatable
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.clone()),
            )
        })
        .collect();
    observed.conditions = status
        .conditions
        .iter()
        .map(|c| Condition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            observed_generation: None,
            last_transition_time: time_of(c.last_transition_unix),
        })
        .collect();
}

/// `unix` (seconds) as a Kubernetes time (the epoch when out of range).
pub(super) fn time_of(unix: u64) -> Time {
    Time(
        k8s_openapi::jiff::Timestamp::from_second(i64::try_from(unix).unwrap_or(i64::MAX))
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

/// A Kubernetes time as Unix seconds (0 before the epoch).
pub(super) fn unix_of(time: &Time) -> u64 {
    u64::try_from(time.0.as_second()).unwrap_or(0)
}

/// DNS names of the hub Service in `namespace`, shortest first (`flower-hub`, `flower-hub.<ns>`,
/// `flower-hub.<ns>.svc`, `flower-hub.<ns>.svc.cluster.local`).
pub fn hub_service_dns_names(namespace: &str) -> Vec<String> {
    vec![
        HUB_SERVICE.to_owned(),
        format!("{HUB_SERVICE}.{namespace}"),
        hub_service_server_name(namespace),
        format!("{HUB_SERVICE}.{namespace}.svc.cluster.local"),
    ]
}

/// The name agents verify the hub certificate by when they dial a node or load-balancer address:
/// `flower-hub.<namespace>.svc`.
pub fn hub_service_server_name(namespace: &str) -> String {
    format!("{HUB_SERVICE}.{namespace}.svc")
}

pub(super) fn token_secret_name(id: &str) -> String {
    format!("{TOKEN_SECRET_PREFIX}{id}")
}

pub(super) fn token_secret(namespace: &str, token: &TokenRecord) -> Result<Secret, StoreError> {
    let expires = k8s_openapi::jiff::Timestamp::from_second(
        i64::try_from(token.expires_unix).unwrap_or(i64::MAX),
    )
    .map(|t| t.to_string())
    .unwrap_or_default();
    let body = serde_json::to_vec(token).map_err(|e| StoreError::Corrupt {
        path: token_secret_name(&token.id),
        detail: e.to_string(),
    })?;
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(token_secret_name(&token.id)),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                TOKEN_LABEL.to_owned(),
                "true".to_owned(),
            )])),
            annotations: Some(BTreeMap::from([(ANN_TOKEN_EXPIRES.to_owned(), expires)])),
            ..Default::default()
        },
        type_: Some(TOKEN_SECRET_TYPE.to_owned()),
        data: Some(BTreeMap::from([(
            "token.json".to_owned(),
            ByteString(body),
        )])),
        ..Default::default()
    })
}

pub(super) fn token_of(secret: &Secret) -> Result<TokenRecord, StoreError> {
    let name = secret.name_any();
    let data = secret
        .data
        .as_ref()
        .and_then(|d| d.get("token.json"))
        .ok_or_else(|| StoreError::Corrupt {
            path: name.clone(),
            detail: "no token.json".into(),
        })?;
    serde_json::from_slice(&data.0).map_err(|e| StoreError::Corrupt {
        path: name,
        detail: e.to_string(),
    })
}

pub(super) fn ca_of(secret: &Secret) -> Result<CaMaterial, StoreError> {
    let data = secret.data.clone().unwrap_or_default();
    let get = |k: &str| {
        data.get(k)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .ok_or_else(|| StoreError::Corrupt {
                path: CA_SECRET.into(),
                detail: format!("no {k}"),
            })
    };
    let optional = |k: &str| {
        data.get(k)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    let next = match (optional(NEXT_CERT_KEY), optional(NEXT_KEY_KEY)) {
        (Some(cert_pem), Some(key_pem)) => Some(Box::new(CaMaterial {
            cert_pem,
            key_pem,
            next: None,
            previous_cert_pem: None,
            previous_key_pem: None,
        })),
        _ => None,
    };
    Ok(CaMaterial {
        cert_pem: get("ca.crt")?,
        key_pem: get("ca.key")?,
        next,
        previous_cert_pem: optional(PREVIOUS_CERT_KEY),
        previous_key_pem: optional(PREVIOUS_KEY_KEY),
    })
}

/// Key of a CA Secret holding the next CA's certificate while a rotation is staged.
pub const NEXT_CERT_KEY: &str = "next.crt";
/// Key of a CA Secret holding the next CA's private key while a rotation is staged.
pub const NEXT_KEY_KEY: &str = "next.key";
/// Key of a CA Secret holding the replaced CA's certificate until it is retired.
pub const PREVIOUS_CERT_KEY: &str = "previous.crt";
/// Key of a CA Secret holding the replaced CA's private key until it is retired (the Flower CA's
/// per-Federation CAs are derived from it).
pub const PREVIOUS_KEY_KEY: &str = "previous.key";

/// The data of the Secret holding `ca`.
pub(super) fn ca_data(ca: &CaMaterial) -> BTreeMap<String, ByteString> {
    let mut data = BTreeMap::from([
        (
            "ca.crt".to_owned(),
            ByteString(ca.cert_pem.clone().into_bytes()),
        ),
        (
            "ca.key".to_owned(),
            ByteString(ca.key_pem.clone().into_bytes()),
        ),
    ]);
    if let Some(next) = &ca.next {
        data.insert(
            NEXT_CERT_KEY.to_owned(),
            ByteString(next.cert_pem.clone().into_bytes()),
        );
        data.insert(
            NEXT_KEY_KEY.to_owned(),
            ByteString(next.key_pem.clone().into_bytes()),
        );
    }
    if let Some(previous) = &ca.previous_cert_pem {
        data.insert(
            PREVIOUS_CERT_KEY.to_owned(),
            ByteString(previous.clone().into_bytes()),
        );
    }
    if let Some(previous) = &ca.previous_key_pem {
        data.insert(
            PREVIOUS_KEY_KEY.to_owned(),
            ByteString(previous.clone().into_bytes()),
        );
    }
    data
}

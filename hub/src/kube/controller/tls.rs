//! The SuperLink TLS Secret issued by the hub CA (`tls.crt`, `tls.key`, `ca.crt`).
//!
//! Issued once and kept: a fresh certificate on every reconcile would change the Secret and roll
//! the SuperLink. It is re-issued only when its SANs or the CA changed, or when it is due
//! ([`crate::core::renewal`]: 80 % of its life, or longer-lived than the configured validity);
//! annotations record what it was issued for. `ensure_certificate` is the reconcile's step that
//! keeps or re-issues it; the SuperLink's pod template carries its end of validity
//! (`annotate_not_after`), so a renewed certificate rolls the pod.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flower_addon_crds::Federation;
use flower_addon_crds::render::component_labels;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use crate::core::render::{ExternalAddressError, ExternalEndpoints, superlink_tls_secret_name};
use crate::registration::ca::FederationCa;

use super::apply::own;
use super::{Context, Error, Result, apply, cache};

/// Lifetime of SuperLink certificates issued before the start of validity was recorded
/// ([`NOT_BEFORE_ANNOTATION`]).
const LEGACY_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);
/// Annotation with the start of validity, seconds since the Unix epoch.
pub const NOT_BEFORE_ANNOTATION: &str = "flower-addon.io/tls-not-before";
/// Annotation with the comma-separated SANs the certificate was issued for.
pub const SANS_ANNOTATION: &str = "flower-addon.io/tls-sans";
/// Annotation with the end of validity, seconds since the Unix epoch.
pub const NOT_AFTER_ANNOTATION: &str = "flower-addon.io/tls-not-after";
/// Annotation with the hash of the CA that signed the certificate.
pub const CA_HASH_ANNOTATION: &str = "flower-addon.io/tls-ca-hash";

/// Whether the hub issues the Federation's SuperLink certificate (TLS on, no user Secret).
pub fn hub_issues_tls(fed: &Federation) -> bool {
    !fed.spec.insecure
        && fed
            .spec
            .tls
            .as_ref()
            .and_then(|t| t.secret_name.as_ref())
            .is_none()
}

fn epoch_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The validity the Secret's annotations record (start derived for Secrets issued before it was
/// recorded).
fn validity_of(secret: &Secret) -> (SystemTime, SystemTime) {
    let at = |key: &str| {
        secret
            .annotations()
            .get(key)
            .and_then(|v| v.parse::<u64>().ok())
            .map(|s| UNIX_EPOCH + Duration::from_secs(s))
    };
    let not_after = at(NOT_AFTER_ANNOTATION).unwrap_or(UNIX_EPOCH);
    let not_before = at(NOT_BEFORE_ANNOTATION)
        .unwrap_or_else(|| not_after.checked_sub(LEGACY_LIFETIME).unwrap_or(UNIX_EPOCH));
    (not_before, not_after)
}

/// What the controller needs of the certificate in `secret` under `validity`: its end of
/// validity (marks the SuperLink pod template) and the time until renewal.
pub(super) fn certificate_of(secret: &Secret, validity: Duration, now: SystemTime) -> Certificate {
    let (not_before, not_after) = validity_of(secret);
    Certificate {
        not_after: secret
            .annotations()
            .get(NOT_AFTER_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
        renew_in: crate::core::renewal::until_renewal(not_before, not_after, validity, now),
    }
}

/// Whether `existing` still serves: same SANs and CA, and not due for renewal under `validity`.
pub fn still_valid(
    existing: &Secret,
    sans: &[String],
    ca: &FederationCa,
    now: SystemTime,
    validity: Duration,
) -> bool {
    let (not_before, not_after) = validity_of(existing);
    serves_but_for_age(existing, sans, ca)
        && !crate::core::renewal::needs_renewal(not_before, not_after, validity, now)
}

/// Whether `existing` would serve but for its age: same SANs and CA, certificate and key
/// present and a usable pair. A certificate that passes this but is due may wait for the runs
/// in progress ([`crate::flower::renewal`]); one that fails it is issued again at once.
pub fn serves_but_for_age(existing: &Secret, sans: &[String], ca: &FederationCa) -> bool {
    let annotations = existing.annotations();
    let same_sans = annotations.get(SANS_ANNOTATION) == Some(&sans.join(","));
    let same_ca = annotations.get(CA_HASH_ANNOTATION).map(String::as_str) == Some(ca.hash());
    // Present and usable: a garbled certificate or key under right-looking annotations is
    // issued again.
    let complete = existing.data.as_ref().is_some_and(|d| {
        d.contains_key("ca.crt")
            && match (d.get("tls.crt"), d.get("tls.key")) {
                (Some(cert), Some(key)) => crate::core::renewal::pair_is_usable(&cert.0, &key.0),
                _ => false,
            }
    });
    same_sans && same_ca && complete
}

/// `existing` with `ca.crt` set to the CA bundle in force, when it holds another (a CA rotation
/// was staged or retired: the bundle changed, the signer did not, so the certificate stays).
pub fn with_current_bundle(existing: &Secret, ca: &FederationCa) -> Option<Secret> {
    let data = existing.data.as_ref()?;
    if data.get("ca.crt").map(|b| b.0.as_slice()) == Some(ca.bundle_pem().as_bytes()) {
        return None;
    }
    let mut data = data.clone();
    data.insert(
        "ca.crt".to_owned(),
        ByteString(ca.bundle_pem().as_bytes().to_vec()),
    );
    Some(Secret {
        metadata: ObjectMeta {
            name: existing.metadata.name.clone(),
            namespace: existing.metadata.namespace.clone(),
            labels: existing.metadata.labels.clone(),
            annotations: existing.metadata.annotations.clone(),
            owner_references: existing.metadata.owner_references.clone(),
            ..ObjectMeta::default()
        },
        type_: existing.type_.clone(),
        data: Some(data),
        ..Secret::default()
    })
}

/// A new SuperLink TLS Secret for `fed`, valid for `validity`, signed by `ca` (the
/// Federation's own), owned by the Federation.
pub fn issue_secret(
    fed: &Federation,
    ca: &FederationCa,
    sans: &[String],
    validity: Duration,
) -> Result<Secret, Error> {
    let name = fed.name_any();
    let issued = ca
        .issue_superlink_cert(&name, sans, validity)
        .map_err(Error::Ca)?;
    let mut metadata = ObjectMeta {
        name: Some(superlink_tls_secret_name(fed)),
        namespace: fed.namespace(),
        labels: Some(component_labels(&name, "superlink", "superlink-tls", None)),
        annotations: Some(BTreeMap::from([
            (SANS_ANNOTATION.to_owned(), sans.join(",")),
            (
                NOT_BEFORE_ANNOTATION.to_owned(),
                epoch_secs(issued.not_before).to_string(),
            ),
            (
                NOT_AFTER_ANNOTATION.to_owned(),
                epoch_secs(issued.not_after).to_string(),
            ),
            (CA_HASH_ANNOTATION.to_owned(), ca.hash().to_owned()),
        ])),
        ..ObjectMeta::default()
    };
    own(&mut metadata, fed);
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    Ok(Secret {
        metadata,
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(BTreeMap::from([
            ("tls.crt".to_owned(), bytes(&issued.cert_pem)),
            ("tls.key".to_owned(), bytes(&issued.key_pem)),
            ("ca.crt".to_owned(), bytes(ca.bundle_pem())),
        ])),
        ..Secret::default()
    })
}

/// Marks the SuperLink's pod template with its certificate's end of validity (a renewed
/// certificate rolls the pod).
pub(super) fn annotate_not_after(superlink: &mut StatefulSet, not_after: String) {
    superlink
        .spec
        .template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(Default::default)
        .insert(NOT_AFTER_ANNOTATION.to_owned(), not_after);
}

/// The SuperLink certificate in force: its end of validity (the Secret's
/// [`NOT_AFTER_ANNOTATION`]) and how long until it is due for renewal.
pub(super) struct Certificate {
    pub(super) not_after: String,
    pub(super) renew_in: Duration,
}

/// Issues the SuperLink TLS Secret unless the stored one is the Federation's, still valid and
/// for the same names. The stored one is read from the cache; a Secret not (yet) cached is read
/// from the apiserver, so a lagging cache never re-issues a certificate.
pub(super) async fn ensure_certificate(
    fed: &Federation,
    ctx: &Context,
    namespace: &str,
    external: Option<&Result<ExternalEndpoints, ExternalAddressError>>,
) -> Result<Certificate> {
    let secret_name = superlink_tls_secret_name(fed);
    let secrets_api = Api::<Secret>::namespaced(ctx.client.clone(), namespace);
    let mut reached_at = crate::core::superlink::in_cluster_names(fed);
    if let Some(Ok(endpoints)) = external {
        reached_at.push(endpoints.fleet_host().to_owned());
    }
    let sans = crate::core::superlink::superlink_sans(fed, reached_at);
    let existing = match cache::cached(&ctx.caches.secrets, namespace, &secret_name) {
        Some(secret) => Some(secret.as_ref().clone()),
        None => secrets_api
            .get_opt(&secret_name)
            .await
            .map_err(|source| Error::Kube {
                action: format!("get Secret {secret_name}"),
                source,
            })?,
    };
    let owned = existing.as_ref().is_some_and(|s| {
        s.owner_references()
            .iter()
            .any(|r| Some(&r.uid) == fed.uid().as_ref())
    });
    let now = SystemTime::now();
    let validity = ctx.settings.superlink_cert_validity;
    let ca = ctx
        .ca
        .federation(namespace, &fed.name_any())
        .map_err(Error::Ca)?;
    if let Some(existing) = existing.as_ref()
        && owned
        && serves_but_for_age(existing, &sans, &ca)
    {
        let (not_before, not_after) = validity_of(existing);
        let kept = if crate::core::renewal::needs_renewal(not_before, not_after, validity, now) {
            // Due by age: it waits for the runs in progress (the pod would roll under them).
            ctx.renewal_waits(fed, not_before, not_after)
                .await
                .map(|recheck| Certificate {
                    renew_in: recheck,
                    ..certificate_of(existing, validity, now)
                })
        } else {
            Some(certificate_of(existing, validity, now))
        };
        if let Some(certificate) = kept {
            if let Some(updated) = with_current_bundle(existing, &ca) {
                apply::apply_body(&secrets_api, &secret_name, &cache::body(&updated)?).await?;
                tracing::info!(federation = %fed.name_any(), %namespace, "SuperLink CA bundle updated");
            }
            return Ok(certificate);
        }
    }
    let secret = issue_secret(fed, &ca, &sans, validity)?;
    let certificate = certificate_of(&secret, validity, now);
    let body = cache::body(&secret)?;
    apply::apply_body(&secrets_api, &secret_name, &body).await?;
    tracing::info!(federation = %fed.name_any(), %namespace, sans = %sans.join(","), "SuperLink certificate issued");
    ctx.publish(
        fed,
        EventType::Normal,
        "CertificateIssued",
        format!("SuperLink certificate issued for {}", sans.join(", ")),
    )
    .await;
    Ok(certificate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(yaml: &str) -> Federation {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const TLS: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {name: f, namespace: team}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  insecure: false
  superlink: {image: "flwr/superlink:1.42.0", externalAddress: "10.0.0.7:30092"}
  supernodes: {image: "flwr/supernode:1.42.0", pools: [{name: a, replicas: 1, images: {}}]}
  tls: {extraSANs: [flower.example]}
"#;

    use crate::registration::ca::CaRole;

    #[test]
    fn an_issued_secret_is_kept_until_sans_ca_or_validity_change() {
        // Re-issuing on every reconcile would churn the Secret; stale ones must be replaced.
        let hub = crate::registration::ca::HubCa::generate_for(CaRole::Flower).unwrap();
        let ca = hub.federation("team", "f").unwrap();
        let f = fed(TLS);
        let sans = crate::core::superlink::superlink_sans(
            &f,
            crate::core::superlink::in_cluster_names(&f),
        );
        let validity = crate::core::renewal::DEFAULT_SUPERLINK_CERT_VALIDITY;
        let secret = issue_secret(&f, &ca, &sans, validity).unwrap();
        let now = SystemTime::now();
        assert!(still_valid(&secret, &sans, &ca, now, validity));
        assert!(!still_valid(&secret, &sans[1..], &ca, now, validity));
        // Another Federation's CA, or the same name under another hub's CA.
        assert!(!still_valid(
            &secret,
            &sans,
            &hub.federation("team", "other").unwrap(),
            now,
            validity
        ));
        assert!(!still_valid(
            &secret,
            &sans,
            &crate::registration::ca::HubCa::generate_for(CaRole::Flower)
                .unwrap()
                .federation("team", "f")
                .unwrap(),
            now,
            validity
        ));
        // Due at 80 % of its life; at once when the policy became shorter.
        assert!(still_valid(
            &secret,
            &sans,
            &ca,
            now + validity.mul_f64(0.75),
            validity
        ));
        assert!(!still_valid(
            &secret,
            &sans,
            &ca,
            now + validity.mul_f64(0.81),
            validity
        ));
        assert!(!still_valid(
            &secret,
            &sans,
            &ca,
            now,
            Duration::from_secs(3600)
        ));
        // Garbled under right-looking annotations (a bad restore, a hand edit): issued again.
        for (key, bytes) in [
            ("tls.crt", &b"not a certificate"[..]),
            (
                "tls.key",
                &b"-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n"[..],
            ),
        ] {
            let mut garbled = secret.clone();
            garbled
                .data
                .as_mut()
                .expect("data")
                .insert(key.to_owned(), ByteString(bytes.to_vec()));
            assert!(!still_valid(&garbled, &sans, &ca, now, validity), "{key}");
        }
        // Another valid pair's key: not this certificate's.
        let other = issue_secret(&f, &ca, &sans, validity).unwrap();
        let mut mixed = secret.clone();
        mixed.data.as_mut().expect("data").insert(
            "tls.key".to_owned(),
            other.data.as_ref().expect("data")["tls.key"].clone(),
        );
        assert!(!still_valid(&mixed, &sans, &ca, now, validity));
    }
}

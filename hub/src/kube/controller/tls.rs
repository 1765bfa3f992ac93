//! The SuperLink TLS Secret issued by the hub CA (`tls.crt`, `tls.key`, `ca.crt`).
//!
//! Issued once and kept: a fresh certificate on every reconcile would change the Secret (and
//! restart nothing, but churn every watcher). It is re-issued only when its SANs, the CA, or the
//! remaining validity (less than a third left) say so; annotations record what it was issued for.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flower_addon_crds::Federation;
use flower_addon_crds::render::component_labels;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::core::render::superlink_tls_secret_name;
use crate::registration::ca::HubCa;

use super::Error;
use super::apply::own;

/// Lifetime of a hub-issued SuperLink certificate.
pub const SUPERLINK_CERT_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);
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

/// Whether `existing` still serves: same SANs and CA, and more than a third of its life left.
pub fn still_valid(existing: &Secret, sans: &[String], ca: &HubCa, now: SystemTime) -> bool {
    let annotations = existing.annotations();
    let same_sans = annotations.get(SANS_ANNOTATION) == Some(&sans.join(","));
    let same_ca = annotations.get(CA_HASH_ANNOTATION).map(String::as_str) == Some(ca.hash());
    let not_after = annotations
        .get(NOT_AFTER_ANNOTATION)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let fresh = not_after > epoch_secs(now) + SUPERLINK_CERT_LIFETIME.as_secs() / 3;
    let complete = existing.data.as_ref().is_some_and(|d| {
        ["tls.crt", "tls.key", "ca.crt"]
            .iter()
            .all(|k| d.contains_key(*k))
    });
    same_sans && same_ca && fresh && complete
}

/// A new SuperLink TLS Secret for `fed`, signed by `ca`, owned by the Federation.
pub fn issue_secret(fed: &Federation, ca: &HubCa, sans: &[String]) -> Result<Secret, Error> {
    let name = fed.name_any();
    let issued = ca
        .issue_superlink_cert(&name, sans, SUPERLINK_CERT_LIFETIME)
        .map_err(Error::Ca)?;
    let mut metadata = ObjectMeta {
        name: Some(superlink_tls_secret_name(fed)),
        namespace: fed.namespace(),
        labels: Some(component_labels(&name, "superlink", "superlink-tls", None)),
        annotations: Some(BTreeMap::from([
            (SANS_ANNOTATION.to_owned(), sans.join(",")),
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
            ("ca.crt".to_owned(), bytes(ca.cert_pem())),
        ])),
        ..Secret::default()
    })
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

    #[test]
    fn an_issued_secret_is_kept_until_sans_ca_or_validity_change() {
        // Re-issuing on every reconcile would churn the Secret; stale ones must be replaced.
        let ca = HubCa::generate().unwrap();
        let f = fed(TLS);
        let sans = crate::core::superlink::superlink_sans(
            &f,
            crate::core::superlink::in_cluster_names(&f),
        );
        let secret = issue_secret(&f, &ca, &sans).unwrap();
        let now = SystemTime::now();
        assert!(still_valid(&secret, &sans, &ca, now));
        assert!(!still_valid(&secret, &sans[1..], &ca, now));
        assert!(!still_valid(
            &secret,
            &sans,
            &HubCa::generate().unwrap(),
            now
        ));
        assert!(!still_valid(
            &secret,
            &sans,
            &ca,
            now + SUPERLINK_CERT_LIFETIME
        ));
    }
}

//! Each Federation's own SuperLink CA.
//!
//! SuperNodes trust exactly one CA for their SuperLink: their Federation's. A SuperLink's key is
//! readable by the code that Federation runs next to it (its ServerApps), so were every
//! SuperLink certificate signed by the hub's one Flower CA, a tenant holding Federation A's key
//! could pass as Federation B's SuperLink to B's SuperNodes (the certificates share names: the
//! hub's address, `127.0.0.1`). With a CA per Federation, A's certificate does not verify for
//! B's SuperNodes, whatever the names.
//!
//! The per-Federation CA is **derived**, not stored: its Ed25519 key is an HMAC-SHA256 of the
//! Federation's `namespace/name` keyed by the Flower CA's private key, and its certificate takes
//! its validity and serial from that derivation, so the same hub CA gives byte-for-byte the same
//! Federation CA in every process and after every restart (Ed25519 signatures are
//! deterministic), in both hub modes, with nothing to persist, clean up or back up. It follows
//! the Flower CA's rotation: while a next CA is staged or a replaced one not yet retired, a
//! Federation's bundle holds the CA derived from each, the signing one first.
use super::pki::{CaError, CaMaterial, IssuedKeyPair, issue_serving_cert};
use hmac::{Hmac, Mac};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};
use std::time::{Duration, SystemTime};

/// What the derivation mixes in before the Federation's name: a new scheme gets a new label.
const DERIVATION_LABEL: &[u8] = b"flower-addon superlink CA v1\0";

/// PKCS#8 v1 header of an Ed25519 private key (RFC 8410): the 32-byte seed follows.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// A Federation's SuperLink CA, ready to sign its SuperLink certificate.
pub struct FederationCa {
    bundle_pem: String,
    cert_pem: String,
    hash: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for FederationCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FederationCa")
            .field("hash", &self.hash)
            .finish_non_exhaustive()
    }
}

impl FederationCa {
    /// The CAs of Federation `namespace/name` derived from every Flower CA of `material` that
    /// has its key at hand: the signing one, the staged next one, the replaced one until retired.
    pub fn derive(material: &CaMaterial, namespace: &str, name: &str) -> Result<Self, CaError> {
        let mut hub_cas = vec![(&material.cert_pem, &material.key_pem)];
        if let Some(next) = &material.next {
            hub_cas.push((&next.cert_pem, &next.key_pem));
        }
        if let (Some(cert), Some(key)) = (&material.previous_cert_pem, &material.previous_key_pem) {
            hub_cas.push((cert, key));
        }
        let mut bundle_pem = String::new();
        let mut signing = None;
        for (cert, key) in hub_cas {
            let (pem, issuer) = derive_one(cert, key, namespace, name)?;
            bundle_pem.push_str(&pem);
            signing.get_or_insert((pem, issuer));
        }
        let (cert_pem, issuer) = signing.expect("the signing CA is always there");
        let der =
            CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| CaError::Parse {
                what: "Federation CA certificate PEM",
                detail: e.to_string(),
            })?;
        let hash = super::pki::ca_cert_hash(&der)?;
        Ok(Self {
            bundle_pem,
            cert_pem,
            hash,
            issuer,
        })
    }

    /// PEM of every CA this Federation's SuperNodes and `flwr` trust, the signing one first.
    pub fn bundle_pem(&self) -> &str {
        &self.bundle_pem
    }

    /// PEM of the CA that signs this Federation's SuperLink certificate now.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// `sha256:<hex>` of the signing CA's public key: a stored SuperLink certificate records it,
    /// and one signed by another CA is re-issued.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// Issues the Federation's SuperLink server certificate (fresh ECDSA P-256 key) for the
    /// addresses SuperNodes and `flwr` dial (`sans`: DNS names or IP addresses).
    pub fn issue_superlink_cert(
        &self,
        federation: &str,
        sans: &[String],
        lifetime: Duration,
    ) -> Result<IssuedKeyPair, CaError> {
        issue_serving_cert(
            &self.issuer,
            &format!("{federation} superlink"),
            sans,
            lifetime,
        )
    }
}

/// The CA of `namespace/name` derived from one hub Flower CA: its certificate PEM and signer.
fn derive_one(
    hub_cert_pem: &str,
    hub_key_pem: &str,
    namespace: &str,
    name: &str,
) -> Result<(String, Issuer<'static, KeyPair>), CaError> {
    let hub_key = KeyPair::from_pem(hub_key_pem)?;
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&hub_key.serialize_der())
        .expect("HMAC takes a key of any length");
    mac.update(DERIVATION_LABEL);
    mac.update(namespace.as_bytes());
    mac.update(b"/");
    mac.update(name.as_bytes());
    let seed = mac.finalize().into_bytes();
    let mut pkcs8 = ED25519_PKCS8_PREFIX.to_vec();
    pkcs8.extend_from_slice(&seed);
    let key = KeyPair::from_pkcs8_der_and_sign_algo(
        &PrivatePkcs8KeyDer::from(pkcs8),
        &rcgen::PKCS_ED25519,
    )?;

    let hub_der =
        CertificateDer::from_pem_slice(hub_cert_pem.as_bytes()).map_err(|e| CaError::Parse {
            what: "Flower CA certificate PEM",
            detail: e.to_string(),
        })?;
    let (_, hub_cert) =
        x509_parser::parse_x509_certificate(&hub_der).map_err(|e| CaError::Parse {
            what: "Flower CA certificate DER",
            detail: e.to_string(),
        })?;
    let at = |t: x509_parser::time::ASN1Time| {
        SystemTime::UNIX_EPOCH + Duration::from_secs(t.timestamp().max(0) as u64)
    };
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "flower-addon");
    dn.push(DnType::CommonName, common_name(namespace, name));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // The serial is public: a hash of the (secret) seed reveals nothing of it.
    let mut serial: [u8; 16] = Sha256::digest(seed)[..16]
        .try_into()
        .expect("16 of 32 bytes");
    serial[0] &= 0x7f;
    serial[0] |= 0x01;
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    params.not_before = at(hub_cert.validity().not_before).into();
    params.not_after = at(hub_cert.validity().not_after).into();
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), Issuer::new(params, key)))
}

/// `<namespace>/<name> SuperLink CA`, or, when that is longer than a common name may be (64),
/// the start of it with a hash of the whole.
fn common_name(namespace: &str, name: &str) -> String {
    let full = format!("{namespace}/{name} SuperLink CA");
    if full.len() <= 64 {
        return full;
    }
    let hash = hex::encode(&Sha256::digest(full.as_bytes())[..6]);
    let mut short: String = format!("{namespace}/{name}").chars().take(36).collect();
    short.push_str(&format!("~{hash} SuperLink CA"));
    short
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registration::ca::{CaRole, HubCa};
    use crate::registration::rotation::{RotationStep, rotate};

    fn flower_ca() -> HubCa {
        HubCa::generate_for(CaRole::Flower).unwrap()
    }

    fn certs(pem: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .map(Result::unwrap)
            .collect()
    }

    /// Whether `cert_pem` verifies as a server certificate for 127.0.0.1 with only `bundle_pem`
    /// trusted (what a SuperNode checks).
    fn verifies(cert_pem: &str, bundle_pem: &str) -> bool {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{ServerName, UnixTime};
        let mut roots = rustls::RootCertStore::empty();
        for ca in certs(bundle_pem) {
            roots.add(ca).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            std::sync::Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let leaf = certs(cert_pem).remove(0);
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &ServerName::try_from("127.0.0.1").unwrap(),
                &[],
                UnixTime::now(),
            )
            .is_ok()
    }

    fn sans() -> Vec<String> {
        vec!["127.0.0.1".into(), "localhost".into()]
    }

    #[test]
    fn the_same_flower_ca_derives_the_same_federation_ca_byte_for_byte() {
        let hub = flower_ca();
        let a = FederationCa::derive(hub.material(), "team", "a").unwrap();
        let again = FederationCa::derive(hub.material(), "team", "a").unwrap();
        assert_eq!(a.bundle_pem(), again.bundle_pem());
        assert_eq!(a.hash(), again.hash());
        // From the persisted form, as another process or a restarted hub loads it.
        let reloaded = HubCa::from_material(hub.material().clone()).unwrap();
        let from_reloaded = FederationCa::derive(reloaded.material(), "team", "a").unwrap();
        assert_eq!(a.bundle_pem(), from_reloaded.bundle_pem());
        assert_eq!(certs(a.bundle_pem()).len(), 1);
    }

    #[test]
    fn federations_get_different_cas_and_one_federations_certificate_fails_for_another() {
        let hub = flower_ca();
        let a = FederationCa::derive(hub.material(), "team", "a").unwrap();
        let b = FederationCa::derive(hub.material(), "team", "b").unwrap();
        // A namespace never holds a `/`, so `namespace/name` names one Federation only.
        let c = FederationCa::derive(hub.material(), "tea", "m/a").unwrap();
        assert_ne!(a.hash(), b.hash());
        assert_ne!(a.hash(), c.hash());
        let a_cert = a
            .issue_superlink_cert("a", &sans(), Duration::from_secs(3600))
            .unwrap();
        assert!(verifies(&a_cert.cert_pem, a.bundle_pem()));
        assert!(
            !verifies(&a_cert.cert_pem, b.bundle_pem()),
            "A's SuperLink certificate must not pass for B's SuperNodes, same names and all"
        );
        // Nor does the hub's own Flower CA sign for any Federation.
        assert!(!verifies(&a_cert.cert_pem, hub.bundle_pem()));
        // Another hub's CA derives other CAs for the same names.
        let other_hub = flower_ca();
        let a_elsewhere = FederationCa::derive(other_hub.material(), "team", "a").unwrap();
        assert_ne!(a.hash(), a_elsewhere.hash());
    }

    #[test]
    fn a_federation_ca_lives_as_long_as_the_flower_ca_and_is_a_ca() {
        let hub = flower_ca();
        let a = FederationCa::derive(hub.material(), "team", "a").unwrap();
        let der = certs(a.cert_pem()).remove(0);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let hub_der = certs(hub.cert_pem()).remove(0);
        let (_, hub_cert) = x509_parser::parse_x509_certificate(&hub_der).unwrap();
        assert_eq!(cert.validity(), hub_cert.validity());
        assert!(cert.is_ca());
        assert_eq!(
            cert.subject().to_string(),
            "O=flower-addon, CN=team/a SuperLink CA"
        );
    }

    #[test]
    fn a_rotation_of_the_flower_ca_rotates_every_federation_ca_with_it() {
        let hub = flower_ca();
        let idle = FederationCa::derive(hub.material(), "team", "a").unwrap();
        let before = idle
            .issue_superlink_cert("a", &sans(), Duration::from_secs(3600))
            .unwrap();

        let staged = rotate(CaRole::Flower, hub.material(), RotationStep::Stage).unwrap();
        let staged_ca = FederationCa::derive(&staged, "team", "a").unwrap();
        // Same signer, the next one trusted already: nothing re-issued, SuperNodes given both.
        assert_eq!(staged_ca.hash(), idle.hash());
        assert_eq!(certs(staged_ca.bundle_pem()).len(), 2);
        assert!(staged_ca.bundle_pem().starts_with(idle.bundle_pem()));

        let promoted = rotate(CaRole::Flower, &staged, RotationStep::Promote).unwrap();
        let promoted_ca = FederationCa::derive(&promoted, "team", "a").unwrap();
        assert_ne!(promoted_ca.hash(), idle.hash());
        assert_eq!(certs(promoted_ca.bundle_pem()).len(), 2);
        let after = promoted_ca
            .issue_superlink_cert("a", &sans(), Duration::from_secs(3600))
            .unwrap();
        // A SuperNode that took the staged bundle accepts the new certificate, and one that
        // took the promoted bundle still accepts the old one until retire.
        assert!(verifies(&after.cert_pem, staged_ca.bundle_pem()));
        assert!(verifies(&before.cert_pem, promoted_ca.bundle_pem()));

        let retired = rotate(CaRole::Flower, &promoted, RotationStep::Retire).unwrap();
        let retired_ca = FederationCa::derive(&retired, "team", "a").unwrap();
        assert_eq!(certs(retired_ca.bundle_pem()).len(), 1);
        assert!(verifies(&after.cert_pem, retired_ca.bundle_pem()));
        assert!(!verifies(&before.cert_pem, retired_ca.bundle_pem()));
    }

    #[test]
    fn long_names_make_a_short_common_name() {
        let ns = "n".repeat(63);
        let name = "f".repeat(253);
        let cn = common_name(&ns, &name);
        assert!(cn.len() <= 64, "{cn} ({} bytes)", cn.len());
        assert_ne!(cn, common_name(&ns, &"g".repeat(253)));
        FederationCa::derive(flower_ca().material(), &ns, &name).unwrap();
    }
}

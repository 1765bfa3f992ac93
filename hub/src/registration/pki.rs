//! Certificate primitives both hub CAs use (the work-channel and Flower CAs in [`super::ca`],
//! the per-Federation CAs in [`super::federation_ca`]): the persisted CA material, issued
//! certificates and their validity, serving certificates, fingerprints and serial numbers.
use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SerialNumber,
};
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime};

/// Certificates start this much in the past so small clock skew between machines does not matter.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Errors of the certificate authority.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// rcgen refused to build, parse or sign something.
    #[error("certificate error: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// A PEM or DER input could not be parsed.
    #[error("cannot parse {what}: {detail}")]
    Parse {
        /// What was being parsed.
        what: &'static str,
        /// Why it failed.
        detail: String,
    },
    /// A requested name is not acceptable in a certificate.
    #[error("invalid name {0:?}")]
    InvalidName(String),
}

/// The persisted form of the CA: PEM certificate and PEM (PKCS#8) private key of the CA that
/// signs, and, while a rotation is under way ([`crate::registration::rotation`]), the CA staged
/// to sign next or the one it replaced: both are trusted beside it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaMaterial {
    /// PEM of the self-signed CA certificate.
    pub cert_pem: String,
    /// PEM of the CA private key. Secret.
    pub key_pem: String,
    /// The CA that signs after the next `promote` (trusted already; its key kept for then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Box<CaMaterial>>,
    /// PEM of the CA this one replaced, trusted until `retire`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_cert_pem: Option<String>,
    /// PEM of the replaced CA's private key, kept until `retire` so that the Flower CA's
    /// per-Federation CAs derived from it stay trusted as well
    /// ([`super::federation_ca`]). Secret. Absent in records of hubs before per-Federation CAs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_key_pem: Option<String>,
}

impl std::fmt::Debug for CaMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaMaterial")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// A certificate with the private key it was issued for (both PEM).
#[derive(Clone)]
pub struct IssuedKeyPair {
    /// PEM certificate.
    pub cert_pem: String,
    /// PEM (PKCS#8) private key. Secret.
    pub key_pem: String,
    /// Start of validity (backdated a little for clock skew).
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
}

/// A certificate issued from a CSR (the key stays with the requester).
#[derive(Clone, Debug)]
pub struct IssuedCert {
    /// PEM certificate.
    pub cert_pem: String,
    /// End of validity.
    pub not_after: SystemTime,
    /// `sha256:<hex>` of the certificate's SubjectPublicKeyInfo (see [`spki_fingerprint`]).
    pub key_fingerprint: String,
}

/// Start and end of a certificate's validity.
#[derive(Clone, Copy, Debug)]
pub struct Validity {
    /// First instant the certificate is valid.
    pub not_before: SystemTime,
    /// Last instant the certificate is valid.
    pub not_after: SystemTime,
}

impl Validity {
    /// From now (backdated up to 5 minutes, at most a tenth of `lifetime`, for clock skew) for
    /// `lifetime`.
    pub fn from_now(lifetime: Duration) -> Self {
        let now = SystemTime::now();
        Self {
            not_before: now - BACKDATE.min(lifetime / 10),
            not_after: now + lifetime,
        }
    }
}

/// A server certificate (fresh ECDSA P-256 key) for `sans`, signed by `issuer`.
pub(super) fn issue_serving_cert(
    issuer: &Issuer<'static, KeyPair>,
    common_name: &str,
    sans: &[String],
    lifetime: Duration,
) -> Result<IssuedKeyPair, CaError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(sans.to_vec())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "flower-addon");
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.serial_number = Some(random_serial());
    params.use_authority_key_identifier_extension = true;
    let validity = Validity::from_now(lifetime);
    params.not_before = validity.not_before.into();
    params.not_after = validity.not_after.into();
    let cert = params.signed_by(&key, issuer)?;
    Ok(IssuedKeyPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_before: validity.not_before,
        not_after: validity.not_after,
    })
}

/// `sha256:<hex>` of a certificate's SubjectPublicKeyInfo DER (the CA hash when applied to the
/// CA certificate).
pub fn ca_cert_hash(cert_der: &[u8]) -> Result<String, CaError> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).map_err(|e| CaError::Parse {
        what: "certificate DER",
        detail: e.to_string(),
    })?;
    Ok(spki_fingerprint(cert.tbs_certificate.subject_pki.raw))
}

pub use flower_addon_runtime::tls::spki_fingerprint;

/// `sha256:<hex>` of the public key in a PEM CSR (the key the hub pins a cluster to). The CSR's
/// self-signature is verified.
pub fn csr_key_fingerprint(csr_pem: &str) -> Result<String, CaError> {
    let csr = CertificateSigningRequestParams::from_pem(csr_pem)?;
    Ok(spki_fingerprint(&csr.public_key.subject_public_key_info()))
}

/// A positive random 128-bit serial number.
pub(super) fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

/// A CA bundle as one string: its CAs' hashes (`sha256:…`), comma-separated, in bundle order.
pub fn bundle_id(bundle_pem: &str) -> String {
    flower_addon_runtime::tls::bundle_hashes(bundle_pem).join(",")
}

//! The hub certificate authorities (rcgen, ECDSA P-256): the work-channel CA signs the gRPC server
//! certificate and agent client certificates; the Flower CA is what each Federation's SuperLink CA
//! is derived from ([`super::federation_ca`]).
//!
//! The CA is identified by its hash `sha256:<hex>`: the SHA-256 of the DER-encoded
//! SubjectPublicKeyInfo of the CA certificate, exactly like kubeadm's
//! `--discovery-token-ca-cert-hash`. Hashing the public key (not the whole certificate) keeps the
//! hash stable if the CA certificate is ever re-issued with the same key.
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::sync::Arc;
use std::time::Duration;

pub use super::federation_ca::FederationCa;
pub use super::pki::{
    CaError, CaMaterial, IssuedCert, IssuedKeyPair, Validity, bundle_id, ca_cert_hash,
    csr_key_fingerprint, spki_fingerprint,
};
use super::pki::{issue_serving_cert, random_serial};

/// Validity of the CA certificate itself.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// What a hub CA signs. The two never share a key: the CA an agent pins with `--ca-hash` signs only
/// the hub's work-channel server certificate and the agents' client certificates; SuperLink
/// certificates (what SuperNodes and `flwr` trust) come from per-Federation CAs derived from the
/// Flower CA, so no certificate a SuperLink holds can pass as the hub or another Federation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaRole {
    /// The work channel: hub server certificate, agent client certificates.
    Channel,
    /// Flower-facing: what each Federation's SuperLink CA is derived from.
    Flower,
}

impl CaRole {
    fn common_name(self) -> &'static str {
        match self {
            Self::Channel => "flower-addon hub CA",
            Self::Flower => "flower-addon Flower CA",
        }
    }
}

/// The hub CA, ready to sign.
pub struct HubCa {
    material: CaMaterial,
    bundle_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    hash: String,
    /// The per-Federation CAs derived so far (Flower role), by `(namespace, name)`.
    federations: dashmap::DashMap<(String, String), Arc<FederationCa>>,
}

impl std::fmt::Debug for HubCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubCa")
            .field("hash", &self.hash)
            .finish_non_exhaustive()
    }
}

// === impl HubCa ===

impl HubCa {
    /// Makes a new work-channel CA (fresh key, self-signed, 10 years). Persist
    /// [`HubCa::material`] before use.
    pub fn generate() -> Result<Self, CaError> {
        Self::generate_for(CaRole::Channel)
    }

    /// Makes a new CA for `role` (fresh key, self-signed, 10 years).
    pub fn generate_for(role: CaRole) -> Result<Self, CaError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "flower-addon");
        dn.push(DnType::CommonName, role.common_name());
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(random_serial());
        let validity = Validity::from_now(CA_VALIDITY);
        params.not_before = validity.not_before.into();
        params.not_after = validity.not_after.into();
        let cert = params.self_signed(&key)?;
        Self::from_material(CaMaterial {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            next: None,
            previous_cert_pem: None,
            previous_key_pem: None,
        })
    }

    /// Loads a CA from its persisted PEM material.
    pub fn from_material(material: CaMaterial) -> Result<Self, CaError> {
        let cert_der =
            CertificateDer::from_pem_slice(material.cert_pem.as_bytes()).map_err(|e| {
                CaError::Parse {
                    what: "CA certificate PEM",
                    detail: e.to_string(),
                }
            })?;
        let key = KeyPair::from_pem(&material.key_pem)?;
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)?;
        let hash = ca_cert_hash(&cert_der)?;
        let mut bundle_pem = String::new();
        for pem in std::iter::once(&material.cert_pem)
            .chain(material.next.as_ref().map(|n| &n.cert_pem))
            .chain(material.previous_cert_pem.as_ref())
        {
            CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| CaError::Parse {
                what: "trusted CA certificate PEM",
                detail: e.to_string(),
            })?;
            // As stored: without a rotation the bundle is the CA certificate's PEM byte for
            // byte, so agents that stored it before rotations existed see no change (a changed
            // bundle makes every agent renew).
            bundle_pem.push_str(pem);
            if !pem.ends_with('\n') {
                bundle_pem.push('\n');
            }
        }
        Ok(Self {
            material,
            bundle_pem,
            cert_der,
            issuer,
            hash,
            federations: dashmap::DashMap::new(),
        })
    }

    /// The persisted form (certificate + key PEM).
    pub fn material(&self) -> &CaMaterial {
        &self.material
    }

    /// PEM of the certificate of the CA that signs.
    pub fn cert_pem(&self) -> &str {
        &self.material.cert_pem
    }

    /// PEM of every CA certificate to trust, the signing one first: with a rotation under way
    /// also the next or the previous CA. What SuperNodes, `flwr` and agents are given; without a
    /// rotation exactly [`Self::cert_pem`].
    pub fn bundle_pem(&self) -> &str {
        &self.bundle_pem
    }

    /// Hex SHA-256 of [`Self::bundle_pem`] (what a work-channel `Ping` carries, so agents
    /// notice a changed bundle).
    pub fn bundle_sha256(&self) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(self.bundle_pem.as_bytes()))
    }

    /// DER of every certificate of [`Self::bundle_pem`].
    pub fn bundle_der(&self) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(self.bundle_pem.as_bytes())
            .filter_map(Result::ok)
            .collect()
    }

    /// DER of the CA certificate.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// `sha256:<hex>` of the CA certificate's SubjectPublicKeyInfo (what `--ca-hash` pins).
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// Issues the hub's gRPC server certificate with a fresh key. `advertise` are the names or IP
    /// addresses agents dial; `127.0.0.1` and `localhost` are always added.
    pub fn issue_server_cert(
        &self,
        advertise: &[String],
        lifetime: Duration,
    ) -> Result<IssuedKeyPair, CaError> {
        let mut sans: Vec<String> = advertise.to_vec();
        for default in ["127.0.0.1", "localhost"] {
            if !sans.iter().any(|s| s == default) {
                sans.push(default.to_string());
            }
        }
        issue_serving_cert(&self.issuer, "flower-addon hub", &sans, lifetime)
    }

    /// The SuperLink CA of Federation `namespace/name`, derived from this (Flower) CA and
    /// remembered: what signs that Federation's SuperLink certificate and what its SuperNodes and
    /// `flwr` trust ([`super::federation_ca`]).
    pub fn federation(&self, namespace: &str, name: &str) -> Result<Arc<FederationCa>, CaError> {
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(ca) = self.federations.get(&key) {
            return Ok(ca.clone());
        }
        let ca = Arc::new(FederationCa::derive(&self.material, namespace, name)?);
        self.federations.insert(key, ca.clone());
        Ok(ca)
    }

    /// Signs an agent's CSR as a client certificate for `cluster_name`, valid for `lifetime`.
    /// Only the CSR's public key is used: subject (CN = `cluster_name`), CA=false, clientAuth,
    /// serial and validity are decided here whatever the CSR asks for.
    pub fn sign_client_csr(
        &self,
        csr_pem: &str,
        cluster_name: &str,
        lifetime: Duration,
    ) -> Result<IssuedCert, CaError> {
        self.sign_client_csr_with_validity(csr_pem, cluster_name, Validity::from_now(lifetime))
    }

    /// Like [`HubCa::sign_client_csr`] with an explicit validity window (tests use it to make
    /// expired certificates).
    pub fn sign_client_csr_with_validity(
        &self,
        csr_pem: &str,
        cluster_name: &str,
        validity: Validity,
    ) -> Result<IssuedCert, CaError> {
        if cluster_name.is_empty() || cluster_name.len() > 253 {
            return Err(CaError::InvalidName(cluster_name.to_string()));
        }
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "flower-addon");
        dn.push(DnType::CommonName, cluster_name);
        self.sign_client(csr_pem, dn, Vec::new(), validity)
    }

    /// Signs the CSR of an agent installed as an Open Cluster Management addon for `cluster`:
    /// common name [`flower_addon_proto::OCM_ADDON_AGENT_CN`] (what OCM's klusterlet expects of
    /// the certificate), the cluster in the URI SAN
    /// [`flower_addon_proto::OCM_ADDON_CLUSTER_URI_PREFIX`]`<cluster>` (what
    /// [`crate::channel::tls::peer_identity`] reads), valid for `lifetime`. As with
    /// [`HubCa::sign_client_csr`], only the CSR's public key is used.
    pub fn sign_ocm_addon_csr(
        &self,
        csr_pem: &str,
        cluster: &str,
        lifetime: Duration,
    ) -> Result<IssuedCert, CaError> {
        if cluster.is_empty() || cluster.len() > 253 {
            return Err(CaError::InvalidName(cluster.to_string()));
        }
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, flower_addon_proto::OCM_ADDON_AGENT_CN);
        let uri = format!(
            "{}{cluster}",
            flower_addon_proto::OCM_ADDON_CLUSTER_URI_PREFIX
        );
        let san = rcgen::SanType::URI(
            rcgen::string::Ia5String::try_from(uri)
                .map_err(|_| CaError::InvalidName(cluster.to_string()))?,
        );
        self.sign_client(csr_pem, dn, vec![san], Validity::from_now(lifetime))
    }

    /// A client certificate for the key of `csr_pem` (whose self-signature is verified) with
    /// subject `dn` and `sans`; nothing else of the CSR is copied.
    fn sign_client(
        &self,
        csr_pem: &str,
        dn: DistinguishedName,
        sans: Vec<rcgen::SanType>,
        validity: Validity,
    ) -> Result<IssuedCert, CaError> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem)?;
        let key_fingerprint = spki_fingerprint(&csr.public_key.subject_public_key_info());
        // Start from empty parameters: nothing the CSR asked for is copied.
        let mut params = CertificateParams::default();
        params.distinguished_name = dn;
        params.subject_alt_names = sans;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        params.not_before = validity.not_before.into();
        params.not_after = validity.not_after.into();
        let cert = params.signed_by(&csr.public_key, &self.issuer)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            not_after: validity.not_after,
            key_fingerprint,
        })
    }
}

//! SuperNode public keys in the two forms Flower uses: the agents report the OpenSSH line of
//! each SuperNode's key (`ecdsa-sha2-nistp384 AAAA… comment`, what `ssh-keygen` writes and
//! `--auth-supernode-private-key` pairs with), and the SuperLink's Control API takes and lists
//! a PEM `SubjectPublicKeyInfo` (what `flwr supernode register KEY.pub` sends after
//! `load_ssh_public_key(…).public_bytes(PEM, SubjectPublicKeyInfo)`).
use base64::Engine;
use ssh_key::public::{EcdsaPublicKey, KeyData};

/// Why a reported key cannot be registered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// Not an OpenSSH public key line.
    #[error("not an OpenSSH public key line ({0}); expected 'ecdsa-sha2-nistp384 AAAA…'")]
    Parse(String),
    /// A key type Flower refuses (RSA, Ed25519…: SuperNode authentication takes NIST EC keys).
    #[error(
        "{0} keys are not accepted by Flower's SuperNode authentication; use an ECDSA NIST P-256/P-384/P-521 key"
    )]
    Unsupported(String),
}

/// DER of the `SubjectPublicKeyInfo` for an OpenSSH ECDSA public key line.
pub fn openssh_to_spki_der(line: &str) -> Result<Vec<u8>, KeyError> {
    let key = ssh_key::PublicKey::from_openssh(line.trim())
        .map_err(|e| KeyError::Parse(e.to_string()))?;
    let (curve_oid, point): (&[u8], &[u8]) = match key.key_data() {
        // 1.2.840.10045.3.1.7 (prime256v1), 1.3.132.0.34 (secp384r1), 1.3.132.0.35 (secp521r1)
        KeyData::Ecdsa(EcdsaPublicKey::NistP256(p)) => (
            &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07],
            p.as_bytes(),
        ),
        KeyData::Ecdsa(EcdsaPublicKey::NistP384(p)) => {
            (&[0x2b, 0x81, 0x04, 0x00, 0x22], p.as_bytes())
        }
        KeyData::Ecdsa(EcdsaPublicKey::NistP521(p)) => {
            (&[0x2b, 0x81, 0x04, 0x00, 0x23], p.as_bytes())
        }
        other => return Err(KeyError::Unsupported(other.algorithm().to_string())),
    };
    // 1.2.840.10045.2.1 (id-ecPublicKey)
    const EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    let algorithm = der(
        0x30,
        &[der(0x06, EC_PUBLIC_KEY), der(0x06, curve_oid)].concat(),
    );
    let mut bits = vec![0u8]; // no unused bits
    bits.extend_from_slice(point);
    Ok(der(0x30, &[algorithm, der(0x03, &bits)].concat()))
}

/// PEM (`-----BEGIN PUBLIC KEY-----`, 64-column base64) of an OpenSSH ECDSA public key line:
/// byte for byte what `flwr supernode register` sends.
pub fn openssh_to_spki_pem(line: &str) -> Result<String, KeyError> {
    let der = openssh_to_spki_der(line)?;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN PUBLIC KEY-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END PUBLIC KEY-----\n");
    Ok(pem)
}

/// The DER inside a PEM block the SuperLink lists (`NodeInfo.public_key`), to compare keys
/// whatever the line wrapping. `None` when it is not PEM.
pub fn pem_to_der(pem: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(pem).ok()?;
    let body: String = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("-----"))
        .collect();
    base64::engine::general_purpose::STANDARD.decode(body).ok()
}

fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values from Flower's own path (Python `cryptography`, flwr 1.42.0 venv):
    // load_ssh_public_key(line).public_bytes(PEM, SubjectPublicKeyInfo).
    const P384: &str = "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBJ7NryvMMKWyOHkfa/yQMy1fXLDk2ZksQLI534CBZwGEKN0FcG1/iEiL2wcX8Rhx2qa2XiRAu8z9peBedvXBheoWLSJ04EfLTvEssJ2FcpYK6e5ZTs6jdMIs7t3wpC5vKw== node0";
    const P384_PEM: &str = "-----BEGIN PUBLIC KEY-----\nMHYwEAYHKoZIzj0CAQYFK4EEACIDYgAEns2vK8wwpbI4eR9r/JAzLV9csOTZmSxA\nsjnfgIFnAYQo3QVwbX+ISIvbBxfxGHHaprZeJEC7zP2l4F529cGF6hYtInTgR8tO\n8SywnYVylgrp7llOzqN0wizu3fCkLm8r\n-----END PUBLIC KEY-----\n";
    const P256: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBL/YNaLovOBKZzyqXKYI3mOBU4R9ggzX8tS4I9ea7SmKRFjPc4aLV2eNpFP0C1X48nmhft+x8sjj4jEKOYcvi7s= n1";
    const P256_PEM: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEv9g1oui84EpnPKpcpgjeY4FThH2C\nDNfy1Lgj15rtKYpEWM9zhotXZ42kU/QLVfjyeaF+37HyyOPiMQo5hy+Luw==\n-----END PUBLIC KEY-----\n";

    #[test]
    fn openssh_lines_become_the_pem_flower_sends() {
        assert_eq!(openssh_to_spki_pem(P384).unwrap(), P384_PEM);
        assert_eq!(openssh_to_spki_pem(P256).unwrap(), P256_PEM);
        assert_eq!(
            pem_to_der(P384_PEM.as_bytes()).unwrap(),
            openssh_to_spki_der(P384).unwrap()
        );
    }

    #[test]
    fn other_keys_are_refused_with_the_fix() {
        let ed =
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x";
        let err = openssh_to_spki_pem(ed).unwrap_err();
        assert!(err.to_string().contains("ECDSA NIST"), "{err}");
        assert!(matches!(
            openssh_to_spki_pem("not a key"),
            Err(KeyError::Parse(_))
        ));
        assert_eq!(pem_to_der(b"\xff\xfe"), None);
    }
}

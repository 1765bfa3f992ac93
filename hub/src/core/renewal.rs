//! When the hub re-issues a SuperLink certificate — the same rule in both modes: at 80 % of its
//! life (a fifth left, as agents renew their client certificates), or at once when it lives
//! longer than the configured validity (the policy was shortened), and when the names or the
//! signing CA changed (decided by the adapters, which know what it was issued for).
use std::time::{Duration, SystemTime};

/// Default validity of a SuperLink certificate (`flower-hub serve --superlink-cert-validity`).
pub const DEFAULT_SUPERLINK_CERT_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);

/// Share of a certificate's life after which it is renewed.
pub const RENEW_AT: f64 = 0.8;

/// When a certificate valid from `not_before` to `not_after` is due for renewal under
/// `validity` (the configured lifetime): 80 % into its life, or now when its life exceeds
/// `validity` by more than the backdating the CA applies (a tenth).
pub fn renewal_due(
    not_before: SystemTime,
    not_after: SystemTime,
    validity: Duration,
) -> SystemTime {
    let life = not_after.duration_since(not_before).unwrap_or_default();
    if life > validity + validity / 10 {
        return not_before;
    }
    not_before + life.mul_f64(RENEW_AT)
}

/// Whether the certificate must be re-issued at `now` ([`renewal_due`]).
pub fn needs_renewal(
    not_before: SystemTime,
    not_after: SystemTime,
    validity: Duration,
    now: SystemTime,
) -> bool {
    now >= renewal_due(not_before, not_after, validity)
}

/// Whether `cert_pem` and `key_pem` still make a usable TLS pair: the certificate parses, the
/// key parses, and the key is the certificate's (the one check of both hub modes before keeping a
/// SuperLink certificate: a Secret or file garbled under annotations or a SANs marker that still
/// look right must be re-issued, not served to a SuperLink that then cannot start).
pub fn pair_is_usable(cert_pem: &[u8], key_pem: &[u8]) -> bool {
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert_pem) else {
        return false;
    };
    let Ok(cert) = pem.parse_x509() else {
        return false;
    };
    let Ok(key_text) = std::str::from_utf8(key_pem) else {
        return false;
    };
    let Ok(key) = rcgen::KeyPair::from_pem(key_text) else {
        return false;
    };
    use rcgen::PublicKeyData;
    cert.public_key().raw == key.subject_public_key_info().as_slice()
}

/// How long until the certificate is due, zero when it is (for the next reconcile's timing).
pub fn until_renewal(
    not_before: SystemTime,
    not_after: SystemTime,
    validity: Duration,
    now: SystemTime,
) -> Duration {
    renewal_due(not_before, not_after, validity)
        .duration_since(now)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn only_a_parsing_matching_pair_is_usable() {
        // Negative cases: a garbled certificate or key, or a key of another certificate, is not
        // kept (it would be served to a SuperLink that cannot start with it).
        let ca =
            crate::registration::ca::HubCa::generate_for(crate::registration::ca::CaRole::Flower)
                .expect("ca")
                .federation("team", "fed")
                .expect("Federation CA");
        let one = ca
            .issue_superlink_cert("fed", &["127.0.0.1".into()], Duration::from_secs(3600))
            .expect("cert");
        let other = ca
            .issue_superlink_cert("fed", &["127.0.0.1".into()], Duration::from_secs(3600))
            .expect("cert");
        let (cert, key) = (one.cert_pem.as_bytes(), one.key_pem.as_bytes());
        assert!(pair_is_usable(cert, key));
        assert!(
            !pair_is_usable(cert, other.key_pem.as_bytes()),
            "another key"
        );
        assert!(!pair_is_usable(b"garbage", key), "garbled certificate");
        assert!(!pair_is_usable(
            cert,
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
        ));
        assert!(
            !pair_is_usable(&cert[..cert.len() / 2], key),
            "cut certificate"
        );
        assert!(!pair_is_usable(cert, b""), "empty key");
        assert!(!pair_is_usable(cert, &[0xff, 0xfe]), "not text");
    }

    #[test]
    fn a_certificate_is_renewed_at_four_fifths_of_its_life() {
        // Invariant: a 90-day certificate is kept for 72 days, renewed from then on.
        let start = SystemTime::UNIX_EPOCH + 1000 * DAY;
        let end = start + 90 * DAY;
        let v = DEFAULT_SUPERLINK_CERT_VALIDITY;
        assert!(!needs_renewal(start, end, v, start + 71 * DAY));
        assert!(needs_renewal(start, end, v, start + 72 * DAY));
        assert_eq!(until_renewal(start, end, v, start + 70 * DAY), 2 * DAY);
        assert_eq!(until_renewal(start, end, v, end), Duration::ZERO);
    }

    #[test]
    fn a_certificate_longer_than_the_policy_is_renewed_now() {
        // Invariant: shortening --superlink-cert-validity replaces longer-lived certificates at
        // once; the CA's backdating (a tenth) does not count as longer.
        let start = SystemTime::UNIX_EPOCH + 1000 * DAY;
        let short = Duration::from_secs(60);
        assert!(needs_renewal(start, start + 365 * DAY, short, start));
        assert!(!needs_renewal(
            start,
            start + short + Duration::from_secs(6),
            short,
            start
        ));
    }
}

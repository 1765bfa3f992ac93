//! When the hub re-issues a SuperLink certificate — the same rule in both modes: at 80 % of its
//! life (a fifth left, as agents renew their client certificates), or at once when it lives
//! longer than the configured validity (the policy was shortened), and when the names or the
//! signing CA changed (decided by the adapters, which know what it was issued for).
//!
//! A renewal that is due only because the certificate aged waits for the runs in progress on
//! the SuperLink, at the latest until 95 % of its life ([`renewal_waits`]): the SuperLink
//! restarts on a new certificate, and Flower stops the runs it is running.
use std::time::{Duration, SystemTime};

use crate::core::run::ListedRun;

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

/// Share of a certificate's life until which a renewal due by age waits for runs in progress.
pub const RENEW_BY: f64 = 0.95;

/// The latest moment a renewal due by age waits for runs in progress: 95 % into the
/// certificate's life (a twentieth of it left: 4.5 days of the default 90).
pub fn renewal_deadline(not_before: SystemTime, not_after: SystemTime) -> SystemTime {
    let life = not_after.duration_since(not_before).unwrap_or_default();
    not_before + life.mul_f64(RENEW_BY)
}

/// The runs of `listed` that a SuperLink restart would stop: every one not finished
/// (`pending`, `starting`, `running`), by id.
pub fn runs_in_progress(listed: &[ListedRun]) -> Vec<u64> {
    let mut ids: Vec<u64> = listed
        .iter()
        .filter(|r| !r.status.starts_with("finished"))
        .map(|r| r.run_id)
        .collect();
    ids.sort_unstable();
    ids
}

/// Until when a certificate that is due waits for the runs `in_progress` at `now`: while any
/// run is in progress and the certificate is less than [`RENEW_BY`] into its life, and only when
/// it is due by age (one living longer than `validity` allows, after the policy was shortened,
/// is an admin's change and is renewed at once). `None`: renew now.
pub fn renewal_waits(
    in_progress: &[u64],
    not_before: SystemTime,
    not_after: SystemTime,
    validity: Duration,
    now: SystemTime,
) -> Option<SystemTime> {
    let life = not_after.duration_since(not_before).unwrap_or_default();
    let deadline = renewal_deadline(not_before, not_after);
    (!in_progress.is_empty() && life <= validity + validity / 10 && now < deadline)
        .then_some(deadline)
}

/// The validity (`not_before`, `not_after`) of the first certificate in `pem`.
pub fn certificate_validity(pem: &str) -> Option<(SystemTime, SystemTime)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let at = |t: x509_parser::time::ASN1Time| {
        let secs = u64::try_from(t.timestamp()).ok()?;
        Some(std::time::UNIX_EPOCH + Duration::from_secs(secs))
    };
    Some((
        at(cert.validity().not_before)?,
        at(cert.validity().not_after)?,
    ))
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

    fn listed(run_id: u64, status: &str) -> ListedRun {
        ListedRun {
            run_id,
            status: status.to_owned(),
            details: String::new(),
            fab_hash: String::new(),
            config: Default::default(),
            finished_at: String::new(),
        }
    }

    #[test]
    fn only_unfinished_runs_hold_a_renewal() {
        let runs = [
            listed(7, "finished:completed"),
            listed(5, "running"),
            listed(9, "pending"),
            listed(3, "starting"),
            listed(4, "finished:stopped"),
            listed(8, "finished:failed"),
        ];
        assert_eq!(runs_in_progress(&runs), [3, 5, 9]);
        assert!(runs_in_progress(&[listed(1, "finished:completed")]).is_empty());
    }

    #[test]
    fn a_due_renewal_waits_for_runs_until_95_percent_of_the_life() {
        let validity = 100 * DAY;
        let not_before = SystemTime::UNIX_EPOCH + 1000 * DAY;
        let not_after = not_before + validity;
        let due = renewal_due(not_before, not_after, validity);
        assert_eq!(due, not_before + 80 * DAY);
        let deadline = not_before + 95 * DAY;
        assert_eq!(renewal_deadline(not_before, not_after), deadline);
        // Runs in progress: it waits until the deadline, not after it.
        assert_eq!(
            renewal_waits(&[1], not_before, not_after, validity, due),
            Some(deadline)
        );
        assert_eq!(
            renewal_waits(
                &[1],
                not_before,
                not_after,
                validity,
                deadline - Duration::from_secs(1)
            ),
            Some(deadline)
        );
        assert_eq!(
            renewal_waits(&[1], not_before, not_after, validity, deadline),
            None
        );
        // No run in progress: renewed at once.
        assert_eq!(
            renewal_waits(&[], not_before, not_after, validity, due),
            None
        );
        // A certificate living longer than the (shortened) policy is renewed at once.
        assert_eq!(
            renewal_waits(&[1], not_before, not_after, 30 * DAY, not_before + DAY),
            None
        );
    }

    #[test]
    fn the_validity_of_an_issued_certificate_is_read() {
        let mut params = rcgen::CertificateParams::new(vec!["superlink".to_owned()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2026, 1, 2);
        params.not_after = rcgen::date_time_ymd(2026, 4, 2);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (not_before, not_after) = certificate_validity(&cert.pem()).unwrap();
        assert_eq!(not_after.duration_since(not_before).unwrap(), 90 * DAY);
        assert_eq!(certificate_validity("not a certificate"), None);
    }
}

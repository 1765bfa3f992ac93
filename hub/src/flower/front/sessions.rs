//! SuperNodes that come back before Flower let their last session go.
//!
//! A SuperNode that stops without a goodbye (SIGKILL, OOM kill, its node powered off) leaves
//! its session `online` on the SuperLink until two heartbeat intervals (60 s) after its last
//! heartbeat. Started again with the same key meanwhile, its `ActivateNode` is refused (Flower
//! 1.40–1.42: HTTP 412, `{"code": 2004}`, "Failed to activate SuperNode") and it exits with code
//! 305 — in Kubernetes into the kubelet's crash-loop back-off (10 s, 20 s, 40 s … 5 min), so it
//! stays away for minutes after Flower would take it back. The front knows which keys were
//! connected a moment ago: their signed requests got a 2xx ([`RecentKeys::seen`]). A refused
//! activation of such a key within [`STALE_SESSION_FOR`] of its last success is that case, and
//! the front answers `503` instead, which the SuperNode retries by itself (every ≤ 20 s) until
//! Flower has let the old session go. Any other refusal — a key never seen, or seen too long
//! ago (unregistered, revoked) — passes through as Flower gave it.
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The header with which Flower's SuperNode (1.40 and later) sends its public key on every
/// Fleet request, signed together with a timestamp (`NodeAuthHttpInterceptor`).
pub const PUBLIC_KEY_HEADER: &str = "flwr-public-key";
/// The Fleet path of `ActivateNode`.
pub const ACTIVATE_PATH: &str = "/v1/fleet/activate-node";
/// Flower's `ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED`.
pub const ACTIVATION_FAILED_CODE: i64 = 2004;
/// How long after a key's last successful request a refused activation is taken for its old
/// session still held: Flower's 2 heartbeat intervals of 30 s (`HEARTBEAT_PATIENCE`,
/// `HEARTBEAT_DEFAULT_INTERVAL`, fixed for SuperNodes in 1.40–1.42) plus 15 s of slack.
pub const STALE_SESSION_FOR: Duration = Duration::from_secs(75);
/// Most keys remembered (each at most [`MAX_KEY_LEN`] bytes): a Federation's SuperNodes.
pub const MAX_KEYS: usize = 65_536;
/// Longest public-key header kept (a P-384 key in base64 is ~160 bytes).
pub const MAX_KEY_LEN: usize = 1024;
/// What the SuperNode is told to wait before it asks again.
pub const RETRY_AFTER_SECS: u64 = 5;

/// Keys whose signed Fleet requests the SuperLink accepted recently.
#[derive(Debug, Default)]
pub struct RecentKeys {
    seen: Mutex<HashMap<String, Instant>>,
}

impl RecentKeys {
    /// Records that the SuperLink answered a request of `key` with a 2xx: it verified the
    /// request's signature, so nobody without the private key can make a key recent.
    pub fn seen(&self, key: &str) {
        if key.len() > MAX_KEY_LEN {
            return;
        }
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = seen.get_mut(key) {
            *at = now;
            return;
        }
        if seen.len() >= MAX_KEYS {
            seen.retain(|_, at| now.saturating_duration_since(*at) < STALE_SESSION_FOR);
            if seen.len() >= MAX_KEYS {
                // Full of keys active right now: this one keeps Flower's own behaviour.
                return;
            }
        }
        seen.insert(key.to_owned(), now);
    }

    /// How long ago `key` last had a request accepted, if within [`STALE_SESSION_FOR`].
    pub fn recent(&self, key: &str) -> Option<Duration> {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let ago = seen.get(key)?.elapsed();
        (ago < STALE_SESSION_FOR).then_some(ago)
    }
}

/// Whether a Fleet error body is Flower's activation refusal (`{"code": 2004, …}`).
pub fn is_activation_refusal(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("code")?.as_i64())
        == Some(ACTIVATION_FAILED_CODE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_key_is_recent_for_two_heartbeat_intervals_and_some_slack() {
        // Invariant: only a key accepted within STALE_SESSION_FOR counts as recent, and each
        // success restarts its clock.
        let keys = RecentKeys::default();
        assert_eq!(keys.recent("k"), None);
        keys.seen("k");
        tokio::time::advance(Duration::from_secs(70)).await;
        assert_eq!(keys.recent("k"), Some(Duration::from_secs(70)));
        keys.seen("k");
        tokio::time::advance(Duration::from_secs(74)).await;
        assert!(keys.recent("k").is_some());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(keys.recent("k"), None);
        assert_eq!(keys.recent("other"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_memory_is_bounded() {
        // Invariant: no more than MAX_KEYS keys are held, oversized keys are not held, and a
        // full memory makes room only from keys that are no longer recent.
        let keys = RecentKeys::default();
        keys.seen(&"x".repeat(MAX_KEY_LEN + 1));
        assert_eq!(keys.recent(&"x".repeat(MAX_KEY_LEN + 1)), None);
        for i in 0..MAX_KEYS {
            keys.seen(&i.to_string());
        }
        keys.seen("late");
        assert_eq!(keys.recent("late"), None, "full of recent keys");
        tokio::time::advance(STALE_SESSION_FOR).await;
        keys.seen("later");
        assert!(keys.recent("later").is_some());
        assert_eq!(
            keys.seen.lock().unwrap().len(),
            1,
            "the expired keys made room"
        );
    }

    #[test]
    fn only_flowers_activation_refusal_is_recognised() {
        // Invariant: the 503 is given for code 2004 only, never for other errors or bodies.
        assert!(is_activation_refusal(
            br#"{"code": 2004, "detail": "Failed to activate SuperNode."}"#
        ));
        for other in [
            &br#"{"code": 2003, "detail": "x"}"#[..],
            br#"{"code": "2004"}"#,
            b"2004",
            b"",
            b"<html>",
        ] {
            assert!(!is_activation_refusal(other), "{other:?}");
        }
    }
}

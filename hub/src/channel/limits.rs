//! A token-bucket rate limiter keyed by string (a peer address or a bootstrap token id).
use dashmap::DashMap;
use std::time::{Duration, Instant};

/// Token buckets per key: `burst` requests at once, refilled at `per_second`.
#[derive(Debug)]
pub struct RateLimiter {
    burst: f64,
    per_second: f64,
    buckets: DashMap<String, (f64, Instant)>,
}

impl RateLimiter {
    /// A limiter allowing `burst` immediate requests per key and `per_second` after that.
    pub fn new(burst: u32, per_second: f64) -> Self {
        Self {
            burst: f64::from(burst.max(1)),
            per_second: per_second.max(0.0),
            buckets: DashMap::new(),
        }
    }

    /// Takes one token for `key`; false when the key is over its rate.
    pub fn allow(&self, key: &str) -> bool {
        let now = Instant::now();
        let mut entry = self
            .buckets
            .entry(key.to_string())
            .or_insert((self.burst, now));
        let (tokens, last) = *entry;
        let refilled =
            (tokens + now.duration_since(last).as_secs_f64() * self.per_second).min(self.burst);
        if refilled >= 1.0 {
            *entry = (refilled - 1.0, now);
            true
        } else {
            *entry = (refilled, now);
            false
        }
    }

    /// Forgets keys idle for longer than `idle` (their buckets are full again anyway).
    pub fn forget_idle(&self, idle: Duration) {
        let now = Instant::now();
        self.buckets
            .retain(|_, (_, last)| now.duration_since(*last) < idle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refused_per_key() {
        // A key gets `burst` requests, then is refused, without affecting other keys.
        let limiter = RateLimiter::new(3, 0.0);
        assert!((0..3).all(|_| limiter.allow("a")));
        assert!(!limiter.allow("a"));
        assert!(limiter.allow("b"));
    }
}

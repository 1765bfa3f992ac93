//! Back-off of the hub's Kubernetes watches.

/// The hub's watch back-off: 0.5 s doubling to at most 5 s (kube-runtime's default goes to
/// 30 s), reset after 2 minutes without errors. After an apiserver or etcd outage the first
/// lists meet 504s until every storage client has reconnected; with the default a few of those
/// kept a restarted hub's work channel closed for 34 s after the apiservers were back (measured
/// under load on real nodes), and every agent waited with it. Every watch of the hub and every
/// controller's trigger stream use it, so nothing of the hub lags 30 s behind a recovered
/// apiserver.
#[derive(Debug)]
pub struct ShortBackoff {
    next: std::time::Duration,
    last_error: Option<std::time::Instant>,
}

impl Default for ShortBackoff {
    fn default() -> Self {
        Self {
            next: SHORT_BACKOFF_FIRST,
            last_error: None,
        }
    }
}

const SHORT_BACKOFF_FIRST: std::time::Duration = std::time::Duration::from_millis(500);
const SHORT_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(5);

impl Iterator for ShortBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<Self::Item> {
        if self
            .last_error
            .is_some_and(|at| at.elapsed() > std::time::Duration::from_secs(120))
        {
            self.next = SHORT_BACKOFF_FIRST;
        }
        self.last_error = Some(std::time::Instant::now());
        let delay = self.next;
        self.next = (self.next * 2).min(SHORT_BACKOFF_MAX);
        Some(delay)
    }
}

impl kube::runtime::utils::Backoff for ShortBackoff {
    fn reset(&mut self) {
        self.next = SHORT_BACKOFF_FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff;
    use std::time::Duration;

    #[test]
    fn doubles_to_five_seconds_and_starts_over_after_a_reset() {
        let mut backoff = ShortBackoff::default();
        let delays: Vec<Duration> = backoff.by_ref().take(7).collect();
        let ms = |v: u64| Duration::from_millis(v);
        assert_eq!(
            delays,
            [
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(5000),
                ms(5000),
                ms(5000)
            ]
        );
        backoff.reset();
        assert_eq!(backoff.next(), Some(ms(500)));
    }

    #[test]
    fn starts_over_two_minutes_after_the_last_error() {
        let mut backoff = ShortBackoff::default();
        for _ in 0..5 {
            backoff.next();
        }
        // As if the last error was long ago (the stream recovered without a reset).
        backoff.last_error = std::time::Instant::now().checked_sub(Duration::from_secs(121));
        assert_eq!(backoff.next(), Some(Duration::from_millis(500)));
    }
}

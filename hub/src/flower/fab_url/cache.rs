//! [`FabUrlCache`]: what was downloaded, refused or failed, by URL and hash.
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{DownloadLimits, RETRY_AFTER, download};
use crate::flower::runs::FabBytes;

/// Most downloads (or refusals) a [`FabUrlCache`] keeps.
pub(super) const CACHE_ENTRIES: usize = 16;
/// Most FAB bytes a [`FabUrlCache`] keeps.
pub(super) const CACHE_BYTES: usize = 64 << 20;

/// FABs downloaded from URLs, shared by a hub's run passes (cheap to clone: clones share one
/// cache). A FAB is kept by (url, sha256) once downloaded, a permanent refusal too (a run's spec
/// cannot change); after a transient failure the URL is not tried again for
/// [`RETRY_AFTER`], the failure's message standing meanwhile. At most 16 entries or 64 MiB of
/// FABs are kept, the oldest going first.
#[derive(Clone)]
pub struct FabUrlCache {
    shared: Arc<Shared>,
}

struct Shared {
    limits: DownloadLimits,
    retry_after: Duration,
    state: Mutex<CacheState>,
}

pub(super) type Key = (String, String);

#[derive(Default)]
pub(super) struct CacheState {
    /// Downloads and refusals, by (url, sha256).
    pub(super) done: HashMap<Key, Done>,
    /// Keys of `done`, oldest first.
    pub(super) order: VecDeque<Key>,
    /// FAB bytes in `done`.
    pub(super) bytes: usize,
    /// The last transient failure of each URL: when, and its message.
    failed: HashMap<String, Failing>,
    /// One download at a time per key: later callers wait for it and take its result.
    downloading: HashMap<Key, Arc<tokio::sync::Mutex<()>>>,
}

/// A URL whose downloads failed for now: when last, what, how often in a row.
struct Failing {
    at: Instant,
    message: String,
    attempts: u32,
}

/// Transient failures in a row after which a URL is given up for good (about 5 minutes at the
/// default 10 s between tries): the run then fails instead of waiting for ever.
pub(super) const MAX_ATTEMPTS: u32 = 30;
/// After how many retry intervals without an attempt a URL's failures are forgotten.
const FORGET_AFTER: u32 = 10;

#[derive(Clone)]
pub(super) enum Done {
    /// Downloaded and checked.
    Found(Vec<u8>),
    /// Refused for good, with the message.
    Refused(String),
}

impl Default for FabUrlCache {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for FabUrlCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("FabUrlCache")
            .field("entries", &state.done.len())
            .field("bytes", &state.bytes)
            .field("failing", &state.failed.len())
            .finish_non_exhaustive()
    }
}

// === impl FabUrlCache ===

impl FabUrlCache {
    /// An empty cache with the default [`DownloadLimits`] and [`RETRY_AFTER`].
    pub fn new() -> Self {
        Self::with_limits(DownloadLimits::default(), RETRY_AFTER)
    }

    /// An empty cache downloading within `limits`, leaving a URL alone for `retry_after` after
    /// a transient failure.
    pub fn with_egress(egress: super::Egress) -> Self {
        Self::with_limits(
            DownloadLimits {
                egress,
                ..DownloadLimits::default()
            },
            RETRY_AFTER,
        )
    }

    pub fn with_limits(limits: DownloadLimits, retry_after: Duration) -> Self {
        Self {
            shared: Arc::new(Shared {
                limits,
                retry_after,
                state: Mutex::new(CacheState::default()),
            }),
        }
    }

    /// The FAB at `url` whose SHA-256 is `sha256`: [`FabBytes::Found`] once downloaded and
    /// checked, [`FabBytes::Unusable`] when it never will be, [`FabBytes::Missing`] (the run
    /// waits) after a transient failure. Downloads at most once per (url, sha256) at a time,
    /// waiting for it (up to the download timeout).
    pub async fn get(&self, url: &str, sha256: &str) -> FabBytes {
        let key: Key = (url.to_owned(), sha256.to_owned());
        let gate = {
            let mut state = self.lock();
            if let Some(done) = state.done.get(&key) {
                return done.clone().into();
            }
            state.downloading.entry(key.clone()).or_default().clone()
        };
        let _turn = gate.lock().await;
        {
            let state = self.lock();
            if let Some(done) = state.done.get(&key) {
                return done.clone().into();
            }
            if let Some(failing) = state.failed.get(url)
                && failing.at.elapsed() < self.shared.retry_after
            {
                return FabBytes::Missing(failing.message.clone());
            }
        }
        let started = Instant::now();
        let result = download(url, Some(sha256), &self.shared.limits).await;
        let mut state = self.lock();
        state.downloading.remove(&key);
        let retry_after = self.shared.retry_after;
        // A failure older than FORGET_AFTER retry intervals no longer counts towards
        // MAX_ATTEMPTS (nobody asked for the URL for that long): for this URL, older when this
        // attempt started (an attempt may take longer than the interval: a server that hangs
        // until the 30 s timeout, against 10 s between attempts, would otherwise restart the
        // count each time and be tried for ever). Generous, so a busy hub that looks again late
        // does not restart the count either.
        let forget = retry_after * FORGET_AFTER;
        let previous = state
            .failed
            .remove(url)
            .filter(|f| started.duration_since(f.at) < forget);
        state.failed.retain(|_, f| f.at.elapsed() < forget);
        match result {
            Ok(bytes) => {
                tracing::info!(%url, bytes = bytes.len(), "downloaded FAB");
                state.insert(key, Done::Found(bytes.clone()));
                FabBytes::Found(bytes)
            }
            Err(e) if e.is_transient() => {
                let attempts = previous.map_or(0, |f| f.attempts) + 1;
                if attempts >= MAX_ATTEMPTS {
                    tracing::warn!(%url, error = %e, attempts, "FAB download failed; giving up");
                    let message = format!(
                        "{e}; gave up after {attempts} attempts {} s apart",
                        self.shared.retry_after.as_secs_f64()
                    );
                    state.insert(key, Done::Refused(message.clone()));
                    return FabBytes::Unusable(message);
                }
                tracing::warn!(%url, error = %e, attempts, "FAB download failed; retrying later");
                let message = format!(
                    "{e}; attempt {attempts} of {MAX_ATTEMPTS}, retried every {} s",
                    self.shared.retry_after.as_secs_f64()
                );
                state.failed.insert(
                    url.to_owned(),
                    Failing {
                        at: Instant::now(),
                        message: message.clone(),
                        attempts,
                    },
                );
                FabBytes::Missing(message)
            }
            Err(e) => {
                tracing::warn!(%url, error = %e, "FAB download refused");
                let message = e.to_string();
                state.insert(key, Done::Refused(message.clone()));
                FabBytes::Unusable(message)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl CacheState {
    /// Keeps `done` for `key`, dropping the oldest entries past the bounds.
    pub(super) fn insert(&mut self, key: Key, done: Done) {
        if let Some(old) = self.done.remove(&key) {
            self.order.retain(|k| *k != key);
            self.bytes -= old.size();
        }
        self.bytes += done.size();
        self.done.insert(key.clone(), done);
        self.order.push_back(key);
        while self.order.len() > CACHE_ENTRIES || self.bytes > CACHE_BYTES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(old) = self.done.remove(&oldest) {
                self.bytes -= old.size();
            }
        }
    }
}

impl Done {
    fn size(&self) -> usize {
        match self {
            Self::Found(bytes) => bytes.len(),
            Self::Refused(_) => 0,
        }
    }
}

impl From<Done> for FabBytes {
    fn from(done: Done) -> Self {
        match done {
            Done::Found(bytes) => FabBytes::Found(bytes),
            Done::Refused(message) => FabBytes::Unusable(message),
        }
    }
}

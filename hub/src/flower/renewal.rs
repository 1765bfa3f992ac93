//! A SuperLink certificate due for renewal waits for the runs in progress on that SuperLink
//! (both hub modes): a new certificate restarts the SuperLink (a Kubernetes pod rolls, a
//! standalone process is restarted), and Flower stops the runs it is running. The rule is the
//! core's ([`crate::core::renewal::renewal_waits`]): only a renewal due by age waits, and at the
//! latest until 95 % of the certificate's life; this asks the SuperLink (its Control API's
//! `ListRuns`) and remembers the answer for [`RECHECK`], so a reconcile loop does not ask on
//! every pass.
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use super::control::{ControlClient, ControlEndpoint};
use super::registry::FedKey;
use crate::core::renewal::{renewal_waits, runs_in_progress};

/// How often a waiting renewal asks the SuperLink again.
pub const RECHECK: Duration = Duration::from_secs(5);

/// What to do with a SuperLink certificate that is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Issue the new certificate now.
    Now {
        /// The runs it waited for before (`None`: it did not wait).
        waited_for: Option<Vec<u64>>,
    },
    /// Keep the certificate in force while `runs` are in progress.
    Wait {
        /// The runs in progress, by id.
        runs: Vec<u64>,
        /// The latest it waits.
        until: SystemTime,
        /// When to decide again.
        recheck: Duration,
        /// Whether this is the first pass that waits (to tell the user once).
        first: bool,
    },
}

impl Renewal {
    /// What to tell the user of a renewal that waits, naming the runs and the deadline.
    pub fn waiting_message(runs: &[u64], until: SystemTime) -> String {
        let ids: Vec<String> = runs.iter().map(u64::to_string).collect();
        let until = k8s_openapi::jiff::Timestamp::try_from(until)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| "its deadline".to_owned());
        format!(
            "SuperLink certificate renewal waits for run(s) {} in progress (a new certificate restarts the SuperLink, which stops its runs); renewed when they end, at the latest at {until}",
            ids.join(", ")
        )
    }
}

#[derive(Debug)]
struct Held {
    asked: Instant,
    runs: Vec<u64>,
    until: SystemTime,
}

/// The renewals waiting for runs, per Federation.
#[derive(Debug)]
pub struct RenewalHolds {
    held: Mutex<HashMap<FedKey, Held>>,
    recheck: Duration,
}

impl Default for RenewalHolds {
    fn default() -> Self {
        Self::new(RECHECK)
    }
}

impl RenewalHolds {
    /// Holds that ask a SuperLink again `recheck` after the last answer ([`RECHECK`] in the
    /// hub).
    pub fn new(recheck: Duration) -> Self {
        Self {
            held: Mutex::default(),
            recheck,
        }
    }

    /// Whether the certificate of `key` (valid `not_before..not_after`, due under `validity`)
    /// is renewed now or waits for the runs in progress on the SuperLink at `endpoint`. A
    /// SuperLink without an endpoint, or that does not answer, is not waited for (it runs
    /// nothing a restart could stop, or cannot be asked).
    pub async fn decide(
        &self,
        key: &FedKey,
        endpoint: Option<ControlEndpoint>,
        not_before: SystemTime,
        not_after: SystemTime,
        validity: Duration,
    ) -> Renewal {
        let now = SystemTime::now();
        let fresh = {
            let held = self.lock();
            held.get(key).and_then(|h| {
                let waits = renewal_waits(&h.runs, not_before, not_after, validity, now)?;
                (h.asked.elapsed() < self.recheck && waits == h.until).then(|| Renewal::Wait {
                    runs: h.runs.clone(),
                    until: h.until,
                    recheck: self.recheck.saturating_sub(h.asked.elapsed()),
                    first: false,
                })
            })
        };
        if let Some(wait) = fresh {
            return wait;
        }
        let in_progress = match endpoint {
            // A renewal that could not wait anyway asks nothing.
            Some(endpoint)
                if renewal_waits(&[0], not_before, not_after, validity, now).is_some() =>
            {
                in_progress(key, endpoint).await
            }
            _ => Vec::new(),
        };
        let mut held = self.lock();
        match renewal_waits(&in_progress, not_before, not_after, validity, now) {
            Some(until) => {
                let first = held.get(key).is_none_or(|h| h.until != until);
                held.insert(
                    key.clone(),
                    Held {
                        asked: Instant::now(),
                        runs: in_progress.clone(),
                        until,
                    },
                );
                Renewal::Wait {
                    runs: in_progress,
                    until,
                    recheck: self.recheck,
                    first,
                }
            }
            None => Renewal::Now {
                waited_for: held.remove(key).map(|h| h.runs),
            },
        }
    }

    /// Forgets `key` (a Federation that is gone).
    pub fn forget(&self, key: &FedKey) {
        self.lock().remove(key);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<FedKey, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The runs in progress on the SuperLink at `endpoint`; none when it cannot be asked.
async fn in_progress(key: &FedKey, endpoint: ControlEndpoint) -> Vec<u64> {
    let client = match ControlClient::new(endpoint) {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(namespace = %key.0, federation = %key.1, %error, "no Control client to ask for runs in progress before a certificate renewal");
            return Vec::new();
        }
    };
    match super::runs::list(&client).await {
        crate::core::run::SuperLinkState::Runs(runs) => runs_in_progress(&runs),
        crate::core::run::SuperLinkState::NotAsked => Vec::new(),
        crate::core::run::SuperLinkState::Unreachable(error) => {
            tracing::info!(namespace = %key.0, federation = %key.1, %error, "SuperLink not asked for runs in progress before its certificate renewal: renewing now");
            Vec::new()
        }
    }
}

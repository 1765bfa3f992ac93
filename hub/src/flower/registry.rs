//! The SuperNode keys each Federation's SuperLink holds, kept equal to what the core wants
//! ([`crate::core::nodekeys::wanted_keys`]) through the Control API, and what the SuperLinks
//! list online. Both hub modes own one [`NodeKeyRegistry`]: the standalone hub syncs it in its
//! reconcile pass, the Kubernetes work source in a task of its own; both read back the
//! registered keys (sent to agents as `registered_node_keys`, so a SuperNode starts only with a
//! registered key) and the online ones (Federation status: SuperNodes connected to the SuperLink).
use super::control::{ControlClient, ControlEndpoint, ControlError};
use super::diagnose::{LogSource, SuperLinkFault, last_fault};
use super::{KeySync, sync_keys_with};
use dashmap::DashMap;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `(namespace, name)` of a Federation.
pub type FedKey = (String, String);

/// How often a SuperLink is listed again when nothing changed (online state, keys removed by
/// hand).
pub const RELIST: Duration = Duration::from_secs(10);
/// How soon a failed sync is tried again.
const RETRY: Duration = Duration::from_secs(2);
/// How often, at most, a SuperLink's log is read ([`super::diagnose`]).
pub const PEEK_EVERY: Duration = Duration::from_secs(30);

/// What one Federation's SuperLink should hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyTarget {
    /// The Federation.
    pub federation: FedKey,
    /// Where its Control API is.
    pub endpoint: ControlEndpoint,
    /// The keys (OpenSSH lines) it should hold.
    pub wanted: BTreeSet<String>,
    /// Whether it should hold nothing else: every cluster the Federation is placed on has
    /// reported since the hub started. Until then the hub does not know all the keys in use
    /// (a restarted hub would otherwise unregister every running SuperNode before the agents
    /// report), so it only registers.
    pub complete: bool,
    /// The SuperLink's log, read when it fails calls unexpectedly or its SuperNodes drop
    /// offline ([`super::diagnose`]); `None`: not read.
    pub log: Option<LogSource>,
}

/// Why a SuperLink fails, as its log says ([`super::diagnose`]), for the Federation's
/// `SuperLinkHealthy` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnosis {
    /// What it logged.
    pub fault: SuperLinkFault,
    /// The condition's message: the line and the fix ([`SuperLinkFault::message`]).
    pub message: String,
}

impl Diagnosis {
    /// `(reason, message)` of the `SuperLinkHealthy=False` condition it makes
    /// ([`crate::core::status::superlink_health`]).
    pub fn health(&self) -> (&'static str, &str) {
        (self.fault.reason(), &self.message)
    }
}

/// What the registry knows of one Federation's SuperLink.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FederationKeys {
    /// Wanted keys the SuperLink holds (as of the last successful sync).
    pub registered: BTreeSet<String>,
    /// Wanted keys whose SuperNode the SuperLink lists online.
    pub online: BTreeSet<String>,
    /// Wanted keys the SuperLink refuses for ever (unregistered once): their SuperNodes need new
    /// keys (sent to the agents as `retired_node_keys`).
    pub retired: BTreeSet<String>,
    /// Whether the SuperLink has been listed at least once.
    pub listed: bool,
    /// The last sync's error, if it failed.
    pub error: Option<String>,
    /// What the SuperLink last logged as failing, while it fails ([`super::diagnose`]).
    pub problem: Option<Diagnosis>,
}

struct Entry {
    client: Arc<ControlClient>,
    wanted: BTreeSet<String>,
    complete: bool,
    tried_at: Instant,
    /// Set by [`NodeKeyRegistry::relist_soon`]: the SuperLink may have restarted.
    stale: bool,
    /// Its log's reader ([`KeyTarget::log`]) and when it last read.
    log: Option<LogSource>,
    peeked_at: Option<Instant>,
    keys: FederationKeys,
}

/// Per-Federation key state, shared between the task that syncs and the code that reads it.
#[derive(Default)]
pub struct NodeKeyRegistry {
    entries: DashMap<FedKey, Entry>,
}

impl std::fmt::Debug for NodeKeyRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeKeyRegistry")
            .field("federations", &self.entries.len())
            .finish()
    }
}

impl NodeKeyRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Syncs every target that is due (its wanted keys or endpoint changed, [`RELIST`] passed,
    /// or a failed sync is [`RETRY`] old) and forgets Federations not among `targets`. Returns
    /// the Federations whose registered or online keys changed.
    pub async fn sync(&self, targets: Vec<KeyTarget>) -> Vec<FedKey> {
        let live: BTreeSet<FedKey> = targets.iter().map(|t| t.federation.clone()).collect();
        self.entries.retain(|k, _| live.contains(k));
        let mut changed = Vec::new();
        for target in targets {
            let due = self.due(&target);
            let Some(client) = due else { continue };
            let result = sync_keys_with(&client, &target.wanted, target.complete).await;
            // The reader of the last sync (it knows how far it read), unless the log moved.
            let log = self
                .entries
                .get(&target.federation)
                .and_then(|e| e.log.clone())
                .filter(|l| Some(l) == target.log.as_ref())
                .or_else(|| target.log.clone());
            let peeked = match &log {
                Some(log) if self.wants_peek(&target.federation, &result) => {
                    Some(log.reader.recent().await)
                }
                _ => None,
            };
            if self.record(&target, client, log, result, peeked) {
                changed.push(target.federation);
            }
        }
        changed
    }

    /// Makes the Federation's SuperLink due at the next [`Self::sync`]: its workload changed
    /// (a SuperLink restarted with an emptyDir database has lost every registration, and its
    /// SuperNodes crash until their keys are back; waiting for [`RELIST`] would cost them a
    /// longer crash-loop back-off).
    pub fn relist_soon(&self, federation: &FedKey) {
        if let Some(mut e) = self.entries.get_mut(federation) {
            e.stale = true;
        }
    }

    /// The keys the Federation's SuperLink holds of those wanted (empty when unknown).
    pub fn registered(&self, federation: &FedKey) -> Vec<String> {
        self.entries
            .get(federation)
            .map(|e| e.keys.registered.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The wanted keys the Federation's SuperLink will never register again (empty when unknown).
    pub fn retired(&self, federation: &FedKey) -> Vec<String> {
        self.entries
            .get(federation)
            .map(|e| e.keys.retired.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Sets what is known of a Federation's SuperLink as a sync would (tests of the readers).
    #[cfg(test)]
    pub(crate) fn insert_for_test(&self, federation: FedKey, keys: FederationKeys) {
        let client = ControlClient::new(ControlEndpoint {
            dialect: flower_addon_crds::render::FlowerDialect::Unified,
            address: "127.0.0.1:9".into(),
            server_name: "127.0.0.1".into(),
            ca_pem: None,
            tunnel: None,
        })
        .expect("a client");
        self.entries.insert(
            federation,
            Entry {
                client: Arc::new(client),
                wanted: BTreeSet::new(),
                complete: true,
                tried_at: Instant::now(),
                stale: false,
                log: None,
                peeked_at: None,
                keys,
            },
        );
    }

    /// Everything known of the Federation's SuperLink (`None` before its first sync attempt).
    pub fn get(&self, federation: &FedKey) -> Option<FederationKeys> {
        self.entries.get(federation).map(|e| e.keys.clone())
    }

    /// Whether the SuperLink's log should be read after this sync: a call failed unexpectedly,
    /// or SuperNodes it holds dropped offline (or are still offline after a fault was seen),
    /// and it was not read in the last [`PEEK_EVERY`].
    fn wants_peek(&self, federation: &FedKey, result: &Result<KeySync, ControlError>) -> bool {
        let entry = self.entries.get(federation);
        if entry
            .as_ref()
            .and_then(|e| e.peeked_at)
            .is_some_and(|at| at.elapsed() < PEEK_EVERY)
        {
            return false;
        }
        match result {
            Err(error) => error.is_internal(),
            Ok(sync) => {
                let offline = sync.registered.iter().any(|k| !sync.online.contains(k));
                let dropped = entry.as_ref().is_some_and(|e| {
                    e.keys
                        .online
                        .iter()
                        .any(|k| sync.registered.contains(k) && !sync.online.contains(k))
                });
                let faulty = entry.as_ref().is_some_and(|e| e.keys.problem.is_some());
                sync.internal || dropped || (faulty && offline)
            }
        }
    }

    fn due(&self, target: &KeyTarget) -> Option<Arc<ControlClient>> {
        let now = Instant::now();
        let fresh_client = || match ControlClient::new(target.endpoint.clone()) {
            Ok(c) => Some(Arc::new(c)),
            Err(error) => {
                tracing::warn!(federation = %target.federation.1, %error, "cannot make a Control API client");
                None
            }
        };
        match self.entries.get(&target.federation) {
            None => fresh_client(),
            Some(e) if e.client.endpoint() != &target.endpoint => fresh_client(),
            Some(e) => {
                let since = now.duration_since(e.tried_at);
                let due = e.stale
                    || match e.keys.error {
                        Some(_) => since >= RETRY,
                        None => {
                            e.wanted != target.wanted
                                || e.complete != target.complete
                                || since >= RELIST
                        }
                    };
                due.then(|| e.client.clone())
            }
        }
    }

    fn record(
        &self,
        target: &KeyTarget,
        client: Arc<ControlClient>,
        log: Option<LogSource>,
        result: Result<KeySync, ControlError>,
        peeked: Option<Result<String, String>>,
    ) -> bool {
        let now = Instant::now();
        let mut entry = self
            .entries
            .entry(target.federation.clone())
            .or_insert_with(|| Entry {
                client: client.clone(),
                wanted: BTreeSet::new(),
                complete: false,
                tried_at: now,
                stale: false,
                log: None,
                peeked_at: None,
                keys: FederationKeys::default(),
            });
        entry.client = client;
        entry.log = log;
        entry.tried_at = now;
        entry.stale = false;
        let before = entry.keys.clone();
        let fed = &target.federation;
        // Healthy again: no call failed unexpectedly, and a write went through or every
        // SuperNode it holds is online.
        let healthy = result.as_ref().is_ok_and(|s| {
            !s.internal
                && (s.newly_registered + s.unregistered > 0
                    || s.registered.iter().all(|k| s.online.contains(k)))
        });
        match peeked {
            Some(Ok(text)) => {
                entry.peeked_at = Some(now);
                // Nothing logged since the last look: whatever failed before has stopped.
                entry.keys.problem = last_fault(&text).map(|fault| Diagnosis {
                    message: fault.message(target.log.as_ref().map_or("", |l| l.storage.as_str())),
                    fault,
                });
                if let Some(problem) = &entry.keys.problem
                    && before.problem.as_ref() != Some(problem)
                {
                    tracing::warn!(namespace = %fed.0, federation = %fed.1, reason = problem.fault.reason(), message = %problem.message, "the SuperLink fails");
                }
            }
            Some(Err(error)) => {
                entry.peeked_at = Some(now);
                tracing::warn!(namespace = %fed.0, federation = %fed.1, %error, "cannot read the SuperLink's log");
            }
            None if healthy => entry.keys.problem = None,
            None => {}
        }
        match result {
            Ok(sync) => {
                if sync.newly_registered > 0 || sync.unregistered > 0 {
                    tracing::info!(namespace = %fed.0, federation = %fed.1, registered = sync.newly_registered, unregistered = sync.unregistered, held = sync.registered.len(), "SuperNode keys synced with the SuperLink");
                }
                if !sync.retired.is_empty() && sync.retired != before.retired {
                    tracing::info!(namespace = %fed.0, federation = %fed.1, keys = sync.retired.len(), "SuperNode keys the SuperLink unregistered before and will not take back: their agents make new ones");
                }
                for failure in &sync.failed {
                    tracing::warn!(namespace = %fed.0, federation = %fed.1, %failure, "a SuperNode key could not be synced; will retry");
                }
                entry.wanted = target.wanted.clone();
                entry.complete = target.complete;
                entry.keys = FederationKeys {
                    registered: sync.registered,
                    online: sync.online,
                    retired: sync.retired,
                    listed: true,
                    // Failed keys are retried after RETRY.
                    error: (!sync.failed.is_empty()).then(|| sync.failed.join("; ")),
                    problem: entry.keys.problem.take(),
                };
            }
            Err(error) => {
                if before.error.as_deref() != Some(&error.to_string()) {
                    tracing::warn!(namespace = %fed.0, federation = %fed.1, %error, "cannot sync SuperNode keys with the SuperLink yet; will retry");
                }
                // Keep what was known: a SuperLink restarting does not unregister anything.
                entry.keys.error = Some(error.to_string());
            }
        }
        if before.problem.is_some() && entry.keys.problem.is_none() {
            tracing::info!(namespace = %fed.0, federation = %fed.1, "the SuperLink works again");
        }
        entry.keys.registered != before.registered
            || entry.keys.online != before.online
            || entry.keys.retired != before.retired
            || entry.keys.problem != before.problem
    }
}

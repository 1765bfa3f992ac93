//! Where the hub keeps registration state: bootstrap tokens, clusters (the standalone form of
//! `ManagedCluster`) and the CA. One trait, two adapters: [`file::FileStore`] for standalone mode
//! and, later, a Kubernetes store (ManagedCluster objects and Secrets).
use crate::registration::ca::{CaError, CaMaterial, CaRole, HubCa};
use crate::registration::tokens::TokenRecord;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use tokio::sync::broadcast;

pub mod file;

/// Condition type: the hub admin accepted the cluster (`hubAcceptsClient=true`).
pub const CONDITION_HUB_ACCEPTED: &str = "HubAcceptedManagedCluster";
/// Condition type: the cluster holds a client certificate issued by the hub.
pub const CONDITION_JOINED: &str = "Joined";
/// Condition type: the cluster's lease is current (heartbeats arrive).
pub const CONDITION_AVAILABLE: &str = "Available";
/// A cluster whose agent has not renewed its lease for this many lease durations becomes
/// `Available=Unknown` and gets the unreachable taint (OCM's `LeaseDurationTimes`).
pub const LEASE_GRACE_TIMES: u32 = 5;

/// Errors of a [`ClusterStore`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A cluster with this name already exists.
    #[error("cluster {0:?} already exists")]
    AlreadyExists(String),
    /// No such cluster or token.
    #[error("{kind} {name:?} not found")]
    NotFound {
        /// `cluster` or `token`.
        kind: &'static str,
        /// The name looked up.
        name: String,
    },
    /// The backing storage failed.
    #[error("store I/O on {path}: {source}")]
    Io {
        /// File or object concerned.
        path: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// Stored data could not be decoded.
    #[error("corrupt store entry {path}: {detail}")]
    Corrupt {
        /// File or object concerned.
        path: String,
        /// Decoder message.
        detail: String,
    },
    /// The stored CA could not be loaded.
    #[error("certificate authority: {0}")]
    Ca(#[from] CaError),
    /// The work-channel CA is gone while clusters hold client certificates it issued: a new CA
    /// would lock every one of their agents out, so none is made.
    #[error(
        "the hub's certificate authority ({location}) is missing, but {count} joined cluster(s) hold client certificates it issued (e.g. {example}, issuer {issuer}); a new CA would lock every agent out, so the hub does not make one. Restore {location} from a backup; or, to start over on purpose, `flower-hub revoke NAME --delete` every cluster and join them again with new tokens"
    )]
    CaMissing {
        /// Where the CA is kept (`Secret ns/flower-hub-ca`, `<state dir>/ca.json`).
        location: String,
        /// How many clusters hold certificates of a CA of this hub.
        count: usize,
        /// One of them.
        example: String,
        /// The issuer hash that cluster's certificate names.
        issuer: String,
    },
}

/// What an agent declared when it joined (the spec side of a `ManagedCluster`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRegistration {
    /// Cluster name (= client certificate CN).
    pub name: String,
    /// Labels reported by the agent.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Cluster claims reported by the agent.
    #[serde(default)]
    pub claims: BTreeMap<String, String>,
    /// `sha256:<hex>` of the agent's public key (SubjectPublicKeyInfo); the cluster is bound to it.
    pub key_fingerprint: String,
    /// The key bound before [`ClusterRegistration::key_fingerprint`], still trusted until its
    /// certificate expires: set only for agents installed as an OCM addon, whose klusterlet
    /// makes a new key at every renewal and hands it to the agent's pod some time after the hub
    /// signed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_key_fingerprint: Option<String>,
    /// Version of the agent at its last join.
    #[serde(default)]
    pub agent_version: String,
    /// Id of the bootstrap token used for the first join.
    #[serde(default)]
    pub token_id: String,
    /// First join, seconds since the Unix epoch.
    pub created_unix: u64,
}

impl ClusterRegistration {
    /// Whether the key `fingerprint` speaks for this cluster: the bound key, or the one bound
    /// before it ([`ClusterRegistration::previous_key_fingerprint`]).
    pub fn binds(&self, fingerprint: &str) -> bool {
        self.key_fingerprint == fingerprint
            || self.previous_key_fingerprint.as_deref() == Some(fingerprint)
    }
}

/// A Kubernetes-style condition on a cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCondition {
    /// Condition type (`Available`, `Joined`, …).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// One CamelCase word.
    pub reason: String,
    /// Human-readable detail.
    pub message: String,
    /// Last change of `status`, seconds since the Unix epoch.
    pub last_transition_unix: u64,
}

/// What the hub observed about a cluster (the status side of a `ManagedCluster`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// Last heartbeat, seconds since the Unix epoch.
    #[serde(default)]
    pub last_heartbeat_unix: Option<u64>,
    /// End of validity of the last client certificate issued, seconds since the Unix epoch.
    #[serde(default)]
    pub client_cert_not_after_unix: Option<u64>,
    /// Hash of the work-channel CA that signed that certificate (`sha256:…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_issuer: Option<String>,
    /// The work-channel CA bundle sent with it (its CAs' hashes, comma-separated): what the
    /// agent trusts since. `flower-hub ca rotate` counts the agents that have the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_bundle: Option<String>,
    /// Conditions, one per type.
    #[serde(default)]
    pub conditions: Vec<ClusterCondition>,
    /// Allocatable resources the agent reports (`cpu`, `memory` as Kubernetes quantities), for
    /// the `ResourceAllocatable*` Placement prioritizers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: BTreeMap<String, String>,
}

impl ClusterStatus {
    /// Sets a condition, keeping `last_transition_unix` when the status did not change. Returns
    /// whether the status value changed.
    pub fn set_condition(
        &mut self,
        type_: &str,
        status: &str,
        reason: &str,
        message: &str,
        now_unix: u64,
    ) -> bool {
        match self.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                let changed = c.status != status;
                if changed {
                    c.last_transition_unix = now_unix;
                }
                c.status = status.to_string();
                c.reason = reason.to_string();
                c.message = message.to_string();
                changed
            }
            None => {
                self.conditions.push(ClusterCondition {
                    type_: type_.to_string(),
                    status: status.to_string(),
                    reason: reason.to_string(),
                    message: message.to_string(),
                    last_transition_unix: now_unix,
                });
                true
            }
        }
    }

    /// Status of the condition of this type, if set.
    pub fn condition(&self, type_: &str) -> Option<&ClusterCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// The availability taint the `Available` condition calls for, as OCM sets it, and when it
    /// was added (the condition's transition): `Unknown` (lease missed for
    /// [`LEASE_GRACE_TIMES`] leases) → `…/unreachable`, `False` (revoked) → `…/unavailable`,
    /// `True` or unset → none. The one rule of both hub modes.
    pub fn availability_taint(&self) -> Option<(&'static str, u64)> {
        let c = self.condition(CONDITION_AVAILABLE)?;
        let key = match c.status.as_str() {
            "Unknown" => crate::core::placement::TAINT_UNREACHABLE,
            "False" => crate::core::placement::TAINT_UNAVAILABLE,
            _ => return None,
        };
        Some((key, c.last_transition_unix))
    }
}

/// One cluster as stored: registration, the admin's decision, and the observed status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterRecord {
    /// What the agent declared.
    pub registration: ClusterRegistration,
    /// `spec.hubAcceptsClient`.
    pub hub_accepts_client: bool,
    /// `spec.leaseDurationSeconds` (Kubernetes mode); `None`: the hub's `--lease-duration`.
    pub lease_duration: Option<std::time::Duration>,
    /// What the hub observed.
    pub status: ClusterStatus,
}

/// Storage of tokens, clusters and the CA. Implementations must make each write atomic (a reader
/// never sees half a record) and must announce cluster changes on [`ClusterStore::changes`],
/// including changes made by other processes (e.g. `flower-hub accept`), so the hub can close
/// a revoked cluster's stream at once.
pub trait ClusterStore: Send + Sync + 'static {
    /// The stored work-channel CA, if any.
    fn load_ca(&self) -> impl Future<Output = Result<Option<CaMaterial>, StoreError>> + Send {
        self.load_ca_for(CaRole::Channel)
    }
    /// Stores `ca` as the work-channel CA unless one exists already; returns the CA that is
    /// stored afterwards (the existing one wins a race).
    fn create_ca(
        &self,
        ca: &CaMaterial,
    ) -> impl Future<Output = Result<CaMaterial, StoreError>> + Send {
        self.create_ca_for(CaRole::Channel, ca)
    }
    /// Where the CA of `role` is kept, for messages (a Secret, a file).
    fn ca_location(&self, role: CaRole) -> String {
        format!("the {role:?} CA of the store")
    }
    /// The stored CA of `role`, if any.
    fn load_ca_for(
        &self,
        role: CaRole,
    ) -> impl Future<Output = Result<Option<CaMaterial>, StoreError>> + Send;
    /// Stores `ca` as the CA of `role` unless one exists already; returns the stored one.
    fn create_ca_for(
        &self,
        role: CaRole,
        ca: &CaMaterial,
    ) -> impl Future<Output = Result<CaMaterial, StoreError>> + Send;

    /// Replaces the CA of `role` with `new` if the stored one is still `current` (a concurrent
    /// change is [`StoreError::Conflict`]-like: nothing is written).
    fn replace_ca_for(
        &self,
        role: CaRole,
        current: &CaMaterial,
        new: &CaMaterial,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The fingerprint of the CA material of `role` the hub last started with
    /// ([`crate::registration::rotation::in_force_fingerprint`]); `None` before a hub recorded
    /// one.
    fn ca_in_force(
        &self,
        _role: CaRole,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send {
        async { Ok(None) }
    }
    /// Records that the hub started with the CA material of `role` of this fingerprint.
    fn mark_ca_in_force(
        &self,
        _role: CaRole,
        _fingerprint: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    /// Stores a new token record.
    fn put_token(&self, token: &TokenRecord)
    -> impl Future<Output = Result<(), StoreError>> + Send;
    /// The token with this id.
    fn get_token(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<TokenRecord>, StoreError>> + Send;
    /// Every token, sorted by id.
    fn list_tokens(&self) -> impl Future<Output = Result<Vec<TokenRecord>, StoreError>> + Send;
    /// Deletes (revokes) a token; false if it did not exist.
    fn delete_token(&self, id: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Counts one cluster registration against token `id` ([`TokenRecord::uses`]), atomically
    /// with the check that it has one left; false when it has none (or is gone).
    fn use_token(&self, id: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Creates a cluster; [`StoreError::AlreadyExists`] if the name is taken (atomic, so two
    /// concurrent joins cannot both create it).
    fn create_cluster(
        &self,
        registration: &ClusterRegistration,
        hub_accepts_client: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Replaces the registration of an existing cluster (labels/claims on a repeated join).
    fn update_registration(
        &self,
        registration: &ClusterRegistration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Sets `hubAcceptsClient`.
    fn set_accepted(
        &self,
        name: &str,
        accepted: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Replaces the observed status of an existing cluster.
    fn put_status(
        &self,
        name: &str,
        status: &ClusterStatus,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Read-modify-write of an existing cluster's observed status: `update` changes the status
    /// as stored now (it may be called again after a conflicting write), and the result is
    /// stored like [`ClusterStore::put_status`]; nothing is written when it did not change or
    /// the cluster does not exist. A store may do this in fewer requests than a read and a put.
    fn update_status<F>(
        &self,
        name: &str,
        mut update: F,
    ) -> impl Future<Output = Result<(), StoreError>> + Send
    where
        F: FnMut(&mut ClusterStatus) + Send,
    {
        async move {
            let Some(record) = self.get_cluster(name).await? else {
                return Ok(());
            };
            let mut status = record.status.clone();
            update(&mut status);
            if status == record.status {
                return Ok(());
            }
            self.put_status(name, &status).await
        }
    }
    /// The cluster with this name.
    fn get_cluster(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<ClusterRecord>, StoreError>> + Send;
    /// The cluster as the store's own cache last saw it, without a request; `None` when the
    /// store keeps no cache or the cache does not hold the cluster (the default: no cache). The
    /// cache may be one change behind the store, and [`ClusterStore::changes`] announces a change
    /// only once the cache holds it. So a cached record may answer "yes" (the change that
    /// revokes it will still be announced), while a "no" must be confirmed with
    /// [`ClusterStore::get_cluster`] (the cluster may just have been accepted or re-keyed).
    fn cached_cluster(&self, name: &str) -> Option<ClusterRecord> {
        let _ = name;
        None
    }
    /// Every cluster the store's cache holds, in no order, without a request; `None` when the
    /// store keeps no cache (the default). What [`ClusterStore::cached_cluster`] says of one
    /// cluster holds for each.
    fn cached_clusters(&self) -> Option<Vec<ClusterRecord>> {
        None
    }
    /// Every cluster, sorted by name.
    fn list_clusters(&self) -> impl Future<Output = Result<Vec<ClusterRecord>, StoreError>> + Send;
    /// Deletes a cluster; false if it did not exist.
    fn delete_cluster(&self, name: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Names of clusters whose registration or acceptance changed (possibly spuriously).
    fn changes(&self) -> broadcast::Receiver<String>;
}

/// Loads the hub CA from the store, creating and persisting it on first use.
pub async fn load_or_create_ca<S: ClusterStore>(store: &S) -> Result<HubCa, StoreError> {
    load_or_create_ca_for(store, CaRole::Channel).await
}

/// The Flower CA (SuperLink certificates), created on first use ([`CaRole::Flower`]).
pub async fn load_or_create_flower_ca<S: ClusterStore>(store: &S) -> Result<HubCa, StoreError> {
    load_or_create_ca_for(store, CaRole::Flower).await
}

/// The CA of `role`, created on first use.
pub async fn load_or_create_ca_for<S: ClusterStore>(
    store: &S,
    role: CaRole,
) -> Result<HubCa, StoreError> {
    Ok(load_or_create_ca_noting_loss(store, role).await?.ca)
}

/// A CA loaded or created, and whether it replaced one that was lost.
#[derive(Debug)]
pub struct LoadedCa {
    /// The CA in force.
    pub ca: HubCa,
    /// When the Flower CA was missing although this hub ran before (it marks its CAs in force
    /// at every start): what a new one means and how to keep the old one. Already logged as a
    /// warning; the Kubernetes hub also publishes it as an event.
    pub replaced_lost: Option<String>,
}

/// What a Flower CA made anew after it was lost means, and the fix.
pub fn lost_flower_ca_message(location: &str) -> String {
    format!(
        "the Flower CA ({location}) was missing although this hub ran with one before, so a new one was made: every Federation's SuperLink certificate is issued again under it and its SuperLink restarts (runs in progress stop); SuperNodes get the new CA bundle through their agents and reconnect; every flwr user must fetch the new CA (flower-hub connect FEDERATION, or the Federation's ca.crt). To keep the old CA instead, stop the hub, restore {location} from a backup and start it again"
    )
}

/// [`load_or_create_ca_for`], saying whether a Flower CA was made anew after it was lost (a
/// work-channel CA that is lost is refused instead: [`StoreError::CaMissing`]). The Flower CA
/// heals by itself, SuperNodes included, but users' trust files break, so it is loud about it.
pub async fn load_or_create_ca_noting_loss<S: ClusterStore>(
    store: &S,
    role: CaRole,
) -> Result<LoadedCa, StoreError> {
    if let Some(material) = store.load_ca_for(role).await? {
        return Ok(LoadedCa {
            ca: HubCa::from_material(material)?,
            replaced_lost: None,
        });
    }
    // Every start marks both CAs in force together, after making both: a work-channel CA
    // marked in force without a Flower CA beside it means the Flower CA was there and is gone.
    let lost = role == CaRole::Flower && store.ca_in_force(CaRole::Channel).await?.is_some();
    if role == CaRole::Channel {
        // A missing CA is a first start only when no joined cluster holds a certificate of it.
        let holders: Vec<ClusterRecord> = store
            .list_clusters()
            .await?
            .into_iter()
            .filter(|c| c.status.client_cert_issuer.is_some())
            .collect();
        if let Some(first) = holders.first() {
            return Err(StoreError::CaMissing {
                location: store.ca_location(role),
                count: holders.len(),
                example: first.registration.name.clone(),
                issuer: first.status.client_cert_issuer.clone().unwrap_or_default(),
            });
        }
    }
    let fresh = HubCa::generate_for(role)?;
    let stored = store.create_ca_for(role, fresh.material()).await?;
    let replaced_lost = lost.then(|| lost_flower_ca_message(&store.ca_location(role)));
    match &replaced_lost {
        Some(message) => tracing::warn!(?role, "{message}"),
        None => tracing::info!(?role, "created a hub certificate authority"),
    }
    Ok(LoadedCa {
        ca: HubCa::from_material(stored)?,
        replaced_lost,
    })
}

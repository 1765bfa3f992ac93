//! [`ClusterStore`] on the hub's Kubernetes API: clusters are `ManagedCluster` objects, bootstrap
//! tokens are Secrets in the hub namespace, the CA is the Secret [`CA_SECRET`].
//!
//! Mapping of a [`ClusterRecord`]:
//! - `spec.hubAcceptsClient` ← acceptance; a new cluster is created with `false` unless
//!   auto-accepted;
//! - `status.labels`, `status.clusterClaims`, `status.version.agent` ← what the agent declared
//!   (hub-side `metadata.labels` stay the admin's);
//! - annotations [`ANN_KEY_FINGERPRINT`], [`ANN_TOKEN_ID`], [`ANN_CREATED`],
//!   [`ANN_CLIENT_CERT_NOT_AFTER`] ← the rest of the registration;
//! - `status.conditions`, `status.lastHeartbeat` ← the observed status (status subresource);
//! - while `Available` is `Unknown` (lease missed) the cluster carries the NoSelect taint
//!   [`crate::core::placement::TAINT_UNREACHABLE`] in `spec.taints`, while it is `False` (revoked)
//!   [`crate::core::placement::TAINT_UNAVAILABLE`] (timeAdded: when the condition changed), so
//!   Placements drop it unless they tolerate it.
//!
//! Writes are read-modify-write with the object's resourceVersion (retried on conflict), so the
//! admin's concurrent edits (labels, taints, acceptance) are never lost. [`ClusterStore::changes`]
//! is fed by a watch on ManagedClusters (`watch`), so `kubectl patch … hubAcceptsClient=false`
//! or a delete closes the cluster's stream at once. The same watch keeps a cache of every
//! ManagedCluster ([`ClusterStore::cached_cluster`]): a connecting agent is authorized, and its
//! status written, without a read per connection (10,000 at once after a hub restart). A status
//! write from the cache carries the cached resourceVersion, so a stale cache costs a conflict
//! and a fresh read, never a lost update.

use std::collections::BTreeMap;
use std::sync::Arc;

use dashmap::DashMap;

use flower_addon_crds::{
    ClusterClaim, ManagedCluster, ManagedClusterSpec, ManagedClusterStatus, ManagedClusterVersion,
    Taint, TaintEffect,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::core::placement::{TAINT_UNAVAILABLE, TAINT_UNREACHABLE};
use crate::registration::ca::{CaMaterial, CaRole};
use crate::registration::store::{
    ClusterCondition, ClusterRecord, ClusterRegistration, ClusterStatus, ClusterStore, StoreError,
};
use crate::registration::tokens::TokenRecord;

/// Name of the Secret holding the hub CA (`ca.crt`, `ca.key`) in the hub namespace.
pub const CA_SECRET: &str = "flower-hub-ca";
/// Secret holding the Flower CA (SuperLink certificates; [`CaRole::Flower`]).
pub const FLOWER_CA_SECRET: &str = "flower-hub-flower-ca";

/// The Secret of the CA of `role`.
pub fn ca_secret_name(role: CaRole) -> &'static str {
    match role {
        CaRole::Channel => CA_SECRET,
        CaRole::Flower => FLOWER_CA_SECRET,
    }
}
/// Name of the Service in front of the hub's work channel (manifests/hub/service.yaml); its DNS
/// names are in the hub's server certificate.
pub const HUB_SERVICE: &str = "flower-hub";
/// Annotation: `sha256:<hex>` of the key the cluster is bound to.
pub const ANN_KEY_FINGERPRINT: &str = "flower-addon.io/key-fingerprint";
/// Annotation: `sha256:<hex>` of the key bound before, still trusted (agents installed as an OCM
/// addon, whose klusterlet renews with a new key).
pub const ANN_PREVIOUS_KEY_FINGERPRINT: &str = "flower-addon.io/previous-key-fingerprint";
/// Annotation: id of the bootstrap token of the first join.
pub const ANN_TOKEN_ID: &str = "flower-addon.io/token-id";
/// Annotation: first join, Unix seconds.
pub const ANN_CREATED: &str = "flower-addon.io/created-unix";
/// Annotation: end of validity of the last client certificate, Unix seconds.
pub const ANN_CLIENT_CERT_NOT_AFTER: &str = "flower-addon.io/client-cert-not-after";
/// Annotation: hash of the work-channel CA that signed the last client certificate.
pub const ANN_CLIENT_CERT_ISSUER: &str = "flower-addon.io/client-cert-issuer";
/// Annotation: the work-channel CA bundle sent with it (hashes, comma-separated).
pub const ANN_CHANNEL_BUNDLE: &str = "flower-addon.io/channel-bundle";
/// Label on token Secrets (value `true`).
pub const TOKEN_LABEL: &str = "flower-addon.io/bootstrap-token";
/// Annotation on token Secrets: expiry, RFC 3339.
pub const ANN_TOKEN_EXPIRES: &str = "flower-addon.io/expires";
/// `type` of token Secrets.
pub const TOKEN_SECRET_TYPE: &str = "flower-addon.io/bootstrap-token";
/// Prefix of token Secret names (`flower-hub-token-<id>`).
pub const TOKEN_SECRET_PREFIX: &str = "flower-hub-token-";

const CONFLICT_RETRIES: usize = 8;

/// A [`ClusterStore`] on the hub cluster's API.
pub struct KubeStore {
    client: Client,
    namespace: String,
    changes: broadcast::Sender<String>,
    /// Every ManagedCluster as the watch last saw it (without `managedFields`).
    cache: Arc<DashMap<String, Arc<ManagedCluster>>>,
    watch: Option<JoinHandle<()>>,
    /// `spec.leaseDurationSeconds` of the ManagedClusters this store creates.
    lease_seconds: i32,
}

impl Drop for KubeStore {
    fn drop(&mut self) {
        if let Some(watch) = &self.watch {
            watch.abort();
        }
    }
}

impl std::fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStore")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> StoreError {
    let path = what.into();
    move |e| StoreError::Io {
        path,
        source: std::io::Error::other(e),
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

impl KubeStore {
    /// A store on `client` keeping tokens and the CA in `namespace`. Starts the ManagedCluster
    /// watch that feeds [`ClusterStore::changes`] (needs a Tokio runtime; stopped on drop).
    pub fn new(client: Client, namespace: impl Into<String>) -> Self {
        let (changes, _) = broadcast::channel(1024);
        let cache: Arc<DashMap<String, Arc<ManagedCluster>>> = Arc::new(DashMap::new());
        let watch = watch::spawn(client.clone(), changes.clone(), cache.clone());
        Self {
            client,
            namespace: namespace.into(),
            changes,
            cache,
            watch: Some(watch),
            lease_seconds: flower_addon_crds::DEFAULT_LEASE_DURATION_SECONDS,
        }
    }

    /// A store without the ManagedCluster watch, for one-shot commands (`flower-hub token`,
    /// `accept`, …): [`ClusterStore::changes`] never fires.
    pub fn without_watch(client: Client, namespace: impl Into<String>) -> Self {
        let (changes, _) = broadcast::channel(1);
        Self {
            client,
            namespace: namespace.into(),
            changes,
            cache: Arc::new(DashMap::new()),
            watch: None,
            lease_seconds: flower_addon_crds::DEFAULT_LEASE_DURATION_SECONDS,
        }
    }

    /// ManagedClusters created on join get `spec.leaseDurationSeconds` = `lease` (the hub's
    /// `--lease-duration`); an admin may change it per cluster afterwards.
    pub fn with_lease_duration(mut self, lease: std::time::Duration) -> Self {
        self.lease_seconds = i32::try_from(lease.as_secs().max(1)).unwrap_or(i32::MAX);
        self
    }

    fn clusters(&self) -> Api<ManagedCluster> {
        Api::all(self.client.clone())
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Read-modify-write of a ManagedCluster's metadata and spec (`update` returns whether it
    /// changed anything), retried on conflicts.
    async fn modify(
        &self,
        name: &str,
        update: impl FnMut(&mut ManagedCluster) -> bool,
    ) -> Result<(), StoreError> {
        self.read_modify_write(name, false, update).await
    }

    /// Read-modify-write of a ManagedCluster's status subresource, retried on conflicts.
    async fn modify_status(
        &self,
        name: &str,
        mut update: impl FnMut(&mut ManagedClusterStatus),
    ) -> Result<(), StoreError> {
        self.read_modify_write(name, true, |mc| {
            let before = mc.status.clone();
            update(mc.status.get_or_insert_with(Default::default));
            mc.status != before
        })
        .await
    }

    /// Reads ManagedCluster `name`, lets `update` change it (false: nothing to write) and writes
    /// it back (its status subresource when `status`), again from a fresh read on a conflict.
    async fn read_modify_write(
        &self,
        name: &str,
        status: bool,
        mut update: impl FnMut(&mut ManagedCluster) -> bool,
    ) -> Result<(), StoreError> {
        let api = self.clusters();
        let what = if status {
            format!("update status of ManagedCluster {name}")
        } else {
            format!("update ManagedCluster {name}")
        };
        for _ in 0..CONFLICT_RETRIES {
            let Some(mut mc) = api
                .get_opt(name)
                .await
                .map_err(kube_err(format!("get ManagedCluster {name}")))?
            else {
                return Err(not_found("cluster", name));
            };
            if !update(&mut mc) {
                return Ok(());
            }
            let written = if status {
                api.replace_status(name, &PostParams::default(), &mc).await
            } else {
                api.replace(name, &PostParams::default(), &mc).await
            };
            match written {
                Ok(_) => return Ok(()),
                Err(e) if is_status(&e, 409) => continue,
                Err(e) if is_status(&e, 404) => return Err(not_found("cluster", name)),
                Err(e) => return Err(kube_err(what)(e)),
            }
        }
        Err(conflict(name))
    }
}

/// Annotation on a CA Secret: the fingerprint of the CA material the hub last started with
/// ([`crate::registration::rotation::in_force_fingerprint`]).
pub const CA_IN_FORCE_ANNOTATION: &str = "flower-addon.io/in-force";

mod cluster_store;
mod mapping;
mod watch;
use mapping::*;
pub use mapping::{hub_service_dns_names, hub_service_server_name, record_of};

#[cfg(test)]
mod tests;

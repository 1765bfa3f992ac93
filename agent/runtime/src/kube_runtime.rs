//! The Kubernetes runtime: applies each Federation's pool workloads (and the CA Secret they
//! mount) with server-side apply, prunes what the snapshot no longer has, and reports readiness
//! from the workloads' status.
//!
//! Everything the agent applies carries [`APPLIED_BY_LABEL`]` = `[`AGENT_FIELD_MANAGER`] on top of
//! the renderer's `app.kubernetes.io/*` labels. Pruning lists StatefulSets, DaemonSets and Secrets
//! with that label in every namespace and deletes those not in the snapshot: removed pools,
//! removed Federations, and the old kind after a mode switch (same name, other kind). Objects of
//! a Federation whose work could not be rendered are kept (a bad spec never deletes running
//! SuperNodes), and the channel never calls [`Runtime::apply`] while the hub is unreachable.
//!
//! With SuperNode authentication ([`FederationPlan::secure`]: TLS on and
//! `supernodeAuthentication` not off), each pool also has a Secret with one key per pod or
//! node, made here and never sent anywhere; only their public keys are reported, and a SuperNode
//! starts once the hub has registered its key ([`keys`]).
//!
//! Applying is deterministic: the renderer's output is byte-identical for an unchanged snapshot
//! and unchanged keys, and a server-side apply of an unchanged object changes no
//! `resourceVersion`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Mutex;

use flower_addon_crds::{DeploymentMode, FederationSpec};
use flower_addon_proto::{ClusterWork, FederationStatus, FederationWork};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::events;

use crate::render::{
    CA_KEY, SuperNodePoolInput, Workload, component_labels, mount_node_keys, node_key_secret_name,
    pool_headless_service, pool_workload_name, render_supernode_pool, spoke_ca_secret_name,
};
use crate::runtime::{BoxFuture, Runtime, RuntimeError};
use crate::work::FederationPlan;

/// Field manager of every server-side apply the agent makes.
pub const AGENT_FIELD_MANAGER: &str = "flower-addon-agent";
/// `Ready` reason of a pool whose workload is not in the cluster (deleted behind the runtime's
/// back); the next apply puts it back.
pub const WORKLOAD_MISSING: &str = "WorkloadMissing";
/// Label marking objects the agent applied (value [`AGENT_FIELD_MANAGER`]); pruning selects on it.
pub const APPLIED_BY_LABEL: &str = "flower-addon.io/applied-by";
/// Label with the agent's installation id ([`Applier::with_installation`]); pruning selects on it.
pub const INSTALLATION_LABEL: &str = "flower-addon.io/installation";

/// Kind of an applied object, for the desired set and pruning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A StatefulSet pool.
    StatefulSet,
    /// A DaemonSet pool.
    DaemonSet,
    /// The CA bundle Secret.
    Secret,
    /// A pool's headless Service.
    Service,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::StatefulSet => "StatefulSet",
            Self::DaemonSet => "DaemonSet",
            Self::Secret => "Secret",
            Self::Service => "Service",
        }
    }
}

/// `(kind, namespace, name)` of an object the snapshot wants.
type ObjectKey = (Kind, String, String);

/// A workload as [`KubeRuntime::apply_rendered`] applied it: its pool, its key, and the uid and
/// what the apply answered with (`None`: unchanged, not sent).
type AppliedWorkload<'r> = (
    &'r AppliedPool,
    ObjectKey,
    Option<(Option<String>, status::Applied)>,
);

/// One pool as applied, for [`Runtime::status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedPool {
    name: String,
    workload: String,
    kind: Kind,
    /// Public keys of every desired SuperNode of the pool (SuperNode authentication on), for
    /// the hub to register.
    node_public_keys: Vec<String>,
    /// Desired SuperNodes not started because their key is not registered yet.
    waiting: u32,
}

/// One Federation as applied.
#[derive(Clone, Debug, PartialEq, Eq)]
struct AppliedFederation {
    namespace: String,
    name: String,
    pools: Vec<AppliedPool>,
    /// Why the Federation's work could not be applied, reported in every pool's condition.
    error: Option<String>,
    /// The restart mark of the work it was applied from (`FederationWork.supernode_restart`).
    supernode_restart: String,
}

/// Objects rendered for one Federation, ready to apply (what `flower-hub render --cluster`
/// prints, too).
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    /// The Secret with the SuperLink CA bundle (TLS on).
    pub secret: Option<Secret>,
    /// One workload per pool.
    pub workloads: Vec<(AppliedPool, Workload)>,
    /// The headless Services StatefulSet pools name in `serviceName`.
    pub services: Vec<k8s_openapi::api::core::v1::Service>,
}

impl Rendered {
    /// Every object as JSON, in apply order (Secret, Services, workloads).
    pub fn to_values(&self) -> Result<Vec<serde_json::Value>, serde_json::Error> {
        let mut out = Vec::new();
        if let Some(secret) = &self.secret {
            out.push(serde_json::to_value(secret)?);
        }
        for service in &self.services {
            out.push(serde_json::to_value(service)?);
        }
        for (_, workload) in &self.workloads {
            out.push(workload.to_value()?);
        }
        Ok(out)
    }
}

mod applier;
mod apply;
mod error;
pub mod keys;
mod owned;
mod policy;
mod recorder;
mod render;
mod runtime;
pub mod sent;
mod status;
mod writes;
pub use applier::{Applier, OwnerFn};
pub use error::KubeRuntimeError;
use error::kube_err;
pub use keys::{FederationKeys, PoolKeys};
pub use policy::{Admin, Allowance, PodPolicy, PodSecurityLevel};
use render::declared_pools;
pub use render::{render_federation, render_federation_with_keys};
use status::WorkloadCache;
use writes::{apply, delete_object};
pub use writes::{ensure_namespace, label_namespace};

// === impl KubeRuntime ===

/// Runs SuperNode pools as StatefulSets or DaemonSets in the agent's cluster.
pub struct KubeRuntime {
    client: Client,
    applier: Applier,
    applied: Mutex<Vec<AppliedFederation>>,
    /// What was sent, so a snapshot costs requests only for what changed ([`sent`]).
    sent: Mutex<sent::Sent>,
    /// Caches of the runtime's workloads, read by [`KubeRuntime::observe`] instead of one GET
    /// per pool once they have listed ([`KubeRuntime::with_workload_cache`]).
    workloads: Option<WorkloadCache>,
    /// Allocatable resources summed over the cluster's nodes, and when they were read.
    allocatable: tokio::sync::Mutex<Option<(std::time::Instant, crate::runtime::Allocatable)>>,
    /// Events on the workloads it applies, prunes or fails to apply (reporting controller: the
    /// applier's field manager).
    recorder: events::Recorder,
    /// What the pods of received work may do here ([`PodPolicy`]).
    policy: PodPolicy,
}

/// How long a node sum is reused before the nodes are listed again.
const ALLOCATABLE_TTL: std::time::Duration = std::time::Duration::from_secs(300);

impl Debug for KubeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeRuntime").finish_non_exhaustive()
    }
}

impl KubeRuntime {
    /// A runtime applying with `client` (the agent's ServiceAccount in its cluster), under a
    /// spoke's default policy ([`PodPolicy::spoke_default`]).
    pub fn new(client: Client) -> Self {
        Self::with_applier(client, Applier::agent()).with_policy(PodPolicy::spoke_default())
    }

    /// The same runtime under `policy`.
    pub fn with_policy(mut self, policy: PodPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// A runtime applying with `client` as `applier`, without a pod policy
    /// ([`PodPolicy::unrestricted`]: the hub's own cluster; give one with
    /// [`KubeRuntime::with_policy`]).
    pub fn with_applier(client: Client, applier: Applier) -> Self {
        let reporter = events::Reporter {
            controller: applier.manager().to_owned(),
            // The pod (a Deployment's pod name is its hostname), or the machine.
            instance: std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .ok(),
        };
        Self {
            recorder: events::Recorder::new(client.clone(), reporter),
            client,
            applier,
            applied: Mutex::new(Vec::new()),
            sent: Mutex::new(sent::Sent::default()),
            workloads: None,
            allocatable: tokio::sync::Mutex::new(None),
            policy: PodPolicy::unrestricted(),
        }
    }

    /// Reads the workloads' status from these caches (reflectors of the objects this runtime
    /// applies, kept by the caller) instead of one GET per pool per observation.
    pub fn with_workload_cache(
        mut self,
        statefulsets: kube::runtime::reflector::Store<StatefulSet>,
        daemonsets: kube::runtime::reflector::Store<DaemonSet>,
    ) -> Self {
        self.workloads = Some(WorkloadCache::new(statefulsets, daemonsets));
        self
    }

    /// Converges the cluster to `work`; on failure the first error is returned after every
    /// Federation was tried (one bad Federation does not block the others). Only what changed
    /// since the last apply is sent, except in a full apply ([`sent`]).
    pub async fn apply_work(&self, work: &ClusterWork) -> Result<(), KubeRuntimeError> {
        let (full, before) = {
            let mut sent = self.sent();
            (sent.start(), sent.wanted())
        };
        let mut desired: BTreeSet<ObjectKey> = BTreeSet::new();
        // Federations whose objects must not be pruned: their work failed to render or apply.
        let mut keep: BTreeSet<(String, String)> = BTreeSet::new();
        let mut applied = Vec::new();
        let mut first_error = None;
        let previous = self.applied.lock().map(|a| a.clone()).unwrap_or_default();
        for fed in &work.federations {
            let id = format!("{}/{}", fed.namespace, fed.name);
            let same = |a: &&AppliedFederation| a.namespace == fed.namespace && a.name == fed.name;
            let unchanged = self.sent().unchanged(fed).cloned();
            if let (Some(objects), Some(before)) = (unchanged, previous.iter().find(same)) {
                desired.extend(objects);
                applied.push(before.clone());
                continue;
            }
            let mut wanted = BTreeSet::new();
            let result = match crate::work::decode_federation(work, fed)
                .map_err(KubeRuntimeError::from)
                .and_then(|plan| render_federation(&plan).map(|base| (plan, base)))
            {
                Ok((plan, base)) => self.apply_federation(&plan, &base, &mut wanted).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(rendered) => {
                    tracing::debug!(federation = %id, pools = rendered.workloads.len(), "federation applied");
                    desired.extend(wanted.iter().cloned());
                    self.sent().applied(fed, wanted);
                    applied.push(AppliedFederation {
                        namespace: fed.namespace.clone(),
                        name: fed.name.clone(),
                        pools: rendered.workloads.into_iter().map(|(p, _)| p).collect(),
                        error: None,
                        supernode_restart: fed.supernode_restart.trim().to_owned(),
                    });
                }
                Err(e) => {
                    tracing::warn!(federation = %id, kind = e.metric_label(), error = %e, "federation not applied");
                    desired.extend(self.sent().failed(fed));
                    keep.insert((fed.namespace.clone(), fed.name.clone()));
                    applied.push(self.not_applied(fed, &e, previous.iter().find(same)));
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Ok(mut slot) = self.applied.lock() {
            *slot = applied;
        }
        let live = work
            .federations
            .iter()
            .map(|f| (f.namespace.clone(), f.name.clone()))
            .collect();
        if full {
            for key in self.prune(&desired, &keep).await? {
                self.record_pruned(&key);
            }
        } else {
            let orphans: Vec<ObjectKey> = before.difference(&desired).cloned().collect();
            for key in &orphans {
                if delete_object(&self.client, key).await? {
                    self.record_pruned(key);
                }
                self.sent().forget_body(key);
            }
        }
        self.sent().retain(&live);
        if let Some(mut fresh) = self.workloads.as_ref().and_then(|c| c.fresh.lock().ok()) {
            fresh.retain(|key, _| desired.contains(key));
        }
        match first_error {
            Some(e) => Err(e),
            None => {
                if full {
                    self.sent().full_done();
                }
                tracing::info!(
                    version = work.version,
                    federations = work.federations.len(),
                    full,
                    "work applied"
                );
                Ok(())
            }
        }
    }

    /// A Federation whose work failed to render or apply with `e`: a Warning event on each of
    /// its pools, and its report with the error and the SuperNode keys reported `before` (they
    /// stay on the cluster: reporting them keeps them registered on the hub).
    fn not_applied(
        &self,
        fed: &FederationWork,
        e: &KubeRuntimeError,
        before: Option<&AppliedFederation>,
    ) -> AppliedFederation {
        let id = format!("{}/{}", fed.namespace, fed.name);
        let mut pools = declared_pools(fed);
        for pool in &mut pools {
            let key = (pool.kind, fed.namespace.clone(), pool.workload.clone());
            self.record(
                &key,
                None,
                events::Event {
                    type_: events::EventType::Warning,
                    reason: "ApplyFailed".to_owned(),
                    note: Some(
                        format!("Federation {id}, pool {}: {e}", pool.name)
                            .chars()
                            .take(1000)
                            .collect(),
                    ),
                    action: "Apply".to_owned(),
                    secondary: None,
                },
            );
            if let Some(old) = before.and_then(|b| b.pools.iter().find(|p| p.name == pool.name)) {
                pool.node_public_keys = old.node_public_keys.clone();
            }
        }
        AppliedFederation {
            namespace: fed.namespace.clone(),
            name: fed.name.clone(),
            pools,
            error: Some(e.to_string()),
            supernode_restart: fed.supernode_restart.trim().to_owned(),
        }
    }

    /// The memory of what was sent (a poisoned lock means a panic elsewhere: start afresh).
    fn sent(&self) -> std::sync::MutexGuard<'_, sent::Sent> {
        self.sent.lock().unwrap_or_else(|poisoned| {
            let mut guard = poisoned.into_inner();
            *guard = sent::Sent::default();
            guard
        })
    }

    /// Server-side applies `object` as `key` unless its body is what was last applied there;
    /// returns the stored object when it was applied.
    async fn send<K>(
        &self,
        api: &Api<K>,
        key: ObjectKey,
        object: &K,
    ) -> Result<Option<K>, KubeRuntimeError>
    where
        K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + Debug,
        K::DynamicType: Default,
    {
        let body = serde_json::to_value(object).map_err(|source| KubeRuntimeError::Serialize {
            what: format!("{} {}", key.0.name(), key.2),
            source,
        })?;
        if self.sent().same_body(&key, &body) {
            return Ok(None);
        }
        self.sent().forget_body(&key);
        let stored = apply(api, &key.2, &body, self.applier.manager()).await?;
        self.sent().body_applied(key, &body);
        Ok(Some(stored))
    }

    /// Applies one Federation: its pools' key Secrets first (authentication on), then the objects
    /// [`render_federation_with_keys`] makes from `base` and the keys; returns what was applied.
    async fn apply_federation(
        &self,
        plan: &FederationPlan,
        base: &Rendered,
        desired: &mut BTreeSet<ObjectKey>,
    ) -> Result<Rendered, KubeRuntimeError> {
        self.admit(plan, base).await?;
        let pool_keys = if plan.secure() {
            self.ensure_keys(plan, base, desired).await?
        } else {
            FederationKeys::new()
        };
        let mut rendered = render_federation_with_keys(plan, &pool_keys)?;
        self.stamp(&mut rendered, plan);
        let stored = self.apply_rendered(plan, &rendered, desired).await?;
        self.record_applied(plan, stored);
        Ok(rendered)
    }

    /// Every node of the cluster (DaemonSet pools have a key per node they may run on).
    async fn list_nodes(&self) -> Result<Vec<k8s_openapi::api::core::v1::Node>, KubeRuntimeError> {
        Api::<k8s_openapi::api::core::v1::Node>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map(|list| list.items)
            .map_err(kube_err("list Nodes"))
    }
}

#[cfg(test)]
mod tests;

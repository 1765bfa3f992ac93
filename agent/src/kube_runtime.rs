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
//! Applying is deterministic: the renderer's output is byte-identical for an unchanged snapshot,
//! and a server-side apply of an unchanged object changes no `resourceVersion`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Mutex;

use flower_addon_crds::{DeploymentMode, FederationSpec};
use flower_addon_proto::{ClusterWork, Condition, FederationStatus, FederationWork, PoolStatus};
use k8s_openapi::ByteString;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::render::{
    CA_KEY, RenderError, SuperNodePoolInput, Workload, component_labels, pool_headless_service,
    pool_workload_name, render_supernode_pool, spoke_ca_secret_name,
};
use crate::runtime::{BoxFuture, Runtime, RuntimeError};
use crate::work::{FederationPlan, WorkError};

/// Field manager of every server-side apply the agent makes.
pub const AGENT_FIELD_MANAGER: &str = "flower-addon-agent";
/// Label marking objects the agent applied (value [`AGENT_FIELD_MANAGER`]); pruning selects on it.
pub const APPLIED_BY_LABEL: &str = "flower-addon.io/applied-by";

/// Why the Kubernetes runtime could not apply (part of) a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum KubeRuntimeError {
    /// The work of the Federation cannot be used ([`crate::work::decode_federation`]).
    #[error(transparent)]
    Work(#[from] WorkError),
    /// A pool cannot be rendered.
    #[error("federation {federation}: {source}")]
    Render {
        /// `<namespace>/<name>` of the Federation.
        federation: String,
        /// What is wrong.
        source: RenderError,
    },
    /// The apiserver refused a request.
    #[error("{action}: {source}")]
    Kube {
        /// What the agent was doing, e.g. `apply StatefulSet ns/name`.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// An object could not be serialized for the apply body.
    #[error("serialize {what}: {source}")]
    Serialize {
        /// The object.
        what: String,
        /// The serialization error.
        source: serde_json::Error,
    },
}

impl KubeRuntimeError {
    /// A stable, low-cardinality name of the error kind (metrics, logs).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Work(WorkError::Name { .. }) => "names",
            Self::Work(WorkError::Version { .. }) => "version",
            Self::Work(_) => "decode",
            Self::Render { .. } => "render",
            Self::Kube { .. } => "kube",
            Self::Serialize { .. } => "serialize",
        }
    }
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeRuntimeError {
    let action = action.into();
    move |source| KubeRuntimeError::Kube { action, source }
}

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

/// One pool as applied, for [`Runtime::status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedPool {
    name: String,
    workload: String,
    kind: Kind,
}

/// One Federation as applied.
#[derive(Clone, Debug, PartialEq, Eq)]
struct AppliedFederation {
    namespace: String,
    name: String,
    pools: Vec<AppliedPool>,
    /// Why the Federation's work could not be applied, reported in every pool's condition.
    error: Option<String>,
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

mod render;
use render::declared_pools;
pub use render::render_federation;

// === impl KubeRuntime ===

/// Runs SuperNode pools as StatefulSets or DaemonSets in the agent's cluster.
pub struct KubeRuntime {
    client: Client,
    applied: Mutex<Vec<AppliedFederation>>,
    /// Allocatable resources summed over the cluster's nodes, and when they were read.
    allocatable: tokio::sync::Mutex<Option<(std::time::Instant, crate::runtime::Allocatable)>>,
}

/// How long a node sum is reused before the nodes are listed again.
const ALLOCATABLE_TTL: std::time::Duration = std::time::Duration::from_secs(300);

impl Debug for KubeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeRuntime").finish_non_exhaustive()
    }
}

impl KubeRuntime {
    /// A runtime applying with `client` (the agent's ServiceAccount in its cluster).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            applied: Mutex::new(Vec::new()),
            allocatable: tokio::sync::Mutex::new(None),
        }
    }

    /// Converges the cluster to `work`; on failure the first error is returned after every
    /// Federation was tried (one bad Federation does not block the others).
    pub async fn apply_work(&self, work: &ClusterWork) -> Result<(), KubeRuntimeError> {
        let mut desired: BTreeSet<ObjectKey> = BTreeSet::new();
        // Federations whose objects must not be pruned: their work failed to render or apply.
        let mut keep: BTreeSet<(String, String)> = BTreeSet::new();
        let mut applied = Vec::new();
        let mut first_error = None;
        for fed in &work.federations {
            let id = format!("{}/{}", fed.namespace, fed.name);
            let result = match crate::work::decode_federation(work, fed)
                .map_err(KubeRuntimeError::from)
                .and_then(|plan| render_federation(&plan))
            {
                Ok(rendered) => self
                    .apply_federation(fed, &rendered, &mut desired)
                    .await
                    .map(|()| rendered),
                Err(e) => Err(e),
            };
            match result {
                Ok(rendered) => {
                    tracing::debug!(federation = %id, pools = rendered.workloads.len(), "federation applied");
                    applied.push(AppliedFederation {
                        namespace: fed.namespace.clone(),
                        name: fed.name.clone(),
                        pools: rendered.workloads.into_iter().map(|(p, _)| p).collect(),
                        error: None,
                    });
                }
                Err(e) => {
                    tracing::warn!(federation = %id, kind = e.metric_label(), error = %e, "federation not applied");
                    keep.insert((fed.namespace.clone(), fed.name.clone()));
                    applied.push(AppliedFederation {
                        namespace: fed.namespace.clone(),
                        name: fed.name.clone(),
                        pools: declared_pools(fed),
                        error: Some(e.to_string()),
                    });
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Ok(mut slot) = self.applied.lock() {
            *slot = applied;
        }
        self.prune(&desired, &keep).await?;
        match first_error {
            Some(e) => Err(e),
            None => {
                tracing::info!(
                    version = work.version,
                    federations = work.federations.len(),
                    "work applied"
                );
                Ok(())
            }
        }
    }

    async fn apply_federation(
        &self,
        fed: &FederationWork,
        rendered: &Rendered,
        desired: &mut BTreeSet<ObjectKey>,
    ) -> Result<(), KubeRuntimeError> {
        ensure_namespace(&self.client, &fed.namespace).await?;
        let ns = fed.namespace.as_str();
        if let Some(secret) = &rendered.secret {
            let name = secret.metadata.name.clone().unwrap_or_default();
            desired.insert((Kind::Secret, ns.to_owned(), name.clone()));
            apply(
                &Api::<Secret>::namespaced(self.client.clone(), ns),
                &name,
                secret,
            )
            .await?;
        }
        for service in &rendered.services {
            let name = service.metadata.name.clone().unwrap_or_default();
            desired.insert((Kind::Service, ns.to_owned(), name.clone()));
            apply(
                &Api::<k8s_openapi::api::core::v1::Service>::namespaced(self.client.clone(), ns),
                &name,
                service,
            )
            .await?;
        }
        for (pool, workload) in &rendered.workloads {
            desired.insert((pool.kind, ns.to_owned(), pool.workload.clone()));
            match workload {
                Workload::StatefulSet(s) => {
                    apply(
                        &Api::<StatefulSet>::namespaced(self.client.clone(), ns),
                        &pool.workload,
                        s,
                    )
                    .await?
                }
                Workload::DaemonSet(d) => {
                    apply(
                        &Api::<DaemonSet>::namespaced(self.client.clone(), ns),
                        &pool.workload,
                        d,
                    )
                    .await?
                }
            }
        }
        Ok(())
    }

    async fn prune(
        &self,
        desired: &BTreeSet<ObjectKey>,
        keep: &BTreeSet<(String, String)>,
    ) -> Result<(), KubeRuntimeError> {
        prune_kind::<StatefulSet>(&self.client, Kind::StatefulSet, desired, keep).await?;
        prune_kind::<DaemonSet>(&self.client, Kind::DaemonSet, desired, keep).await?;
        prune_kind::<Secret>(&self.client, Kind::Secret, desired, keep).await?;
        prune_kind::<k8s_openapi::api::core::v1::Service>(
            &self.client,
            Kind::Service,
            desired,
            keep,
        )
        .await
    }

    /// The observed state of every Federation of the last applied snapshot.
    pub async fn observe(&self) -> Vec<FederationStatus> {
        let applied = self.applied.lock().map(|a| a.clone()).unwrap_or_default();
        let mut out = Vec::with_capacity(applied.len());
        for fed in applied {
            let mut pools = Vec::with_capacity(fed.pools.len());
            for pool in &fed.pools {
                pools.push(match &fed.error {
                    Some(error) => PoolStatus {
                        name: pool.name.clone(),
                        conditions: vec![condition("False", "ApplyFailed", error.clone())],
                        ..PoolStatus::default()
                    },
                    None => self.pool_status(&fed.namespace, pool).await,
                });
            }
            out.push(FederationStatus {
                namespace: fed.namespace,
                name: fed.name,
                pools,
            });
        }
        out
    }

    async fn pool_status(&self, namespace: &str, pool: &AppliedPool) -> PoolStatus {
        let observed = match pool.kind {
            Kind::StatefulSet => Api::<StatefulSet>::namespaced(self.client.clone(), namespace)
                .get_opt(&pool.workload)
                .await
                .map(|s| s.map(|s| statefulset_counts(&s))),
            _ => Api::<DaemonSet>::namespaced(self.client.clone(), namespace)
                .get_opt(&pool.workload)
                .await
                .map(|d| d.map(|d| daemonset_counts(&d))),
        };
        let what = format!("{} {namespace}/{}", pool.kind.name(), pool.workload);
        let (desired, ready, cond) = match observed {
            Ok(Some(counts)) => {
                let cond = ready_condition(&what, counts);
                (counts.desired, counts.ready, cond)
            }
            Ok(None) => (
                0,
                0,
                condition("False", "WorkloadMissing", format!("{what} not found")),
            ),
            Err(e) => (
                0,
                0,
                condition("Unknown", "StatusUnavailable", format!("get {what}: {e}")),
            ),
        };
        PoolStatus {
            name: pool.name.clone(),
            desired,
            ready,
            conditions: vec![cond],
            node_public_keys: Vec::new(),
        }
    }
}

impl Runtime for KubeRuntime {
    fn apply<'a>(&'a self, work: &'a ClusterWork) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.apply_work(work)
                .await
                .map_err(|e| RuntimeError::Apply(e.to_string()))
        })
    }

    fn status(&self) -> BoxFuture<'_, Vec<FederationStatus>> {
        Box::pin(self.observe())
    }

    /// `cpu` and `memory` allocatable summed over the cluster's nodes (read at most every
    /// [`ALLOCATABLE_TTL`]); empty if the nodes cannot be listed.
    fn allocatable(&self) -> BoxFuture<'_, crate::runtime::Allocatable> {
        Box::pin(async move {
            let mut cached = self.allocatable.lock().await;
            if let Some((at, value)) = cached.as_ref()
                && at.elapsed() < ALLOCATABLE_TTL
            {
                return value.clone();
            }
            let nodes = match Api::<k8s_openapi::api::core::v1::Node>::all(self.client.clone())
                .list(&Default::default())
                .await
            {
                Ok(list) => list.items,
                Err(error) => {
                    tracing::debug!(%error, "cannot list nodes for the allocatable report");
                    return crate::runtime::Allocatable::new();
                }
            };
            let sum = |key: &str| -> f64 {
                nodes
                    .iter()
                    .filter_map(|n| n.status.as_ref()?.allocatable.as_ref()?.get(key))
                    .filter_map(|q| flower_addon_crds::parse_quantity(&q.0))
                    .sum()
            };
            let mut value = crate::runtime::Allocatable::new();
            if !nodes.is_empty() {
                value.insert(
                    "cpu".to_owned(),
                    format!("{}m", (sum("cpu") * 1000.0).round()),
                );
                value.insert("memory".to_owned(), format!("{}", sum("memory").round()));
            }
            *cached = Some((std::time::Instant::now(), value.clone()));
            value
        })
    }
}

// === Kubernetes I/O ===

/// Creates `namespace` unless it exists (never deleted by the agent: it may hold user data).
async fn ensure_namespace(client: &Client, namespace: &str) -> Result<(), KubeRuntimeError> {
    let api = Api::<Namespace>::all(client.clone());
    let action = format!("get Namespace {namespace}");
    if api
        .get_opt(namespace)
        .await
        .map_err(kube_err(action))?
        .is_some()
    {
        return Ok(());
    }
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {
            tracing::info!(%namespace, "namespace created");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(source) => Err(KubeRuntimeError::Kube {
            action: format!("create Namespace {namespace}"),
            source,
        }),
    }
}

/// Server-side applies `object` as the agent's field manager (forced: the agent owns these).
async fn apply<K>(api: &Api<K>, name: &str, object: &K) -> Result<(), KubeRuntimeError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let params = PatchParams::apply(AGENT_FIELD_MANAGER).force();
    let body = serde_json::to_value(object).map_err(|source| KubeRuntimeError::Serialize {
        what: format!("{kind} {name}"),
        source,
    })?;
    api.patch(name, &params, &Patch::Apply(&body))
        .await
        .map_err(kube_err(format!("apply {kind} {name}")))?;
    Ok(())
}

/// Deletes objects of one kind that carry the agent's label and are not desired.
async fn prune_kind<K>(
    client: &Client,
    kind: Kind,
    desired: &BTreeSet<ObjectKey>,
    keep: &BTreeSet<(String, String)>,
) -> Result<(), KubeRuntimeError>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let selector = format!(
        "app.kubernetes.io/managed-by={},{APPLIED_BY_LABEL}={AGENT_FIELD_MANAGER}",
        crate::render::MANAGED_BY
    );
    let all = Api::<K>::all(client.clone());
    let list = all
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map_err(kube_err(format!("list {}", kind.name())))?;
    for object in list.items {
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        let name = object.metadata.name.clone().unwrap_or_default();
        let instance = object
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/instance"))
            .cloned()
            .unwrap_or_default();
        if desired.contains(&(kind, namespace.clone(), name.clone()))
            || keep.contains(&(namespace.clone(), instance))
        {
            continue;
        }
        let api = Api::<K>::namespaced(client.clone(), &namespace);
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => tracing::info!(kind = kind.name(), %namespace, %name, "pruned"),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => {
                return Err(KubeRuntimeError::Kube {
                    action: format!("delete {} {namespace}/{name}", kind.name()),
                    source,
                });
            }
        }
    }
    Ok(())
}

// === status ===

/// Desired and ready SuperNodes of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Counts {
    desired: u32,
    ready: u32,
    /// The controller has not yet observed the latest spec.
    stale: bool,
}

fn non_negative(n: Option<i32>) -> u32 {
    n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0)
}

fn statefulset_counts(s: &StatefulSet) -> Counts {
    let status = s.status.as_ref();
    let desired = non_negative(s.spec.replicas.or(Some(1)));
    Counts {
        desired,
        ready: non_negative(status.and_then(|st| st.ready_replicas)),
        stale: status.and_then(|st| st.observed_generation) < s.metadata.generation,
    }
}

fn daemonset_counts(d: &DaemonSet) -> Counts {
    let status = d.status.as_ref();
    Counts {
        desired: non_negative(status.map(|st| st.desired_number_scheduled)),
        ready: non_negative(status.map(|st| st.number_ready)),
        stale: status.and_then(|st| st.observed_generation) < d.metadata.generation,
    }
}

fn condition(status: &str, reason: &str, message: String) -> Condition {
    Condition {
        r#type: "Ready".to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
    }
}

/// `Ready` of one pool; the message names the workload and what it lacks.
fn ready_condition(what: &str, counts: Counts) -> Condition {
    if counts.stale {
        return condition(
            "False",
            "Progressing",
            format!("{what}: the latest spec is not yet observed by its controller"),
        );
    }
    if counts.ready >= counts.desired && counts.desired > 0 {
        condition(
            "True",
            "SuperNodesReady",
            format!(
                "{what}: {}/{} SuperNodes ready",
                counts.ready, counts.desired
            ),
        )
    } else {
        condition(
            "False",
            "SuperNodesNotReady",
            format!(
                "{what}: {}/{} SuperNodes ready",
                counts.ready, counts.desired
            ),
        )
    }
}

#[cfg(test)]
mod tests;

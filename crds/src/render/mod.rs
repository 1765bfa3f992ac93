//! The SuperNode renderer — the only one: the agent's Kubernetes and process runtimes, the hub
//! (for pools in its own cluster) and `flower-hub render` all call it.
//!
//! Rendering is pure and deterministic: the same input gives byte-identical objects (sorted maps,
//! ordered merges), so an unchanged Federation never restarts pods.
//!
//! # Placeholders in Kubernetes mode
//!
//! `{pool}`, `{replicas}`, `{cluster}`, `{clusterIndex}`, `{clusters}` and `{partitions}` are
//! substituted when rendering. `{index}` becomes `$(FLWR_POD_INDEX)`, an env var from the downward
//! API (`metadata.labels['apps.kubernetes.io/pod-index']`), and `{node}` becomes
//! `$(FLWR_NODE_NAME)` (`spec.nodeName`); Kubernetes expands both in the container arguments.
//!
//! `{partition}` is `offset + index`, and Kubernetes cannot add. Instead of a shell wrapper (which
//! would need `command`, a shell in the image and quoting of every user value), a pool that uses
//! `{partition}` gets `spec.ordinals.start = offset`: the StatefulSet then numbers its pods
//! `offset … offset+replicas-1`, the pod-index label *is* the global partition, and `{partition}`
//! becomes `$(FLWR_POD_INDEX)` too (pod names then carry the partition, e.g.
//! `fed-supernode-gpu-12`). The consequence: such a pool cannot also use `{index}` (the ordinal
//! is no longer 0-based); using both is an error, in every runtime, so a Federation is valid or
//! not independently of where it runs. `{index}`, `{replicas}`, `{partition}` and `{partitions}`
//! are errors in DaemonSet pools (no replica index or count).
//!
//! In process mode ([`supernode_argv`]) every placeholder is expanded natively with the same
//! rules, and nothing is escaped because no one expands anything.

pub mod address;
pub mod dialect;
pub mod merge;
pub mod node_config;
pub mod node_keys;
pub mod placeholders;
mod pool;
pub mod process_env;

use std::collections::BTreeMap;
use std::path::Path;

use crate::{FederationSpec, IsolationMode, SuperNodePoolSpec};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Group (and user) id of `app`, the user Flower's official images (`flwr/superlink`,
/// `flwr/supernode`, `flwr/superexec`) run as: the `fsGroup` our pods get unless their
/// podTemplate sets one, so volumes the kubelet manages (node keys, a SuperLink state claim)
/// are readable and writable by Flower.
pub const FLOWER_IMAGE_GROUP: i64 = 49999;

/// flower-addon's own image (the root `Dockerfile`; `flower-hub` and `flower-agent`) at this
/// release: the manifests' image, and the SuperLink pod's `fleet-front` sidecar.
pub const ADDON_IMAGE: &str = concat!(
    "ghcr.io/flower-addon/flower-addon:",
    env!("CARGO_PKG_VERSION")
);

pub use dialect::{DialectError, FlowerDialect, FlowerVersion};
pub use node_config::{NodeConfigError, encode_node_config};
pub use node_keys::{mount_node_keys, node_key_secret_name};
pub use placeholders::PlaceholderError;
pub use pool::{claim, superexec_clientapp_argv, supernode_argv};
pub use process_env::{ProcessEnvError, process_env, unenforced_resources};

/// Value of `app.kubernetes.io/managed-by` on everything we render.
pub const MANAGED_BY: &str = "flower-addon";
/// Label carrying the pool name on pool workloads and their pods.
pub const POOL_LABEL: &str = "flower-addon.io/pool";
/// Program the SuperNode runs ([`supernode_argv`] returns its arguments).
pub const SUPERNODE_PROGRAM: &str = "flower-supernode";
/// Program of the SuperExec sidecars ([`superexec_clientapp_argv`] returns its arguments).
pub const SUPEREXEC_PROGRAM: &str = "flower-superexec";
/// Directory where the SuperLink CA bundle (`ca.crt`) is mounted in SuperNode pods.
pub const CA_MOUNT_DIR: &str = "/etc/flwr/superlink-ca";
/// Key of the CA bundle in the CA Secret.
pub const CA_KEY: &str = "ca.crt";

/// The `app.kubernetes.io/*` labels of one component of a Federation (plus the pool label for
/// pools). Also the selector of the component's workload.
pub fn component_labels(
    federation: &str,
    name: &str,
    component: &str,
    pool: Option<&str>,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    labels.insert("app.kubernetes.io/name".to_owned(), name.to_owned());
    labels.insert(
        "app.kubernetes.io/instance".to_owned(),
        federation.to_owned(),
    );
    labels.insert(
        "app.kubernetes.io/component".to_owned(),
        component.to_owned(),
    );
    labels.insert(
        "app.kubernetes.io/managed-by".to_owned(),
        MANAGED_BY.to_owned(),
    );
    if let Some(pool) = pool {
        labels.insert(POOL_LABEL.to_owned(), pool.to_owned());
    }
    labels
}

/// Label with the Federation's name, as flower-operator sets it (its troubleshooting steps select
/// pods with it).
pub const OPERATOR_FEDERATION_LABEL: &str = "flower.flwr.ai/federation";
/// Label with the component (`superlink` or `supernode`), as flower-operator sets it.
pub const OPERATOR_COMPONENT_LABEL: &str = "flower.flwr.ai/component";
/// Label with the pool name on pool workloads and pods, as flower-operator sets it.
pub const OPERATOR_POOL_LABEL: &str = "flower.flwr.ai/pool";

/// [`component_labels`] plus flower-operator's `flower.flwr.ai/*` labels, so its users'
/// `kubectl -l flower.flwr.ai/component=supernode` habits work. For object and pod labels only:
/// selectors stay [`component_labels`] (a selector is immutable, and ours are already unique).
pub fn object_labels(
    federation: &str,
    name: &str,
    component: &str,
    pool: Option<&str>,
) -> BTreeMap<String, String> {
    let mut labels = component_labels(federation, name, component, pool);
    labels.insert(OPERATOR_FEDERATION_LABEL.to_owned(), federation.to_owned());
    labels.insert(OPERATOR_COMPONENT_LABEL.to_owned(), name.to_owned());
    if let Some(pool) = pool {
        labels.insert(OPERATOR_POOL_LABEL.to_owned(), pool.to_owned());
    }
    labels
}

/// Name of a pool's workload, `<fed>-supernode-<pool>`.
pub fn pool_workload_name(federation: &str, pool: &str) -> String {
    format!("{federation}-supernode-{pool}")
}

/// The headless Service `<fed>-supernode-<pool>` a StatefulSet pool names in `serviceName`, so
/// its SuperNode pods get stable DNS names (`<pod>.<fed>-supernode-<pool>.<ns>.svc`); not-ready
/// pods are published too (a SuperNode is reachable before it connects). No ports: SuperNodes
/// serve nothing to others.
pub fn pool_headless_service(
    federation: &str,
    namespace: &str,
    pool: &str,
) -> k8s_openapi::api::core::v1::Service {
    use k8s_openapi::api::core::v1::{Service, ServiceSpec};
    let component = format!("pool-{pool}");
    Service {
        metadata: ObjectMeta {
            name: Some(pool_workload_name(federation, pool)),
            namespace: Some(namespace.to_owned()),
            labels: Some(object_labels(
                federation,
                "supernode",
                &component,
                Some(pool),
            )),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            publish_not_ready_addresses: Some(true),
            selector: Some(component_labels(
                federation,
                "supernode",
                &component,
                Some(pool),
            )),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Name of the Secret holding the SuperLink CA bundle (`ca.crt`) in a spoke cluster; the agent
/// creates it from the CA bundle it receives with its work.
pub fn spoke_ca_secret_name(federation: &str) -> String {
    format!("{federation}-superlink-ca")
}

/// Where the pools of a Federation run, and the partitions of one pool there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterContext {
    /// Cluster name (`{cluster}`).
    pub name: String,
    /// Position of the cluster among the selected clusters, 0-based (`{clusterIndex}`).
    pub index: u32,
    /// Number of selected clusters (`{clusters}`).
    pub clusters: u32,
    /// Global partition of this pool's replica 0 on this cluster (numbered by the hub's work
    /// split over every selected cluster).
    pub partition_offset: u64,
    /// SuperNodes over every selected cluster (`{partitions}`).
    pub partitions: u64,
}

/// Everything needed to render one pool.
#[derive(Clone, Copy, Debug)]
pub struct SuperNodePoolInput<'a> {
    /// Federation name.
    pub federation: &'a str,
    /// Namespace of the workload.
    pub namespace: &'a str,
    /// Federation spec.
    pub spec: &'a FederationSpec,
    /// The pool (one of `spec.supernodes.pools`).
    pub pool: &'a SuperNodePoolSpec,
    /// Flower argument dialect ([`FlowerDialect::select`]).
    pub dialect: FlowerDialect,
    /// The Flower release (the SuperExec's flags change within a dialect).
    pub version: FlowerVersion,
    /// Fleet API address SuperNodes dial, `host:port` (the real Service or external port).
    pub fleet_address: &'a str,
    /// Secret with the SuperLink CA bundle under `ca.crt` (used when `spec.insecure` is false).
    pub ca_secret_name: &'a str,
    /// The cluster and the pool's partitions there.
    pub cluster: &'a ClusterContext,
}

/// A pool's workload.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// StatefulSet mode.
    StatefulSet(StatefulSet),
    /// DaemonSet mode.
    DaemonSet(DaemonSet),
}

impl Workload {
    /// The workload's metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Self::StatefulSet(s) => &s.metadata,
            Self::DaemonSet(d) => &d.metadata,
        }
    }

    /// The object as JSON (`apiVersion` and `kind` included, keys sorted).
    pub fn to_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        match self {
            Self::StatefulSet(s) => serde_json::to_value(s),
            Self::DaemonSet(d) => serde_json::to_value(d),
        }
    }
}

/// One replica of a pool run as a process (edge device, local demo).
#[derive(Clone, Copy, Debug)]
pub struct ProcessReplica<'a> {
    /// Replica index in the pool, 0-based (`{index}`).
    pub index: u32,
    /// Port of this replica's ClientAppIO / Runtime API on 127.0.0.1 (unique per host).
    pub runtime_port: u16,
    /// Host name (`{node}`).
    pub node_name: &'a str,
    /// CA bundle file for `--root-certificates` when TLS is on (`None`: system trust store).
    pub root_certificates: Option<&'a Path>,
}

/// Why a pool cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The pool's nodeConfig cannot be encoded.
    #[error("pool {pool:?}: {source}")]
    NodeConfig {
        /// Pool name.
        pool: String,
        /// What is wrong.
        source: NodeConfigError,
    },
    /// The pool uses `{index}` and `{partition}` together.
    #[error(
        "pool {pool:?}: nodeConfig uses both {{index}} and {{partition}}; use one (the pool's pods are numbered by partition when {{partition}} is used)"
    )]
    IndexWithPartition {
        /// Pool name.
        pool: String,
    },
    /// StatefulSet mode without replicas.
    #[error("pool {pool:?}: replicas must be set (>=1) for every pool when mode is StatefulSet")]
    MissingReplicas {
        /// Pool name.
        pool: String,
    },
    /// Process isolation without a ClientApp SuperExec image.
    #[error(
        "pool {pool:?}: spec.supernodes.pools[*].images.superexecClientApp is required when isolationMode=process"
    )]
    MissingSuperExecImage {
        /// Pool name.
        pool: String,
    },
    /// The SuperLink spec cannot be rendered.
    #[error("{0}")]
    SuperLink(String),
    /// No Flower dialect.
    #[error(transparent)]
    Dialect(#[from] DialectError),
}

/// Renders one pool as the StatefulSet or DaemonSet `<fed>-supernode-<pool>`.
pub fn render_supernode_pool(input: &SuperNodePoolInput<'_>) -> Result<Workload, RenderError> {
    pool::render(input)
}

/// Whether the Federation runs SuperExec sidecars.
pub(crate) fn is_process(spec: &FederationSpec) -> bool {
    spec.isolation_mode == IsolationMode::Process
}

/// The `--isolation` value of a Federation.
pub fn isolation_arg(spec: &FederationSpec) -> &'static str {
    match spec.isolation_mode {
        IsolationMode::Process => "--isolation=process",
        IsolationMode::Subprocess => "--isolation=subprocess",
    }
}

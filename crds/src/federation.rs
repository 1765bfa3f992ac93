//! The `Federation` resource: one Flower SuperLink on the hub and SuperNode pools in the hub
//! cluster or in the clusters a `Placement` selects.
//!
//! The spec is a superset of flower-operator's `Federation` spec (same field names and defaults);
//! additions are `placementRef`, `superlink.externalAddress` and `tls`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EnvVar, PersistentVolumeClaimSpec, PodTemplateSpec, ResourceRequirements, Volume, VolumeMount,
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema_helpers::{
    node_config_value_schema, preserve_unknown_object, preserve_unknown_object_list,
};
mod superlink;
pub use superlink::*;

/// Default Fleet API port (SuperNodes dial it), `spec.superlink.service.ports.grpc`.
pub const DEFAULT_FLEET_PORT: i32 = 9092;
/// Default ServerAppIO API port, `spec.superlink.service.ports.serverAppIO`.
pub const DEFAULT_SERVERAPPIO_PORT: i32 = 9091;
/// Default Control API port (`flwr run`), `spec.superlink.service.ports.extra`.
pub const DEFAULT_CONTROL_PORT: i32 = 9093;
pub use crate::limits::{MAX_NODE_CONFIG_ENTRIES, MAX_NODE_CONFIG_LENGTH, MAX_POOLS, MAX_REPLICAS};

/// Desired state of a Flower federation: a SuperLink and one or more SuperNode pools.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "flower-addon.io",
    version = "v1alpha1",
    derive = "PartialEq",
    kind = "Federation",
    plural = "federations",
    namespaced,
    status = "FederationStatus",
    shortname = "fed",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Isolation","type":"string","jsonPath":".spec.isolationMode"}"#,
    printcolumn = r#"{"name":"Clusters","type":"integer","jsonPath":".status.selectedClusters"}"#,
    printcolumn = r#"{"name":"Supernodes","type":"string","jsonPath":".status.supernodes"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FederationSpec {
    /// How SuperNode pools are materialised: one DaemonSet or one StatefulSet per pool.
    pub mode: DeploymentMode,
    /// Flower isolation mode for SuperLink and SuperNodes (`process` adds SuperExec sidecars).
    pub isolation_mode: IsolationMode,
    /// Flower version; selects the Flower argument dialect. When unset, read from the image tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub version: Option<String>,
    /// Run every component with `--insecure` (no TLS, no SuperNode authentication). Default
    /// false: the hub issues the SuperLink's certificate and registers each SuperNode's key
    /// (flower-operator defaults to true; its examples apply unchanged, with TLS).
    #[serde(default)]
    pub insecure: bool,
    /// With TLS (`insecure: false`), SuperNodes must authenticate with a key the hub registered
    /// with the SuperLink (Flower's `--enable-supernode-auth`): every SuperNode gets its own key
    /// pair, made where it runs, and the hub registers exactly the keys of the clusters the
    /// Federation is placed on (and unregisters the rest). `false` lets any SuperNode that
    /// trusts the CA join: only for SuperNodes the hub does not manage. Default true.
    #[serde(default = "default_true")]
    pub supernode_authentication: bool,
    /// The SuperLink (always runs in the hub cluster).
    pub superlink: SuperLinkSpec,
    /// SuperNode pools.
    pub supernodes: SuperNodesSpec,
    /// Placement whose decisions select the clusters that run the pools. Absent: the pools run in
    /// the hub cluster, exactly like flower-operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_ref: Option<PlacementRef>,
    /// TLS settings used when `insecure` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// Per-cluster changes to pools (needs `placementRef`): each entry whose `clusterSelector`
    /// matches a selected cluster's labels is merged over the pools it names (all pools when it
    /// names none), in order, for that cluster only. Unlike OCM's AddOnDeploymentConfig, it
    /// merges: `env` by name, `nodeConfig` by key, resources by resource name; `image` and
    /// `replicas` replace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 16))]
    pub cluster_overrides: Vec<ClusterOverride>,
    /// Where runs keep their files (a trained model, metrics): a volume mounted on the
    /// SuperLink (and its ServerApp) in Kubernetes, `<state>/federations/<ns>/<fed>/outputs`
    /// in standalone mode. Each `FlowerRun` gets the directory `<namespace>/<run name>/` in it,
    /// passed to the app as the run-config key `runConfigKey` when the app declares that key;
    /// the hub lists the files in the run's `status.outputs` after it finished and
    /// `flower-hub run fetch` copies them out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<OutputsSpec>,
}

/// A Federation's run outputs (`spec.outputs`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutputsSpec {
    /// An existing PersistentVolumeClaim in the Federation's namespace (Kubernetes mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: Option<String>,
    /// A claim the SuperLink's StatefulSet makes, named `outputs` (Kubernetes mode): kept when
    /// the pod is replaced and when the Federation is deleted, like any StatefulSet claim. Set
    /// it when creating the Federation: a StatefulSet's claims cannot change afterwards.
    /// Neither this nor `claimName`: an `emptyDir`, lost with the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_claim_template: Option<OutputsClaimTemplate>,
    /// The run-config key the run's directory is passed as (only to apps that declare it in
    /// `[tool.flwr.app.config]`). Default `output-dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    )]
    pub run_config_key: Option<String>,
    /// The most bytes one run's outputs may take, a Kubernetes quantity (default `1Gi`): the
    /// outputs `emptyDir`'s `sizeLimit` when no claim holds them; a run whose files add up to
    /// more is neither listed nor fetched (its status says so), so no file, however large or
    /// sparse, is read past it. Standalone hubs hold runs to it the same way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_limit: Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
}

/// `spec.outputs.sizeLimit` when unset.
pub const DEFAULT_OUTPUTS_SIZE_LIMIT: &str = "1Gi";

/// The claim of `spec.outputs.volumeClaimTemplate`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutputsClaimTemplate {
    /// The claim's spec (access modes, storage class, size).
    pub spec: PersistentVolumeClaimSpec,
}

/// `spec.outputs.runConfigKey` when unset.
pub const DEFAULT_OUTPUTS_RUN_CONFIG_KEY: &str = "output-dir";

impl OutputsSpec {
    /// `sizeLimit` in bytes ([`DEFAULT_OUTPUTS_SIZE_LIMIT`] when unset); `None` when it does
    /// not parse (validation refuses that).
    pub fn size_limit_bytes(&self) -> Option<u64> {
        let text = self
            .size_limit
            .as_ref()
            .map_or(DEFAULT_OUTPUTS_SIZE_LIMIT, |q| q.0.as_str());
        crate::parse_quantity(text)
            .filter(|b| b.is_finite() && *b >= 1.0)
            .map(|b| b as u64)
    }

    /// `runConfigKey`, [`DEFAULT_OUTPUTS_RUN_CONFIG_KEY`] when unset.
    pub fn run_config_key(&self) -> &str {
        self.run_config_key
            .as_deref()
            .unwrap_or(DEFAULT_OUTPUTS_RUN_CONFIG_KEY)
    }
}

/// A partial pool spec merged over pools on the clusters a selector matches.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterOverride {
    /// Selects clusters by their ManagedCluster labels.
    pub cluster_selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    /// Names of the pools it changes; empty: every pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 16))]
    pub pools: Vec<String>,
    /// SuperNode image (replaces the pool's `images.supernode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
    /// Replicas on these clusters (StatefulSet mode), 1 to 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_REPLICAS))]
    pub replicas: Option<i32>,
    /// Merged over the pool's `supernodeResources` (per resource name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supernode_resources: Option<ResourceRequirements>,
    /// Merged over the pool's `superexecResources` (per resource name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superexec_resources: Option<ResourceRequirements>,
    /// Merged over the pool's `env` (by name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Merged over the pool's `nodeConfig` (by key).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub node_config: BTreeMap<String, NodeConfigValue>,
}

fn default_true() -> bool {
    true
}

impl FederationSpec {
    /// Whether SuperNodes authenticate with hub-registered keys: TLS on and
    /// `supernodeAuthentication` not turned off. The one rule the SuperLink's arguments, the
    /// hub's key registration and the agents' key pairs all follow.
    pub fn supernode_auth(&self) -> bool {
        !self.insecure && self.supernode_authentication
    }
}

/// How SuperNode pools are deployed.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum DeploymentMode {
    /// One DaemonSet per pool; pools must not set `replicas`.
    DaemonSet,
    /// One StatefulSet per pool; every pool sets `replicas` ≥ 1.
    StatefulSet,
}

/// Flower isolation semantics.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum IsolationMode {
    /// SuperExec runs as a separate container (sidecar) next to SuperLink and each SuperNode.
    Process,
    /// SuperLink and SuperNode start SuperExec internally; no sidecars.
    Subprocess,
}

/// Reference to a `Placement` in the Federation's namespace: the addon's own (the default), or,
/// with `apiGroup: cluster.open-cluster-management.io`, an Open Cluster Management Placement
/// whose PlacementDecisions and `ManagedCluster`s (labels) the hub then reads instead.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlacementRef {
    /// Name of the Placement.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// API group of the Placement: `flower-addon.io` (the default) or
    /// `cluster.open-cluster-management.io` (OCM's, on a Kubernetes hub where OCM is installed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<PlacementApiGroup>,
    /// Kind of the referenced object: `Placement` (the only one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<PlacementKind>,
}

impl PlacementRef {
    /// A reference to the addon's own Placement `name`.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            api_group: None,
            kind: None,
        }
    }

    /// Whether it names an Open Cluster Management Placement.
    pub fn is_ocm(&self) -> bool {
        self.api_group == Some(PlacementApiGroup::Ocm)
    }
}

/// Which Placement API a `placementRef` names.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PlacementApiGroup {
    /// The addon's own `Placement` (`flower-addon.io/v1alpha1`).
    #[serde(rename = "flower-addon.io")]
    FlowerAddon,
    /// Open Cluster Management's `Placement` (`cluster.open-cluster-management.io/v1beta1`).
    #[serde(rename = "cluster.open-cluster-management.io")]
    Ocm,
}

/// The kind a `placementRef` names.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PlacementKind {
    /// A Placement.
    Placement,
}

/// SuperNode defaults and pools.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SuperNodesSpec {
    /// Default SuperNode image, used when a pool sets no `images.supernode`.
    #[schemars(length(min = 1))]
    pub image: String,
    /// Default environment of every pool (a pool's `env` overrides it by name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// The pools (1..16); each becomes one DaemonSet or StatefulSet per cluster.
    #[schemars(extend("minItems" = 1, "maxItems" = 16))]
    pub pools: Vec<SuperNodePoolSpec>,
}

/// One pool of SuperNodes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SuperNodePoolSpec {
    /// Pool name (a DNS label, unique in the Federation); used in `<fed>-supernode-<pool>`.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Replicas per cluster; required (1 to 1000) in StatefulSet mode, unset in DaemonSet mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_REPLICAS))]
    pub replicas: Option<i32>,
    /// Images of this pool; optional (flower-operator's README omits it): the SuperNode image
    /// falls back to `spec.supernodes.image`.
    #[serde(default, skip_serializing_if = "PoolImages::is_empty")]
    pub images: PoolImages,
    /// Narrows the pool to the selected clusters whose ManagedCluster labels match (flower-addon
    /// addition; absent: the pool runs on every cluster the Placement selects). Lets one
    /// Federation put different pools on different sites.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    /// GPU request of this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuConfig>,
    /// Resources of the `supernode` container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supernode_resources: Option<ResourceRequirements>,
    /// Resources of the `superexec-clientapp` sidecar (process mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superexec_resources: Option<ResourceRequirements>,
    /// Pod-level customisation of this pool (free-form object in the CRD, typed here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub pod_template: Option<PodTemplateSpec>,
    /// Extra arguments appended to the SuperNode arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Environment of this pool (overrides `spec.supernodes.env` by name; also on the sidecar).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Pod volumes of this pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "preserve_unknown_object_list")]
    pub volumes: Vec<Volume>,
    /// Volume mounts of the `supernode` container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Volume mounts of the ClientApp sidecar; when empty, `volumeMounts` is used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub superexec_volume_mounts: Vec<VolumeMount>,
    /// PersistentVolumeClaim templates (StatefulSet mode only; ignored for DaemonSets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 16))]
    pub volume_claim_templates: Vec<PersistentVolumeClaimTemplate>,
    /// `--node-config` entries (keys sorted when rendered). Values are strings, integers or
    /// booleans and may contain placeholders: `{index}` and `{replicas}` (StatefulSet only),
    /// `{pool}`, `{node}`, `{cluster}`, `{clusterIndex}`, `{clusters}`, `{partition}`,
    /// `{partitions}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub node_config: BTreeMap<String, NodeConfigValue>,
}

/// One `nodeConfig` value as written in YAML.
///
/// The CRD types a value as `x-kubernetes-int-or-string` (a structural schema cannot add
/// booleans, and a free-form value would be invisible to the CEL rules), so the apiserver accepts
/// strings and integers only; `validate_federation` rejects [`NodeConfigValue::Bool`] with the
/// hint to write `"true"`/`"false"`, which the renderer emits bare (a TOML boolean), exactly like
/// flower-operator, whose values are all strings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(untagged)]
pub enum NodeConfigValue {
    /// `true` / `false` written unquoted; parsed so the error can say what to write instead.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// Any other value, possibly with placeholders.
    String(String),
}

impl JsonSchema for NodeConfigValue {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "NodeConfigValue".into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        node_config_value_schema(generator)
    }
}

impl std::fmt::Display for NodeConfigValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bool(b) => write!(f, "{b}"),
            Self::Int(i) => write!(f, "{i}"),
            Self::String(s) => f.write_str(s),
        }
    }
}

/// Images of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolImages {
    /// SuperNode image; empty: `spec.supernodes.image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supernode: Option<String>,
    /// ClientApp SuperExec sidecar image; required in process mode, empty in subprocess mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superexec_client_app: Option<String>,
}

/// GPU request of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuConfig {
    /// Request `count` GPUs of `resourceName` per pod.
    #[serde(default)]
    pub enabled: bool,
    /// GPU vendor; selects the default resource name and what `mountAll` does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<GpuVendor>,
    /// Extended resource name (default by vendor: `nvidia.com/gpu`, `amd.com/gpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
    /// GPUs per pod; default 1.
    #[serde(default = "default_gpu_count")]
    #[schemars(range(min = 1))]
    pub count: i32,
    /// Expose every GPU of the node to the pod (needs `vendor`; `count`/`resourceName` ignored).
    #[serde(default)]
    pub mount_all: bool,
}

impl Default for GpuConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            vendor: None,
            resource_name: None,
            count: 1,
            mount_all: false,
        }
    }
}

impl PoolImages {
    /// True when neither image is set (`images: {}` or no `images` at all).
    pub fn is_empty(&self) -> bool {
        self.supernode.is_none() && self.superexec_client_app.is_none()
    }
}

fn default_gpu_count() -> i32 {
    1
}

/// GPU vendor.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum GpuVendor {
    /// NVIDIA (`nvidia.com/gpu`, runtime class `nvidia` for mountAll).
    Nvidia,
    /// AMD (`amd.com/gpu`, `/dev/kfd` and `/dev/dri` for mountAll).
    Amd,
}

// === Status ===

mod status;
pub use status::*;

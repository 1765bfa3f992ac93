//! The SuperLink's part of a Federation spec: TLS, image and resources, Service, ports and
//! database volume.
use super::*;

/// TLS settings for the SuperLink's Fleet API (used when `spec.insecure` is false).
///
/// By default the hub issues the SuperLink server certificate from its CA, with SANs for the
/// in-cluster Service names, the host of `superlink.externalAddress` and `extraSANs`; spokes get
/// the CA bundle with their work. `secretName` instead names a user-managed `kubernetes.io/tls`
/// Secret (keys `tls.crt`, `tls.key` and `ca.crt`) in the Federation's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsSpec {
    /// Secret holding `tls.crt`, `tls.key` and `ca.crt`; when absent the hub CA issues them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: Option<String>,
    /// Additional DNS names or IP addresses for the hub-issued SuperLink certificate.
    #[serde(rename = "extraSANs", default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 32))]
    pub extra_sans: Vec<String>,
}

// === SuperLink ===

/// Configuration of the SuperLink.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SuperLinkSpec {
    /// SuperLink image (in subprocess mode it must contain the ServerApp dependencies).
    #[schemars(length(min = 1))]
    pub image: String,
    /// ServerApp SuperExec sidecar image; required in process mode, must be empty in subprocess.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superexec_image: Option<String>,
    /// Resources of the `superlink` container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Resources of the `superexec-serverapp` sidecar (process mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superexec_resources: Option<ResourceRequirements>,
    /// Environment of the SuperLink container (and of the ServerApp sidecar in process mode).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Extra arguments appended to the SuperLink arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Pod-level customisation (scheduling, security context, …); containers are owned by us.
    ///
    /// The CRD keeps this as a free-form object (`x-kubernetes-preserve-unknown-fields`) so the
    /// CRD stays small; it is still typed here and checked when parsed offline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub pod_template: Option<PodTemplateSpec>,
    /// Service exposing the SuperLink.
    #[serde(default)]
    pub service: SuperLinkServiceSpec,
    /// Address (`host[:port]`) spokes dial to reach the Fleet API from outside the hub cluster.
    /// Its host is added to the SuperLink certificate. Without a port, the Fleet port
    /// (`service.ports.grpc`) is used. Optional: when unset, a Federation with `placementRef` gets
    /// it from its Service (`NodePort`: the hub's node address and the fleet node port;
    /// `LoadBalancer`: the ingress IP or hostname once assigned), shown in
    /// `status.endpoints.fleet`; a `ClusterIP` Service needs it (spokes cannot reach a cluster IP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 261))]
    pub external_address: Option<String>,
    /// Pod volumes of the SuperLink StatefulSet (merged with the podTemplate's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "preserve_unknown_object_list")]
    pub volumes: Vec<Volume>,
    /// Volume mounts of the `superlink` container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Volume mounts of the ServerApp sidecar; when empty, `volumeMounts` is used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub superexec_volume_mounts: Vec<VolumeMount>,
    /// PersistentVolumeClaim templates of the SuperLink StatefulSet. One named
    /// `superlink-state` holds the SuperLink database instead of an emptyDir, so registered
    /// SuperNodes and runs survive the pod's deletion; the pod then gets `fsGroup: 49999`
    /// (the user of Flower's images) unless `podTemplate` sets one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 16))]
    pub volume_claim_templates: Vec<PersistentVolumeClaimTemplate>,
}

/// Service exposing the SuperLink's APIs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[derive(Default)]
pub struct SuperLinkServiceSpec {
    /// Service type; default `ClusterIP`.
    #[serde(rename = "type", default)]
    pub type_: ServiceType,
    /// Service ports.
    #[serde(default)]
    pub ports: SuperLinkPorts,
    /// Node ports to pin, per port (`type: NodePort` or `LoadBalancer` only); unset ports get one
    /// allocated by Kubernetes. A placed Federation without `externalAddress` is reached by its
    /// spokes at `<hub node address>:<fleet node port>`, so pinning keeps that address stable
    /// when the Service is re-created.
    #[serde(default, skip_serializing_if = "SuperLinkNodePorts::is_empty")]
    pub node_ports: SuperLinkNodePorts,
    /// Labels merged under ours (ours win on conflicts).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the Service.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Put the Control API (`flwr run`, `flwr ls`, node registration) on the network: on the pod
    /// network (Service `<name>-superlink-control`, and the `control` port of this Service) and,
    /// when this Service is a `NodePort` or `LoadBalancer`, outside the cluster (in standalone
    /// mode, on the hub machine's addresses instead of loopback). Off by default: open-source
    /// Flower does not authenticate the Control API, so **anyone who reaches this port can run
    /// code on every SuperNode of the Federation** — another tenant's ServerApp in the same
    /// cluster included. When off, the SuperLink serves Control on its pod's loopback only, the
    /// port SuperNodes reach serves the Fleet API only (Flower >= 1.40: through the
    /// `fleet-front` sidecar, which refuses every other path), and `flwr` reaches the Control API
    /// through `flower-hub connect` or `kubectl port-forward pod/<name>-superlink-0` (through the
    /// Kubernetes API, so RBAC on `pods/portforward` decides who). Turn it on only behind
    /// `loadBalancerSourceRanges`, NetworkPolicies your network plugin enforces, or a firewall
    /// that admits the people allowed to run code.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expose_control: bool,
    /// Source ranges (CIDRs) a `LoadBalancer` Service admits, where the platform enforces them
    /// (`spec.loadBalancerSourceRanges` of the Service).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_balancer_source_ranges: Vec<String>,
}

/// Kubernetes Service type of the SuperLink Service.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
pub enum ServiceType {
    /// Cluster-internal virtual IP.
    #[default]
    ClusterIP,
    /// Exposed on every node's port.
    NodePort,
    /// Exposed through a cloud load balancer.
    LoadBalancer,
}

/// Ports of the SuperLink Service (flower-operator names and defaults).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SuperLinkPorts {
    /// Fleet API port SuperNodes dial (service port `fleet`); default 9092.
    #[serde(default = "default_fleet_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub grpc: i32,
    /// ServerAppIO API port (service port `serverappio`, process mode only); default 9091.
    #[serde(rename = "serverAppIO", default = "default_serverappio_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub server_app_io: i32,
    /// Control API port used by `flwr run` (service port `control`); default 9093.
    #[serde(default = "default_control_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub extra: i32,
}

/// Node ports of the SuperLink Service, named like [`SuperLinkPorts`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SuperLinkNodePorts {
    /// Node port of the Fleet API (service port `fleet`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub grpc: Option<i32>,
    /// Node port of the ServerAppIO API (service port `serverappio`, classic process mode).
    #[serde(
        rename = "serverAppIO",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 65535))]
    pub server_app_io: Option<i32>,
    /// Node port of the Control API (service port `control`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub extra: Option<i32>,
}

impl SuperLinkNodePorts {
    /// True when no node port is pinned.
    pub fn is_empty(&self) -> bool {
        self.grpc.is_none() && self.server_app_io.is_none() && self.extra.is_none()
    }
}

impl Default for SuperLinkPorts {
    fn default() -> Self {
        Self {
            grpc: DEFAULT_FLEET_PORT,
            server_app_io: DEFAULT_SERVERAPPIO_PORT,
            extra: DEFAULT_CONTROL_PORT,
        }
    }
}

pub(super) fn default_fleet_port() -> i32 {
    DEFAULT_FLEET_PORT
}
pub(super) fn default_serverappio_port() -> i32 {
    DEFAULT_SERVERAPPIO_PORT
}
pub(super) fn default_control_port() -> i32 {
    DEFAULT_CONTROL_PORT
}

/// A PersistentVolumeClaim template (flower-operator's reduced metadata plus a full claim spec).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PersistentVolumeClaimTemplate {
    /// Name, labels and annotations of the claim; the name is also the volume name to mount.
    pub metadata: PersistentVolumeClaimTemplateMeta,
    /// The claim's spec.
    ///
    /// Free-form in the CRD (`x-kubernetes-preserve-unknown-fields`) to keep it small; typed here.
    #[schemars(schema_with = "preserve_unknown_object")]
    pub spec: PersistentVolumeClaimSpec,
}

/// Metadata of a PersistentVolumeClaim template.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PersistentVolumeClaimTemplateMeta {
    /// Claim name, also the volume name used in volume mounts.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Labels of the claim.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the claim.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

// === SuperNodes ===

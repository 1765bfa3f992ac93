//! The Federation's status (what the hub observed), kept apart from the spec types.
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state of a Federation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationStatus {
    /// Generation last processed by the hub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Aggregate SuperNode readiness, `"<ready>/<desired>"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supernodes: Option<String>,
    /// Ready SuperNodes across every pool and cluster.
    #[serde(default)]
    pub ready_supernodes: i32,
    /// Desired SuperNodes across every pool and cluster.
    #[serde(default)]
    pub desired_supernodes: i32,
    /// Number of clusters running pools (selected by the Placement; 1 without `placementRef`).
    #[serde(default)]
    pub selected_clusters: i32,
    /// Where to reach the SuperLink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<FederationEndpoints>,
    /// Per-pool readiness summed over clusters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolStatus>,
    /// Per-cluster readiness (multi-cluster Federations): at most 100 clusters, those with
    /// something wrong first; `clusterTotals` counts them all, so that a Federation over
    /// thousands of clusters stays a small object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterStatus>,
    /// Totals over every selected cluster, of which `clusters` lists at most 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_totals: Option<ClusterTotals>,
    /// `Ready`, `Reconciling`, `PlacementSatisfied`, `Degraded`, `FlowerVersionVerified`, and
    /// `SuperLinkHealthy` (written by the hub's work source: whether the SuperLink fails calls,
    /// and why, from its log).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The Flower run after which the hub last restarted the Federation's SuperNodes (written by
    /// the hub's FlowerRun controller): Flower's SuperNodes that were working on a message of a
    /// run that ended without completing (stopped, or failed) wait for ever for its reply to be
    /// taken and take no other message, so the hub restarts them, keys and identities kept, once
    /// no run of the SuperLink is pending, starting or running. A new value restarts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supernode_restart_after_run: Option<String>,
}

/// Addresses of the SuperLink.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FederationEndpoints {
    /// In-cluster Control API address, `<fed>-superlink-control.<ns>.svc:<control port>`
    /// (flower-operator's field): only with `spec.superlink.service.exposeControl`; otherwise the
    /// Control API listens on the SuperLink pod's loopback, reached by port-forward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superlink_service: Option<String>,
    /// External Fleet API address spokes dial (`host:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<String>,
    /// External Control API address for `flwr run` (`host:port`): only with
    /// `spec.superlink.service.exposeControl`; otherwise `flower-hub connect` port-forwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<String>,
}

/// Readiness of one pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    /// Pool name.
    pub name: String,
    /// Workload kind: `DaemonSet` or `StatefulSet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Desired replicas (StatefulSet) or desired scheduled pods (DaemonSet).
    #[serde(default)]
    pub desired: i32,
    /// Ready replicas or pods.
    #[serde(default)]
    pub ready: i32,
    /// Pool conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Totals over every cluster a Federation runs in.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterTotals {
    /// Clusters selected.
    #[serde(default)]
    pub selected: i32,
    /// Clusters whose agent is connected to the hub.
    #[serde(default)]
    pub connected: i32,
    /// Clusters with something wrong (an entry of `clusters` with a `message`).
    #[serde(default)]
    pub with_problems: i32,
    /// Entries in `clusters`.
    #[serde(default)]
    pub listed: i32,
    /// SuperNodes the SuperLink lists online, over the clusters where that is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub online: Option<i32>,
    /// Each pool of the spec summed over the clusters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolTotal>,
}

/// One pool summed over clusters.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolTotal {
    /// Pool name.
    pub name: String,
    /// SuperNodes wanted.
    #[serde(default)]
    pub desired: i32,
    /// SuperNodes ready (in each cluster at most as many as it wants).
    #[serde(default)]
    pub ready: i32,
}

/// Readiness of the pools in one cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// ManagedCluster name.
    pub name: String,
    /// SuperNode readiness in this cluster, `"<ready>/<desired>"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supernodes: Option<String>,
    /// Per-pool readiness in this cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolStatus>,
    /// Whether the cluster's agent is connected to the hub.
    #[serde(default)]
    pub connected: bool,
    /// SuperNodes of this cluster that the SuperLink lists online (its own node list, read
    /// through the Control API), when SuperNode authentication maps nodes to clusters. Pools
    /// count as ready only for those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub online: Option<i32>,
    /// Time the cluster's status report last changed (a report that repeats it does not move
    /// it, so an idle Federation's status is not rewritten).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_report: Option<Time>,
    /// What is wrong, when something is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The SuperNode restart mark the cluster's agent last reported its pools applied from
    /// (see the `flower-addon.io/supernode-restart` annotations); a restart is done when every
    /// cluster reports the Federation's mark with its pools ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supernode_restart: Option<String>,
}

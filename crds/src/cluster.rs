//! `ManagedCluster`: a spoke cluster (or edge device) registered with the hub.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::placement::TaintEffect;

/// Default lease duration of a ManagedCluster, in seconds.
pub const DEFAULT_LEASE_DURATION_SECONDS: i32 = 60;
/// Condition type: the hub admin accepted the cluster (`hubAcceptsClient`).
pub const CONDITION_HUB_ACCEPTED: &str = "HubAcceptedManagedCluster";
/// Condition type: the agent joined (has a client certificate).
pub const CONDITION_JOINED: &str = "Joined";
/// Condition type: the agent renews its lease.
pub const CONDITION_AVAILABLE: &str = "Available";
/// Taint key the hub puts on a cluster that reports itself unavailable (OCM's
/// `cluster.open-cluster-management.io/unavailable`, in this API's domain).
pub const TAINT_UNAVAILABLE: &str = "cluster.flower-addon.io/unavailable";
/// Taint key the hub puts on a cluster whose lease expired (OCM's
/// `cluster.open-cluster-management.io/unreachable`, in this API's domain). Placements tolerate
/// this key to keep a cluster through short outages.
pub const TAINT_UNREACHABLE: &str = "cluster.flower-addon.io/unreachable";

/// A registered cluster; the agent authenticates as this name.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "flower-addon.io",
    version = "v1alpha1",
    derive = "PartialEq",
    kind = "ManagedCluster",
    plural = "managedclusters",
    status = "ManagedClusterStatus",
    shortname = "fmc",
    printcolumn = r#"{"name":"Hub Accepted","type":"boolean","jsonPath":".spec.hubAcceptsClient"}"#,
    printcolumn = r#"{"name":"Joined","type":"string","jsonPath":".status.conditions[?(@.type==\"Joined\")].status"}"#,
    printcolumn = r#"{"name":"Available","type":"string","jsonPath":".status.conditions[?(@.type==\"Available\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManagedClusterSpec {
    /// Whether the hub accepts this cluster's agent; false refuses and revokes it.
    #[serde(default)]
    pub hub_accepts_client: bool,
    /// Taints that keep placements from selecting the cluster unless tolerated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 32))]
    pub taints: Vec<Taint>,
    /// Seconds between lease renewals by the agent; missed for 5 × this → unreachable.
    #[serde(default = "default_lease_duration_seconds")]
    #[schemars(range(min = 1))]
    pub lease_duration_seconds: i32,
}

impl Default for ManagedClusterSpec {
    fn default() -> Self {
        Self {
            hub_accepts_client: false,
            taints: Vec::new(),
            lease_duration_seconds: DEFAULT_LEASE_DURATION_SECONDS,
        }
    }
}

fn default_lease_duration_seconds() -> i32 {
    DEFAULT_LEASE_DURATION_SECONDS
}

/// A taint on a ManagedCluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Taint {
    /// Taint key.
    #[schemars(length(min = 1, max = 316))]
    pub key: String,
    /// Taint value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Effect on placements.
    pub effect: TaintEffect,
    /// When the taint was added; `tolerationSeconds` counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_added: Option<Time>,
}

/// Observed state of a ManagedCluster, mostly reported by its agent.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedClusterStatus {
    /// `HubAcceptedManagedCluster`, `Joined`, `Available`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Labels the agent reported at join (copied to the object's labels by the hub).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Cluster claims the agent reports, sorted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_claims: Vec<ClusterClaim>,
    /// Total resources of the cluster.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, Quantity>,
    /// Allocatable resources of the cluster.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: BTreeMap<String, Quantity>,
    /// Versions of the cluster and its agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<ManagedClusterVersion>,
    /// When the hub last heard from the cluster, coarsely: written when the cluster becomes
    /// available and then every 15 minutes while it stays connected (availability itself is
    /// the hub's lease, kept in memory; see the `Available` condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<Time>,
}

/// A claim (name/value fact) about a cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterClaim {
    /// Claim name, e.g. `platform.open-cluster-management.io`.
    pub name: String,
    /// Claim value.
    pub value: String,
}

/// Versions reported by the agent.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedClusterVersion {
    /// Kubernetes version (empty for the process runtime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<String>,
    /// flower-agent version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

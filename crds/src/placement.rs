//! `Placement` and `PlacementDecision`: which ManagedClusters run a Federation's pools, with
//! OCM's field names and semantics.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelector, LabelSelectorRequirement,
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Label on a PlacementDecision naming its Placement (OCM's label key).
pub const PLACEMENT_LABEL: &str = "cluster.open-cluster-management.io/placement";
/// Maximum number of decisions in one PlacementDecision (OCM's page size).
pub const MAX_DECISIONS_PER_OBJECT: usize = 100;

/// Selects ManagedClusters: predicates are ORed, selectors inside one predicate are ANDed.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "flower-addon.io",
    version = "v1alpha1",
    derive = "PartialEq",
    kind = "Placement",
    plural = "placements",
    namespaced,
    status = "PlacementStatus",
    shortname = "fplc",
    printcolumn = r#"{"name":"Succeeded","type":"string","jsonPath":".status.conditions[?(@.type==\"PlacementSatisfied\")].status"}"#,
    printcolumn = r#"{"name":"Selected","type":"integer","jsonPath":".status.numberOfSelectedClusters"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlacementSpec {
    /// ManagedClusterSets to select from, among those bound to the Placement's namespace by a
    /// `ManagedClusterSetBinding`; empty: every bound set. No bound set → nothing is selected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 32))]
    pub cluster_sets: Vec<String>,
    /// Cluster predicates, ORed; empty selects every cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 32))]
    pub predicates: Vec<ClusterPredicate>,
    /// Maximum number of clusters selected; absent: all that match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub number_of_clusters: Option<i32>,
    /// Taints this placement tolerates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 32))]
    pub tolerations: Vec<Toleration>,
    /// How clusters are ranked when `numberOfClusters` caps the selection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prioritizer_policy: Option<PrioritizerPolicy>,
}

/// One predicate.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterPredicate {
    /// Cluster must match this selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_cluster_selector: Option<ClusterSelector>,
}

/// Label and claim selectors, ANDed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSelector {
    /// Selector over ManagedCluster labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    /// Selector over the cluster claims the agent reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_selector: Option<ClusterClaimSelector>,
}

/// Selector over cluster claims.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterClaimSelector {
    /// Requirements, ANDed (`key` is the claim name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// Tolerates a ManagedCluster taint.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Toleration {
    /// Taint key; empty with `Exists` matches every taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `Equal` (default) or `Exists`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<TolerationOperator>,
    /// Taint value for `Equal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Effect matched; empty matches every effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<TaintEffect>,
    /// How long the taint is tolerated, counted from the taint's `timeAdded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub toleration_seconds: Option<i64>,
}

/// Toleration operator.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum TolerationOperator {
    /// Key and value equal.
    Equal,
    /// Key exists.
    Exists,
}

/// Effect of a ManagedCluster taint (OCM).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum TaintEffect {
    /// Not selected by placements that do not tolerate it; already-selected clusters are dropped.
    NoSelect,
    /// Selected only when no other cluster fits.
    PreferNoSelect,
    /// Not newly selected, but kept when already selected.
    NoSelectIfNew,
}

/// The built-in prioritizers (OCM's names) a `BuiltIn` score coordinate may name.
pub const BUILT_IN_PRIORITIZERS: [&str; 4] = [
    "Balance",
    "Steady",
    "ResourceAllocatableCPU",
    "ResourceAllocatableMemory",
];

/// Ranking of clusters when `numberOfClusters` leaves some out (OCM semantics): each
/// prioritizer scores a cluster from -100 to 100, scores are summed by weight, and the highest
/// totals are selected (ties by name).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrioritizerPolicy {
    /// `Additive` (default prioritizers plus configurations) or `Exact` (only configurations).
    #[serde(default)]
    pub mode: PrioritizerPolicyMode,
    /// Prioritizers and their weights.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 16))]
    pub configurations: Vec<PrioritizerConfig>,
}

/// Prioritizer policy mode.
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
pub enum PrioritizerPolicyMode {
    /// Configured prioritizers are added to the defaults (`Balance`, `Steady`).
    #[default]
    Additive,
    /// Only the configured prioritizers are used.
    Exact,
}

/// One prioritizer with its weight.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrioritizerConfig {
    /// Which score to use.
    pub score_coordinate: ScoreCoordinate,
    /// Weight of the score (-10..10); default 1.
    #[serde(default = "default_weight")]
    #[schemars(range(min = -10, max = 10))]
    pub weight: i32,
}

fn default_weight() -> i32 {
    1
}

/// A built-in prioritizer or an add-on score.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScoreCoordinate {
    /// `BuiltIn` or `AddOn`.
    #[serde(rename = "type", default)]
    pub type_: ScoreCoordinateType,
    /// Built-in prioritizer name: `Balance`, `Steady`, `ResourceAllocatableCPU`,
    /// `ResourceAllocatableMemory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub built_in: Option<String>,
    /// Add-on score reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_on: Option<AddOnScore>,
}

/// Kind of score coordinate.
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
pub enum ScoreCoordinateType {
    /// A built-in prioritizer.
    #[default]
    BuiltIn,
    /// A score published by an add-on.
    AddOn,
}

/// A score published by an add-on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddOnScore {
    /// Resource name of the add-on placement score.
    pub resource_name: String,
    /// Score name inside it.
    pub score_name: String,
}

/// Observed state of a Placement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementStatus {
    /// Number of clusters selected.
    #[serde(default)]
    pub number_of_selected_clusters: i32,
    /// `PlacementSatisfied` and `PlacementMisconfigured`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Clusters not selected and why, sorted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unselected_clusters: Vec<UnselectedCluster>,
}

/// A cluster the placement did not select.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnselectedCluster {
    /// ManagedCluster name.
    pub cluster_name: String,
    /// Why it was not selected (e.g. a predicate did not match, an untolerated taint).
    pub reason: String,
}

/// One page (≤ 100 decisions) of a Placement's selection, named `<placement>-decision-<n>` and
/// labelled with the placement name. It carries no spec; `spec` is an empty object.
#[derive(
    CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema,
)]
#[kube(
    group = "flower-addon.io",
    version = "v1alpha1",
    derive = "PartialEq",
    kind = "PlacementDecision",
    plural = "placementdecisions",
    namespaced,
    status = "PlacementDecisionStatus",
    shortname = "fpd"
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlacementDecisionSpec {}

/// The decisions of one page.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementDecisionStatus {
    /// Selected clusters, sorted by name.
    #[serde(default)]
    #[schemars(extend("maxItems" = 100))]
    pub decisions: Vec<ClusterDecision>,
}

/// One selected cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterDecision {
    /// ManagedCluster name.
    pub cluster_name: String,
    /// Why it was selected (may be empty).
    #[serde(default)]
    pub reason: String,
}

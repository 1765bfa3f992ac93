//! `ManagedClusterSet` and `ManagedClusterSetBinding`: which clusters the Placements of a
//! namespace may select, with OCM's names and semantics.
//!
//! - A `ManagedClusterSet` (cluster-scoped, the platform admin's) groups ManagedClusters: by the
//!   label [`CLUSTERSET_LABEL`]`=<set name>` (`selectorType: ExclusiveClusterSetLabel`, the
//!   default; a cluster is in at most one such set) or by a label selector
//!   (`selectorType: LabelSelector`; `labelSelector: {}` selects every cluster, like OCM's
//!   `global` set).
//! - A `ManagedClusterSetBinding` named like its set, in a namespace, lets that namespace's
//!   Placements select the set's clusters. Without a binding a Placement selects nothing. In
//!   Kubernetes, creating a binding needs `create` on `managedclustersets/bind` for that set (the
//!   ValidatingAdmissionPolicy in `manifests/hub/clusterset-binding-policy.yaml`, as OCM's webhook).
//! - `Placement.spec.clusterSets` narrows the bound sets further; empty means all bound ones.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The label that puts a ManagedCluster in the `ExclusiveClusterSetLabel` set of that name (OCM's
/// key).
pub const CLUSTERSET_LABEL: &str = "cluster.open-cluster-management.io/clusterset";

/// A set of ManagedClusters that namespaces can be bound to.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "flower-addon.io",
    version = "v1alpha1",
    derive = "PartialEq",
    derive = "Default",
    kind = "ManagedClusterSet",
    plural = "managedclustersets",
    shortname = "fmcs",
    printcolumn = r#"{"name":"Selector","type":"string","jsonPath":".spec.clusterSelector.selectorType"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManagedClusterSetSpec {
    /// Which ManagedClusters belong to the set.
    #[serde(default)]
    pub cluster_selector: ManagedClusterSelector,
}

/// How a ManagedClusterSet selects its clusters.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!(has(self.selectorType) && self.selectorType == 'LabelSelector') || has(self.labelSelector)",
     "message": "labelSelector is required with selectorType LabelSelector (use {} to select every cluster)"},
    {"rule": "(has(self.selectorType) && self.selectorType == 'LabelSelector') || !has(self.labelSelector)",
     "message": "labelSelector is not allowed with selectorType ExclusiveClusterSetLabel (members carry the label cluster.open-cluster-management.io/clusterset=<set name>); set selectorType: LabelSelector to select by labels"}
]))]
pub struct ManagedClusterSelector {
    /// `ExclusiveClusterSetLabel` (default): clusters labelled
    /// `cluster.open-cluster-management.io/clusterset=<set name>`; `LabelSelector`: clusters
    /// matching `labelSelector`.
    #[serde(default)]
    pub selector_type: ClusterSetSelectorType,
    /// Selector over ManagedCluster labels (only with `selectorType: LabelSelector`; `{}`
    /// selects every cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
}

/// Selector type of a ManagedClusterSet.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, PartialOrd, Ord, JsonSchema,
)]
pub enum ClusterSetSelectorType {
    /// Clusters labelled with the set's name.
    #[default]
    ExclusiveClusterSetLabel,
    /// Clusters matching a label selector.
    LabelSelector,
}

/// Lets the Placements of its namespace select the clusters of one ManagedClusterSet; its name
/// must be the set's name.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "flower-addon.io",
    version = "v1alpha1",
    derive = "PartialEq",
    derive = "Default",
    kind = "ManagedClusterSetBinding",
    plural = "managedclustersetbindings",
    namespaced,
    shortname = "fmcsb",
    printcolumn = r#"{"name":"ClusterSet","type":"string","jsonPath":".spec.clusterSet"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManagedClusterSetBindingSpec {
    /// The bound ManagedClusterSet (the binding's own name).
    #[schemars(length(min = 1, max = 63))]
    pub cluster_set: String,
}

//! Open Cluster Management as a source of placement: a Federation whose `placementRef` says
//! `apiGroup: cluster.open-cluster-management.io` is placed by OCM's Placement of that name in
//! its namespace. The hub then reads OCM's `PlacementDecision`s (every page and decision group,
//! by OCM's label `cluster.open-cluster-management.io/placement`) and OCM's `ManagedCluster`s
//! (their labels, for pool `clusterSelector`s and `clusterOverrides`) instead of the addon's,
//! and builds the same work from them: one core, two sources. A cluster OCM decides runs pools
//! once an agent of the addon is connected under the same name.
//!
//! OCM is optional: the hub looks for its API at start ([`installed`]); without it the addon's
//! own Placements work as before and a Federation naming an OCM Placement says that OCM is not
//! installed.
use std::collections::BTreeMap;

use flower_addon_crds::{ClusterDecision, PLACEMENT_LABEL, PlacementDecision};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Client, ResourceExt};

/// OCM's cluster API group.
pub const GROUP: &str = "cluster.open-cluster-management.io";

/// OCM's `PlacementDecision` (`v1beta1`).
pub fn decision_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        GROUP,
        "v1beta1",
        "PlacementDecision",
    ))
}

/// OCM's `Placement` (`v1beta1`).
pub fn placement_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, "v1beta1", "Placement"))
}

/// OCM's `ManagedCluster` (`v1`).
pub fn cluster_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, "v1", "ManagedCluster"))
}

/// Whether the apiserver serves OCM's Placements, PlacementDecisions and ManagedClusters.
pub async fn installed(client: &Client) -> bool {
    let serves =
        |list: Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList, _>,
         names: &[&str]| {
            list.is_ok_and(|l| {
                names
                    .iter()
                    .all(|n| l.resources.iter().any(|r| r.name == *n))
            })
        };
    serves(
        client
            .list_api_group_resources(&format!("{GROUP}/v1beta1"))
            .await,
        &["placements", "placementdecisions"],
    ) && serves(
        client
            .list_api_group_resources(&format!("{GROUP}/v1"))
            .await,
        &["managedclusters"],
    )
}

/// What the placement core reads of an OCM PlacementDecision, as the addon's own type: its
/// namespace, the Placement label and the decided clusters (OCM's decision reasons and groups
/// are not needed: every page of every group counts).
pub fn decision_of(obj: &DynamicObject) -> PlacementDecision {
    let mut decision = PlacementDecision::new(&obj.name_any(), Default::default());
    decision.metadata.namespace = obj.metadata.namespace.clone();
    decision.metadata.labels = obj
        .labels()
        .get(PLACEMENT_LABEL)
        .map(|p| BTreeMap::from([(PLACEMENT_LABEL.to_owned(), p.clone())]));
    let clusters: Vec<ClusterDecision> = obj.data["status"]["decisions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["clusterName"].as_str())
        .filter(|c| !c.is_empty())
        .map(|c| ClusterDecision {
            cluster_name: c.to_owned(),
            reason: String::new(),
        })
        .collect();
    decision.status = Some(flower_addon_crds::PlacementDecisionStatus {
        decisions: clusters,
    });
    decision
}

/// The labels of each OCM ManagedCluster, by name.
pub fn cluster_labels<'a>(
    clusters: impl IntoIterator<Item = &'a DynamicObject>,
) -> BTreeMap<String, BTreeMap<String, String>> {
    clusters
        .into_iter()
        .map(|c| (c.name_any(), c.labels().clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ocm_decision_reads_as_ours_with_its_placement_and_clusters() {
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta1",
            "kind": "PlacementDecision",
            "metadata": {"name": "flower-decision-2", "namespace": "fl",
                         "labels": {PLACEMENT_LABEL: "flower",
                                    "cluster.open-cluster-management.io/decision-group-index": "1"}},
            "status": {"decisions": [
                {"clusterName": "edge-2", "reason": ""},
                {"clusterName": "edge-1", "reason": "picked"},
                {"clusterName": ""},
            ]},
        }))
        .unwrap();
        let d = decision_of(&obj);
        assert_eq!(d.metadata.namespace.as_deref(), Some("fl"));
        assert_eq!(
            d.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(PLACEMENT_LABEL)),
            Some(&"flower".to_owned())
        );
        let clusters = crate::core::work::decided([&d], "fl", "flower", |_| true);
        assert_eq!(clusters, ["edge-1", "edge-2"]);
        // Another Placement's name or namespace does not match.
        assert!(crate::core::work::decided([&d], "fl", "other", |_| true).is_empty());
        assert!(crate::core::work::decided([&d], "team", "flower", |_| true).is_empty());
    }
}

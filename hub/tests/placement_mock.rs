//! The Placement reconciler against a mocked API server: the exact requests for a Placement
//! over known clusters (no LIST: decisions come from the cache; the decision page applied and
//! its status, the Placement status, an event), and for a misconfigured one (nothing but status
//! and an event).
mod mock_api;

use std::sync::Arc;

use flower_addon_crds::{
    ManagedCluster, ManagedClusterSet, ManagedClusterSetBinding, ManagedClusterSetBindingSpec,
    ManagedClusterSpec, Placement, PlacementDecision,
};
use flower_addon_hub::kube::controller::HUB_FIELD_MANAGER;
use flower_addon_hub::kube::controller::placement::{PlacementContext, PlacementStores, reconcile};
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use mock_api::{Call, mock_client};

fn cluster(name: &str, accepted: bool, labels: &[(&str, &str)]) -> ManagedCluster {
    let mut mc = ManagedCluster::new(
        name,
        ManagedClusterSpec {
            hub_accepts_client: accepted,
            ..Default::default()
        },
    );
    mc.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    mc
}

fn placement(yaml: &str) -> Arc<Placement> {
    let mut p: Placement = serde_saphyr::from_str(yaml).expect("placement");
    p.metadata.uid = Some("placement-uid".into());
    Arc::new(p)
}

/// A set of every cluster (`labelSelector: {}`), bound to namespace `team` when `bound`.
fn every_cluster_set(bound: bool) -> (ManagedClusterSet, Vec<ManagedClusterSetBinding>) {
    let set: ManagedClusterSet = serde_saphyr::from_str(
        "apiVersion: flower-addon.io/v1alpha1\nkind: ManagedClusterSet\nmetadata: {name: global}\nspec: {clusterSelector: {selectorType: LabelSelector, labelSelector: {}}}\n",
    )
    .expect("set");
    let mut binding = ManagedClusterSetBinding::new(
        "global",
        ManagedClusterSetBindingSpec {
            cluster_set: "global".into(),
        },
    );
    binding.metadata.namespace = Some("team".into());
    (set, if bound { vec![binding] } else { Vec::new() })
}

async fn run(p: Arc<Placement>, clusters: Vec<ManagedCluster>) -> Vec<Call> {
    run_bound(p, clusters, true).await
}

async fn run_bound(p: Arc<Placement>, clusters: Vec<ManagedCluster>, bound: bool) -> Vec<Call> {
    let (client, calls) = mock_client(vec![serde_json::to_value(p.as_ref()).expect("json")]);
    let (store, mut writer) = reflector::store::<ManagedCluster>();
    writer.apply_watcher_event(&Event::Init);
    for mc in clusters {
        writer.apply_watcher_event(&Event::InitApply(mc));
    }
    writer.apply_watcher_event(&Event::InitDone);
    let (decisions, mut decision_writer) = reflector::store::<PlacementDecision>();
    decision_writer.apply_watcher_event(&Event::Init);
    decision_writer.apply_watcher_event(&Event::InitDone);
    let (set, bindings) = every_cluster_set(bound);
    let (sets, mut set_writer) = reflector::store::<ManagedClusterSet>();
    set_writer.apply_watcher_event(&Event::Init);
    set_writer.apply_watcher_event(&Event::InitApply(set));
    set_writer.apply_watcher_event(&Event::InitDone);
    let (binding_store, mut binding_writer) = reflector::store::<ManagedClusterSetBinding>();
    binding_writer.apply_watcher_event(&Event::Init);
    for b in bindings {
        binding_writer.apply_watcher_event(&Event::InitApply(b));
    }
    binding_writer.apply_watcher_event(&Event::InitDone);
    let stores = PlacementStores {
        clusters: store,
        decisions,
        sets,
        bindings: binding_store,
    };
    let ctx = Arc::new(PlacementContext::new(client, stores));
    reconcile(p, ctx).await.expect("reconcile");
    calls.lock().expect("log").clone()
}

const GPU: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: Placement
metadata: {name: gpu, namespace: team}
spec:
  predicates:
    - requiredClusterSelector:
        labelSelector: {matchLabels: {gpu: "yes"}}
"#;

#[tokio::test]
async fn a_placement_writes_one_decision_page_with_the_matching_accepted_clusters() {
    // s1 matches, s2 lacks the label, s3 matches but is not accepted: the decision lists s1 only.
    let calls = run(
        placement(GPU),
        vec![
            cluster("s1", true, &[("gpu", "yes")]),
            cluster("s2", true, &[]),
            cluster("s3", false, &[("gpu", "yes")]),
        ],
    )
    .await;
    let lines: Vec<String> = calls.iter().map(Call::line).collect();
    assert_eq!(
        lines,
        [
            "PATCH /apis/flower-addon.io/v1alpha1/namespaces/team/placementdecisions/gpu-decision-1",
            "PATCH /apis/flower-addon.io/v1alpha1/namespaces/team/placementdecisions/gpu-decision-1/status",
            "PATCH /apis/flower-addon.io/v1alpha1/namespaces/team/placements/gpu/status",
            "POST /apis/events.k8s.io/v1/namespaces/team/events",
        ],
        "{calls:#?}"
    );
    for call in calls.iter().filter(|c| c.method == http::Method::PATCH) {
        assert!(
            call.query
                .contains(&format!("fieldManager={HUB_FIELD_MANAGER}")),
            "{call:?}"
        );
    }
    assert_eq!(
        calls[0].body["metadata"]["ownerReferences"][0]["uid"],
        "placement-uid"
    );
    assert_eq!(
        calls[1].body["status"]["decisions"],
        serde_json::json!([{"clusterName": "s1", "reason": ""}])
    );
    assert_eq!(calls[2].body["status"]["numberOfSelectedClusters"], 1);
    assert_eq!(calls[3].body["reason"], "DecisionUpdate");
}

#[tokio::test]
async fn a_misconfigured_placement_keeps_its_decisions_and_says_why() {
    // OCM's taint key in a toleration is refused naming ours: no decision is written or deleted.
    let bad = format!(
        "{GPU}  tolerations:\n    - key: cluster.open-cluster-management.io/unreachable\n      operator: Exists\n"
    );
    let calls = run(
        placement(&bad),
        vec![cluster("s1", true, &[("gpu", "yes")])],
    )
    .await;
    let lines: Vec<String> = calls.iter().map(Call::line).collect();
    assert_eq!(
        lines,
        [
            "POST /apis/events.k8s.io/v1/namespaces/team/events",
            "PATCH /apis/flower-addon.io/v1alpha1/namespaces/team/placements/gpu/status",
        ],
        "{calls:#?}"
    );
    let condition = &calls[1].body["status"]["conditions"][0];
    assert_eq!(condition["type"], "PlacementMisconfigured");
    assert!(
        condition["message"]
            .as_str()
            .is_some_and(|m| m.contains("cluster.flower-addon.io/unreachable")),
        "{condition}"
    );
}

#[tokio::test]
async fn without_a_binding_in_its_namespace_a_placement_selects_nothing_and_names_no_cluster() {
    // The set exists but is not bound to namespace `team`: an empty decision page, no cluster
    // named in the status, and the reason with the fix.
    let calls = run_bound(
        placement(GPU),
        vec![cluster("s1", true, &[("gpu", "yes")])],
        false,
    )
    .await;
    let lines: Vec<String> = calls.iter().map(Call::line).collect();
    assert_eq!(
        lines,
        [
            "PATCH /apis/flower-addon.io/v1alpha1/namespaces/team/placementdecisions/gpu-decision-1",
            "PATCH /apis/flower-addon.io/v1alpha1/namespaces/team/placementdecisions/gpu-decision-1/status",
            "PATCH /apis/flower-addon.io/v1alpha1/namespaces/team/placements/gpu/status",
        ],
        "{calls:#?}"
    );
    assert_eq!(calls[1].body["status"]["decisions"], serde_json::json!([]));
    let status = &calls[2].body["status"];
    assert_eq!(status["numberOfSelectedClusters"], 0);
    assert!(status.get("unselectedClusters").is_none(), "{status}");
    let satisfied = status["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "PlacementSatisfied")
        .expect("PlacementSatisfied");
    assert_eq!(satisfied["status"], "False");
    assert_eq!(satisfied["reason"], "NoManagedClusterSetBindings");
    let message = satisfied["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("namespace team") && message.contains("ManagedClusterSetBinding"),
        "{message}"
    );
}

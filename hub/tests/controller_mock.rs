//! The Federation reconciler against a mocked API server (in the style of kube-rs's
//! controller-rs): every request it makes is recorded and the test asserts the exact sequence —
//! what is applied, in which order, with which field manager, and that an invalid spec applies
//! nothing. Fast (no cluster), beside the real-apiserver e2e tests.
mod mock_api;

use std::sync::Arc;

use flower_addon_crds::Federation;
use flower_addon_hub::kube::controller::{Context, HUB_FIELD_MANAGER, reconcile};
use flower_addon_hub::registration::ca::HubCa;
use http::Method;
use mock_api::{Call, mock_client};

fn federation(yaml: &str) -> Arc<Federation> {
    let mut fed: Federation = serde_saphyr::from_str(yaml).expect("federation");
    fed.metadata.uid = Some("fed-uid".into());
    Arc::new(fed)
}

const VALID: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {name: fed, namespace: team}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  insecure: true
  superlink: {image: "flwr/superlink:1.42.0"}
  supernodes:
    image: "flwr/supernode:1.42.0"
    pools: [{name: a, replicas: 2}]
"#;

async fn run(fed: Arc<Federation>) -> Vec<Call> {
    let (client, calls) = mock_client(vec![serde_json::to_value(fed.as_ref()).expect("json")]);
    let ca = Arc::new(HubCa::generate().expect("ca"));
    let ctx = Arc::new(Context::new(client, ca));
    reconcile(fed, ctx).await.expect("reconcile");
    calls.lock().expect("log").clone()
}

#[tokio::test]
async fn a_valid_federation_is_applied_in_order_then_pruned_then_its_status_written() {
    // Service first (its node ports feed the certificate and status), then the SuperLink; every
    // write a server-side apply by the hub's manager; then the prune LISTs (label-selected),
    // then one status patch. The pools are not the controller's: they are the hub cluster's
    // work, applied by the embedded runtime (kube::local, its own manager).
    let calls = run(federation(VALID)).await;
    let lines: Vec<String> = calls.iter().map(Call::line).collect();
    assert_eq!(
        lines,
        [
            "PATCH /api/v1/namespaces/team/services/fed-superlink",
            "PATCH /api/v1/namespaces/team/services/fed-superlink-control",
            "PATCH /apis/apps/v1/namespaces/team/statefulsets/fed-superlink",
            "GET /apis/apps/v1/namespaces/team/statefulsets",
            "GET /api/v1/namespaces/team/services",
            "GET /api/v1/namespaces/team/secrets",
            "PATCH /apis/flower-addon.io/v1alpha1/namespaces/team/federations/fed/status",
        ],
        "{calls:#?}"
    );
    for call in calls.iter().filter(|c| c.method == Method::PATCH) {
        assert!(
            call.query
                .contains(&format!("fieldManager={HUB_FIELD_MANAGER}"))
                && call.query.contains("force=true"),
            "{} is not a forced server-side apply by the hub: {}",
            call.path,
            call.query
        );
    }
    for call in calls.iter().filter(|c| c.method == Method::GET) {
        assert!(
            call.query.contains("labelSelector="),
            "prune LIST without a label selector: {call:?}"
        );
    }
    // Every applied object is owned by the Federation (garbage collection on delete).
    for call in &calls[..2] {
        let owner = &call.body["metadata"]["ownerReferences"][0];
        assert_eq!(owner["uid"], "fed-uid", "{}", call.path);
        assert_eq!(owner["blockOwnerDeletion"], true, "{}", call.path);
    }
    let status = &calls.last().expect("status").body["status"];
    assert!(
        status["conditions"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
    );
}

#[tokio::test]
async fn an_invalid_federation_applies_nothing_and_says_why() {
    // Process isolation without a ServerApp SuperExec image: no object is written or deleted;
    // a Warning event and a Degraded condition name the field.
    let invalid = VALID.replace("isolationMode: subprocess", "isolationMode: process");
    let calls = run(federation(&invalid)).await;
    let lines: Vec<String> = calls.iter().map(Call::line).collect();
    assert_eq!(
        lines,
        [
            "POST /apis/events.k8s.io/v1/namespaces/team/events",
            "PATCH /apis/flower-addon.io/v1alpha1/namespaces/team/federations/fed/status",
        ],
        "{calls:#?}"
    );
    let event = &calls[0].body;
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], "InvalidSpec");
    assert!(
        event["note"]
            .as_str()
            .is_some_and(|n| n.contains("spec.superlink.superexecImage")),
        "{event}"
    );
    let conditions = calls[1].body["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .clone();
    let degraded = conditions
        .iter()
        .find(|c| c["type"] == "Degraded")
        .expect("Degraded condition");
    assert_eq!(degraded["status"], "True");
    assert!(
        degraded["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.superlink.superexecImage")),
        "{degraded}"
    );
}

#[tokio::test]
async fn hub_local_pools_are_applied_by_the_embedded_runtime_as_the_hub_clusters_work() {
    // Invariant (#10, one code path): a Federation without placementRef has its pools applied
    // exactly as an agent applies a spoke's — the work of the hub's own cluster, rendered and
    // applied by the agent's KubeRuntime — but under the hub's own manager and label (so neither
    // an agent nor the controller prunes them) and owned by the Federation. With SuperNode
    // authentication a key Secret is made in the cluster and no SuperNode starts before its key
    // is registered.
    use flower_addon_agent::kube_runtime::{APPLIED_BY_LABEL, KubeRuntime};
    use flower_addon_hub::core::HUB_CLUSTER;
    use flower_addon_hub::kube::local::{LOCAL_POOLS_FIELD_MANAGER, applier};
    use flower_addon_proto::ClusterWork;
    use std::collections::BTreeMap;

    let secure = VALID.replace("insecure: true", "insecure: false");
    let fed = federation(&secure);
    let (store, mut writer) = kube::runtime::reflector::store::<Federation>();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(fed.as_ref().clone()));
    let labels = BTreeMap::from([(HUB_CLUSTER.to_owned(), BTreeMap::new())]);
    let works = flower_addon_hub::kube::work::federation_work(
        &fed,
        &[HUB_CLUSTER.to_owned()],
        &labels,
        "CA PEM",
        &[],
    )
    .expect("work");
    assert_eq!(works.len(), 1);
    assert_eq!(
        works[0].1.superlink_fleet_address,
        "fed-superlink.team.svc:9092"
    );
    let work = ClusterWork {
        version: 0,
        cluster_name: HUB_CLUSTER.into(),
        federations: vec![works[0].1.clone()],
    };
    let (client, calls) = mock_client(vec![]);
    let runtime = KubeRuntime::with_applier(client, applier(store));
    runtime.apply_work(&work).await.expect("apply");
    let calls = calls.lock().expect("log").clone();
    let writes: Vec<&Call> = calls
        .iter()
        .filter(|c| c.method == Method::PATCH || c.method == Method::POST)
        .filter(|c| !c.path.ends_with("/namespaces"))
        .collect();
    let paths: Vec<String> = writes.iter().map(|c| c.line()).collect();
    assert_eq!(
        paths,
        [
            "POST /api/v1/namespaces/team/secrets",
            "PATCH /api/v1/namespaces/team/secrets/fed-superlink-ca",
            "PATCH /api/v1/namespaces/team/services/fed-supernode-a",
            "PATCH /apis/apps/v1/namespaces/team/statefulsets/fed-supernode-a",
        ],
        "{calls:#?}"
    );
    for call in &writes {
        assert!(
            call.query
                .contains(&format!("fieldManager={LOCAL_POOLS_FIELD_MANAGER}")),
            "{}: {}",
            call.path,
            call.query
        );
        let meta = &call.body["metadata"];
        assert_eq!(
            meta["labels"][APPLIED_BY_LABEL], LOCAL_POOLS_FIELD_MANAGER,
            "{}",
            call.path
        );
        assert_eq!(
            meta["ownerReferences"][0]["uid"], "fed-uid",
            "{}",
            call.path
        );
        assert_eq!(
            meta["ownerReferences"][0]["controller"], true,
            "{}",
            call.path
        );
    }
    // One key per SuperNode in the cluster; none registered yet, so none starts.
    let keys = writes[0].body["data"].as_object().expect("key data");
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(writes[3].body["spec"]["replicas"], 0);
    // Pruning selects only this manager's objects.
    let lists: Vec<&Call> = calls
        .iter()
        .filter(|c| c.method == Method::GET && c.query.contains("labelSelector"))
        .collect();
    assert_eq!(lists.len(), 4, "{calls:#?}");
    for call in lists {
        assert!(
            call.query.contains(&format!(
                "{}%3D{LOCAL_POOLS_FIELD_MANAGER}",
                APPLIED_BY_LABEL.replace('/', "%2F")
            )),
            "{call:?}"
        );
    }
    // What the runtime reports carries the public keys for the hub to register.
    let report = runtime.observe().await;
    assert_eq!(report[0].pools[0].node_public_keys.len(), 2);
}

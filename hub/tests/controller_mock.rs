//! The Federation reconciler against a mocked API server (in the style of kube-rs's
//! controller-rs): every request it makes is recorded and the test asserts the exact sequence —
//! what is applied, in which order, with which field manager, and that an invalid spec applies
//! nothing. Fast (no cluster), beside the real-apiserver e2e tests.
mod fake_control;
mod mock_api;

use std::sync::Arc;

use flower_addon_crds::Federation;
use flower_addon_hub::kube::controller::cache::APPLIED_HASH_ANNOTATION;
use flower_addon_hub::kube::controller::{Caches, Context, HUB_FIELD_MANAGER, reconcile};
use flower_addon_hub::registration::ca::HubCa;
use http::Method;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use mock_api::{Call, mock_client, mock_client_refusing};
use serde_json::json;

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

/// Namespace `team` with the Pod Security `enforce` label `level` (`None`: no label).
fn team(level: Option<&str>) -> Namespace {
    let labels = level.map(|l| json!({"pod-security.kubernetes.io/enforce": l}));
    serde_json::from_value(json!({"metadata": {"name": "team", "labels": labels}}))
        .expect("namespace")
}

/// The controller's caches holding these objects and namespace `team` labelled `baseline`, as the
/// hub left it.
fn cached(
    statefulsets: Vec<StatefulSet>,
    services: Vec<Service>,
    policies: Vec<NetworkPolicy>,
    secrets: Vec<k8s_openapi::api::core::v1::Secret>,
    placements: Vec<flower_addon_crds::Placement>,
) -> Caches {
    Caches::fixed(statefulsets, services, policies, secrets, placements)
        .with_namespaces(vec![team(Some("baseline"))])
}

async fn run(fed: Arc<Federation>) -> Vec<Call> {
    run_with(fed, cached(vec![], vec![], vec![], vec![], vec![])).await
}

async fn run_with(fed: Arc<Federation>, caches: Caches) -> Vec<Call> {
    let (client, calls) = mock_client(vec![serde_json::to_value(fed.as_ref()).expect("json")]);
    let ca = Arc::new(HubCa::generate().expect("ca"));
    let ctx = Arc::new(Context::new(client, ca, caches));
    reconcile(fed, ctx).await.expect("reconcile");
    calls.lock().expect("log").clone()
}

/// The objects a first reconcile applied, as the apiserver would store them (the mock echoes
/// the applied body; a uid and a default are added), for the caches of the next reconcile.
fn stored(calls: &[Call]) -> (Vec<StatefulSet>, Vec<Service>, Vec<NetworkPolicy>) {
    let mut statefulsets = Vec::new();
    let mut services = Vec::new();
    let mut policies = Vec::new();
    for call in calls.iter().filter(|c| c.method == Method::PATCH) {
        let mut object = call.body.clone();
        object["metadata"]["uid"] = json!("uid-1");
        object["metadata"]["namespace"] = json!("team");
        if call.path.contains("/statefulsets/") {
            object["spec"]["revisionHistoryLimit"] = json!(10);
            statefulsets.push(serde_json::from_value(object).expect("statefulset"));
        } else if call.path.contains("/services/") {
            object["spec"]["sessionAffinity"] = json!("None");
            services.push(serde_json::from_value(object).expect("service"));
        } else if call.path.contains("/networkpolicies/") {
            policies.push(serde_json::from_value(object).expect("networkpolicy"));
        }
    }
    (statefulsets, services, policies)
}

#[tokio::test]
async fn a_valid_federation_is_applied_then_its_status_written() {
    // The Service, the NetworkPolicy and the SuperLink (applied at once: no certificate to issue first); every
    // write a server-side apply by the hub's manager; no LIST (orphans are found in the caches);
    // then one status patch. The pools are not the controller's: they are the hub cluster's
    // work, applied by the embedded runtime (kube::hub_pools, its own manager).
    let calls = run(federation(VALID)).await;
    let mut lines: Vec<String> = calls.iter().map(Call::line).collect();
    let status = lines.pop().expect("status");
    lines.sort();
    assert_eq!(
        lines,
        [
            "PATCH /api/v1/namespaces/team/services/fed-superlink",
            "PATCH /apis/apps/v1/namespaces/team/statefulsets/fed-superlink",
            "PATCH /apis/networking.k8s.io/v1/namespaces/team/networkpolicies/fed-superlink",
        ],
        "{calls:#?}"
    );
    assert_eq!(
        status,
        "PATCH /apis/flower-addon.io/v1alpha1/namespaces/team/federations/fed/status"
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
    // Every applied object is owned by the Federation (garbage collection on delete) and
    // carries the hash of what was applied.
    for call in &calls[..3] {
        let meta = &call.body["metadata"];
        let owner = &meta["ownerReferences"][0];
        assert_eq!(owner["uid"], "fed-uid", "{}", call.path);
        assert_eq!(owner["blockOwnerDeletion"], true, "{}", call.path);
        assert!(
            meta["annotations"][APPLIED_HASH_ANNOTATION].is_string(),
            "{}",
            call.path
        );
    }
    let status = &calls.last().expect("status").body["status"];
    assert!(
        status["conditions"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
    );
}

#[tokio::test]
async fn a_converged_federation_costs_no_request() {
    // Invariant: when the caches hold what the build makes and the status is current, a reconcile
    // (a resync) sends nothing at all: no apply, no LIST, no GET, no status write.
    let fed = federation(VALID);
    let first = run(fed.clone()).await;
    let (statefulsets, services, policies) = stored(&first);
    let mut converged = fed.as_ref().clone();
    converged.status = serde_json::from_value(first.last().expect("status").body["status"].clone())
        .expect("status");
    let caches = cached(statefulsets, services, policies, vec![], vec![]);
    let calls = run_with(Arc::new(converged.clone()), caches).await;
    assert!(calls.is_empty(), "{calls:#?}");

    // A value someone else changed in a field the hub owns is put back by one apply of that
    // object alone.
    let (statefulsets, mut services, policies) = stored(&first);
    services[0]
        .metadata
        .labels
        .get_or_insert_default()
        .insert("app.kubernetes.io/name".into(), "changed".into());
    let caches = cached(statefulsets, services, policies, vec![], vec![]);
    let calls = run_with(Arc::new(converged), caches).await;
    let lines: Vec<String> = calls.iter().map(Call::line).collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].starts_with("PATCH /api/v1/namespaces/team/services/"),
        "{lines:?}"
    );
}

#[tokio::test]
async fn a_reconcile_on_a_cache_behind_its_own_status_write_writes_nothing() {
    // The controller's status write triggers nothing, so a later reconcile (an owned object's
    // event) may still read the Federation as it was before that write. Same object, same
    // status: no second write. Once the cache moves on (another resourceVersion), its status
    // is what counts again.
    let mut fed = federation(VALID).as_ref().clone();
    fed.metadata.resource_version = Some("10".into());
    let fed = Arc::new(fed);
    let first = run(fed.clone()).await;
    let (statefulsets, services, policies) = stored(&first);
    let (client, calls) = mock_client(vec![serde_json::to_value(fed.as_ref()).expect("json")]);
    let ca = Arc::new(HubCa::generate().expect("ca"));
    let caches = cached(statefulsets, services, policies, vec![], vec![]);
    let ctx = Arc::new(Context::new(client, ca, caches));
    let status_writes = || {
        calls
            .lock()
            .expect("log")
            .iter()
            .filter(|c| c.path.ends_with("/status"))
            .count()
    };
    reconcile(fed.clone(), ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(status_writes(), 1, "the first status write");
    reconcile(fed.clone(), ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(
        status_writes(),
        1,
        "the same status again on the same stale object"
    );
    let mut moved = fed.as_ref().clone();
    moved.metadata.resource_version = Some("12".into());
    reconcile(Arc::new(moved), ctx).await.expect("reconcile");
    assert_eq!(
        status_writes(),
        2,
        "a newer object without that status gets it written"
    );
}

#[tokio::test]
async fn an_orphan_in_the_cache_is_deleted_without_listing() {
    // A StatefulSet the hub applied for this Federation that the build no longer makes (e.g. a
    // renamed SuperLink) is found in the cache and deleted; one owned by another Federation, or
    // not labelled as the hub's, is left alone.
    let fed = federation(VALID);
    let first = run(fed.clone()).await;
    let (mut statefulsets, services, policies) = stored(&first);
    let mut orphan = statefulsets[0].clone();
    orphan.metadata.name = Some("fed-old".into());
    let mut foreign = orphan.clone();
    foreign.metadata.name = Some("fed-foreign".into());
    foreign.metadata.owner_references.as_mut().expect("owner")[0].uid = "other-uid".into();
    let mut unlabelled = orphan.clone();
    unlabelled.metadata.name = Some("fed-unlabelled".into());
    unlabelled.metadata.labels = None;
    statefulsets.extend([orphan, foreign, unlabelled]);
    let caches = cached(statefulsets, services, policies, vec![], vec![]);
    let calls = run_with(fed, caches).await;
    let lines: Vec<String> = calls.iter().map(Call::line).collect();
    assert!(
        lines.contains(&"DELETE /apis/apps/v1/namespaces/team/statefulsets/fed-old".to_string()),
        "{lines:#?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("fed-foreign") || l.contains("fed-unlabelled")),
        "{lines:#?}"
    );
    assert!(
        !calls.iter().any(|c| c.method == Method::GET),
        "no LIST or GET: {lines:#?}"
    );
}

/// The calls of a reconcile that applied nothing: a Warning event, then the status; returns the
/// event's note.
fn only_an_event_and_the_status(calls: &[Call]) -> String {
    let lines: Vec<String> = calls.iter().map(Call::line).collect();
    assert_eq!(
        lines,
        [
            "POST /apis/events.k8s.io/v1/namespaces/team/events",
            "PATCH /apis/flower-addon.io/v1alpha1/namespaces/team/federations/fed/status",
        ],
        "{calls:#?}"
    );
    assert_eq!(calls[0].body["type"], "Warning");
    assert_eq!(calls[0].body["reason"], "InvalidSpec");
    calls[0].body["note"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn an_invalid_federation_applies_nothing_and_says_why() {
    // Process isolation without a ServerApp SuperExec image: no object is written or deleted;
    // a Warning event and a Degraded condition name the field.
    let invalid = VALID.replace("isolationMode: subprocess", "isolationMode: process");
    let calls = run(federation(&invalid)).await;
    let note = only_an_event_and_the_status(&calls);
    assert!(note.contains("spec.superlink.superexecImage"), "{note}");
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
async fn the_namespace_gets_the_pod_security_labels_it_lacks_and_a_weaker_one_is_refused() {
    // Invariant: the hub labels a Federation's unlabelled namespace with its Pod Security level
    // (one server-side apply, before anything else) so the API server enforces it too; in a
    // namespace labelled weaker nothing is applied and the Federation is Degraded naming the
    // namespace, the label command and the flag; a labelled one costs no request (above).
    let fed = federation(VALID);
    let empty = || Caches::fixed(vec![], vec![], vec![], vec![], vec![]);
    let calls = run_with(fed.clone(), empty().with_namespaces(vec![team(None)])).await;
    let first = &calls[0];
    assert_eq!(first.line(), "PATCH /api/v1/namespaces/team", "{calls:#?}");
    assert!(
        first.query.contains("fieldManager=flower-addon-hub"),
        "{}",
        first.query
    );
    for mode in ["enforce", "audit", "warn"] {
        assert_eq!(
            first.body["metadata"]["labels"][format!("pod-security.kubernetes.io/{mode}")],
            "baseline",
            "{}",
            first.body
        );
    }
    assert!(
        calls.iter().any(|c| c.path.contains("/statefulsets/")),
        "labelled, the SuperLink is applied: {calls:#?}"
    );

    let calls = run_with(fed, empty().with_namespaces(vec![team(Some("privileged"))])).await;
    let note = only_an_event_and_the_status(&calls);
    for part in [
        "metadata.namespace: namespace team exists with Pod Security pod-security.kubernetes.io/enforce=privileged",
        "kubectl label namespace team pod-security.kubernetes.io/enforce=baseline --overwrite",
        "`flower-hub serve --allow weaker-namespaces`",
    ] {
        assert!(note.contains(part), "{part:?} not in {note}");
    }
}

#[tokio::test]
async fn a_refused_write_is_degraded_with_its_fix_and_fails_the_reconcile() {
    // The hub's RBAC lacks StatefulSets in this namespace: the error reaches the Federation (a
    // Warning event and Degraded=True naming the fix), nothing is deleted, and the reconcile
    // fails so that it is retried.
    let fed = federation(VALID);
    let (client, calls) = mock_client_refusing(
        vec![serde_json::to_value(fed.as_ref()).expect("json")],
        Some("/statefulsets/"),
    );
    let ca = Arc::new(HubCa::generate().expect("ca"));
    let ctx = Arc::new(Context::new(
        client,
        ca,
        cached(vec![], vec![], vec![], vec![], vec![]),
    ));
    let error = reconcile(fed, ctx)
        .await
        .expect_err("a refused StatefulSet fails the reconcile");
    assert!(error.to_string().contains("forbidden"), "{error}");
    let calls = calls.lock().expect("log").clone();
    assert!(
        !calls.iter().any(|c| c.method == Method::DELETE),
        "{calls:#?}"
    );
    let event = calls
        .iter()
        .find(|c| c.is_event())
        .expect("a Warning event");
    assert_eq!(event.body["type"], "Warning");
    assert_eq!(event.body["reason"], "ReconcileFailed");
    let note = event.body["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("forbidden") && note.contains("lacks this permission"),
        "{note}"
    );
    let status = calls
        .iter()
        .rev()
        .find(|c| c.path.ends_with("/federations/fed/status"))
        .expect("a status write");
    let conditions = status.body["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .clone();
    let degraded = conditions
        .iter()
        .find(|c| c["type"] == "Degraded")
        .expect("Degraded");
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "ReconcileFailed");
    assert!(
        degraded["message"]
            .as_str()
            .is_some_and(|m| m.contains("manifests/hub/rbac.yaml")),
        "{degraded}"
    );
    let reconciling = conditions
        .iter()
        .find(|c| c["type"] == "Reconciling")
        .expect("Reconciling");
    assert_eq!(reconciling["reason"], "RetryingAfterError");
}

#[tokio::test]
async fn a_certificate_name_the_hub_does_not_have_issues_nothing() {
    // A TLS Federation asking for a SAN outside the hub's names gets no certificate (no Secret,
    // nothing applied): a Warning event and a Degraded condition name the field and the flag that
    // would allow it. Allowed by the hub's admin, the same Federation is applied.
    use flower_addon_hub::core::sans::SuperLinkNames;
    let fed = VALID.replace(
        "insecure: true",
        "insecure: false\n  tls: {extraSANs: [flower.example.org]}",
    );
    let (client, calls) = mock_client(vec![
        serde_json::to_value(federation(&fed).as_ref()).unwrap(),
    ]);
    let ca = Arc::new(HubCa::generate().expect("ca"));
    let ctx = Arc::new(Context::new(
        client,
        ca,
        cached(vec![], vec![], vec![], vec![], vec![]),
    ));
    reconcile(federation(&fed), ctx).await.expect("reconcile");
    let calls = calls.lock().expect("log").clone();
    let note = only_an_event_and_the_status(&calls);
    assert!(
        note.contains(
            "spec.tls.extraSANs[0]: \"flower.example.org\" is not one of the hub's names"
        ) && note.contains("--superlink-name flower.example.org"),
        "{note}"
    );

    let (client, calls) = mock_client(vec![
        serde_json::to_value(federation(&fed).as_ref()).unwrap(),
    ]);
    let ca = Arc::new(HubCa::generate().expect("ca"));
    let mut ctx = Context::new(client, ca, cached(vec![], vec![], vec![], vec![], vec![]));
    ctx.settings.superlink_names =
        SuperLinkNames::new([], &["*.example.org".to_owned()]).expect("names");
    reconcile(federation(&fed), Arc::new(ctx))
        .await
        .expect("reconcile");
    let calls = calls.lock().expect("log").clone();
    assert!(
        calls.iter().any(|c| c.method == Method::PATCH
            && c.path == "/api/v1/namespaces/team/secrets/fed-superlink-tls"),
        "allowed, the certificate is issued: {:#?}",
        calls.iter().map(Call::line).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn hub_local_pools_are_applied_by_the_embedded_runtime_as_the_hub_clusters_work() {
    // Invariant (one code path): a Federation without placementRef has its pools applied exactly as
    // an agent applies a spoke's — the work of the hub's own cluster, rendered and applied by the
    // agent's KubeRuntime — but under the hub's own manager and label (so neither an agent nor the
    // controller prunes them) and owned by the Federation. With SuperNode authentication a key
    // Secret is made in the cluster and no SuperNode starts before its key is registered.
    use flower_addon_agent::kube_runtime::{APPLIED_BY_LABEL, KubeRuntime};
    use flower_addon_hub::core::HUB_CLUSTER;
    use flower_addon_hub::kube::hub_pools::{LOCAL_POOLS_FIELD_MANAGER, applier};
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
        &[],
        &flower_addon_crds::policy::PodPolicy::new(flower_addon_crds::policy::Admin::Hub),
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
        .filter(|c| !c.path.ends_with("/namespaces") && !c.is_event())
        .collect();
    let mut paths: Vec<String> = writes.iter().map(|c| c.line()).collect();
    // The key Secret is written first, then the workload, then what it uses (the workload's
    // pods take longest to start).
    // The Secret and the Service go together, in no fixed order.
    paths[2..].sort();
    assert_eq!(
        paths,
        [
            "POST /api/v1/namespaces/team/secrets",
            "PATCH /apis/apps/v1/namespaces/team/statefulsets/fed-supernode-a",
            "PATCH /api/v1/namespaces/team/secrets/fed-superlink-ca",
            "PATCH /api/v1/namespaces/team/services/fed-supernode-a",
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
    let pool = writes
        .iter()
        .find(|c| c.path.ends_with("/statefulsets/fed-supernode-a"))
        .expect("pool StatefulSet applied");
    assert_eq!(pool.body["spec"]["replicas"], 0);
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

#[tokio::test]
async fn the_embedded_runtime_sends_only_what_changed() {
    // Invariant: after the first (full) apply, a snapshot costs requests only for what changed in
    // it: the same work sends nothing, a replica change one apply of the pool's StatefulSet, a
    // removed Federation one DELETE per object it had (no LIST).
    use flower_addon_agent::kube_runtime::KubeRuntime;
    use flower_addon_hub::core::HUB_CLUSTER;
    use flower_addon_hub::kube::hub_pools::applier;
    use flower_addon_proto::ClusterWork;
    use std::collections::BTreeMap;

    let snapshot = |yaml: &str| {
        let fed = federation(yaml);
        let labels = BTreeMap::from([(HUB_CLUSTER.to_owned(), BTreeMap::new())]);
        let works = flower_addon_hub::kube::work::federation_work(
            &fed,
            &[HUB_CLUSTER.to_owned()],
            &labels,
            "",
            &[],
            &[],
            &flower_addon_crds::policy::PodPolicy::new(flower_addon_crds::policy::Admin::Hub),
        )
        .expect("work");
        ClusterWork {
            version: 0,
            cluster_name: HUB_CLUSTER.into(),
            federations: works.into_iter().map(|(_, w)| w).collect(),
        }
    };
    let (store, mut writer) = kube::runtime::reflector::store::<Federation>();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(
        federation(VALID).as_ref().clone(),
    ));
    let (client, calls) = mock_client(vec![]);
    let runtime = KubeRuntime::with_applier(client, applier(store));
    let take = || {
        let mut taken = std::mem::take(&mut *calls.lock().expect("log"));
        taken.retain(|c| !c.is_event());
        taken
    };

    runtime.apply_work(&snapshot(VALID)).await.expect("first");
    let first = take();
    assert!(
        first
            .iter()
            .any(|c| c.method == Method::GET && c.query.contains("labelSelector")),
        "the first apply is full (prunes by listing): {first:#?}"
    );

    runtime.apply_work(&snapshot(VALID)).await.expect("same");
    let same = take();
    assert!(same.is_empty(), "{same:#?}");

    let scaled = VALID.replace("replicas: 2", "replicas: 3");
    runtime
        .apply_work(&snapshot(&scaled))
        .await
        .expect("scaled");
    let lines: Vec<String> = take().iter().map(Call::line).collect();
    assert_eq!(
        lines,
        ["PATCH /apis/apps/v1/namespaces/team/statefulsets/fed-supernode-a"],
    );

    runtime
        .apply_work(&ClusterWork {
            version: 0,
            cluster_name: HUB_CLUSTER.into(),
            federations: vec![],
        })
        .await
        .expect("removed");
    let mut lines: Vec<String> = take().iter().map(Call::line).collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "DELETE /api/v1/namespaces/team/services/fed-supernode-a",
            "DELETE /apis/apps/v1/namespaces/team/statefulsets/fed-supernode-a",
        ],
    );
}

#[tokio::test]
async fn a_certificate_due_by_age_waits_for_the_runs_in_progress() {
    // A SuperLink certificate due for renewal only because it aged is kept while a run is in
    // progress on the SuperLink (a new one rolls the pod, and Flower stops its runs): no Secret
    // written, the pod template marked with the certificate in force, an event naming the run
    // and the deadline (once), a reconcile again soon, and no request on a reconcile within the
    // recheck. Once the run finished, the next reconcile issues it and rolls the pod.
    use flower_addon_hub::kube::controller::tls::{NOT_AFTER_ANNOTATION, NOT_BEFORE_ANNOTATION};
    use k8s_openapi::api::core::v1::Secret;
    let fed = federation(&VALID.replace("insecure: true", "insecure: false"));
    let ca = Arc::new(HubCa::generate().expect("ca"));
    let fake_control::StandIn {
        fake,
        endpoint,
        dir: _dir,
        ..
    } = fake_control::stand_in(&ca, fake_control::Fake::default()).await;
    let validity = std::time::Duration::from_secs(1000);
    let context = |client, caches| {
        let mut ctx = Context::new(client, ca.clone(), caches);
        ctx.settings.superlink_cert_validity = validity;
        let endpoint = endpoint.clone();
        ctx.control = Arc::new(move |_| Some(endpoint.clone()));
        ctx
    };
    let lines = |calls: &Arc<std::sync::Mutex<Vec<Call>>>| -> Vec<String> {
        calls.lock().expect("log").iter().map(Call::line).collect()
    };
    const SECRET: &str = "PATCH /api/v1/namespaces/team/secrets/fed-superlink-tls";
    const SUPERLINK: &str = "PATCH /apis/apps/v1/namespaces/team/statefulsets/fed-superlink";
    // The first reconcile issues the certificate; as stored, it is made 85 % old.
    let (client, calls) = mock_client(vec![serde_json::to_value(fed.as_ref()).unwrap()]);
    let none = || cached(vec![], vec![], vec![], vec![], vec![]);
    reconcile(fed.clone(), Arc::new(context(client, none())))
        .await
        .expect("reconcile");
    let first = calls.lock().expect("log").clone();
    let (_, services, policies) = stored(&first);
    let secret_call = first
        .iter()
        .find(|c| c.line() == SECRET)
        .expect("the certificate issued");
    let mut secret: Secret = serde_json::from_value(secret_call.body.clone()).expect("Secret");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let aged_not_after = (now + 150).to_string();
    let annotations = secret.metadata.annotations.get_or_insert_default();
    annotations.insert(NOT_BEFORE_ANNOTATION.into(), (now - 850).to_string());
    annotations.insert(NOT_AFTER_ANNOTATION.into(), aged_not_after.clone());
    secret.metadata.namespace = Some("team".into());
    let mut converged = fed.as_ref().clone();
    converged.status = serde_json::from_value(first.last().expect("status").body["status"].clone())
        .expect("status");
    let converged = Arc::new(converged);
    fake.runs.lock().expect("runs").runs.insert(
        41,
        flower_addon_proto::flwr::Run {
            run_id: 41,
            status: Some(flower_addon_proto::flwr::RunStatus {
                status: "running".into(),
                sub_status: String::new(),
                details: String::new(),
            }),
            ..Default::default()
        },
    );

    // Due, with run 41 running: kept.
    let (client, calls) = mock_client(vec![serde_json::to_value(converged.as_ref()).unwrap()]);
    let caches = |statefulsets| {
        cached(
            statefulsets,
            services.clone(),
            policies.clone(),
            vec![secret.clone()],
            vec![],
        )
    };
    let ctx = Arc::new(context(client, caches(vec![])));
    let action = reconcile(converged.clone(), ctx.clone())
        .await
        .expect("reconcile");
    let waited = calls.lock().expect("log").clone();
    assert!(
        !lines(&calls).contains(&SECRET.to_owned()),
        "the Secret is not written while the run is in progress: {:#?}",
        lines(&calls)
    );
    let superlink = waited
        .iter()
        .find(|c| c.line() == SUPERLINK)
        .expect("the SuperLink applied");
    assert_eq!(
        superlink.body["spec"]["template"]["metadata"]["annotations"][NOT_AFTER_ANNOTATION],
        aged_not_after.as_str(),
        "the pod template marked with the certificate in force"
    );
    let event = waited
        .iter()
        .find(|c| c.path.ends_with("/events"))
        .expect("an event");
    assert_eq!(event.body["reason"], "CertificateRenewalWaits");
    let note = event.body["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("run(s) 41 in progress") && note.contains("at the latest at"),
        "{note}"
    );
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(std::time::Duration::from_millis(5_100)),
        "asked again after the recheck"
    );
    assert_eq!(fake.calls(), ["list-runs"]);

    // Within the recheck, on the converged objects: no request, no second event, not asked.
    let (statefulsets, _, _) = stored(&waited);
    let (client, calls) = mock_client(vec![serde_json::to_value(converged.as_ref()).unwrap()]);
    let mut again = context(client, caches(statefulsets.clone()));
    again.renewals = std::mem::take(&mut Arc::into_inner(ctx).expect("one context").renewals);
    reconcile(converged.clone(), Arc::new(again))
        .await
        .expect("reconcile");
    assert_eq!(lines(&calls), Vec::<String>::new());
    assert_eq!(fake.calls(), ["list-runs"]);

    // Finished: the next reconcile (asking again at once) issues the new certificate and rolls
    // the pod template.
    fake.runs
        .lock()
        .expect("runs")
        .set_status(41, "finished:completed");
    let (client, calls) = mock_client(vec![serde_json::to_value(converged.as_ref()).unwrap()]);
    let mut ctx = context(client, caches(statefulsets));
    ctx.renewals = flower_addon_hub::flower::renewal::RenewalHolds::new(std::time::Duration::ZERO);
    reconcile(converged, Arc::new(ctx))
        .await
        .expect("reconcile");
    let renewed = lines(&calls);
    assert!(
        renewed.contains(&SECRET.to_owned()) && renewed.contains(&SUPERLINK.to_owned()),
        "renewed and the SuperLink rolled: {renewed:#?}"
    );
}

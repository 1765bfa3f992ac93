use super::super::tests::{decision, federation, managed, stores};
use super::*;
use flower_addon_proto::Status as AgentStatus;

#[test]
fn cluster_status_sums_the_reported_pools_and_names_what_is_missing() {
    // Invariant: a cluster's entry shows its pools' ready/desired from the agent's report,
    // and says so when there is no report yet or the cluster is not Available.
    let fed = federation("[{name: a, replicas: 2, images: {}}]");
    let none = cluster_status(&fed, "s1", None, None, None);
    assert_eq!(none.supernodes, None);
    assert!(!none.connected);
    assert!(none.message.is_some_and(|m| m.contains("no status report")));
    let report = Report {
        status: AgentStatus {
            observed_version: 1,
            cluster_name: "s1".into(),
            federations: vec![flower_addon_proto::FederationStatus {
                supernode_restart: String::new(),
                namespace: "team".into(),
                name: "fed".into(),
                pools: vec![flower_addon_proto::PoolStatus {
                    name: "a".into(),
                    desired: 2,
                    ready: 1,
                    ..Default::default()
                }],
            }],
            ..Default::default()
        },
        at: 1_700_000_000,
    };
    let mut mc = ManagedCluster::new("s1", Default::default());
    mc.status = Some(flower_addon_crds::ManagedClusterStatus {
        conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Available".into(),
            status: "True".into(),
            reason: "ClusterLeaseRenewed".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }],
        ..Default::default()
    });
    let st = cluster_status(&fed, "s1", Some(&mc), Some(&report), None);
    assert_eq!(st.supernodes.as_deref(), Some("1/2"));
    assert!(st.connected);
    assert_eq!(st.message.as_deref(), Some("1/2 SuperNodes ready"));
    let mut later = st.clone();
    later.last_report = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(1_700_000_010).expect("time"),
    ));
    assert!(same_but_fresh(std::slice::from_ref(&st), &[later]));

    // A status just written is not written again while the cache still shows the object as it
    // was before that write (same resourceVersion); once anything moved, the rule applies anew.
    let old = vec![none_status(&fed)];
    let want = vec![st.clone()];
    let v5 = Some("5".to_owned());
    assert!(needs_status_write(&old, &want, None, &v5));
    let written = (&v5, &want);
    assert!(!needs_status_write(&old, &want, Some(written), &v5));
    assert!(needs_status_write(
        &old,
        &want,
        Some(written),
        &Some("6".to_owned())
    ));
    let mut other = st.clone();
    other.connected = false;
    assert!(needs_status_write(&old, &[other], Some(written), &v5));
    assert!(!needs_status_write(&want, &want, None, &v5));
}

fn none_status(fed: &Federation) -> flower_addon_crds::ClusterStatus {
    cluster_status(fed, "s1", None, None, None)
}

#[path = "../../../../tests/mock_api/mod.rs"]
mod mock_api;

#[tokio::test]
async fn the_status_writer_patches_status_clusters_as_its_own_field_manager() {
    // A report from a decided cluster becomes that Federation's status.clusters entry, written
    // by server-side apply under CLUSTER_STATUS_FIELD_MANAGER (the controller owns the rest of
    // the status); clusters the Placement did not decide are not listed.
    let fed = federation("[{name: a, replicas: 2, images: {}}]");
    let (client, calls) = mock_api::mock_client(vec![serde_json::to_value(&fed).expect("json")]);
    let mut available = managed("s1", &[]);
    available.status = Some(flower_addon_crds::ManagedClusterStatus {
        conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Available".into(),
            status: "True".into(),
            reason: "ClusterLeaseRenewed".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }],
        ..Default::default()
    });
    let stores = stores(
        vec![fed],
        vec![decision("both", &["s1"])],
        vec![available, managed("s2", &[])],
    );
    let reports: Arc<DashMap<String, Report>> = Arc::new(DashMap::new());
    for cluster in ["s1", "s2"] {
        reports.insert(
            cluster.into(),
            Report {
                status: AgentStatus {
                    cluster_name: cluster.into(),
                    federations: vec![flower_addon_proto::FederationStatus {
                        supernode_restart: String::new(),
                        namespace: "team".into(),
                        name: "fed".into(),
                        pools: vec![flower_addon_proto::PoolStatus {
                            name: "a".into(),
                            desired: 2,
                            ready: 1,
                            ..Default::default()
                        }],
                    }],
                    ..Default::default()
                },
                at: 1_700_000_000,
            },
        );
    }
    let (tx, rx) = watch::channel(0u64);
    let writer = tokio::spawn(write_cluster_statuses(
        client,
        stores,
        reports,
        Arc::new(NodeKeyRegistry::new()),
        rx,
    ));
    tx.send_modify(|n| *n += 1);
    tokio::time::sleep(Duration::from_millis(900)).await;
    writer.abort();
    let calls = calls.lock().expect("log").clone();
    let lines: Vec<String> = calls.iter().map(mock_api::Call::line).collect();
    assert_eq!(
        lines,
        ["PATCH /apis/flower-addon.io/v1alpha1/namespaces/team/federations/fed/status"],
        "{calls:#?}"
    );
    assert!(
        calls[0]
            .query
            .contains(&format!("fieldManager={CLUSTER_STATUS_FIELD_MANAGER}")),
        "{:?}",
        calls[0].query
    );
    let clusters = calls[0].body["status"]["clusters"]
        .as_array()
        .expect("clusters")
        .clone();
    assert_eq!(clusters.len(), 1, "{clusters:?}");
    assert_eq!(clusters[0]["name"], "s1");
    assert_eq!(clusters[0]["supernodes"], "1/2");
    assert_eq!(clusters[0]["connected"], true);
}

#[tokio::test]
async fn a_failing_superlink_gets_its_condition_and_a_warning_event() {
    // What the key registry read from a SuperLink's log (a full database) becomes condition
    // SuperLinkHealthy=False in the same status write (this writer's field manager), with a
    // Warning event naming the reason; a Federation whose SuperLink works gets it True.
    use crate::flower::diagnose::{FaultKind, SuperLinkFault};
    use crate::flower::registry::{Diagnosis, FederationKeys};
    let fed = federation("[{name: a, replicas: 2, images: {}}]");
    let (client, calls) = mock_api::mock_client(vec![serde_json::to_value(&fed).expect("json")]);
    let stores = stores(
        vec![fed],
        vec![decision("both", &["s1"])],
        vec![managed("s1", &[])],
    );
    let registry = Arc::new(NodeKeyRegistry::new());
    let fault = SuperLinkFault {
        kind: FaultKind::Storage,
        line: "ERROR : [/v1/fleet/heartbeat][UnexpectedError:OperationalError] (sqlite3.OperationalError) database or disk is full".into(),
    };
    registry.insert_for_test(
        ("team".into(), "fed".into()),
        FederationKeys {
            listed: true,
            problem: Some(Diagnosis {
                message: fault.message("expand claim superlink-state-fed-superlink-0"),
                fault,
            }),
            ..FederationKeys::default()
        },
    );
    let (tx, rx) = watch::channel(0u64);
    let writer = tokio::spawn(write_cluster_statuses(
        client,
        stores,
        Arc::new(DashMap::new()),
        registry,
        rx,
    ));
    tx.send_modify(|n| *n += 1);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    writer.abort();
    let calls = calls.lock().expect("log").clone();
    let patch = calls
        .iter()
        .find(|c| c.line().ends_with("/federations/fed/status"))
        .unwrap_or_else(|| panic!("a status write: {calls:#?}"));
    let conditions = patch.body["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .clone();
    assert_eq!(conditions.len(), 1, "{conditions:?}");
    assert_eq!(conditions[0]["type"], "SuperLinkHealthy");
    assert_eq!(conditions[0]["status"], "False");
    assert_eq!(conditions[0]["reason"], "DatabaseStorageFull");
    let message = conditions[0]["message"].as_str().expect("message");
    assert!(
        message.contains("database or disk is full")
            && message.contains("expand claim superlink-state-fed-superlink-0"),
        "{message}"
    );
    let event = calls
        .iter()
        .find(|c| c.line().contains("/events"))
        .unwrap_or_else(|| panic!("a Warning event: {calls:#?}"));
    assert_eq!(event.body["type"], "Warning", "{:#}", event.body);
    assert_eq!(
        event.body["reason"], "DatabaseStorageFull",
        "{:#}",
        event.body
    );
}

use super::*;

fn federation(pools: &str) -> Federation {
    let yaml = format!(
        r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {{name: fed, namespace: team}}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  insecure: false
  placementRef: {{name: both}}
  superlink: {{image: "flwr/superlink:1.42.0", externalAddress: "hub.example:30092"}}
  supernodes:
    image: "flwr/supernode:1.42.0"
    pools: {pools}
"#
    );
    serde_saphyr::from_str(&yaml).expect("federation")
}

#[test]
fn pools_split_over_the_decided_clusters_with_global_partitions() {
    // Invariant: every decided cluster gets every pool (unless its clusterSelector excludes
    // the cluster), partitions are numbered across clusters by name, and the spoke gets the
    // external Fleet address and the CA bundle.
    let fed = federation(
        r#"[{name: a, replicas: 2, images: {}},
                {name: gpu, replicas: 1, images: {}, clusterSelector: {matchLabels: {gpu: "yes"}}}]"#,
    );
    let labels = BTreeMap::from([
        ("s1".to_string(), BTreeMap::new()),
        (
            "s2".to_string(),
            BTreeMap::from([("gpu".to_string(), "yes".to_string())]),
        ),
    ]);
    let works = federation_work(&fed, &["s1".into(), "s2".into()], &labels, "CA").expect("work");
    assert_eq!(works.len(), 2);
    let (c1, w1) = &works[0];
    let (c2, w2) = &works[1];
    assert_eq!((c1.as_str(), c2.as_str()), ("s1", "s2"));
    assert_eq!(
        w1.pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
    assert_eq!(
        w2.pools
            .iter()
            .map(|p| (p.name.as_str(), p.partition_offset))
            .collect::<Vec<_>>(),
        [("a", 2), ("gpu", 4)]
    );
    assert_eq!(w1.partitions_total, 5);
    assert_eq!(w2.superlink_fleet_address, "hub.example:30092");
    assert_eq!(w2.ca_bundle_pem, "CA");
    assert_eq!((w1.cluster_index, w1.cluster_count), (0, 2));
}

#[test]
fn cluster_status_sums_the_reported_pools_and_names_what_is_missing() {
    // Invariant: a cluster's entry shows its pools' ready/desired from the agent's report,
    // and says so when there is no report yet or the cluster is not Available.
    let fed = federation("[{name: a, replicas: 2, images: {}}]");
    let none = cluster_status(&fed, "s1", None, None);
    assert_eq!(none.supernodes, None);
    assert!(!none.connected);
    assert!(none.message.is_some_and(|m| m.contains("no status report")));
    let report = Report {
        status: AgentStatus {
            observed_version: 1,
            cluster_name: "s1".into(),
            federations: vec![flower_addon_proto::FederationStatus {
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
    let st = cluster_status(&fed, "s1", Some(&mc), Some(&report));
    assert_eq!(st.supernodes.as_deref(), Some("1/2"));
    assert!(st.connected);
    assert_eq!(st.message.as_deref(), Some("1/2 SuperNodes ready"));
    let mut later = st.clone();
    later.last_report = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(1_700_000_010).expect("time"),
    ));
    assert!(same_but_fresh(std::slice::from_ref(&st), &[later]));
}

#[test]
fn an_invalid_federation_yields_no_new_work() {
    // Invariant: a Federation the renderer refuses gives an error (the caller keeps the old
    // work) instead of an empty list that would prune running SuperNodes.
    let mut fed = federation("[{name: a, replicas: 1, images: {}}]");
    fed.spec.superlink.external_address = None;
    assert!(federation_work(&fed, &["s1".into()], &BTreeMap::new(), "CA").is_err());
}

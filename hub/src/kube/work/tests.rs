use super::*;

pub(super) fn federation(pools: &str) -> Federation {
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
    let works = federation_work(
        &fed,
        &["s1".into(), "s2".into()],
        &labels,
        "CA",
        &[],
        &[],
        &hub_policy(),
    )
    .expect("work");
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
fn an_invalid_federation_yields_no_new_work() {
    // Invariant: a Federation the renderer refuses gives an error (the caller keeps the old
    // work) instead of an empty list that would prune running SuperNodes.
    let mut fed = federation("[{name: a, replicas: 1, images: {}}]");
    fed.spec.superlink.external_address = None;
    assert!(
        federation_work(
            &fed,
            &["s1".into()],
            &BTreeMap::new(),
            "CA",
            &[],
            &[],
            &hub_policy()
        )
        .is_err()
    );
}

/// Stores filled as the reflectors would after their first list.
pub(super) fn stores(
    feds: Vec<Federation>,
    decisions: Vec<PlacementDecision>,
    clusters: Vec<ManagedCluster>,
) -> Stores {
    stores_with(feds, decisions, clusters, Vec::new())
}

/// [`stores`] with the SuperLink StatefulSets the hub applied.
pub(super) fn stores_with(
    feds: Vec<Federation>,
    decisions: Vec<PlacementDecision>,
    clusters: Vec<ManagedCluster>,
    superlinks: Vec<k8s_openapi::api::apps::v1::StatefulSet>,
) -> Stores {
    use kube::runtime::watcher::Event;
    fn fill<K>(items: Vec<K>) -> Store<K>
    where
        K: kube::Resource + Clone + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let (store, mut writer) = reflector::store::<K>();
        writer.apply_watcher_event(&Event::Init);
        for item in items {
            writer.apply_watcher_event(&Event::InitApply(item));
        }
        writer.apply_watcher_event(&Event::InitDone);
        store
    }
    Stores {
        federations: fill(feds),
        decisions: fill(decisions),
        clusters: fill(clusters),
        superlinks: fill(superlinks),
        ocm: None,
    }
}

/// OCM stores filled with `decisions` (`(placement, clusters)`, namespace `team`) and clusters
/// `(name, labels)`, as OCM writes them.
fn ocm_stores(decisions: &[(&str, &[&str])], clusters: &[(&str, &[(&str, &str)])]) -> OcmStores {
    use kube::runtime::watcher::Event;
    let fill = |resource: kube::api::ApiResource, items: Vec<serde_json::Value>| {
        let mut writer = reflector::store::Writer::<DynamicObject>::new(resource);
        writer.apply_watcher_event(&Event::Init);
        for item in items {
            writer.apply_watcher_event(&Event::InitApply(serde_json::from_value(item).unwrap()));
        }
        writer.apply_watcher_event(&Event::InitDone);
        writer.as_reader()
    };
    let decisions = decisions
        .iter()
        .map(|(placement, clusters)| {
            let decided: Vec<serde_json::Value> = clusters
                .iter()
                .map(|c| serde_json::json!({"clusterName": c, "reason": ""}))
                .collect();
            serde_json::json!({
                "apiVersion": "cluster.open-cluster-management.io/v1beta1",
                "kind": "PlacementDecision",
                "metadata": {"name": format!("{placement}-decision-1"), "namespace": "team",
                             "labels": {PLACEMENT_LABEL: placement}},
                "status": {"decisions": decided},
            })
        })
        .collect();
    let clusters = clusters
        .iter()
        .map(|(name, labels)| {
            let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
            serde_json::json!({
                "apiVersion": "cluster.open-cluster-management.io/v1",
                "kind": "ManagedCluster",
                "metadata": {"name": name, "labels": labels},
                "spec": {"hubAcceptsClient": true},
            })
        })
        .collect();
    OcmStores {
        decisions: fill(crate::kube::ocm::decision_resource(), decisions),
        clusters: fill(crate::kube::ocm::cluster_resource(), clusters),
    }
}

#[test]
fn a_federation_naming_an_ocm_placement_is_placed_by_ocms_decisions_and_labels() {
    // Invariant: the API the placementRef names decides — never the other one's Placement of
    // the same name — and an OCM-placed Federation's pool selectors match OCM's labels. Without
    // OCM installed it is placed nowhere.
    let mut ocm_fed = federation(
        "[{name: a, replicas: 1, images: {}}, {name: g, replicas: 1, images: {}, clusterSelector: {matchLabels: {gpu: \"true\"}}}]",
    );
    ocm_fed.spec.placement_ref = Some(flower_addon_crds::PlacementRef {
        name: "both".into(),
        api_group: Some(flower_addon_crds::PlacementApiGroup::Ocm),
        kind: None,
    });
    let ours = federation("[{name: a, replicas: 1, images: {}}]");
    let mut stores = stores(
        vec![ocm_fed.clone(), ours.clone()],
        vec![decision("both", &["s1"])],
        vec![managed("s1", &[]), managed("s2", &[]), managed("s3", &[])],
    );
    let known = |c: &str| ["s1", "s2", "s3"].contains(&c);
    assert!(Decided::of(&stores).placed_on(&ocm_fed, known).is_empty());
    stores.ocm = Some(ocm_stores(
        &[("both", &["s2", "s3", "edge-9"])],
        &[("s2", &[("gpu", "true")]), ("s3", &[])],
    ));
    let decided = Decided::of(&stores);
    assert_eq!(decided.placed_on(&ocm_fed, known), ["s2", "s3"]);
    assert_eq!(decided.placed_on(&ours, known), ["s1"]);
    let ours_labels = BTreeMap::new();
    let labels = decided.labels(&ocm_fed, &ours_labels);
    let work = federation_work(
        &ocm_fed,
        &["s2".into(), "s3".into()],
        labels,
        "CA",
        &[],
        &[],
        &hub_policy(),
    )
    .expect("work");
    let pools = |cluster: &str| -> Vec<String> {
        work.iter()
            .filter(|(c, _)| c == cluster)
            .flat_map(|(_, w)| w.pools.iter().map(|p| p.name.clone()))
            .collect()
    };
    assert_eq!(pools("s2"), ["a", "g"], "OCM's label gpu=true on s2");
    assert_eq!(pools("s3"), ["a"]);
    assert!(std::ptr::eq(
        decided.labels(&ours, &ours_labels),
        &ours_labels
    ));
}

pub(super) fn decision(placement: &str, clusters: &[&str]) -> PlacementDecision {
    let mut d = PlacementDecision::new(&format!("{placement}-decision-1"), Default::default());
    d.metadata.namespace = Some("team".into());
    d.metadata.labels = Some(BTreeMap::from([(
        PLACEMENT_LABEL.to_string(),
        placement.to_string(),
    )]));
    d.status = Some(flower_addon_crds::PlacementDecisionStatus {
        decisions: clusters
            .iter()
            .map(|c| flower_addon_crds::ClusterDecision {
                cluster_name: c.to_string(),
                reason: String::new(),
            })
            .collect(),
    });
    d
}

pub(super) fn managed(name: &str, labels: &[(&str, &str)]) -> ManagedCluster {
    let mut mc = ManagedCluster::new(name, Default::default());
    mc.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    mc
}

#[test]
fn the_work_source_sends_only_the_clusters_whose_work_changed() {
    // The reconciler of the work channel: decided clusters get the Federation's work, clusters
    // not decided get an empty snapshot, a change bumps the versions of exactly the clusters
    // whose work it alters, and a pass that alters nothing sends nothing.
    let fed = federation(
        r#"[{name: a, replicas: 1, images: {}},
            {name: gpu, replicas: 1, images: {}, clusterSelector: {matchLabels: {gpu: "yes"}}}]"#,
    );
    let work = InMemoryWorkSource::new();
    let mut state = fresh_state();
    let both = decision("both", &["s1", "s2"]);
    let first = stores(
        vec![fed.clone()],
        vec![both.clone()],
        vec![managed("s1", &[]), managed("s2", &[]), managed("s3", &[])],
    );
    state.recompute(&first, &work);
    let v = |c: &str| work.snapshot(c).version;
    let (s1, s2, s3) = (v("s1"), v("s2"), v("s3"));
    assert_eq!(work.snapshot("s1").federations[0].pools.len(), 1);
    assert_eq!(work.snapshot("s2").federations.len(), 1);
    assert!(work.snapshot("s3").federations.is_empty());

    // Same input: nothing is sent again.
    state.recompute(&first, &work);
    assert_eq!((v("s1"), v("s2"), v("s3")), (s1, s2, s3));

    // A label on s3, which no Placement decided, changes nobody's work: nothing is sent.
    let s3_labelled = stores(
        vec![fed.clone()],
        vec![both.clone()],
        vec![
            managed("s1", &[]),
            managed("s2", &[]),
            managed("s3", &[("gpu", "yes")]),
        ],
    );
    state.recompute(&s3_labelled, &work);
    assert_eq!((v("s1"), v("s2"), v("s3")), (s1, s2, s3));

    // s2 gains gpu=yes: s2 runs the gpu pool, and {partitions} grows for every decided cluster,
    // so s1 and s2 get new work; s3 (not decided) keeps its version.
    let relabelled = stores(
        vec![fed],
        vec![both],
        vec![
            managed("s1", &[]),
            managed("s2", &[("gpu", "yes")]),
            managed("s3", &[("gpu", "yes")]),
        ],
    );
    state.recompute(&relabelled, &work);
    assert_ne!(v("s1"), s1);
    assert_ne!(v("s2"), s2);
    assert_eq!(v("s3"), s3);
    assert_eq!(work.snapshot("s2").federations[0].pools.len(), 2);
    assert_eq!(work.snapshot("s1").federations[0].partitions_total, 3);
}

#[test]
fn a_cluster_the_placement_no_longer_decides_gets_empty_work_even_when_none_is_left() {
    // spoke-1 relabelled out of the only Placement of a Federation: its work must become empty (so
    // its agent prunes the SuperNodes), also when no cluster is left at all.
    let fed = federation("[{name: a, replicas: 1, images: {}}]");
    let work = InMemoryWorkSource::new();
    let mut state = fresh_state();
    state.recompute(
        &stores(
            vec![fed.clone()],
            vec![decision("both", &["s1"])],
            vec![managed("s1", &[])],
        ),
        &work,
    );
    assert_eq!(work.snapshot("s1").federations.len(), 1);
    state.recompute(
        &stores(
            vec![fed],
            vec![decision("both", &[])],
            vec![managed("s1", &[])],
        ),
        &work,
    );
    assert!(
        work.snapshot("s1").federations.is_empty(),
        "{:?}",
        work.snapshot("s1")
    );
}

/// A work-source state that has sent nothing yet.
fn fresh_state() -> State {
    State {
        policy: hub_policy(),
        ca: Arc::new(
            crate::registration::ca::HubCa::generate_for(crate::registration::ca::CaRole::Flower)
                .expect("CA"),
        ),
        registry: Arc::new(NodeKeyRegistry::new()),
        sent: BTreeMap::new(),
        last_good: BTreeMap::new(),
        memo: BTreeMap::new(),
        holds: hold::Holds::default(),
    }
}

#[test]
fn a_pass_renders_only_the_federations_whose_inputs_changed() {
    // The work of a Federation is rendered again only when what it is computed from changed (spec
    // generation, selected clusters and their labels, node keys); otherwise the last result is
    // reused, so a pass costs what changed, not the number of Federations.
    let mut fed = federation(
        r#"[{name: a, replicas: 1, images: {}},
            {name: gpu, replicas: 1, images: {}, clusterSelector: {matchLabels: {gpu: "yes"}}}]"#,
    );
    fed.metadata.uid = Some("u1".into());
    fed.metadata.generation = Some(1);
    let work = InMemoryWorkSource::new();
    let mut state = fresh_state();
    let both = decision("both", &["s1", "s2"]);
    let with = |fed: &Federation, s2: &[(&str, &str)]| {
        stores(
            vec![fed.clone()],
            vec![both.clone()],
            vec![managed("s1", &[]), managed("s2", s2)],
        )
    };
    state.recompute(&with(&fed, &[]), &work);
    let pools = |c: &str| {
        work.snapshot(c).federations[0]
            .pools
            .iter()
            .map(|p| p.name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(pools("s2"), ["a"]);
    assert_eq!(state.memo.len(), 1);

    // The same generation with another spec cannot come from an apiserver; it shows that the
    // remembered work is what is sent.
    let mut same_generation = fed.clone();
    same_generation.spec.supernodes.pools.truncate(1);
    same_generation.spec.supernodes.pools[0].name = "renamed".into();
    state.recompute(&with(&same_generation, &[]), &work);
    assert_eq!(pools("s1"), ["a"]);

    // A label of a selected cluster is an input: s2 now runs the gpu pool.
    state.recompute(&with(&fed, &[("gpu", "yes")]), &work);
    assert_eq!(pools("s2"), ["a", "gpu"]);

    // A new generation is rendered.
    let mut edited = same_generation.clone();
    edited.metadata.generation = Some(2);
    state.recompute(&with(&edited, &[("gpu", "yes")]), &work);
    assert_eq!(pools("s1"), ["renamed"]);

    // A deleted Federation is forgotten.
    state.recompute(
        &stores(vec![], vec![both.clone()], vec![managed("s1", &[])]),
        &work,
    );
    assert!(state.memo.is_empty());
}

/// A SuperLink StatefulSet `fed-superlink` in `team` whose rollout is `done` or still running.
fn superlink_sts(done: bool) -> k8s_openapi::api::apps::v1::StatefulSet {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "fed-superlink", "namespace": "team", "generation": 2},
        "spec": {"replicas": 1, "selector": {}, "template": {}},
        "status": {
            "observedGeneration": 2,
            "replicas": 1,
            "readyReplicas": if done { 1 } else { 0 },
            "updatedReplicas": 1,
            "currentRevision": if done { "r2" } else { "r1" },
            "updateRevision": "r2",
        },
    }))
    .expect("statefulset")
}

#[test]
fn a_federations_work_waits_while_its_superlink_rolls_out() {
    // A Federation edit that restarts the SuperLink and changes a pool: each cluster keeps the
    // Federation's old work until the controller has applied the spec and the SuperLink
    // StatefulSet has rolled out and is ready (the same rule as the standalone hub's probe).
    let with = |replicas: u32, generation: i64, observed: i64| {
        let mut fed = federation(&format!(
            "[{{name: a, replicas: {replicas}, images: {{}}}}]"
        ));
        fed.metadata.generation = Some(generation);
        fed.status = Some(flower_addon_crds::FederationStatus {
            observed_generation: Some(observed),
            ..Default::default()
        });
        fed
    };
    let replicas = |work: &InMemoryWorkSource| -> String {
        let snap = work.snapshot("s1");
        snap.federations[0].pools[0].spec_json.clone()
    };
    let work = InMemoryWorkSource::new();
    let mut state = fresh_state();
    let both = decision("both", &["s1"]);
    let clusters = || vec![managed("s1", &[])];
    let ends = state.recompute(
        &stores_with(
            vec![with(2, 1, 1)],
            vec![both.clone()],
            clusters(),
            vec![superlink_sts(true)],
        ),
        &work,
    );
    assert_eq!(ends, None, "nothing held");
    let before = replicas(&work);
    assert!(before.contains("\"replicas\":2"), "{before}");

    // Edited: the controller has not applied generation 2 yet.
    let ends = state.recompute(
        &stores_with(
            vec![with(3, 2, 1)],
            vec![both.clone()],
            clusters(),
            vec![superlink_sts(true)],
        ),
        &work,
    );
    assert!(ends.is_some(), "a hold runs out at some point");
    assert_eq!(
        replicas(&work),
        before,
        "held: the controller has not applied the spec"
    );

    // Applied; the SuperLink StatefulSet rolls.
    state.recompute(
        &stores_with(
            vec![with(3, 2, 2)],
            vec![both.clone()],
            clusters(),
            vec![superlink_sts(false)],
        ),
        &work,
    );
    assert_eq!(
        replicas(&work),
        before,
        "held: the SuperLink is rolling out"
    );

    // Rolled out and ready: the new work goes out.
    let ends = state.recompute(
        &stores_with(
            vec![with(3, 2, 2)],
            vec![both],
            clusters(),
            vec![superlink_sts(true)],
        ),
        &work,
    );
    assert_eq!(ends, None);
    assert!(
        replicas(&work).contains("\"replicas\":3"),
        "{}",
        replicas(&work)
    );
}

#[tokio::test(start_paused = true)]
async fn a_hold_runs_out_after_hold_max() {
    // A SuperLink that never rolls out must not freeze its clusters' work for ever.
    let with = |replicas: u32| {
        let mut fed = federation(&format!(
            "[{{name: a, replicas: {replicas}, images: {{}}}}]"
        ));
        // A new spec is a new generation, applied by the controller.
        fed.metadata.generation = Some(i64::from(replicas));
        fed.status = Some(flower_addon_crds::FederationStatus {
            observed_generation: Some(i64::from(replicas)),
            ..Default::default()
        });
        fed
    };
    let work = InMemoryWorkSource::new();
    let mut state = fresh_state();
    let both = decision("both", &["s1"]);
    state.recompute(
        &stores_with(
            vec![with(2)],
            vec![both.clone()],
            vec![managed("s1", &[])],
            vec![superlink_sts(true)],
        ),
        &work,
    );
    let rolling = stores_with(
        vec![with(3)],
        vec![both],
        vec![managed("s1", &[])],
        vec![superlink_sts(false)],
    );
    let ends = state.recompute(&rolling, &work).expect("held");
    assert!(
        work.snapshot("s1").federations[0].pools[0]
            .spec_json
            .contains("\"replicas\":2")
    );
    tokio::time::advance(HOLD_MAX).await;
    assert!(tokio::time::Instant::now() >= ends);
    assert_eq!(state.recompute(&rolling, &work), None, "the hold ran out");
    assert!(
        work.snapshot("s1").federations[0].pools[0]
            .spec_json
            .contains("\"replicas\":3")
    );
}

/// The hub's default pod policy.
fn hub_policy() -> flower_addon_crds::policy::PodPolicy {
    flower_addon_crds::policy::PodPolicy::new(flower_addon_crds::policy::Admin::Hub)
}

use super::*;

fn cluster(name: &str, labels: &[(&str, &str)]) -> ClusterView {
    ClusterView {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        accepted: true,
        ..Default::default()
    }
}

fn label_pred(k: &str, v: &str) -> PredicateView {
    PredicateView {
        label_selector: Some(LabelSelector {
            match_labels: Some([(k.to_string(), v.to_string())].into()),
            match_expressions: None,
        }),
        claim_selector: vec![],
    }
}

fn unreachable_taint(added: i64) -> TaintView {
    TaintView {
        key: TAINT_UNREACHABLE.into(),
        value: String::new(),
        effect: TaintEffect::NoSelect,
        time_added: Some(added),
    }
}

#[test]
fn predicates_are_ored_and_selectors_anded() {
    // A cluster is selected when any predicate matches, and a predicate needs both selectors.
    let mut a = cluster("a", &[("env", "prod")]);
    a.claims.insert("region".into(), "eu".into());
    let b = cluster("b", &[("env", "dev")]);
    let c = cluster("c", &[("env", "prod")]);
    let policy = PlacementPolicy {
        predicates: vec![
            PredicateView {
                claim_selector: vec![LabelSelectorRequirement {
                    key: "region".into(),
                    operator: "In".into(),
                    values: Some(vec!["eu".into()]),
                }],
                ..label_pred("env", "prod")
            },
            label_pred("env", "dev"),
        ],
        ..every_cluster()
    };
    let out = evaluate(&policy, &[a, b, c], &BTreeSet::new(), 0);
    assert_eq!(out.selected, vec!["a", "b"]);
    assert_eq!(out.excluded["c"], Exclusion::PredicatesNotMatched);
}

#[test]
fn unaccepted_clusters_are_never_selected() {
    // Registration gates placement: a pending cluster gets no work.
    let mut a = cluster("a", &[]);
    a.accepted = false;
    let out = evaluate(&every_cluster(), &[a], &BTreeSet::new(), 0);
    assert!(out.selected.is_empty());
    assert!(!out.satisfied);
    assert_eq!(out.excluded["a"], Exclusion::NotAccepted);
}

fn policy_yaml(yaml: &str) -> PlacementPolicy {
    let spec: flower_addon_crds::PlacementSpec =
        serde_saphyr::from_str(yaml).expect("test placement spec");
    PlacementPolicy {
        cluster_sets: every_cluster().cluster_sets,
        ..policy_from_spec(&spec)
    }
}

/// A policy whose cluster set holds every cluster (these tests are about what happens inside
/// the sets; `clustersets_*` tests are about the sets).
fn every_cluster() -> PlacementPolicy {
    PlacementPolicy {
        cluster_sets: vec![crate::core::clustersets::ClusterSetView::every_cluster(
            "global",
        )],
        ..PlacementPolicy::default()
    }
}

fn sized(name: &str, cpu_millis: i64, memory: i64, others: u32) -> ClusterView {
    ClusterView {
        allocatable_cpu_millis: Some(cpu_millis),
        allocatable_memory_bytes: Some(memory),
        other_decisions: others,
        ..cluster(name, &[])
    }
}

#[test]
fn resource_prioritizers_pick_the_largest_clusters() {
    // Exact ResourceAllocatableCPU: the two clusters with most CPU win, whatever their names;
    // memory picks by memory; a cluster that reports nothing ranks last.
    let clusters = [
        sized("a", 2000, 64 << 30, 0),
        sized("b", 16000, 8 << 30, 0),
        sized("c", 8000, 32 << 30, 0),
        cluster("d", &[]),
    ];
    let cpu = policy_yaml(
        "numberOfClusters: 2\nprioritizerPolicy:\n  mode: Exact\n  configurations:\n    - scoreCoordinate: {type: BuiltIn, builtIn: ResourceAllocatableCPU}\n",
    );
    assert_eq!(
        evaluate(&cpu, &clusters, &BTreeSet::new(), 0).selected,
        ["b", "c"]
    );
    let memory = policy_yaml(
        "numberOfClusters: 2\nprioritizerPolicy:\n  mode: Exact\n  configurations:\n    - scoreCoordinate: {type: BuiltIn, builtIn: ResourceAllocatableMemory}\n",
    );
    assert_eq!(
        evaluate(&memory, &clusters, &BTreeSet::new(), 0).selected,
        ["a", "c"]
    );
    // Without a prioritizer policy the defaults (Balance + Steady) rank equal clusters by
    // name: the resource scores change the choice.
    let plain = policy_yaml("numberOfClusters: 2\n");
    assert_eq!(
        evaluate(&plain, &clusters, &BTreeSet::new(), 0).selected,
        ["a", "b"]
    );
}

#[test]
fn additive_weights_trade_steadiness_against_resources() {
    // Additive keeps Steady (weight 2, +200) and Balance; a CPU weight of 3 (+600 against
    // -600) outweighs Steady and moves the selection to the bigger cluster, 0 does not.
    let clusters = [sized("a", 1000, 1, 0), sized("b", 9000, 1, 0)];
    let previous: BTreeSet<String> = ["a".to_string()].into();
    let heavy = policy_yaml(
        "numberOfClusters: 1\nprioritizerPolicy:\n  configurations:\n    - scoreCoordinate: {builtIn: ResourceAllocatableCPU}\n      weight: 3\n",
    );
    assert_eq!(evaluate(&heavy, &clusters, &previous, 0).selected, ["b"]);
    let off = policy_yaml(
        "numberOfClusters: 1\nprioritizerPolicy:\n  configurations:\n    - scoreCoordinate: {builtIn: ResourceAllocatableCPU}\n      weight: 0\n",
    );
    assert_eq!(evaluate(&off, &clusters, &previous, 0).selected, ["a"]);
}

#[test]
fn balance_alone_never_displaces_a_selected_cluster_by_default() {
    // No policy: a new cluster that other Placements use less does not take the place of the
    // selected one (Steady outweighs Balance), but an empty place goes to it.
    let clusters = [sized("a", 1, 1, 4), sized("b", 1, 1, 0)];
    let policy = policy_yaml("numberOfClusters: 1\n");
    let kept: BTreeSet<String> = ["a".to_string()].into();
    assert_eq!(evaluate(&policy, &clusters, &kept, 0).selected, ["a"]);
    assert_eq!(
        evaluate(&policy, &clusters, &BTreeSet::new(), 0).selected,
        ["b"]
    );
}

#[test]
fn balance_prefers_clusters_other_placements_use_less() {
    // Exact Balance: the cluster with fewer decisions of other Placements is picked.
    let clusters = [
        sized("a", 1, 1, 5),
        sized("b", 1, 1, 1),
        sized("c", 1, 1, 3),
    ];
    let balance = policy_yaml(
        "numberOfClusters: 1\nprioritizerPolicy:\n  mode: Exact\n  configurations:\n    - scoreCoordinate: {builtIn: Balance}\n",
    );
    assert_eq!(
        evaluate(&balance, &clusters, &BTreeSet::new(), 0).selected,
        ["b"]
    );
}

#[test]
fn number_of_clusters_caps_and_steady_keeps_previous() {
    // Steady: an already-selected cluster keeps its place even when a lower name appears.
    let clusters = [cluster("a", &[]), cluster("b", &[]), cluster("c", &[])];
    let policy = PlacementPolicy {
        number_of_clusters: Some(1),
        ..every_cluster()
    };
    let first = evaluate(&policy, &clusters, &BTreeSet::new(), 0);
    assert_eq!(first.selected, vec!["a"]);
    assert!(first.satisfied);
    let prev: BTreeSet<String> = ["c".to_string()].into();
    let again = evaluate(&policy, &clusters, &prev, 0);
    assert_eq!(again.selected, vec!["c"]);
    assert_eq!(again.excluded["a"], Exclusion::NumberOfClustersReached);
}

#[test]
fn untolerated_taint_drops_cluster_and_room_goes_to_another() {
    // An unreachable cluster leaves the selection and numberOfClusters room is refilled.
    let mut a = cluster("a", &[]);
    a.taints.push(unreachable_taint(100));
    let clusters = [a, cluster("b", &[])];
    let policy = PlacementPolicy {
        number_of_clusters: Some(1),
        ..every_cluster()
    };
    let prev: BTreeSet<String> = ["a".to_string()].into();
    let out = evaluate(&policy, &clusters, &prev, 200);
    assert_eq!(out.selected, vec!["b"]);
    assert!(matches!(out.excluded["a"], Exclusion::Tainted { .. }));
}

#[test]
fn toleration_seconds_count_from_time_added() {
    // tolerationSeconds keeps the cluster until the window closes, then drops it.
    let mut a = cluster("a", &[]);
    a.taints.push(unreachable_taint(1000));
    let policy = PlacementPolicy {
        tolerations: vec![TolerationView {
            key: TAINT_UNREACHABLE.into(),
            operator: "Exists".into(),
            toleration_seconds: Some(300),
            ..Default::default()
        }],
        ..every_cluster()
    };
    let within = evaluate(&policy, std::slice::from_ref(&a), &BTreeSet::new(), 1100);
    assert_eq!(within.selected, vec!["a"]);
    assert_eq!(within.requeue_after_secs, Some(200));
    let after = evaluate(&policy, &[a], &BTreeSet::new(), 1300);
    assert!(after.selected.is_empty());
}

#[test]
fn equal_toleration_needs_the_same_value_and_effect() {
    // A toleration for another value or effect does not cover the taint.
    let mut a = cluster("a", &[]);
    a.taints.push(TaintView {
        key: "gpu".into(),
        value: "busy".into(),
        effect: TaintEffect::NoSelect,
        time_added: None,
    });
    let tol = |value: &str, effect| TolerationView {
        key: "gpu".into(),
        operator: "Equal".into(),
        value: value.into(),
        effect,
        toleration_seconds: None,
    };
    let run = |t: TolerationView| {
        let policy = PlacementPolicy {
            tolerations: vec![t],
            ..every_cluster()
        };
        evaluate(&policy, std::slice::from_ref(&a), &BTreeSet::new(), 0).selected
    };
    assert!(run(tol("idle", None)).is_empty());
    assert!(run(tol("busy", Some(TaintEffect::PreferNoSelect))).is_empty());
    assert_eq!(run(tol("busy", Some(TaintEffect::NoSelect))), vec!["a"]);
}

#[test]
fn no_select_if_new_keeps_but_never_adds() {
    // NoSelectIfNew protects running work but stops new placements.
    let mut a = cluster("a", &[]);
    a.taints.push(TaintView {
        key: "drain".into(),
        value: String::new(),
        effect: TaintEffect::NoSelectIfNew,
        time_added: None,
    });
    let fresh = evaluate(
        &every_cluster(),
        std::slice::from_ref(&a),
        &BTreeSet::new(),
        0,
    );
    assert!(fresh.selected.is_empty());
    let prev: BTreeSet<String> = ["a".to_string()].into();
    let kept = evaluate(&every_cluster(), &[a], &prev, 0);
    assert_eq!(kept.selected, vec!["a"]);
}

#[test]
fn prefer_no_select_is_taken_last() {
    // PreferNoSelect clusters fill the selection only when nothing else qualifies.
    let mut a = cluster("a", &[]);
    a.taints.push(TaintView {
        key: "slow".into(),
        value: String::new(),
        effect: TaintEffect::PreferNoSelect,
        time_added: None,
    });
    let policy = PlacementPolicy {
        number_of_clusters: Some(1),
        ..every_cluster()
    };
    let out = evaluate(
        &policy,
        &[a.clone(), cluster("b", &[])],
        &BTreeSet::new(),
        0,
    );
    assert_eq!(out.selected, vec!["b"]);
    let only = evaluate(&policy, &[a], &BTreeSet::new(), 0);
    assert_eq!(only.selected, vec!["a"]);
}

#[test]
fn selector_operators() {
    // In, NotIn, Exists and DoesNotExist follow Kubernetes label-selector semantics.
    let labels: BTreeMap<String, String> = [("a".to_string(), "1".to_string())].into();
    let req = |key: &str, op: &str, values: &[&str]| LabelSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: Some(values.iter().map(|s| s.to_string()).collect()),
    };
    assert!(requirement_matches(&req("a", "In", &["1", "2"]), &labels));
    assert!(!requirement_matches(&req("a", "NotIn", &["1"]), &labels));
    assert!(requirement_matches(&req("b", "NotIn", &["1"]), &labels));
    assert!(requirement_matches(&req("a", "Exists", &[]), &labels));
    assert!(requirement_matches(&req("b", "DoesNotExist", &[]), &labels));
    assert!(!requirement_matches(&req("a", "Bogus", &[]), &labels));
}

#[test]
fn decisions_paginate_at_100() {
    // OCM consumers expect at most 100 decisions per PlacementDecision.
    let names: Vec<String> = (0..250).map(|i| format!("c{i:03}")).collect();
    let pages = paginate("p", &names);
    assert_eq!(pages.len(), 3);
    assert_eq!(pages[0].0, "p-decision-1");
    assert_eq!(pages[0].1.len(), 100);
    assert_eq!(pages[2].1.len(), 50);
}

#[test]
fn clustersets_clusters_outside_the_usable_sets_are_neither_selected_nor_named() {
    use crate::core::clustersets::{ClusterSetView, ScopeProblem, SetSelector};
    let label = flower_addon_crds::CLUSTERSET_LABEL;
    let red = cluster("red-1", &[(label, "red")]);
    let blue = cluster("blue-1", &[(label, "blue")]);
    let red_set = ClusterSetView {
        name: "red".into(),
        selector: SetSelector::Exclusive,
    };
    let policy = PlacementPolicy {
        cluster_sets: vec![red_set.clone()],
        ..PlacementPolicy::default()
    };
    let out = evaluate(&policy, &[red.clone(), blue.clone()], &BTreeSet::new(), 0);
    assert_eq!(out.selected, ["red-1"]);
    assert!(out.excluded.is_empty(), "{:?}", out.excluded);
    assert_eq!(out.scope, None);
    // A cluster selected before and moved out of the set is dropped.
    let prev: BTreeSet<String> = ["blue-1".to_string()].into();
    assert_eq!(
        evaluate(&policy, &[red.clone(), blue.clone()], &prev, 0).selected,
        ["red-1"]
    );

    // No usable set: nothing selected, nothing named, the reason says why.
    let none = evaluate(
        &PlacementPolicy::default(),
        &[red.clone(), blue.clone()],
        &BTreeSet::new(),
        0,
    );
    assert!(none.selected.is_empty() && none.excluded.is_empty() && !none.satisfied);
    assert_eq!(none.scope, Some(ScopeProblem::NoBindings));

    // A usable set without clusters.
    let empty = evaluate(
        &PlacementPolicy {
            cluster_sets: vec![ClusterSetView {
                name: "green".into(),
                selector: SetSelector::Exclusive,
            }],
            ..PlacementPolicy::default()
        },
        &[red, blue],
        &BTreeSet::new(),
        0,
    );
    assert!(empty.selected.is_empty());
    assert_eq!(empty.scope, Some(ScopeProblem::AllSetsEmpty));
}

#[test]
fn clustersets_placement_policy_uses_the_namespace_bindings_and_spec_cluster_sets() {
    use crate::core::clustersets::ClusterSetView;
    let placement: flower_addon_crds::Placement = serde_saphyr::from_str(
        "apiVersion: flower-addon.io/v1alpha1\nkind: Placement\nmetadata: {name: p, namespace: team-a}\nspec: {clusterSets: [red]}\n",
    )
    .expect("placement");
    let sets = [
        ClusterSetView::every_cluster("red"),
        ClusterSetView::every_cluster("blue"),
    ];
    let bindings = [
        ("team-a".to_string(), "red".to_string()),
        ("team-a".to_string(), "blue".to_string()),
    ];
    let policy = placement_policy(&placement, &sets, &bindings);
    let names: Vec<&str> = policy
        .cluster_sets
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names, ["red"]);
    let other_ns = [("team-b".to_string(), "red".to_string())];
    assert!(
        placement_policy(&placement, &sets, &other_ns)
            .cluster_sets
            .is_empty()
    );
}

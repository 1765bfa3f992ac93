use super::*;
use flower_addon_crds::ClusterStatus;

fn fed() -> Federation {
    let mut f: Federation = serde_saphyr::from_str(
        r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {name: f, namespace: team, generation: 3}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  superlink: {image: "flwr/superlink:1.42.0"}
  supernodes: {image: "flwr/supernode:1.42.0", pools: [{name: a, replicas: 2, images: {}}]}
"#,
    )
    .unwrap();
    f.status = None;
    f
}

fn w(name: &str, desired: i32, ready: i32) -> WorkloadReadiness {
    WorkloadReadiness {
        name: name.into(),
        kind: "StatefulSet",
        desired,
        ready,
        stale: false,
    }
}

fn find<'a>(s: &'a FederationStatus, t: &str) -> &'a Condition {
    s.conditions.iter().find(|c| c.type_ == t).unwrap()
}

fn at(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
}

/// A Federation without placementRef whose pools in the hub's own cluster reported `pools`.
fn local(pools: &[(&str, i32, i32)]) -> Federation {
    let mut f = fed();
    f.status = Some(FederationStatus {
        clusters: vec![reported(crate::core::HUB_CLUSTER, pools)],
        ..FederationStatus::default()
    });
    f
}

#[test]
fn not_ready_names_what_is_missing() {
    // Users see which pool or the SuperLink holds Ready back, with counts: the hub's own pools
    // are summed from their cluster entry like a spoke's.
    let outcome = Outcome::Applied {
        superlink: w("superlink", 1, 1),
        external: None,
    };
    let s = federation_status(
        &local(&[("a", 2, 1)]),
        &outcome,
        &PlacementState::NotReferenced,
        &at(10),
    );
    assert_eq!(s.supernodes.as_deref(), Some("1/2"));
    assert_eq!(s.selected_clusters, 1);
    assert_eq!(s.observed_generation, Some(3));
    assert_eq!(find(&s, "Ready").status, "False");
    assert!(
        find(&s, "Ready")
            .message
            .contains("cluster local-cluster: pool a: 1/2 ready"),
        "{:?}",
        find(&s, "Ready")
    );
    assert_eq!(s.pools[0].kind.as_deref(), Some("StatefulSet"));
    assert_eq!((s.pools[0].desired, s.pools[0].ready), (2, 1));
    assert_eq!(find(&s, "Reconciling").status, "True");
    // Control is on the SuperLink pod's loopback: no in-cluster address to show.
    assert_eq!(s.endpoints.unwrap().superlink_service, None);
    let mut exposed = local(&[("a", 2, 1)]);
    exposed.spec.superlink.service.expose_control = true;
    let s = federation_status(&exposed, &outcome, &PlacementState::NotReferenced, &at(10));
    assert_eq!(
        s.endpoints.unwrap().superlink_service.as_deref(),
        Some("f-superlink-control.team.svc:9093")
    );
}

#[test]
fn unchanged_facts_give_an_identical_status() {
    // The controller writes status only on change, so it never loops on its own writes.
    let outcome = Outcome::Applied {
        superlink: w("superlink", 1, 1),
        external: None,
    };
    let mut f = local(&[("a", 2, 2)]);
    let first = federation_status(&f, &outcome, &PlacementState::NotReferenced, &at(10));
    assert_eq!(find(&first, "Ready").status, "True");
    assert!(
        first.clusters.is_empty(),
        "status.clusters is not the controller's"
    );
    let clusters = f.status.take().unwrap().clusters;
    f.status = Some(FederationStatus {
        clusters,
        ..first.clone()
    });
    assert_eq!(
        federation_status(&f, &outcome, &PlacementState::NotReferenced, &at(20)),
        first
    );
}

#[test]
fn invalid_spec_is_degraded_with_the_field_path() {
    // The message names the field to fix; readiness of what runs is kept.
    let outcome = Outcome::Invalid(vec![("spec.version".into(), "not set".into())]);
    let s = federation_status(&fed(), &outcome, &PlacementState::NotReferenced, &at(10));
    assert_eq!(find(&s, "Degraded").status, "True");
    assert_eq!(find(&s, "Degraded").message, "spec.version: not set");
    assert_eq!(find(&s, "Ready").status, "False");
}

#[test]
fn a_placement_ref_mirrors_the_placement_and_a_missing_one_holds_ready_back() {
    // Invariant: no placementRef → no PlacementSatisfied; a missing Placement → False naming
    // it and the fix, and Ready=False says so; an evaluated one is mirrored; an unevaluated
    // one is Unknown.
    let outcome = Outcome::Applied {
        superlink: w("superlink", 1, 1),
        external: None,
    };
    let plain = federation_status(&fed(), &outcome, &PlacementState::NotReferenced, &at(10));
    assert!(
        plain
            .conditions
            .iter()
            .all(|c| c.type_ != "PlacementSatisfied")
    );

    let missing = PlacementState::of("sites", None);
    let s = federation_status(&fed(), &outcome, &missing, &at(10));
    let c = find(&s, "PlacementSatisfied");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "PlacementNotFound")
    );
    assert!(
        c.message.contains("Placement sites not found"),
        "{}",
        c.message
    );
    assert!(
        c.message.contains("spec.placementRef.name"),
        "{}",
        c.message
    );
    assert_eq!(find(&s, "Ready").status, "False");
    assert!(
        find(&s, "Ready")
            .message
            .contains("Placement sites not found")
    );

    let mut placement: flower_addon_crds::Placement = serde_saphyr::from_str(
        "apiVersion: flower-addon.io/v1alpha1\nkind: Placement\nmetadata: {name: sites, namespace: team}\nspec: {}\n",
    )
    .unwrap();
    let pending = PlacementState::of("sites", Some(&placement));
    let s = federation_status(&fed(), &outcome, &pending, &at(10));
    assert_eq!(find(&s, "PlacementSatisfied").status, "Unknown");

    placement.status = Some(flower_addon_crds::PlacementStatus {
        conditions: vec![cond(
            "PlacementSatisfied",
            "False",
            "NotAllDecisionsScheduled",
            "1 of 3 clusters selected",
        )],
        ..Default::default()
    });
    let s = federation_status(
        &fed(),
        &outcome,
        &PlacementState::of("sites", Some(&placement)),
        &at(10),
    );
    let c = find(&s, "PlacementSatisfied");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        (
            "False",
            "NotAllDecisionsScheduled",
            "Placement sites: 1 of 3 clusters selected"
        )
    );
}

fn placed(clusters: Vec<ClusterStatus>) -> Federation {
    let mut f = fed();
    f.spec.placement_ref = Some(flower_addon_crds::PlacementRef::named("p"));
    f.status = Some(FederationStatus {
        clusters,
        ..FederationStatus::default()
    });
    f
}

fn reported(name: &str, pools: &[(&str, i32, i32)]) -> ClusterStatus {
    ClusterStatus {
        name: name.into(),
        connected: true,
        pools: pools
            .iter()
            .map(|(p, desired, ready)| PoolStatus {
                name: (*p).into(),
                desired: *desired,
                ready: *ready,
                ..PoolStatus::default()
            })
            .collect(),
        ..ClusterStatus::default()
    }
}

#[test]
fn placed_federations_show_derived_endpoints_and_pools_summed_over_clusters() {
    // A placed Federation's status has the Fleet and Control addresses the hub derived and
    // one entry per pool summed over the clusters, like a hub-local one.
    let f = placed(vec![
        reported("s1", &[("a", 2, 2)]),
        reported("s2", &[("a", 2, 1)]),
    ]);
    let outcome = Outcome::Applied {
        superlink: w("superlink", 1, 1),
        external: Some(Ok(ExternalEndpoints {
            fleet: "198.18.0.1:30092".into(),
            control: Some("198.18.0.1:30093".into()),
        })),
    };
    let s = federation_status(&f, &outcome, &PlacementState::NotReferenced, &at(10));
    let endpoints = s.endpoints.clone().unwrap();
    assert_eq!(endpoints.fleet.as_deref(), Some("198.18.0.1:30092"));
    assert_eq!(endpoints.control.as_deref(), Some("198.18.0.1:30093"));
    assert_eq!(s.pools.len(), 1);
    assert_eq!(
        (
            s.pools[0].name.as_str(),
            s.pools[0].desired,
            s.pools[0].ready
        ),
        ("a", 4, 3)
    );
    assert_eq!(s.pools[0].kind.as_deref(), Some("StatefulSet"));
    assert_eq!(s.supernodes.as_deref(), Some("3/4"));
}

#[test]
fn an_unknown_external_address_holds_ready_back_and_keeps_the_old_one() {
    // While the address is pending, Ready says what it waits for and the last known
    // endpoints stay (SuperNodes still dial them); a ClusterIP Service is Degraded.
    let mut f = placed(vec![reported("s1", &[("a", 2, 2)])]);
    f.status.as_mut().unwrap().endpoints = Some(FederationEndpoints {
        fleet: Some("198.18.0.1:30092".into()),
        ..FederationEndpoints::default()
    });
    let pending = Outcome::Applied {
        superlink: w("superlink", 1, 1),
        external: Some(Err(ExternalAddressError::Pending("a node port".into()))),
    };
    let s = federation_status(&f, &pending, &PlacementState::NotReferenced, &at(10));
    assert_eq!(find(&s, "Ready").status, "False");
    assert!(
        find(&s, "Ready")
            .message
            .contains("waiting for a node port")
    );
    assert_eq!(
        s.endpoints.unwrap().fleet.as_deref(),
        Some("198.18.0.1:30092")
    );
    let hidden = Outcome::Applied {
        superlink: w("superlink", 1, 1),
        external: Some(Err(ExternalAddressError::NotExposed)),
    };
    let s = federation_status(&f, &hidden, &PlacementState::NotReferenced, &at(10));
    assert_eq!(find(&s, "Degraded").status, "True");
    assert!(
        find(&s, "Degraded")
            .message
            .starts_with("spec.superlink.externalAddress: required")
    );
}

#[test]
fn a_release_newer_than_the_verified_ones_is_a_warning_not_an_error() {
    // spec.version 1.50.0 renders with the newest dialect: Ready as usual, plus the warning
    // condition naming the field; a verified release has no such condition.
    let outcome = Outcome::Applied {
        superlink: w("superlink", 1, 1),
        external: None,
    };
    let mut f = local(&[("a", 2, 2)]);
    let verified = federation_status(&f, &outcome, &PlacementState::NotReferenced, &at(10));
    assert!(
        !verified
            .conditions
            .iter()
            .any(|c| c.type_ == VERSION_CONDITION),
        "{:?}",
        verified.conditions
    );
    f.spec.version = Some("1.50.0".into());
    let s = federation_status(&f, &outcome, &PlacementState::NotReferenced, &at(10));
    assert_eq!(find(&s, "Ready").status, "True");
    assert_eq!(find(&s, "Degraded").status, "False");
    let warning = find(&s, VERSION_CONDITION);
    assert_eq!(
        (warning.status.as_str(), warning.reason.as_str()),
        ("False", "NewerThanVerified")
    );
    assert!(
        warning
            .message
            .starts_with("spec.version: Flower 1.50.0 is newer"),
        "{}",
        warning.message
    );
}

#[test]
fn over_thousands_of_clusters_the_totals_count_and_the_message_stays_short() {
    // A Federation over thousands of clusters must fit in etcd: `status.clusters` lists at most 100
    // clusters; the totals the work source writes beside them (`clusterTotals`) are what the
    // SuperNode counts, the selected clusters and Ready come from, and Ready's message names a few
    // problems and counts the rest.
    let listed: Vec<ClusterStatus> = (0..100)
        .map(|i| {
            let mut c = reported(&format!("s{i:05}"), &[("a", 2, if i < 30 { 0 } else { 2 })]);
            if i < 30 {
                c.message = Some("0/2 SuperNodes ready".into());
            }
            c
        })
        .collect();
    let mut f = placed(listed);
    f.status.as_mut().unwrap().cluster_totals = Some(flower_addon_crds::ClusterTotals {
        selected: 10_000,
        connected: 10_000,
        with_problems: 500,
        listed: 100,
        online: None,
        pools: vec![flower_addon_crds::PoolTotal {
            name: "a".into(),
            desired: 20_000,
            ready: 19_000,
        }],
    });
    let outcome = Outcome::Applied {
        superlink: w("superlink", 1, 1),
        external: Some(Ok(ExternalEndpoints {
            fleet: "198.18.0.1:30092".into(),
            control: None,
        })),
    };
    let s = federation_status(&f, &outcome, &PlacementState::NotReferenced, &at(10));
    assert_eq!(s.selected_clusters, 10_000);
    assert_eq!(s.supernodes.as_deref(), Some("19000/20000"));
    assert_eq!((s.pools[0].desired, s.pools[0].ready), (20_000, 19_000));
    let ready = find(&s, "Ready");
    assert_eq!(ready.status, "False");
    assert!(
        ready
            .message
            .starts_with("cluster s00000: 0/2 SuperNodes ready; cluster s00001"),
        "{}",
        ready.message
    );
    assert!(
        ready.message.ends_with("; and 490 more"),
        "30 listed problems, 10 named, 20 + 470 unlisted counted: {}",
        ready.message
    );
    assert!(ready.message.len() < 1000, "{}", ready.message);
    assert!(
        s.clusters.is_empty() && s.cluster_totals.is_none(),
        "the work source's fields"
    );
}

#[test]
fn an_ocm_placement_on_a_hub_without_ocm_says_so_and_holds_ready_back() {
    // Invariant: a placementRef naming an OCM Placement where OCM is not installed is not a
    // silent "placed nowhere": PlacementSatisfied=False names OCM and both fixes, Ready=False.
    let outcome = Outcome::Applied {
        superlink: w("superlink", 1, 1),
        external: None,
    };
    let state = PlacementState::OcmNotInstalled {
        name: "sites".into(),
    };
    let s = federation_status(&fed(), &outcome, &state, &at(10));
    let c = find(&s, "PlacementSatisfied");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "OcmNotInstalled")
    );
    for needle in [
        "Open Cluster Management Placement sites",
        "install OCM",
        "spec.placementRef.apiGroup",
    ] {
        assert!(c.message.contains(needle), "{needle}: {}", c.message);
    }
    assert_eq!(find(&s, "Ready").status, "False");
}

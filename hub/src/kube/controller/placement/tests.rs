use super::*;
use flower_addon_crds::{ClusterClaim, ManagedClusterSpec, ManagedClusterStatus, Taint};

#[test]
fn cluster_view_takes_the_admins_labels_and_the_agents_claims() {
    // Invariant: only metadata.labels (the admin's) are labels; labels an older hub kept from the
    // agent in status.labels do not select anything; claims, acceptance and taints (with timeAdded)
    // carry over.
    let mut mc = ManagedCluster::new(
        "c1",
        ManagedClusterSpec {
            hub_accepts_client: true,
            taints: vec![Taint {
                key: "k".into(),
                value: None,
                effect: flower_addon_crds::TaintEffect::NoSelect,
                time_added: Some(time_at(100)),
            }],
            ..Default::default()
        },
    );
    mc.metadata.labels = Some([("zone".to_string(), "hub".to_string())].into());
    mc.status = Some(ManagedClusterStatus {
        labels: [
            ("zone".to_string(), "agent".to_string()),
            ("gpu".to_string(), "yes".to_string()),
        ]
        .into(),
        cluster_claims: vec![ClusterClaim {
            name: "region".into(),
            value: "eu".into(),
        }],
        ..Default::default()
    });
    let v = cluster_view(&mc);
    assert_eq!(v.labels.get("zone").map(String::as_str), Some("hub"));
    assert_eq!(
        v.labels.get("gpu"),
        None,
        "an agent-asserted label selected"
    );
    assert_eq!(v.claims.get("region").map(String::as_str), Some("eu"));
    assert!(v.accepted);
    assert_eq!(v.taints[0].time_added, Some(100));
    assert_eq!(v.taints[0].effect, TaintEffect::NoSelect);
}

#[test]
fn unchanged_condition_keeps_its_transition_time() {
    // Invariant: re-evaluating with the same result does not move lastTransitionTime, so the
    // status is not rewritten on every reconcile.
    let mut conditions = Vec::new();
    set_condition(&mut conditions, "A", "True", "R", "m", Some(1), 10);
    set_condition(&mut conditions, "A", "True", "R", "m", Some(1), 20);
    assert_eq!(conditions[0].last_transition_time, time_at(10));
    set_condition(&mut conditions, "A", "False", "R", "m", Some(1), 30);
    assert_eq!(conditions[0].last_transition_time, time_at(30));
}

#[test]
fn only_changes_that_matter_to_placement_re_evaluate_placements() {
    // Invariant: a heartbeat (status time, conditions) triggers nothing; a label, taint or
    // acceptance change, a new cluster and a deleted one each trigger once; a re-list
    // triggers once at its end.
    let mut mc = ManagedCluster::new(
        "c1",
        ManagedClusterSpec {
            hub_accepts_client: true,
            ..Default::default()
        },
    );
    let mut views = ClusterViews::default();
    assert!(
        views.on_event(&watcher::Event::Apply(mc.clone())),
        "new cluster"
    );
    assert!(
        !views.on_event(&watcher::Event::Apply(mc.clone())),
        "same view"
    );
    mc.status = Some(ManagedClusterStatus {
        last_heartbeat: Some(time_at(200)),
        ..Default::default()
    });
    assert!(
        !views.on_event(&watcher::Event::Apply(mc.clone())),
        "heartbeat only"
    );
    mc.metadata.labels = Some([("env".to_string(), "prod".to_string())].into());
    assert!(views.on_event(&watcher::Event::Apply(mc.clone())), "label");
    mc.spec.taints.push(Taint {
        key: "k".into(),
        value: None,
        effect: flower_addon_crds::TaintEffect::NoSelect,
        time_added: Some(time_at(300)),
    });
    assert!(views.on_event(&watcher::Event::Apply(mc.clone())), "taint");
    mc.spec.hub_accepts_client = false;
    assert!(
        views.on_event(&watcher::Event::Apply(mc.clone())),
        "revoked"
    );
    assert!(
        views.on_event(&watcher::Event::Delete(mc.clone())),
        "deleted"
    );
    assert!(
        !views.on_event(&watcher::Event::Delete(mc.clone())),
        "unknown"
    );
    assert!(!views.on_event(&watcher::Event::Init));
    assert!(!views.on_event(&watcher::Event::InitApply(mc.clone())));
    assert!(views.on_event(&watcher::Event::InitDone), "re-list done");
    assert!(
        !views.on_event(&watcher::Event::Apply(mc)),
        "known after the re-list"
    );
}

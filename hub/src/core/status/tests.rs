use super::*;

fn entry(name: &str, problem: bool) -> ClusterStatus {
    ClusterStatus {
        name: name.into(),
        connected: !problem,
        message: problem.then(|| "agent not connected".to_owned()),
        ..Default::default()
    }
}

#[test]
fn a_status_lists_a_bounded_number_of_clusters_the_troubled_ones_first() {
    // 10,000 entries made the Federation status larger than etcd accepts.
    let few: Vec<ClusterStatus> = (0..3).map(|i| entry(&format!("c{i}"), i == 1)).collect();
    assert_eq!(listed_clusters(few.clone()), few, "all of them, in order");
    let many: Vec<ClusterStatus> = (0..10_000)
        .map(|i| entry(&format!("c{i:05}"), i % 1000 == 999))
        .collect();
    let listed = listed_clusters(many.clone());
    assert_eq!(listed.len(), LISTED_CLUSTERS);
    let troubled: Vec<&str> = listed
        .iter()
        .filter(|c| c.message.is_some())
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(troubled.len(), 10, "every troubled cluster is listed");
    assert!(
        listed.windows(2).all(|w| w[0].name < w[1].name),
        "in the given order"
    );
    let totals = cluster_totals_of(&["a".to_owned()], &many, listed.len());
    assert_eq!(
        (
            totals.selected,
            totals.connected,
            totals.with_problems,
            totals.listed
        ),
        (10_000, 9_990, 10, 100)
    );
    let size = serde_json::to_string(&(listed, totals))
        .expect("json")
        .len();
    assert!(size < 64 * 1024, "{size} bytes");
}

#[test]
fn readiness_names_what_is_missing_and_counts_unlisted_clusters() {
    let totals = |selected: usize, all: &[ClusterStatus]| ClusterTotals {
        selected: i32::try_from(selected).expect("small"),
        with_problems: i32::try_from(all.iter().filter(|c| c.message.is_some()).count())
            .expect("small"),
        ..Default::default()
    };
    let fine = [entry("a", false), entry("b", false)];
    assert_eq!(
        readiness(Ok(()), &[], true, &fine, &totals(2, &fine)),
        Ok(())
    );
    // A cluster with no report for the Federation yet is not ready, in both modes.
    let unreported = ClusterStatus {
        name: "c".into(),
        connected: true,
        message: Some("no status report for this Federation from the agent yet".into()),
        ..Default::default()
    };
    let all = [entry("a", false), unreported];
    assert_eq!(
        readiness(Ok(()), &[], true, &all, &totals(2, &all)),
        Err("cluster c: no status report for this Federation from the agent yet".into())
    );
    assert_eq!(
        readiness(
            Err("SuperLink not running".into()),
            &["pool g: no available cluster matches its clusterSelector".into()],
            true,
            &fine,
            &totals(2, &fine)
        ),
        Err(
            "SuperLink not running; pool g: no available cluster matches its clusterSelector"
                .into()
        )
    );
    assert_eq!(
        readiness(Ok(()), &[], true, &[], &totals(0, &[])),
        Err("no cluster selected by the Placement (yet)".into())
    );
    // Troubled clusters beyond the listed ones are counted.
    let mut many = totals(200, &fine);
    many.with_problems = 3;
    let listed = [entry("x", true)];
    assert_eq!(
        readiness(Ok(()), &[], true, &listed, &many),
        Err("cluster x: agent not connected; and 2 more".into())
    );
}

#[test]
fn totals_sum_online_only_where_known() {
    // Invariant: clusters without an online count do not turn a known count into 0, and no
    // cluster with one means the SuperLink's view is unknown.
    let cluster = |online| ClusterStatus {
        online,
        ..Default::default()
    };
    let all = [cluster(Some(2)), cluster(None), cluster(Some(1))];
    assert_eq!(cluster_totals_of(&[], &all, 3).online, Some(3));
    assert_eq!(cluster_totals_of(&[], &[cluster(None)], 1).online, None);
}

#[test]
fn a_message_names_a_bounded_number_of_problems() {
    let problems: Vec<String> = (0..25).map(|i| format!("p{i}")).collect();
    let message = join_problems(&problems, 5);
    assert!(message.starts_with("p0; p1;"), "{message}");
    assert!(message.ends_with("p9; and 20 more"), "{message}");
    assert_eq!(join_problems(&problems[..2], 0), "p0; p1");
    assert_eq!(join_problems(&[], 3), "and 3 more");
    let names: Vec<String> = (0..10_000).map(|i| format!("cluster-{i:05}")).collect();
    let few = name_few(&names);
    assert!(few.starts_with("cluster-00000, cluster-00001"), "{few}");
    assert!(few.ends_with("cluster-00009 and 9990 more"), "{few}");
    assert_eq!(name_few(&names[..2]), "cluster-00000, cluster-00001");
}
use flower_addon_proto::{Condition, FederationStatus, PoolStatus as WirePool};

fn report(ready: u32, why: &str) -> AgentStatus {
    AgentStatus {
        cluster_name: "s1".into(),
        federations: vec![FederationStatus {
            namespace: "team".into(),
            name: "fed".into(),
            pools: vec![WirePool {
                name: "a".into(),
                desired: 2,
                ready,
                conditions: vec![Condition {
                    r#type: "Ready".into(),
                    status: if ready == 2 { "True" } else { "False" }.into(),
                    reason: String::new(),
                    message: why.into(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[test]
fn a_run_sees_a_restart_pending_until_every_listed_cluster_is_back_under_the_mark() {
    // Read from the entries, not from `Ready`: right after the hub records a restart the
    // entries still show the old mark, and a `Ready=True` not yet recomputed must not let a
    // run through.
    let mut fed: Federation = serde_saphyr::from_str(
        "apiVersion: flower-addon.io/v1alpha1\nkind: Federation\n\
         metadata: {name: fed, namespace: team}\n\
         spec: {mode: StatefulSet, isolationMode: subprocess, insecure: true, \
         superlink: {image: \"flwr/superlink:1.42.0\"}, \
         supernodes: {image: \"flwr/supernode:1.42.0\", pools: []}}\n",
    )
    .expect("federation");
    let entry = |mark: Option<&str>, message: Option<&str>| ClusterStatus {
        name: "s1".into(),
        supernode_restart: mark.map(str::to_owned),
        message: message.map(str::to_owned),
        ..Default::default()
    };
    fed.status = Some(flower_addon_crds::FederationStatus {
        clusters: vec![entry(None, None)],
        ..Default::default()
    });
    assert_eq!(restart_pending(&fed), None);
    fed.status.as_mut().unwrap().supernode_restart_after_run = Some("7".into());
    let why = restart_pending(&fed).expect("a new mark is a restart pending");
    assert!(
        why.contains("after-run-7") && why.contains("cluster s1"),
        "{why}"
    );
    fed.status.as_mut().unwrap().clusters = vec![entry(Some("after-run-7"), Some("1/2 ready"))];
    assert!(restart_pending(&fed).unwrap().contains("1/2 ready"));
    fed.status.as_mut().unwrap().clusters = vec![entry(Some("after-run-7"), None)];
    assert_eq!(restart_pending(&fed), None);
}

#[test]
fn a_restart_is_done_only_when_the_agent_applied_the_federations_mark() {
    // Invariant: pools ready under an older restart mark are not the restart done, so a
    // run waiting for it is not sent to SuperNodes that may still be wedged.
    let mut r = report(2, "");
    let s = cluster_status(
        "team",
        "fed",
        "s1",
        true,
        Some((&r, 0)),
        None,
        Some("after-run-7"),
    );
    assert!(
        s.message
            .as_deref()
            .is_some_and(|m| m.contains("restarting its SuperNodes") && m.contains("after-run-7")),
        "{:?}",
        s.message
    );
    assert_eq!(s.supernode_restart, None);
    r.federations[0].supernode_restart = "after-run-7".into();
    let s = cluster_status(
        "team",
        "fed",
        "s1",
        true,
        Some((&r, 0)),
        None,
        Some("after-run-7"),
    );
    assert_eq!(
        (s.message, s.supernode_restart.as_deref()),
        (None, Some("after-run-7"))
    );
    // Applied, but the rollout still going: the pool's own reason is the message.
    let mut rolling = report(1, "rolling out a new pod template: 1/2 SuperNodes updated");
    rolling.federations[0].supernode_restart = "after-run-7".into();
    let s = cluster_status(
        "team",
        "fed",
        "s1",
        true,
        Some((&rolling, 0)),
        None,
        Some("after-run-7"),
    );
    assert!(s.message.unwrap().contains("rolling out"));
    // Mid-rollout with every replica ready (one replaced, the next not yet stopped): the
    // counts say 2/2, the pool's Ready=False says the restart is not done.
    let mut rolling = report(
        2,
        "rolling out a new pod template: 1/2 SuperNodes updated, 2 ready",
    );
    rolling.federations[0].supernode_restart = "after-run-7".into();
    rolling.federations[0].pools[0].conditions[0].status = "False".into();
    let s = cluster_status(
        "team",
        "fed",
        "s1",
        true,
        Some((&rolling, 0)),
        None,
        Some("after-run-7"),
    );
    assert!(
        s.message
            .as_deref()
            .is_some_and(|m| m.contains("rolling out") && m.contains("pool a")),
        "{:?}",
        s.message
    );
    let listed = [s];
    assert!(restart_pending_of(Some("after-run-7"), &listed).is_some());
    // A mark reported by a Federation without one is a restart not taken back yet.
    let s = cluster_status("team", "fed", "s1", true, Some((&r, 0)), None, None);
    assert!(s.message.is_some());
}

#[test]
fn a_cluster_entry_sums_its_pools_and_names_what_is_missing() {
    // No report, a disconnected agent and a pool short of replicas each say why, the last
    // with the runtime's own reason.
    let none = cluster_status("team", "fed", "s1", true, None, None, None);
    assert_eq!(none.supernodes, None);
    assert!(none.message.unwrap().contains("no status report"));
    let r = report(1, "pod fed-a-1 is Pending");
    let short = cluster_status(
        "team",
        "fed",
        "s1",
        true,
        Some((&r, 1_700_000_000)),
        None,
        None,
    );
    assert_eq!(short.supernodes.as_deref(), Some("1/2"));
    assert_eq!(
        short.message.as_deref(),
        Some("1/2 SuperNodes ready (pool a: pod fed-a-1 is Pending)")
    );
    assert!(short.last_report.is_some());
    let gone = cluster_status(
        "team",
        "fed",
        "s1",
        false,
        Some((&r, 1_700_000_000)),
        None,
        None,
    );
    assert!(gone.message.unwrap().contains("not connected"));
    let full = report(2, "");
    assert_eq!(
        cluster_status("team", "fed", "s1", true, Some((&full, 0)), None, None).message,
        None
    );
    // Another Federation's report is not this one's.
    assert_eq!(
        cluster_status("team", "other", "s1", true, Some((&full, 0)), None, None).supernodes,
        None
    );
}

#[test]
fn with_the_superlinks_node_list_ready_means_connected() {
    // Invariant: with SuperNode authentication, a pool is ready only for the SuperNodes the
    // SuperLink lists online, whatever the agent says about its containers.
    let mut r = report(2, "");
    r.federations[0].pools[0].node_public_keys = vec!["k1".into(), "k2 ".into()];
    let one: std::collections::BTreeSet<String> = ["k2".to_owned()].into();
    let s = cluster_status("team", "fed", "s1", true, Some((&r, 0)), Some(&one), None);
    assert_eq!(s.supernodes.as_deref(), Some("1/2"));
    assert_eq!(s.online, Some(1));
    assert_eq!(
        s.message.as_deref(),
        Some("1/2 SuperNodes ready; 1/2 SuperNodes connected to the SuperLink")
    );
    let both: std::collections::BTreeSet<String> = ["k1".to_owned(), "k2".to_owned()].into();
    let s = cluster_status("team", "fed", "s1", true, Some((&r, 0)), Some(&both), None);
    assert_eq!(
        (s.supernodes.as_deref(), s.online, s.message),
        (Some("2/2"), Some(2), None)
    );
    // Without the list (insecure Federation), the agent's readiness stands.
    let s = cluster_status("team", "fed", "s1", true, Some((&r, 0)), None, None);
    assert_eq!((s.supernodes.as_deref(), s.online), (Some("2/2"), None));
}

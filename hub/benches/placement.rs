//! Evaluates one Placement over 10,000 ManagedClusters as the Placement controller does (#12
//! item 4, target ≤ 20 ms): the clusters' views from the API objects, then the selection
//! (cluster set, a label predicate, a toleration, `numberOfClusters` and the default
//! prioritizers), and prints each part's p50 and worst time.
//! Run: `cargo bench -p flower-addon-hub --bench placement [-- CLUSTERS]`.

use std::collections::BTreeSet;
use std::hint::black_box;
use std::time::{Duration, Instant};

use flower_addon_crds::{ManagedCluster, Placement};
use flower_addon_hub::core::clustersets::ClusterSetView;
use flower_addon_hub::core::placement::{evaluate, placement_policy};
use flower_addon_hub::kube::controller::placement::cluster_view;

const TARGET: Duration = Duration::from_millis(20);
const RUNS: usize = 30;

fn cluster(i: usize) -> ManagedCluster {
    let zone = ["eu", "us", "ap"][i % 3];
    let gpu = if i.is_multiple_of(4) { "yes" } else { "no" };
    // Every 10th cluster is unreachable (a taint the Placement tolerates for a while), every
    // 50th is not accepted.
    let taints = if i.is_multiple_of(10) {
        r#"[{key: cluster.flower-addon.io/unreachable, effect: NoSelect, timeAdded: "2026-11-27T00:00:00Z"}]"#
    } else {
        "[]"
    };
    let yaml = format!(
        r#"apiVersion: flower-addon.io/v1alpha1
kind: ManagedCluster
metadata:
  name: cluster-{i:05}
  labels: {{zone: {zone}, gpu: "{gpu}", env: prod, team: team-{team}}}
spec:
  hubAcceptsClient: {accepted}
  taints: {taints}
status:
  allocatable: {{cpu: "{cpu}", memory: 64Gi}}
  clusterClaims: [{{name: region, value: {zone}-1}}]
  conditions:
  - {{type: Available, status: "True", reason: ClusterAvailable, message: "", lastTransitionTime: "2026-11-27T00:00:00Z"}}
"#,
        team = i % 20,
        accepted = !i.is_multiple_of(50),
        cpu = 8 + i % 24,
    );
    serde_saphyr::from_str(&yaml).expect("bench ManagedCluster parses")
}

fn placement() -> Placement {
    serde_saphyr::from_str(
        r#"apiVersion: flower-addon.io/v1alpha1
kind: Placement
metadata: {name: prod, namespace: flower}
spec:
  clusterSets: [global]
  numberOfClusters: 5000
  predicates:
  - requiredClusterSelector:
      labelSelector:
        matchLabels: {env: prod}
        matchExpressions: [{key: zone, operator: In, values: [eu, us]}]
  tolerations:
  - {key: cluster.flower-addon.io/unreachable, operator: Exists, tolerationSeconds: 300}
"#,
    )
    .expect("bench Placement parses")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn main() {
    let clusters: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_000);
    let objects: Vec<ManagedCluster> = (0..clusters).map(cluster).collect();
    let sets = [ClusterSetView::every_cluster("global")];
    let bindings = [("flower".to_owned(), "global".to_owned())];
    let policy = placement_policy(&placement(), &sets, &bindings);
    let now = 1_795_000_000; // 2026-11-18: the taints were added 9 days later, still tolerated
    let mut views_took = Vec::with_capacity(RUNS);
    let mut evaluate_took = Vec::with_capacity(RUNS);
    let mut previous = BTreeSet::new();
    let mut selected = 0;
    for run in 0..RUNS {
        let t = Instant::now();
        let views: Vec<_> = objects.iter().map(cluster_view).collect();
        views_took.push(t.elapsed());
        let t = Instant::now();
        let outcome = evaluate(&policy, black_box(&views), &previous, now);
        evaluate_took.push(t.elapsed());
        selected = outcome.selected.len();
        // From the second run on, the last selection is kept (the steady state of a hub).
        if run == 0 {
            previous = outcome.selected.into_iter().collect();
        }
    }
    assert!(selected > 0, "the bench Placement selects nothing");
    views_took.sort();
    evaluate_took.sort();
    let total: Vec<Duration> = {
        let mut t: Vec<Duration> = views_took
            .iter()
            .zip(&evaluate_took)
            .map(|(a, b)| *a + *b)
            .collect();
        t.sort();
        t
    };
    println!("placement over {clusters} clusters ({selected} selected), {RUNS} runs:",);
    for (what, sorted) in [
        ("ManagedCluster → view", &views_took),
        ("evaluate", &evaluate_took),
        ("both", &total),
    ] {
        println!(
            "  {what:<24} p50 {:>7.2} ms   max {:>7.2} ms",
            percentile(sorted, 0.5).as_secs_f64() * 1000.0,
            percentile(sorted, 1.0).as_secs_f64() * 1000.0
        );
    }
    let p50 = percentile(&total, 0.5);
    println!(
        "  target: one Placement over 10,000 clusters ≤ {} ms: {}",
        TARGET.as_millis(),
        if clusters < 10_000 {
            "not measured (fewer clusters)"
        } else if p50 <= TARGET {
            "PASS"
        } else {
            "MISS"
        }
    );
}

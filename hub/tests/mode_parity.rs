//! The standalone hub's work for a Federation (pools narrowed by `clusterSelector`,
//! `clusterOverrides`, SuperNode keys registered with its SuperLink) equals what the Kubernetes
//! mode's work function, `kube::work::federation_work`, makes of the same Federation, selected
//! clusters, labels, CA and keys: the standalone hub hands the shared core the same Fleet address,
//! CA bundle and keys. And `flower-hub render --cluster` prints exactly what the agent applies
//! from what the hub sent.
//!
//! The Kubernetes side's inputs (which clusters are selected) are chosen here, so this says
//! nothing about placement or the Kubernetes work source; `e2e/tests/mode_parity.rs` compares
//! both modes' real work sources (Placement controller + `KubeWorkSource` on a real apiserver
//! against the standalone hub) on the same manifests.
//!
//! The standalone hub runs its SuperLink as a process; here `flower-superlink` is a script that
//! only stays alive, and a stand-in Control API ([`fake_control`]) on the SuperLink's port, with
//! its certificate, takes the node keys the standalone hub registers (this test is about the
//! hub's decisions, not Flower; the e2e tests run real Flower in both modes). The agents' reports
//! carry SuperNode keys, so the work compared includes `registered_node_keys`.
mod fake_control;
mod standalone_support;
use standalone_support::{Dirs, register};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flower_addon_agent::kube_runtime::render_federation;
use flower_addon_agent::work::decode_federation;
use flower_addon_crds::{Federation, Object};
use flower_addon_hub::channel::source::{InMemoryWorkSource, WorkSource};
use flower_addon_hub::cli::spoke::{SpokeSelection, spoke_objects};
use flower_addon_hub::registration::store::file::FileStore;
use flower_addon_hub::registration::store::load_or_create_flower_ca;
use flower_addon_hub::standalone::StandaloneHub;
use flower_addon_proto::ClusterWork;

const MANIFESTS: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {name: fed, namespace: team}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  insecure: false
  placementRef: {name: all}
  superlink:
    image: "flwr/superlink:1.42.0"
    externalAddress: "hub.example:30092"
    service: {ports: {grpc: FLEET, extra: PORT}}
  supernodes:
    image: "flwr/supernode:1.42.0"
    pools:
      - name: a
        replicas: 2
        nodeConfig: {partition-id: "{partition}", num-partitions: "{partitions}"}
      - name: gpu
        replicas: 1
        clusterSelector: {matchLabels: {gpu: "yes"}}
  clusterOverrides:
    - clusterSelector: {matchLabels: {gpu: "yes"}}
      pools: [a]
      replicas: 3
      env: [{name: MODE, value: gpu}]
---
apiVersion: flower-addon.io/v1alpha1
kind: ManagedClusterSet
metadata: {name: global}
spec:
  clusterSelector: {selectorType: LabelSelector, labelSelector: {}}
---
apiVersion: flower-addon.io/v1alpha1
kind: ManagedClusterSetBinding
metadata: {name: global, namespace: team}
spec: {clusterSet: global}
---
apiVersion: flower-addon.io/v1alpha1
kind: Placement
metadata: {name: all, namespace: team}
spec: {}
"#;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Feeds `work` the agents' reports: SuperNode keys of pool `a`, 2 from s1 and 1 from s2.
fn report_keys(work: &InMemoryWorkSource) -> BTreeMap<&'static str, Vec<String>> {
    let mut keys: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (cluster, count) in [("s1", 2), ("s2", 1)] {
        let lines: Vec<String> = (0..count)
            .map(|_| {
                flower_addon_agent::node_key::generate_node_key()
                    .expect("key")
                    .public_openssh
            })
            .collect();
        work.on_status(
            cluster,
            &flower_addon_proto::Status {
                cluster_name: cluster.into(),
                federations: vec![flower_addon_proto::FederationStatus {
                    supernode_restart: String::new(),
                    namespace: "team".into(),
                    name: "fed".into(),
                    pools: vec![flower_addon_proto::PoolStatus {
                        name: "a".into(),
                        node_public_keys: lines.clone(),
                        ..Default::default()
                    }],
                }],
                ..Default::default()
            },
        );
        keys.insert(cluster, lines);
    }
    keys
}

#[tokio::test]
async fn standalone_work_equals_the_kube_work_function_on_its_selection_and_render_prints_what_is_applied()
 {
    let dirs = Dirs::new();
    let (state, manifests) = (&dirs.state, &dirs.manifests);
    // The SuperLink's Control port (on loopback), where the stand-in Control API listens; the
    // hub's Fleet front takes a free port of its own.
    let control = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = control.local_addr().expect("addr").port();
    let fleet = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let manifests_text = MANIFESTS
        .replace("PORT", &port.to_string())
        .replace("FLEET", &fleet.to_string());
    std::fs::write(manifests.join("fed.yaml"), &manifests_text).expect("manifests");

    let store = Arc::new(FileStore::open(state).expect("store"));
    // SuperLink certificates and the CA bundle in the work come from the Flower CA.
    let ca = Arc::new(load_or_create_flower_ca(store.as_ref()).await.expect("ca"));
    let clusters = BTreeMap::from([
        ("s1".to_string(), labels(&[("gpu", "yes")])),
        ("s2".to_string(), labels(&[])),
    ]);
    register(store.as_ref(), &clusters).await;

    // Standalone: the real controller, with the agents' reports (SuperNode keys of pool a)
    // already in.
    let work = Arc::new(InMemoryWorkSource::new());
    let keys = report_keys(&work);
    // The stand-in Control API listens on the hub machine's Control port itself, where an
    // isolated SuperLink's bridge would: this SuperLink stays on the host network.
    let mut config = dirs.config(&["hub.example"]);
    config.superlink_network = None;
    let hub = StandaloneHub::new(store.clone(), work.clone(), ca.clone(), config);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(hub.run(async {
        let _ = stop_rx.await;
    }));
    let paths = flower_addon_hub::standalone::superlink::SuperLinkPaths::new(state, "team", "fed");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !(paths.cert.is_file() && paths.key.is_file()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no SuperLink certificate in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (held, _server) = fake_control::serve(control, &paths.cert, &paths.key);
    // Every reported key registered and sent back with the work.
    let all: Vec<String> = {
        let mut all: Vec<String> = keys.values().flatten().cloned().collect();
        all.sort();
        all
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while ["s1", "s2"].iter().any(|c| {
        work.snapshot(c)
            .federations
            .first()
            .is_none_or(|f| f.registered_node_keys.len() != all.len())
    }) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the standalone hub did not register the reported keys in 30 s (SuperLink holds {})",
            held.lock().expect("held").len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(held.lock().expect("held").len(), all.len());
    let standalone: BTreeMap<String, ClusterWork> = ["s1", "s2"]
        .iter()
        .map(|c| (c.to_string(), work.snapshot(c)))
        .collect();
    let _ = stop_tx.send(());
    running.await.expect("controller stops");

    // The Kubernetes work source's function on the same Federation, the clusters the
    // standalone hub selected (both: the Placement selects all), the same CA and keys.
    let objects = flower_addon_crds::parse_documents("fed.yaml", &manifests_text).expect("parse");
    let fed: &Federation = objects
        .iter()
        .find_map(|o| match o {
            Object::Federation(f) => Some(f),
            _ => None,
        })
        .expect("federation");
    let selected: Vec<String> = clusters.keys().cloned().collect();
    // Both modes derive the same Federation CA from the same Flower CA.
    let fed_ca = ca
        .federation(
            fed.metadata.namespace.as_deref().expect("namespace"),
            fed.metadata.name.as_deref().expect("name"),
        )
        .expect("Federation CA");
    let kube = flower_addon_hub::kube::work::federation_work(
        fed,
        &selected,
        &clusters,
        fed_ca.bundle_pem(),
        &all,
        &[],
        &flower_addon_crds::policy::PodPolicy::new(flower_addon_crds::policy::Admin::Hub),
    )
    .expect("kube work");
    assert_eq!(kube.len(), 2);
    for (cluster, fw) in &kube {
        let sent = &standalone[cluster].federations;
        assert_eq!(sent.len(), 1, "{cluster}");
        assert_eq!(
            &sent[0], fw,
            "the standalone hub's work for {cluster} differs from kube::work::federation_work's"
        );
    }
    // The overrides and selectors took effect (s1: a×3 + gpu×1; s2: a×2), numbered across both.
    let s1 = &standalone["s1"].federations[0];
    assert_eq!(
        s1.pools
            .iter()
            .map(|p| (p.name.as_str(), p.partition_offset))
            .collect::<Vec<_>>(),
        [("a", 0), ("gpu", 3)]
    );
    assert_eq!(s1.partitions_total, 6);

    // render --cluster s1 prints what s1's agent applies from what it was sent.
    let selection = SpokeSelection {
        cluster: "s1".into(),
        selected: selected.clone(),
        labels: clusters.clone(),
    };
    let printed = spoke_objects(
        fed,
        &selection,
        &s1.superlink_fleet_address,
        fed_ca.bundle_pem(),
    )
    .expect("render")
    .expect("s1 runs pools");
    let snapshot = &standalone["s1"];
    let applied =
        render_federation(&decode_federation(snapshot, &snapshot.federations[0]).expect("decode"))
            .expect("agent renders");
    assert_eq!(printed.workloads, applied.workloads);
    assert_eq!(printed.services, applied.services);
}

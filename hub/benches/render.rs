//! Splits a 16-pool Federation over 1,000 clusters (the hub: SuperLink objects and every
//! cluster's work message) and renders every spoke's objects from its message (the agents), and
//! prints the total and per-cluster times. Run: `cargo bench -p flower-addon-hub --bench render`.

use std::hint::black_box;
use std::time::Instant;

use flower_addon_crds::Federation;
use std::collections::BTreeMap;

use flower_addon_agent::kube_runtime::render_federation;
use flower_addon_agent::work::decode_federation;
use flower_addon_hub::core::render::{federation_dialect, render_hub};
use flower_addon_hub::core::work::{WorkInputs, federation_work};
use flower_addon_proto::ClusterWork;

const CLUSTERS: u32 = 1_000;

fn federation() -> Federation {
    let mut yaml = String::from(
        "apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: { name: bench, namespace: flower }
spec:
  mode: StatefulSet
  isolationMode: process
  version: \"1.42.0\"
  insecure: false
  placementRef: { name: all }
  superlink:
    image: flwr/superlink:1.42.0
    superexecImage: flwr/superexec:1.42.0
    externalAddress: hub.example.org:30092
  supernodes:
    image: flwr/supernode:1.42.0
    env: [{ name: A, value: a }, { name: B, value: b }]
    pools:
",
    );
    for pool in 0..16 {
        yaml.push_str(&format!(
            "      - name: pool-{pool}
        replicas: {}
        images: {{ superexecClientApp: flwr/superexec:1.42.0 }}
        gpu: {{ enabled: true, vendor: nvidia }}
        env: [{{ name: B, value: pool }}, {{ name: C, value: c }}]
        volumes: [{{ name: data, emptyDir: {{}} }}]
        volumeMounts: [{{ name: data, mountPath: /data }}]
        nodeConfig:
          partition-id: \"{{partition}}\"
          num-partitions: \"{{partitions}}\"
          name: \"{{cluster}}-{{pool}}-{{node}}\"
          lr: \"0.01\"
",
            1 + pool % 4
        ));
    }
    serde_saphyr::from_str(&yaml).expect("bench Federation parses")
}

fn main() {
    let fed = federation();
    // Warm up once.
    black_box(render_hub(&fed).expect("hub renders"));
    let (version, _) = federation_dialect(&fed).expect("dialect");
    let selected: Vec<String> = (0..CLUSTERS).map(|i| format!("cluster-{i:04}")).collect();
    let labels = BTreeMap::new();
    let inputs = WorkInputs {
        selected: &selected,
        labels: &labels,
        fleet_address: "hub.example:30092",
        ca_pem: "CA",
        registered_node_keys: &[],
        retired_node_keys: &[],
    };

    // The hub: the SuperLink objects and every cluster's work message.
    let start = Instant::now();
    let hub = render_hub(&fed).expect("hub renders");
    let works = federation_work(&fed, version, &inputs).expect("work");
    let split_time = start.elapsed();

    // The agents: decode the message and render the pools (what each spoke does).
    let start = Instant::now();
    let mut workloads = 0usize;
    let mut json_bytes = 0usize;
    for (cluster, work) in &works.per_cluster {
        let snapshot = ClusterWork {
            version: 1,
            cluster_name: cluster.clone(),
            federations: vec![work.clone()],
        };
        let plan = decode_federation(&snapshot, &snapshot.federations[0]).expect("decodes");
        let rendered = render_federation(&plan).expect("renders");
        workloads += rendered.workloads.len();
        for value in rendered.to_values().expect("json") {
            json_bytes += serde_json::to_vec(&value).expect("bytes").len();
        }
    }
    let render_time = start.elapsed();
    black_box(hub);
    println!(
        "hub: SuperLink + work for {CLUSTERS} clusters x 16 pools in {:.1} ms ({:.1} us per cluster)",
        split_time.as_secs_f64() * 1e3,
        split_time.as_secs_f64() * 1e6 / f64::from(CLUSTERS)
    );
    println!(
        "agents: decode + render + JSON of {workloads} workloads in {:.1} ms ({:.1} us per cluster, {:.1} MB of JSON)",
        render_time.as_secs_f64() * 1e3,
        render_time.as_secs_f64() * 1e6 / f64::from(CLUSTERS),
        json_bytes as f64 / 1e6
    );
}

//! Renders a 16-pool Federation for 1,000 clusters (hub side once, every spoke's pools) and
//! prints the total and per-cluster time. Run: `cargo bench -p flower-addon-hub --bench render`.

use std::hint::black_box;
use std::time::Instant;

use flower_addon_crds::Federation;
use flower_addon_hub::render::{SpokeCluster, render_hub, render_spoke};

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
    black_box(render_hub(&fed, "local").expect("hub renders"));
    let start = Instant::now();
    let hub = render_hub(&fed, "local").expect("hub renders");
    let mut workloads = 0usize;
    let mut bytes = 0usize;
    for index in 0..CLUSTERS {
        let name = format!("cluster-{index:04}");
        let cluster = SpokeCluster {
            name: &name,
            index,
            clusters: CLUSTERS,
            labels: None,
        };
        let pools = render_spoke(&fed, cluster, None).expect("spoke renders");
        workloads += pools.len();
        bytes += black_box(&pools).len();
    }
    let render_time = start.elapsed();
    // Serialising to JSON is what the work channel sends; time it separately.
    let start = Instant::now();
    let mut json_bytes = 0usize;
    for index in 0..CLUSTERS {
        let name = format!("cluster-{index:04}");
        let cluster = SpokeCluster {
            name: &name,
            index,
            clusters: CLUSTERS,
            labels: None,
        };
        for pool in render_spoke(&fed, cluster, None).expect("spoke renders") {
            json_bytes += serde_json::to_vec(&pool.to_value().expect("json"))
                .expect("bytes")
                .len();
        }
    }
    let with_json = start.elapsed();
    black_box((hub, bytes));
    println!(
        "render: 16 pools x {CLUSTERS} clusters = {workloads} workloads in {:.1} ms ({:.1} us per cluster)",
        render_time.as_secs_f64() * 1e3,
        render_time.as_secs_f64() * 1e6 / f64::from(CLUSTERS)
    );
    println!(
        "render + JSON: {:.1} ms ({:.1} us per cluster, {:.1} MB of JSON)",
        with_json.as_secs_f64() * 1e3,
        with_json.as_secs_f64() * 1e6 / f64::from(CLUSTERS),
        json_bytes as f64 / 1e6
    );
}

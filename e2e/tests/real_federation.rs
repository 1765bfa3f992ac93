//! A Federation in Kubernetes mode with real Flower pods: the hub installed from CRDs +
//! `manifests/hub/` (its pod from our image) renders `examples/federation-nodeconfig.yaml` (no
//! Placement: it runs in the hub cluster, like flower-operator; `nodeConfig` placeholders
//! `{index}`/`{replicas}`) into a SuperLink and four SuperNode pods of the `flwr/*:1.25.0` images
//! on the cluster's real node; every SuperNode connects to the SuperLink through its Service name
//! (cluster DNS + ClusterIP): each logs its `SuperNode ID`, and the SuperLink logs Fleet requests
//! from all. Then `flwr run` of `examples/fedavg` (2 rounds) from a pod of the app image, against
//! the SuperLink's Control Service, ends `finished:completed` (`flwr ls --run-id … --format json`).
//!
//! Needs what `real_node` needs (root, `e2e/k8s/build.sh`, `e2e/node/build.sh`,
//! `e2e/images/build.sh`); fails loudly when something is missing.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Result;
use e2e::harness::wait_for;
use e2e::node::image_archive;
use e2e::pods::check_not_crashing;
use e2e::{ControlPlane, Options};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, LogParams};

const IMAGES: [&str; 4] = [
    "ghcr.io/flower-addon/flower-addon:0.1.0",
    "flwr/superlink:1.25.0",
    "flwr/supernode:1.25.0",
    APP_IMAGE,
];
/// examples/fedavg on flwr/superexec:1.25.0 (e2e/images/app), with the `flwr` CLI.
const APP_IMAGE: &str = "flower-addon/fedavg:1.25.0";
/// Run in a pod of [`APP_IMAGE`]: `flwr run` of examples/fedavg against the SuperLink's Control
/// API by its Service name (1.25 dialect: a federation table in a writable copy of the app), then
/// `flwr ls --run-id … --format json` until the run finishes; prints `STATUS <status>`.
const FLWR_RUN: &str = r#"
import json, re, shutil, subprocess, sys, time
shutil.copytree("/app/fedavg", "/tmp/app")
with open("/tmp/app/pyproject.toml", "a") as f:
    f.write("""
[tool.flwr.federations]
default = "k8s"

[tool.flwr.federations.k8s]
address = "%s"
insecure = true
""" % sys.argv[1])
run = subprocess.run(["flwr", "run", "/tmp/app", "k8s", "--run-config", "num-server-rounds=2 min-nodes=4", "--stream"],
                     capture_output=True, text=True, timeout=600)
print(run.stdout[-3000:], run.stderr[-2000:])
rid = re.search(r"started run (\d+)", run.stdout + run.stderr).group(1)
status = "unknown"
for _ in range(180):
    ls = subprocess.run(["flwr", "ls", "/tmp/app", "k8s", "--run-id", rid, "--format", "json"],
                        capture_output=True, text=True)
    try:
        d = json.loads(ls.stdout[ls.stdout.index("{"):])
        status = d["runs"][0]["status"] if d.get("success") else "error"
    except ValueError:
        status = "unparsable: " + ls.stdout[-300:]
    if status.startswith("finished"):
        break
    time.sleep(1)
print("RUN", rid, "STATUS", status)
"#;
/// The example applied, and the Federation it names.
const EXAMPLE: &str = "examples/federation-nodeconfig.yaml";
const FEDERATION: &str = "federation-nodeconfig";
/// Its SuperNode replicas.
const SUPERNODES: usize = 4;

/// The `SuperNode ID: <n>` a SuperNode logs once connected.
fn supernode_id(log: &str) -> Option<String> {
    log.lines()
        .find_map(|l| l.split("SuperNode ID: ").nth(1))
        .map(|id| id.trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn federation_pods_connect_on_a_real_node() -> Result<()> {
    e2e::install_crypto();
    let images = IMAGES
        .iter()
        .map(|r| image_archive(r))
        .collect::<Result<Vec<_>>>()?;
    let cp = ControlPlane::start_with(
        &["hub"],
        Options {
            nodes_per_cluster: 1,
            real_nodes: true,
            ..Default::default()
        },
    )
    .await?;
    let hub = cp.cluster("hub")?;
    cp.real_node("hub")?.import_images(&images)?;

    e2e::install_hub_manifests(&hub.client).await?;
    let t = Instant::now();
    e2e::apply_file(&hub.client, &e2e::repo_root().join(EXAMPLE), "default").await?;

    let hub_pods: Api<Pod> = Api::namespaced(hub.client.clone(), "flower-addon-system");
    let pods: Api<Pod> = Api::namespaced(hub.client.clone(), "default");
    let ids = wait_for(
        "every SuperNode pod connected (SuperNode ID logged)",
        Duration::from_secs(180),
        || {
            let (pods, hub_pods) = (pods.clone(), hub_pods.clone());
            async move {
                check_not_crashing(&hub_pods, "app.kubernetes.io/name=flower-hub").await?;
                let Ok(list) = pods.list(&ListParams::default()).await else {
                    return Ok(None);
                };
                let mut ids = Vec::new();
                for p in &list.items {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    if !name.starts_with(&format!("{FEDERATION}-supernode-")) {
                        continue;
                    }
                    let log = pods
                        .logs(&name, &LogParams::default())
                        .await
                        .unwrap_or_default();
                    ids.extend(supernode_id(&log).map(|id| (name, id)));
                }
                Ok((ids.len() == SUPERNODES).then_some(ids))
            }
        },
    )
    .await?;
    let connected = t.elapsed();
    let superlink = format!("{FEDERATION}-superlink-0");
    let want: BTreeSet<String> = ids.iter().map(|(_, id)| id.clone()).collect();
    wait_for(
        "the SuperLink serving every SuperNode (Fleet requests with their node ids)",
        Duration::from_secs(60),
        || {
            let (pods, superlink, want) = (pods.clone(), superlink.clone(), want.clone());
            async move {
                let log = pods
                    .logs(&superlink, &LogParams::default())
                    .await
                    .unwrap_or_default();
                Ok(want
                    .iter()
                    .all(|id| log.contains(&format!("node_id={id}")))
                    .then_some(()))
            }
        },
    )
    .await?;
    eprintln!(
        "real_federation: Federation applied -> SuperLink + {SUPERNODES} SuperNodes (flwr 1.25.0) pods on {} connected in {:.1}s: {ids:?}",
        cp.real_node("hub")?.name,
        connected.as_secs_f64()
    );

    // --- flwr run of examples/fedavg from a pod, against the SuperLink's Control Service ------
    let t = Instant::now();
    let control = format!("{FEDERATION}-superlink.default.svc:9093");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "flwr-run"},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {e2e::node::REAL_NODE_LABEL.0: e2e::node::REAL_NODE_LABEL.1},
            "containers": [{
                "name": "flwr",
                "image": APP_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "-c", FLWR_RUN, control],
                "env": [
                    {"name": "FLWR_TELEMETRY_ENABLED", "value": "0"},
                    {"name": "FLWR_DISABLE_UPDATE_CHECK", "value": "1"},
                ],
            }],
        },
    }))?;
    pods.create(&Default::default(), &pod).await?;
    let log =
        e2e::pods::run_to_completion_within(&pods, "flwr-run", Duration::from_secs(400)).await?;
    let status = log
        .lines()
        .rev()
        .find_map(|l| l.split(" STATUS ").nth(1))
        .unwrap_or_default()
        .to_string();
    eprintln!(
        "real_federation: flwr run examples/fedavg (2 rounds, 4 SuperNodes) from a pod: {status} in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(
        status,
        "finished:completed",
        "the run did not complete; flwr-run pod log:\n{log}\nSuperLink log:\n{}",
        pods.logs(
            &superlink,
            &LogParams {
                tail_lines: Some(40),
                ..Default::default()
            }
        )
        .await
        .unwrap_or_default()
    );
    Ok(())
}

//! A Federation in Kubernetes mode with real Flower pods: the hub installed from CRDs +
//! `manifests/hub/` (its pod from our image) renders `examples/federation-nodeconfig.yaml` (no
//! Placement: it runs in the hub cluster, like flower-operator; `nodeConfig` placeholders
//! `{index}`/`{replicas}`) into a SuperLink and four SuperNode pods of the `flwr/*:1.25.0` images
//! on the cluster's real node; every SuperNode connects to the SuperLink through its Service name
//! (cluster DNS + ClusterIP): each logs its `SuperNode ID`, and the SuperLink logs Fleet requests
//! from all. Then `flwr run` of `examples/fedavg` (2 rounds) from a pod of the app image, against
//! the SuperLink's Control Service, ends `finished:completed` (`flwr ls --run-id … --format json`).
//!
//! Then the same with TLS and SuperNode authentication (`insecure: false`), still without a
//! Placement: the hub's own cluster runs the pools through the runtime the hub embeds, which
//! makes one key pair per SuperNode pod in a Secret of the cluster; the hub pod registers the
//! public keys through the SuperLink's Control API (its Service name) and only then do the
//! SuperNodes start; the Federation status counts them online from the SuperLink's node list;
//! `flwr run` with the CA the runtime put in `<fed>-superlink-ca` completes.
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
%s
""" % (sys.argv[1], 'root-certificates = "/ca/ca.crt"' if sys.argv[3] == "tls" else "insecure = true"))
run = subprocess.run(["flwr", "run", "/tmp/app", "k8s", "--run-config", "num-server-rounds=2 min-nodes=%s" % sys.argv[2], "--stream"],
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
/// The TLS + SuperNode authentication Federation (no Placement either).
const SECURE: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {name: secure, namespace: default}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  insecure: false
  superlink: {image: "flwr/superlink:1.25.0"}
  supernodes:
    image: "flwr/supernode:1.25.0"
    pools:
      - name: default
        replicas: 2
        images: {}
        nodeConfig: {partition-id: "{index}", num-partitions: "{replicas}"}
"#;

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
    let node = &cp.real_node("hub")?.name;
    federation_runs(hub, node, FEDERATION, SUPERNODES, false, t).await?;

    let t = Instant::now();
    e2e::apply_yaml(&hub.client, SECURE, "default").await?;
    federation_runs(hub, node, "secure", 2, true, t).await?;
    the_secure_federation_authenticated_its_supernodes(hub).await?;
    a_deleted_superlink_pod_comes_back_and_serves_a_new_run(hub).await
}

/// #9 item 6d (the part that holds without a persistent volume): the SuperLink pod deleted →
/// the StatefulSet brings it back; its state is an emptyDir, so the hub registers the
/// SuperNodes' keys again (Control API relist), they reconnect, and a new run completes.
async fn a_deleted_superlink_pod_comes_back_and_serves_a_new_run(hub: &e2e::Cluster) -> Result<()> {
    let t = Instant::now();
    let pods: Api<Pod> = Api::namespaced(hub.client.clone(), "default");
    let old = pods.get("secure-superlink-0").await?.metadata.uid;
    pods.delete("secure-superlink-0", &Default::default())
        .await?;
    wait_for(
        "the SuperLink pod back and Ready",
        Duration::from_secs(120),
        || {
            let (pods, old) = (pods.clone(), old.clone());
            async move {
                let Some(pod) = pods.get_opt("secure-superlink-0").await? else {
                    return Ok(None);
                };
                Ok((pod.metadata.uid != old && e2e::pods::pod_ready(&pod)).then_some(()))
            }
        },
    )
    .await?;
    eprintln!(
        "real_federation: SuperLink pod deleted -> back and Ready in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    flwr_run(hub, "secure", 2, true, "-after-restart").await
}

/// Waits until `supernodes` SuperNode pods of Federation `name` (applied at `t`) are connected
/// and served by its SuperLink, then runs examples/fedavg with `flwr` from a pod (TLS with the
/// Federation's CA Secret when `tls`) and checks it finished `completed`.
async fn federation_runs(
    hub: &e2e::Cluster,
    node: &str,
    name: &str,
    supernodes: usize,
    tls: bool,
    t: Instant,
) -> Result<()> {
    let hub_pods: Api<Pod> = Api::namespaced(hub.client.clone(), "flower-addon-system");
    let pods: Api<Pod> = Api::namespaced(hub.client.clone(), "default");
    let ids = wait_for(
        "every SuperNode pod connected (SuperNode ID logged)",
        Duration::from_secs(180),
        || {
            let (pods, hub_pods, fed) = (pods.clone(), hub_pods.clone(), name.to_owned());
            async move {
                check_not_crashing(&hub_pods, "app.kubernetes.io/name=flower-hub").await?;
                let Ok(list) = pods.list(&ListParams::default()).await else {
                    return Ok(None);
                };
                let mut ids = Vec::new();
                for p in &list.items {
                    let pod = p.metadata.name.clone().unwrap_or_default();
                    if !pod.starts_with(&format!("{fed}-supernode-")) {
                        continue;
                    }
                    let log = pods
                        .logs(&pod, &LogParams::default())
                        .await
                        .unwrap_or_default();
                    ids.extend(supernode_id(&log).map(|id| (pod, id)));
                }
                Ok((ids.len() == supernodes).then_some(ids))
            }
        },
    )
    .await?;
    let connected = t.elapsed();
    let superlink = format!("{name}-superlink-0");
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
        "real_federation: Federation {name} (TLS {tls}) applied -> SuperLink + {supernodes} SuperNodes (flwr 1.25.0) pods on {node} connected in {:.1}s: {ids:?}",
        connected.as_secs_f64()
    );

    flwr_run(hub, name, supernodes, tls, "").await
}

/// `flwr run` of examples/fedavg (2 rounds, at least `supernodes` SuperNodes) from a pod against
/// Federation `name`'s Control Service (TLS with its CA Secret when `tls`); checks the run
/// finished `completed`. `suffix` tells the runner pods of several runs apart.
async fn flwr_run(
    hub: &e2e::Cluster,
    name: &str,
    supernodes: usize,
    tls: bool,
    suffix: &str,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(hub.client.clone(), "default");
    let superlink = format!("{name}-superlink-0");
    let t = Instant::now();
    let control = format!("{name}-superlink.default.svc:9093");
    let runner = format!("flwr-run-{name}{suffix}");
    let mut pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": runner},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {e2e::node::REAL_NODE_LABEL.0: e2e::node::REAL_NODE_LABEL.1},
            "containers": [{
                "name": "flwr",
                "image": APP_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "-c", FLWR_RUN, control, supernodes.to_string(), if tls { "tls" } else { "insecure" }],
                "env": [
                    {"name": "FLWR_TELEMETRY_ENABLED", "value": "0"},
                    {"name": "FLWR_DISABLE_UPDATE_CHECK", "value": "1"},
                ],
            }],
        },
    }))?;
    if tls {
        // The CA the hub cluster's runtime gave the SuperNodes (the one that signed the SuperLink).
        let spec = pod.spec.as_mut().expect("pod spec");
        spec.volumes = Some(vec![serde_json::from_value(serde_json::json!({
            "name": "ca", "secret": {"secretName": flower_addon_crds::render::spoke_ca_secret_name(name)},
        }))?]);
        spec.containers[0].volume_mounts = Some(vec![serde_json::from_value(
            serde_json::json!({"name": "ca", "mountPath": "/ca", "readOnly": true}),
        )?]);
    }
    pods.create(&Default::default(), &pod).await?;
    let log = e2e::pods::run_to_completion_within(&pods, &runner, Duration::from_secs(400)).await?;
    let status = log
        .lines()
        .rev()
        .find_map(|l| l.split(" STATUS ").nth(1))
        .unwrap_or_default()
        .to_string();
    eprintln!(
        "real_federation: flwr run examples/fedavg (2 rounds, {supernodes} SuperNodes, TLS {tls}) from a pod: {status} in {:.1}s",
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

/// The secure Federation's SuperLink requires registered keys, each SuperNode pod's key was made
/// in the cluster (a Secret with one key per pod, never sent), and the status counts the
/// SuperNodes online from the SuperLink's node list under the hub's own cluster.
async fn the_secure_federation_authenticated_its_supernodes(hub: &e2e::Cluster) -> Result<()> {
    use anyhow::ensure;
    let sl =
        Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(hub.client.clone(), "default")
            .get("secure-superlink")
            .await?;
    let args = sl
        .spec
        .template
        .spec
        .map(|p| p.containers[0].args.clone().unwrap_or_default())
        .unwrap_or_default();
    ensure!(
        args.iter().any(|a| a == "--enable-supernode-auth"),
        "SuperLink args: {args:?}"
    );
    let keys = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(hub.client.clone(), "default")
        .get("secure-supernode-default-node-keys")
        .await?;
    let names: Vec<String> = keys.data.unwrap_or_default().into_keys().collect();
    ensure!(
        names == ["secure-supernode-default-0", "secure-supernode-default-1"],
        "key Secret holds {names:?}"
    );
    let feds = Api::<flower_addon_crds::Federation>::namespaced(hub.client.clone(), "default");
    let entry = wait_for(
        "the secure Federation's status: 2 SuperNodes online in local-cluster",
        Duration::from_secs(60),
        || {
            let feds = feds.clone();
            async move {
                let fed = feds.get("secure").await?;
                Ok(fed.status.and_then(|s| {
                    s.clusters
                        .into_iter()
                        .find(|c| c.name == "local-cluster" && c.online == Some(2))
                }))
            }
        },
    )
    .await?;
    ensure!(entry.supernodes.as_deref() == Some("2/2"), "{entry:?}");
    eprintln!(
        "real_federation: secure Federation: --enable-supernode-auth, 2 keys made in the cluster, 2/2 online"
    );
    Ok(())
}

//! A Federation in Kubernetes mode with real Flower pods: the hub installed from CRDs +
//! `manifests/hub/` (its pod from our image) renders `examples/federation-nodeconfig.yaml` (no
//! Placement: it runs in the hub cluster, like flower-operator; `nodeConfig` placeholders
//! `{index}`/`{replicas}`) into a SuperLink and four SuperNode pods of the `flwr/*:1.25.0` images
//! on the cluster's real node; every SuperNode connects to the SuperLink through its Service name
//! (cluster DNS + ClusterIP): each logs its `SuperNode ID`, and the SuperLink logs Fleet requests
//! from all. Then `flwr run` of `examples/fedavg` (2 rounds) from a pod of the app image, against
//! the SuperLink's Control Service, ends `finished:completed` (`flwr ls --run-id … --format json`);
//! the example runs plaintext as flower-operator's default had it (`insecure: true` added: ours
//! is TLS).
//! That is flower-operator's way of reaching Control (from any pod of the cluster), which a
//! Federation now opts into with `spec.superlink.service.exposeControl: true`: both Federations
//! here set it (without it Control is on the SuperLink pod's loopback only: `real_node` checks a
//! ServerApp of another Federation cannot reach it).
//!
//! Then the same with TLS and SuperNode authentication (`insecure: false`), still without a
//! Placement: the hub's own cluster runs the pools through the runtime the hub embeds, which
//! makes one key pair per SuperNode pod in a Secret of the cluster; the hub pod registers the
//! public keys through the SuperLink's Control API (its Service name) and only then do the
//! SuperNodes start; the Federation status counts them online from the SuperLink's node list;
//! `flwr run` with the CA the runtime put in `<fed>-superlink-ca` completes. Its SuperLink keeps
//! its database on a `superlink-state` claim (a `local` PersistentVolume on the real node):
//! the SuperLink pod deleted, it comes back knowing the same SuperNodes and the run before, and
//! a new run completes.
//!
//! Needs what `real_node` needs (root, `e2e/k8s/build.sh`, `e2e/node/build.sh`,
//! `e2e/images/build.sh`); fails loudly when something is missing.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Result;
use e2e::harness::wait_for;
use e2e::node::image_archive;
use e2e::pods::check_not_crashing;
use e2e::supernodes::supernode_id;
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
ls = subprocess.run(["flwr", "ls", "/tmp/app", "k8s", "--format", "json"], capture_output=True, text=True)
try:
    print("RUNS", len(json.loads(ls.stdout[ls.stdout.index("{"):])["runs"]))
except (ValueError, KeyError):
    print("RUNS unparsable: " + ls.stdout[-300:])
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
  superlink:
    image: "flwr/superlink:1.25.0"
    service: {exposeControl: true}
    volumeClaimTemplates:
      - metadata: {name: superlink-state}
        spec:
          accessModes: [ReadWriteOnce]
          storageClassName: e2e-local
          resources: {requests: {storage: 64Mi}}
  supernodes:
    image: "flwr/supernode:1.25.0"
    pools:
      - name: default
        replicas: 2
        images: {}
        nodeConfig: {partition-id: "{index}", num-partitions: "{replicas}"}
"#;

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
    // flower-operator's example as a flower-operator user keeps it: plaintext (`insecure: true`,
    // flower-operator's default; ours is TLS, the second Federation below), and the opt-in that
    // puts Control on the pod network.
    let example = std::fs::read_to_string(e2e::repo_root().join(EXAMPLE))?;
    let exposed = example.replace(
        "  superlink:\n    image: flwr/superlink:1.25.0\n",
        "  insecure: true\n  superlink:\n    image: flwr/superlink:1.25.0\n    service: {exposeControl: true}\n",
    );
    anyhow::ensure!(
        exposed != example,
        "{EXAMPLE} changed: exposeControl not added"
    );
    e2e::apply_yaml(&hub.client, &exposed, "default").await?;
    let node = &cp.real_node("hub")?.name;
    federation_runs(hub, node, FEDERATION, SUPERNODES, false, t).await?;

    let (state, storage) = cp
        .real_node("hub")?
        .local_volume("secure-superlink-state")?;
    e2e::apply_yaml(&hub.client, &storage, "default").await?;
    let t = Instant::now();
    e2e::apply_yaml(&hub.client, SECURE, "default").await?;
    let ids = federation_runs(hub, node, "secure", 2, true, t).await?;
    the_secure_federation_authenticated_its_supernodes(hub).await?;
    let refused = e2e::supernodes::hand_made_supernodes_are_refused(
        &hub.client,
        "default",
        "secure",
        "default",
    )
    .await?;
    eprintln!("real_federation: hand-made SuperNode pods: {refused}");
    a_deleted_superlink_pod_comes_back_with_its_state(hub, &state, &ids).await
}

/// The SuperLink pod deleted → the StatefulSet brings it back on the same claim
/// (`--database` on the `superlink-state` volume), so the SuperLink still knows every SuperNode
/// (the same node ids serve Fleet requests again, no key registered anew) and the run before;
/// a new run completes.
async fn a_deleted_superlink_pod_comes_back_with_its_state(
    hub: &e2e::Cluster,
    state: &std::path::Path,
    ids: &BTreeSet<String>,
) -> Result<()> {
    use anyhow::ensure;
    let db = state.join("superlink.db");
    ensure!(
        std::fs::metadata(&db).is_ok_and(|m| m.len() > 0),
        "the SuperLink database is not on the claimed volume: {} missing or empty",
        db.display()
    );
    let t = Instant::now();
    let pods: Api<Pod> = Api::namespaced(hub.client.clone(), "default");
    e2e::pods::delete_and_wait_replaced(&pods, "secure-superlink-0", Duration::from_secs(120))
        .await?;
    let back = t.elapsed();
    if let Err(e) =
        superlink_serves(&pods, "secure-superlink-0", ids, Duration::from_secs(180)).await
    {
        let supernodes = e2e::pods::dump(&pods, "secure-supernode-").await;
        return Err(e.context(format!(
            "after the SuperLink's restart; the SuperNode pods:\n{supernodes}"
        )));
    }
    let restarts: i32 = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("secure-supernode-"))
        })
        .flat_map(|p| {
            p.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
        })
        .map(|c| c.restart_count)
        .sum();
    eprintln!(
        "real_federation: SuperLink pod deleted -> back and Ready in {:.1}s; the same {} SuperNode ids served again after {:.1}s (state kept on the claim; SuperNode container restarts: {restarts})",
        back.as_secs_f64(),
        ids.len(),
        t.elapsed().as_secs_f64()
    );
    let runs = flwr_run(hub, "secure", 2, true, "-after-restart").await?;
    ensure!(
        runs == 2,
        "the SuperLink lists {runs} run(s) after its restart; the run before it was lost (want 2)"
    );
    Ok(())
}

/// Waits until the log of SuperLink pod `superlink` shows Fleet requests from every node id in
/// `ids`.
async fn superlink_serves(
    pods: &Api<Pod>,
    superlink: &str,
    ids: &BTreeSet<String>,
    timeout: Duration,
) -> Result<()> {
    wait_for(
        "the SuperLink serving every SuperNode (Fleet requests with their node ids)",
        timeout,
        || {
            let (pods, superlink, want) = (pods.clone(), superlink.to_owned(), ids.clone());
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
    .await
}

/// Returns the SuperNodes' node ids.
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
) -> Result<BTreeSet<String>> {
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
    superlink_serves(&pods, &superlink, &want, Duration::from_secs(60)).await?;
    eprintln!(
        "real_federation: Federation {name} (TLS {tls}) applied -> SuperLink + {supernodes} SuperNodes (flwr 1.25.0) pods on {node} connected in {:.1}s: {ids:?}",
        connected.as_secs_f64()
    );

    flwr_run(hub, name, supernodes, tls, "").await?;
    Ok(want)
}

/// `flwr run` of examples/fedavg (2 rounds, at least `supernodes` SuperNodes) from a pod against
/// Federation `name`'s Control Service (TLS with its CA Secret when `tls`); checks the run
/// finished `completed`. `suffix` tells the runner pods of several runs apart. Returns how many
/// runs the SuperLink lists afterwards, not counting runs repeated below.
///
/// A run that fails is run again (at most twice) only when a SuperNode of it logged Flower 1.25's
/// own bug during that attempt (e2e/flower/NOTES.md, fact 9; test.sh and real_node do the same);
/// any other failure fails.
async fn flwr_run(
    hub: &e2e::Cluster,
    name: &str,
    supernodes: usize,
    tls: bool,
    suffix: &str,
) -> Result<usize> {
    // Runs of each Federation that failed with Flower's bug and were run again: the SuperLink
    // lists them too.
    static REPEATED: std::sync::Mutex<std::collections::BTreeMap<String, usize>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    let repeated = |add: usize| {
        let mut map = REPEATED.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(name.to_owned()).or_default();
        *n += add;
        *n
    };
    let mut runner = suffix.to_owned();
    for attempt in 0..=2 {
        if let Some(runs) = flwr_run_once(hub, name, supernodes, tls, &runner, attempt == 2).await?
        {
            return Ok(runs.saturating_sub(repeated(0)));
        }
        repeated(1);
        runner = format!("{suffix}-again{}", attempt + 1);
    }
    unreachable!("the last attempt fails instead of asking for another")
}

/// What Flower 1.25.0's SuperLink answers a SuperNode's message pull with, sometimes.
const FLOWER_125_BUG: &str = "Both bytes_sent and bytes_recv cannot be zero";

/// One `flwr run` (see [`flwr_run`]): `Some(runs listed)` when it completed; `None` when it
/// failed with [`FLOWER_125_BUG`] in a SuperNode log and `last` is false; otherwise a failure.
async fn flwr_run_once(
    hub: &e2e::Cluster,
    name: &str,
    supernodes: usize,
    tls: bool,
    suffix: &str,
    last: bool,
) -> Result<Option<usize>> {
    let pods: Api<Pod> = Api::namespaced(hub.client.clone(), "default");
    let superlink = format!("{name}-superlink-0");
    let bugs_before = flower_125_bug_counts(&pods, name).await?;
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
    if status != "finished:completed" && !last {
        let hit = e2e::pods::logged_since(&bugs_before, &flower_125_bug_counts(&pods, name).await?);
        if !hit.is_empty() {
            e2e::harness::retried(
                "flower-1.25-bug",
                format_args!(
                    "real_federation: the run ended {status} with Flower 1.25's \"{FLOWER_125_BUG}\" newly in the log of {hit:?} (a bug inside Flower): running it again"
                ),
            );
            return Ok(None);
        }
    }
    assert_eq!(
        status,
        "finished:completed",
        "the run did not complete; flwr-run pod log:\n{log}\nSuperLink log:\n{}\nSuperNode pods:\n{}\nHub pod:\n{}",
        pods.logs(
            &superlink,
            &LogParams {
                tail_lines: Some(40),
                ..Default::default()
            }
        )
        .await
        .unwrap_or_default(),
        e2e::pods::dump(&pods, &format!("{name}-supernode-")).await,
        e2e::pods::dump(
            &Api::namespaced(hub.client.clone(), "flower-addon-system"),
            "flower-hub"
        )
        .await,
    );
    let runs = log
        .lines()
        .find_map(|l| l.strip_prefix("RUNS "))
        .unwrap_or_default();
    runs.trim()
        .parse()
        .map(Some)
        .map_err(|_| anyhow::anyhow!("flwr ls listed no runs: {runs}"))
}

/// How often each SuperNode pod of Federation `name` logged [`FLOWER_125_BUG`] (see
/// [`e2e::pods::log_counts`]).
async fn flower_125_bug_counts(
    pods: &Api<Pod>,
    name: &str,
) -> Result<std::collections::BTreeMap<String, (String, usize)>> {
    let lp = ListParams::default().labels(&format!(
        "app.kubernetes.io/name=supernode,app.kubernetes.io/instance={name}"
    ));
    e2e::pods::log_counts(pods, &lp, Some("supernode"), FLOWER_125_BUG).await
}

/// The secure Federation's SuperLink requires registered keys, each SuperNode pod's key was made
/// in the cluster (a Secret with one key per pod, never sent), and the status counts the
/// SuperNodes online from the SuperLink's node list under the hub's own cluster.
async fn the_secure_federation_authenticated_its_supernodes(hub: &e2e::Cluster) -> Result<()> {
    use anyhow::ensure;
    e2e::supernodes::superlink_requires_node_auth(&hub.client, "default", "secure").await?;
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

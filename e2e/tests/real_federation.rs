//! A Federation in Kubernetes mode with real Flower pods: the hub installed from CRDs +
//! `manifests/hub/` (its pod from our image) renders `examples/federation-statefulset-subprocess.yaml`
//! (no Placement: it runs in the hub cluster, like flower-operator) into a SuperLink and two
//! SuperNode pods of the `flwr/*:1.25.0` images on the cluster's real node, and both SuperNodes
//! connect to the SuperLink through its Service name (cluster DNS + ClusterIP): each logs its
//! `SuperNode ID`, and the SuperLink logs Fleet requests from both.
//!
//! Needs what `real_node` needs (root, `e2e/k8s/build.sh`, `e2e/node/build.sh`,
//! `e2e/images/build.sh`); fails loudly when something is missing.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Result;
use e2e::node::image_archive;
use e2e::pods::{check_not_crashing, poll};
use e2e::{ControlPlane, Options};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, LogParams};

const IMAGES: [&str; 3] = [
    "ghcr.io/flower-addon/flower-addon:0.1.0",
    "flwr/superlink:1.25.0",
    "flwr/supernode:1.25.0",
];
/// The example applied, and the Federation it names.
const EXAMPLE: &str = "examples/federation-statefulset-subprocess.yaml";
const FEDERATION: &str = "federation-sts-subprocess";

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

    e2e::install_crds(&hub.client).await?;
    let manifests = e2e::repo_root().join("manifests/hub");
    for file in [
        "namespace.yaml",
        "rbac.yaml",
        "deployment.yaml",
        "service.yaml",
    ] {
        e2e::apply_file(&hub.client, &manifests.join(file), "flower-addon-system").await?;
    }
    let t = Instant::now();
    e2e::apply_file(&hub.client, &e2e::repo_root().join(EXAMPLE), "default").await?;

    let hub_pods: Api<Pod> = Api::namespaced(hub.client.clone(), "flower-addon-system");
    let pods: Api<Pod> = Api::namespaced(hub.client.clone(), "default");
    let ids = poll(
        "both SuperNode pods connected (SuperNode ID logged)",
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
                Ok((ids.len() == 2).then_some(ids))
            }
        },
    )
    .await?;
    let connected = t.elapsed();
    let superlink = format!("{FEDERATION}-superlink-0");
    let want: BTreeSet<String> = ids.iter().map(|(_, id)| id.clone()).collect();
    poll(
        "the SuperLink serving both SuperNodes (Fleet requests with their node ids)",
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
        "real_federation: Federation applied -> SuperLink + 2 SuperNodes (flwr 1.25.0) pods on {} connected in {:.1}s: {ids:?}",
        cp.real_node("hub")?.name,
        connected.as_secs_f64()
    );
    Ok(())
}

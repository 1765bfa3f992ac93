//! Open Cluster Management's own hub controllers and klusterlet agents (v1.2.0, built by
//! `e2e/ocm/build.sh`) on the test control plane: two spokes join by OCM's flow (bootstrap
//! kubeconfig, CSR signed by kube-controller-manager, `hubAcceptsClient`), and OCM's placement
//! controller decides a Placement by a label OCM's `ManagedCluster` carries — the ground the
//! addon's OCM integration stands on.
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use e2e::cluster::ControlPlane;
use e2e::harness::{Wait, wait_until};
use e2e::ocm::{OcmHub, managed_cluster_resource};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};

const NS: &str = "fl";

fn placement_decisions() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cluster.open-cluster-management.io",
        "v1beta1",
        "PlacementDecision",
    ))
}

/// The clusters OCM decided for Placement `NS/name`, sorted (every decision page).
async fn decided(client: &kube::Client, name: &str) -> Result<Vec<String>> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &placement_decisions());
    let list = api
        .list(&ListParams::default().labels(&format!(
            "cluster.open-cluster-management.io/placement={name}"
        )))
        .await?;
    let mut clusters: Vec<String> = list
        .items
        .iter()
        .flat_map(|d| {
            d.data["status"]["decisions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|d| d["clusterName"].as_str().map(str::to_owned))
        .collect();
    clusters.sort();
    Ok(clusters)
}

#[tokio::test(flavor = "multi_thread")]
async fn spokes_join_ocm_and_its_placement_controller_decides_by_label() -> Result<()> {
    e2e::install_crypto();
    let mut cp = ControlPlane::start(&["hub", "spoke-1", "spoke-2"]).await?;
    let result = run(&cp).await;
    cp.log_tails_on_error(
        &result,
        &["hub/kube-apiserver", "hub/kube-controller-manager"],
    );
    result
}

async fn run(cp: &ControlPlane) -> Result<()> {
    let hub = cp.cluster("hub")?;
    let dir = cp.work_dir().join("ocm");
    let mut ocm = OcmHub::start(hub, &dir).await?;
    let result = joined_and_placed(&mut ocm, cp).await;
    if result.is_err() {
        for name in ["ocm-registration", "ocm-placement", "klusterlet-edge-1"] {
            let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- {name} (last 30 lines)\n{}",
                lines[lines.len().saturating_sub(30)..].join("\n")
            );
        }
    }
    result
}

async fn joined_and_placed(ocm: &mut OcmHub, cp: &ControlPlane) -> Result<()> {
    let hub = cp.cluster("hub")?.client.clone();
    let mut joins = Vec::new();
    for (spoke, name) in [("spoke-1", "edge-1"), ("spoke-2", "edge-2")] {
        joins.push(ocm.join(cp.cluster(spoke)?, name).await?);
    }
    // OCM's registration controller puts every cluster in its `global` set (DefaultClusterSet).
    let clusters: Api<DynamicObject> = Api::all_with(hub.clone(), &managed_cluster_resource());
    clusters
        .patch(
            "edge-2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"flower": "yes"}}})),
        )
        .await?;
    e2e::apply_yaml(
        &hub,
        &format!(
            r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: cluster.open-cluster-management.io/v1beta2
kind: ManagedClusterSetBinding
metadata: {{name: global, namespace: {NS}}}
spec: {{clusterSet: global}}
---
apiVersion: cluster.open-cluster-management.io/v1beta1
kind: Placement
metadata: {{name: flower, namespace: {NS}}}
spec:
  predicates:
    - requiredClusterSelector:
        labelSelector:
          matchLabels: {{flower: "yes"}}
"#
        ),
        NS,
    )
    .await
    .context("ManagedClusterSetBinding and Placement")?;
    let t = Instant::now();
    Wait::new(
        "OCM's placement controller to decide edge-2 for fl/flower",
        Duration::from_secs(60),
    )
    .until(|| {
        let hub = hub.clone();
        async move { Ok(decided(&hub, "flower").await? == ["edge-2"]) }
    })
    .await?;
    let first = t.elapsed();
    // Relabelled in OCM: the decision follows.
    for (cluster, value) in [("edge-2", "no"), ("edge-1", "yes")] {
        clusters
            .patch(
                cluster,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": {"flower": value}}})),
            )
            .await?;
    }
    let t = Instant::now();
    wait_until(
        "the decision to follow the labels to edge-1",
        Duration::from_secs(60),
        || {
            let hub = hub.clone();
            async move { Ok(decided(&hub, "flower").await? == ["edge-1"]) }
        },
    )
    .await?;
    ensure!(joins.len() == 2);
    eprintln!(
        "ocm: edge-1 and edge-2 joined OCM {} in {:.1}s and {:.1}s; OCM's placement decided edge-2 by label in {:.1}s, and edge-1 after relabelling in {:.1}s",
        e2e::ocm::VERSION,
        joins[0].as_secs_f64(),
        joins[1].as_secs_f64(),
        first.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

//! Open Cluster Management's own hub controllers and klusterlet agents (v1.2.0, built by
//! `e2e/ocm/build.sh`) on the test control plane: two spokes join by OCM's flow (bootstrap
//! kubeconfig, CSR signed by kube-controller-manager, `hubAcceptsClient`), and OCM's placement
//! controller decides a Placement by a label OCM's `ManagedCluster` carries — the ground the
//! addon's OCM integration stands on.
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use e2e::cluster::ControlPlane;
use e2e::harness::{Wait, wait_until};
use e2e::ocm::{OcmHub, managed_cluster_resource};
use flower_addon_hub::channel::source::WorkSource;
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
    e2e::ocm::label_cluster(&hub, "edge-2", "flower", Some("yes")).await?;
    e2e::ocm::place_by_label(&hub, NS, "flower", "flower", "yes").await?;
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
    // The addon's hub, under its own least-privilege ServiceAccount, reads OCM's decisions for a
    // Federation that names the OCM Placement: work goes to edge-2 only.
    let hub_cluster = cp.cluster("hub")?;
    e2e::install_crds(&hub).await?;
    let manifests = e2e::repo_root().join("manifests/hub");
    e2e::apply_file(&hub, &manifests.join("namespace.yaml"), "default").await?;
    let hub_sa = e2e::service_account_access(
        hub_cluster,
        &manifests.join("rbac.yaml"),
        "flower-addon-system",
        "flower-hub",
        3600,
    )
    .await?;
    // Our agents joined under the OCM names (the addon registration of its own).
    for name in ["edge-1", "edge-2"] {
        e2e::apply_yaml(
            &hub,
            &format!(
                "apiVersion: flower-addon.io/v1alpha1\nkind: ManagedCluster\nmetadata: {{name: {name}}}\nspec: {{hubAcceptsClient: true}}\n"
            ),
            NS,
        )
        .await?;
    }
    e2e::apply_yaml(
        &hub,
        &format!(
            r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {{name: fed, namespace: {NS}}}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  placementRef: {{name: flower, apiGroup: cluster.open-cluster-management.io, kind: Placement}}
  superlink: {{image: "flwr/superlink:1.42.0", externalAddress: "hub.example:30092"}}
  supernodes:
    image: "flwr/supernode:1.42.0"
    pools:
      - {{name: a, replicas: 1}}
      - {{name: gpu, replicas: 1, clusterSelector: {{matchLabels: {{gpu: "true"}}}}}}
"#
        ),
        NS,
    )
    .await?;
    let flower_ca = std::sync::Arc::new(flower_addon_hub::registration::ca::HubCa::generate_for(
        flower_addon_hub::registration::ca::CaRole::Flower,
    )?);
    let work =
        flower_addon_hub::kube::work::KubeWorkSource::start(hub_sa.client.clone(), flower_ca)
            .await?;
    let pools = |cluster: &str| -> Vec<String> {
        work.snapshot(cluster)
            .federations
            .iter()
            .flat_map(|f| f.pools.iter().map(|p| p.name.clone()))
            .collect()
    };
    let t_work = Instant::now();
    wait_until(
        "our work source to send fed's pool a to edge-2 (OCM's decision) and nothing to edge-1",
        Duration::from_secs(60),
        || async { Ok(pools("edge-2") == ["a"] && pools("edge-1").is_empty()) },
    )
    .await?;
    // OCM's labels select pools: gpu=true on edge-2 in OCM adds the gpu pool there.
    clusters
        .patch(
            "edge-2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"gpu": "true"}}})),
        )
        .await?;
    wait_until(
        "the gpu pool on edge-2 after OCM's label gpu=true",
        Duration::from_secs(60),
        || async { Ok(pools("edge-2") == ["a", "gpu"]) },
    )
    .await?;
    let work_followed = t_work.elapsed();
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
    let t_moved = Instant::now();
    wait_until(
        "our work to move with OCM's decision: pool a on edge-1, nothing on edge-2",
        Duration::from_secs(60),
        || async { Ok(pools("edge-1") == ["a"] && pools("edge-2").is_empty()) },
    )
    .await?;
    let moved = t_moved.elapsed();
    drop(work);
    ensure!(joins.len() == 2);
    eprintln!(
        "ocm: edge-1 and edge-2 joined OCM {} in {:.1}s and {:.1}s; OCM's placement decided edge-2 by label in {:.1}s, and edge-1 after relabelling in {:.1}s; our work source followed OCM's decision and labels ({:.1}s) and the move ({:.1}s)",
        e2e::ocm::VERSION,
        joins[0].as_secs_f64(),
        joins[1].as_secs_f64(),
        first.as_secs_f64(),
        t.elapsed().as_secs_f64(),
        work_followed.as_secs_f64(),
        moved.as_secs_f64()
    );
    Ok(())
}

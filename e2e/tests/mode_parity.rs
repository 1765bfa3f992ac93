//! The two hub modes place and split the same manifests the same way, each through its real
//! work source: the Kubernetes mode's Placement controller (PlacementDecisions) and
//! `KubeWorkSource` (Federations + decisions + ManagedClusters) on a real hub apiserver, and the
//! standalone hub (`StandaloneHub` on a manifests directory and a file store) with its
//! in-memory work source.
//!
//! The case makes `Balance` decide: Placement `busy` holds cluster c1; Placement `shared` takes 2
//! of the 3 clusters with only the `Balance` prioritizer, and two Federations name it. Placements
//! are balanced against *other Placements* (as OCM and the Kubernetes controller count other
//! PlacementDecisions), so `shared` avoids c1 and both of its Federations run on the same two
//! clusters; a hub that balanced per Federation would spread fed-a and fed-b apart, and one that
//! did not balance would pick c1.
//!
//! The standalone hub runs its SuperLinks as processes; here `flower-superlink` is the stand-in
//! of the hub's tests (it only listens). SuperNode authentication is off (no keys to register: no
//! Control API involved), TLS on: both modes send the same CA bundle because both are given the
//! same Flower CA (the standalone hub's, handed to `KubeWorkSource::start` as `flower-hub serve`
//! hands it the Flower CA from its Secret).
#[path = "../../hub/tests/standalone_support/mod.rs"]
mod standalone_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use flower_addon_crds::{ManagedCluster, PLACEMENT_LABEL, PlacementDecision};
use flower_addon_hub::channel::source::{InMemoryWorkSource, WorkSource};
use flower_addon_hub::kube::controller::placement;
use flower_addon_hub::kube::work::KubeWorkSource;
use flower_addon_hub::registration::store::file::FileStore;
use flower_addon_hub::registration::store::load_or_create_flower_ca;
use flower_addon_hub::standalone::StandaloneHub;
use flower_addon_hub::standalone::status::HubStatus;
use flower_addon_proto::ClusterWork;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use standalone_support::{Dirs, register};

const NS: &str = "team";
const USER: &str = "e2e-user";
const WAIT: Duration = Duration::from_secs(30);
const CLUSTERS: [&str; 3] = ["c1", "c2", "c3"];

/// The cluster set of every cluster and its binding to the namespace.
const SETS: &str = r#"
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
"#;

/// Placement `busy` (c1, by label).
const BUSY: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: Placement
metadata: {name: busy, namespace: team}
spec:
  predicates:
    - requiredClusterSelector: {labelSelector: {matchLabels: {role: busy}}}
"#;

/// Placement `shared`: 2 of the 3 `env: prod` clusters, ranked by `Balance` alone.
const SHARED: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: Placement
metadata: {name: shared, namespace: team}
spec:
  numberOfClusters: 2
  predicates:
    - requiredClusterSelector: {labelSelector: {matchLabels: {env: prod}}}
  prioritizerPolicy:
    mode: Exact
    configurations:
      - scoreCoordinate: {type: BuiltIn, builtIn: Balance}
        weight: 1
"#;

/// Federation `name` on Placement `placement` with `pools` (and `extra` spec lines), its
/// SuperLink on loopback ports `fleet` and `control` (where the standalone hub starts it).
fn federation(
    name: &str,
    placement: &str,
    external_port: u16,
    [fleet, control]: [u16; 2],
    pools: &str,
    extra: &str,
) -> String {
    format!(
        r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {{name: {name}, namespace: team}}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  insecure: false
  supernodeAuthentication: false
  placementRef: {{name: {placement}}}
  superlink:
    image: "flwr/superlink:1.42.0"
    externalAddress: "hub.example:{external_port}"
    service: {{ports: {{grpc: {fleet}, extra: {control}}}}}
  supernodes:
    image: "flwr/supernode:1.42.0"
    pools: {pools}
{extra}"#
    )
}

/// The manifests besides [`SETS`], as two YAML streams: `busy` with its Federation, then `shared`
/// with its two.
fn manifests() -> Result<(String, String)> {
    let ports = e2e::free_ports(6)?;
    let port = |i: usize| [ports[2 * i], ports[2 * i + 1]];
    let fed_busy = federation(
        "fed-busy",
        "busy",
        30091,
        port(0),
        r#"[{name: x, replicas: 1}]"#,
        "",
    );
    let fed_a = federation(
        "fed-a",
        "shared",
        30092,
        port(1),
        r#"[{name: a, replicas: 2, nodeConfig: {partition-id: "{partition}", num-partitions: "{partitions}"}}]"#,
        r#"  clusterOverrides:
    - clusterSelector: {matchLabels: {gpu: "yes"}}
      pools: [a]
      replicas: 3
      env: [{name: MODE, value: gpu}]
"#,
    );
    let fed_b = federation(
        "fed-b",
        "shared",
        30093,
        port(2),
        r#"[{name: b, replicas: 1}, {name: gpu, replicas: 1, clusterSelector: {matchLabels: {gpu: "yes"}}}]"#,
        "",
    );
    Ok((
        format!("{BUSY}---{fed_busy}"),
        format!("{SHARED}---{fed_a}---{fed_b}"),
    ))
}

/// Labels of the clusters (the same in the file store and on the ManagedClusters).
fn cluster_labels() -> BTreeMap<String, BTreeMap<String, String>> {
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    BTreeMap::from([
        (
            "c1".to_string(),
            labels(&[("env", "prod"), ("role", "busy")]),
        ),
        ("c2".to_string(), labels(&[("env", "prod")])),
        ("c3".to_string(), labels(&[("env", "prod"), ("gpu", "yes")])),
    ])
}

/// A cluster's work with what is not part of the comparison normalised: the `version` (each
/// source counts its own snapshots) and the order of the Federations (the Kubernetes work source
/// walks its reflector's store, which has no order; agents key Federations by namespace/name).
fn normalised(mut work: ClusterWork) -> ClusterWork {
    work.version = 0;
    work.federations
        .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    work
}

fn snapshots(work: &dyn WorkSource) -> BTreeMap<String, ClusterWork> {
    CLUSTERS
        .iter()
        .map(|c| (c.to_string(), normalised(work.snapshot(c))))
        .collect()
}

/// Federation name → the clusters whose work holds it.
fn placed(snapshots: &BTreeMap<String, ClusterWork>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (cluster, work) in snapshots {
        for fw in &work.federations {
            out.entry(fw.name.clone())
                .or_default()
                .insert(cluster.clone());
        }
    }
    out
}

/// A cluster's work in a line: each Federation's share and pools (the CA bundle by length).
fn brief(work: &ClusterWork) -> String {
    work.federations
        .iter()
        .map(|f| {
            let pools: Vec<String> = f
                .pools
                .iter()
                .map(|p| format!("{}@{} {}", p.name, p.partition_offset, p.spec_json))
                .collect();
            format!(
                "{} [cluster {}/{}, {} partitions, fleet {}, CA {} bytes, keys {:?}/{:?}] {pools:?}",
                f.name,
                f.cluster_index,
                f.cluster_count,
                f.partitions_total,
                f.superlink_fleet_address,
                f.ca_bundle_pem.len(),
                f.registered_node_keys,
                f.retired_node_keys,
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Within one mode: fed-busy on c1 only, fed-a and fed-b on the same two clusters, not c1.
fn check_placement(mode: &str, snapshots: &BTreeMap<String, ClusterWork>) -> Result<()> {
    let placed = placed(snapshots);
    let on = |name: &str| placed.get(name).cloned().unwrap_or_default();
    ensure!(
        on("fed-busy") == BTreeSet::from(["c1".to_string()]),
        "{mode}: fed-busy must run on c1 only: {placed:?}"
    );
    ensure!(
        on("fed-a") == on("fed-b"),
        "{mode}: the two Federations of Placement shared must run on the same clusters: {placed:?}"
    );
    ensure!(
        on("fed-a").len() == 2 && !on("fed-a").contains("c1"),
        "{mode}: Placement shared must take 2 clusters and balance away from c1, which Placement busy holds: {placed:?}"
    );
    Ok(())
}

/// The standalone hub's work: passes until every Federation is placed and a pass changes nothing.
async fn standalone_work(
    dirs: &Dirs,
    store: Arc<FileStore>,
    ca: Arc<flower_addon_hub::registration::ca::HubCa>,
) -> Result<BTreeMap<String, ClusterWork>> {
    let work = Arc::new(InMemoryWorkSource::new());
    let mut hub = StandaloneHub::new(store, work.clone(), ca, dirs.config(&["hub.example"]));
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut last: Option<BTreeMap<String, ClusterWork>> = None;
    let result = loop {
        // One pass, as `run` makes each second; work is held back until the Federation's
        // SuperLink (the stand-in) listens, so the first passes may send nothing.
        hub.reconcile().await;
        let now = snapshots(work.as_ref());
        let all_placed = placed(&now).len() == 3;
        if all_placed && last.as_ref() == Some(&now) {
            break Ok(now);
        }
        if tokio::time::Instant::now() > deadline {
            let status = HubStatus::read(&dirs.state).map(|s| {
                let feds: Vec<_> = s
                    .federations
                    .iter()
                    .map(|f| (f.name.clone(), f.selected.clone(), f.error.clone()))
                    .collect();
                (s.problems, feds)
            });
            break Err(anyhow::anyhow!(
                "the standalone hub did not settle with every Federation placed in {WAIT:?}: last work {now:?}; status {status:?}"
            ));
        }
        last = Some(now);
        // Polling pace between passes (the SuperLinks take a moment to listen).
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Stops the stand-in SuperLinks (a resolved shutdown ends `run` after at most one pass).
    hub.run(std::future::ready(())).await;
    result
}

/// The Placement controller, under the hub's ServiceAccount, until [`PlacementController::stop`].
struct PlacementController {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl PlacementController {
    fn start(hub_sa: &Client) -> Self {
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let health = flower_addon_agent::ops::Health::new(&[]);
        let task = tokio::spawn(placement::run(hub_sa.clone(), health, async move {
            let _ = rx.await;
        }));
        Self { stop, task }
    }

    async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .context("placement controller did not stop")??;
        Ok(())
    }
}

/// The clusters of every PlacementDecision of `placement`, sorted.
async fn decided(client: &Client, placement: &str) -> Result<Vec<String>> {
    let mut out: Vec<String> = Api::<PlacementDecision>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!("{PLACEMENT_LABEL}={placement}")))
        .await?
        .items
        .into_iter()
        .flat_map(|d| d.status.into_iter().flat_map(|s| s.decisions))
        .map(|d| d.cluster_name)
        .collect();
    out.sort();
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_modes_place_and_split_shared_placements_alike_from_their_work_sources() -> Result<()>
{
    // Invariant: from the same manifests and the same accepted, labelled clusters, the
    // Kubernetes work source (Placement controller + KubeWorkSource on a real apiserver) and the
    // standalone hub's send every cluster the same Federations' work; Federations that share a
    // Placement run on the same clusters, balanced against the other Placement.
    e2e::install_crypto();
    let (first, second) = manifests()?;
    let clusters = cluster_labels();

    // Standalone: the manifests directory, a file store with the clusters accepted.
    let dirs = Dirs::new();
    std::fs::write(
        dirs.manifests.join("parity.yaml"),
        format!("{SETS}---{first}---{second}"),
    )?;
    let store = Arc::new(FileStore::open(&dirs.state).context("file store")?);
    let ca = Arc::new(
        load_or_create_flower_ca(store.as_ref())
            .await
            .context("Flower CA")?,
    );
    register(store.as_ref(), &clusters).await;
    let standalone = standalone_work(&dirs, store.clone(), ca.clone()).await?;
    check_placement("standalone", &standalone)?;

    // Kubernetes: the same clusters as accepted ManagedClusters, the same documents applied.
    let (cp, hub_sa) = e2e::addon::start_hub_with_rbac(NS).await?;
    let client = cp.cluster("hub")?.client.clone();
    for (name, labels) in &clusters {
        let body = serde_json::json!({
            "apiVersion": "flower-addon.io/v1alpha1",
            "kind": "ManagedCluster",
            "metadata": {"name": name, "labels": labels},
            "spec": {"hubAcceptsClient": true},
        });
        Api::<ManagedCluster>::all(client.clone())
            .patch(
                name,
                &PatchParams::apply(USER).force(),
                &Patch::Apply(&body),
            )
            .await
            .with_context(|| format!("apply ManagedCluster {name}"))?;
    }
    let controller = PlacementController::start(&hub_sa.client);
    // The harder order: `shared` decides before `busy` exists (so it may take c1), then `busy`
    // takes c1. Another Placement's new decisions must make the Kubernetes controller evaluate
    // `shared` again (Balance counts them), as the standalone hub evaluates every Placement on
    // each pass; otherwise `shared` would keep c1 until its resync.
    e2e::apply_yaml(&client, SETS, NS).await?;
    e2e::apply_yaml(&client, &second, NS).await?;
    e2e::wait_until("Placement shared decides 2 clusters", WAIT, || async {
        Ok(decided(&client, "shared").await?.len() == 2)
    })
    .await?;
    eprintln!(
        "mode_parity: Placement shared decided {:?} before Placement busy existed",
        decided(&client, "shared").await?
    );
    e2e::apply_yaml(&client, &first, NS).await?;
    e2e::wait_until("Placement busy decides c1", WAIT, || async {
        Ok(decided(&client, "busy").await? == ["c1"])
    })
    .await?;
    let work = KubeWorkSource::start(hub_sa.client.clone(), ca.clone()).await?;
    let converged = e2e::wait_until(
        "the Kubernetes work source sends every cluster what the standalone hub sends",
        WAIT,
        || async { Ok(snapshots(&work) == standalone) },
    )
    .await;
    let kube = snapshots(&work);
    if converged.is_err() {
        for cluster in CLUSTERS.iter().filter(|c| standalone[**c] != kube[**c]) {
            let (s, k) = (&standalone[*cluster], &kube[*cluster]);
            if brief(s) == brief(k) {
                eprintln!("{cluster} differs:\n  standalone: {s:?}\n  kubernetes: {k:?}");
            } else {
                eprintln!(
                    "{cluster} differs:\n  standalone: {}\n  kubernetes: {}",
                    brief(s),
                    brief(k)
                );
            }
        }
    }
    converged.with_context(|| {
        format!(
            "the modes differ: placed by the standalone hub {:?}, by the Kubernetes one {:?}",
            placed(&standalone),
            placed(&kube)
        )
    })?;
    check_placement("kubernetes", &kube)?;
    // What the work source sent follows the PlacementDecisions (the placement is the
    // controller's, not an artefact of the work source).
    let shared: Vec<String> = placed(&kube)["fed-a"].iter().cloned().collect();
    ensure!(
        decided(&client, "shared").await? == shared,
        "PlacementDecisions of shared: {:?}, work on {shared:?}",
        decided(&client, "shared").await?
    );
    // The work carries the Federations' content (not only their names): fed-a on the gpu
    // cluster c3 with the override, numbered after c2's partitions, with fed-a's own CA
    // (derived from the Flower CA: the same in both modes, and not another Federation's).
    let fed_a_ca = ca.federation(NS, "fed-a")?;
    let fed_a_c3 = kube["c3"]
        .federations
        .iter()
        .find(|f| f.name == "fed-a")
        .context("fed-a on c3")?;
    let pool_a = fed_a_c3.pools.first().context("pool a of fed-a on c3")?;
    let pool_spec: serde_json::Value = serde_json::from_str(&pool_a.spec_json)?;
    ensure!(
        pool_a.partition_offset == 2
            && pool_spec["replicas"] == 3
            && fed_a_c3.partitions_total == 5
            && fed_a_c3.ca_bundle_pem == fed_a_ca.bundle_pem()
            && fed_a_c3.ca_bundle_pem != ca.bundle_pem()
            && fed_a_c3.superlink_fleet_address == "hub.example:30092",
        "fed-a on c3: {fed_a_c3:?}"
    );
    controller.stop().await
}

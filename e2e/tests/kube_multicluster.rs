//! The hub's Kubernetes-mode multi-cluster side on a real hub apiserver: the Placement controller
//! turns ManagedClusters + Placements into PlacementDecisions (selectors, relabelling, Steady
//! selection with `numberOfClusters`, taints and expiring tolerations, pagination at 100), under
//! the hub's least-privilege ServiceAccount from `manifests/hub`; the Kubernetes ClusterStore keeps
//! the registration state in ManagedClusters and Secrets.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use e2e::ControlPlane;
use e2e::addon::{AGENT_NS, Addon, AddonOptions, Bootstrap, Spoke, hub_cli};
use flower_addon_crds::{ManagedCluster, PLACEMENT_LABEL, Placement, PlacementDecision};
use flower_addon_hub::channel::source::WorkSource;
use flower_addon_hub::core::placement::TAINT_UNREACHABLE;
use flower_addon_hub::kube::controller::placement;
use flower_addon_hub::kube::store::{self as kube_store, KubeStore};
use flower_addon_hub::kube::work::KubeWorkSource;
use flower_addon_hub::registration::ca::HubCa;
use flower_addon_hub::registration::store::{
    ClusterRegistration, ClusterStatus, ClusterStore, StoreError,
};
use flower_addon_hub::registration::tokens;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::{broadcast, oneshot};

const NS: &str = "team";
const USER: &str = "e2e-user";
const HUB_NS: &str = "flower-addon-system";
const WAIT: Duration = Duration::from_secs(30);

/// Applies (as the user) a ManagedCluster with `labels`, accepted or not, with `taints`.
async fn apply_cluster(
    client: &Client,
    name: &str,
    labels: &[(&str, &str)],
    accepted: bool,
    taints: serde_json::Value,
) -> Result<()> {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let body = serde_json::json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "ManagedCluster",
        "metadata": {"name": name, "labels": labels},
        "spec": {"hubAcceptsClient": accepted, "taints": taints},
    });
    Api::<ManagedCluster>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply(USER).force(),
            &Patch::Apply(&body),
        )
        .await
        .with_context(|| format!("apply ManagedCluster {name}"))?;
    Ok(())
}

/// Sets `status.allocatable` of ManagedCluster `name` (what its agent reports) to `cpu` cores.
async fn set_allocatable(client: &Client, name: &str, cpu: &str) -> Result<()> {
    Api::<ManagedCluster>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"status": {"allocatable": {"cpu": cpu, "memory": "1Gi"}}}),
            ),
        )
        .await
        .with_context(|| format!("set allocatable of ManagedCluster {name}"))?;
    Ok(())
}

async fn apply_placement(client: &Client, name: &str, spec: serde_json::Value) -> Result<()> {
    let body = serde_json::json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "Placement",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    });
    Api::<Placement>::namespaced(client.clone(), NS)
        .patch(
            name,
            &PatchParams::apply(USER).force(),
            &Patch::Apply(&body),
        )
        .await
        .with_context(|| format!("apply Placement {name}"))?;
    Ok(())
}

/// Decision pages of `placement` by name, each with its cluster names.
async fn pages(client: &Client, placement: &str) -> Result<BTreeMap<String, Vec<String>>> {
    Ok(Api::<PlacementDecision>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!("{PLACEMENT_LABEL}={placement}")))
        .await?
        .items
        .into_iter()
        .map(|d| {
            let clusters = d
                .status
                .iter()
                .flat_map(|s| s.decisions.iter().map(|c| c.cluster_name.clone()))
                .collect();
            (d.name_any(), clusters)
        })
        .collect())
}

/// Waits until the decisions of `placement` are exactly `want` (sorted) and the status agrees.
async fn wait_decisions(client: &Client, placement: &str, want: &[&str]) -> Result<Duration> {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    let took = e2e::wait_until(
        &format!("Placement {placement} decides {want:?}"),
        WAIT,
        || {
            let want = want.clone();
            async move {
                let mut got: Vec<String> = pages(client, placement)
                    .await?
                    .into_values()
                    .flatten()
                    .collect();
                got.sort();
                let p = Api::<Placement>::namespaced(client.clone(), NS)
                    .get(placement)
                    .await?;
                let selected = p
                    .status
                    .as_ref()
                    .map_or(-1, |s| s.number_of_selected_clusters);
                Ok(got == want && selected == want.len() as i32)
            }
        },
    )
    .await?;
    eprintln!(
        "Placement {placement} → {want:?} in {:.2}s",
        took.as_secs_f64()
    );
    Ok(took)
}

async fn status_of(client: &Client, placement: &str) -> Result<flower_addon_crds::PlacementStatus> {
    Ok(Api::<Placement>::namespaced(client.clone(), NS)
        .get(placement)
        .await?
        .status
        .unwrap_or_default())
}

fn condition(status: &flower_addon_crds::PlacementStatus, type_: &str) -> Option<String> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

/// A hub control plane with the CRDs, namespace [`NS`], and the hub's ServiceAccount client
/// (RBAC from `manifests/hub`).
async fn hub_with_rbac() -> Result<(ControlPlane, Client, e2e::SaAccess)> {
    let (cp, hub_sa) = e2e::addon::start_hub_with_rbac(NS).await?;
    let client = cp.cluster("hub")?.client.clone();
    Ok((cp, client, hub_sa))
}

/// The Placement controller, under the hub's ServiceAccount, until [`PlacementController::stop`].
struct PlacementController {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl PlacementController {
    fn start(hub_sa: &Client) -> Self {
        let (stop, rx) = oneshot::channel::<()>();
        let health = flower_addon_agent::ops::Health::new(&[]);
        let task = tokio::spawn(placement::run(hub_sa.clone(), health, async move {
            let _ = rx.await;
        }));
        Self { stop, task }
    }

    async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .context("placement controller did not stop")??;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_controller_writes_decisions_on_a_real_hub() -> Result<()> {
    // Invariant: PlacementDecisions always list exactly the accepted, matching, untolerated-taint-
    // free clusters (Steady under numberOfClusters, expiring tolerations honoured, 100 per page,
    // owned by the Placement), and the Placement status says how many and why others are out.
    let (_cp, client, hub_sa) = hub_with_rbac().await?;
    e2e::addon::bind_every_cluster(&client, NS).await?;
    let controller = PlacementController::start(&hub_sa.client);
    let t0 = Instant::now();
    let prod = accepted_matching_clusters_are_decided(&client).await?;
    relabelling_moves_the_decision(&client).await?;
    number_of_clusters_is_steady(&client, &prod).await?;
    an_untolerated_taint_drops_a_cluster(&client).await?;
    a_toleration_keeps_a_cluster_until_it_expires(&client, &prod).await?;
    decisions_are_paginated_at_100(&client).await?;
    no_match_keeps_one_empty_page(&client).await?;
    prioritizers_pick_by_reported_capacity(&client).await?;
    placements_select_only_from_bound_cluster_sets(&client).await?;
    eprintln!("placement scenario took {:.1}s", t0.elapsed().as_secs_f64());
    controller.stop().await
}

/// 1. Three accepted clusters (two prod) and one prod cluster not accepted.
async fn accepted_matching_clusters_are_decided(client: &Client) -> Result<serde_json::Value> {
    let none = serde_json::json!([]);
    apply_cluster(client, "c1", &[("env", "prod")], true, none.clone()).await?;
    apply_cluster(client, "c2", &[("env", "prod")], true, none.clone()).await?;
    apply_cluster(client, "c3", &[("env", "dev")], true, none.clone()).await?;
    apply_cluster(client, "c9", &[("env", "prod")], false, none.clone()).await?;
    let prod = serde_json::json!({"predicates": [
        {"requiredClusterSelector": {"labelSelector": {"matchLabels": {"env": "prod"}}}}
    ]});
    apply_placement(client, "prod", prod.clone()).await?;
    wait_decisions(client, "prod", &["c1", "c2"]).await?;
    let placement_uid = Api::<Placement>::namespaced(client.clone(), NS)
        .get("prod")
        .await?
        .uid()
        .unwrap_or_default();
    let page = Api::<PlacementDecision>::namespaced(client.clone(), NS)
        .get("prod-decision-1")
        .await?;
    ensure!(
        page.owner_references()
            .iter()
            .any(|r| r.uid == placement_uid && r.controller == Some(true)),
        "decision page not owned by the Placement: {:?}",
        page.owner_references()
    );
    let status = status_of(client, "prod").await?;
    ensure!(
        condition(&status, "PlacementSatisfied").as_deref() == Some("True"),
        "PlacementSatisfied: {status:?}"
    );
    ensure!(
        condition(&status, "PlacementMisconfigured").as_deref() == Some("False"),
        "PlacementMisconfigured: {status:?}"
    );
    let out = placement::unselected(&status);
    ensure!(
        out.get("c3")
            .is_some_and(|r| r.contains("no predicate matches"))
            && out.get("c9").is_some_and(|r| r.contains("not accepted")),
        "unselected reasons: {out:?}"
    );

    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), NS);
    e2e::wait_until("a DecisionUpdate event for prod", WAIT, || async {
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|e| {
                e.reporting_controller.as_deref()
                    == Some(flower_addon_hub::kube::controller::HUB_FIELD_MANAGER)
                    && e.reason.as_deref() == Some("DecisionUpdate")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("prod")
                    && e.note.as_deref().is_some_and(|n| n.contains("c1, c2"))
            }))
    })
    .await?;
    Ok(prod)
}

/// 2. Relabelling moves the decision: c2 leaves prod, c3 joins it.
async fn relabelling_moves_the_decision(client: &Client) -> Result<()> {
    let none = serde_json::json!([]);
    apply_cluster(client, "c2", &[("env", "dev")], true, none.clone()).await?;
    apply_cluster(client, "c3", &[("env", "prod")], true, none.clone()).await?;
    wait_decisions(client, "prod", &["c1", "c3"]).await?;
    Ok(())
}

/// 3. numberOfClusters=1 is Steady: a new matching cluster that sorts first does not take
///    the place of the selected one (while the unbounded Placement gets it).
async fn number_of_clusters_is_steady(client: &Client, prod: &serde_json::Value) -> Result<()> {
    let none = serde_json::json!([]);
    let mut one = prod.clone();
    one["numberOfClusters"] = serde_json::json!(1);
    apply_placement(client, "one", one).await?;
    wait_decisions(client, "one", &["c1"]).await?;
    apply_cluster(client, "c0", &[("env", "prod")], true, none.clone()).await?;
    wait_decisions(client, "prod", &["c0", "c1", "c3"]).await?;
    // `one` has been evaluated with c0 once its status names c0 (left out for
    // numberOfClusters); the decisions are written before that status.
    e2e::wait_until(
        "c0 left out of `one` for numberOfClusters",
        WAIT,
        || async {
            let reasons = placement::unselected(&status_of(client, "one").await?);
            Ok(reasons
                .get("c0")
                .is_some_and(|r| r.contains("numberOfClusters")))
        },
    )
    .await
    .with_context(|| "`one` never named c0 in its status".to_string())?;
    let decided: Vec<String> = pages(client, "one")
        .await?
        .into_values()
        .flatten()
        .collect();
    let selected = status_of(client, "one").await?.number_of_selected_clusters;
    ensure!(
        decided == ["c1"] && selected == 1,
        "`one` keeps c1 (Steady): decided {decided:?}, {selected} selected"
    );
    Ok(())
}

/// 4. An untolerated NoSelect taint drops c1 everywhere; `one` takes another cluster.
async fn an_untolerated_taint_drops_a_cluster(client: &Client) -> Result<()> {
    apply_cluster(
        client,
        "c1",
        &[("env", "prod")],
        true,
        serde_json::json!([{"key": "maintenance", "effect": "NoSelect"}]),
    )
    .await?;
    wait_decisions(client, "prod", &["c0", "c3"]).await?;
    wait_decisions(client, "one", &["c0"]).await?;
    let reasons = placement::unselected(&status_of(client, "prod").await?);
    ensure!(
        reasons
            .get("c1")
            .is_some_and(|r| r.contains("maintenance:NoSelect")),
        "c1 left out for its taint: {reasons:?}"
    );
    Ok(())
}

/// 5. A toleration with tolerationSeconds keeps a tainted cluster only until it expires: the
///    controller requeues itself at the expiry (no other change happens meanwhile).
async fn a_toleration_keeps_a_cluster_until_it_expires(
    client: &Client,
    prod: &serde_json::Value,
) -> Result<()> {
    let mut tolerant = prod.clone();
    tolerant["tolerations"] = serde_json::json!([
        {"key": "unreachable", "operator": "Exists", "tolerationSeconds": 6}
    ]);
    apply_placement(client, "tolerant", tolerant).await?;
    wait_decisions(client, "tolerant", &["c0", "c3"]).await?;
    let added =
        k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second())?;
    apply_cluster(
        client,
        "c3",
        &[("env", "prod")],
        true,
        serde_json::json!([{"key": "unreachable", "effect": "NoSelect",
                            "timeAdded": added.to_string()}]),
    )
    .await?;
    wait_decisions(client, "prod", &["c0"]).await?;
    wait_decisions(client, "tolerant", &["c0", "c3"]).await?;
    let dropped = e2e::wait_until("toleration expiry drops c3", WAIT, || async {
        let mut got: Vec<String> = pages(client, "tolerant")
            .await?
            .into_values()
            .flatten()
            .collect();
        got.sort();
        Ok(got == ["c0"])
    })
    .await?;
    let held = added.duration_until(k8s_openapi::jiff::Timestamp::now());
    eprintln!(
        "tolerated for {:.1}s (tolerationSeconds 6)",
        held.as_secs_f64()
    );
    ensure!(
        held.as_secs_f64() >= 5.0 && held.as_secs_f64() < 20.0,
        "c3 dropped {held:?} after the taint, tolerationSeconds was 6 (waited {dropped:?})"
    );
    Ok(())
}

/// 6. Pagination: 101 more clusters → two pages of at most 100; removing them deletes the
///    surplus page.
async fn decisions_are_paginated_at_100(client: &Client) -> Result<()> {
    let none = serde_json::json!([]);
    let every = serde_json::json!({"tolerations": [{"operator": "Exists"}]});
    for i in 0..101 {
        apply_cluster(client, &format!("bulk-{i:03}"), &[], true, none.clone()).await?;
    }
    apply_placement(client, "every", every).await?;
    // bulk-000..100 and c0..c3 (tainted ones tolerated); c9 is not accepted.
    e2e::wait_until("two decision pages", WAIT, || async {
        let p = pages(client, "every").await?;
        let sizes: Vec<usize> = p.values().map(Vec::len).collect();
        Ok(p.len() == 2
            && p.contains_key("every-decision-1")
            && p.contains_key("every-decision-2")
            && sizes.iter().all(|n| *n <= 100)
            && sizes.iter().sum::<usize>() == 105)
    })
    .await?;
    let clusters = Api::<ManagedCluster>::all(client.clone());
    for i in 0..101 {
        clusters
            .delete(&format!("bulk-{i:03}"), &DeleteParams::default())
            .await?;
    }
    wait_decisions(client, "every", &["c0", "c1", "c2", "c3"]).await?;
    e2e::wait_until("surplus page deleted", WAIT, || async {
        Ok(pages(client, "every").await?.len() == 1)
    })
    .await?;
    Ok(())
}

/// 7. Nothing matches → one empty page and PlacementSatisfied=False.
async fn no_match_keeps_one_empty_page(client: &Client) -> Result<()> {
    apply_placement(
        client,
        "nobody",
        serde_json::json!({"predicates": [
            {"requiredClusterSelector": {"labelSelector": {"matchLabels": {"env": "none"}}}}
        ]}),
    )
    .await?;
    wait_decisions(client, "nobody", &[]).await?;
    ensure!(
        pages(client, "nobody").await?.len() == 1,
        "an empty selection keeps one page"
    );
    let status = status_of(client, "nobody").await?;
    ensure!(
        condition(&status, "PlacementSatisfied").as_deref() == Some("False"),
        "PlacementSatisfied for an empty selection: {status:?}"
    );
    Ok(())
}

/// 8. Prioritizers pick by the capacity clusters report: Exact ResourceAllocatableCPU with
///    numberOfClusters 1 takes the cluster with more CPU, and follows when that changes.
async fn prioritizers_pick_by_reported_capacity(client: &Client) -> Result<()> {
    let none = serde_json::json!([]);
    for (name, cpu) in [("small", "4"), ("big", "64")] {
        apply_cluster(client, name, &[("tier", "cpu")], true, none.clone()).await?;
        set_allocatable(client, name, cpu).await?;
    }
    apply_placement(
        client,
        "biggest",
        serde_json::json!({
            "numberOfClusters": 1,
            "predicates": [{"requiredClusterSelector": {"labelSelector": {"matchLabels": {"tier": "cpu"}}}}],
            "prioritizerPolicy": {"mode": "Exact", "configurations": [
                {"scoreCoordinate": {"type": "BuiltIn", "builtIn": "ResourceAllocatableCPU"}, "weight": 1}
            ]}
        }),
    )
    .await?;
    wait_decisions(client, "biggest", &["big"]).await?;
    set_allocatable(client, "small", "128").await?;
    wait_decisions(client, "biggest", &["small"]).await?;
    Ok(())
}

/// 9. Tenancy: in a namespace without a ManagedClusterSetBinding a Placement selects nothing and
///    names no cluster (`NoManagedClusterSetBindings`); bound to the exclusive set `red` it
///    selects only red's member; unbound again, nothing.
async fn placements_select_only_from_bound_cluster_sets(client: &Client) -> Result<()> {
    const TEAM_B: &str = "team-b";
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": TEAM_B}}))?,
        )
        .await?;
    let placements = Api::<Placement>::namespaced(client.clone(), TEAM_B);
    let decisions = Api::<PlacementDecision>::namespaced(client.clone(), TEAM_B);
    placements
        .patch(
            "scoped",
            &PatchParams::apply(USER).force(),
            &Patch::Apply(&serde_json::json!({
                "apiVersion": "flower-addon.io/v1alpha1",
                "kind": "Placement",
                "metadata": {"name": "scoped"},
                "spec": {"tolerations": [{"operator": "Exists"}]},
            })),
        )
        .await?;
    // (reason of PlacementSatisfied, decided clusters, clusters named in unselectedClusters)
    let state = || async {
        let p = placements.get("scoped").await?;
        let status = p.status.unwrap_or_default();
        let reason = status
            .conditions
            .iter()
            .find(|c| c.type_ == "PlacementSatisfied")
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        let mut decided: Vec<String> = decisions
            .list(&ListParams::default().labels(&format!("{PLACEMENT_LABEL}=scoped")))
            .await?
            .items
            .into_iter()
            .flat_map(|d| d.status.map(|s| s.decisions).unwrap_or_default())
            .map(|d| d.cluster_name)
            .collect();
        decided.sort();
        let named: Vec<String> = status
            .unselected_clusters
            .into_iter()
            .map(|u| u.cluster_name)
            .collect();
        anyhow::Ok((reason, decided, named))
    };
    let unbound = || async {
        let (reason, decided, named) = state().await?;
        Ok(reason == "NoManagedClusterSetBindings" && decided.is_empty() && named.is_empty())
    };
    e2e::wait_until(
        "team-b's Placement selects nothing without a binding",
        WAIT,
        unbound,
    )
    .await?;
    let red = r#"
apiVersion: flower-addon.io/v1alpha1
kind: ManagedClusterSet
metadata: {name: red}
spec: {clusterSelector: {selectorType: ExclusiveClusterSetLabel}}
---
apiVersion: flower-addon.io/v1alpha1
kind: ManagedClusterSetBinding
metadata: {name: red}
spec: {clusterSet: red}
"#;
    e2e::apply_yaml(client, red, TEAM_B).await?;
    apply_cluster(
        client,
        "small",
        &[
            ("tier", "cpu"),
            (flower_addon_crds::CLUSTERSET_LABEL, "red"),
        ],
        true,
        serde_json::json!([]),
    )
    .await?;
    e2e::wait_until(
        "team-b's Placement selects red's member only",
        WAIT,
        || async {
            let (reason, decided, named) = state().await?;
            Ok(reason == "AllDecisionsScheduled" && decided == ["small"] && named.is_empty())
        },
    )
    .await?;
    Api::<flower_addon_crds::ManagedClusterSetBinding>::namespaced(client.clone(), TEAM_B)
        .delete("red", &DeleteParams::default())
        .await?;
    e2e::wait_until(
        "team-b's Placement selects nothing once unbound",
        WAIT,
        unbound,
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_store_keeps_registration_state_in_managed_clusters_and_secrets() -> Result<()> {
    // Invariant: the Kubernetes ClusterStore (under the hub's RBAC) keeps one CA, hashed tokens
    // with expiry, exclusive cluster creation pending acceptance, round-trips registration and
    // status, taints unavailable clusters (so Placements drop them), keeps the admin's edits, and
    // announces admin-side changes on changes().
    let (_cp, client, hub_sa) = hub_with_rbac().await?;
    e2e::addon::bind_every_cluster(&client, NS).await?;
    let store = KubeStore::new(hub_sa.client.clone(), HUB_NS);
    let mut changes = store.changes();
    let t0 = Instant::now();
    the_ca_is_created_once(&store, &client).await?;
    let id = tokens_are_hashed_secrets_with_an_expiry(&store, &client).await?;
    clusters_are_created_pending_and_exclusive(&store, &client, &id).await?;
    the_admin_accepts_with_kubectl(&store, &client, &mut changes).await?;
    let controller = PlacementController::start(&hub_sa.client);
    an_unavailable_cluster_is_tainted_and_dropped(&store, &client).await?;
    a_deleted_ca_is_not_replaced_under_joined_clusters(&store, &client).await?;
    a_lost_flower_ca_is_made_anew_and_said(&store, &client, &hub_sa.client).await?;
    revocation_and_deletion(&store, &client).await?;
    eprintln!("store scenario took {:.1}s", t0.elapsed().as_secs_f64());
    controller.stop().await
}

/// CA: created once; a second create returns the first.
async fn the_ca_is_created_once(store: &KubeStore, client: &Client) -> Result<()> {
    ensure!(
        store.load_ca().await?.is_none(),
        "no CA before the first start"
    );
    let first = HubCa::generate()?;
    let stored = store.create_ca(first.material()).await?;
    let second = HubCa::generate()?;
    let again = store.create_ca(second.material()).await?;
    ensure!(
        again.cert_pem == stored.cert_pem && stored.cert_pem == first.material().cert_pem,
        "the first CA wins"
    );
    let ca = flower_addon_hub::cli::serve::load_or_create_ca_secret(client.clone(), HUB_NS).await?;
    ensure!(
        ca.cert_pem() == first.material().cert_pem,
        "serve's CA loader reads the store's CA"
    );
    Ok(())
}

/// Tokens: hashed Secrets with an expiry annotation; verify works; delete revokes.
async fn tokens_are_hashed_secrets_with_an_expiry(
    store: &KubeStore,
    client: &Client,
) -> Result<String> {
    let token = tokens::generate(Duration::from_secs(600), "e2e");
    store.put_token(&token.record).await?;
    let (id, secret) = tokens::parse(&token.token)?;
    let got = store.get_token(id).await?;
    ensure!(
        got.as_ref() == Some(&token.record),
        "token round trip: {got:?}"
    );
    tokens::verify(got.as_ref(), secret, token.record.created_unix + 1)?;
    // A use count is kept in the Secret and checked with each use.
    let once = tokens::generate_scoped(
        Duration::from_secs(600),
        "e2e once",
        tokens::TokenScope {
            cluster_name: Some("spoke-9".into()),
            max_uses: Some(1),
            ..Default::default()
        },
    );
    store.put_token(&once.record).await?;
    ensure!(store.use_token(&once.record.id).await?, "the first use");
    ensure!(!store.use_token(&once.record.id).await?, "no second use");
    let used = store.get_token(&once.record.id).await?.context("kept")?;
    ensure!(
        used.uses == 1 && used.cluster_name.as_deref() == Some("spoke-9"),
        "{used:?}"
    );
    store.delete_token(&once.record.id).await?;
    let raw = Api::<Secret>::namespaced(client.clone(), HUB_NS)
        .get(&format!("{}{id}", kube_store::TOKEN_SECRET_PREFIX))
        .await?;
    ensure!(
        raw.annotations()
            .contains_key(kube_store::ANN_TOKEN_EXPIRES),
        "expiry annotation"
    );
    let body: Vec<u8> = raw
        .data
        .unwrap_or_default()
        .into_values()
        .flat_map(|b| b.0)
        .collect();
    ensure!(
        !String::from_utf8_lossy(&body).contains(secret),
        "the token secret itself is stored"
    );
    ensure!(store.list_tokens().await?.len() == 1, "one token listed");
    // A damaged token Secret (its token.json cut short) is left out of the listing; the other
    // token is still listed, and it is deleted by id like any token.
    let damaged = tokens::generate(Duration::from_secs(600), "e2e damaged");
    store.put_token(&damaged.record).await?;
    let secrets = Api::<Secret>::namespaced(client.clone(), HUB_NS);
    let damaged_name = format!("{}{}", kube_store::TOKEN_SECRET_PREFIX, damaged.record.id);
    secrets
        .patch(
            &damaged_name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"data": {"token.json": "eyJpZCI6"}})),
        )
        .await?;
    let listed: Vec<String> = store
        .list_tokens()
        .await?
        .into_iter()
        .map(|t| t.id)
        .collect();
    ensure!(
        listed == [id.to_owned()],
        "the damaged token left out, the other listed: {listed:?}"
    );
    ensure!(
        store.delete_token(&damaged.record.id).await?,
        "the damaged token deleted by id"
    );
    ensure!(store.delete_token(id).await?, "token deleted");
    ensure!(
        store.get_token(id).await?.is_none(),
        "deleted token is gone"
    );
    ensure!(
        !store.delete_token(id).await?,
        "second delete reports absence"
    );
    Ok(id.to_owned())
}

/// Clusters: created pending, exclusive, registration round-trips.
async fn clusters_are_created_pending_and_exclusive(
    store: &KubeStore,
    client: &Client,
    id: &str,
) -> Result<()> {
    let registration = ClusterRegistration {
        name: "spoke-1".into(),
        labels: BTreeMap::from([("env".into(), "prod".into())]),
        claims: BTreeMap::from([("region".into(), "eu".into())]),
        key_fingerprint: "sha256:00ff".into(),
        previous_key_fingerprint: None,
        agent_version: "0.1.0".into(),
        token_id: id.into(),
        created_unix: 1_700_000_000,
    };
    store.create_cluster(&registration, false).await?;
    ensure!(
        matches!(
            store.create_cluster(&registration, true).await,
            Err(StoreError::AlreadyExists(_))
        ),
        "a second create must fail"
    );
    let record = store
        .get_cluster("spoke-1")
        .await?
        .context("cluster stored")?;
    ensure!(
        record.registration == registration && !record.hub_accepts_client,
        "record: {record:?}"
    );
    let mc = Api::<ManagedCluster>::all(client.clone())
        .get("spoke-1")
        .await?;
    // The registration's labels (the admin's, from the token) are the ManagedCluster's own
    // labels; the agent's claims are in its status.
    ensure!(
        !mc.spec.hub_accepts_client
            && mc.labels().get("env").is_some_and(|v| v == "prod")
            && mc
                .status
                .as_ref()
                .is_some_and(|s| s.labels.is_empty() && !s.cluster_claims.is_empty()),
        "ManagedCluster pending with the admin's labels: {mc:?}"
    );
    Ok(())
}

/// The admin accepts with kubectl: changes() announces it and the record follows.
async fn the_admin_accepts_with_kubectl(
    store: &KubeStore,
    client: &Client,
    changes: &mut broadcast::Receiver<String>,
) -> Result<()> {
    wait_change(changes, "spoke-1").await?;
    Api::<ManagedCluster>::all(client.clone())
        .patch(
            "spoke-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"hubAcceptsClient": true}})),
        )
        .await?;
    wait_change(changes, "spoke-1").await?;
    ensure!(
        store
            .get_cluster("spoke-1")
            .await?
            .is_some_and(|r| r.hub_accepts_client),
        "accepted by the admin"
    );
    Ok(())
}

/// Status: heartbeat and conditions; Available=Unknown adds the unreachable taint and keeps
/// the admin's own taint; the Placement controller then drops the cluster.
async fn an_unavailable_cluster_is_tainted_and_dropped(
    store: &KubeStore,
    client: &Client,
) -> Result<()> {
    apply_placement(client, "all", serde_json::json!({})).await?;
    wait_decisions(client, "all", &["spoke-1"]).await?;
    Api::<ManagedCluster>::all(client.clone())
        .patch(
            "spoke-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"taints": [
                {"key": "admin", "effect": "PreferNoSelect"}
            ]}})),
        )
        .await?;
    let mut status = ClusterStatus {
        last_heartbeat_unix: Some(1_700_000_100),
        client_cert_not_after_unix: Some(1_800_000_000),
        ..Default::default()
    };
    status.set_condition(
        "Available",
        "Unknown",
        "ClusterLeaseExpired",
        "no heartbeat",
        1_700_000_200,
    );
    store.put_status("spoke-1", &status).await?;
    let record = store.get_cluster("spoke-1").await?.context("cluster")?;
    ensure!(
        record.status == status,
        "status round trip: {:?}",
        record.status
    );
    let taints: Vec<String> = Api::<ManagedCluster>::all(client.clone())
        .get("spoke-1")
        .await?
        .spec
        .taints
        .iter()
        .map(|t| t.key.clone())
        .collect();
    ensure!(
        taints == ["admin", TAINT_UNREACHABLE],
        "taints after the lease expired: {taints:?}"
    );
    wait_decisions(client, "all", &[]).await?;
    status.set_condition(
        "Available",
        "True",
        "ClusterLeaseRenewed",
        "",
        1_700_000_300,
    );
    store.put_status("spoke-1", &status).await?;
    wait_decisions(client, "all", &["spoke-1"]).await?;
    Ok(())
}

/// The CA Secret deleted while a cluster holds a client certificate of it (as an admin's
/// mistake or a restore gone wrong would): serve's CA loader refuses to make a new CA (which
/// would lock every agent out), names the Secret and the fix, and writes nothing; once the
/// Secret is restored from its backup, it loads the same CA. The file store does the same
/// (`a_deleted_ca_is_not_replaced_while_clusters_hold_its_certificates`).
async fn a_deleted_ca_is_not_replaced_under_joined_clusters(
    store: &KubeStore,
    client: &Client,
) -> Result<()> {
    let name = kube_store::ca_secret_name(flower_addon_hub::registration::ca::CaRole::Channel);
    let secrets = Api::<Secret>::namespaced(client.clone(), HUB_NS);
    let backup = secrets.get(name).await?;
    let ca = flower_addon_hub::cli::serve::load_or_create_ca_secret(client.clone(), HUB_NS).await?;
    let mut status = store
        .get_cluster("spoke-1")
        .await?
        .context("spoke-1 is registered")?
        .status;
    status.client_cert_issuer = Some(ca.hash().to_owned());
    store.put_status("spoke-1", &status).await?;
    secrets.delete(name, &DeleteParams::default()).await?;
    let error = flower_addon_hub::cli::serve::load_or_create_ca_secret(client.clone(), HUB_NS)
        .await
        .err()
        .context("a new CA was made while spoke-1 holds a certificate of the deleted one")?;
    let message = format!("{error:#}");
    for part in [
        &format!("Secret {HUB_NS}/{name}"),
        "spoke-1",
        ca.hash(),
        "Restore",
        "flower-hub revoke NAME --delete",
    ] {
        ensure!(message.contains(part), "{part:?} missing in: {message}");
    }
    ensure!(
        secrets.get_opt(name).await?.is_none(),
        "the refused start wrote a CA Secret"
    );
    let mut restored = backup;
    restored.metadata.resource_version = None;
    restored.metadata.uid = None;
    restored.metadata.creation_timestamp = None;
    restored.metadata.managed_fields = None;
    secrets.create(&PostParams::default(), &restored).await?;
    let again =
        flower_addon_hub::cli::serve::load_or_create_ca_secret(client.clone(), HUB_NS).await?;
    ensure!(
        again.hash() == ca.hash(),
        "the restored Secret's CA is loaded"
    );
    eprintln!("a deleted CA Secret under a joined cluster: refused with: {message}");
    Ok(())
}

/// The Flower CA Secret deleted after the hub ran: unlike the work-channel CA it heals (a new
/// one signs new SuperLink certificates, SuperNodes get its bundle through their agents), but
/// users' `flwr` trust files break, so serve's loader says so (naming the Secret, what users do
/// and how to keep the old CA) and the hub publishes it as a Warning event on the new Secret,
/// under the hub's RBAC. A first start says nothing.
async fn a_lost_flower_ca_is_made_anew_and_said(
    store: &KubeStore,
    client: &Client,
    hub: &Client,
) -> Result<()> {
    use flower_addon_hub::registration::ca::CaRole;
    use flower_addon_hub::registration::store::load_or_create_ca_noting_loss;
    let name = kube_store::ca_secret_name(CaRole::Flower);
    let first = load_or_create_ca_noting_loss(store, CaRole::Flower).await?;
    ensure!(
        first.replaced_lost.is_none(),
        "a first start: {:?}",
        first.replaced_lost
    );
    let channel =
        flower_addon_hub::cli::serve::load_or_create_ca_secret(client.clone(), HUB_NS).await?;
    flower_addon_hub::cli::serve::mark_cas_in_force(store, &channel, &first.ca).await?;
    let secrets = Api::<Secret>::namespaced(client.clone(), HUB_NS);
    secrets.delete(name, &DeleteParams::default()).await?;
    let again = load_or_create_ca_noting_loss(store, CaRole::Flower).await?;
    let message = again
        .replaced_lost
        .clone()
        .context("a Flower CA made anew after the hub ran says so")?;
    for part in [
        &format!("Secret {HUB_NS}/{name}"),
        "flower-hub connect",
        "restore",
    ] {
        ensure!(message.contains(part), "{part:?} missing in: {message}");
    }
    ensure!(again.ca.cert_pem() != first.ca.cert_pem(), "a new CA");
    flower_addon_hub::cli::serve::publish_lost_flower_ca(hub.clone(), HUB_NS, &message).await;
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), HUB_NS)
        .list(&ListParams::default())
        .await?;
    let event = events
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some(flower_addon_hub::cli::serve::LOST_FLOWER_CA_REASON))
        .context("no FlowerCaRecreated event")?;
    ensure!(
        event.type_.as_deref() == Some("Warning")
            && event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            && event.note.as_deref() == Some(message.as_str()),
        "{event:?}"
    );
    eprintln!("a lost Flower CA made anew: a Warning event on {name}: {message}");
    Ok(())
}

/// Revocation by the store and deletion.
async fn revocation_and_deletion(store: &KubeStore, client: &Client) -> Result<()> {
    store.set_accepted("spoke-1", false).await?;
    ensure!(
        !Api::<ManagedCluster>::all(client.clone())
            .get("spoke-1")
            .await?
            .spec
            .hub_accepts_client,
        "revoked"
    );
    ensure!(
        store.list_clusters().await?.len() == 1,
        "one cluster listed"
    );
    ensure!(store.delete_cluster("spoke-1").await?, "deleted");
    ensure!(store.get_cluster("spoke-1").await?.is_none(), "gone");
    ensure!(!store.delete_cluster("spoke-1").await?, "second delete");
    Ok(())
}

/// Waits until `changes` announces `name`.
async fn wait_change(changes: &mut broadcast::Receiver<String>, name: &str) -> Result<()> {
    tokio::time::timeout(WAIT, async {
        loop {
            match changes.recv().await {
                Ok(n) if n == name => return Ok(()),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => return Err(anyhow::anyhow!("changes closed: {e}")),
            }
        }
    })
    .await
    .with_context(|| format!("no change announced for {name}"))?
}

/// Federation names in the work snapshot of `cluster`, with their pools.
fn work_of(work: &KubeWorkSource, cluster: &str) -> Vec<(String, Vec<String>)> {
    work.snapshot(cluster)
        .federations
        .iter()
        .map(|f| {
            (
                f.name.clone(),
                f.pools.iter().map(|p| p.name.clone()).collect(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_work_source_follows_federations_and_decisions() -> Result<()> {
    // Invariant: each cluster's work snapshot holds exactly the Federations whose Placement
    // decided it, with their pools; it follows relabelling and spec changes, and an invalid
    // Federation keeps the work it had (nothing is pruned while the spec is broken).
    let (_cp, client, hub_sa) = hub_with_rbac().await?;
    e2e::addon::bind_every_cluster(&client, NS).await?;
    let none = serde_json::json!([]);
    apply_cluster(&client, "s1", &[("env", "prod")], true, none.clone()).await?;
    apply_cluster(&client, "s2", &[("env", "prod")], true, none.clone()).await?;
    let controller = PlacementController::start(&hub_sa.client);
    apply_placement(
        &client,
        "prod",
        serde_json::json!({"predicates": [
            {"requiredClusterSelector": {"labelSelector": {"matchLabels": {"env": "prod"}}}}
        ]}),
    )
    .await?;
    wait_decisions(&client, "prod", &["s1", "s2"]).await?;
    let fed = |pools: serde_json::Value, external: Option<&str>| {
        let mut superlink = serde_json::json!({"image": "flwr/superlink:1.42.0"});
        if let Some(address) = external {
            superlink["externalAddress"] = serde_json::json!(address);
        }
        serde_json::json!({
            "apiVersion": "flower-addon.io/v1alpha1",
            "kind": "Federation",
            "metadata": {"name": "fed", "namespace": NS},
            "spec": {
                "mode": "StatefulSet",
                "isolationMode": "subprocess",
                "insecure": false,
                // kwok pods run no Flower and this hub runs on the host, where the SuperLink
                // Service's name does not resolve: no key can be registered, so SuperNode
                // authentication (tested in kube_runtime, control_api and the real-pod tests)
                // would hold every pool at 0 replicas here.
                "supernodeAuthentication": false,
                "placementRef": {"name": "prod"},
                "superlink": superlink,
                "supernodes": {"image": "flwr/supernode:1.42.0", "pools": pools},
            }
        })
    };
    let feds = Api::<flower_addon_crds::Federation>::namespaced(client.clone(), NS);
    let apply_fed = |body: serde_json::Value| {
        let feds = feds.clone();
        async move {
            feds.patch(
                "fed",
                &PatchParams::apply(USER).force(),
                &Patch::Apply(&body),
            )
            .await
            .context("apply Federation")
        }
    };
    apply_fed(fed(
        serde_json::json!([{"name": "a", "replicas": 2, "images": {}}]),
        Some("hub.example:30092"),
    ))
    .await?;
    let t0 = Instant::now();
    let flower_ca = std::sync::Arc::new(flower_addon_hub::registration::ca::HubCa::generate_for(
        flower_addon_hub::registration::ca::CaRole::Flower,
    )?);
    let work = KubeWorkSource::start(hub_sa.client.clone(), flower_ca.clone()).await?;
    eprintln!("work source ready in {:.2}s", t0.elapsed().as_secs_f64());
    let want = |pools: &[&str]| {
        vec![(
            "fed".to_string(),
            pools.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        )]
    };
    e2e::wait_until("both clusters get pool a", WAIT, || async {
        Ok(work_of(&work, "s1") == want(&["a"]) && work_of(&work, "s2") == want(&["a"]))
    })
    .await?;
    let snap = work.snapshot("s2");
    let fw = &snap.federations[0];
    ensure!(
        fw.superlink_fleet_address == "hub.example:30092"
            && fw.ca_bundle_pem == flower_ca.federation(NS, "fed")?.bundle_pem()
            && fw.partitions_total == 4
            && fw.cluster_index == 1
            && fw.cluster_count == 2
            && fw.pools[0].partition_offset == 2,
        "work of s2: {fw:?}"
    );

    // A pool added → both clusters; s2 relabelled out → its work is empty.
    apply_fed(fed(
        serde_json::json!([{"name": "a", "replicas": 2, "images": {}},
                           {"name": "b", "replicas": 1, "images": {}}]),
        Some("hub.example:30092"),
    ))
    .await?;
    e2e::wait_until("pool b everywhere", WAIT, || async {
        Ok(work_of(&work, "s1") == want(&["a", "b"]) && work_of(&work, "s2") == want(&["a", "b"]))
    })
    .await?;
    apply_cluster(&client, "s2", &[("env", "dev")], true, none.clone()).await?;
    e2e::wait_until("s2 loses its work", WAIT, || async {
        Ok(work_of(&work, "s1") == want(&["a", "b"]) && work_of(&work, "s2").is_empty())
    })
    .await?;
    let s1 = work.snapshot("s1").federations[0].clone();
    ensure!(
        s1.cluster_count == 1 && s1.partitions_total == 3,
        "s1 alone: {s1:?}"
    );

    // Invalid (no external address for the spokes) → s1 keeps its work. Federation `marker`,
    // applied after the invalid spec, shows that the work source has processed that spec: both
    // come through its one Federation watch in order, so the pass that gives s1 `marker`'s work
    // computed from a store already holding the invalid `fed`.
    let before = work.snapshot("s1").federations;
    apply_fed(fed(
        serde_json::json!([{"name": "a", "replicas": 5, "images": {}}]),
        None,
    ))
    .await?;
    let mut marker = fed(
        serde_json::json!([{"name": "m", "replicas": 1, "images": {}}]),
        Some("hub.example:30093"),
    );
    marker["metadata"]["name"] = serde_json::json!("marker");
    feds.patch(
        "marker",
        &PatchParams::apply(USER).force(),
        &Patch::Apply(&marker),
    )
    .await
    .context("apply Federation marker")?;
    e2e::wait_until(
        "s1 gets the Federation applied after the invalid one",
        WAIT,
        || async {
            Ok(work_of(&work, "s1")
                .iter()
                .any(|(name, _)| name == "marker"))
        },
    )
    .await?;
    let after: Vec<_> = work
        .snapshot("s1")
        .federations
        .into_iter()
        .filter(|f| f.name == "fed")
        .collect();
    ensure!(
        after == before,
        "an invalid Federation must not change the work: before {before:?}, after {after:?}"
    );

    // Federations deleted → no work anywhere.
    for name in ["fed", "marker"] {
        feds.delete(name, &DeleteParams::default()).await?;
    }
    e2e::wait_until("work removed with the Federations", WAIT, || async {
        Ok(work_of(&work, "s1").is_empty() && work_of(&work, "s2").is_empty())
    })
    .await?;
    controller.stop().await
}

/// Ready replicas of StatefulSet `name` in `NS` of a cluster, if it exists.
async fn sts_ready(client: &Client, name: &str) -> Result<Option<(i32, i32)>> {
    Ok(
        Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(client.clone(), NS)
            .get_opt(name)
            .await?
            .map(|s| {
                (
                    s.status.and_then(|st| st.ready_replicas).unwrap_or(0),
                    s.spec.replicas.unwrap_or(1),
                )
            }),
    )
}

/// Federation `fed` (placementRef `both`, NodePort SuperLink, TLS) with `pools`, and no
/// `externalAddress`: the hub derives it from the Service's node port and its node address.
fn fed_with_pools(pools: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "Federation",
        "metadata": {"name": "fed", "namespace": NS},
        "spec": {
            "mode": "StatefulSet",
            "isolationMode": "subprocess",
            "insecure": false,
            // No key can be registered with a kwok SuperLink from a host-run hub (see above).
            "supernodeAuthentication": false,
            "placementRef": {"name": "both"},
            "superlink": {"image": "flwr/superlink:1.42.0",
                          "service": {"type": "NodePort"}},
            "supernodes": {"image": "flwr/supernode:1.42.0", "pools": pools},
        }
    })
}

async fn apply_fed(client: &Client, body: &serde_json::Value) -> Result<()> {
    Api::<flower_addon_crds::Federation>::namespaced(client.clone(), NS)
        .patch(
            "fed",
            &PatchParams::apply(USER).force(),
            &Patch::Apply(body),
        )
        .await
        .context("apply Federation")?;
    Ok(())
}

/// Waits until StatefulSet `name` on every client has `(ready, desired)` = `want` (None: absent).
async fn wait_pool(
    clients: &[Client],
    name: &str,
    want: Option<(i32, i32)>,
    timeout: Duration,
) -> Result<Duration> {
    e2e::wait_until(
        &format!("{name} {want:?} on every spoke"),
        timeout,
        || async {
            let mut all = true;
            for c in clients {
                all &= sts_ready(c, name).await? == want;
            }
            Ok(all)
        },
    )
    .await
}

/// Hub (`flower-hub serve` in Kubernetes mode) and two agents (Kubernetes runtime) on real
/// apiservers, with Federation `fed` (pool `a`, 2 replicas) Ready on both spokes.
struct World {
    cp: ControlPlane,
    client: Client,
    spoke_clients: [Client; 2],
    /// How each daemon is started.
    addon: Addon,
}

async fn two_spokes_running() -> Result<World> {
    e2e::binary("flower-hub")?;
    e2e::binary("flower-agent")?;
    e2e::install_crypto();
    let mut cp = ControlPlane::start(&["hub", "spoke-1", "spoke-2"])
        .await
        .context("control plane (run e2e/k8s/build.sh if binaries are missing)")?;
    let hub = cp.cluster("hub")?.clone();
    let client = hub.client.clone();
    e2e::install_crds(&hub.client).await?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": NS}}))?,
        )
        .await?;
    // Installed as the README tells an admin: spoke-1's bootstrap Secret printed by
    // `flower-hub token create -o secret`, spoke-2's filled into the template by hand.
    let addon = Addon::install(
        &mut cp,
        &[
            Spoke::new("spoke-1", &[("env", "prod")], Bootstrap::Cli),
            Spoke::new("spoke-2", &[("env", "prod")], Bootstrap::Template),
        ],
        &AddonOptions::default(),
    )
    .await?;
    eprintln!(
        "both spokes joined in {:.1}s",
        addon.joined_in.as_secs_f64()
    );

    // Federation + Placement selecting both spokes (of the set bound to the namespace).
    e2e::addon::bind_every_cluster(&client, NS).await?;
    apply_placement(
        &client,
        "both",
        serde_json::json!({"predicates": [
            {"requiredClusterSelector": {"labelSelector": {"matchLabels": {"env": "prod"}}}}
        ]}),
    )
    .await?;
    let fed = fed_with_pools(serde_json::json!([{"name": "a", "replicas": 2, "images": {}}]));
    let t1 = Instant::now();
    Api::<flower_addon_crds::Federation>::namespaced(client.clone(), NS)
        .patch(
            "fed",
            &PatchParams::apply(USER).force(),
            &Patch::Apply(&fed),
        )
        .await?;
    wait_decisions(&client, "both", &["spoke-1", "spoke-2"]).await?;
    let spoke_clients = [
        cp.cluster("spoke-1")?.client.clone(),
        cp.cluster("spoke-2")?.client.clone(),
    ];
    let processes_ok = std::sync::Mutex::new(&mut cp);
    e2e::wait_until(
        "pool a Ready on both spokes",
        Duration::from_secs(90),
        || async {
            if let Ok(mut cp) = processes_ok.lock() {
                cp.processes().check_alive().map_err(e2e::harness::fatal)?;
            }
            let mut all = true;
            for c in &spoke_clients {
                all &= sts_ready(c, "fed-supernode-a").await? == Some((2, 2));
            }
            Ok(all)
        },
    )
    .await?;
    eprintln!(
        "Federation applied → pools Ready on both spokes in {:.1}s",
        t1.elapsed().as_secs_f64()
    );
    Ok(World {
        cp,
        client,
        spoke_clients,
        addon,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_5b_two_spokes_join_and_run_a_federation() -> Result<()> {
    // Invariant: against the Kubernetes-mode `flower-hub serve` (hub RBAC), two agents join with a
    // token and are accepted on their ManagedClusters; a Federation + Placement selecting both
    // gives a SuperLink and NodePort Service on the hub and Ready pool workloads on both spokes
    // (agent RBAC), the agents' reports appear per cluster in the Federation status, spec changes
    // reach both spokes (a removed pool is pruned), and a relabelled spoke loses its pools.
    let World {
        cp: _cp,
        client,
        spoke_clients,
        addon,
    } = two_spokes_running().await?;
    let t0 = Instant::now();
    federation_status_reports_both_spokes(&client).await?;
    the_metrics_show_the_fleet(&addon).await?;
    let fanouts = scrape(&addon, "flower-hub")?.count(FANOUT_COUNT, &[]);
    agents_report_their_allocatable_cpu(&client, &spoke_clients).await?;
    the_fleet_endpoint_comes_from_the_node_port(&client, &spoke_clients).await?;
    a_missing_placement_is_reported(&client).await?;
    cluster_overrides_apply_where_they_select(&client, &spoke_clients).await?;
    spec_changes_reach_both_spokes(&client, &spoke_clients).await?;
    // Both spokes acked the changed work: at least two more fan-outs were measured.
    wait_metric(
        &addon,
        "flower-hub",
        FANOUT_COUNT,
        &[],
        "two more fan-outs",
        |v| v >= fanouts + 2.0,
    )
    .await?;
    a_relabelled_spoke_loses_its_pools(&client, &spoke_clients).await?;
    bootstrap_refusals(&_cp).await?;
    eprintln!("scenario 5b took {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}

const FANOUT_COUNT: &str = "flower_addon_hub_work_fanout_seconds_count";
/// Work snapshots an agent applied (label `result`: `ok`, `error`), since it started.
const APPLIED_OK: &str = "flower_addon_agent_applies_total";

/// Scrapes the `/metrics` of the addon's daemon `who` (`flower-hub`, `agent-<spoke>`).
fn scrape(addon: &Addon, who: &str) -> Result<e2e::scrape::Samples> {
    let ops = addon
        .ops
        .get(who)
        .with_context(|| format!("no daemon {who}"))?;
    e2e::scrape::Samples::scrape(ops.metrics)
}

/// Waits until `name{labels}` scraped from `who` satisfies `ok`.
async fn wait_metric(
    addon: &Addon,
    who: &str,
    name: &str,
    labels: &[(&str, &str)],
    what: &str,
    ok: impl Fn(f64) -> bool,
) -> Result<()> {
    e2e::wait_until(what, WAIT, || async {
        Ok(ok(scrape(addon, who)?.count(name, labels)))
    })
    .await
    .with_context(|| {
        format!(
            "{name}{labels:?} from {who}: {:?}",
            scrape(addon, who).map(|s| s.value(name, labels))
        )
    })?;
    Ok(())
}

/// In Kubernetes mode the hub and both agents pass their probes, the hub
/// counts 2 connected agents, 2 accepted joins, 2 available clusters, the Federation's 4
/// SuperNodes desired and ready, its SuperLink's restarts (0), and reconciles of both
/// controllers; each agent is connected and has applied work.
async fn the_metrics_show_the_fleet(addon: &Addon) -> Result<()> {
    for (who, ops) in &addon.ops {
        let (code, body) = e2e::scrape::get(ops.health, "/healthz")?;
        ensure!(code == 200, "{who} /healthz: HTTP {code}: {body}");
        e2e::wait_until(&format!("{who} /readyz"), WAIT, || async {
            Ok(e2e::scrape::get(ops.health, "/readyz")?.0 == 200)
        })
        .await
        .with_context(|| format!("{:?}", e2e::scrape::get(ops.health, "/readyz")))?;
    }
    let (_, readyz) = e2e::scrape::get(addon.ops["flower-hub"].health, "/readyz")?;
    for check in [
        "work-channel",
        "work-source",
        "federation-controller",
        "placement-controller",
    ] {
        ensure!(
            readyz.contains(&format!("[+]{check} ok")),
            "hub /readyz lacks {check}: {readyz}"
        );
    }
    let hub = "flower-hub";
    let fed = [("namespace", NS), ("federation", "fed")];
    wait_metric(
        addon,
        hub,
        "flower_addon_hub_connected_agents",
        &[],
        "2 agents connected",
        |v| v == 2.0,
    )
    .await?;
    wait_metric(
        addon,
        hub,
        "flower_addon_hub_clusters",
        &[("available", "True")],
        "2 clusters available",
        |v| v == 2.0,
    )
    .await?;
    for state in ["desired", "ready"] {
        let labels = [fed[0], fed[1], ("state", state)];
        wait_metric(
            addon,
            hub,
            "flower_addon_hub_supernodes",
            &labels,
            &format!("4 SuperNodes {state}"),
            |v| v == 4.0,
        )
        .await?;
    }
    let m = scrape(addon, hub)?;
    ensure!(
        m.value("flower_addon_hub_superlink_restarts", &fed) == Some(0.0),
        "SuperLink restarts of fed: {:?}",
        m.value("flower_addon_hub_superlink_restarts", &fed)
    );
    ensure!(
        m.count("flower_addon_hub_joins_total", &[("result", "accepted")]) == 2.0,
        "accepted joins: {}",
        m.count("flower_addon_hub_joins_total", &[("result", "accepted")])
    );
    for controller in ["federation", "placement"] {
        let n = m.count(
            "flower_addon_hub_reconciles_total",
            &[("controller", controller)],
        );
        ensure!(n > 0.0, "no {controller} reconcile counted");
    }
    for agent in ["agent-spoke-1", "agent-spoke-2"] {
        let a = scrape(addon, agent)?;
        let (connected, applied) = (
            a.count("flower_addon_agent_hub_connected", &[]),
            a.count("flower_addon_agent_applies_total", &[("result", "ok")]),
        );
        ensure!(
            connected == 1.0 && applied >= 1.0,
            "{agent}: connected {connected}, applies {applied}"
        );
    }
    eprintln!(
        "metrics: hub and agents ready; 2 agents connected, 2 clusters available, 4/4 SuperNodes, hub RSS {:.1} MiB",
        m.count("process_resident_memory_bytes", &[]) / 1048576.0
    );
    Ok(())
}

/// The agents' reports reach the Federation status: per cluster 2/2 and connected, then the
/// totals (4/4, 2 clusters) and Ready.
async fn federation_status_reports_both_spokes(client: &Client) -> Result<()> {
    let feds = Api::<flower_addon_crds::Federation>::namespaced(client.clone(), NS);
    let took = e2e::wait_until(
        "Federation status.clusters 2/2 and connected on both spokes",
        Duration::from_secs(60),
        || async {
            let status = feds.get("fed").await?.status.unwrap_or_default();
            let got: Vec<(String, Option<String>, bool)> = status
                .clusters
                .iter()
                .map(|c| (c.name.clone(), c.supernodes.clone(), c.connected))
                .collect();
            Ok(got
                == [
                    ("spoke-1".to_string(), Some("2/2".to_string()), true),
                    ("spoke-2".to_string(), Some("2/2".to_string()), true),
                ])
        },
    )
    .await?;
    eprintln!(
        "per-cluster Federation status 2/2 on both spokes {:.1}s after pods Ready",
        took.as_secs_f64()
    );
    // The totals and Ready come from the spokes' reports (what `kubectl get federation` shows).
    e2e::wait_until(
        "Federation supernodes 4/4, 2 clusters, Ready=True",
        Duration::from_secs(60),
        || async {
            let status = feds.get("fed").await?.status.unwrap_or_default();
            let is_true = |t: &str| {
                status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == t && c.status == "True")
            };
            Ok(status.supernodes.as_deref() == Some("4/4")
                && status.selected_clusters == 2
                && is_true("Ready")
                && is_true("PlacementSatisfied"))
        },
    )
    .await?;
    Ok(())
}

/// Each agent reports its cluster's allocatable CPU (summed over its nodes) into its
/// ManagedCluster, for the ResourceAllocatable* prioritizers.
async fn agents_report_their_allocatable_cpu(
    client: &Client,
    spoke_clients: &[Client; 2],
) -> Result<()> {
    let clusters = Api::<ManagedCluster>::all(client.clone());
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(spoke_clients[0].clone())
        .list(&Default::default())
        .await?;
    let want_millis: f64 = nodes
        .items
        .iter()
        .filter_map(|n| n.status.as_ref()?.allocatable.as_ref()?.get("cpu"))
        .filter_map(|q| flower_addon_crds::parse_quantity(&q.0))
        .sum::<f64>()
        * 1000.0;
    let want = format!("{}m", want_millis.round());
    e2e::wait_until("spoke-1 reports its allocatable CPU", WAIT, || async {
        let mc = clusters.get("spoke-1").await?;
        Ok(mc
            .status
            .and_then(|s| s.allocatable.get("cpu").map(|q| q.0.clone()))
            == Some(want.clone()))
    })
    .await?;
    Ok(())
}

/// No address typed by hand: the Fleet endpoint is the hub's node address (the Deployment's
/// status.hostIP, here this machine) and the node port Kubernetes allocated, and it is what
/// the spokes' SuperNodes dial; status.pools sums the pool over both spokes.
async fn the_fleet_endpoint_comes_from_the_node_port(
    client: &Client,
    spoke_clients: &[Client; 2],
) -> Result<()> {
    let feds = Api::<flower_addon_crds::Federation>::namespaced(client.clone(), NS);
    let node_ports: BTreeMap<String, i32> =
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), NS)
            .get("fed-superlink")
            .await?
            .spec
            .and_then(|s| s.ports)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| Some((p.name?, p.node_port?)))
            .collect();
    let status = feds.get("fed").await?.status.unwrap_or_default();
    let port = |name: &str| {
        node_ports
            .get(name)
            .map(|p| format!("127.0.0.1:{p}"))
            .with_context(|| format!("the SuperLink Service has no {name} node port"))
    };
    let derived = port("fleet")?;
    let endpoints = status.endpoints.clone().unwrap_or_default();
    // The NodePort SuperNodes reach serves no Control API (no `control` node port,
    // no external Control endpoint).
    ensure!(
        endpoints.fleet.as_deref() == Some(derived.as_str())
            && endpoints.control.is_none()
            && !node_ports.contains_key("control"),
        "endpoints derived from the NodePort Service: {endpoints:?} (node ports {node_ports:?}), want fleet {derived} and no Control endpoint"
    );
    // Nor is Control on the pod network: no Service of it, and the SuperLink's NetworkPolicy
    // admits the Fleet port only.
    let control = Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), NS)
        .get_opt("fed-superlink-control")
        .await?;
    ensure!(
        control.is_none(),
        "Service fed-superlink-control: {control:?}"
    );
    let policy =
        Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(client.clone(), NS)
            .get("fed-superlink")
            .await?;
    let admitted: Vec<_> = policy
        .spec
        .and_then(|s| s.ingress)
        .unwrap_or_default()
        .iter()
        .flat_map(|r| r.ports.clone().unwrap_or_default())
        .map(|p| p.port)
        .collect();
    ensure!(
        admitted.len() == 1,
        "NetworkPolicy fed-superlink admits {admitted:?}, want the Fleet port only"
    );
    let pools: Vec<(String, i32, i32)> = status
        .pools
        .iter()
        .map(|p| (p.name.clone(), p.desired, p.ready))
        .collect();
    ensure!(
        pools == [("a".to_string(), 4, 4)],
        "status.pools: {pools:?}"
    );
    for c in spoke_clients {
        let sts = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(c.clone(), NS)
            .get("fed-supernode-a")
            .await?;
        let args = sts
            .spec
            .template
            .spec
            .and_then(|p| p.containers.into_iter().find(|c| c.name == "supernode"))
            .and_then(|c| c.args)
            .unwrap_or_default();
        ensure!(
            args.contains(&format!("--superlink={derived}")),
            "spoke SuperNodes dial the derived address: {args:?}"
        );
    }
    Ok(())
}

/// A Federation whose Placement does not exist says so (and is not Ready); once the Placement
/// is created, the Federation's PlacementSatisfied follows it.
async fn a_missing_placement_is_reported(client: &Client) -> Result<()> {
    let feds = Api::<flower_addon_crds::Federation>::namespaced(client.clone(), NS);
    let mut orphan =
        fed_with_pools(serde_json::json!([{"name": "a", "replicas": 1, "images": {}}]));
    orphan["metadata"]["name"] = "orphan".into();
    orphan["spec"]["placementRef"]["name"] = "later".into();
    feds.patch(
        "orphan",
        &PatchParams::apply(USER).force(),
        &Patch::Apply(&orphan),
    )
    .await?;
    let placement_condition = |f: flower_addon_crds::Federation| {
        f.status.and_then(|s| {
            s.conditions
                .into_iter()
                .find(|c| c.type_ == "PlacementSatisfied")
                .map(|c| (c.status, c.reason))
        })
    };
    e2e::wait_until(
        "orphan: PlacementSatisfied=False, PlacementNotFound",
        WAIT,
        || async {
            Ok(placement_condition(feds.get("orphan").await?)
                == Some(("False".into(), "PlacementNotFound".into())))
        },
    )
    .await?;
    apply_placement(
        client,
        "later",
        serde_json::json!({"predicates": [
            {"requiredClusterSelector": {"labelSelector": {"matchLabels": {"env": "prod"}}}}
        ]}),
    )
    .await?;
    e2e::wait_until(
        "orphan: PlacementSatisfied follows the new Placement",
        WAIT,
        || async {
            Ok(placement_condition(feds.get("orphan").await?).map(|c| c.0) == Some("True".into()))
        },
    )
    .await?;
    feds.delete("orphan", &DeleteParams::default()).await?;
    let svc = Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), NS)
        .get("fed-superlink")
        .await?;
    ensure!(
        svc.spec.and_then(|s| s.type_).as_deref() == Some("NodePort"),
        "NodePort SuperLink Service on the hub"
    );
    ensure!(
        sts_ready(client, "fed-superlink").await?.is_some(),
        "SuperLink StatefulSet on the hub"
    );
    ensure!(
        sts_ready(client, "fed-supernode-a").await?.is_none(),
        "no pool runs in the hub cluster for a placementRef Federation"
    );
    Ok(())
}

/// Per-cluster overrides merge on the clusters they select only: spoke-1 (labelled
/// tier=big by the admin) runs pool a with 3 replicas and MODE=big, spoke-2 as written.
async fn cluster_overrides_apply_where_they_select(
    client: &Client,
    spoke_clients: &[Client; 2],
) -> Result<()> {
    let clusters = Api::<ManagedCluster>::all(client.clone());
    clusters
        .patch(
            "spoke-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"tier": "big"}}})),
        )
        .await?;
    let mut overridden = fed_with_pools(serde_json::json!([{"name": "a", "replicas": 2}]));
    overridden["spec"]["clusterOverrides"] = serde_json::json!([{
        "clusterSelector": {"matchLabels": {"tier": "big"}},
        "replicas": 3,
        "env": [{"name": "MODE", "value": "big"}]
    }]);
    apply_fed(client, &overridden).await?;
    wait_pool(&spoke_clients[..1], "fed-supernode-a", Some((3, 3)), WAIT).await?;
    wait_pool(&spoke_clients[1..], "fed-supernode-a", Some((2, 2)), WAIT).await?;
    let mode_env = |c: &Client| {
        let c = c.clone();
        async move {
            let sts = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(c, NS)
                .get("fed-supernode-a")
                .await?;
            anyhow::Ok(
                sts.spec
                    .template
                    .spec
                    .and_then(|p| p.containers.into_iter().find(|c| c.name == "supernode"))
                    .and_then(|c| c.env)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|e| e.name == "MODE")
                    .and_then(|e| e.value),
            )
        }
    };
    ensure!(
        mode_env(&spoke_clients[0]).await?.as_deref() == Some("big")
            && mode_env(&spoke_clients[1]).await?.is_none(),
        "the override's env only on spoke-1"
    );
    Ok(())
}

/// c. Replicas changed and a pool added → on both spokes; the pool removed → pruned on both.
async fn spec_changes_reach_both_spokes(
    client: &Client,
    spoke_clients: &[Client; 2],
) -> Result<()> {
    apply_fed(
        client,
        &fed_with_pools(serde_json::json!([
            {"name": "a", "replicas": 3, "images": {}},
            {"name": "b", "replicas": 1, "images": {}}
        ])),
    )
    .await?;
    let took = wait_pool(spoke_clients, "fed-supernode-a", Some((3, 3)), WAIT).await?;
    wait_pool(spoke_clients, "fed-supernode-b", Some((1, 1)), WAIT).await?;
    eprintln!(
        "replicas 2→3 and pool b on both spokes in {:.1}s",
        took.as_secs_f64()
    );
    apply_fed(
        client,
        &fed_with_pools(serde_json::json!([{"name": "a", "replicas": 3, "images": {}}])),
    )
    .await?;
    wait_pool(spoke_clients, "fed-supernode-b", None, WAIT).await?;
    // The headless Service a StatefulSet pool names goes with its pool; pool a's stays.
    e2e::wait_until(
        "pool b's headless Service pruned on both spokes",
        WAIT,
        || async {
            let mut gone = true;
            for c in spoke_clients {
                let services =
                    Api::<k8s_openapi::api::core::v1::Service>::namespaced(c.clone(), NS);
                gone &= services.get_opt("fed-supernode-b").await?.is_none()
                    && services.get_opt("fed-supernode-a").await?.is_some();
            }
            Ok(gone)
        },
    )
    .await?;
    wait_pool(spoke_clients, "fed-supernode-a", Some((3, 3)), WAIT).await?;
    Ok(())
}

/// spoke-2 relabelled out of the Placement → its pool is pruned; spoke-1 keeps running.
async fn a_relabelled_spoke_loses_its_pools(
    client: &Client,
    spoke_clients: &[Client; 2],
) -> Result<()> {
    let clusters = Api::<ManagedCluster>::all(client.clone());
    let feds = Api::<flower_addon_crds::Federation>::namespaced(client.clone(), NS);
    let sts1 =
        Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(spoke_clients[0].clone(), NS)
            .get("fed-supernode-a")
            .await?
            .uid();
    clusters
        .patch(
            "spoke-2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"env": "dev"}}})),
        )
        .await?;
    wait_decisions(client, "both", &["spoke-1"]).await?;
    e2e::wait_until(
        "pool a pruned on spoke-2",
        Duration::from_secs(60),
        || async {
            Ok(sts_ready(&spoke_clients[1], "fed-supernode-a")
                .await?
                .is_none())
        },
    )
    .await?;
    let still =
        Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(spoke_clients[0].clone(), NS)
            .get("fed-supernode-a")
            .await?
            .uid();
    ensure!(still == sts1, "spoke-1's pool was recreated");
    e2e::wait_until(
        "status.clusters lists only spoke-1",
        Duration::from_secs(30),
        || async {
            let status = feds.get("fed").await?.status.unwrap_or_default();
            Ok(status
                .clusters
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                == ["spoke-1"])
        },
    )
    .await?;
    let heartbeat = clusters
        .get("spoke-1")
        .await?
        .status
        .and_then(|s| s.last_heartbeat);
    ensure!(heartbeat.is_some(), "spoke-1 reports heartbeats");
    Ok(())
}

/// Invariant: an agent joining from a bootstrap Secret refuses the unfilled template, a hub whose
/// CA does not match the pinned hash, and a token the hub does not know; each exits non-zero with
/// a message naming the cause, and none stores a client certificate.
async fn bootstrap_refusals(cp: &ControlPlane) -> Result<()> {
    let root = e2e::repo_root();
    let spoke = cp.cluster("spoke-1")?;
    let admin = cp.cluster("hub")?.kubeconfig.clone();
    let secrets = Api::<Secret>::namespaced(spoke.client.clone(), AGENT_NS);
    let hub_address = secrets
        .get("flower-agent-bootstrap")
        .await?
        .data
        .and_then(|d| {
            d.get("hub")
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        })
        .context("spoke-1's bootstrap Secret names the hub")?;
    let created: serde_json::Value = serde_json::from_str(&hub_cli(
        &admin,
        &[
            "token",
            "create",
            "--ttl",
            "10m",
            "--hub",
            &hub_address,
            "-o",
            "json",
        ],
    )?)?;
    let template = std::fs::read_to_string(root.join("manifests/agent/bootstrap-secret.yaml"))?;
    let real = |yaml: &str, token: &str, ca_hash: &str| {
        yaml.replace("REPLACE-WITH-BOOTSTRAP-TOKEN", token)
            .replace("REPLACE-WITH-HUB-HOST:PORT", &hub_address)
            .replace("sha256:REPLACE-WITH-HUB-CA-SHA256", ca_hash)
            .replace("REPLACE-WITH-CLUSTER-NAME", "intruder")
    };
    let token = created["token"].as_str().context("token")?;
    let ca_hash = created["caHash"].as_str().context("caHash")?;
    let wrong_hash = format!("sha256:{}", "00".repeat(32));
    let cases = [
        (
            "neg-template",
            template.clone(),
            "key hub still holds the template placeholder",
        ),
        (
            "neg-ca",
            real(&template, token, &wrong_hash),
            "refusing to join",
        ),
        (
            "neg-token",
            real(&template, "abcdef.0123456789abcdef", ca_hash),
            "the hub refused to join",
        ),
    ];
    for (name, yaml, expected) in cases {
        let yaml = yaml.replace("name: flower-agent-bootstrap", &format!("name: {name}"));
        e2e::apply_yaml(&spoke.client, &yaml, AGENT_NS).await?;
        let creds = format!("{name}-credentials");
        let out = std::process::Command::new(e2e::binary("flower-agent")?)
            .args([
                "join",
                "--namespace",
                AGENT_NS,
                "--bootstrap-secret",
                name,
                "--credentials-secret",
                &creds,
                "--timeout",
                "20s",
            ])
            .env("KUBECONFIG", &spoke.kubeconfig)
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && stderr.contains(expected),
            "{name}: expected a failure saying {expected:?}, got {:?}: {stderr}",
            out.status
        );
        let stored = secrets.get_opt(&creds).await?.and_then(|s| s.data);
        ensure!(
            !stored.is_some_and(|d| d.contains_key("client.crt")),
            "{name}: a refused join stored a client certificate"
        );
        eprintln!(
            "{name}: refused ({})",
            stderr.trim().lines().last().unwrap_or_default()
        );
    }
    ensure!(
        Api::<ManagedCluster>::all(cp.cluster("hub")?.client.clone())
            .get_opt("intruder")
            .await?
            .is_none(),
        "a refused join registered a cluster"
    );
    Ok(())
}

/// `(status, reason)` of condition `type_` of a ManagedCluster.
fn cluster_condition(c: &ManagedCluster, type_: &str) -> Option<(String, String)> {
    c.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// `uid@resourceVersion` of StatefulSet `fed-supernode-a` in `NS`.
async fn pool_identity(client: &Client) -> Result<String> {
    let s = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(client.clone(), NS)
        .get("fed-supernode-a")
        .await?;
    Ok(format!(
        "{}@{}",
        s.uid().unwrap_or_default(),
        s.resource_version().unwrap_or_default()
    ))
}

/// Pod name → uid in `NS`.
async fn pod_uids(client: &Client) -> Result<BTreeMap<String, String>> {
    e2e::pod_uids(client, NS).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenarios_5efg_restarts_change_nothing_and_a_lost_lease_drops_the_cluster() -> Result<()> {
    // Invariant: restarting the hub or an agent recreates no pod and rewrites no workload on any
    // spoke; an agent that stops heartbeating gets the unreachable taint and its Placement drops
    // it (its workloads keep running), and it is selected again once it is back; revoking a
    // cluster (hubAcceptsClient=false) cuts its stream.
    let World {
        mut cp,
        client,
        spoke_clients,
        addon,
    } = two_spokes_running().await?;
    // The identities below include the StatefulSet's resourceVersion: taken once the
    // controller-manager has written its final status, so that a later change is the hub's or
    // an agent's.
    for c in &spoke_clients {
        e2e::wait_statefulsets_settled(c, NS).await?;
    }
    let before: Vec<(String, BTreeMap<String, String>)> = {
        let mut v = Vec::new();
        for c in &spoke_clients {
            v.push((pool_identity(c).await?, pod_uids(c).await?));
        }
        v
    };

    a_hub_restart_changes_nothing(&mut cp, &addon, &client, &spoke_clients, &before).await?;
    an_agent_restart_without_tokens_changes_nothing(
        &mut cp,
        &addon,
        &client,
        &spoke_clients,
        &before,
    )
    .await?;
    a_stopped_agent_is_dropped_until_it_is_back(&mut cp, &addon, &client, &spoke_clients, &before)
        .await?;
    revoking_a_cluster_cuts_its_stream(&cp, &addon, &client, &spoke_clients[0]).await?;
    a_revocation_while_the_hub_is_down_is_recorded(&mut cp, &addon, &client).await
}

/// f. Hub restarted: the agents reconnect, nothing on the spokes changes.
async fn a_hub_restart_changes_nothing(
    cp: &mut ControlPlane,
    addon: &Addon,
    client: &Client,
    spoke_clients: &[Client; 2],
    before: &[(String, BTreeMap<String, String>)],
) -> Result<()> {
    const AGENTS: [&str; 2] = ["agent-spoke-1", "agent-spoke-2"];
    let mut applied = Vec::new();
    for agent in AGENTS {
        applied.push(scrape(addon, agent)?.count(APPLIED_OK, &[("result", "ok")]));
    }
    cp.processes().stop("flower-hub")?;
    // Heartbeats are recorded in whole seconds, and a restarted hub with its agents back may
    // write theirs within the second it was started in (seen: 0.7 s), which may be the second
    // the stopped hub last wrote in: start it in the next second, so that a heartbeat of that
    // second or later is the new hub's (a wait on the clock, not on the system under test).
    let stopped_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    let restarted = stopped_ms.div_euclid(1000) + 1;
    tokio::time::sleep(Duration::from_millis(
        (restarted * 1000 - stopped_ms) as u64,
    ))
    .await;
    let t = Instant::now();
    addon.start(cp, "flower-hub")?;
    let feds = Api::<flower_addon_crds::Federation>::namespaced(client.clone(), NS);
    let clusters = Api::<ManagedCluster>::all(client.clone());
    let heartbeats = e2e::wait_until(
        "both agents heartbeat to the restarted hub",
        WAIT,
        || async {
            let mut all = true;
            for spoke in ["spoke-1", "spoke-2"] {
                all &= clusters
                    .get(spoke)
                    .await?
                    .status
                    .and_then(|s| s.last_heartbeat)
                    .is_some_and(|t| t.0.as_second() >= restarted);
            }
            Ok(all)
        },
    )
    .await;
    if heartbeats.is_err() {
        // What the next person needs to tell a slow reconnect from a lost heartbeat write.
        for spoke in ["spoke-1", "spoke-2"] {
            let status = clusters.get(spoke).await.ok().and_then(|c| c.status);
            eprintln!(
                "{spoke}: lastHeartbeat {:?}, hub restarted at {restarted}, conditions {:?}",
                status.as_ref().and_then(|s| s.last_heartbeat.clone()),
                status.map(|s| s.conditions)
            );
        }
    }
    cp.log_tails_on_error(
        &heartbeats,
        &["flower-hub", "agent-spoke-1", "agent-spoke-2"],
    );
    heartbeats?;
    e2e::wait_until(
        "both clusters connected in the Federation status",
        WAIT,
        || async {
            let status = feds.get("fed").await?.status.unwrap_or_default();
            Ok(status.clusters.len() == 2 && status.clusters.iter().all(|c| c.connected))
        },
    )
    .await?;
    // Each agent has applied the restarted hub's work: whatever that changes has been written.
    for (agent, before) in AGENTS.into_iter().zip(applied) {
        wait_metric(
            addon,
            agent,
            APPLIED_OK,
            &[("result", "ok")],
            "the restarted hub's work applied",
            |v| v > before,
        )
        .await?;
    }
    for (c, (identity, pods)) in spoke_clients.iter().zip(before) {
        ensure!(
            &pool_identity(c).await? == identity,
            "a workload changed after the hub restart"
        );
        ensure!(
            &pod_uids(c).await? == pods,
            "a pod was recreated after the hub restart"
        );
    }
    eprintln!(
        "hub restart: nothing changed on the spokes ({:.1}s)",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// g. Agent restarted: no workload changes. Every bootstrap token is deleted first, so the
/// agent can only come back with the credentials it keeps in its Secret.
async fn an_agent_restart_without_tokens_changes_nothing(
    cp: &mut ControlPlane,
    addon: &Addon,
    client: &Client,
    spoke_clients: &[Client; 2],
    before: &[(String, BTreeMap<String, String>)],
) -> Result<()> {
    let admin = cp.cluster("hub")?.kubeconfig.clone();
    let listed = hub_cli(&admin, &["token", "list"])?;
    let ids: Vec<String> = listed
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    ensure!(ids.len() == 2, "two bootstrap tokens listed: {listed}");
    for id in &ids {
        hub_cli(&admin, &["token", "delete", id])?;
    }
    let clusters = Api::<ManagedCluster>::all(client.clone());
    let last_seen = || async {
        Ok::<_, anyhow::Error>(
            clusters
                .get("spoke-1")
                .await?
                .status
                .and_then(|s| s.last_heartbeat)
                .map(|t| t.0.as_second()),
        )
    };
    let seen_before = last_seen().await?;
    // Heartbeats are recorded in whole seconds, and the hub-restart step's reconnect may have
    // been recorded in this very second: restart in a later one, so that the new stream's first
    // heartbeat shows as a change (a wait on the clock, not on the system under test).
    if let Some(before) = seen_before {
        let now_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond();
        let next_second_ms = (before + 1) * 1000;
        if now_ms < next_second_ms {
            tokio::time::sleep(Duration::from_millis((next_second_ms - now_ms) as u64)).await;
        }
    }
    cp.processes().stop("agent-spoke-1")?;
    let restarted = k8s_openapi::jiff::Timestamp::now().as_second();
    addon.start(cp, "agent-spoke-1")?;
    // The first heartbeat of the new stream is written at once (whole seconds, so it may be in
    // the second of the restart); later ones only every 10–15 minutes.
    e2e::wait_until(
        "the restarted agent heartbeats without a token",
        WAIT,
        || async {
            let seen = last_seen().await?;
            Ok(seen != seen_before && seen.is_some_and(|t| t >= restarted))
        },
    )
    .await?;
    // The restarted agent (its counters start at 0) has applied the hub's work: whatever that
    // changes has been written.
    wait_metric(
        addon,
        "agent-spoke-1",
        APPLIED_OK,
        &[("result", "ok")],
        "the restarted agent applied the hub's work",
        |v| v >= 1.0,
    )
    .await?;
    ensure!(
        pool_identity(&spoke_clients[0]).await? == before[0].0,
        "a workload changed after the agent restart"
    );
    ensure!(
        pod_uids(&spoke_clients[0]).await? == before[0].1,
        "a pod was recreated after the agent restart"
    );
    Ok(())
}

/// e. Agent stopped: lease (5s) expires → unreachable taint → dropped; its pods keep running.
async fn a_stopped_agent_is_dropped_until_it_is_back(
    cp: &mut ControlPlane,
    addon: &Addon,
    client: &Client,
    spoke_clients: &[Client; 2],
    before: &[(String, BTreeMap<String, String>)],
) -> Result<()> {
    let clusters = Api::<ManagedCluster>::all(client.clone());
    cp.processes().stop("agent-spoke-2")?;
    let t = Instant::now();
    e2e::wait_until(
        "spoke-2 tainted unreachable",
        Duration::from_secs(60),
        || async {
            Ok(clusters
                .get("spoke-2")
                .await?
                .spec
                .taints
                .iter()
                .any(|t| t.key == TAINT_UNREACHABLE))
        },
    )
    .await?;
    wait_decisions(client, "both", &["spoke-1"]).await?;
    eprintln!(
        "agent stopped → tainted and dropped in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    ensure!(
        pod_uids(&spoke_clients[1]).await? == before[1].1,
        "the stopped agent's pods must keep running"
    );
    addon.start(cp, "agent-spoke-2")?;
    e2e::wait_until("spoke-2 untainted", Duration::from_secs(60), || async {
        Ok(!clusters
            .get("spoke-2")
            .await?
            .spec
            .taints
            .iter()
            .any(|t| t.key == TAINT_UNREACHABLE))
    })
    .await?;
    wait_decisions(client, "both", &["spoke-1", "spoke-2"]).await?;
    Ok(())
}

/// Revocation: hubAcceptsClient=false closes spoke-1's stream at once (the hub counts one
/// connected agent, spoke-1's agent none, spoke-2's still one), and its agent stops the
/// SuperNodes it ran (the hub no longer trusts the cluster to run the Federations' code).
async fn revoking_a_cluster_cuts_its_stream(
    cp: &ControlPlane,
    addon: &Addon,
    client: &Client,
    spoke_1: &Client,
) -> Result<()> {
    let clusters = Api::<ManagedCluster>::all(client.clone());
    let applied = || async {
        let list = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(spoke_1.clone(), NS)
            .list(&kube::api::ListParams::default().labels("flower-addon.io/applied-by"))
            .await?;
        Ok::<usize, anyhow::Error>(list.items.len())
    };
    ensure!(
        applied().await? > 0,
        "spoke-1 runs SuperNodes before the revocation"
    );
    // Both streams are open before (spoke-2's agent came back in the step before).
    const HUB_CONNECTED: &str = "flower_addon_hub_connected_agents";
    const AGENT_CONNECTED: &str = "flower_addon_agent_hub_connected";
    wait_metric(
        addon,
        "flower-hub",
        HUB_CONNECTED,
        &[],
        "2 agents connected",
        |v| v == 2.0,
    )
    .await?;
    for agent in ["agent-spoke-1", "agent-spoke-2"] {
        wait_metric(addon, agent, AGENT_CONNECTED, &[], "stream open", |v| {
            v == 1.0
        })
        .await?;
    }
    let admin = cp.cluster("hub")?.kubeconfig.clone();
    hub_cli(&admin, &["revoke", "spoke-1"])?;
    // The hub closes spoke-1's stream; its agent's retries are refused before a stream opens,
    // so neither gauge counts them.
    wait_metric(
        addon,
        "agent-spoke-1",
        AGENT_CONNECTED,
        &[],
        "spoke-1's stream closed by the revocation",
        |v| v == 0.0,
    )
    .await?;
    wait_metric(
        addon,
        "flower-hub",
        HUB_CONNECTED,
        &[],
        "the hub counts spoke-2's stream only",
        |v| v == 1.0,
    )
    .await?;
    let spoke_2 = scrape(addon, "agent-spoke-2")?.count(AGENT_CONNECTED, &[]);
    ensure!(spoke_2 == 1.0, "spoke-2's stream stays open: {spoke_2}");
    // Recorded beside the closing (the stream's end does not wait for these writes).
    let recorded = |c: &ManagedCluster| {
        let taints: Vec<&str> = c.spec.taints.iter().map(|t| t.key.as_str()).collect();
        cluster_condition(c, "Available") == Some(("False".into(), "ClusterRevoked".into()))
            && cluster_condition(c, "HubAcceptedManagedCluster")
                == Some(("False".into(), "HubClusterAdminRevoked".into()))
            // OCM: Available=False carries the unavailable taint.
            && taints == [flower_addon_hub::core::placement::TAINT_UNAVAILABLE]
    };
    if let Err(error) = e2e::wait_until(
        "spoke-1 recorded unavailable, not accepted and tainted unavailable",
        WAIT,
        || async { Ok(recorded(&clusters.get("spoke-1").await?)) },
    )
    .await
    {
        let c = clusters.get("spoke-1").await?;
        return Err(error.context(format!(
            "spoke-1: taints {:?}, status {:?}",
            c.spec.taints, c.status
        )));
    }
    e2e::wait_until(
        "spoke-1's agent stops its SuperNodes after the revocation",
        Duration::from_secs(30),
        || async { Ok(applied().await? == 0) },
    )
    .await?;
    Ok(())
}

/// Revoked while the hub is down: the restarted hub records it, with no stream to close.
async fn a_revocation_while_the_hub_is_down_is_recorded(
    cp: &mut ControlPlane,
    addon: &Addon,
    client: &Client,
) -> Result<()> {
    let clusters = Api::<ManagedCluster>::all(client.clone());
    cp.processes().stop("flower-hub")?;
    clusters
        .patch(
            "spoke-2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"hubAcceptsClient": false}})),
        )
        .await?;
    addon.start(cp, "flower-hub")?;
    e2e::wait_until(
        "spoke-2, revoked while the hub was down, recorded unavailable",
        WAIT,
        || async {
            let c = clusters.get("spoke-2").await?;
            Ok(cluster_condition(&c, "Available")
                == Some(("False".into(), "ClusterRevoked".into())))
        },
    )
    .await?;
    // Accepted again (with kubectl, not the CLI): the agent's retries get it back in.
    clusters
        .patch(
            "spoke-2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"hubAcceptsClient": true}})),
        )
        .await?;
    e2e::wait_until(
        "spoke-2 accepted and available again",
        Duration::from_secs(60),
        || async {
            let c = clusters.get("spoke-2").await?;
            Ok(cluster_condition(&c, "Available")
                == Some(("True".into(), "ClusterAvailable".into()))
                && cluster_condition(&c, "HubAcceptedManagedCluster").map(|c| c.0)
                    == Some("True".into()))
        },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_5d_a_spoke_that_stops_matching_hands_its_place_to_another() -> Result<()> {
    // Invariant: with numberOfClusters=1 only the selected spoke runs the pools; when its label
    // no longer matches, its workloads are deleted and the other matching spoke gets them.
    let World {
        cp: _cp,
        client,
        spoke_clients,
        ..
    } = two_spokes_running().await?;
    apply_placement(
        &client,
        "both",
        serde_json::json!({"numberOfClusters": 1, "predicates": [
            {"requiredClusterSelector": {"labelSelector": {"matchLabels": {"env": "prod"}}}}
        ]}),
    )
    .await?;
    wait_decisions(&client, "both", &["spoke-1"]).await?;
    wait_pool(&spoke_clients[1..], "fed-supernode-a", None, WAIT).await?;
    wait_pool(&spoke_clients[..1], "fed-supernode-a", Some((2, 2)), WAIT).await?;
    let t = Instant::now();
    Api::<ManagedCluster>::all(client.clone())
        .patch(
            "spoke-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"env": "dev"}}})),
        )
        .await?;
    wait_decisions(&client, "both", &["spoke-2"]).await?;
    wait_pool(&spoke_clients[..1], "fed-supernode-a", None, WAIT).await?;
    wait_pool(&spoke_clients[1..], "fed-supernode-a", Some((2, 2)), WAIT).await?;
    eprintln!(
        "spoke-1 relabelled → pools moved to spoke-2 in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

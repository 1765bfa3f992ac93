//! The hub's Federation controller and its own pools on a real hub apiserver (kwok nodes): a
//! Federation without `placementRef` runs SuperLink, Service and TLS Secret (the controller) and
//! pools (the hub cluster's work, applied by the embedded runtime under its own manager) in the
//! hub cluster, all owned by the Federation; changes propagate, removed pools and switched modes
//! are pruned, an invalid spec is Degraded without touching anything, and a restarted hub
//! changes nothing. SuperNode authentication is off here (kwok pods run no SuperLink whose
//! Control API could register keys); `real_node` runs it on real pods.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use flower_addon_crds::Federation;
use flower_addon_hub::core::sans::SuperLinkNames;
use flower_addon_hub::kube::controller::{self, APPLIED_BY_LABEL, Context, HUB_FIELD_MANAGER};
use flower_addon_hub::kube::hub_pools::LOCAL_POOLS_FIELD_MANAGER;
use flower_addon_hub::registration::ca::HubCa;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const NS: &str = "team";
const FED: &str = "fed";
const USER: &str = "e2e-user";

/// The Federation as a user applies it: StatefulSet mode, TLS on, pools `(name, replicas)`.
fn federation(
    mode: &str,
    image: &str,
    pools: &[(&str, i32)],
    service_labels: &[(&str, &str)],
) -> serde_json::Value {
    let pools: Vec<serde_json::Value> = pools
        .iter()
        .map(|(name, replicas)| {
            if mode == "StatefulSet" {
                serde_json::json!({"name": name, "replicas": replicas, "images": {}})
            } else {
                serde_json::json!({"name": name, "images": {}})
            }
        })
        .collect();
    let labels: BTreeMap<&str, &str> = service_labels.iter().copied().collect();
    let mut service = serde_json::json!({"type": "NodePort"});
    if !labels.is_empty() {
        service["labels"] = serde_json::json!(labels);
    }
    serde_json::json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "Federation",
        "metadata": {"name": FED, "namespace": NS},
        "spec": {
            "mode": mode,
            "isolationMode": "subprocess",
            "insecure": false,
            "supernodeAuthentication": false,
            "superlink": {
                "image": image,
                "externalAddress": "hub.example:30092",
                "service": service,
            },
            "supernodes": {"image": "flwr/supernode:1.42.0", "pools": pools},
        }
    })
}

async fn apply_federation(client: &Client, fed: &serde_json::Value) -> Result<()> {
    Api::<Federation>::namespaced(client.clone(), NS)
        .patch(FED, &PatchParams::apply(USER).force(), &Patch::Apply(fed))
        .await
        .context("apply Federation")?;
    Ok(())
}

async fn get_fed(client: &Client) -> Result<Federation> {
    Ok(Api::<Federation>::namespaced(client.clone(), NS)
        .get(FED)
        .await?)
}

fn condition(fed: &Federation, type_: &str) -> Option<(String, String)> {
    fed.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.message.clone()))
}

/// Waits until the Federation's status shows `supernodes` and Ready=True for its generation.
async fn wait_ready(client: &Client, supernodes: &str) -> Result<Duration> {
    e2e::wait_until(
        &format!("Federation {supernodes} and Ready=True"),
        Duration::from_secs(90),
        || async move {
            let fed = get_fed(client).await?;
            let status = fed.status.clone().unwrap_or_default();
            Ok(status.observed_generation == fed.metadata.generation
                && status.supernodes.as_deref() == Some(supernodes)
                && condition(&fed, "Ready").is_some_and(|(s, _)| s == "True"))
        },
    )
    .await
}

/// resourceVersions of everything the hub applied in `NS` (the controller's objects and the
/// hub cluster's pools), by `kind/name`.
async fn applied_versions(client: &Client) -> Result<BTreeMap<String, String>> {
    let mut versions = BTreeMap::new();
    for manager in [HUB_FIELD_MANAGER, LOCAL_POOLS_FIELD_MANAGER] {
        let mine =
            e2e::applied_versions(client, NS, &format!("{APPLIED_BY_LABEL}={manager}")).await?;
        ensure!(!mine.is_empty(), "nothing applied by {manager}");
        versions.extend(mine);
    }
    Ok(versions)
}

/// Reasons of the events the hub published about the Federation.
async fn event_reasons(client: &Client) -> Result<Vec<String>> {
    Ok(
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), NS)
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| {
                e.reporting_controller.as_deref() == Some(HUB_FIELD_MANAGER)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(FED)
            })
            .filter_map(|e| e.reason)
            .collect(),
    )
}

async fn pod_uids(client: &Client) -> Result<BTreeMap<String, String>> {
    e2e::pod_uids(client, NS).await
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// The hub's settings here: its admin lets Federations name `hub.example` in their SuperLink
/// certificates (`--superlink-name hub.example`), and nothing else.
fn settings() -> controller::Settings {
    controller::Settings {
        superlink_names: SuperLinkNames::new([], &["hub.example".to_owned()])
            .expect("a valid name"),
        ..Default::default()
    }
}

/// A reconcile context with [`settings`] and caches listed now.
async fn context(hub_sa: &Client, ca: &Arc<HubCa>) -> Result<Context> {
    let caches = controller::Caches::listed(hub_sa).await?;
    let mut ctx = Context::new(hub_sa.clone(), ca.clone(), caches);
    ctx.settings = settings();
    Ok(ctx)
}

fn start_controller(client: &Client, ca: &Arc<HubCa>) -> Running {
    let (stop, rx) = oneshot::channel::<()>();
    let (client, ca) = (client.clone(), ca.clone());
    let task = tokio::spawn(async move {
        flower_addon_hub::kube::run_hub_cluster(client, ca, settings(), async move {
            let _ = rx.await;
        })
        .await
        .expect("the hub's work source starts");
    });
    Running { stop, task }
}

async fn stop_controller(running: Running) -> Result<()> {
    let _ = running.stop.send(());
    tokio::time::timeout(Duration::from_secs(30), running.task)
        .await
        .context("controller did not stop")??;
    Ok(())
}

/// Controlled by `uid`, with `blockOwnerDeletion` like controller-runtime's
/// `SetControllerReference` (a foreground delete of the Federation waits for its objects).
fn owned_by(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, uid: &str) -> bool {
    meta.owner_references.as_ref().is_some_and(|refs| {
        refs.iter().any(|r| {
            r.uid == uid && r.controller == Some(true) && r.block_owner_deletion == Some(true)
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_controller_runs_a_federation_in_the_hub_cluster() -> Result<()> {
    // Invariant: a Federation without placementRef converges to SuperLink + Service + TLS Secret +
    // pools owned by it, follows spec changes (prune included), is Degraded without side effects
    // when invalid, and a controller restart recreates and rewrites nothing.
    // The controller acts with the hub's least-privilege ServiceAccount from manifests/hub.
    let (cp, hub_sa) = e2e::addon::start_hub_with_rbac(NS).await?;
    let client = cp.cluster("hub")?.client.clone();
    let hub_sa = hub_sa.client;
    let ca = Arc::new(HubCa::generate()?);
    let running = start_controller(&hub_sa, &ca);
    let t0 = Instant::now();
    let uid = two_pools_converge_owned_by_the_federation(&client, &ca).await?;
    spec_changes_propagate(&client).await?;
    a_removed_pool_is_pruned(&client).await?;
    let (running, versions, pods) =
        a_restarted_controller_changes_nothing(&client, &hub_sa, &ca, running).await?;
    an_invalid_spec_is_degraded_without_side_effects(&client, &versions, &pods).await?;
    a_mode_switch_prunes_the_statefulset(&client, &uid, cp.cluster("hub")?.nodes.len()).await?;
    a_due_certificate_is_renewed_and_rolls_the_superlink(&client, &hub_sa, &ca).await?;
    let running =
        a_rotated_flower_ca_reaches_the_secret_and_the_supernodes(&client, &hub_sa, &ca, running)
            .await?;
    stop_controller(running).await?;
    eprintln!("hub controller scenario {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}

/// 1. Two pools: everything applied, owned by the Federation, pods Ready, status 3/3. Returns
///    the Federation's uid.
async fn two_pools_converge_owned_by_the_federation(
    client: &Client,
    ca: &Arc<HubCa>,
) -> Result<String> {
    let sts = Api::<StatefulSet>::namespaced(client.clone(), NS);
    // 1. Two pools: everything applied, owned by the Federation, pods Ready, status 3/3.
    apply_federation(
        client,
        &federation(
            "StatefulSet",
            "flwr/superlink:1.42.0",
            &[("a", 2), ("b", 1)],
            &[("team", "a")],
        ),
    )
    .await?;
    let took = wait_ready(client, "3/3").await?;
    eprintln!("Federation 3/3 Ready in {:.1}s", took.as_secs_f64());
    // The namespace the hub wrote into (unlabelled until now) has the hub's Pod Security level,
    // so the API server enforces it on every pod there too.
    let labels = namespace_labels(client).await?;
    for mode in ["enforce", "audit", "warn"] {
        let key = format!("pod-security.kubernetes.io/{mode}");
        ensure!(
            labels.get(&key).map(String::as_str) == Some("baseline"),
            "namespace {NS} not labelled {key}=baseline by the hub: {labels:?}"
        );
    }
    let fed = get_fed(client).await?;
    let uid = fed.uid().unwrap_or_default();
    for name in ["fed-superlink", "fed-supernode-a", "fed-supernode-b"] {
        let s = sts
            .get(name)
            .await
            .with_context(|| format!("StatefulSet {name}"))?;
        ensure!(
            owned_by(&s.metadata, &uid),
            "{name} not owned by the Federation"
        );
    }
    // Each StatefulSet pool's serviceName exists: a headless Service, owned like the rest.
    for name in ["fed-supernode-a", "fed-supernode-b"] {
        let headless = Api::<Service>::namespaced(client.clone(), NS)
            .get(name)
            .await
            .with_context(|| format!("headless Service {name}"))?;
        ensure!(
            owned_by(&headless.metadata, &uid)
                && headless.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None"),
            "{name}: a headless Service owned by the Federation"
        );
    }
    let svc = Api::<Service>::namespaced(client.clone(), NS)
        .get("fed-superlink")
        .await?;
    ensure!(
        owned_by(&svc.metadata, &uid),
        "Service not owned by the Federation"
    );
    ensure!(
        svc.labels().get("team").map(String::as_str) == Some("a"),
        "Service labels from the spec missing"
    );
    let secret = Api::<Secret>::namespaced(client.clone(), NS)
        .get("fed-superlink-tls")
        .await?;
    ensure!(
        owned_by(&secret.metadata, &uid),
        "TLS Secret not owned by the Federation"
    );
    let data = secret.data.clone().unwrap_or_default();
    ensure!(
        ["tls.crt", "tls.key", "ca.crt"]
            .iter()
            .all(|k| data.contains_key(*k)),
        "TLS Secret keys: {:?}",
        data.keys().collect::<Vec<_>>()
    );
    // The Federation's own CA, derived from the hub's Flower CA (not the hub's CA itself).
    let own = ca.federation(NS, "fed")?;
    ensure!(
        data.get("ca.crt").map(|b| b.0.as_slice()) == Some(own.bundle_pem().as_bytes())
            && own.bundle_pem() != ca.cert_pem(),
        "TLS Secret ca.crt is not the Federation's CA"
    );
    let sans = secret
        .annotations()
        .get("flower-addon.io/tls-sans")
        .cloned()
        .unwrap_or_default();
    for want in ["hub.example", "fed-superlink.team.svc", "127.0.0.1"] {
        ensure!(
            sans.split(',').any(|s| s == want),
            "SAN {want} missing in {sans}"
        );
    }
    let status = fed.status.clone().unwrap_or_default();
    // Control listens on the SuperLink pod's loopback: no in-cluster Control address.
    ensure!(
        status
            .endpoints
            .as_ref()
            .is_some_and(|e| e.superlink_service.is_none()),
        "endpoints: {:?}",
        status.endpoints
    );
    ensure!(
        status.ready_supernodes == 3 && status.desired_supernodes == 3,
        "{status:?}"
    );
    ensure!(
        condition(&fed, "Degraded").is_some_and(|(s, _)| s == "False")
            && condition(&fed, "Reconciling").is_some_and(|(s, _)| s == "False"),
        "conditions: {:?}",
        status.conditions
    );

    ensure!(
        event_reasons(client)
            .await?
            .iter()
            .any(|r| r == "CertificateIssued"),
        "no CertificateIssued event"
    );
    Ok(uid)
}

/// 2. Replicas changed and a Service label removed → propagated.
async fn spec_changes_propagate(client: &Client) -> Result<()> {
    let sts = Api::<StatefulSet>::namespaced(client.clone(), NS);
    // 2. Replicas changed and a Service label removed → propagated.
    apply_federation(
        client,
        &federation(
            "StatefulSet",
            "flwr/superlink:1.42.0",
            &[("a", 3), ("b", 1)],
            &[],
        ),
    )
    .await?;
    wait_ready(client, "4/4").await?;
    ensure!(
        sts.get("fed-supernode-a").await?.spec.replicas == Some(3),
        "replicas not propagated"
    );
    let svc = Api::<Service>::namespaced(client.clone(), NS)
        .get("fed-superlink")
        .await?;
    ensure!(
        !svc.labels().contains_key("team"),
        "removed Service label still set"
    );
    Ok(())
}

/// 3. Pool b removed → pruned.
async fn a_removed_pool_is_pruned(client: &Client) -> Result<()> {
    let sts = Api::<StatefulSet>::namespaced(client.clone(), NS);
    // 3. Pool b removed → pruned.
    let one_pool = federation("StatefulSet", "flwr/superlink:1.42.0", &[("a", 3)], &[]);
    apply_federation(client, &one_pool).await?;
    wait_ready(client, "3/3").await?;
    e2e::wait_until("pool b pruned", Duration::from_secs(30), || {
        let sts = sts.clone();
        async move { Ok(sts.get_opt("fed-supernode-b").await?.is_none()) }
    })
    .await?;
    let fed = get_fed(client).await?;
    let pools: Vec<String> = fed
        .status
        .clone()
        .unwrap_or_default()
        .pools
        .iter()
        .map(|p| p.name.clone())
        .collect();
    ensure!(pools == ["a"], "status pools {pools:?}");
    Ok(())
}

/// 4. Controller restarted → no pod recreated, no object rewritten, status unchanged. Returns
///    the restarted controller and what the next step compares against.
async fn a_restarted_controller_changes_nothing(
    client: &Client,
    hub_sa: &Client,
    ca: &Arc<HubCa>,
    running: Running,
) -> Result<(Running, BTreeMap<String, String>, BTreeMap<String, String>)> {
    // 4. Controller restarted → no pod recreated, no object rewritten, status unchanged.
    e2e::wait_statefulsets_settled(client, NS).await?;
    let versions = applied_versions(client).await?;
    let pods = pod_uids(client).await?;
    let fed_version = get_fed(client).await?.resource_version();
    stop_controller(running).await?;
    let running = start_controller(hub_sa, ca);
    // Prove a reconcile ran against the running state, on top of the restarted controller's own.
    let ctx = Arc::new(context(hub_sa, ca).await?);
    controller::reconcile(Arc::new(get_fed(client).await?), ctx.clone()).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(
        applied_versions(client).await? == versions,
        "restart rewrote objects: before {versions:?}"
    );
    ensure!(pod_uids(client).await? == pods, "restart recreated pods");
    ensure!(
        get_fed(client).await?.resource_version() == fed_version,
        "restart rewrote the status"
    );
    Ok((running, versions, pods))
}

/// 7. With a validity shorter than the certificate's (due at once; then at 80 %), a
///    reconcile issues a new SuperLink certificate for that validity and marks the SuperLink's
///    pod template with its end of validity, so the SuperLink pod is replaced; the next
///    reconcile keeps both.
async fn a_due_certificate_is_renewed_and_rolls_the_superlink(
    client: &Client,
    hub_sa: &Client,
    ca: &Arc<HubCa>,
) -> Result<()> {
    use flower_addon_hub::kube::controller::tls::{NOT_AFTER_ANNOTATION, NOT_BEFORE_ANNOTATION};
    let secrets = Api::<Secret>::namespaced(client.clone(), NS);
    let superlinks = Api::<StatefulSet>::namespaced(client.clone(), NS);
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS);
    let before = secrets.get("fed-superlink-tls").await?;
    let old_pod = pods.get("fed-superlink-0").await?.metadata.uid;
    let validity = Duration::from_secs(3600);
    let mut ctx = context(hub_sa, ca).await?;
    ctx.settings.superlink_cert_validity = validity;
    controller::reconcile(Arc::new(get_fed(client).await?), Arc::new(ctx)).await?;
    let after = secrets.get("fed-superlink-tls").await?;
    let at = |s: &Secret, key: &str| -> Result<u64> {
        s.annotations()
            .get(key)
            .with_context(|| format!("{key} missing"))?
            .parse::<u64>()
            .context(key.to_owned())
    };
    ensure!(
        after.data != before.data,
        "the certificate was not re-issued for the shorter validity"
    );
    let life = at(&after, NOT_AFTER_ANNOTATION)? - at(&after, NOT_BEFORE_ANNOTATION)?;
    ensure!(
        (3600..=3600 + 360).contains(&life),
        "re-issued certificate lives {life} s (want 1 h, plus backdating)"
    );
    let template = superlinks
        .get("fed-superlink")
        .await?
        .spec
        .template
        .metadata
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    ensure!(
        template.get(NOT_AFTER_ANNOTATION) == after.annotations().get(NOT_AFTER_ANNOTATION),
        "the SuperLink pod template is not marked with the new certificate: {template:?}"
    );
    let t = Instant::now();
    e2e::wait_until(
        "the SuperLink pod replaced",
        Duration::from_secs(60),
        || async {
            Ok(pods
                .get_opt("fed-superlink-0")
                .await?
                .is_some_and(|p| p.metadata.uid != old_pod && e2e::pods::pod_ready(&p)))
        },
    )
    .await?;
    // Not due again: the next reconcile (its caches listed afresh: `listed` is a snapshot)
    // issues nothing.
    let version = after.resource_version();
    let mut ctx = context(hub_sa, ca).await?;
    ctx.settings.superlink_cert_validity = validity;
    controller::reconcile(Arc::new(get_fed(client).await?), Arc::new(ctx)).await?;
    ensure!(
        secrets.get("fed-superlink-tls").await?.resource_version() == version,
        "a certificate that is not due was re-issued"
    );
    eprintln!(
        "certificate renewed for a 1 h validity; SuperLink pod replaced and Ready in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// 5. Unmappable Flower version, then certificate names the hub may not issue → Degraded naming
///    the field; nothing touched.
async fn an_invalid_spec_is_degraded_without_side_effects(
    client: &Client,
    versions: &BTreeMap<String, String>,
    pods: &BTreeMap<String, String>,
) -> Result<()> {
    // 5. Unmappable Flower version → Degraded naming spec.version; nothing touched.
    apply_federation(
        client,
        &federation("StatefulSet", "flwr/superlink:latest", &[("a", 3)], &[]),
    )
    .await?;
    wait_degraded(client, &["spec.version"]).await?;
    // 5b. A certificate name the hub's admin did not allow (and another
    //     Federation's Service name) → Degraded naming each field and the fix; no certificate
    //     issued, nothing touched (checked below).
    let mut fed = federation("StatefulSet", "flwr/superlink:1.42.0", &[("a", 3)], &[]);
    fed["spec"]["tls"] = serde_json::json!({
        "extraSANs": ["bank.example.com", "other-superlink.other.svc"]
    });
    apply_federation(client, &fed).await?;
    wait_degraded(
        client,
        &[
            "spec.tls.extraSANs[0]: \"bank.example.com\" is not one of the hub's names (hub.example)",
            "--superlink-name bank.example.com",
            "spec.tls.extraSANs[1]: \"other-superlink.other.svc\" is a cluster-internal name",
        ],
    )
    .await?;
    // 5c. The namespace labelled weaker than the hub's level (by its admin, or anyone who may):
    //     the next change is Degraded naming the namespace, the label command and the flag;
    //     nothing touched.
    label_namespace(client, "privileged").await?;
    apply_federation(
        client,
        &federation("StatefulSet", "flwr/superlink:1.42.0", &[("a", 3)], &[]),
    )
    .await?;
    wait_degraded(
        client,
        &[
            "metadata.namespace: namespace team exists with Pod Security pod-security.kubernetes.io/enforce=privileged, weaker than the hub cluster's baseline",
            "kubectl label namespace team pod-security.kubernetes.io/enforce=baseline --overwrite",
            "flower-hub serve --allow weaker-namespaces",
        ],
    )
    .await?;
    let fed = get_fed(client).await?;
    ensure!(
        condition(&fed, "Ready").is_some_and(|(s, _)| s == "False"),
        "invalid spec but Ready"
    );
    ensure!(
        applied_versions(client).await? == *versions,
        "an invalid spec touched running objects"
    );
    ensure!(
        pod_uids(client).await? == *pods,
        "an invalid spec restarted pods"
    );
    ensure!(
        event_reasons(client)
            .await?
            .iter()
            .any(|r| r == "InvalidSpec"),
        "no InvalidSpec event"
    );
    label_namespace(client, "baseline").await?;
    Ok(())
}

/// The labels of namespace [`NS`].
async fn namespace_labels(client: &Client) -> Result<BTreeMap<String, String>> {
    let ns = Api::<Namespace>::all(client.clone()).get(NS).await?;
    Ok(ns.metadata.labels.unwrap_or_default())
}

/// Sets namespace [`NS`]'s Pod Security `enforce` label, as its admin would.
async fn label_namespace(client: &Client, level: &str) -> Result<()> {
    let patch = serde_json::json!({
        "metadata": {"labels": {"pod-security.kubernetes.io/enforce": level}}
    });
    Api::<Namespace>::all(client.clone())
        .patch(NS, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("label namespace {NS} enforce={level}"))?;
    Ok(())
}

/// Waits until the Federation's current generation is Degraded with a message holding each of
/// `parts`.
async fn wait_degraded(client: &Client, parts: &[&str]) -> Result<()> {
    e2e::wait_until(
        &format!("Degraded=True naming {parts:?}"),
        Duration::from_secs(30),
        || {
            let client = client.clone();
            async move {
                let fed = get_fed(&client).await?;
                Ok(fed.status.as_ref().and_then(|s| s.observed_generation)
                    == fed.metadata.generation
                    && condition(&fed, "Degraded")
                        .is_some_and(|(s, m)| s == "True" && parts.iter().all(|p| m.contains(p))))
            }
        },
    )
    .await?;
    Ok(())
}

/// 6. Mode switch StatefulSet → DaemonSet: the pool's StatefulSet is pruned, the DaemonSet runs
///    on every kwok node (`nodes`).
async fn a_mode_switch_prunes_the_statefulset(
    client: &Client,
    uid: &str,
    nodes: usize,
) -> Result<()> {
    let sts = Api::<StatefulSet>::namespaced(client.clone(), NS);
    // 6. Mode switch StatefulSet → DaemonSet: the pool's StatefulSet is pruned, the DaemonSet runs
    //    on every kwok node.
    apply_federation(
        client,
        &federation("DaemonSet", "flwr/superlink:1.42.0", &[("a", 0)], &[]),
    )
    .await?;
    wait_ready(client, &format!("{nodes}/{nodes}")).await?;
    ensure!(
        sts.get_opt("fed-supernode-a").await?.is_none(),
        "old StatefulSet not pruned"
    );
    let ds = Api::<DaemonSet>::namespaced(client.clone(), NS)
        .get("fed-supernode-a")
        .await?;
    ensure!(
        owned_by(&ds.metadata, uid),
        "DaemonSet not owned by the Federation"
    );
    ensure!(
        sts.get_opt("fed-superlink").await?.is_some(),
        "SuperLink pruned by mistake"
    );
    let fed = get_fed(client).await?;
    let kind = fed
        .status
        .clone()
        .unwrap_or_default()
        .pools
        .first()
        .and_then(|p| p.kind.clone());
    ensure!(kind.as_deref() == Some("DaemonSet"), "pool kind {kind:?}");
    ensure!(
        fed.meta().deletion_timestamp.is_none(),
        "Federation being deleted"
    );
    Ok(())
}

/// The CA digest on the pod templates of the hub's own pools (one per pool).
async fn pool_ca_digests(client: &Client) -> Result<Vec<String>> {
    let selector = format!("{APPLIED_BY_LABEL}={LOCAL_POOLS_FIELD_MANAGER}");
    let params = ListParams::default().labels(&selector);
    let digest = |template: &k8s_openapi::api::core::v1::PodTemplateSpec| {
        template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(flower_addon_agent::work::CA_DIGEST_ANNOTATION))
            .cloned()
            .unwrap_or_default()
    };
    let mut digests: Vec<String> = Api::<StatefulSet>::namespaced(client.clone(), NS)
        .list(&params)
        .await?
        .items
        .iter()
        .map(|s| digest(&s.spec.template))
        .collect();
    for d in Api::<DaemonSet>::namespaced(client.clone(), NS)
        .list(&params)
        .await?
        .items
    {
        digests.push(digest(&d.spec.template));
    }
    ensure!(
        !digests.is_empty() && digests.iter().all(|d| !d.is_empty()),
        "pools and their CA digests: {digests:?}"
    );
    Ok(digests)
}

/// 8. The Flower CA rotated (what `flower-hub ca rotate` stores, the hub restarted
///    after each step). Staged: the SuperLink Secret's `ca.crt` holds both CAs, its certificate
///    is kept, the pools roll (new CA digest). Promoted: a certificate of the new CA, both still
///    trusted, the pools do not roll (same CAs). Retired: only the new CA, the pools roll.
async fn a_rotated_flower_ca_reaches_the_secret_and_the_supernodes(
    client: &Client,
    hub_sa: &Client,
    ca: &Arc<HubCa>,
    mut running: Running,
) -> Result<Running> {
    use flower_addon_hub::kube::controller::tls::CA_HASH_ANNOTATION;
    use flower_addon_hub::registration::ca::CaRole;
    use flower_addon_hub::registration::rotation::{RotationStep, rotate};
    let secrets = Api::<Secret>::namespaced(client.clone(), NS);
    let mut material = ca.material().clone();
    let mut digests = pool_ca_digests(client).await?;
    for (step, rolls) in [
        (RotationStep::Stage, true),
        (RotationStep::Promote, false),
        (RotationStep::Retire, true),
    ] {
        material = rotate(CaRole::Flower, &material, step)?;
        let now = Arc::new(HubCa::from_material(material.clone())?);
        stop_controller(running).await?;
        running = start_controller(hub_sa, &now);
        let t = Instant::now();
        let what = format!(
            "{}: the Secret's ca.crt is the bundle, signed by the CA in force",
            step.as_str()
        );
        e2e::wait_until(&what, Duration::from_secs(30), || {
            let (secrets, now) = (secrets.clone(), now.federation(NS, "fed"));
            async move {
                let now = now?;
                let s = secrets.get("fed-superlink-tls").await?;
                let ca_crt = s
                    .data
                    .as_ref()
                    .and_then(|d| d.get("ca.crt"))
                    .map(|b| b.0.clone());
                Ok(ca_crt.as_deref() == Some(now.bundle_pem().as_bytes())
                    && s.annotations().get(CA_HASH_ANNOTATION).map(String::as_str)
                        == Some(now.hash()))
            }
        })
        .await?;
        if rolls {
            let before = digests.clone();
            digests = e2e::wait_for(
                &format!("{}: the pools' CA digest to change", step.as_str()),
                Duration::from_secs(30),
                || {
                    let before = before.clone();
                    async move {
                        let now = pool_ca_digests(client).await?;
                        Ok(now.iter().all(|d| !before.contains(d)).then_some(now))
                    }
                },
            )
            .await?;
        } else {
            tokio::time::sleep(Duration::from_secs(3)).await;
            ensure!(
                pool_ca_digests(client).await? == digests,
                "{}: the pools rolled though they trust the same CAs",
                step.as_str()
            );
        }
        eprintln!(
            "CA rotation {}: Secret and pools followed in {:.1}s",
            step.as_str(),
            t.elapsed().as_secs_f64()
        );
    }
    Ok(running)
}

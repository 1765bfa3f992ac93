//! The agent's Kubernetes runtime against a real spoke apiserver (kwok nodes): pools applied with
//! server-side apply, readiness from the workloads' status, idempotent re-apply, pruning of
//! removed pools, switched modes and removed Federations; SuperNode keys made per pod (per node
//! for DaemonSets) in a Secret, and SuperNodes started only once the "hub" (the test, here)
//! registers their public keys, with registration kept across a hub that forgets it. The agent
//! records Events (Applied, Pruned, ApplyFailed) on the workloads.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use e2e::ControlPlane;
use flower_addon_agent::kube_runtime::{
    AGENT_FIELD_MANAGER, APPLIED_BY_LABEL, Allowance, Applier, KubeRuntime, PodPolicy,
};
use flower_addon_proto::{ClusterWork, FederationStatus, FederationWork, PoolWork};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Client;
use kube::api::Api;

const NS: &str = "team-a";
const FED: &str = "fed";

/// A Federation's work with the given mode and pools (`(name, replicas)`; replicas ignored in
/// DaemonSet mode), TLS on.
fn federation(namespace: &str, name: &str, mode: &str, pools: &[(&str, i32)]) -> FederationWork {
    let pool_specs: Vec<serde_json::Value> = pools
        .iter()
        .map(|(pool, replicas)| {
            if mode == "StatefulSet" {
                serde_json::json!({"name": pool, "replicas": replicas, "images": {}})
            } else {
                serde_json::json!({"name": pool, "images": {}})
            }
        })
        .collect();
    let spec = serde_json::json!({
        "mode": mode,
        "isolationMode": "subprocess",
        "insecure": false,
        "superlink": {"image": "flwr/superlink:1.42.0", "externalAddress": "hub.example:30092"},
        "supernodes": {"image": "flwr/supernode:1.42.0", "pools": pool_specs},
        "placementRef": {"name": "all"},
    });
    let mut offset = 0u32;
    let pools = pools
        .iter()
        .zip(&pool_specs)
        .map(|((pool, replicas), spec)| {
            let work = PoolWork {
                name: (*pool).to_owned(),
                partition_offset: offset,
                spec_json: spec.to_string(),
            };
            offset += u32::try_from(*replicas).unwrap_or(0);
            work
        })
        .collect();
    FederationWork {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        flower_version: "1.42.0".to_owned(),
        superlink_fleet_address: "hub.example:30092".to_owned(),
        ca_bundle_pem: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_owned(),
        partitions_total: offset,
        pools,
        federation_spec_json: spec.to_string(),
        cluster_index: 0,
        cluster_count: 1,
        registered_node_keys: Vec::new(),
        retired_node_keys: Vec::new(),
        supernode_restart: String::new(),
    }
}

fn snapshot(version: u64, federations: Vec<FederationWork>) -> ClusterWork {
    ClusterWork {
        version,
        cluster_name: "spoke-1".to_owned(),
        federations,
    }
}

/// `(desired, ready, Ready status)` of each pool of `fed` in `statuses`.
fn pool_counts(statuses: &[FederationStatus], fed: &str) -> BTreeMap<String, (u32, u32, String)> {
    statuses
        .iter()
        .filter(|f| f.name == fed)
        .flat_map(|f| f.pools.iter())
        .map(|p| {
            let ready = p
                .conditions
                .iter()
                .find(|c| c.r#type == "Ready")
                .map(|c| c.status.clone())
                .unwrap_or_default();
            (p.name.clone(), (p.desired, p.ready, ready))
        })
        .collect()
}

async fn wait_pools(
    runtime: &KubeRuntime,
    what: &str,
    want: BTreeMap<String, (u32, u32, String)>,
) -> Result<Duration> {
    e2e::wait_until(what, Duration::from_secs(90), || {
        let want = want.clone();
        async move { Ok(pool_counts(&runtime.observe().await, FED) == want) }
    })
    .await
}

fn counts(entries: &[(&str, u32, u32, &str)]) -> BTreeMap<String, (u32, u32, String)> {
    entries
        .iter()
        .map(|(n, d, r, s)| ((*n).to_owned(), (*d, *r, (*s).to_owned())))
        .collect()
}

/// The public keys the runtime reports for each pool of `fed`, by pool name.
fn reported_keys(statuses: &[FederationStatus], fed: &str) -> BTreeMap<String, Vec<String>> {
    statuses
        .iter()
        .filter(|f| f.name == fed)
        .flat_map(|f| f.pools.iter())
        .map(|p| (p.name.clone(), p.node_public_keys.clone()))
        .collect()
}

/// `work` as a hub sends it after registering `keys` (its Federations' registered keys).
fn registered(mut work: ClusterWork, version: u64, keys: &[String]) -> ClusterWork {
    work.version = version;
    for fed in &mut work.federations {
        fed.registered_node_keys = keys.to_vec();
    }
    work
}

/// Registers every key the runtime reports for `FED` (what the hub does), applies `work` with
/// them and returns that snapshot.
async fn register_all(
    runtime: &KubeRuntime,
    work: &ClusterWork,
    version: u64,
) -> Result<ClusterWork> {
    let keys: Vec<String> = reported_keys(&runtime.observe().await, FED)
        .into_values()
        .flatten()
        .collect();
    ensure!(!keys.is_empty(), "no node keys reported");
    let next = registered(work.clone(), version, &keys);
    runtime.apply_work(&next).await?;
    Ok(next)
}

/// Data keys of Secret `name` in `NS`.
async fn secret_keys(client: &Client, name: &str) -> Result<Vec<String>> {
    let secret = Api::<Secret>::namespaced(client.clone(), NS)
        .get(name)
        .await?;
    Ok(secret.data.unwrap_or_default().into_keys().collect())
}

/// `spec.replicas` of StatefulSet `name` in `NS`.
async fn replicas(client: &Client, name: &str) -> Result<Option<i32>> {
    Ok(Api::<StatefulSet>::namespaced(client.clone(), NS)
        .get(name)
        .await?
        .spec
        .replicas)
}

/// resourceVersions of everything the agent applied in `NS`, by `kind/name`.
async fn applied_versions(client: &Client) -> Result<BTreeMap<String, String>> {
    e2e::applied_versions(
        client,
        NS,
        &format!("{APPLIED_BY_LABEL}={AGENT_FIELD_MANAGER}"),
    )
    .await
}

/// Pod UIDs in `NS`, by name.
async fn pod_uids(client: &Client) -> Result<BTreeMap<String, String>> {
    e2e::pod_uids(client, NS).await
}

async fn exists<K>(client: &Client, name: &str) -> Result<bool>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Ok(Api::<K>::namespaced(client.clone(), NS)
        .get_opt(name)
        .await?
        .is_some())
}

/// Waits for an Event (events.k8s.io/v1) in [`NS`] about `kind` `name` with `reason`, recorded
/// by the agent; returns its note.
async fn wait_event(client: &Client, kind: &str, name: &str, reason: &str) -> Result<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), NS);
    e2e::wait_for(
        &format!("Event {reason} on {kind} {name}"),
        Duration::from_secs(30),
        || {
            let events = events.clone();
            async move {
                Ok(events
                    .list(&Default::default())
                    .await?
                    .items
                    .into_iter()
                    .find(|e| {
                        e.reason.as_deref() == Some(reason)
                            && e.reporting_controller.as_deref() == Some(AGENT_FIELD_MANAGER)
                            && e.regarding.as_ref().is_some_and(|r| {
                                r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                            })
                    })
                    .map(|e| e.note.unwrap_or_default()))
            }
        },
    )
    .await
}

async fn wait_gone<K>(client: &Client, name: &str) -> Result<()>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    e2e::wait_until(
        &format!("{name} deleted"),
        Duration::from_secs(60),
        || async move { Ok(!exists::<K>(client, name).await?) },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_runtime_applies_prunes_and_reports() -> Result<()> {
    // Invariant: the agent's cluster converges to each snapshot (apply, prune, readiness) and an
    // unchanged snapshot changes no object.
    e2e::install_crypto();
    let cp = ControlPlane::start(&["spoke-1"])
        .await
        .context("control plane (run e2e/k8s/build.sh if binaries are missing)")?;
    let spoke = cp.cluster("spoke-1")?;
    let client = spoke.client.clone();
    // The runtime acts with the agent's least-privilege ServiceAccount from manifests/agent.
    let manifests = e2e::repo_root().join("manifests/agent");
    e2e::apply_file(&client, &manifests.join("namespace.yaml"), "default").await?;
    let agent = e2e::service_account_access(
        spoke,
        &manifests.join("rbac.yaml"),
        "flower-addon-agent",
        "flower-agent",
        3600,
    )
    .await?;
    let runtime = KubeRuntime::new(agent.client.clone());
    let t0 = Instant::now();
    let two_pools = two_pools_start_once_their_keys_are_registered(&client, &runtime).await?;
    let versions =
        reapplying_an_unchanged_snapshot_changes_nothing(&client, &runtime, &two_pools).await?;
    an_unrenderable_federation_keeps_its_objects(&client, &runtime, &two_pools, &versions).await?;
    a_removed_pool_is_pruned(&client, &runtime, &two_pools, &versions).await?;
    scaling_down_removes_the_extra_keys(&client, &runtime, &two_pools).await?;
    a_deleted_key_secret_is_made_anew_and_said(&client, &agent.client, &two_pools).await?;
    let nodes = spoke.nodes.clone();
    a_mode_switch_prunes_the_old_kind(&client, &runtime, &nodes).await?;
    a_removed_federation_is_pruned(&client, &runtime).await?;
    the_spoke_policy_refuses_what_its_admin_did_not_allow(&client, &runtime, &agent.client).await?;
    installations_keep_to_their_own_objects(&client, &agent.client).await?;
    existing_namespaces_are_labelled_or_refused(&client, &agent.client).await?;
    // Last: it replaces the agent's ClusterRole with the scoped chart's.
    a_scoped_agent_works_only_in_its_namespaces(spoke, &client).await?;
    eprintln!("kube_runtime scenario {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}

/// 1. Two pools: namespace created, CA Secret, key Secrets and StatefulSets applied; no
///    SuperNode starts before its key is registered, a key that is not its own never starts it,
///    and once the reported keys are registered the pods get Ready via kwok.
async fn two_pools_start_once_their_keys_are_registered(
    client: &Client,
    runtime: &KubeRuntime,
) -> Result<ClusterWork> {
    let two_pools = snapshot(
        1,
        vec![federation(NS, FED, "StatefulSet", &[("a", 2), ("b", 1)])],
    );
    runtime.apply_work(&two_pools).await?;
    ensure!(
        Api::<Namespace>::all(client.clone())
            .get_opt(NS)
            .await?
            .is_some(),
        "namespace {NS} not created"
    );
    let secret = Api::<Secret>::namespaced(client.clone(), NS)
        .get("fed-superlink-ca")
        .await?;
    ensure!(
        secret
            .data
            .as_ref()
            .is_some_and(|d| d.contains_key("ca.crt")),
        "CA Secret without ca.crt"
    );
    ensure!(
        exists::<StatefulSet>(client, "fed-supernode-a").await?,
        "pool a missing"
    );
    ensure!(
        exists::<StatefulSet>(client, "fed-supernode-b").await?,
        "pool b missing"
    );
    let note = wait_event(client, "StatefulSet", "fed-supernode-a", "Applied").await?;
    ensure!(
        note.contains("Federation team-a/fed, pool a: 2 SuperNode(s)"),
        "Applied note: {note}"
    );
    // One private key per pod, kept on the spoke; only public keys are reported.
    ensure!(
        secret_keys(client, "fed-supernode-a-node-keys").await?
            == ["fed-supernode-a-0", "fed-supernode-a-1"],
        "pool a's key Secret"
    );
    ensure!(
        secret_keys(client, "fed-supernode-b-node-keys").await? == ["fed-supernode-b-0"],
        "pool b's key Secret"
    );
    let reported = reported_keys(&runtime.observe().await, FED);
    ensure!(
        reported["a"].len() == 2
            && reported["b"].len() == 1
            && reported
                .values()
                .flatten()
                .all(|k| k.starts_with("ecdsa-sha2-nistp384 ")),
        "public keys not reported: {reported:?}"
    );
    ensure!(
        (
            replicas(client, "fed-supernode-a").await?,
            replicas(client, "fed-supernode-b").await?
        ) == (Some(0), Some(0)),
        "SuperNodes scheduled before their key was registered"
    );
    wait_pools(
        runtime,
        "pools wait for their keys (desired kept)",
        counts(&[("a", 2, 0, "False"), ("b", 1, 0, "False")]),
    )
    .await?;
    // Negative: pod a-1's key and a key of no pod here are registered, a-0's is not; a StatefulSet
    // starts pods in order, so nothing may start.
    let stranger = flower_addon_agent::node_key::generate_node_key()?.public_openssh;
    let partial = registered(two_pools.clone(), 2, &[reported["a"][1].clone(), stranger]);
    runtime.apply_work(&partial).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(
        (
            replicas(client, "fed-supernode-a").await?,
            replicas(client, "fed-supernode-b").await?
        ) == (Some(0), Some(0)),
        "a SuperNode started with an unregistered key"
    );
    ensure!(
        pod_uids(client).await?.is_empty(),
        "pods exist before any key of theirs is registered"
    );
    let registered_work = register_all(runtime, &two_pools, 3).await?;
    let took = wait_pools(
        runtime,
        "pools a 2/2 and b 1/1 Ready",
        counts(&[("a", 2, 2, "True"), ("b", 1, 1, "True")]),
    )
    .await?;
    eprintln!(
        "pools ready {:.1}s after their keys were registered",
        took.as_secs_f64()
    );
    // Each pod reads its own key file, readable through the pod's fsGroup only.
    let sts = Api::<StatefulSet>::namespaced(client.clone(), NS)
        .get("fed-supernode-a")
        .await?;
    let pod = sts.spec.template.spec.context("pod spec")?;
    let args = pod.containers[0].args.clone().unwrap_or_default();
    ensure!(
        args.last().map(String::as_str)
            == Some("--auth-supernode-private-key=/var/run/flower-addon/node-key/$(FLWR_POD_NAME)"),
        "key argument: {args:?}"
    );
    let key_volume = pod
        .volumes
        .iter()
        .flatten()
        .find_map(|v| {
            v.secret
                .clone()
                .filter(|s| s.secret_name.as_deref() == Some("fed-supernode-a-node-keys"))
        })
        .context("key volume")?;
    ensure!(key_volume.default_mode == Some(0o440), "{key_volume:?}");
    ensure!(
        pod.security_context.and_then(|s| s.fs_group) == Some(49999),
        "fsGroup for Flower's uid"
    );
    Ok(registered_work)
}

/// 2. Re-applying the unchanged snapshot changes no resourceVersion and recreates no pod — nor
///    does a hub that restarted and sends no registered keys (registration is sticky).
async fn reapplying_an_unchanged_snapshot_changes_nothing(
    client: &Client,
    runtime: &KubeRuntime,
    two_pools: &ClusterWork,
) -> Result<BTreeMap<String, String>> {
    e2e::wait_statefulsets_settled(client, NS).await?;
    let versions = applied_versions(client).await?;
    let pods = pod_uids(client).await?;
    ensure!(
        versions.len() == 7
            && versions.contains_key("Service/fed-supernode-a")
            && versions.contains_key("Service/fed-supernode-b")
            && versions.contains_key("Secret/fed-supernode-a-node-keys")
            && versions.contains_key("Secret/fed-supernode-b-node-keys"),
        "expected 2 StatefulSets, their 2 headless Services, 2 key Secrets + 1 CA Secret, got {versions:?}"
    );
    runtime
        .apply_work(&snapshot(4, two_pools.federations.clone()))
        .await?;
    runtime
        .apply_work(&snapshot(5, two_pools.federations.clone()))
        .await?;
    // A restarted hub may briefly send fewer (here: no) registered keys.
    runtime
        .apply_work(&registered(two_pools.clone(), 6, &[]))
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    ensure!(
        applied_versions(client).await? == versions,
        "re-apply changed objects: before {versions:?}"
    );
    ensure!(pod_uids(client).await? == pods, "re-apply recreated pods");
    wait_pools(
        runtime,
        "pools still Ready after a hub forgot its registrations",
        counts(&[("a", 2, 2, "True"), ("b", 1, 1, "True")]),
    )
    .await?;
    Ok(versions)
}

/// 3. A Federation whose work cannot be rendered keeps its running objects (never pruned).
async fn an_unrenderable_federation_keeps_its_objects(
    client: &Client,
    runtime: &KubeRuntime,
    two_pools: &ClusterWork,
    versions: &BTreeMap<String, String>,
) -> Result<()> {
    let mut broken = two_pools.federations[0].clone();
    broken.flower_version = "latest".to_owned();
    let err = runtime.apply_work(&snapshot(7, vec![broken])).await;
    ensure!(
        err.is_err(),
        "unreadable flower_version must fail the apply"
    );
    // The spoke's admin sees why on the workloads themselves.
    let note = wait_event(client, "StatefulSet", "fed-supernode-a", "ApplyFailed").await?;
    ensure!(note.contains("latest"), "ApplyFailed note: {note}");
    ensure!(
        applied_versions(client).await? == *versions,
        "a failed apply touched the running objects"
    );
    let status = runtime.observe().await;
    ensure!(
        status[0].pools.iter().all(
            |p| p.conditions[0].status == "False" && p.conditions[0].message.contains("latest")
        ),
        "failed apply not reported: {status:?}"
    );
    ensure!(
        status[0]
            .pools
            .iter()
            .all(|p| !p.node_public_keys.is_empty()),
        "keys still on the cluster must stay reported: {status:?}"
    );
    Ok(())
}

/// 4. Pool b removed → its StatefulSet, Service and key Secret are pruned; pool a untouched.
async fn a_removed_pool_is_pruned(
    client: &Client,
    runtime: &KubeRuntime,
    two_pools: &ClusterWork,
    versions: &BTreeMap<String, String>,
) -> Result<()> {
    let keys = &two_pools.federations[0].registered_node_keys;
    let one_pool = registered(
        snapshot(0, vec![federation(NS, FED, "StatefulSet", &[("a", 2)])]),
        8,
        keys,
    );
    runtime.apply_work(&one_pool).await?;
    wait_gone::<StatefulSet>(client, "fed-supernode-b").await?;
    wait_event(client, "StatefulSet", "fed-supernode-b", "Pruned").await?;
    wait_gone::<k8s_openapi::api::core::v1::Service>(client, "fed-supernode-b").await?;
    wait_gone::<Secret>(client, "fed-supernode-b-node-keys").await?;
    let after = applied_versions(client).await?;
    for kept in [
        "StatefulSet/fed-supernode-a",
        "Secret/fed-supernode-a-node-keys",
    ] {
        ensure!(
            after.get(kept) == versions.get(kept),
            "removing pool b changed {kept}"
        );
    }
    wait_pools(
        runtime,
        "only pool a reported",
        counts(&[("a", 2, 2, "True")]),
    )
    .await?;
    Ok(())
}

/// 4b. Pool a scaled down to 1 → the key (and registration) of pod a-1 is removed, a-0's kept.
async fn scaling_down_removes_the_extra_keys(
    client: &Client,
    runtime: &KubeRuntime,
    two_pools: &ClusterWork,
) -> Result<()> {
    let before = Api::<Secret>::namespaced(client.clone(), NS)
        .get("fed-supernode-a-node-keys")
        .await?
        .data
        .unwrap_or_default();
    let keys = &two_pools.federations[0].registered_node_keys;
    let one = registered(
        snapshot(0, vec![federation(NS, FED, "StatefulSet", &[("a", 1)])]),
        9,
        keys,
    );
    runtime.apply_work(&one).await?;
    let after = Api::<Secret>::namespaced(client.clone(), NS)
        .get("fed-supernode-a-node-keys")
        .await?
        .data
        .unwrap_or_default();
    ensure!(
        after.keys().collect::<Vec<_>>() == ["fed-supernode-a-0"]
            && after.get("fed-supernode-a-0") == before.get("fed-supernode-a-0"),
        "scale-down must drop a-1's key and keep a-0's"
    );
    ensure!(
        replicas(client, "fed-supernode-a").await? == Some(1),
        "replicas after scale-down"
    );
    wait_pools(runtime, "pool a 1/1", counts(&[("a", 1, 1, "True")])).await?;
    Ok(())
}

/// 4c. Pool a's key Secret deleted by hand: the next full apply (an agent restarted here; a
///     running one every `FULL_EVERY`) makes a new key for a-0, says so in a Warning event on the
///     Secret (none was recorded for the Secrets made before), and runs a-0 again only once the
///     new key is registered.
async fn a_deleted_key_secret_is_made_anew_and_said(
    client: &Client,
    agent: &Client,
    two_pools: &ClusterWork,
) -> Result<()> {
    const SECRET: &str = "fed-supernode-a-node-keys";
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), NS);
    let recreated = |list: Vec<k8s_openapi::api::events::v1::Event>| {
        list.into_iter()
            .filter(|e| e.reason.as_deref() == Some("NodeKeysRecreated"))
            .count()
    };
    ensure!(
        recreated(events.list(&Default::default()).await?.items) == 0,
        "NodeKeysRecreated recorded for a key Secret made for the first time"
    );
    let secrets = Api::<Secret>::namespaced(client.clone(), NS);
    let before = secrets.get(SECRET).await?.data.unwrap_or_default();
    secrets.delete(SECRET, &Default::default()).await?;
    wait_gone::<Secret>(client, SECRET).await?;
    let keys = &two_pools.federations[0].registered_node_keys;
    let one = registered(
        snapshot(0, vec![federation(NS, FED, "StatefulSet", &[("a", 1)])]),
        9,
        keys,
    );
    let restarted = KubeRuntime::new(agent.clone());
    restarted.apply_work(&one).await?;
    let after = secrets.get(SECRET).await?.data.unwrap_or_default();
    ensure!(
        after.keys().collect::<Vec<_>>() == ["fed-supernode-a-0"]
            && after.get("fed-supernode-a-0") != before.get("fed-supernode-a-0"),
        "a new key for a-0 in the Secret made again"
    );
    let note = wait_event(client, "Secret", SECRET, "NodeKeysRecreated").await?;
    ensure!(
        note.contains(&format!(
            "Secret {NS}/{SECRET} was deleted while StatefulSet {NS}/fed-supernode-a used it"
        )) && note.contains("fed-supernode-a-0")
            && note.contains("registered the new keys"),
        "NodeKeysRecreated note: {note}"
    );
    ensure!(
        replicas(client, "fed-supernode-a").await? == Some(0),
        "a-0 must wait for its new key to be registered"
    );
    register_all(&restarted, &one, 9).await?;
    ensure!(
        replicas(client, "fed-supernode-a").await? == Some(1),
        "a-0 runs again once its new key is registered"
    );
    wait_pools(
        &restarted,
        "pool a 1/1 on the new key",
        counts(&[("a", 1, 1, "True")]),
    )
    .await?;
    ensure!(
        recreated(events.list(&Default::default()).await?.items) == 1,
        "one NodeKeysRecreated event for one deleted Secret"
    );
    Ok(())
}

/// 5. Mode switch StatefulSet → DaemonSet: the old kind is pruned, the pool's keys become one
///    per node, the DaemonSet runs on no node before its key is registered, then on every kwok
///    node.
async fn a_mode_switch_prunes_the_old_kind(
    client: &Client,
    runtime: &KubeRuntime,
    nodes: &[String],
) -> Result<()> {
    let count = u32::try_from(nodes.len())?;
    let daemon = snapshot(10, vec![federation(NS, FED, "DaemonSet", &[("a", 0)])]);
    runtime.apply_work(&daemon).await?;
    wait_gone::<StatefulSet>(client, "fed-supernode-a").await?;
    // A DaemonSet names no Service: the StatefulSet's headless one goes with it.
    wait_gone::<k8s_openapi::api::core::v1::Service>(client, "fed-supernode-a").await?;
    ensure!(
        exists::<DaemonSet>(client, "fed-supernode-a").await?,
        "DaemonSet missing"
    );
    let mut want_keys = nodes.to_vec();
    want_keys.sort();
    ensure!(
        secret_keys(client, "fed-supernode-a-node-keys").await? == want_keys,
        "DaemonSet keys must be one per node"
    );
    let daemonsets = Api::<DaemonSet>::namespaced(client.clone(), NS);
    e2e::wait_until(
        "DaemonSet observed with no registered node",
        Duration::from_secs(60),
        || async {
            let d = daemonsets.get("fed-supernode-a").await?;
            Ok(d.status.is_some_and(|st| {
                st.observed_generation == d.metadata.generation && st.desired_number_scheduled == 0
            }))
        },
    )
    .await?;
    wait_pools(
        runtime,
        "DaemonSet pool waits for its node keys",
        counts(&[("a", count, 0, "False")]),
    )
    .await?;
    register_all(runtime, &daemon, 11).await?;
    wait_pools(
        runtime,
        "DaemonSet pool ready on every node",
        counts(&[("a", count, count, "True")]),
    )
    .await?;
    Ok(())
}

/// 6. Federation removed from the snapshot → its workload and Secrets are pruned; another
///    Federation applied in the same snapshot is kept.
async fn a_removed_federation_is_pruned(client: &Client, runtime: &KubeRuntime) -> Result<()> {
    let other = federation("team-b", "other", "StatefulSet", &[("x", 1)]);
    runtime
        .apply_work(&snapshot(12, vec![other.clone()]))
        .await?;
    wait_gone::<DaemonSet>(client, "fed-supernode-a").await?;
    wait_gone::<Secret>(client, "fed-superlink-ca").await?;
    wait_gone::<Secret>(client, "fed-supernode-a-node-keys").await?;
    ensure!(
        Api::<StatefulSet>::namespaced(client.clone(), "team-b")
            .get_opt("other-supernode-x")
            .await?
            .is_some(),
        "the remaining Federation's pool is missing"
    );
    ensure!(
        Api::<Namespace>::all(client.clone())
            .get_opt(NS)
            .await?
            .is_some(),
        "the agent must never delete namespaces"
    );
    Ok(())
}

/// 8. The spoke's pod policy: the namespace the runtime created carries the Pod
///    Security `baseline` labels; a Federation whose pods want the host network and a foreign
///    service account is refused as a whole (no key Secret, no workload), naming each violation
///    and the flag that allows it; allowed by the admin, it applies. An object of the pool's name
///    that the agent did not create is refused and left unchanged.
async fn the_spoke_policy_refuses_what_its_admin_did_not_allow(
    client: &Client,
    runtime: &KubeRuntime,
    agent: &Client,
) -> Result<()> {
    let labels = Api::<Namespace>::all(client.clone())
        .get(NS)
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    ensure!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str)
            == Some("baseline"),
        "namespace {NS} created without the baseline label: {labels:?}"
    );
    let mut hostnet = federation(NS, "hostnet", "StatefulSet", &[("a", 1)]);
    let mut spec: serde_json::Value = serde_json::from_str(&hostnet.federation_spec_json)?;
    let template = serde_json::json!({"spec": {"hostNetwork": true, "serviceAccountName": "ops-admin", "containers": []}});
    spec["supernodes"]["pools"][0]["podTemplate"] = template.clone();
    hostnet.federation_spec_json = spec.to_string();
    let mut pool: serde_json::Value = serde_json::from_str(&hostnet.pools[0].spec_json)?;
    pool["podTemplate"] = template;
    hostnet.pools[0].spec_json = pool.to_string();
    let work = snapshot(20, vec![hostnet]);
    let error = runtime
        .apply_work(&work)
        .await
        .expect_err("hostNetwork and a foreign service account must be refused");
    let message = error.to_string();
    for part in [
        "pod policy",
        "hostNetwork",
        "--allow host-network",
        "serviceAccountName ops-admin",
        "--allow-service-account ops-admin",
    ] {
        ensure!(message.contains(part), "{part:?} not in {message}");
    }
    ensure!(
        !exists::<StatefulSet>(client, "hostnet-supernode-a").await?
            && !exists::<Secret>(client, "hostnet-supernode-a-node-keys").await?,
        "a refused Federation wrote objects"
    );
    let reported = runtime.observe().await;
    ensure!(
        reported
            .iter()
            .filter(|f| f.name == "hostnet")
            .flat_map(|f| f.pools.iter())
            .flat_map(|p| p.conditions.iter())
            .any(|c| c.message.contains("pod policy")),
        "the refusal is not reported to the hub: {reported:?}"
    );
    // The admin allows both: the same work applies.
    let mut policy = PodPolicy::spoke_default();
    policy.allowed = [Allowance::HostNetwork].into();
    policy.service_accounts = ["ops-admin".to_string()].into();
    let allowing = KubeRuntime::new(agent.clone()).with_policy(policy);
    allowing.apply_work(&work).await?;
    ensure!(
        exists::<StatefulSet>(client, "hostnet-supernode-a").await?,
        "allowed by the admin, the pool was not applied"
    );

    // A StatefulSet of the pool's name created by someone else: refused, left as it was.
    let foreign: StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "own-supernode-a", "namespace": NS, "labels": {"team": "other"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "other"}},
            "template": {
                "metadata": {"labels": {"app": "other"}},
                "spec": {"containers": [{"name": "c", "image": "example.org/other:1"}]}
            }
        }
    }))?;
    let sts = Api::<StatefulSet>::namespaced(client.clone(), NS);
    let created = sts.create(&Default::default(), &foreign).await?;
    let error = runtime
        .apply_work(&snapshot(
            21,
            vec![federation(NS, "own", "StatefulSet", &[("a", 1)])],
        ))
        .await
        .expect_err("a foreign object of the same name must be refused");
    ensure!(
        error.to_string().contains(
            "StatefulSet team-a/own-supernode-a exists and was not created by this agent"
        ),
        "{error}"
    );
    let after = sts.get("own-supernode-a").await?;
    // (Its status is the controller's; its spec and labels must be as created.)
    ensure!(
        after.metadata.generation == created.metadata.generation
            && after.metadata.labels == created.metadata.labels,
        "the foreign StatefulSet was changed: {:?}",
        after.metadata
    );
    ensure!(
        !exists::<Secret>(client, "own-supernode-a-node-keys").await?,
        "a refused Federation wrote its key Secret"
    );
    sts.delete("own-supernode-a", &Default::default()).await?;
    allowing.apply_work(&snapshot(22, Vec::new())).await?;
    wait_gone::<StatefulSet>(client, "hostnet-supernode-a").await?;
    Ok(())
}

/// 9. Two agents in one cluster (installation ids `x` and `y`): each prunes and takes over only
///    its own objects.
async fn installations_keep_to_their_own_objects(client: &Client, agent: &Client) -> Result<()> {
    let runtime = |id: &str| {
        KubeRuntime::with_applier(agent.clone(), Applier::agent().with_installation(id))
            .with_policy(PodPolicy::spoke_default())
    };
    let (x, y) = (runtime("x"), runtime("y"));
    x.apply_work(&snapshot(
        1,
        vec![federation(NS, "fx", "StatefulSet", &[("a", 1)])],
    ))
    .await?;
    // y's first apply is a full one: it prunes everything of its own not wanted, not x's.
    y.apply_work(&snapshot(
        1,
        vec![federation(NS, "fy", "StatefulSet", &[("a", 1)])],
    ))
    .await?;
    ensure!(
        exists::<StatefulSet>(client, "fx-supernode-a").await?
            && exists::<StatefulSet>(client, "fy-supernode-a").await?,
        "one installation pruned the other's pool"
    );
    let taken = y
        .apply_work(&snapshot(
            2,
            vec![
                federation(NS, "fx", "StatefulSet", &[("a", 1)]),
                federation(NS, "fy", "StatefulSet", &[("a", 1)]),
            ],
        ))
        .await
        .expect_err("y must not take over x's objects");
    ensure!(
        taken.to_string().contains("was not created by this agent"),
        "{taken}"
    );
    ensure!(
        exists::<StatefulSet>(client, "fy-supernode-a").await?,
        "y's own pool did not survive the refused one"
    );
    x.apply_work(&snapshot(3, Vec::new())).await?;
    y.apply_work(&snapshot(3, Vec::new())).await?;
    wait_gone::<StatefulSet>(client, "fx-supernode-a").await?;
    wait_gone::<StatefulSet>(client, "fy-supernode-a").await?;
    Ok(())
}

/// A StatefulSet `name` exists in `namespace`.
async fn exists_in(client: &Client, namespace: &str, name: &str) -> Result<bool> {
    Ok(Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
        .is_some())
}

async fn create_namespace(client: &Client, name: &str, labels: &[(&str, &str)]) -> Result<()> {
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
    }))?;
    Api::<Namespace>::all(client.clone())
        .create(&Default::default(), &ns)
        .await?;
    Ok(())
}

async fn namespace_labels(client: &Client, name: &str) -> Result<BTreeMap<String, String>> {
    Ok(Api::<Namespace>::all(client.clone())
        .get(name)
        .await?
        .metadata
        .labels
        .unwrap_or_default())
}

/// 10. Namespaces that existed before the agent: one without Pod Security labels gets the
///     agent's (`baseline`, the admin's own `warn` kept) when work arrives; one labelled
///     `privileged` is refused with the command that fixes it and nothing is written there,
///     until the admin allows weaker namespaces; Kubernetes' own namespaces never take work.
async fn existing_namespaces_are_labelled_or_refused(
    client: &Client,
    agent: &Client,
) -> Result<()> {
    const ENFORCE: &str = "pod-security.kubernetes.io/enforce";
    create_namespace(
        client,
        "plain",
        &[("pod-security.kubernetes.io/warn", "restricted")],
    )
    .await?;
    create_namespace(client, "loose", &[(ENFORCE, "privileged")]).await?;
    let runtime = KubeRuntime::new(agent.clone()).with_policy(PodPolicy::spoke_default());
    runtime
        .apply_work(&snapshot(
            30,
            vec![federation("plain", "p", "StatefulSet", &[("a", 1)])],
        ))
        .await?;
    let labels = namespace_labels(client, "plain").await?;
    let want: BTreeMap<String, String> = [
        (ENFORCE, "baseline"),
        ("pod-security.kubernetes.io/audit", "baseline"),
        ("pod-security.kubernetes.io/warn", "restricted"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    ensure!(
        want.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "existing namespace plain labelled {labels:?}, want {want:?}"
    );
    ensure!(
        exists_in(client, "plain", "p-supernode-a").await?,
        "the pool in the labelled namespace was not applied"
    );

    for (namespace, part) in [
        (
            "loose",
            "kubectl label namespace loose pod-security.kubernetes.io/enforce=baseline --overwrite",
        ),
        ("kube-system", "namespace kube-system is Kubernetes' own"),
    ] {
        let error = runtime
            .apply_work(&snapshot(
                31,
                vec![federation(namespace, "w", "StatefulSet", &[("a", 1)])],
            ))
            .await
            .expect_err("work in a weaker or system namespace must be refused");
        ensure!(error.to_string().contains(part), "{part:?} not in {error}");
        ensure!(
            !exists_in(client, namespace, "w-supernode-a").await?
                && Api::<Secret>::namespaced(client.clone(), namespace)
                    .get_opt("w-superlink-ca")
                    .await?
                    .is_none(),
            "a refused Federation wrote objects in {namespace}"
        );
    }
    ensure!(
        namespace_labels(client, "loose")
            .await?
            .get(ENFORCE)
            .map(String::as_str)
            == Some("privileged"),
        "the admin's label on loose was changed"
    );
    let mut policy = PodPolicy::spoke_default();
    policy.allowed = [Allowance::WeakerNamespaces].into();
    let allowing = KubeRuntime::new(agent.clone()).with_policy(policy);
    allowing
        .apply_work(&snapshot(
            32,
            vec![federation("loose", "w", "StatefulSet", &[("a", 1)])],
        ))
        .await?;
    ensure!(
        exists_in(client, "loose", "w-supernode-a").await?,
        "allowed by the admin, the pool in loose was not applied"
    );
    allowing.apply_work(&snapshot(33, Vec::new())).await?;
    Ok(())
}

/// 11. The chart with `agent.namespaces=[scoped]`: the agent's ServiceAccount may not read
///     Secrets cluster-wide nor write outside `scoped`; with `--namespaces scoped` it applies,
///     reports and prunes a Federation there (listing per namespace) and refuses work for
///     another namespace with the flag and the Helm value that add it.
async fn a_scoped_agent_works_only_in_its_namespaces(
    spoke: &e2e::Cluster,
    client: &Client,
) -> Result<()> {
    use e2e::access::{Access, can_i};
    create_namespace(client, "scoped", &[]).await?;
    let chart = e2e::helm::chart();
    let rendered = e2e::helm::run(
        None,
        &[
            "template",
            "flower-addon",
            chart.to_str().context("chart path")?,
            "--namespace",
            "flower-addon-scoped",
            "--set",
            "hub.enabled=false",
            "--set",
            "agent.enabled=true",
            "--set",
            "agent.namespaces={scoped}",
        ],
    )?;
    let manifest = spoke.dir().join("scoped-agent.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: flower-addon-scoped}}\n---\n{rendered}"
        ),
    )?;
    let sa = e2e::service_account_access(
        spoke,
        &manifest,
        "flower-addon-scoped",
        "flower-agent",
        3600,
    )
    .await?;
    for (verb, resource, namespace, allowed) in [
        ("list", "secrets", None, false),
        ("create", "statefulsets", Some(NS), false),
        ("get", "secrets", Some("kube-system"), false),
        ("create", "statefulsets", Some("scoped"), true),
        ("list", "secrets", Some("scoped"), true),
        ("update", "secrets", Some("flower-addon-scoped"), true),
        ("create", "statefulsets", Some("flower-addon-scoped"), false),
    ] {
        let group = if resource == "statefulsets" {
            "apps"
        } else {
            ""
        };
        let what = Access {
            verb,
            group,
            resource,
            namespace,
            ..Default::default()
        };
        ensure!(
            can_i(client, &sa, &what).await? == allowed,
            "the scoped agent {} {verb} {resource} in {namespace:?}",
            if allowed { "may not" } else { "may" }
        );
    }
    let mut policy = PodPolicy::spoke_default();
    policy.namespaces = Some(["scoped".to_owned()].into());
    let runtime = KubeRuntime::new(sa.client.clone()).with_policy(policy);
    runtime
        .apply_work(&snapshot(
            40,
            vec![federation("scoped", "s", "StatefulSet", &[("a", 1)])],
        ))
        .await?;
    ensure!(
        exists_in(client, "scoped", "s-supernode-a").await?,
        "the scoped agent did not apply its pool"
    );
    let error = runtime
        .apply_work(&snapshot(
            41,
            vec![
                federation("scoped", "s", "StatefulSet", &[("a", 1)]),
                federation(NS, "elsewhere", "StatefulSet", &[("a", 1)]),
            ],
        ))
        .await
        .expect_err("work outside --namespaces must be refused");
    for part in [
        "namespace team-a is not one this agent manages",
        "--namespaces scoped",
        "agent.namespaces",
    ] {
        ensure!(error.to_string().contains(part), "{part:?} not in {error}");
    }
    ensure!(
        !exists::<StatefulSet>(client, "elsewhere-supernode-a").await?,
        "work outside the agent's namespaces was applied"
    );
    runtime.apply_work(&snapshot(42, Vec::new())).await?;
    e2e::wait_until(
        "the scoped pool pruned",
        Duration::from_secs(60),
        || async { Ok(!exists_in(client, "scoped", "s-supernode-a").await?) },
    )
    .await?;
    Ok(())
}

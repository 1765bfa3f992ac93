//! The agent as an Open Cluster Management addon (`manifests/ocm/`), against OCM v1.2.0's own hub
//! controllers (registration, placement, work, addon manager) and klusterlets on the test control
//! plane: enabling the addon on two OCM clusters installs the agent through OCM's work agent, the
//! klusterlet's CSR is signed by flower-hub (no token of ours), the agent runs on that
//! certificate and gets the work of a Federation placed by an OCM Placement; another cluster's
//! klusterlet cannot get a cluster's identity; disabling the addon, or OCM no longer accepting a
//! cluster, ends the hub's trust in it. Disabled with its agent already gone, the addon leaves no
//! pool, Secret or Service of ours on the spoke (the addon's namespace owns them all, and the
//! garbage collector removes them with it); enabled again, the pool comes back.
//!
//! The kwok "pods" of the agent's Deployment are not real: the agent runs as a local process,
//! with the command line of the Deployment OCM's work agent applied on the spoke (template
//! variables substituted) and the certificate and key from the Secret OCM's klusterlet wrote
//! there. The real-node variant with Flower is the next step of the OCM work.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use e2e::addon::{Addon, AddonOptions};
use e2e::cluster::ControlPlane;
use e2e::harness::{Wait, wait_until};
use e2e::ocm::{OcmHub, conditions, managed_cluster_resource};
use flower_addon_hub::kube::ocm_addon::{REGISTERED_BY_LABEL, REGISTERED_BY_OCM, addon_resource};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};

const NS: &str = "fl";
/// `agentInstallNamespace` of `manifests/ocm/addon-deployment-config.yaml`.
const AGENT_NS: &str = "flower-addon-ocm";
/// The Secret OCM's klusterlet keeps the addon's certificate in (`<addon>-<signer>-client-cert`).
const CERT_SECRET: &str = "flower-addon-flower-addon.io-work-channel-client-cert";
/// Where the template's Deployment reads it (OCM mounts the Secret there).
const CERT_DIR: &str = "/managed/flower-addon.io-work-channel";
/// How long OCM's hub controllers are down.
const OCM_OUTAGE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_installs_as_an_ocm_addon_and_the_hub_signs_its_certificate() -> Result<()> {
    e2e::install_crypto();
    let mut cp = ControlPlane::start(&["hub", "spoke-1", "spoke-2"]).await?;
    let dir = cp.work_dir().join("ocm");
    let hub = cp.cluster("hub")?.clone();
    let mut ocm = OcmHub::start(&hub, &dir).await?;
    let result = run(&mut cp, &mut ocm).await;
    if result.is_err() {
        for name in [
            "ocm-addon",
            "ocm-registration",
            "klusterlet-edge-1",
            "klusterlet-edge-2",
        ] {
            let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- {name} (last 30 lines)\n{}",
                lines[lines.len().saturating_sub(30)..].join("\n")
            );
        }
    }
    cp.log_tails_on_error(&result, &["flower-hub", "agent-edge-1", "agent-edge-2"]);
    result
}

async fn run(cp: &mut ControlPlane, ocm: &mut OcmHub) -> Result<()> {
    let hub = cp.cluster("hub")?.client.clone();
    for (spoke, name) in [("spoke-1", "edge-1"), ("spoke-2", "edge-2")] {
        ocm.join(cp.cluster(spoke)?, name).await?;
    }
    // flower-hub as manifests/hub runs it, after OCM's APIs exist (it looks for them at start).
    let addon = Addon::install(cp, &[], &AddonOptions::default()).await?;
    let ca_hash = channel_ca_hash(&hub).await?;

    // The admin installs the addon: manifests/ocm with the deployment config filled in.
    let root = e2e::repo_root().join("manifests/ocm");
    for file in ["cluster-management-addon.yaml", "addon-template.yaml"] {
        e2e::apply_file(&hub, &root.join(file), "default").await?;
    }
    let config = std::fs::read_to_string(root.join("addon-deployment-config.yaml"))?
        .replace("hub.example.com:30443", &addon.hub_address)
        .replace(
            "sha256:0000000000000000000000000000000000000000000000000000000000000000",
            &ca_hash,
        );
    e2e::apply_yaml(&hub, &config, "default").await?;

    // `clusteradm addon enable --names flower-addon --clusters edge-1,edge-2`.
    let t_enable = Instant::now();
    for cluster in ["edge-1", "edge-2"] {
        enable(&hub, cluster).await?;
    }
    let mut issued = BTreeMap::new();
    for (spoke, cluster) in [("spoke-1", "edge-1"), ("spoke-2", "edge-2")] {
        let spoke_client = cp.cluster(spoke)?.client.clone();
        let secret = Wait::new(
            format!("OCM's klusterlet of {cluster} to store the certificate flower-hub signed"),
            Duration::from_secs(90),
        )
        .for_value(|| {
            let secrets: Api<Secret> = Api::namespaced(spoke_client.clone(), AGENT_NS);
            async move {
                Ok(secrets.get_opt(CERT_SECRET).await?.filter(|s| {
                    s.data
                        .as_ref()
                        .is_some_and(|d| d.contains_key("tls.crt") && d.contains_key("tls.key"))
                }))
            }
        })
        .await?;
        issued.insert(cluster, t_enable.elapsed());
        let data = secret.data.unwrap_or_default();
        let cert = String::from_utf8(data["tls.crt"].0.clone())?;
        ensure!(
            flower_addon_agent::ocm_addon::cluster_of(&cert).as_deref() == Ok(cluster),
            "the certificate of {cluster} names {:?}",
            flower_addon_agent::ocm_addon::cluster_of(&cert)
        );
        // The hub registered the cluster under OCM's name, accepted, bound to the key.
        let ours: Api<flower_addon_crds::ManagedCluster> = Api::all(hub.clone());
        let mc = ours.get(cluster).await?;
        ensure!(
            mc.labels().get(REGISTERED_BY_LABEL).map(String::as_str) == Some(REGISTERED_BY_OCM)
                && mc.spec.hub_accepts_client,
            "{cluster}: {:?}",
            mc.metadata
        );
        // The agent, as the Deployment OCM's work agent applied on the spoke runs it.
        start_agent(cp, &addon, spoke, cluster, &data).await?;
    }
    let ours: Api<flower_addon_crds::ManagedCluster> = Api::all(hub.clone());
    let t_connected = Instant::now();
    for cluster in ["edge-1", "edge-2"] {
        Wait::new(
            format!("{cluster}'s agent connected to the hub"),
            Duration::from_secs(60),
        )
        .until(|| {
            let ours = ours.clone();
            async move { Ok(available(&ours.get(cluster).await?)) }
        })
        .await?;
    }
    let connected = t_connected.elapsed();
    // OCM reports the addon Available from the Deployment's availability (kwok runs its pod).
    let addons: Api<DynamicObject> = Api::namespaced_with(hub.clone(), "edge-1", &addon_resource());
    Wait::new(
        "OCM's ManagedClusterAddOn edge-1/flower-addon Available",
        Duration::from_secs(90),
    )
    .until(|| {
        let addons = addons.clone();
        async move {
            let a = addons.get("flower-addon").await?;
            Ok(conditions(&a).get("Available").map(String::as_str) == Some("True"))
        }
    })
    .await?;

    // A Federation placed by an OCM Placement selecting OCM's label flower=yes: its pool runs on
    // edge-1 through the addon agent.
    let clusters: Api<DynamicObject> = Api::all_with(hub.clone(), &managed_cluster_resource());
    e2e::ocm::label_cluster(&hub, "edge-1", "flower", Some("yes")).await?;
    e2e::ocm::place_by_label(&hub, NS, "flower", "flower", "yes").await?;
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
"#
        ),
        NS,
    )
    .await?;
    let spoke1 = cp.cluster("spoke-1")?.client.clone();
    let sets: Api<StatefulSet> = Api::namespaced(spoke1.clone(), NS);
    let t_pool = Instant::now();
    wait_until(
        "fed's pool a applied on spoke-1 by the addon agent",
        Duration::from_secs(90),
        || async { Ok(!sets.list(&ListParams::default()).await?.items.is_empty()) },
    )
    .await?;
    let pool = t_pool.elapsed();

    // OCM's hub controllers down for a minute (the apiserver stays up): nothing the addon runs
    // is torn down, and a change made in OCM meanwhile takes effect once they are back.
    // (The SuperLink does not run on kwok, so the SuperNodes wait for their keys with 0
    // replicas: what must not change is the StatefulSet the agent applied.)
    let sets_before = workload_ids(&spoke1, NS).await?;
    ensure!(!sets_before.is_empty(), "no StatefulSet on spoke-1");
    ocm.stop_hub_controllers()?;
    let outage = Instant::now();
    clusters
        .patch(
            "edge-2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"flower": "yes"}}})),
        )
        .await?;
    let spoke2 = cp.cluster("spoke-2")?.client.clone();
    let sets2: Api<StatefulSet> = Api::namespaced(spoke2.clone(), NS);
    while outage.elapsed() < OCM_OUTAGE {
        for cluster in ["edge-1", "edge-2"] {
            ensure!(
                ours.get_opt(cluster).await?.as_ref().is_some_and(available),
                "{cluster} lost or unavailable while OCM's hub controllers were down"
            );
        }
        ensure!(
            workload_ids(&spoke1, NS).await? == sets_before,
            "fed's StatefulSet on spoke-1 changed while OCM's hub controllers were down"
        );
        ensure!(
            sets2.list(&ListParams::default()).await?.items.is_empty(),
            "edge-2 got fed's pool without OCM's placement controller deciding it"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    ocm.start_hub_controllers()?;
    let t_resumed = Instant::now();
    wait_until(
        "OCM's decision (edge-2 relabelled during the outage) to reach spoke-2 once OCM is back",
        Duration::from_secs(90),
        || async { Ok(!sets2.list(&ListParams::default()).await?.items.is_empty()) },
    )
    .await?;
    let resumed = t_resumed.elapsed();
    ensure!(
        workload_ids(&spoke1, NS).await? == sets_before,
        "fed's StatefulSet on spoke-1 changed when OCM's hub controllers came back"
    );

    // A ManagedClusterAddOn in a namespace with no OCM ManagedCluster, and a CSR for that
    // cluster from what looks like its klusterlet (its user and group, impersonated): refused,
    // nothing registered.
    e2e::apply_yaml(
        &hub,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: ghost}\n",
        "default",
    )
    .await?;
    enable(&hub, "ghost").await?;
    // What OCM grants a cluster's klusterlet on the hub: creating CSRs.
    e2e::apply_yaml(
        &hub,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: test-ghost-csr}
rules: [{apiGroups: [certificates.k8s.io], resources: [certificatesigningrequests], verbs: [create, get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: test-ghost-csr}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: test-ghost-csr}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:open-cluster-management:ghost"}]
"#,
        "default",
    )
    .await?;
    let ghost_klusterlet = {
        let mut kubeconfig = kube::config::Kubeconfig::read_from(&cp.cluster("hub")?.kubeconfig)?;
        for user in &mut kubeconfig.auth_infos {
            if let Some(auth) = user.auth_info.as_mut() {
                auth.impersonate = Some("system:open-cluster-management:ghost:agent".into());
                auth.impersonate_groups = Some(vec![
                    "system:open-cluster-management:ghost".into(),
                    "system:authenticated".into(),
                ]);
            }
        }
        Client::try_from(
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?,
        )?
    };
    Api::<CertificateSigningRequest>::all(ghost_klusterlet)
        .create(&PostParams::default(), &forged_csr("ghost")?)
        .await
        .context("ghost's klusterlet (impersonated) creates a CSR")?;
    let ghost_refusal = refused(
        &hub,
        "addon-ghost-flower-addon-forged",
        "ghost's klusterlet",
    )
    .await?;
    ensure!(
        ghost_refusal.contains("join the cluster to OCM"),
        "refusal of ghost's CSR: {ghost_refusal}"
    );

    // edge-1's klusterlet asks for edge-2's identity (labels and all): refused by the hub, no
    // certificate.
    let klusterlet = e2e::kubeconfig::client(&ocm.klusterlet_hub_kubeconfig("edge-1")).await?;
    let forged = forged_csr("edge-2")?;
    let csrs: Api<CertificateSigningRequest> = Api::all(klusterlet);
    csrs.create(&PostParams::default(), &forged)
        .await
        .context("edge-1's klusterlet creates a CSR naming edge-2")?;
    let message = refused(
        &hub,
        "addon-edge-2-flower-addon-forged",
        "edge-1's klusterlet for edge-2",
    )
    .await?;
    ensure!(
        message.contains("not the klusterlet of cluster \"edge-2\""),
        "refusal: {message}"
    );

    ensure!(
        ours.get_opt("ghost").await?.is_none(),
        "a cluster was registered for a ManagedClusterAddOn without an OCM ManagedCluster"
    );

    // Disable the addon on edge-1 with its agent already gone (as a node lost with the agent's
    // pod): nothing of ours may outlive the addon. OCM's work agent deletes the addon's
    // namespace, which owns every object the agent applied, so the garbage collector removes
    // the pool, its key Secrets, CA Secret and Service; the hub stops trusting edge-1.
    let ours_on_spoke1 = e2e::ocm::objects_of_ours(&spoke1, NS).await?;
    let owner_uid = Api::<k8s_openapi::api::core::v1::Namespace>::all(spoke1.clone())
        .get(AGENT_NS)
        .await?
        .metadata
        .uid;
    ensure!(
        ours_on_spoke1.len() >= 3
            && ours_on_spoke1
                .iter()
                .all(|(_, owners)| owners.contains(&format!(
                    "Namespace/{AGENT_NS}/{}",
                    owner_uid.as_deref().unwrap_or("")
                ))),
        "every object the addon agent applied on spoke-1 must be owned by its namespace {AGENT_NS}: {ours_on_spoke1:#?}"
    );
    cp.processes().stop("agent-edge-1")?;
    let t_disable = Instant::now();
    addons
        .delete("flower-addon", &DeleteParams::default())
        .await?;
    wait_until(
        "the hub to stop trusting edge-1 once its addon is disabled",
        Duration::from_secs(60),
        || async { Ok(ours.get_opt("edge-1").await?.is_none()) },
    )
    .await?;
    let untrusted = t_disable.elapsed();
    let deployments: Api<Deployment> = Api::namespaced(spoke1.clone(), AGENT_NS);
    wait_until(
        "OCM's work agent to remove the agent's Deployment from spoke-1",
        Duration::from_secs(90),
        || async { Ok(deployments.get_opt("flower-agent").await?.is_none()) },
    )
    .await?;
    wait_until(
        "the garbage collector to remove fed's pool, its Secrets and Service from spoke-1 with the addon's namespace",
        Duration::from_secs(120),
        || async { Ok(e2e::ocm::objects_of_ours(&spoke1, NS).await?.is_empty()) },
    )
    .await?;
    let collected = t_disable.elapsed();
    let feds: Api<flower_addon_crds::Federation> = Api::namespaced(hub.clone(), NS);
    wait_until(
        "fed's status to stop listing edge-1 (its SuperNode keys unregistered with it)",
        Duration::from_secs(60),
        || async {
            let fed = feds.get("fed").await?;
            Ok(fed
                .status
                .as_ref()
                .is_some_and(|s| s.clusters.iter().all(|c| c.name != "edge-1")))
        },
    )
    .await?;

    // Enabled again: the agent comes back through OCM and so does the pool.
    let t_reenable = Instant::now();
    enable(&hub, "edge-1").await?;
    let spoke1_secrets: Api<Secret> = Api::namespaced(spoke1.clone(), AGENT_NS);
    let secret = Wait::new(
        "OCM's klusterlet of edge-1 to store a new certificate once the addon is enabled again",
        Duration::from_secs(120),
    )
    .for_value(|| {
        let secrets = spoke1_secrets.clone();
        async move {
            Ok(secrets
                .get_opt(CERT_SECRET)
                .await?
                .filter(|s| s.data.as_ref().is_some_and(|d| d.contains_key("tls.key"))))
        }
    })
    .await?;
    start_agent(
        cp,
        &addon,
        "spoke-1",
        "edge-1",
        &secret.data.unwrap_or_default(),
    )
    .await?;
    wait_until(
        "fed's pool back on spoke-1 once the addon is enabled again",
        Duration::from_secs(120),
        || async { Ok(!sets.list(&ListParams::default()).await?.items.is_empty()) },
    )
    .await?;
    let back = t_reenable.elapsed();
    // OCM no longer accepts edge-2: the hub deletes it too.
    // OCM no longer accepts edge-2: the hub deletes it too.
    clusters
        .patch(
            "edge-2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"hubAcceptsClient": false}})),
        )
        .await?;
    wait_until(
        "the hub to stop trusting edge-2 once OCM no longer accepts it",
        Duration::from_secs(60),
        || async { Ok(ours.get_opt("edge-2").await?.is_none()) },
    )
    .await?;
    eprintln!(
        "ocm_addon: certificates signed and stored by OCM's klusterlets {:.1}s / {:.1}s after enabling; agents connected in {:.1}s; OCM-placed pool applied in {:.1}s; OCM's hub controllers down {}s: nothing torn down, the decision made meanwhile applied {:.1}s after they were back; forged CSR refused ({message:?}); ghost's refused ({ghost_refusal:?}); trust ended {:.1}s after the addon was disabled, its pool, Secrets and Service collected after {:.1}s, back {:.1}s after enabling it again",
        issued["edge-1"].as_secs_f64(),
        issued["edge-2"].as_secs_f64(),
        connected.as_secs_f64(),
        pool.as_secs_f64(),
        OCM_OUTAGE.as_secs(),
        resumed.as_secs_f64(),
        untrusted.as_secs_f64(),
        collected.as_secs_f64(),
        back.as_secs_f64()
    );
    Ok(())
}

/// The sorted `name/uid/generation` of the StatefulSets in `namespace`.
async fn workload_ids(client: &Client, namespace: &str) -> Result<Vec<String>> {
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    let mut ids: Vec<String> = sets
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|s| {
            format!(
                "{}/{}/{}",
                s.name_any(),
                s.uid().unwrap_or_default(),
                s.metadata.generation.unwrap_or_default()
            )
        })
        .collect();
    ids.sort();
    Ok(ids)
}

/// The hash of flower-hub's work-channel CA (what `flower-hub ca status --ca channel` shows).
async fn channel_ca_hash(hub: &Client) -> Result<String> {
    use flower_addon_hub::registration::store::ClusterStore;
    let store =
        flower_addon_hub::kube::store::KubeStore::without_watch(hub.clone(), e2e::addon::HUB_NS);
    let material = Wait::new(
        "flower-hub to create its work-channel CA",
        Duration::from_secs(60),
    )
    .for_value(|| async { Ok(store.load_ca().await?) })
    .await?;
    Ok(
        flower_addon_hub::registration::ca::HubCa::from_material(material)?
            .hash()
            .to_owned(),
    )
}

/// What `clusteradm addon enable` creates.
async fn enable(hub: &Client, cluster: &str) -> Result<()> {
    e2e::apply_yaml(
        hub,
        &format!(
            "apiVersion: addon.open-cluster-management.io/v1alpha1\nkind: ManagedClusterAddOn\nmetadata: {{name: flower-addon, namespace: {cluster}}}\nspec: {{}}\n"
        ),
        cluster,
    )
    .await?;
    Ok(())
}

/// Whether the addon's `ManagedCluster` says its agent is connected.
fn available(mc: &flower_addon_crds::ManagedCluster) -> bool {
    mc.status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == flower_addon_crds::CONDITION_AVAILABLE)
        })
        .is_some_and(|c| c.status == "True")
}

/// Starts cluster `cluster`'s agent as a local process: the command of the Deployment OCM's work
/// agent applied on `spoke`, the klusterlet's pair from `data` where the Deployment mounts it.
async fn start_agent(
    cp: &mut ControlPlane,
    addon: &Addon,
    spoke: &str,
    cluster: &str,
    data: &BTreeMap<String, k8s_openapi::ByteString>,
) -> Result<()> {
    let spoke_cluster = cp.cluster(spoke)?.clone();
    let deployments: Api<Deployment> = Api::namespaced(spoke_cluster.client.clone(), AGENT_NS);
    let deployment = Wait::new(
        format!("OCM's work agent to apply the agent's Deployment on {spoke}"),
        Duration::from_secs(60),
    )
    .for_value(|| {
        let deployments = deployments.clone();
        async move { Ok(deployments.get_opt("flower-agent").await?) }
    })
    .await?;
    let work_dir = cp.work_dir().join(format!("addon-{cluster}"));
    let cert_dir = work_dir.join("managed");
    std::fs::create_dir_all(&cert_dir)?;
    for key in ["tls.crt", "tls.key"] {
        std::fs::write(cert_dir.join(key), &data[key].0)?;
    }
    let manifest = work_dir.join("deployment.yaml");
    std::fs::write(&manifest, serde_saphyr::to_string(&deployment)?)?;
    let mut command = e2e::ContainerCommand::from_manifest(&manifest, "agent", AGENT_NS)?;
    ensure!(
        command.argv.contains(&addon.hub_address),
        "the template's variables were not substituted: {:?}",
        command.argv
    );
    ensure!(
        command.argv.iter().any(|a| a == CERT_DIR),
        "the template's Deployment does not read the klusterlet's pair from {CERT_DIR}: {:?}",
        command.argv
    );
    command.set_flag("--ocm-addon-dir", &cert_dir.display().to_string())?;
    let ports = e2e::harness::free_ports(2)?;
    command.push_args(&[
        "--metrics-bind-address",
        &format!("127.0.0.1:{}", ports[0]),
        "--health-probe-bind-address",
        &format!("127.0.0.1:{}", ports[1]),
        "--status-interval",
        "1s",
    ]);
    let argv = command.env_argv(
        &e2e::binary("flower-agent")?,
        &[("KUBECONFIG", spoke_cluster.kubeconfig.display().to_string())],
    );
    let name = format!("agent-{cluster}");
    let log = cp.work_dir().join(format!("{name}.log"));
    cp.processes()
        .start(&name, std::path::Path::new("/usr/bin/env"), &argv, &log)
}

/// Waits until the hub refused CSR `name` (Denied or Failed, no certificate); its message.
async fn refused(hub: &Client, name: &str, what: &str) -> Result<String> {
    let csrs: Api<CertificateSigningRequest> = Api::all(hub.clone());
    let refusal = Wait::new(
        format!("the hub to refuse {what} a certificate"),
        Duration::from_secs(30),
    )
    .for_value(|| {
        let csrs = csrs.clone();
        async move {
            let csr = csrs.get(name).await?;
            let status = csr.status.unwrap_or_default();
            ensure!(
                status.certificate.is_none_or(|c| c.0.is_empty()),
                "a certificate was issued for CSR {name}"
            );
            Ok(status
                .conditions
                .unwrap_or_default()
                .into_iter()
                .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True"))
        }
    })
    .await?;
    Ok(refusal.message.unwrap_or_default())
}

/// A CSR with `cluster`'s labels and the addon's subject, as a klusterlet makes them.
fn forged_csr(cluster: &str) -> Result<CertificateSigningRequest> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        flower_addon_proto::OCM_ADDON_AGENT_CN,
    );
    let pem = params.serialize_request(&key)?.pem()?;
    let mut csr = CertificateSigningRequest {
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(pem.into_bytes()),
            signer_name: flower_addon_proto::OCM_ADDON_SIGNER.to_owned(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            ..Default::default()
        },
        ..Default::default()
    };
    csr.metadata.name = Some(format!("addon-{cluster}-flower-addon-forged"));
    csr.metadata.labels = Some(BTreeMap::from([
        (
            "open-cluster-management.io/cluster-name".to_owned(),
            cluster.to_owned(),
        ),
        (
            "open-cluster-management.io/addon-name".to_owned(),
            "flower-addon".to_owned(),
        ),
    ]));
    Ok(csr)
}

#[test]
fn the_addon_agents_rbac_is_the_agents() -> Result<()> {
    // The template carries a copy of manifests/agent/rbac.yaml's ClusterRole rules (an addon
    // agent does what a joined agent does): they must not drift apart.
    let root = e2e::repo_root().join("manifests");
    let rbac = e2e::apply::parse_yaml(&std::fs::read_to_string(root.join("agent/rbac.yaml"))?)?;
    let role = rbac
        .iter()
        .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "ClusterRole"))
        .context("agent ClusterRole")?;
    let template = e2e::apply::parse_yaml(&std::fs::read_to_string(
        root.join("ocm/addon-template.yaml"),
    )?)?;
    let manifests = template[0].data["spec"]["agentSpec"]["workload"]["manifests"]
        .as_array()
        .context("template manifests")?;
    let ocm_role = manifests
        .iter()
        .find(|m| m["kind"] == "ClusterRole")
        .context("template ClusterRole")?;
    ensure!(
        ocm_role["rules"] == role.data["rules"],
        "manifests/ocm/addon-template.yaml's ClusterRole rules differ from manifests/agent/rbac.yaml's"
    );
    Ok(())
}

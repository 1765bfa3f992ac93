//! The Helm chart `manifests/chart/flower-addon`, with a real `helm` built from its Go
//! module (`e2e/helm/build.sh`, path in `FLOWER_ADDON_HELM`; test.sh sets it):
//! - `helm lint` passes for the hub side, the agent side and with the ServiceMonitor;
//! - the plain manifests in `manifests/hub/`, `manifests/agent/` and `manifests/ocm/` are `helm
//!   template` of the chart with the default values (agent: `hub.enabled=false,agent.enabled=true`;
//!   ocm: `hub.enabled=false,ocm.enabled=true` with placeholders), so they cannot drift (`FLOWER_ADDON_BLESS=1` rewrites them);
//! - on real apiservers: `helm install` of the hub side into the hub cluster and of the agent side
//!   (with its bootstrap Secret) into a spoke, `helm upgrade` with changed values, and
//!   `helm uninstall` leaving nothing of the chart behind but the CRDs.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::ListParams;

const HUB_NS: &str = "flower-addon-system";
const AGENT_NS: &str = "flower-addon-agent";
const AGENT_VALUES: &[&str] = &["--set", "hub.enabled=false", "--set", "agent.enabled=true"];
/// The OCM addon side (`manifests/ocm/`), with placeholders an admin replaces.
const OCM_VALUES: &[&str] = &[
    "--set",
    "hub.enabled=false",
    "--set",
    "ocm.enabled=true",
    "--set",
    "ocm.hubAddress=hub.example.com:30443",
    "--set",
    "ocm.caHash=sha256:0000000000000000000000000000000000000000000000000000000000000000",
];
const GENERATED: &str = "# GENERATED from manifests/chart/flower-addon by `helm template` with the default values; do\n# not edit: change the chart, then run `FLOWER_ADDON_BLESS=1 cargo test -p e2e --test helm_chart`.\n";

fn chart() -> PathBuf {
    e2e::helm::chart()
}

fn run_helm(kubeconfig: Option<&Path>, args: &[&str]) -> Result<String> {
    e2e::helm::run(kubeconfig, args)
}

/// `helm template` output grouped by template file name (`rbac.yaml`, …), each the file's
/// documents joined as one YAML stream under [`GENERATED`].
fn rendered(namespace: &str, extra: &[&str]) -> Result<BTreeMap<String, String>> {
    let chart = chart();
    let chart = chart.to_str().context("chart path")?;
    let mut args = vec!["template", "flower-addon", chart, "--namespace", namespace];
    args.extend_from_slice(extra);
    let text = run_helm(None, &args)?;
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for doc in text.split("---\n").filter(|d| !d.trim().is_empty()) {
        let (source, body) = doc
            .split_once('\n')
            .with_context(|| format!("a document without a Source line: {doc}"))?;
        let source = source
            .strip_prefix("# Source: ")
            .with_context(|| format!("not a Source line: {source}"))?;
        let name = Path::new(source)
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("source {source}"))?;
        files
            .entry(name.to_owned())
            .or_default()
            .push(body.to_owned());
    }
    Ok(files
        .into_iter()
        .map(|(name, docs)| (name, format!("{GENERATED}{}", docs.join("---\n"))))
        .collect())
}

#[test]
fn the_chart_lints_and_the_plain_manifests_are_its_defaults() -> Result<()> {
    // Invariant: what `kubectl apply -f manifests/…` installs is what `helm install` installs with
    // the default values, and the chart lints for every side.
    let chart = chart();
    let chart_s = chart.to_str().context("chart path")?;
    for extra in [
        &[][..],
        AGENT_VALUES,
        OCM_VALUES,
        &[
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "agent.enabled=true",
        ][..],
    ] {
        let mut args = vec!["lint", "--strict", chart_s];
        args.extend_from_slice(extra);
        run_helm(None, &args)?;
    }
    let bless = std::env::var("FLOWER_ADDON_BLESS").is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    for (dir, namespace, extra) in [
        ("hub", HUB_NS, &[][..]),
        ("agent", AGENT_NS, AGENT_VALUES),
        ("ocm", HUB_NS, OCM_VALUES),
    ] {
        let dir = e2e::repo_root().join("manifests").join(dir);
        for (name, want) in rendered(namespace, extra)? {
            let path = dir.join(&name);
            if bless {
                std::fs::write(&path, &want)?;
            } else if std::fs::read_to_string(&path).ok().as_deref() != Some(want.as_str()) {
                stale.push(path.display().to_string());
            }
        }
    }
    ensure!(
        stale.is_empty(),
        "the plain manifests drifted from the chart: {stale:?}; regenerate with `FLOWER_ADDON_BLESS=1 cargo test -p e2e --test helm_chart` (and review the diff)"
    );
    // Optional parts render when asked for, and bad values are refused with the fix.
    let monitored = rendered(HUB_NS, &["--set", "metrics.serviceMonitor.enabled=true"])?;
    let monitor = monitored
        .get("servicemonitor.yaml")
        .context("no ServiceMonitor rendered")?;
    ensure!(
        monitor.contains("kind: ServiceMonitor") && monitor.contains("name: flower-hub-metrics"),
        "{monitor}"
    );
    let mut args = vec!["template", "x", chart_s];
    args.extend_from_slice(AGENT_VALUES);
    args.extend_from_slice(&["--set", "agent.bootstrap.create=true"]);
    let error = run_helm(None, &args).expect_err("a bootstrap Secret without a token");
    ensure!(
        format!("{error:#}").contains("agent.bootstrap.token is required"),
        "{error:#}"
    );
    // The OCM side needs where the hub is.
    let mut args = vec!["template", "x", chart_s, "--set", "ocm.enabled=true"];
    args.extend_from_slice(&["--set", "ocm.caHash=sha256:00"]);
    let error = run_helm(None, &args).expect_err("the OCM addon without the hub's address");
    ensure!(
        format!("{error:#}").contains("ocm.hubAddress is required"),
        "{error:#}"
    );
    Ok(())
}

/// Names of the objects `api` lists that look like ours (contain "flower").
async fn ours_left<K>(kind: &str, api: Api<K>) -> Result<Vec<String>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|o| o.meta().name.clone())
        .filter(|n| n.contains("flower"))
        .map(|n| format!("{kind}/{n}"))
        .collect())
}

/// Our CustomResourceDefinitions among `list`.
fn our_crds(list: Vec<CustomResourceDefinition>) -> usize {
    list.into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n.ends_with(".flower-addon.io"))
        .count()
}

/// The first container's args of a Deployment.
fn container_args(d: &Deployment) -> Vec<String> {
    d.spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.containers.first())
        .and_then(|c| c.args.clone())
        .unwrap_or_default()
}

/// Installs the agent release into the spoke and checks its bootstrap Secret and Deployment,
/// and that it brought no hub parts (no hub Deployment, no CRDs).
async fn install_agent_side(spoke_kc: &Path, spoke_client: &kube::Client) -> Result<()> {
    e2e::helm::install_agent(
        spoke_kc,
        &[
            ("token", "abcdef.0123456789abcdef"),
            ("hub", "198.18.0.1:30443"),
            ("caHash", "sha256:00"),
            ("clusterName", "spoke-1"),
        ],
    )?;
    let secret = Api::<Secret>::namespaced(spoke_client.clone(), AGENT_NS)
        .get("flower-agent-bootstrap")
        .await?;
    let value = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
    };
    ensure!(
        value("clusterName").as_deref() == Some("spoke-1")
            && value("hub").as_deref() == Some("198.18.0.1:30443"),
        "bootstrap Secret {:?}",
        secret.data
    );
    Api::<Deployment>::namespaced(spoke_client.clone(), AGENT_NS)
        .get("flower-agent")
        .await?;
    ensure!(
        Api::<Deployment>::namespaced(spoke_client.clone(), AGENT_NS)
            .get_opt("flower-hub")
            .await?
            .is_none()
            && our_crds(
                Api::<CustomResourceDefinition>::all(spoke_client.clone())
                    .list(&ListParams::default())
                    .await?
                    .items
            ) == 0,
        "the agent release installed hub parts"
    );
    Ok(())
}

/// Our objects of every kind the chart installs still present in `clusters` (client, namespace).
async fn left_behind(clusters: &[(&kube::Client, &str)]) -> Result<Vec<String>> {
    let mut left = Vec::new();
    for &(client, ns) in clusters {
        let c = || client.clone();
        left.extend(ours_left("Deployment", Api::<Deployment>::namespaced(c(), ns)).await?);
        left.extend(ours_left("Service", Api::<Service>::namespaced(c(), ns)).await?);
        left.extend(ours_left("ServiceAccount", Api::<ServiceAccount>::namespaced(c(), ns)).await?);
        left.extend(ours_left("Secret", Api::<Secret>::namespaced(c(), ns)).await?);
        left.extend(ours_left("Role", Api::<Role>::namespaced(c(), ns)).await?);
        left.extend(ours_left("RoleBinding", Api::<RoleBinding>::namespaced(c(), ns)).await?);
        left.extend(ours_left("ClusterRole", Api::<ClusterRole>::all(c())).await?);
        left.extend(ours_left("ClusterRoleBinding", Api::<ClusterRoleBinding>::all(c())).await?);
    }
    Ok(left)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_upgrades_and_uninstalls_both_sides() -> Result<()> {
    // Invariant: the chart installs the hub into a hub cluster and the agent into a spoke on real
    // apiservers, an upgrade changes what the values say, and uninstall leaves only the CRDs.
    e2e::install_crypto();
    let cp = e2e::ControlPlane::start(&["hub", "spoke-1"])
        .await
        .context("control plane (run e2e/k8s/build.sh if binaries are missing)")?;
    let hub = cp.cluster("hub")?;
    let spoke = cp.cluster("spoke-1")?;
    let chart = chart();
    let chart = chart.to_str().context("chart path")?;
    let (hub_kc, spoke_kc) = (hub.kubeconfig.as_path(), spoke.kubeconfig.as_path());

    run_helm(
        Some(hub_kc),
        &[
            "install",
            "flower-addon",
            chart,
            "--namespace",
            HUB_NS,
            "--create-namespace",
        ],
    )?;
    let hub_client = hub.client.clone();
    let crds = Api::<CustomResourceDefinition>::all(hub_client.clone());
    ensure!(
        our_crds(crds.list(&ListParams::default()).await?.items) == flower_addon_crds::crds().len(),
        "CRDs not installed"
    );
    let deployments = Api::<Deployment>::namespaced(hub_client.clone(), HUB_NS);
    let d = deployments.get("flower-hub").await?;
    ensure!(
        container_args(&d).contains(&"--leader-elect".to_owned()),
        "hub args {:?}",
        container_args(&d)
    );
    Api::<Service>::namespaced(hub_client.clone(), HUB_NS)
        .get("flower-hub")
        .await?;
    Api::<ServiceAccount>::namespaced(hub_client.clone(), HUB_NS)
        .get("flower-hub")
        .await?;
    Api::<ClusterRole>::all(hub_client.clone())
        .get("flower-addon:hub")
        .await?;
    Api::<ClusterRole>::all(hub_client.clone())
        .get("flower-addon-federation-viewer")
        .await?;

    // The agent side into the spoke, with its bootstrap Secret from values.
    let spoke_client = spoke.client.clone();
    install_agent_side(spoke_kc, &spoke_client).await?;

    // Upgrade with changed values: two replicas, JSON logs, auto-accept.
    run_helm(
        Some(hub_kc),
        &[
            "upgrade",
            "flower-addon",
            chart,
            "--namespace",
            HUB_NS,
            "--reuse-values",
            "--set",
            "hub.replicas=2",
            "--set",
            "logFormat=json",
            "--set",
            "hub.autoAccept.env=prod",
        ],
    )?;
    let d = deployments.get("flower-hub").await?;
    let upgraded = container_args(&d);
    ensure!(
        d.spec.replicas == Some(2)
            && upgraded.contains(&"--log-format=json".to_owned())
            && upgraded.contains(&"--auto-accept=env=prod".to_owned()),
        "after the upgrade: replicas {:?}, args {upgraded:?}",
        d.spec.replicas
    );
    let history = run_helm(
        Some(hub_kc),
        &["history", "flower-addon", "--namespace", HUB_NS],
    )?;
    ensure!(history.lines().count() == 3, "helm history:\n{history}");

    // Uninstall: nothing of either release is left but the CRDs.
    run_helm(
        Some(hub_kc),
        &["uninstall", "flower-addon", "--namespace", HUB_NS, "--wait"],
    )?;
    run_helm(
        Some(spoke_kc),
        &[
            "uninstall",
            "flower-addon-agent",
            "--namespace",
            AGENT_NS,
            "--wait",
        ],
    )?;
    let left = left_behind(&[(&hub_client, HUB_NS), (&spoke_client, AGENT_NS)]).await?;
    ensure!(
        left.is_empty(),
        "left behind after helm uninstall: {left:?}"
    );
    ensure!(
        our_crds(crds.list(&ListParams::default()).await?.items) == flower_addon_crds::crds().len(),
        "helm uninstall removed the CRDs (Helm keeps them: Federations would be lost)"
    );
    eprintln!(
        "helm_chart: install (hub, agent), upgrade (replicas 2, json logs, auto-accept), uninstall: only the CRDs left"
    );
    Ok(())
}

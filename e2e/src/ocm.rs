//! Open Cluster Management's own controllers and agents, built from its Go module by
//! `e2e/ocm/build.sh` (v1.2.0), run as processes against the test control plane's apiservers.
//!
//! [`OcmHub::start`] installs OCM's CRDs on the hub (from `open-cluster-management.io/api` of the
//! same version, the `addon` v1alpha1 files: their v1beta1 siblings need the hub's conversion
//! webhook), the bootstrap ClusterRole of OCM's cluster-manager chart with its ServiceAccount, and
//! starts the hub controllers: `registration controller`, `placement controller`, `work manager`
//! and `addon manager`. [`OcmHub::join`] joins a spoke the way `clusteradm join` + `accept` do:
//! the klusterlet agent (`registration-operator agent`, singleton mode: registration and work in
//! one process) starts on the spoke with a bootstrap kubeconfig holding the bootstrap
//! ServiceAccount's token, creates its `ManagedCluster` and a CSR; the harness approves the CSR
//! (kube-controller-manager signs it with the control plane's client CA) and sets
//! `hubAcceptsClient`, and waits until OCM reports the cluster joined and available.
//!
//! A missing binary or module fails loudly, naming the script that makes it.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};

use crate::cluster::Cluster;
use crate::harness::{Processes, free_ports, wait_until};

/// The OCM release the binaries and CRDs are of (`e2e/ocm/wrapper/go.mod` requires it).
pub const VERSION: &str = "v1.2.0";
/// Namespace of the OCM hub controllers (their events and leases).
pub const HUB_NAMESPACE: &str = "open-cluster-management-hub";
/// Namespace of the bootstrap ServiceAccount (what OCM's cluster-manager chart uses).
pub const BOOTSTRAP_NAMESPACE: &str = "open-cluster-management";
/// Name of the bootstrap ServiceAccount.
pub const BOOTSTRAP_SERVICE_ACCOUNT: &str = "agent-registration-bootstrap";
/// Namespace of the klusterlet agent on a spoke (where it keeps its hub kubeconfig Secret).
pub const AGENT_NAMESPACE: &str = "open-cluster-management-agent";
/// Label OCM puts on an agent's CSRs: the cluster it is for.
pub const CSR_CLUSTER_LABEL: &str = "open-cluster-management.io/cluster-name";

/// The directory of the OCM binaries: `FLOWER_ADDON_OCM_BIN`, or what `e2e/ocm/build.sh` builds
/// (instant once cached).
pub fn bin_dir() -> Result<PathBuf> {
    let dir = crate::harness::built_by("FLOWER_ADDON_OCM_BIN", "e2e/ocm/build.sh")?;
    for bin in [
        "registration",
        "placement",
        "work",
        "addon",
        "registration-operator",
    ] {
        ensure!(
            dir.join(bin).is_file(),
            "OCM's {bin} is not in {}: run e2e/ocm/build.sh",
            dir.display()
        );
    }
    Ok(dir)
}

/// What `e2e/ocm/build.sh` copied beside the binaries from OCM's Go modules at [`VERSION`]
/// (`modules/api`: the CRDs of `open-cluster-management.io/api`; `modules/ocm`: the templates of
/// OCM's cluster-manager chart), so that no Go cache is needed to run the tests.
fn module_files(module: &str) -> Result<PathBuf> {
    let bin = bin_dir()?;
    let dir = bin
        .parent()
        .context("the OCM binary directory has no parent")?
        .join("modules")
        .join(module);
    ensure!(
        dir.is_dir(),
        "OCM's {module} files are not at {}: run e2e/ocm/build.sh (it copies them there)",
        dir.display()
    );
    Ok(dir)
}

/// The CRDs of the module `open-cluster-management.io/api`, by their paths in the module.
pub fn api_module() -> Result<PathBuf> {
    module_files("api")
}

/// OCM's CRDs a hub needs: clusters, sets and bindings, placements and decisions, add-on
/// placement scores, ManifestWorks (and their replica sets), and the add-on API (v1alpha1).
pub fn hub_crd_files() -> Result<Vec<PathBuf>> {
    let api = api_module()?;
    Ok([
        "cluster/v1/0000_00_clusters.open-cluster-management.io_managedclusters.crd.yaml",
        "cluster/v1beta2/0000_00_clusters.open-cluster-management.io_managedclustersets.crd.yaml",
        "cluster/v1beta2/0000_01_clusters.open-cluster-management.io_managedclustersetbindings.crd.yaml",
        "cluster/v1beta1/0000_02_clusters.open-cluster-management.io_placements.crd.yaml",
        "cluster/v1beta1/0000_03_clusters.open-cluster-management.io_placementdecisions.crd.yaml",
        "cluster/v1alpha1/0000_05_clusters.open-cluster-management.io_addonplacementscores.crd.yaml",
        "work/v1/0000_00_work.open-cluster-management.io_manifestworks.crd.yaml",
        "work/v1alpha1/0000_00_work.open-cluster-management.io_manifestworkreplicasets.crd.yaml",
        "addon/v1alpha1/0000_00_addon.open-cluster-management.io_clustermanagementaddons.crd.yaml",
        "addon/v1alpha1/0000_01_addon.open-cluster-management.io_managedclusteraddons.crd.yaml",
        "addon/v1alpha1/0000_02_addon.open-cluster-management.io_addondeploymentconfigs.crd.yaml",
        "addon/v1alpha1/0000_03_addon.open-cluster-management.io_addontemplates.crd.yaml",
    ]
    .iter()
    .map(|f| api.join(f))
    .collect())
}

/// OCM's CRDs a spoke needs: ClusterClaims and AppliedManifestWorks.
pub fn spoke_crd_files() -> Result<Vec<PathBuf>> {
    let api = api_module()?;
    Ok([
        "cluster/v1alpha1/0000_02_clusters.open-cluster-management.io_clusterclaims.crd.yaml",
        "work/v1/0000_01_work.open-cluster-management.io_appliedmanifestworks.crd.yaml",
    ]
    .iter()
    .map(|f| api.join(f))
    .collect())
}

/// Applies CRD files and waits until each is Established.
pub async fn install_crds(client: &Client, files: &[PathBuf]) -> Result<()> {
    let mut names = Vec::new();
    for file in files {
        for obj in crate::apply::apply_file(client, file, "").await? {
            names.push(obj.name_any());
        }
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in names {
        let crds = crds.clone();
        wait_until(
            &format!("CRD {name} Established"),
            Duration::from_secs(30),
            || {
                let (crds, name) = (crds.clone(), name.clone());
                async move {
                    let conditions = crds
                        .get(&name)
                        .await?
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default();
                    Ok(conditions
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True"))
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// The `ManagedCluster` kind of OCM (`cluster.open-cluster-management.io/v1`).
pub fn managed_cluster_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cluster.open-cluster-management.io",
        "v1",
        "ManagedCluster",
    ))
}

/// The hub side of OCM: its controllers running against `hub`'s apiserver.
pub struct OcmHub {
    hub: Cluster,
    dir: PathBuf,
    bins: PathBuf,
    procs: Processes,
    bootstrap_kubeconfig: PathBuf,
    /// How each running hub controller was started: name, arguments.
    controllers: Vec<(String, Vec<String>)>,
}

impl OcmHub {
    /// Installs OCM's hub CRDs and bootstrap RBAC on `hub` and starts its hub controllers, logging
    /// to `dir`. The controllers run with the hub's admin kubeconfig (in a real hub each has a
    /// ServiceAccount of the cluster-manager).
    pub async fn start(hub: &Cluster, dir: &Path) -> Result<Self> {
        Self::start_with(hub, dir, &["registration", "placement", "work", "addon"]).await
    }

    /// [`OcmHub::start`] with only the named hub controllers (`registration`, `placement`,
    /// `work`, `addon`): the placement controller alone decides on `ManagedCluster`s exactly as
    /// written, without the registration controller's availability taints for clusters that
    /// have no agent.
    pub async fn start_with(hub: &Cluster, dir: &Path, components: &[&str]) -> Result<Self> {
        let t = Instant::now();
        let bins = bin_dir()?;
        std::fs::create_dir_all(dir)?;
        let client = hub.client.clone();
        install_crds(&client, &hub_crd_files()?).await?;
        for ns in [HUB_NAMESPACE, BOOTSTRAP_NAMESPACE] {
            ensure_namespace(&client, ns).await?;
        }
        let bootstrap_kubeconfig = install_bootstrap(hub, dir).await?;
        let mut procs = Processes::default();
        let mut controllers = Vec::new();
        let ports = free_ports(4)?;
        let kubeconfig = hub.kubeconfig.display().to_string();
        for ((name, bin, sub), port) in [
            ("registration", "registration", "controller"),
            ("placement", "placement", "controller"),
            ("work", "work", "manager"),
            ("addon", "addon", "manager"),
        ]
        .into_iter()
        .filter(|(name, _, _)| components.contains(name))
        .zip(ports)
        {
            let args = vec![
                sub.to_owned(),
                format!("--kubeconfig={kubeconfig}"),
                format!("--namespace={HUB_NAMESPACE}"),
                "--disable-leader-election".to_owned(),
                format!("--listen=127.0.0.1:{port}"),
            ];
            procs.start(
                &format!("ocm-{name}"),
                &bins.join(bin),
                &args,
                &dir.join(format!("ocm-{name}.log")),
            )?;
            controllers.push((
                name.to_owned(),
                std::iter::once(bin.to_owned()).chain(args).collect(),
            ));
        }
        eprintln!(
            "e2e: OCM {VERSION} hub controllers {components:?} started on {} ({:.1}s)",
            hub.name,
            t.elapsed().as_secs_f64()
        );
        Ok(Self {
            hub: hub.clone(),
            dir: dir.to_owned(),
            bins,
            procs,
            bootstrap_kubeconfig,
            controllers,
        })
    }

    /// Stops every OCM hub controller (an outage of OCM's hub; the apiserver stays up).
    pub fn stop_hub_controllers(&mut self) -> Result<()> {
        for (name, _) in &self.controllers {
            self.procs.stop(&format!("ocm-{name}"))?;
        }
        Ok(())
    }

    /// Starts the hub controllers [`OcmHub::stop_hub_controllers`] stopped, as they ran before.
    pub fn start_hub_controllers(&mut self) -> Result<()> {
        for (name, argv) in &self.controllers {
            self.procs.start(
                &format!("ocm-{name}"),
                &self.bins.join(&argv[0]),
                &argv[1..],
                &self.dir.join(format!("ocm-{name}.log")),
            )?;
        }
        Ok(())
    }

    /// The hub kubeconfig the klusterlet of cluster `name` holds (its identity on the hub, as
    /// OCM's registration issued it).
    pub fn klusterlet_hub_kubeconfig(&self, name: &str) -> PathBuf {
        self.dir
            .join(format!("klusterlet-{name}"))
            .join("hub-kubeconfig")
            .join("kubeconfig")
    }

    /// The processes (hub controllers and klusterlet agents), to stop or restart one.
    pub fn processes(&mut self) -> &mut Processes {
        &mut self.procs
    }

    /// Joins `spoke` to the OCM hub as cluster `name`: its CRDs and agent namespace, the
    /// klusterlet agent (singleton) with the bootstrap kubeconfig, then what `clusteradm accept`
    /// does (approve the CSR, set `hubAcceptsClient`), until `ManagedCluster` `name` is Joined and
    /// Available.
    pub async fn join(&mut self, spoke: &Cluster, name: &str) -> Result<Duration> {
        let t = Instant::now();
        install_crds(&spoke.client, &spoke_crd_files()?).await?;
        ensure_namespace(&spoke.client, AGENT_NAMESPACE).await?;
        let agent_dir = self.dir.join(format!("klusterlet-{name}"));
        let hub_kubeconfig_dir = agent_dir.join("hub-kubeconfig");
        std::fs::create_dir_all(&hub_kubeconfig_dir)?;
        let port = free_ports(1)?[0];
        let spoke_kubeconfig = spoke.kubeconfig.display().to_string();
        let args = vec![
            "agent".to_owned(),
            format!("--spoke-cluster-name={name}"),
            format!("--agent-id={name}"),
            format!(
                "--bootstrap-kubeconfig={}",
                self.bootstrap_kubeconfig.display()
            ),
            format!("--hub-kubeconfig-dir={}", hub_kubeconfig_dir.display()),
            format!(
                "--workload-source-config={}",
                hub_kubeconfig_dir.join("kubeconfig").display()
            ),
            format!("--kubeconfig={spoke_kubeconfig}"),
            format!("--spoke-kubeconfig={spoke_kubeconfig}"),
            format!("--namespace={AGENT_NAMESPACE}"),
            "--disable-leader-election".to_owned(),
            format!("--listen=127.0.0.1:{port}"),
        ];
        self.procs.start(
            &format!("klusterlet-{name}"),
            &self.bins.join("registration-operator"),
            &args,
            &self.dir.join(format!("klusterlet-{name}.log")),
        )?;
        let log = self.dir.join(format!("klusterlet-{name}.log"));
        let log_tail = || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(20)..].join("\n")
        };
        let csrs: Api<CertificateSigningRequest> = Api::all(self.hub.client.clone());
        let selector = format!("{CSR_CLUSTER_LABEL}={name}");
        let clusters: Api<DynamicObject> =
            Api::all_with(self.hub.client.clone(), &managed_cluster_resource());
        // Once the klusterlet has created its ManagedCluster, approve its bootstrap CSRs (a
        // klusterlet that saw no certificate in time asks again with a new CSR, which the waits
        // below approve too). Approving before the ManagedCluster exists can end the
        // klusterlet's bootstrap before it created it, and it then never does (seen here): as
        // `clusteradm accept`, which waits for the cluster to show up.
        crate::harness::Wait::new(
            format!(
                "the klusterlet of {name} to ask for a certificate and create ManagedCluster {name}"
            ),
            Duration::from_secs(120),
        )
        .detail(log_tail)
        .until(|| {
            let (csrs, selector, clusters) = (csrs.clone(), selector.clone(), clusters.clone());
            async move {
                if clusters.get_opt(name).await?.is_none() {
                    return Ok(false);
                }
                approve_pending(&csrs, &selector).await
            }
        })
        .await?;
        clusters
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"hubAcceptsClient": true}})),
            )
            .await
            .with_context(|| format!("accept ManagedCluster {name}"))?;
        crate::harness::Wait::new(
            format!("ManagedCluster {name} Joined and Available"),
            Duration::from_secs(120),
        )
        .detail(log_tail)
        .until(|| {
            let (csrs, selector, clusters) = (csrs.clone(), selector.clone(), clusters.clone());
            async move {
                approve_pending(&csrs, &selector).await?;
                let mc = clusters.get(name).await?;
                let conditions = conditions(&mc);
                Ok(
                    conditions.get("ManagedClusterJoined").map(String::as_str) == Some("True")
                        && conditions
                            .get("ManagedClusterConditionAvailable")
                            .map(String::as_str)
                            == Some("True"),
                )
            }
        })
        .await?;
        let took = t.elapsed();
        eprintln!(
            "e2e: {} joined the OCM hub as {name} (klusterlet, CSR approved, accepted) in {:.1}s",
            spoke.name,
            took.as_secs_f64()
        );
        Ok(took)
    }
}

/// Sets (`Some`) or removes (`None`) label `key` on OCM's `ManagedCluster` `cluster`.
pub async fn label_cluster(
    client: &kube::Client,
    cluster: &str,
    key: &str,
    value: Option<&str>,
) -> Result<()> {
    let clusters: Api<DynamicObject> = Api::all_with(client.clone(), &managed_cluster_resource());
    clusters
        .patch(
            cluster,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {key: value}}})),
        )
        .await
        .with_context(|| format!("label OCM's ManagedCluster {cluster}"))?;
    Ok(())
}

/// Namespace `namespace` (created if missing), a binding of OCM's `global` cluster set into it and
/// an OCM Placement `name` there selecting clusters labelled `key=value`: what an OCM user writes
/// to place by label.
pub async fn place_by_label(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    key: &str,
    value: &str,
) -> Result<()> {
    crate::apply_yaml(
        client,
        &format!(
            r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {namespace}}}
---
apiVersion: cluster.open-cluster-management.io/v1beta2
kind: ManagedClusterSetBinding
metadata: {{name: global, namespace: {namespace}}}
spec: {{clusterSet: global}}
---
apiVersion: cluster.open-cluster-management.io/v1beta1
kind: Placement
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  predicates:
    - requiredClusterSelector:
        labelSelector:
          matchLabels: {{{key}: "{value}"}}
"#
        ),
        namespace,
    )
    .await
    .with_context(|| format!("OCM Placement {namespace}/{name}"))?;
    Ok(())
}

/// `type → status` of an OCM object's `status.conditions`.
pub fn conditions(obj: &DynamicObject) -> BTreeMap<String, String> {
    obj.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some((
                c["type"].as_str()?.to_owned(),
                c["status"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

async fn ensure_namespace(client: &Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    if api.get_opt(name).await?.is_none() {
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
        api.create(&PostParams::default(), &ns).await?;
    }
    Ok(())
}

/// OCM's bootstrap ClusterRole (from its cluster-manager chart in the module, the Helm
/// conditionals dropped), the bootstrap ServiceAccount bound to it, and a kubeconfig with a token
/// of that ServiceAccount: what `clusteradm init` hands to `clusteradm join`.
async fn install_bootstrap(hub: &Cluster, dir: &Path) -> Result<PathBuf> {
    let client = hub.client.clone();
    let chart = ocm_module()?.join("deploy/cluster-manager/chart/cluster-manager/templates");
    for file in [
        "bootstrap_cluster_role.yaml",
        "bootstrap_sa_cluster_role_binding.yaml",
    ] {
        let path = chart.join(file);
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        let yaml: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("{{"))
            .map(|l| l.replace("{{ .Release.Namespace }}", BOOTSTRAP_NAMESPACE) + "\n")
            .collect();
        ensure!(
            !yaml.contains("{{"),
            "{} has templating left",
            path.display()
        );
        crate::apply::apply_yaml(&client, &yaml, BOOTSTRAP_NAMESPACE)
            .await
            .with_context(|| format!("apply {}", path.display()))?;
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), BOOTSTRAP_NAMESPACE);
    if accounts.get_opt(BOOTSTRAP_SERVICE_ACCOUNT).await?.is_none() {
        let sa: ServiceAccount = serde_json::from_value(
            serde_json::json!({"metadata": {"name": BOOTSTRAP_SERVICE_ACCOUNT}}),
        )?;
        accounts.create(&PostParams::default(), &sa).await?;
    }
    let request = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 86400},
    });
    let answer: serde_json::Value = accounts
        .create_subresource(
            "token",
            BOOTSTRAP_SERVICE_ACCOUNT,
            &PostParams::default(),
            &request,
        )
        .await
        .context("a token of the bootstrap ServiceAccount")?;
    let token = answer["status"]["token"]
        .as_str()
        .context("TokenRequest without status.token")?;
    let path = dir.join("bootstrap.kubeconfig");
    crate::kubeconfig::write(
        &path,
        &hub.name,
        &hub.server,
        &hub.ca_file,
        BOOTSTRAP_SERVICE_ACCOUNT,
        token,
    )?;
    Ok(path)
}

/// The module `open-cluster-management.io/ocm` at [`VERSION`] (its cluster-manager chart).
pub fn ocm_module() -> Result<PathBuf> {
    module_files("ocm")
}

/// Approves every bootstrap CSR (signer `kubernetes.io/kube-apiserver-client`) matching
/// `selector` that has no condition yet; whether one of them is approved now.
async fn approve_pending(csrs: &Api<CertificateSigningRequest>, selector: &str) -> Result<bool> {
    let list = csrs.list(&ListParams::default().labels(selector)).await?;
    let mut approved = false;
    for csr in list
        .items
        .iter()
        .filter(|c| c.spec.signer_name == "kubernetes.io/kube-apiserver-client")
    {
        let conditions = csr
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        if conditions.is_empty() {
            approve(csrs, &csr.name_any()).await?;
            approved = true;
        } else if conditions.iter().any(|c| c.type_ == "Approved") {
            approved = true;
        }
    }
    Ok(approved)
}

/// Approves a CSR (what `clusteradm accept` does).
async fn approve(csrs: &Api<CertificateSigningRequest>, name: &str) -> Result<()> {
    let mut csr = csrs.get(name).await?;
    let status = csr.status.get_or_insert_with(Default::default);
    status
        .conditions
        .get_or_insert_with(Vec::new)
        .push(serde_json::from_value(serde_json::json!({
            "type": "Approved",
            "status": "True",
            "reason": "E2eAccept",
            "message": "approved by the e2e harness, as clusteradm accept does",
        }))?);
    csrs.replace_subresource("approval", name, &PostParams::default(), &csr)
        .await
        .with_context(|| format!("approve CSR {name}"))?;
    Ok(())
}

/// Every StatefulSet, DaemonSet, Secret and Service of ours in `namespace` (`Kind/name`), with
/// its owners (`Kind/name/uid`).
pub async fn objects_of_ours(
    client: &Client,
    namespace: &str,
) -> Result<Vec<(String, Vec<String>)>> {
    use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
    use k8s_openapi::api::core::v1::{Secret, Service};
    use kube::core::ObjectMeta;
    let params = ListParams::default().labels(&format!(
        "app.kubernetes.io/managed-by={}",
        flower_addon_crds::render::MANAGED_BY
    ));
    let describe = |kind: &str, m: &ObjectMeta| {
        let owners = m
            .owner_references
            .iter()
            .flatten()
            .map(|o| format!("{}/{}/{}", o.kind, o.name, o.uid))
            .collect();
        (
            format!("{kind}/{}", m.name.as_deref().unwrap_or("")),
            owners,
        )
    };
    let mut out = Vec::new();
    for s in Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .list(&params)
        .await?
    {
        out.push(describe("StatefulSet", &s.metadata));
    }
    for d in Api::<DaemonSet>::namespaced(client.clone(), namespace)
        .list(&params)
        .await?
    {
        out.push(describe("DaemonSet", &d.metadata));
    }
    for s in Api::<Secret>::namespaced(client.clone(), namespace)
        .list(&params)
        .await?
    {
        out.push(describe("Secret", &s.metadata));
    }
    for s in Api::<Service>::namespaced(client.clone(), namespace)
        .list(&params)
        .await?
    {
        out.push(describe("Service", &s.metadata));
    }
    Ok(out)
}

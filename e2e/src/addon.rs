//! Installing flower-addon into a running [`ControlPlane`] the way the README tells an admin:
//! CRDs and `manifests/hub` in the hub cluster, `flower-hub` started with the hub Deployment's
//! command line under its ServiceAccount, a bootstrap Secret per spoke (printed by
//! `flower-hub token create -o secret`, or the template filled in by hand), `manifests/agent` and
//! `flower-agent` with the agent Deployment's command line under its ServiceAccount, and
//! `flower-hub accept`. Used by the multi-cluster tests and by `e2e up --with-addon`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, PostParams};

use crate::harness::{binary, fatal, free_port};
use crate::{ContainerCommand, ControlPlane, SaAccess};

/// Namespace of the hub (`manifests/hub`).
pub const HUB_NS: &str = "flower-addon-system";
/// Namespace of each agent (`manifests/agent`).
pub const AGENT_NS: &str = "flower-addon-agent";
/// Keys of the agent's credential Secret once it has joined.
pub const CREDENTIAL_KEYS: [&str; 4] = ["agent.json", "client.key", "client.crt", "ca.crt"];

/// How a spoke's bootstrap Secret is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bootstrap {
    /// `flower-hub token create --cluster-name NAME --label … -o secret`.
    Cli,
    /// `manifests/agent/bootstrap-secret.yaml` with the values of `token create -o json` filled in.
    Template,
}

/// One spoke to join.
#[derive(Clone, Debug)]
pub struct Spoke {
    /// Cluster name (also the control plane's cluster name).
    pub name: String,
    /// Labels the agent reports at join.
    pub labels: Vec<(String, String)>,
    /// How its bootstrap Secret is made.
    pub bootstrap: Bootstrap,
}

impl Spoke {
    /// Spoke `name` with `labels`, bootstrapped by `bootstrap`.
    pub fn new(name: &str, labels: &[(&str, &str)], bootstrap: Bootstrap) -> Self {
        Self {
            name: name.to_string(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            bootstrap,
        }
    }
}

/// Settings the tests shorten.
#[derive(Clone, Debug)]
pub struct AddonOptions {
    /// `flower-hub serve --lease-duration`.
    pub lease: String,
    /// `flower-agent run --status-interval`.
    pub status_interval: String,
    /// How long to wait for each step.
    pub wait: Duration,
}

impl Default for AddonOptions {
    fn default() -> Self {
        Self {
            lease: "5s".into(),
            status_interval: "1s".into(),
            wait: Duration::from_secs(30),
        }
    }
}

/// The installed addon: how to (re)start its daemons and reach the hub.
#[derive(Clone, Debug)]
pub struct Addon {
    /// `HOST:PORT` of the hub's work channel.
    pub hub_address: String,
    /// The hub cluster's admin kubeconfig (what an admin runs `flower-hub token …` with).
    pub admin_kubeconfig: PathBuf,
    /// How each daemon (`flower-hub`, `agent-<spoke>`) is started: `/usr/bin/env` arguments and
    /// log file.
    pub starts: BTreeMap<String, (Vec<String>, PathBuf)>,
    /// Time from the hub's start to every spoke's credentials stored.
    pub joined_in: Duration,
    /// Where each daemon serves `/metrics` and its probes (each gets free loopback ports).
    pub ops: BTreeMap<String, OpsAddresses>,
}

/// A daemon's `--metrics-bind-address` and `--health-probe-bind-address`.
#[derive(Clone, Copy, Debug)]
pub struct OpsAddresses {
    /// `/metrics`.
    pub metrics: std::net::SocketAddr,
    /// `/healthz` and `/readyz`.
    pub health: std::net::SocketAddr,
}

impl OpsAddresses {
    /// Two free loopback ports.
    fn free() -> Result<Self> {
        Ok(Self {
            metrics: ([127, 0, 0, 1], free_port()?).into(),
            health: ([127, 0, 0, 1], free_port()?).into(),
        })
    }

    /// The flags that put the endpoints here.
    fn args(&self) -> [String; 4] {
        [
            "--metrics-bind-address".into(),
            self.metrics.to_string(),
            "--health-probe-bind-address".into(),
            self.health.to_string(),
        ]
    }
}

/// The ManagedClusterSet `global` of every cluster (`labelSelector: {}`, like OCM's), and
/// its ManagedClusterSetBinding into `namespace`, as the platform admin would apply them: without
/// a binding a Placement in `namespace` selects nothing.
pub const EVERY_CLUSTER_SET: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: ManagedClusterSet
metadata: {name: global}
spec:
  clusterSelector: {selectorType: LabelSelector, labelSelector: {}}
---
apiVersion: flower-addon.io/v1alpha1
kind: ManagedClusterSetBinding
metadata: {name: global}
spec: {clusterSet: global}
"#;

/// Applies [`EVERY_CLUSTER_SET`] with its binding in `namespace` (as the admin).
pub async fn bind_every_cluster(client: &kube::Client, namespace: &str) -> Result<()> {
    crate::apply_yaml(client, EVERY_CLUSTER_SET, namespace)
        .await
        .with_context(|| format!("binding ManagedClusterSet global to namespace {namespace}"))?;
    Ok(())
}

/// A control plane with one cluster, `hub`, holding the CRDs, namespace `user_namespace` for the
/// user's objects and the hub's least-privilege ServiceAccount from `manifests/hub`: what the
/// hub's controllers act with when a test runs them in-process.
pub async fn start_hub_with_rbac(user_namespace: &str) -> Result<(ControlPlane, SaAccess)> {
    crate::install_crypto();
    let cp = ControlPlane::start(&["hub"])
        .await
        .context("control plane (run e2e/k8s/build.sh if binaries are missing)")?;
    let hub = cp.cluster("hub")?;
    crate::install_crds(&hub.client).await?;
    Api::<Namespace>::all(hub.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": user_namespace}}))?,
        )
        .await
        .with_context(|| format!("creating namespace {user_namespace}"))?;
    let manifests = crate::repo_root().join("manifests/hub");
    crate::apply_file(&hub.client, &manifests.join("namespace.yaml"), "default").await?;
    let hub_sa = crate::service_account_access(
        hub,
        &manifests.join("rbac.yaml"),
        HUB_NS,
        "flower-hub",
        3600,
    )
    .await?;
    Ok((cp, hub_sa))
}

/// Runs `flower-hub ARGS` against the hub cluster (`kubeconfig`), as an admin would; its stdout,
/// or an error with its stderr when it fails.
pub fn hub_cli(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let bin = binary("flower-hub")?;
    let out = std::process::Command::new(&bin)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("FLOWER_HUB_STATE_DIR")
        .env_remove("POD_NAMESPACE")
        .output()
        .with_context(|| format!("run {}", bin.display()))?;
    ensure!(
        out.status.success(),
        "flower-hub {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

impl Addon {
    /// Installs the hub into cluster `hub` and joins `spokes` (each a cluster of `cp`); returns
    /// once every agent has stored its credentials.
    pub async fn install(
        cp: &mut ControlPlane,
        spokes: &[Spoke],
        options: &AddonOptions,
    ) -> Result<Self> {
        let root = crate::repo_root();
        let (hub_bin, agent_bin) = (binary("flower-hub")?, binary("flower-agent")?);
        let hub = cp.cluster("hub")?.clone();
        crate::install_crds(&hub.client).await?;
        let manifests = root.join("manifests/hub");
        crate::apply_file(&hub.client, &manifests.join("namespace.yaml"), "default").await?;
        let hub_sa = crate::service_account_access(
            &hub,
            &manifests.join("rbac.yaml"),
            HUB_NS,
            "flower-hub",
            3600,
        )
        .await?;
        let hub_address = format!("127.0.0.1:{}", free_port()?);
        let work_dir = cp.work_dir().to_path_buf();
        let started = Instant::now();
        let mut addon = Self {
            hub_address: hub_address.clone(),
            admin_kubeconfig: hub.kubeconfig.clone(),
            starts: BTreeMap::new(),
            joined_in: Duration::ZERO,
            ops: BTreeMap::new(),
        };

        // The hub as manifests/hub/deployment.yaml runs it, on a free local port.
        let mut hub_command =
            ContainerCommand::from_manifest(&manifests.join("deployment.yaml"), "hub", HUB_NS)?;
        // The tests' placed Federations name `hub.example` as their external address: the
        // hub's admin allows it in SuperLink certificates (`kube_hub` step 5b is the refusal of a
        // name not allowed).
        hub_command.set_flag("--listen", &hub_address)?.push_args(&[
            "--advertise-address",
            "127.0.0.1",
            "--lease-duration",
            &options.lease,
            "--superlink-name",
            "hub.example",
        ]);
        let hub_ops = OpsAddresses::free()?;
        hub_command.push_args(&hub_ops.args().each_ref().map(String::as_str));
        addon.ops.insert("flower-hub".to_string(), hub_ops);
        // With a real node, spokes' pods reach the SuperLink's NodePort on that node's address
        // (the Deployment's status.hostIP), not on this host's loopback.
        let mut hub_env = vec![("KUBECONFIG", hub_sa.kubeconfig.display().to_string())];
        if let Some((_, ip)) = &hub.real_node {
            hub_env.push(("FLOWER_HUB_NODE_ADDRESS", ip.to_string()));
        }
        // A finer log filter for the hub than the manifest's `info` (e.g. to time a bench; keep
        // the log with FLOWER_ADDON_E2E_KEEP=1).
        if let Ok(filter) = std::env::var("FLOWER_ADDON_E2E_HUB_LOG") {
            hub_env.push(("RUST_LOG", filter));
        }
        addon.starts.insert(
            "flower-hub".to_string(),
            (
                hub_command.env_argv(&hub_bin, &hub_env),
                work_dir.join("flower-hub.log"),
            ),
        );
        addon.start(cp, "flower-hub")?;

        // Agents as manifests/agent/deployment.yaml runs them: they join from the bootstrap
        // Secret and keep their credentials in a Secret (no state directory).
        let agent_manifests = root.join("manifests/agent");
        for spoke in spokes {
            let bootstrap = addon.bootstrap_secret(spoke)?;
            let cluster = cp.cluster(&spoke.name)?.clone();
            crate::apply_file(
                &cluster.client,
                &agent_manifests.join("namespace.yaml"),
                "default",
            )
            .await?;
            let sa = crate::service_account_access(
                &cluster,
                &agent_manifests.join("rbac.yaml"),
                AGENT_NS,
                "flower-agent",
                3600,
            )
            .await?;
            crate::apply_yaml(&cluster.client, &bootstrap, AGENT_NS).await?;
            let mut command = ContainerCommand::from_manifest(
                &agent_manifests.join("deployment.yaml"),
                "agent",
                AGENT_NS,
            )?;
            command.push_args(&["--status-interval", &options.status_interval]);
            let name = format!("agent-{}", spoke.name);
            let ops = OpsAddresses::free()?;
            command.push_args(&ops.args().each_ref().map(String::as_str));
            addon.ops.insert(name.clone(), ops);
            addon.starts.insert(
                name.clone(),
                (
                    command.env_argv(
                        &agent_bin,
                        &[("KUBECONFIG", sa.kubeconfig.display().to_string())],
                    ),
                    work_dir.join(format!("{name}.log")),
                ),
            );
            addon.start(cp, &name)?;
        }

        // Each agent waits for acceptance; the admin accepts with the CLI.
        let clusters = Api::<flower_addon_crds::ManagedCluster>::all(hub.client.clone());
        for spoke in spokes {
            let alive = std::sync::Mutex::new(&mut *cp);
            crate::wait_until(
                &format!("ManagedCluster {} pending", spoke.name),
                options.wait,
                || async {
                    if let Ok(mut cp) = alive.lock() {
                        cp.processes().check_alive().map_err(fatal)?;
                    }
                    Ok(clusters
                        .get_opt(&spoke.name)
                        .await?
                        .is_some_and(|mc| !mc.spec.hub_accepts_client))
                },
            )
            .await?;
            hub_cli(&addon.admin_kubeconfig, &["accept", &spoke.name])?;
        }
        for spoke in spokes {
            let secrets =
                Api::<Secret>::namespaced(cp.cluster(&spoke.name)?.client.clone(), AGENT_NS);
            crate::wait_until(
                &format!("{}'s credentials Secret", spoke.name),
                options.wait,
                || async {
                    Ok(secrets
                        .get_opt("flower-agent-credentials")
                        .await?
                        .and_then(|s| s.data)
                        .is_some_and(|d| CREDENTIAL_KEYS.iter().all(|k| d.contains_key(*k))))
                },
            )
            .await?;
        }
        addon.joined_in = started.elapsed();
        Ok(addon)
    }

    /// (Re)starts daemon `name` (`flower-hub` or `agent-<spoke>`).
    pub fn start(&self, cp: &mut ControlPlane, name: &str) -> Result<()> {
        let (args, log) = self
            .starts
            .get(name)
            .with_context(|| format!("unknown daemon {name}"))?;
        cp.processes()
            .start(name, Path::new("/usr/bin/env"), args, log)
    }

    /// The bootstrap Secret YAML for `spoke`.
    fn bootstrap_secret(&self, spoke: &Spoke) -> Result<String> {
        let labels: Vec<String> = spoke
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        // The labels are the admin's, bound to the token (in the Template path the Secret's
        // `labels` are what the agent reports, recorded as claims).
        let token_create = |output: &'static str| {
            let mut args = vec![
                "token",
                "create",
                "--cluster-name",
                &spoke.name,
                "--hub",
                &self.hub_address,
                "-o",
                output,
            ];
            for l in &labels {
                args.extend(["--label", l.as_str()]);
            }
            hub_cli(&self.admin_kubeconfig, &args)
        };
        match spoke.bootstrap {
            Bootstrap::Cli => token_create("secret"),
            Bootstrap::Template => {
                let created: serde_json::Value = serde_json::from_str(&token_create("json")?)?;
                let template = std::fs::read_to_string(
                    crate::repo_root().join("manifests/agent/bootstrap-secret.yaml"),
                )?;
                Ok(template
                    .replace(
                        "REPLACE-WITH-BOOTSTRAP-TOKEN",
                        created["token"].as_str().context("token")?,
                    )
                    .replace("REPLACE-WITH-HUB-HOST:PORT", &self.hub_address)
                    .replace(
                        "sha256:REPLACE-WITH-HUB-CA-SHA256",
                        created["caHash"].as_str().context("caHash")?,
                    )
                    .replace("REPLACE-WITH-CLUSTER-NAME", &spoke.name)
                    .replace("labels: \"\"", &format!("labels: \"{}\"", labels.join(","))))
            }
        }
    }
}

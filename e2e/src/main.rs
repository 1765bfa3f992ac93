//! `e2e` command: brings a real local control plane up for exploring by hand.

use anyhow::Result;
use clap::{Parser, Subcommand};

/// flower-addon e2e harness.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start etcd + hub/spoke clusters (apiserver, controller-manager, scheduler, kwok nodes),
    /// print their kubeconfigs, and keep them running until Ctrl-C.
    Up {
        /// Number of clusters: the hub plus N-1 spokes (`spoke-1`, …).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=8))]
        clusters: u16,
        /// Fake kwok nodes per cluster.
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        /// Keep the work dir (logs, kubeconfigs) after Ctrl-C.
        #[arg(long)]
        keep: bool,
        /// Also install flower-addon and apply a demo Federation + Placement (env=demo) with TLS
        /// and SuperNode authentication; needs `cargo build --bins` first. As root, each cluster
        /// gets a real node (kubelet, containerd), the hub runs as its Helm release's pod and
        /// every spoke's agent from the chart, so Flower trains and `flwr` connects; what that
        /// needs (the node binaries, helm and the images) is built first when missing (cached
        /// in ~/.cache/flower-addon). Without root, or with `FLOWER_ADDON_E2E_REAL_NODES=0`,
        /// kwok nodes only and the hub as a process: nothing runs Flower then.
        #[arg(long)]
        with_addon: bool,
    },
    /// Remove what real nodes of killed runs left on this machine (their containers, mounts,
    /// network namespaces, veths, bridges and cgroups); a node whose kubelet, kube-proxy or
    /// containerd still runs is never touched. `./test.sh` runs it when it exits.
    Reap,
}

#[tokio::main]
async fn main() -> Result<()> {
    e2e::install_crypto();
    match Cli::parse().command {
        Cmd::Reap => {
            e2e::node::reap_orphans();
            Ok(())
        }
        Cmd::Up {
            clusters,
            nodes,
            keep,
            with_addon,
        } => {
            let names: Vec<String> = std::iter::once("hub".to_string())
                .chain((1..clusters).map(|i| format!("spoke-{i}")))
                .collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let mut opts = e2e::Options {
                nodes_per_cluster: nodes,
                keep_work_dir: keep,
                ..Default::default()
            };
            if with_addon {
                // Fail before starting anything.
                e2e::binary("flower-hub")?;
                e2e::binary("flower-agent")?;
                anyhow::ensure!(
                    clusters >= 2,
                    "--with-addon needs at least one spoke: --clusters 2 or more"
                );
                opts.real_nodes = real_nodes_for_the_addon()?;
            }
            let mut cp = e2e::ControlPlane::start_with(&names, opts).await?;
            println!(
                "control plane up in {:.1}s (work dir {}):",
                cp.startup.as_secs_f64(),
                cp.work_dir().display()
            );
            for c in cp.clusters() {
                println!(
                    "  {:<8} {}  nodes {:?}\n           export KUBECONFIG={}",
                    c.name,
                    c.server,
                    c.nodes,
                    c.kubeconfig.display()
                );
            }
            let mut connect = None;
            if with_addon && !cp.real_nodes().is_empty() {
                // Real nodes pull nothing: load our image and Flower 1.42.0's into each.
                let images: Vec<e2e::node::ImageArchive> = [
                    flower_addon_crds::render::ADDON_IMAGE,
                    "flwr/superlink:1.42.0",
                    "flwr/supernode:1.42.0",
                    "flwr/superexec:1.42.0",
                ]
                .iter()
                .map(|r| e2e::node::image_archive(r))
                .collect::<Result<_>>()?;
                for node in cp.real_nodes() {
                    println!("loading images into real node {}…", node.name);
                    node.import_images(&images)?;
                }
            }
            if with_addon && !cp.real_nodes().is_empty() {
                connect = install_addon_pods(&cp, &names[1..]).await?;
            } else if with_addon {
                install_addon(&mut cp, &names[1..]).await?;
            }
            println!("memory (RSS):\n{}", cp.rss_report());
            println!("press Ctrl-C to stop");
            flower_addon_agent::cli::shutdown_signal().await;
            eprintln!("stopping…");
            if let Some(mut child) = connect {
                let _ = child.kill();
                let _ = child.wait();
            }
            drop(cp);
            Ok(())
        }
    }
}

/// Whether `up --with-addon` runs real nodes: yes as root unless `FLOWER_ADDON_E2E_REAL_NODES=0`,
/// and then the node binaries and the images must be there (the error names what builds them);
/// without real nodes it says plainly that no Flower will run.
fn real_nodes_for_the_addon() -> Result<bool> {
    let asked = std::env::var("FLOWER_ADDON_E2E_REAL_NODES").ok();
    let root = nix::unistd::geteuid().is_root();
    let wanted = match asked.as_deref() {
        Some("0") => false,
        Some(_) => true,
        None => root,
    };
    if !wanted {
        println!(
            "no real nodes ({}): the demo Federation's pods run on kwok nodes, where nothing \
             executes, so no Flower runs and no flwr connection is offered; run as root (real \
             nodes need network namespaces, containerd and iptables) for a federation that trains",
            if root {
                "FLOWER_ADDON_E2E_REAL_NODES=0"
            } else {
                "not root"
            }
        );
        return Ok(false);
    }
    anyhow::ensure!(
        root,
        "real nodes need root (network namespaces, containerd, iptables)"
    );
    // Our image holds the binaries `up` itself was built with (not a stale release build).
    let bin_dir = e2e::binary("flower-hub")?
        .parent()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    // Idempotent and quick when cached; each prints its own progress.
    for (what, script, args, env) in [
        ("the Kubernetes binaries", "e2e/k8s/build.sh", &[][..], None),
        (
            "the real-node binaries and packages",
            "e2e/node/build.sh",
            &[][..],
            None,
        ),
        ("helm (for the chart)", "e2e/helm/build.sh", &[][..], None),
        (
            "the images (Debian base, pause, Flower 1.42.0, ours)",
            "e2e/images/build.sh",
            &[
                "--only", "base", "--only", "pause", "--only", "flwr", "--only", "addon",
            ][..],
            Some(("FLWR_VERSIONS", "1.42.0")),
        ),
    ] {
        let env = env.into_iter().chain(
            (script == "e2e/images/build.sh").then_some(("FLOWER_ADDON_BIN_DIR", bin_dir.as_str())),
        );
        println!(
            "preparing {what}: {script} {} (cached after the first time)…",
            args.join(" ")
        );
        let mut cmd = std::process::Command::new(e2e::repo_root().join(script));
        cmd.args(args).stdout(std::process::Stdio::null());
        cmd.envs(env);
        let status = cmd
            .status()
            .map_err(|e| anyhow::anyhow!("running {script}: {e}"))?;
        anyhow::ensure!(
            status.success(),
            "{script} failed (its output is above); run it by hand to see why, or run with \
             FLOWER_ADDON_E2E_REAL_NODES=0 for kwok nodes only, where no Flower runs"
        );
    }
    e2e::NodeBinaries::locate()?;
    for image in [
        flower_addon_crds::render::ADDON_IMAGE,
        "flwr/superlink:1.42.0",
        "flwr/supernode:1.42.0",
    ] {
        e2e::node::image_archive(image)?;
    }
    Ok(true)
}

/// `up --with-addon` without real nodes: the hub as a process on the host (as
/// manifests/hub/deployment.yaml runs it) and an agent per spoke, with the demo Federation; no
/// Flower runs on kwok nodes, so no flwr connection is offered.
async fn install_addon(cp: &mut e2e::ControlPlane, spokes: &[&str]) -> Result<()> {
    use e2e::addon::{Addon, AddonOptions, Bootstrap, Spoke};
    println!("installing flower-addon (hub, then an agent per spoke)…");
    let spokes: Vec<Spoke> = spokes
        .iter()
        .map(|s| Spoke::new(s, &[("env", "demo")], Bootstrap::Cli))
        .collect();
    let options = AddonOptions {
        lease: "60s".into(),
        status_interval: "3s".into(),
        ..Default::default()
    };
    let addon = Addon::install(cp, &spokes, &options).await?;
    apply_demo(cp).await?;
    println!(
        "flower-addon: hub on {} (logs in {}); {} spoke(s) joined in {:.1}s",
        addon.hub_address,
        cp.work_dir().display(),
        spokes.len(),
        addon.joined_in.as_secs_f64()
    );
    print_look(&addon.admin_kubeconfig)?;
    println!(
        "  no flwr connection: the demo Federation's pods run on kwok nodes (no real nodes), \
         where nothing executes"
    );
    Ok(())
}

/// `up --with-addon` on real nodes, as docs/kubernetes.md's Helm path: the hub as its release's pod,
/// an agent from the chart per spoke (accepted with env=demo), the demo Federation with TLS and
/// SuperNode authentication, and `flower-hub connect` kept running so `flwr` reaches it.
async fn install_addon_pods(
    cp: &e2e::ControlPlane,
    spokes: &[&str],
) -> Result<Option<std::process::Child>> {
    let t = std::time::Instant::now();
    let hub = cp.cluster("hub")?;
    let node = cp.real_node("hub")?;
    println!("installing flower-addon with helm: the hub pod, then an agent per spoke…");
    let channel = e2e::pod_addon::install_hub(hub, node).await?;
    for name in spokes {
        e2e::pod_addon::install_agent(hub, name, cp.cluster(name)?, &channel, &["env=demo"])
            .await?;
    }
    apply_demo(cp).await?;
    println!(
        "flower-addon: hub pod in {} (channel {channel}); {} spoke(s) joined in {:.1}s",
        e2e::pod_addon::HUB_NS,
        spokes.len(),
        t.elapsed().as_secs_f64()
    );
    print_look(&hub.kubeconfig)?;
    connect(cp, &hub.kubeconfig).await
}

/// The demo: namespace `demo`, every cluster bound to it, Placement env=demo, Federation demo.
async fn apply_demo(cp: &e2e::ControlPlane) -> Result<()> {
    let hub = cp.cluster("hub")?.client.clone();
    let demo = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: demo
---
# Every cluster, bound to namespace demo: without a binding its Placement selects nothing.
apiVersion: flower-addon.io/v1alpha1
kind: ManagedClusterSet
metadata:
  name: global
spec:
  clusterSelector:
    selectorType: LabelSelector
    labelSelector: {}
---
apiVersion: flower-addon.io/v1alpha1
kind: ManagedClusterSetBinding
metadata:
  name: global
  namespace: demo
spec:
  clusterSet: global
---
apiVersion: flower-addon.io/v1alpha1
kind: Placement
metadata:
  name: demo
  namespace: demo
spec:
  predicates:
    - requiredClusterSelector:
        labelSelector:
          matchLabels:
            env: demo
---
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata:
  name: demo
  namespace: demo
spec:
  mode: StatefulSet
  isolationMode: subprocess
  insecure: false
  placementRef:
    name: demo
  superlink:
    image: flwr/superlink:1.42.0
    service:
      type: NodePort
      nodePorts:
        grpc: 30092          # pinned: spokes dial <hub node address>:30092, no address typed
  supernodes:
    image: flwr/supernode:1.42.0
    pools:
      - name: trainers
        replicas: 2
        images: {}
        nodeConfig:
          partition-id: "{partition}"
          num-partitions: "{partitions}"
"#;
    e2e::apply_yaml(&hub, demo, "demo").await.map(|_| ())
}

fn print_look(admin: &std::path::Path) -> Result<()> {
    let hub_bin = e2e::binary("flower-hub")?;
    let admin = admin.display();
    println!("  Federation demo/demo (Placement env=demo) applied; look at it with:");
    println!("    KUBECONFIG={admin} {} status", hub_bin.display());
    println!(
        "    KUBECONFIG={admin} kubectl get federation,placement,placementdecision,managedcluster -A"
    );
    println!("    KUBECONFIG=<a spoke's kubeconfig> kubectl get statefulset,pod -n demo");
    Ok(())
}

/// `flower-hub connect demo` (it writes the flwr connection once the SuperLink is placed and
/// keeps a port-forward to the SuperLink pod open: the Control API is not exposed).
async fn connect(
    cp: &e2e::ControlPlane,
    admin_kubeconfig: &std::path::Path,
) -> Result<Option<std::process::Child>> {
    let hub = cp.cluster("hub")?.client.clone();
    let hub_bin = e2e::binary("flower-hub")?;
    let admin = admin_kubeconfig.display();
    // The flwr connection: `flower-hub connect` writes it once the SuperLink is placed, and
    // keeps a port-forward to the SuperLink pod open while this runs (the Control API is not
    // exposed; a port-forward needs a real node).
    let flwr_home = cp.work_dir().join("flwr-home");
    let feds = kube::Api::<flower_addon_crds::Federation>::namespaced(hub.clone(), "demo");
    let t = std::time::Instant::now();
    let mut placed = false;
    while !placed && t.elapsed() < std::time::Duration::from_secs(60) {
        placed = feds
            .get_opt("demo")
            .await
            .ok()
            .flatten()
            .and_then(|f| f.status?.endpoints?.fleet)
            .is_some();
        if !placed {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }
    let mut connect = None;
    if placed {
        let mut child = std::process::Command::new(&hub_bin)
            .args([
                "connect",
                "demo",
                "--federation-namespace",
                "demo",
                "--flwr-home",
            ])
            .arg(&flwr_home)
            .arg("--ca-file")
            .arg(cp.work_dir().join("demo-ca.crt"))
            .env("KUBECONFIG", admin_kubeconfig)
            .stdout(std::process::Stdio::null())
            .spawn()?;
        let config = flwr_home.join("config.toml");
        let t = std::time::Instant::now();
        let written = loop {
            if std::fs::read_to_string(&config).is_ok_and(|c| c.contains("[superlink.demo]")) {
                break true;
            }
            if child.try_wait()?.is_some() || t.elapsed() > std::time::Duration::from_secs(30) {
                break false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        };
        if written {
            connect = Some(child);
        } else {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    if connect.is_some() {
        println!("FLWR_HOME={}", flwr_home.display());
        println!(
            "  flwr connection [superlink.demo] written there (a port-forward kept open while this runs): FLWR_HOME={} flwr run examples/fedavg demo",
            flwr_home.display()
        );
    } else {
        println!(
            "  (no flwr connection yet: Federation demo/demo is not placed; \
             later: KUBECONFIG={admin} {} connect demo --federation-namespace demo --flwr-home DIR)",
            hub_bin.display()
        );
    }
    Ok(connect)
}

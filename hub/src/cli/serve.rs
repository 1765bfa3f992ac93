//! `flower-hub serve`: the long-running hub. Its flags, the standalone hub and what both modes
//! share (the ops endpoints, the listeners, the work channel's settings) are here; Kubernetes
//! mode is the submodule `kubernetes`.
use crate::channel::source::InMemoryWorkSource;
use crate::channel::{ChannelConfig, ChannelServer};
use crate::cli::registration::DEFAULT_PORT;
use crate::core::sans::SuperLinkNames;
use crate::registration::store::file::FileStore;
use crate::registration::store::{load_or_create_ca, load_or_create_flower_ca};
use crate::standalone::{StandaloneConfig, StandaloneHub};
use anyhow::Context;
use flower_addon_runtime::ops::{Health, Metrics, Refresh};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `flower-hub serve`.
/// Records that this hub started with these CAs, so `flower-hub ca rotate` knows the last step
/// is in force ([`crate::registration::rotation::in_force_fingerprint`]).
pub async fn mark_cas_in_force<S: crate::registration::store::ClusterStore>(
    store: &S,
    channel: &crate::registration::ca::HubCa,
    flower: &crate::registration::ca::HubCa,
) -> anyhow::Result<()> {
    use crate::registration::ca::CaRole;
    use crate::registration::rotation::in_force_fingerprint;
    for (role, ca) in [(CaRole::Channel, channel), (CaRole::Flower, flower)] {
        store
            .mark_ca_in_force(role, &in_force_fingerprint(ca.material()))
            .await
            .context("record the CAs in force")?;
    }
    Ok(())
}

use flower_addon_runtime::netns::NetworkMode;

/// This binary, whose `netns-bridge` gives standalone SuperLinks or SuperNodes network
/// namespaces of their own, when `isolated` (`flag` says which setting asks for it).
fn bridge_when(
    isolated: bool,
    flag: &str,
) -> anyhow::Result<Option<crate::standalone::NetnsBridge>> {
    if !isolated {
        return Ok(None);
    }
    let program = std::env::current_exe()
        .with_context(|| format!("{flag}: cannot find the flower-hub binary"))?;
    Ok(Some(crate::standalone::NetnsBridge { program }))
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Run without Kubernetes: state (CA, tokens, clusters) in --state-dir.
    #[arg(long)]
    pub standalone: bool,
    /// State directory (standalone mode).
    #[arg(
        long,
        env = "FLOWER_HUB_STATE_DIR",
        required_if_eq("standalone", "true")
    )]
    pub state_dir: Option<PathBuf>,
    /// Address of the work channel (repeatable).
    #[arg(long, default_values_t = [SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT))])]
    pub listen: Vec<SocketAddr>,
    /// Name or IP agents dial; goes into the server certificate (repeatable; 127.0.0.1 and
    /// localhost are always included). The first one is printed in join commands.
    #[arg(long = "advertise-address")]
    pub advertise_address: Vec<String>,
    /// Names a Federation may ask for in the SuperLink certificate the hub issues
    /// (`spec.superlink.externalAddress`, `spec.tls.extraSANs`) besides the hub's own addresses
    /// (`--advertise-address`, `--node-address`): a DNS name, `*.domain`, an IP address or a
    /// CIDR range (repeatable or comma-separated). A Federation's CA is trusted by its own
    /// SuperNodes and `flwr` users only, who may keep it among others, so the hub signs only
    /// names its admin vouches for; `*` lets Federation authors
    /// choose any name but another Service's cluster-internal one. A Federation asking for
    /// another name is refused (status Degraded, the field named).
    #[arg(
        long = "superlink-name",
        env = "FLOWER_HUB_SUPERLINK_NAMES",
        value_delimiter = ','
    )]
    pub superlink_name: Vec<String>,
    /// Accept joining clusters whose labels include `key=value` (repeatable; all must match).
    #[arg(long = "auto-accept", value_parser = flower_addon_runtime::cli::parse_pair)]
    pub auto_accept: Vec<(String, String)>,
    /// Validity of agent client certificates (renewed by agents at 80 %).
    #[arg(long, default_value = "30d", value_parser = parse_duration)]
    pub cert_validity: Duration,
    /// Validity of the SuperLink certificates the hub issues. At 80 % of it the hub issues a new
    /// one and restarts the SuperLink (Kubernetes: the pod rolls, its state kept by
    /// `--database`; standalone: the process), and SuperNodes reconnect. A shorter value replaces
    /// longer-lived certificates at once.
    #[arg(long, default_value = "90d", value_parser = parse_duration)]
    pub superlink_cert_validity: Duration,
    /// Standalone: first local port tried for the SuperNodes the hub machine runs itself (pools
    /// of Federations without a Placement), as `flower-agent run --port-base` for an agent. Give
    /// hubs and agents sharing one machine distinct ranges: two processes starting SuperNodes at
    /// the same moment can both find the same port free.
    #[arg(long, env = "FLOWER_HUB_LOCAL_PORT_BASE", default_value_t = 19500)]
    pub local_port_base: u16,
    /// Standalone: run each SuperLink (and its ServerApps) and the hub machine's own SuperNodes
    /// in a mount namespace where the state directory is empty but for their own directory, so
    /// code run through `flwr run` cannot read the CA keys or tokens; a hub run as root also
    /// runs them as an unprivileged uid of their Federation's own, without capabilities, in a PID
    /// namespace of their own. Needs root or unprivileged user namespaces; `false` turns it off
    /// (then that code runs with the hub's privileges).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub flower_sandbox: bool,
    /// Standalone, with the sandbox: `isolated` runs each SuperLink (with its ServerApps and
    /// SuperExec) in a network namespace of its own that reaches nothing but itself, so a
    /// ServerApp of one Federation cannot open another Federation's Control API; the hub serves
    /// the Fleet and Control ports on the host as before and bridges them in. `host`: SuperLinks
    /// on the hub machine's network (ServerApps may then reach the network, and each other's
    /// SuperLinks). `--flower-sandbox false` implies `host`.
    #[arg(long, value_enum, default_value_t = NetworkMode::Isolated)]
    pub superlink_network: NetworkMode,
    /// Standalone, with the sandbox: `isolated` runs each of the hub machine's own SuperNodes
    /// (pools of Federations without `placementRef`, with their ClientApps) in a network
    /// namespace of its own that reaches only its SuperLink's Fleet API (through the hub), so a
    /// ClientApp cannot reach another Federation's SuperNodes or Control API, nor the network.
    /// `host`: the hub machine's network. `--flower-sandbox false` implies `host`.
    #[arg(long, value_enum, default_value_t = NetworkMode::Isolated)]
    pub supernode_network: NetworkMode,
    /// Cluster lease: the hub pings agents every third of it, and a cluster without heartbeat
    /// for 5 leases becomes Available=Unknown and gets the unreachable taint (OCM's rule). In
    /// Kubernetes mode it is the `spec.leaseDurationSeconds` of ManagedClusters created on join;
    /// each cluster's own value is what counts.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// Directory of Federation and Placement YAML files, re-read when they change (standalone).
    /// Default: `<state-dir>/manifests`.
    #[arg(long)]
    pub manifests: Option<PathBuf>,
    /// Directory holding `flower-superlink`, `flower-superexec` and `flower-supernode` (a
    /// venv's `bin/`; standalone; the hub registers SuperNode keys itself, no `flwr` needed).
    /// Default: PATH.
    #[arg(long, env = "FLOWER_BIN_DIR")]
    pub flower_bin: Option<PathBuf>,
    /// Host the SuperLinks' Fleet API (what SuperNodes dial) listens on (standalone). Their
    /// Control API listens on 127.0.0.1 unless a Federation sets
    /// `spec.superlink.service.exposeControl`.
    #[arg(long, default_value = "0.0.0.0")]
    pub superlink_host: String,
    /// Address of the hub cluster's nodes that spokes reach (Kubernetes mode): a placed
    /// Federation with a NodePort SuperLink Service and no `externalAddress` is dialed at
    /// `<node address>:<fleet node port>`. The manifests set it to the node the hub runs on
    /// (`status.hostIP`); set a reachable one when nodes have private addresses.
    #[arg(long, env = "FLOWER_HUB_NODE_ADDRESS")]
    pub node_address: Option<String>,
    /// The hub admin's pod policy: what SuperLink pods and hub-local pools may do.
    #[command(flatten)]
    pub pod_policy: crate::cli::policy::HubPolicyArgs,
    /// Where FlowerRuns' `spec.app.fab.url` may be downloaded from besides public addresses: an
    /// IP address, a CIDR range or a host name (comma-separated or repeated). By default
    /// loopback, link-local (cloud metadata), private, shared and special-purpose addresses and
    /// the Kubernetes API server are refused. Helm value `hub.fabUrlAllow`.
    #[arg(
        long = "fab-url-allow",
        env = "FLOWER_HUB_FAB_URL_ALLOW",
        value_delimiter = ',',
        value_name = "CIDR|HOST"
    )]
    pub fab_url_allow: Vec<String>,
    /// Namespace of the hub's own objects, e.g. the CA Secret (Kubernetes mode).
    #[arg(long, env = "POD_NAMESPACE", default_value = "flower-addon-system")]
    pub namespace: String,
    /// `/metrics`, `/healthz` and `/readyz` (ready once the work channel listens and every
    /// cache has listed: the Kubernetes controllers' and work source's, or the standalone hub's
    /// first pass over its manifests).
    #[command(flatten)]
    pub ops: flower_addon_runtime::ops::OpsArgs,
    /// Kubernetes mode: run as one of several replicas. Only the holder of the Lease
    /// `--leader-elect-resource-name` in `--namespace` reconciles, writes status and serves the work
    /// channel; the others wait, not ready (so the hub Service sends agents to the leader), and
    /// take over when it stops (at once after a graceful stop, else after the lease duration). A
    /// leader that cannot renew stops with an error, to be restarted as a standby.
    #[arg(long)]
    pub leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(long, default_value = "flower-hub")]
    pub leader_elect_resource_name: String,
    /// How long a standby waits after the leader's last renewal before taking over
    /// (controller-runtime's and kube-controller-manager's default).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often the leader renews and standbys try.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
}

/// Readiness check: the work channel listens.
const CHANNEL_READY: &str = "work-channel";
/// Readiness check: the standalone hub finished its first pass over the manifests.
const STANDALONE_READY: &str = "manifests";

/// Serves `/metrics` (the hub registry; with the supervisor's when `processes`), `/healthz` and
/// `/readyz` for `health`, refreshing the scrape-time gauges with `refresh`.
async fn serve_ops(
    args: &ServeArgs,
    health: Arc<Health>,
    processes: bool,
    refresh: Option<Refresh>,
) -> anyhow::Result<()> {
    let refresh = refresh
        .unwrap_or_else(|| Arc::new(|| Box::pin(async { crate::metrics::refresh_process() })));
    flower_addon_runtime::ops::serve(
        &args.ops,
        Metrics {
            registry: crate::metrics::registry(processes),
            refresh: Some(refresh),
        },
        health,
    )
    .await?;
    Ok(())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    flower_addon_runtime::cli::parse_duration(s)
}

/// `flower-hub serve`.
pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    raise_fd_limit();
    if !args.standalone {
        return kubernetes::serve_kubernetes(args);
    }
    if args.leader_elect {
        anyhow::bail!(
            "--leader-elect works in Kubernetes mode (a Lease in the hub cluster); a standalone hub runs alone: drop --leader-elect or --standalone"
        );
    }
    let dir = args
        .state_dir
        .clone()
        .context("--state-dir is required with --standalone")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(serve_standalone(args, dir))?;
    Ok(ExitCode::SUCCESS)
}

/// Standalone mode: the work channel and the standalone controller (Federations and Placements
/// from files, SuperLinks and the hub's own SuperNodes as processes) on the state in `dir`.
async fn serve_standalone(args: ServeArgs, dir: PathBuf) -> anyhow::Result<()> {
    let health = Health::new(&[CHANNEL_READY, STANDALONE_READY]);
    serve_ops(&args, health.clone(), true, None).await?;
    let store = Arc::new(FileStore::open(&dir)?);
    // Child processes run in subdirectories: every path handed to them must be absolute.
    let dir = std::fs::canonicalize(&dir).with_context(|| format!("resolve {}", dir.display()))?;
    let ca = Arc::new(load_or_create_ca(store.as_ref()).await?);
    let flower_ca = Arc::new(load_or_create_flower_ca(store.as_ref()).await?);
    mark_cas_in_force(store.as_ref(), &ca, &flower_ca).await?;
    let listeners = bind(&args.listen).await?;
    health.set(CHANNEL_READY, true);
    let hub = advertised_hub(&args, &listeners);
    std::fs::write(dir.join("hub-address"), format!("{hub}\n"))
        .with_context(|| format!("write {}", dir.join("hub-address").display()))?;
    println!(
        "flower-hub: serving the work channel on {hub} (CA hash {})",
        ca.hash()
    );
    println!(
        "flower-hub: add a cluster with `flower-hub token create --state-dir {}`",
        dir.display()
    );
    // Notice `accept`/`revoke` run from other processes.
    {
        let store = store.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                if let Err(error) = store.poll_external_changes() {
                    tracing::warn!(%error, "cannot scan the state directory");
                }
            }
        });
    }
    let config = channel_config(&args, args.advertise_address.clone());
    let work = Arc::new(InMemoryWorkSource::gated());
    // SuperLink certificates come from the Flower CA, never from the CA agents pin.
    let controller = StandaloneHub::new(
        store.clone(),
        work.clone(),
        flower_ca,
        standalone_config(&args, dir)?,
    )
    .with_health(health, STANDALONE_READY);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let controller = tokio::spawn(controller.run(wait_stop(stop_rx.clone())));
    serve_until_signal(
        ChannelServer::new(store, work, ca, config),
        listeners,
        stop_tx,
    )
    .await?;
    // The controller stops its SuperLinks before the hub exits.
    let _ = controller.await;
    Ok(())
}

/// Where agents reach a standalone hub: the first `--advertise-address` (127.0.0.1 without
/// one) and the port the first listener got.
fn advertised_hub(args: &ServeArgs, listeners: &[tokio::net::TcpListener]) -> String {
    let port = listeners
        .first()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.port())
        .unwrap_or(DEFAULT_PORT);
    let host = args
        .advertise_address
        .first()
        .cloned()
        .unwrap_or_else(|| "127.0.0.1".to_string());
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The standalone controller's settings from the flags: the manifests directory (made when
/// missing), the Flower binaries, the sandbox and its networks, the SuperLink names, the pod
/// policy and where FABs may come from.
fn standalone_config(args: &ServeArgs, dir: PathBuf) -> anyhow::Result<StandaloneConfig> {
    let manifests_dir = args
        .manifests
        .clone()
        .unwrap_or_else(|| dir.join("manifests"));
    std::fs::create_dir_all(&manifests_dir)
        .with_context(|| format!("create {}", manifests_dir.display()))?;
    let manifests_dir = std::fs::canonicalize(&manifests_dir)
        .with_context(|| format!("resolve {}", manifests_dir.display()))?;
    let flower_bin = match &args.flower_bin {
        Some(d) => Some(
            std::fs::canonicalize(d)
                .with_context(|| format!("--flower-bin {}: not found", d.display()))?,
        ),
        None => None,
    };
    println!(
        "flower-hub: reading Federations and Placements from {}",
        manifests_dir.display()
    );
    Ok(StandaloneConfig {
        state_dir: dir,
        manifests_dir,
        flower_bin,
        superlink_host: args.superlink_host.clone(),
        advertise: args.advertise_address.clone(),
        superlink_cert_validity: args.superlink_cert_validity,
        local_port_base: args.local_port_base,
        sandbox: args.flower_sandbox,
        superlink_network: bridge_when(
            args.flower_sandbox && args.superlink_network == NetworkMode::Isolated,
            "--superlink-network isolated",
        )?,
        supernode_network: bridge_when(
            args.flower_sandbox && args.supernode_network == NetworkMode::Isolated,
            "--supernode-network isolated",
        )?,
        superlink_names: SuperLinkNames::new(
            args.advertise_address.iter().map(String::as_str),
            &args.superlink_name,
        )?,
        pod_policy: args.pod_policy.policy()?,
        fab_egress: crate::flower::fab_url::Egress::allowing(&args.fab_url_allow)
            .map_err(anyhow::Error::msg)?,
    })
}

/// Binds every `--listen` address.
async fn bind(addresses: &[SocketAddr]) -> anyhow::Result<Vec<tokio::net::TcpListener>> {
    let mut listeners = Vec::with_capacity(addresses.len());
    for addr in addresses {
        listeners.push(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("listen on {addr}"))?,
        );
    }
    Ok(listeners)
}

/// The work channel's settings from the flags, with `advertise` as the server certificate's
/// names.
fn channel_config(args: &ServeArgs, advertise: Vec<String>) -> ChannelConfig {
    ChannelConfig {
        advertise,
        cert_validity: args.cert_validity,
        lease_duration: args.lease_duration,
        auto_accept: args.auto_accept.iter().cloned().collect::<BTreeMap<_, _>>(),
        ..ChannelConfig::default()
    }
}

/// Serves the work channel on `listeners` until SIGINT/SIGTERM, then tells the other tasks to
/// stop through `stop`.
async fn serve_until_signal<
    S: crate::registration::store::ClusterStore + 'static,
    W: crate::channel::source::WorkSource + 'static,
>(
    server: ChannelServer<S, W>,
    listeners: Vec<tokio::net::TcpListener>,
    stop: tokio::sync::watch::Sender<bool>,
) -> anyhow::Result<()> {
    let shutdown = async move {
        shutdown_signal().await;
        tracing::info!("stopping");
        let _ = stop.send(true);
    };
    server.serve(listeners, shutdown).await?;
    Ok(())
}

async fn wait_stop(mut rx: tokio::sync::watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

pub use flower_addon_runtime::cli::shutdown_signal;

/// Raises the soft limit on open files to the hard one (as Go's runtime does): the work channel
/// holds one connection per agent, and its caps ([`crate::channel::conns`]), not a default soft
/// limit of 1,024, should decide how many connections are refused.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!(from = soft, to = hard, "open-file limit raised"),
            Err(error) => tracing::warn!(%error, soft, hard, "cannot raise the open-file limit"),
        },
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "cannot read the open-file limit"),
    }
}

mod kubernetes;
pub use kubernetes::{
    CA_SECRET, LOST_FLOWER_CA_REASON, kubernetes_advertise, load_or_create_ca_secret,
    load_or_create_ca_secret_for, publish_lost_flower_ca,
};

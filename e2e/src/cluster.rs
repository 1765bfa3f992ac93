//! A real multi-cluster control plane on loopback: one etcd shared by one kube-apiserver per
//! cluster (`--etcd-prefix=/<cluster>`), each with kube-controller-manager, kube-scheduler and kwok
//! managing fake nodes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tempfile::TempDir;

use crate::bins::Binaries;
use crate::dns::ClusterDns;
use crate::harness::{BootLock, free_ports};
use crate::kubeconfig;
use crate::node::{NodeBinaries, NodeNetwork, RealNode};
use crate::process::{Downed, Processes};

/// Service CIDR of every cluster: inside 198.18.0.0/15 (the benchmarking range this harness
/// keeps all its addresses in; real nodes' pod subnets are 198.19.0.0–198.19.239.255).
pub const SERVICE_CIDR: &str = "198.19.240.0/20";
/// Taint on the kwok nodes of clusters that also have a real node, so that real workloads land on
/// the real node (`flower-addon.io/kwok=true:NoSchedule`; scale tests tolerate it).
pub const KWOK_TAINT_KEY: &str = "flower-addon.io/kwok";
/// Annotation kwok uses to pick the nodes it manages.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// Knobs of [`ControlPlane::start_with`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Fake kwok nodes per cluster (`<cluster>-node-<i>`).
    pub nodes_per_cluster: usize,
    /// kube-apiserver `--watch-cache` (on by default, as in real clusters: streaming lists need
    /// it; off saves only ~10 MiB per apiserver at test scale). `FLOWER_ADDON_E2E_WATCH_CACHE=0`
    /// turns it off.
    pub watch_cache: bool,
    /// Keep the work dir (logs, kubeconfigs, certs) after the control plane stops.
    pub keep_work_dir: bool,
    /// Time allowed for each readiness step.
    pub step_timeout: Duration,
    /// One real node per cluster (kubelet, kube-proxy, containerd; see [`crate::node`]) beside the
    /// kwok nodes, which are then tainted [`KWOK_TAINT_KEY`], and a cluster DNS per cluster
    /// ([`crate::dns`]) for its pods. The apiservers then listen on the
    /// node bridge's host address (198.18.k.1) instead of 127.0.0.1, so pods and kubelets reach
    /// them. `FLOWER_ADDON_E2E_REAL_NODES=1` turns it on.
    pub real_nodes: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            nodes_per_cluster: 2,
            watch_cache: std::env::var("FLOWER_ADDON_E2E_WATCH_CACHE").map_or(true, |v| v != "0"),
            keep_work_dir: std::env::var("FLOWER_ADDON_E2E_KEEP").is_ok_and(|v| v == "1"),
            step_timeout: Duration::from_secs(120),
            real_nodes: std::env::var("FLOWER_ADDON_E2E_REAL_NODES").is_ok_and(|v| v == "1"),
        }
    }
}

/// One cluster of the control plane.
#[derive(Clone)]
pub struct Cluster {
    /// Cluster name (`hub`, `spoke-1`, …), also its etcd prefix.
    pub name: String,
    /// API server URL, `https://127.0.0.1:<port>`.
    pub server: String,
    /// CA bundle of the apiserver's serving certificate.
    pub ca_file: PathBuf,
    /// Admin kubeconfig (user `admin` in `system:masters`).
    pub kubeconfig: PathBuf,
    /// Admin bearer token.
    pub admin_token: String,
    /// Admin client.
    pub client: Client,
    /// Names of the fake kwok nodes.
    pub nodes: Vec<String>,
    /// Name and address of the real node, with [`Options::real_nodes`].
    pub real_node: Option<(String, std::net::Ipv4Addr)>,
    dir: PathBuf,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.name)
            .field("server", &self.server)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// This cluster's directory in the work dir (certs, logs, kubeconfigs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes a kubeconfig for this cluster authenticating with `token`.
    pub fn write_kubeconfig(&self, file_name: &str, user: &str, token: &str) -> Result<PathBuf> {
        let path = self.dir.join(file_name);
        kubeconfig::write(&path, &self.name, &self.server, &self.ca_file, user, token)?;
        Ok(path)
    }
}

/// A running control plane; every process is ended by pid when it is dropped.
pub struct ControlPlane {
    /// Behind a lock so that an outage ([`ControlPlane::stop_apiserver`], [`ControlPlane::stop_etcd`])
    /// can be caused while the test holds its clusters (`&self`).
    procs: std::sync::Mutex<Processes>,
    clusters: Vec<Cluster>,
    /// Time [`ControlPlane::start`] took.
    pub startup: Duration,
    etcd_url: String,
    work_dir: PathBuf,
    tmp: Option<TempDir>,
    bins: Binaries,
    node_net: Option<Arc<NodeNetwork>>,
    real_nodes: Vec<RealNode>,
    dns: Vec<ClusterDns>,
}

/// Ports of one cluster's components.
struct Ports {
    api: u16,
    cm: u16,
    sched: u16,
    kwok: u16,
}

/// The signing key files shared by every cluster: the service-account key, and the CA of client
/// certificates (what kube-controller-manager signs `kubernetes.io/kube-apiserver-client` CSRs
/// with and the apiservers accept: Open Cluster Management's agents authenticate to the hub with
/// such certificates).
struct SaKey {
    private: PathBuf,
    public: PathBuf,
    client_ca_cert: PathBuf,
    client_ca_key: PathBuf,
}

fn random_hex(bytes: usize) -> Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn s(v: impl std::fmt::Display) -> String {
    v.to_string()
}

/// An unauthenticated client for a component's `/healthz` (self-signed serving cert).
fn health_client(port: u16) -> Result<Client> {
    let mut cfg = kube::Config::new(format!("https://127.0.0.1:{port}").parse()?);
    cfg.accept_invalid_certs = true;
    cfg.connect_timeout = Some(Duration::from_secs(2));
    cfg.read_timeout = Some(Duration::from_secs(5));
    Ok(Client::try_from(cfg)?)
}

async fn get_text(client: &Client, path: &str) -> Result<String> {
    let req = http::Request::get(path).body(Vec::new())?;
    Ok(client.request_text(req).await?)
}

impl ControlPlane {
    /// Starts one etcd and, for each name, a cluster (kube-apiserver with
    /// `--etcd-prefix=/<name>`, controller-manager, scheduler, kwok and two fake nodes) with
    /// default [`Options`]. Fails loudly if a binary is missing.
    pub async fn start(names: &[&str]) -> Result<Self> {
        Self::start_with(names, Options::default()).await
    }

    /// [`ControlPlane::start`] with explicit options. A boot that fails only because a port
    /// chosen free was taken before a component bound it (another test's process got it in
    /// between) is retried from scratch, at most twice, saying so; any other failure fails.
    pub async fn start_with(names: &[&str], opts: Options) -> Result<Self> {
        let mut attempt = 1;
        loop {
            match Self::start_once(names, &opts).await {
                Err(e) if attempt < 3 && format!("{e:#}").contains("address already in use") => {
                    crate::harness::retried(
                        "port-race",
                        format_args!(
                            "a port chosen free was taken before a component bound it; booting again ({e:#})"
                        ),
                    );
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn start_once(names: &[&str], opts: &Options) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let bins = Binaries::locate()?;
        // One boot at a time on this machine; the running control planes stay in parallel.
        let lock = BootLock::acquire_async().await?;
        if lock.waited > Duration::from_millis(500) {
            eprintln!(
                "e2e: waited {:.1}s for another control plane to finish booting",
                lock.waited.as_secs_f64()
            );
        }
        let t0 = Instant::now();
        let tmp = tempfile::Builder::new()
            .prefix("flower-e2e-")
            .tempdir()
            .context("creating the work dir")?;
        let work_dir = tmp.path().to_path_buf();
        eprintln!(
            "e2e: starting control plane {names:?} in {} (binaries: {})",
            work_dir.display(),
            bins.dir.display()
        );
        let mut cp = ControlPlane {
            procs: std::sync::Mutex::new(Processes::default()),
            clusters: Vec::new(),
            startup: Duration::ZERO,
            etcd_url: String::new(),
            work_dir,
            tmp: Some(tmp),
            bins,
            node_net: None,
            real_nodes: Vec::new(),
            dns: Vec::new(),
        };
        if opts.keep_work_dir {
            cp.keep_work_dir();
        }
        let booted = cp.boot(names, opts).await;
        drop(lock);
        match booted {
            Ok(()) => {
                cp.startup = t0.elapsed();
                eprintln!(
                    "e2e: control plane up in {:.1}s; RSS {} MiB total",
                    cp.startup.as_secs_f64(),
                    cp.total_rss_kib() / 1024
                );
                Ok(cp)
            }
            Err(e) => {
                // Dropping `cp` ends every process; say where the logs were.
                bail!(
                    "control plane failed to start: {e:#}\n(logs under {})",
                    cp.work_dir.display()
                )
            }
        }
    }

    async fn boot(&mut self, names: &[&str], opts: &Options) -> Result<()> {
        // Real nodes: locate their binaries before starting anything, then the bridge the
        // apiservers listen on.
        let node_bins = if opts.real_nodes {
            let bins = NodeBinaries::locate()?;
            self.node_net = Some(NodeNetwork::create()?);
            Some(bins)
        } else {
            None
        };
        let listen_ip = self
            .node_net
            .as_ref()
            .map_or_else(|| "127.0.0.1".to_string(), |n| n.host_ip().to_string());
        let ports = free_ports(2 + 4 * names.len())?;
        let cluster_ports: Vec<Ports> = ports[2..]
            .chunks(4)
            .map(|c| Ports {
                api: c[0],
                cm: c[1],
                sched: c[2],
                kwok: c[3],
            })
            .collect();
        self.start_etcd(ports[0], ports[1], opts).await?;
        let sa_key = self.write_service_account_key()?;
        let mut clusters = self
            .start_apiservers(names, &cluster_ports, &listen_ip, &sa_key, opts)
            .await?;

        let t = Instant::now();
        for (c, p) in clusters.iter().zip(&cluster_ports) {
            self.start_cluster_daemons(c, p, &sa_key)?;
        }
        for (c, p) in clusters.iter_mut().zip(&cluster_ports) {
            self.wait_cluster_daemons(c, p, opts).await?;
            self.create_fake_nodes(c, opts).await?;
        }
        eprintln!(
            "e2e: controller-managers, schedulers, kwok and {} node(s) ready ({:.1}s)",
            clusters.iter().map(|c| c.nodes.len()).sum::<usize>(),
            t.elapsed().as_secs_f64()
        );
        if let Some(bins) = node_bins {
            self.start_real_nodes(&mut clusters, &bins, opts).await?;
        }
        self.clusters = clusters;
        Ok(())
    }

    /// The shared etcd on `port` (peer port `peer`), waited for until healthy.
    async fn start_etcd(&mut self, port: u16, peer: u16, opts: &Options) -> Result<()> {
        let etcd_dir = self.work_dir.join("etcd");
        std::fs::create_dir_all(&etcd_dir)?;
        self.etcd_url = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let etcd = self.bins.etcd.clone();
        procs_of(&mut self.procs).start(
            "etcd",
            &etcd,
            &[
                s("--name=e2e"),
                format!("--data-dir={}", etcd_dir.display()),
                format!("--listen-client-urls={}", self.etcd_url),
                format!("--advertise-client-urls={}", self.etcd_url),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=e2e={peer_url}"),
                s("--unsafe-no-fsync=true"),
                s("--log-level=warn"),
            ],
            &self.work_dir.join("etcd.log"),
        )?;
        let t = Instant::now();
        self.wait("etcd /health", &["etcd"], opts.step_timeout, || {
            etcd_healthy(port)
        })
        .await?;
        eprintln!("e2e: etcd ready ({:.1}s)", t.elapsed().as_secs_f64());
        Ok(())
    }

    /// One service-account signing key for every cluster (PEM, private and public part), and
    /// one client-certificate CA.
    fn write_service_account_key(&self) -> Result<SaKey> {
        let key = rcgen::KeyPair::generate().context("generating the service-account key")?;
        let sa = SaKey {
            private: self.work_dir.join("sa.key"),
            public: self.work_dir.join("sa.pub"),
            client_ca_cert: self.work_dir.join("client-ca.crt"),
            client_ca_key: self.work_dir.join("client-ca.key"),
        };
        std::fs::write(&sa.private, key.serialize_pem())?;
        std::fs::write(&sa.public, key.public_key_pem())?;
        let ca_key = rcgen::KeyPair::generate().context("generating the client CA key")?;
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "e2e client CA");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = params
            .self_signed(&ca_key)
            .context("self-signing the client CA")?;
        std::fs::write(&sa.client_ca_cert, ca.pem())?;
        std::fs::write(&sa.client_ca_key, ca_key.serialize_pem())?;
        Ok(sa)
    }

    /// One kube-apiserver per cluster, started together, then waited for one by one until
    /// `/readyz`; returns the clusters with their admin clients.
    async fn start_apiservers(
        &mut self,
        names: &[&str],
        ports: &[Ports],
        listen_ip: &str,
        sa: &SaKey,
        opts: &Options,
    ) -> Result<Vec<Cluster>> {
        let t = Instant::now();
        let mut pending = Vec::new();
        for (name, p) in names.iter().zip(ports) {
            let dir = self.work_dir.join(name);
            std::fs::create_dir_all(dir.join("certs"))?;
            let token = random_hex(16)?;
            std::fs::write(
                dir.join("tokens.csv"),
                format!("{token},admin,admin,system:masters\n"),
            )?;
            let args = self.apiserver_args(name, &dir, p.api, listen_ip, sa, opts);
            let apiserver = self.bins.kube_apiserver.clone();
            self.procs
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .start(
                    &format!("{name}/kube-apiserver"),
                    &apiserver,
                    &args,
                    &dir.join("kube-apiserver.log"),
                )?;
            pending.push((name.to_string(), dir, token, p.api));
        }
        let mut clusters = Vec::new();
        for (name, dir, token, port) in pending {
            clusters.push(
                self.wait_apiserver(name, dir, token, listen_ip, port, opts)
                    .await?,
            );
        }
        eprintln!(
            "e2e: {} kube-apiserver(s) ready ({:.1}s)",
            clusters.len(),
            t.elapsed().as_secs_f64()
        );
        Ok(clusters)
    }

    fn apiserver_args(
        &self,
        name: &str,
        dir: &Path,
        port: u16,
        listen_ip: &str,
        sa: &SaKey,
        opts: &Options,
    ) -> Vec<String> {
        let mut args = vec![
            format!("--etcd-servers={}", self.etcd_url),
            format!("--etcd-prefix=/{name}"),
            format!("--bind-address={listen_ip}"),
            format!("--advertise-address={listen_ip}"),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", dir.join("certs").display()),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            s("--service-account-issuer=https://kubernetes.default.svc.cluster.local"),
            format!("--service-account-key-file={}", sa.public.display()),
            format!(
                "--service-account-signing-key-file={}",
                sa.private.display()
            ),
            format!("--token-auth-file={}", dir.join("tokens.csv").display()),
            format!("--client-ca-file={}", sa.client_ca_cert.display()),
            s("--authorization-mode=RBAC"),
            s("--allow-privileged=true"),
        ];
        if self.node_net.is_none() {
            // A loopback advertise address is refused by the endpoint reconciler. With real
            // nodes the `kubernetes` Service gets its endpoint (pods reach the apiserver).
            args.push(s("--endpoint-reconciler-type=none"));
        } else {
            // Logs and exec go to the kubelet by its node IP (node names do not resolve).
            args.push(s("--kubelet-preferred-address-types=InternalIP"));
        }
        if !opts.watch_cache {
            args.push(s("--watch-cache=false"));
        }
        args
    }

    /// Waits for cluster `name`'s serving certificate and `/readyz`, with an admin kubeconfig.
    async fn wait_apiserver(
        &mut self,
        name: String,
        dir: PathBuf,
        token: String,
        listen_ip: &str,
        port: u16,
        opts: &Options,
    ) -> Result<Cluster> {
        let ca_file = dir.join("certs/apiserver.crt");
        let server = format!("https://{listen_ip}:{port}");
        let kc = dir.join("kubeconfig");
        let ca = ca_file.clone();
        self.wait(
            &format!("{name} serving certificate"),
            &[&format!("{name}/kube-apiserver")],
            opts.step_timeout,
            || {
                let ca = ca.clone();
                async move { Ok(ca.is_file()) }
            },
        )
        .await?;
        // The apiserver writes its certificate file (serving certificate, then its CA) in place:
        // read too early, it holds the serving certificate alone, and a client trusting only
        // that fails every handshake with UnknownIssuer (seen once in a full run). So each
        // attempt reads the file afresh.
        let ready: std::sync::Mutex<Option<Client>> = std::sync::Mutex::new(None);
        self.wait(
            &format!("{name} kube-apiserver /readyz"),
            &[&format!("{name}/kube-apiserver"), "etcd"],
            opts.step_timeout,
            || {
                let (kc, name, server, ca_file, token) = (&kc, &name, &server, &ca_file, &token);
                let ready = &ready;
                async move {
                    kubeconfig::write(kc, name, server, ca_file, "admin", token)?;
                    let client = kubeconfig::client(kc).await?;
                    let ok = get_text(&client, "/readyz").await?.trim() == "ok";
                    if ok && let Ok(mut ready) = ready.lock() {
                        *ready = Some(client);
                    }
                    Ok(ok)
                }
            },
        )
        .await?;
        let client = ready
            .into_inner()
            .ok()
            .flatten()
            .context("the apiserver was ready but no client was kept")?;
        Ok(Cluster {
            name,
            server,
            ca_file,
            kubeconfig: kc,
            admin_token: token,
            client,
            nodes: Vec::new(),
            real_node: None,
            dir,
        })
    }

    /// kube-controller-manager, kube-scheduler and kwok of cluster `c`.
    fn start_cluster_daemons(&mut self, c: &Cluster, p: &Ports, sa: &SaKey) -> Result<()> {
        let kc = c.kubeconfig.display().to_string();
        let common = |port: u16, cert_dir: &str| {
            vec![
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                s("--leader-elect=false"),
                s("--bind-address=127.0.0.1"),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", c.dir.join(cert_dir).display()),
            ]
        };
        let mut cm = common(p.cm, "cm-certs");
        cm.extend([
            format!(
                "--service-account-private-key-file={}",
                sa.private.display()
            ),
            format!("--root-ca-file={}", c.ca_file.display()),
            s("--use-service-account-credentials=false"),
            format!(
                "--cluster-signing-cert-file={}",
                sa.client_ca_cert.display()
            ),
            format!("--cluster-signing-key-file={}", sa.client_ca_key.display()),
        ]);
        let bin = self.bins.kube_controller_manager.clone();
        procs_of(&mut self.procs).start(
            &format!("{}/kube-controller-manager", c.name),
            &bin,
            &cm,
            &c.dir.join("kube-controller-manager.log"),
        )?;
        let bin = self.bins.kube_scheduler.clone();
        procs_of(&mut self.procs).start(
            &format!("{}/kube-scheduler", c.name),
            &bin,
            &common(p.sched, "sched-certs"),
            &c.dir.join("kube-scheduler.log"),
        )?;
        let bin = self.bins.kwok.clone();
        procs_of(&mut self.procs).start(
            &format!("{}/kwok", c.name),
            &bin,
            &[
                format!("--kubeconfig={kc}"),
                s("--manage-all-nodes=false"),
                format!("--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake"),
                format!("--config={}", self.bins.kwok_stages.display()),
                s("--node-lease-duration-seconds=40"),
                format!("--server-address=127.0.0.1:{}", p.kwok),
            ],
            &c.dir.join("kwok.log"),
        )?;
        Ok(())
    }

    /// Waits until cluster `c`'s controller-manager and scheduler are healthy and the
    /// controller-manager has made the `default` ServiceAccount.
    async fn wait_cluster_daemons(&mut self, c: &Cluster, p: &Ports, opts: &Options) -> Result<()> {
        for (what, port) in [
            ("kube-controller-manager", p.cm),
            ("kube-scheduler", p.sched),
        ] {
            let hc = health_client(port)?;
            self.wait(
                &format!("{}/{what} /healthz", c.name),
                &[&format!("{}/{what}", c.name)],
                opts.step_timeout,
                || {
                    let hc = hc.clone();
                    async move { Ok(get_text(&hc, "/healthz").await?.trim() == "ok") }
                },
            )
            .await?;
        }
        let sas: Api<ServiceAccount> = Api::namespaced(c.client.clone(), "default");
        self.wait(
            &format!(
                "{}: default ServiceAccount (controller-manager works)",
                c.name
            ),
            &[&format!("{}/kube-controller-manager", c.name)],
            opts.step_timeout,
            || {
                let sas = sas.clone();
                async move { Ok(sas.get_opt("default").await?.is_some()) }
            },
        )
        .await
    }

    /// Creates cluster `c`'s kwok nodes and waits until kwok has made each Ready.
    async fn create_fake_nodes(&mut self, c: &mut Cluster, opts: &Options) -> Result<()> {
        let nodes: Api<Node> = Api::all(c.client.clone());
        for i in 0..opts.nodes_per_cluster {
            let name = format!("{}-node-{i}", c.name);
            nodes
                .create(&PostParams::default(), &fake_node(&name, opts.real_nodes)?)
                .await
                .with_context(|| format!("creating node {name}"))?;
            c.nodes.push(name);
        }
        for name in c.nodes.clone() {
            self.wait(
                &format!("node {name} Ready (kwok)"),
                &[&format!("{}/kwok", c.name)],
                opts.step_timeout,
                || {
                    let nodes = nodes.clone();
                    let name = name.clone();
                    async move { Ok(node_ready(&nodes.get(&name).await?)) }
                },
            )
            .await?;
        }
        Ok(())
    }

    /// A cluster DNS and a real node per cluster ([`Options::real_nodes`]).
    async fn start_real_nodes(
        &mut self,
        clusters: &mut [Cluster],
        bins: &NodeBinaries,
        opts: &Options,
    ) -> Result<()> {
        let net = self
            .node_net
            .clone()
            .context("real nodes need the node network")?;
        let t = Instant::now();
        for (i, c) in clusters.iter_mut().enumerate() {
            let dns_ip = net.add_dns_address(i)?;
            self.dns
                .push(ClusterDns::start(dns_ip, c.client.clone()).await?);
            let name = format!("{}-real-0", c.name);
            let node = RealNode::start(&net, c, &name, bins, dns_ip, opts.step_timeout).await?;
            c.real_node = Some((name, node.ip));
            self.real_nodes.push(node);
        }
        eprintln!(
            "e2e: {} real node(s) Ready ({:.1}s)",
            self.real_nodes.len(),
            t.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Waits for `probe`, failing early (with the process log) if one of `procs` exits, and on
    /// timeout with the tails of their logs.
    async fn wait<F, Fut>(
        &mut self,
        what: &str,
        procs: &[&str],
        timeout: Duration,
        probe: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        self.procs_mut()
            .wait_for(what, Some(procs), timeout, probe)
            .await
    }

    /// Every cluster, in start order.
    pub fn clusters(&self) -> &[Cluster] {
        &self.clusters
    }

    /// The cluster named `name`.
    pub fn cluster(&self, name: &str) -> Result<&Cluster> {
        self.clusters
            .iter()
            .find(|c| c.name == name)
            .with_context(|| format!("no cluster named {name}"))
    }

    /// The shared etcd's client URL.
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The work dir (logs, kubeconfigs, certs, etcd data).
    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    /// Keeps the work dir on disk after the control plane stops.
    pub fn keep_work_dir(&mut self) {
        if let Some(tmp) = self.tmp.take() {
            let _ = tmp.keep();
        }
    }

    /// The real nodes ([`Options::real_nodes`]), one per cluster in cluster order.
    pub fn real_nodes(&self) -> &[RealNode] {
        &self.real_nodes
    }

    /// The real node of cluster `name`.
    pub fn real_node(&self, cluster: &str) -> Result<&RealNode> {
        let c = self.cluster(cluster)?;
        let (node, _) = c
            .real_node
            .as_ref()
            .with_context(|| format!("cluster {cluster} has no real node (Options::real_nodes)"))?;
        self.real_nodes
            .iter()
            .find(|n| &n.name == node)
            .with_context(|| format!("no real node {node}"))
    }

    fn procs_mut(&mut self) -> &mut Processes {
        procs_of(&mut self.procs)
    }

    fn procs_locked(&self) -> std::sync::MutexGuard<'_, Processes> {
        self.procs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Crashes cluster `cluster`'s kube-apiserver (SIGKILL: its clients get connection refused,
    /// its `kubernetes` endpoints stay) and with it that cluster's controller-manager and
    /// scheduler, which in a real control plane exit when they cannot renew their leader lease
    /// and start afresh when the apiserver is back (the harness runs them without leader
    /// election; kept running, the controller-manager would judge the nodes by heartbeats it
    /// could not see during the outage and mark them NotReady at once). Returns what
    /// [`ControlPlane::start_again`] starts again.
    pub fn stop_apiserver(&self, cluster: &str) -> Result<Vec<Downed>> {
        self.cluster(cluster)?;
        let mut procs = self.procs_locked();
        [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ]
        .iter()
        .map(|daemon| procs.take_down(&format!("{cluster}/{daemon}")))
        .collect()
    }

    /// Crashes the etcd every apiserver shares (all clusters lose their storage at once; their
    /// apiservers keep running and fail their requests), and, as in
    /// [`ControlPlane::stop_apiserver`], every cluster's controller-manager and scheduler.
    pub fn stop_etcd(&self) -> Result<Vec<Downed>> {
        let mut procs = self.procs_locked();
        let mut downed = vec![procs.take_down("etcd")?];
        for c in &self.clusters {
            for daemon in ["kube-controller-manager", "kube-scheduler"] {
                downed.push(procs.take_down(&format!("{}/{daemon}", c.name))?);
            }
        }
        Ok(downed)
    }

    /// Starts what [`ControlPlane::stop_apiserver`] or [`ControlPlane::stop_etcd`] stopped, in
    /// order: the apiserver or etcd first, and once every apiserver answers `/readyz` (after an
    /// etcd outage they reconnect by themselves) the controller-managers and schedulers. Returns
    /// how long until the apiservers were ready.
    pub async fn start_again(&self, downed: Vec<Downed>, timeout: Duration) -> Result<Duration> {
        let t = Instant::now();
        let mut downed = downed.into_iter();
        let first = downed.next().context("nothing was stopped")?;
        let name = first.name().to_string();
        self.procs_locked().bring_up(first)?;
        for c in &self.clusters {
            crate::harness::wait_until(
                &format!(
                    "{} kube-apiserver /readyz after {name} was started again",
                    c.name
                ),
                timeout.saturating_sub(t.elapsed()),
                || async {
                    self.procs_locked()
                        .check_alive()
                        .map_err(crate::harness::fatal)?;
                    Ok(get_text(&c.client, "/readyz").await?.trim() == "ok")
                },
            )
            .await?;
        }
        let ready = t.elapsed();
        for rest in downed {
            self.procs_locked().bring_up(rest)?;
        }
        Ok(ready)
    }

    /// The harness's processes (to start more, e.g. hub and agents, or stop one).
    pub fn processes(&mut self) -> &mut Processes {
        self.procs_mut()
    }

    /// Prints the log tails of `names` on stderr when `result` is an error (a bench's failure
    /// shows what the daemon said), before the control plane is stopped.
    pub fn log_tails_on_error<T>(&mut self, result: &Result<T>, names: &[&str]) {
        if result.is_err() {
            eprintln!("log tails:\n{}", self.procs_mut().log_tails(Some(names)));
        }
    }

    /// `(process name, RSS KiB)` of every running process.
    pub fn rss_kib(&self) -> Vec<(String, u64)> {
        self.procs_locked()
            .all()
            .iter()
            .map(|p| (p.name.clone(), p.rss_kib().unwrap_or(0)))
            .collect()
    }

    /// Sum of the RSS of every process, KiB.
    pub fn total_rss_kib(&self) -> u64 {
        self.rss_kib().iter().map(|(_, k)| k).sum()
    }

    /// A multi-line RSS report per process and in total.
    pub fn rss_report(&self) -> String {
        let mut out = String::new();
        for (name, kib) in self.rss_kib() {
            out.push_str(&format!("  {name:<34} {:>6} MiB\n", kib / 1024));
        }
        out.push_str(&format!(
            "  {:<34} {:>6} MiB\n",
            "total",
            self.total_rss_kib() / 1024
        ));
        out
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let t = Instant::now();
        // Nodes first (their cleanup needs no apiserver), then the control plane, then the bridge.
        self.real_nodes.clear();
        self.dns.clear();
        self.procs_mut().stop_all();
        self.node_net = None;
        eprintln!(
            "e2e: control plane stopped ({:.1}s){}",
            t.elapsed().as_secs_f64(),
            if self.tmp.is_none() {
                format!("; work dir kept: {}", self.work_dir.display())
            } else {
                String::new()
            }
        );
    }
}

/// The processes behind the control plane's lock, borrowed through the field alone (so that the
/// other fields can be read in the same call).
fn procs_of(procs: &mut std::sync::Mutex<Processes>) -> &mut Processes {
    procs
        .get_mut()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn etcd_healthy(port: u16) -> Result<bool> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    conn.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut body = String::new();
    conn.read_to_string(&mut body).await?;
    Ok(body.contains("\"health\":\"true\""))
}

fn fake_node(name: &str, tainted: bool) -> Result<Node> {
    let taints = if tainted {
        serde_json::json!([{"key": KWOK_TAINT_KEY, "value": "true", "effect": "NoSchedule"}])
    } else {
        serde_json::json!([])
    };
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", KWOK_NODE_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok"
            }
        },
        "spec": {"taints": taints},
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}
        }
    }))?)
}

/// Whether a node has condition `Ready=True`.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Names of the nodes of a cluster (for debugging output).
pub async fn node_names(client: &Client) -> Result<Vec<String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(nodes
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect())
}

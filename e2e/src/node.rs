//! Real nodes: kubelet + kube-proxy + containerd + runc + CNI (bridge, host-local, portmap,
//! loopback), each node in its own network namespace joined to a host bridge, so that pods run real
//! containers (images from `e2e/images/build.sh`, loaded with `ctr images import`).
//!
//! Addresses come from 198.18.0.0/15 only: per run a bridge subnet `198.18.<k>.0/24` (host
//! `198.18.<k>.1`, node `j` at `198.18.<k>.<10 + j>`) and per node a pod subnet
//! `198.19.<4k + j>.0/24`; Services use [`crate::cluster::SERVICE_CIDR`] (198.19.240.0/20).
//!
//! Everything a node makes is undone when it is dropped, also after a failed start: processes
//! (kubelet, kube-proxy, containerd) by pid, container shims and container processes by the pids
//! containerd recorded, `kube-proxy --cleanup`, the node's cgroups, every mount under its directory
//! (overlay rootfs, shm, pod netns, kubelet volumes), its netns (and with it every iptables rule
//! kubelet, kube-proxy and the CNI plugins wrote, which all live in that netns); [`NodeNetwork`]
//! removes its bridge when the last node is gone, and the host's own state (kernel settings kubelet
//! changes, fixed directories) is put back when the last run on this machine using it ends
//! (several test processes may run real nodes at once: `host`).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::cluster::{Cluster, node_ready};

mod host;
use crate::process::Processes;

/// Environment variable naming the directory holding `kubelet` and `kube-proxy`.
pub const NODE_BIN_DIR_ENV: &str = "FLOWER_ADDON_NODE_BIN";
/// Environment variable naming the directory of OCI archives (default: `e2e/images/build.sh`'s).
pub const IMAGES_DIR_ENV: &str = "FLOWER_ADDON_IMAGES";
/// The pod sandbox image (containerd's `sandbox_image`), built by `e2e/images/build.sh`.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.2";
/// Label every real node carries (`flower-addon.io/e2e-node=real`); kwok nodes carry `type=kwok`.
pub const REAL_NODE_LABEL: (&str, &str) = ("flower-addon.io/e2e-node", "real");

/// [`RealNode::local_volume`]'s objects; `{name}`, `{path}`, `{label}` and `{value}` are filled in.
const LOCAL_VOLUME: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: e2e-local}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: "{name}"}
spec:
  capacity: {storage: 64Mi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: e2e-local
  local: {path: "{path}"}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions: [{key: "{label}", operator: In, values: ["{value}"]}]
"#;
/// A node's [`NodeResources`], in its directory.
const NODE_STATE_FILE: &str = "node-state.json";
/// Where the Debian package containernetworking-plugins installs the CNI plugins.
const CNI_BIN_DIR: &str = "/usr/lib/cni";

fn script(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Runs a command to completion; fails with its stderr when it fails.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program} {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a cleanup command, reporting (not failing on) errors.
fn run_quiet(program: &str, args: &[&str]) {
    if let Err(e) = run(program, args) {
        eprintln!("e2e: cleanup: {e:#}");
    }
}

/// Paths of everything a real node runs.
#[derive(Debug, Clone)]
pub struct NodeBinaries {
    /// `kubelet` (built by `e2e/node/build.sh`).
    pub kubelet: PathBuf,
    /// `kube-proxy` (built by `e2e/node/build.sh`).
    pub kube_proxy: PathBuf,
    /// `containerd` (Debian package).
    pub containerd: PathBuf,
    /// `ctr` (Debian package containerd).
    pub ctr: PathBuf,
    /// `nsenter` (util-linux): starts the node's processes in its network namespace only (the
    /// mount namespace stays the host's, so kubelet's volume mounts are what containerd sees).
    pub nsenter: PathBuf,
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl NodeBinaries {
    /// Finds kubelet and kube-proxy via `$FLOWER_ADDON_NODE_BIN` or `e2e/node/build.sh
    /// --print-bin-dir`, and containerd, runc, ctr, ip, nsenter, iptables and the CNI plugins on
    /// the machine. Fails (never skips) naming what is missing and how to get it.
    pub fn locate() -> Result<Self> {
        let build = script("node/build.sh");
        let how = format!(
            "run `{}` (installs containerd, runc, containernetworking-plugins, iptables and builds \
             kubelet and kube-proxy; cold ~1-2 min after e2e/k8s/build.sh) or set {NODE_BIN_DIR_ENV}",
            build.display()
        );
        let dir = match std::env::var_os(NODE_BIN_DIR_ENV) {
            Some(d) => PathBuf::from(d),
            None => {
                let out = Command::new(&build)
                    .arg("--print-bin-dir")
                    .output()
                    .with_context(|| format!("running {} --print-bin-dir", build.display()))?;
                if !out.status.success() {
                    bail!(
                        "{} --print-bin-dir failed: {}",
                        build.display(),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            }
        };
        let in_dir = |name: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                bail!("missing {}; {how}", p.display())
            }
        };
        let machine = |name: &str| -> Result<PathBuf> {
            on_path(name).with_context(|| format!("{name} is not installed; {how}"))
        };
        for tool in ["runc", "ip", "iptables", "mount", "umount"] {
            machine(tool)?;
        }
        for plugin in ["bridge", "host-local", "portmap", "loopback"] {
            let p = Path::new(CNI_BIN_DIR).join(plugin);
            if !p.is_file() {
                bail!("missing CNI plugin {}; {how}", p.display());
            }
        }
        Ok(Self {
            kubelet: in_dir("kubelet")?,
            kube_proxy: in_dir("kube-proxy")?,
            containerd: machine("containerd")?,
            ctr: machine("ctr")?,
            nsenter: machine("nsenter")?,
        })
    }
}

/// One image archive of `e2e/images/build.sh`.
#[derive(Debug, Clone)]
pub struct ImageArchive {
    /// Full reference, e.g. `docker.io/flwr/superlink:1.42.0`.
    pub reference: String,
    /// The OCI archive.
    pub file: PathBuf,
}

/// The images `e2e/images/build.sh` built (its `images.tsv`), from `$FLOWER_ADDON_IMAGES` or the
/// cache. Fails, naming the script, when the index or an archive is missing.
pub fn image_archives() -> Result<Vec<ImageArchive>> {
    let dir = match std::env::var_os(IMAGES_DIR_ENV) {
        Some(d) => PathBuf::from(d),
        None => {
            let cache = std::env::var_os("FLOWER_ADDON_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/flower-addon"))
                })
                .context("neither FLOWER_ADDON_CACHE nor HOME is set")?;
            cache.join("images/oci")
        }
    };
    let how = format!(
        "build the images first: run `{}` (or set {IMAGES_DIR_ENV})",
        script("images/build.sh").display()
    );
    let index = dir.join("images.tsv");
    let text = std::fs::read_to_string(&index)
        .with_context(|| format!("reading {}; {how}", index.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (reference, file) = l
                .split_once('\t')
                .with_context(|| format!("bad line in {}: {l:?}", index.display()))?;
            Ok(ImageArchive {
                reference: reference.to_string(),
                file: dir.join(file),
            })
        })
        .collect()
}

/// The archive of image `reference` (full or short, e.g. `flwr/superlink:1.42.0`).
pub fn image_archive(reference: &str) -> Result<ImageArchive> {
    let all = image_archives()?;
    let full = normalize_reference(reference);
    let found = all
        .into_iter()
        .find(|a| a.reference == full)
        .with_context(|| format!("no image {full} in the images index"))?;
    if !found.file.is_file() {
        bail!(
            "missing {}; run {}",
            found.file.display(),
            script("images/build.sh").display()
        );
    }
    Ok(found)
}

/// Docker-style normalization: `flwr/superlink:1` → `docker.io/flwr/superlink:1`, `debian:x` →
/// `docker.io/library/debian:x`.
pub fn normalize_reference(reference: &str) -> String {
    let first = reference.split('/').next().unwrap_or_default();
    let has_domain = reference.contains('/')
        && (first.contains('.') || first.contains(':') || first == "localhost");
    if has_domain {
        reference.to_string()
    } else if reference.contains('/') {
        format!("docker.io/{reference}")
    } else {
        format!("docker.io/library/{reference}")
    }
}

fn random_u16() -> Result<u16> {
    use std::io::Read;
    let mut buf = [0u8; 2];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(u16::from_le_bytes(buf))
}

/// A host bridge in `198.18.<k>.0/24` that every node of one run joins; removed on drop.
#[derive(Debug)]
pub struct NodeNetwork {
    k: u8,
    bridge: String,
    next_node: AtomicU8,
    /// What the nodes change on the host (fixed directories, the `/run/netns` mount, kernel
    /// settings kubelet writes): put back when the last run using the host ends.
    _host: host::HostUse,
}

fn is_mount_point(path: &str) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(path))
}

impl NodeNetwork {
    /// Creates the bridge on a subnet no interface of this machine uses yet.
    pub fn create() -> Result<Arc<Self>> {
        reap_orphans();
        let used = run("ip", &["-4", "-o", "addr", "show"])?;
        let start = random_u16()?;
        for i in 0..59u16 {
            let k = u8::try_from(1 + (start.wrapping_add(i) % 59)).unwrap_or(1);
            if used.contains(&format!(" 198.18.{k}.")) {
                continue;
            }
            let bridge = format!("fae2e{k}br");
            if Path::new("/sys/class/net").join(&bridge).exists() {
                continue;
            }
            let net = Self {
                k,
                bridge,
                next_node: AtomicU8::new(0),
                _host: host::HostUse::take()?,
            };
            run("ip", &["link", "add", &net.bridge, "type", "bridge"])?;
            let up = (|| -> Result<()> {
                run(
                    "ip",
                    &[
                        "addr",
                        "add",
                        &format!("{}/24", net.host_ip()),
                        "dev",
                        &net.bridge,
                    ],
                )?;
                run("ip", &["link", "set", &net.bridge, "up"])?;
                Ok(())
            })();
            // On error `net` is dropped here, which deletes the bridge.
            up?;
            eprintln!(
                "e2e: node network {} on {} (198.18.{k}.0/24)",
                net.bridge,
                net.host_ip()
            );
            return Ok(Arc::new(net));
        }
        bail!("no free 198.18.<k>.0/24 subnet for the node bridge (k = 1..59 all in use)")
    }

    /// The host's address on the bridge (where apiservers listen for the nodes).
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.k, 1)
    }

    /// The bridge's name.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// The host address of cluster `i`'s DNS server ([`crate::dns::ClusterDns`]), added to the
    /// bridge: `198.18.<k>.<2 + i>`.
    pub fn add_dns_address(&self, i: usize) -> Result<Ipv4Addr> {
        let last = u8::try_from(2 + i)
            .ok()
            .filter(|l| *l < 10)
            .context("at most 8 cluster DNS servers per node network")?;
        let ip = Ipv4Addr::new(198, 18, self.k, last);
        run(
            "ip",
            &["addr", "add", &format!("{ip}/32"), "dev", &self.bridge],
        )?;
        Ok(ip)
    }

    fn allocate(&self) -> Result<u8> {
        let j = self.next_node.fetch_add(1, Ordering::SeqCst);
        if j >= 4 {
            bail!("at most 4 real nodes per node network");
        }
        Ok(j)
    }
}

impl Drop for NodeNetwork {
    fn drop(&mut self) {
        run_quiet("ip", &["link", "del", &self.bridge]);
        // Then `_host` is dropped: the host is put back if no other run uses it.
    }
}

/// A running real node; everything it made is removed when it is dropped.
pub struct RealNode {
    /// Node name (as registered with the apiserver).
    pub name: String,
    /// The node's address on the bridge (its InternalIP; NodePorts answer here).
    pub ip: Ipv4Addr,
    /// Pod subnet of this node.
    pub pod_cidr: String,
    /// Time from start to Ready.
    pub startup: Duration,
    /// The cluster DNS server pods use (kubelet's `clusterDNS`).
    pub cluster_dns: Ipv4Addr,
    dir: PathBuf,
    netns: String,
    host_veth: String,
    cgroup_root: String,
    /// Behind a lock so that a power cut ([`RealNode::power_cycle`]) can be caused while the
    /// test holds the node (`&self`).
    procs: std::sync::Mutex<Processes>,
    bins: NodeBinaries,
    _net: Arc<NodeNetwork>,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("name", &self.name)
            .field("ip", &self.ip)
            .field("pod_cidr", &self.pod_cidr)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl RealNode {
    /// Starts a real node named `name` for `cluster` (whose apiserver must listen on
    /// `net.host_ip()`), in `<cluster dir>/<name>`, and waits until it is Ready.
    pub async fn start(
        net: &Arc<NodeNetwork>,
        cluster: &Cluster,
        name: &str,
        bins: &NodeBinaries,
        cluster_dns: Ipv4Addr,
        timeout: Duration,
    ) -> Result<Self> {
        let t0 = Instant::now();
        let j = net.allocate()?;
        let k = net.k;
        let dir = cluster.dir().join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut node = Self {
            name: name.to_string(),
            ip: Ipv4Addr::new(198, 18, k, 10 + j),
            pod_cidr: format!("198.19.{}.0/24", 4 * u16::from(k) + u16::from(j)),
            cluster_dns,
            startup: Duration::ZERO,
            dir,
            netns: format!("fae2e-{k}-{j}"),
            host_veth: format!("fae2e{k}v{j}"),
            cgroup_root: format!("/fae2e-{k}-{j}"),
            procs: std::sync::Mutex::new(Processes::default()),
            bins: bins.clone(),
            _net: Arc::clone(net),
        };
        // On error `node` is dropped, which undoes what was done so far.
        node.boot(net, cluster, timeout).await.with_context(|| {
            format!(
                "real node {name} failed to start (logs under {})",
                node.dir.display()
            )
        })?;
        node.startup = t0.elapsed();
        eprintln!(
            "e2e: real node {} Ready on {} (pods {}) in {:.1}s",
            node.name,
            node.ip,
            node.pod_cidr,
            node.startup.as_secs_f64()
        );
        Ok(node)
    }

    fn resources(&self) -> NodeResources {
        NodeResources {
            dir: self.dir.clone(),
            netns: self.netns.clone(),
            host_veth: self.host_veth.clone(),
            cgroup_root: self.cgroup_root.clone(),
            bridge: self._net.bridge.clone(),
        }
    }

    /// The node's directory (configs, logs, containerd and kubelet state).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A `local` PersistentVolume `name` (64 MiB) on this node, of StorageClass `e2e-local`
    /// (no provisioner, `WaitForFirstConsumer`: the harness has no provisioner, and `local`
    /// volumes get the pod's fsGroup as provisioned ones do). Returns its directory (created
    /// under the node's) and the StorageClass + PersistentVolume YAML to apply.
    pub fn local_volume(&self, name: &str) -> Result<(PathBuf, String)> {
        let path = self.dir.join("volumes").join(name);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        let yaml = LOCAL_VOLUME
            .replace("{name}", name)
            .replace("{path}", &path.display().to_string())
            .replace("{label}", REAL_NODE_LABEL.0)
            .replace("{value}", REAL_NODE_LABEL.1);
        Ok((path, yaml))
    }

    /// The containerd socket of this node.
    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// `(process name, RSS KiB)` of the node's processes.
    pub fn rss_kib(&self) -> Vec<(String, u64)> {
        self.procs_locked()
            .all()
            .iter()
            .map(|p| (p.name.clone(), p.rss_kib().unwrap_or(0)))
            .collect()
    }

    /// Starts `program args…` in the node's network namespace as process `<node>/<what>`,
    /// logging to `<node dir>/<what>.log`.
    fn start_in_netns(&mut self, what: &str, program: &Path, args: &[String]) -> Result<()> {
        let mut argv = vec![
            format!("--net=/run/netns/{}", self.netns),
            "--".to_string(),
            program.display().to_string(),
        ];
        argv.extend(args.iter().cloned());
        let nsenter = self.bins.nsenter.clone();
        let log = self.dir.join(format!("{what}.log"));
        self.procs_locked()
            .start(&format!("{}/{what}", self.name), &nsenter, &argv, &log)
    }

    /// Runs `program args…` inside the node's network namespace, to completion.
    pub fn exec_in_netns(&self, program: &str, args: &[&str]) -> Result<String> {
        let mut v = vec![
            format!("--net=/run/netns/{}", self.netns),
            "--".into(),
            program.into(),
        ];
        v.extend(args.iter().map(|a| a.to_string()));
        let refs: Vec<&str> = v.iter().map(String::as_str).collect();
        run("nsenter", &refs)
    }

    /// Cuts this node (and its pods, whose traffic passes its netns's FORWARD chain) off from
    /// `peers` (addresses or CIDRs), both directions: DROP rules at the top of INPUT, OUTPUT and
    /// FORWARD in its netns. Connections hang as on a cut link (no reset). The returned
    /// [`Partition`] heals it ([`Partition::heal`], or when dropped); the rules would go with the
    /// netns anyway.
    pub fn partition_from(&self, peers: &[String]) -> Result<Partition> {
        let mut partition = Partition {
            netns: self.netns.clone(),
            rules: Vec::new(),
        };
        for peer in peers {
            for rule in [
                ["INPUT", "-s"],
                ["OUTPUT", "-d"],
                ["FORWARD", "-s"],
                ["FORWARD", "-d"],
            ] {
                let rule = vec![
                    rule[0].to_string(),
                    rule[1].to_string(),
                    peer.clone(),
                    "-j".to_string(),
                    "DROP".to_string(),
                ];
                partition.iptables("-I", &rule)?;
                partition.rules.push(rule);
            }
        }
        Ok(partition)
    }

    /// A power cut and a reboot of this node: kubelet, kube-proxy, containerd and every container
    /// killed at once (SIGKILL), what a reboot loses removed (every mount under the node's
    /// directory, containerd's and runc's state, which live in /run on a real node, and the pod
    /// cgroups), and after `off` containerd, kubelet and kube-proxy started again as they were,
    /// on their persistent state (images and snapshots, kubelet's directory, CNI IPAM). The node's
    /// netns (its "NIC") stays. Returns how long after the start kubelet answered its healthz
    /// and the node was Ready with a heartbeat of the new kubelet.
    pub async fn power_cycle(
        &self,
        cluster: &Cluster,
        off: Duration,
        timeout: Duration,
    ) -> Result<Duration> {
        let res = self.resources();
        let mut downed = Vec::new();
        {
            let mut procs = self.procs_locked();
            for daemon in ["containerd", "kubelet", "kube-proxy"] {
                downed.push(procs.take_down(&format!("{}/{daemon}", self.name))?);
            }
        }
        kill_containers(&res);
        remove_host_leftovers(&self.dir, &self.netns);
        unmount_all(&res);
        for volatile in ["containerd/state", "containerd/runc"] {
            let path = self.dir.join(volatile);
            if path.exists() {
                std::fs::remove_dir_all(&path)
                    .with_context(|| format!("removing {} (power cut)", path.display()))?;
            }
        }
        remove_cgroups(&res, false);
        tokio::time::sleep(off).await;

        let t = Instant::now();
        // Heartbeats are written to the second.
        let started = k8s_openapi::jiff::Timestamp::now().as_second();
        let mut downed = downed.into_iter();
        let containerd = downed.next().context("containerd was not taken down")?;
        self.procs_locked().bring_up(containerd)?;
        self.wait(
            timeout,
            "containerd answering after the power cut",
            || async { Ok(self.ctr(&["version"]).is_ok()) },
        )
        .await?;
        for daemon in downed {
            self.procs_locked().bring_up(daemon)?;
        }
        self.wait(timeout, "kubelet healthz after the power cut", || async {
            Ok(healthz_in_netns(&self.netns, 10248))
        })
        .await?;
        let nodes: Api<Node> = Api::all(cluster.client.clone());
        self.wait(timeout, "node Ready after the power cut", || {
            let nodes = nodes.clone();
            let name = self.name.clone();
            async move {
                let Some(node) = nodes.get_opt(&name).await? else {
                    return Ok(false);
                };
                let heartbeat = node
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                    .and_then(|c| c.last_heartbeat_time.as_ref())
                    .is_some_and(|h| h.0.as_second() >= started);
                Ok(heartbeat && node_ready(&node))
            }
        })
        .await?;
        Ok(t.elapsed())
    }

    /// `ctr -a <node socket> -n k8s.io ARGS…`.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let sock = self.containerd_socket().display().to_string();
        let mut v = vec!["-a", sock.as_str(), "-n", "k8s.io"];
        v.extend_from_slice(args);
        run(&self.bins.ctr.display().to_string(), &v)
    }

    /// Loads images into the node's containerd (`ctr images import`), so pods with
    /// `imagePullPolicy: IfNotPresent` run them without a registry. Returns the time it took.
    pub fn import_images(&self, images: &[ImageArchive]) -> Result<Duration> {
        let t = Instant::now();
        for img in images {
            let t1 = Instant::now();
            let file = img.file.display().to_string();
            // The archives name their manifest with the full reference
            // (org.opencontainers.image.ref.name, written by `buildah push`), which ctr uses as
            // the image name. (`--index-name` failed once in ~10 imports with containerd 1.6.20:
            // "content digest sha256:…: not found" for the index blob it had just written.)
            let mut attempt = 0;
            loop {
                attempt += 1;
                match self.ctr(&["images", "import", &file]) {
                    Ok(_) => break,
                    Err(e) if attempt < 3 => {
                        crate::harness::retried(
                            "image-import",
                            format_args!(
                                "{}: the import of {} failed: {e:#}",
                                self.name, img.reference
                            ),
                        );
                    }
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!("importing {} into {}", img.reference, self.name)
                        });
                    }
                }
            }
            let listed = self.ctr(&["images", "ls", "-q"])?;
            if !listed.lines().any(|l| l.trim() == img.reference) {
                bail!(
                    "{} is not in {}'s containerd after importing {file} (images: {})",
                    img.reference,
                    self.name,
                    listed.split_whitespace().collect::<Vec<_>>().join(", ")
                );
            }
            eprintln!(
                "e2e: {}: imported {} ({:.1}s)",
                self.name,
                img.reference,
                t1.elapsed().as_secs_f64()
            );
        }
        Ok(t.elapsed())
    }

    async fn boot(
        &mut self,
        net: &NodeNetwork,
        cluster: &Cluster,
        timeout: Duration,
    ) -> Result<()> {
        std::fs::write(
            self.dir.join(NODE_STATE_FILE),
            serde_json::to_vec_pretty(&self.resources())?,
        )?;
        self.make_netns(net)?;
        self.make_cgroups()?;
        self.write_configs(net, cluster)?;

        // containerd (CNI plugins run from it, so it lives in the node's netns).
        let containerd = self.bins.containerd.clone();
        self.start_in_netns(
            "containerd",
            &containerd,
            &[format!(
                "--config={}",
                self.dir.join("containerd.toml").display()
            )],
        )?;
        let sock = self.containerd_socket();
        self.wait(timeout, "containerd socket", || {
            let sock = sock.clone();
            async move { Ok(sock.exists()) }
        })
        .await?;
        let pause = image_archive(PAUSE_IMAGE)?;
        self.import_images(&[pause])?;

        // kubelet.
        let kubelet = self.bins.kubelet.clone();
        self.start_in_netns(
            "kubelet",
            &kubelet,
            &[
                format!("--config={}", self.dir.join("kubelet.yaml").display()),
                format!("--root-dir={}", self.dir.join("kubelet").display()),
                format!("--cert-dir={}", self.dir.join("kubelet/pki").display()),
                format!("--kubeconfig={}", self.dir.join("kubeconfig").display()),
                format!("--hostname-override={}", self.name),
                format!("--node-ip={}", self.ip),
                format!("--node-labels={}={}", REAL_NODE_LABEL.0, REAL_NODE_LABEL.1),
                "--v=1".into(),
            ],
        )?;
        let nodes: Api<Node> = Api::all(cluster.client.clone());
        let name = self.name.clone();
        self.wait(timeout, "node registered", || {
            let nodes = nodes.clone();
            let name = name.clone();
            async move { Ok(nodes.get_opt(&name).await?.is_some()) }
        })
        .await?;

        // kube-proxy (iptables mode, NodePorts on the node's address only).
        let proxy = self.bins.kube_proxy.clone();
        self.start_in_netns(
            "kube-proxy",
            &proxy,
            &[
                format!("--kubeconfig={}", self.dir.join("kubeconfig").display()),
                format!("--hostname-override={}", self.name),
                "--proxy-mode=iptables".into(),
                format!("--nodeport-addresses={}/32", self.ip),
                format!("--cluster-cidr={}", self.pod_cidr),
                "--healthz-bind-address=127.0.0.1:10256".into(),
                "--metrics-bind-address=127.0.0.1:10249".into(),
                // 0: leave the host's conntrack sysctls alone.
                "--conntrack-max-per-core=0".into(),
                "--conntrack-tcp-timeout-established=0".into(),
                "--conntrack-tcp-timeout-close-wait=0".into(),
            ],
        )?;
        self.wait(timeout, "node Ready", || {
            let nodes = nodes.clone();
            let name = name.clone();
            async move { Ok(nodes.get_opt(&name).await?.as_ref().is_some_and(node_ready)) }
        })
        .await?;
        // kube-proxy's healthz answers 200 once it has synced its rules.
        self.wait(timeout, "kube-proxy healthz", || async {
            Ok(healthz_in_netns(&self.netns, 10256))
        })
        .await?;
        Ok(())
    }

    async fn wait<F, Fut>(&self, timeout: Duration, what: &str, mut probe: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        let what = format!("{what} of {}", self.name);
        let waited = crate::harness::wait_until(&what, timeout, || {
            let alive = self
                .procs_locked()
                .check_alive()
                .map_err(crate::harness::fatal);
            let fut = probe();
            async move {
                alive?;
                fut.await
            }
        })
        .await;
        match waited {
            Ok(_) => Ok(()),
            Err(e) if crate::harness::is_fatal(&e) => Err(e),
            Err(e) => bail!("{e:#}{}", self.procs_locked().log_tails(None)),
        }
    }

    fn procs_locked(&self) -> std::sync::MutexGuard<'_, Processes> {
        self.procs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn make_netns(&mut self, net: &NodeNetwork) -> Result<()> {
        let ns = self.netns.clone();
        if Path::new("/run/netns").join(&ns).exists() {
            // A leftover of a killed run with the same subnet (the subnet check makes this rare).
            run_quiet("ip", &["netns", "del", &ns]);
        }
        run("ip", &["netns", "add", &ns])?;
        let peer = format!("{}p", self.host_veth);
        run(
            "ip",
            &[
                "link",
                "add",
                &self.host_veth,
                "type",
                "veth",
                "peer",
                "name",
                &peer,
            ],
        )?;
        run(
            "ip",
            &["link", "set", &self.host_veth, "master", net.bridge(), "up"],
        )?;
        run("ip", &["link", "set", &peer, "netns", &ns])?;
        let inns = |args: &[&str]| -> Result<String> {
            let mut v = vec!["netns", "exec", ns.as_str()];
            v.extend_from_slice(args);
            run("ip", &v)
        };
        inns(&["ip", "link", "set", &peer, "name", "eth0"])?;
        inns(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", self.ip),
            "dev",
            "eth0",
        ])?;
        inns(&["ip", "link", "set", "eth0", "up"])?;
        inns(&["ip", "link", "set", "lo", "up"])?;
        inns(&[
            "ip",
            "route",
            "add",
            "default",
            "via",
            &net.host_ip().to_string(),
        ])?;
        // Per-netns settings: routing for pods, and bridged pod traffic through iptables (Service
        // hairpin); the latter exists only where br_netfilter is loaded.
        let nsenter_sysctl = |key: &str, value: &str| -> Result<()> {
            let path = format!("/proc/sys/{key}");
            if Path::new(&path).exists() {
                run(
                    "nsenter",
                    &[
                        &format!("--net=/run/netns/{ns}"),
                        "--",
                        "sh",
                        "-c",
                        &format!("echo {value} > {path}"),
                    ],
                )?;
            }
            Ok(())
        };
        nsenter_sysctl("net/ipv4/ip_forward", "1")?;
        nsenter_sysctl("net/bridge/bridge-nf-call-iptables", "1")?;
        Ok(())
    }

    /// kubelet refuses a `cgroupRoot` that does not exist: make it in every v1 hierarchy. In
    /// the cpu hierarchy the node weighs [`NODE_CPU_SHARES`].
    fn make_cgroups(&self) -> Result<()> {
        for hierarchy in cgroup_hierarchies() {
            let dir = hierarchy.join(self.cgroup_root.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let shares = dir.join("cpu.shares");
            if shares.exists() {
                std::fs::write(&shares, NODE_CPU_SHARES.to_string())
                    .with_context(|| format!("writing {}", shares.display()))?;
            }
            if hierarchy.ends_with("cpuset") {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let v = std::fs::read_to_string(hierarchy.join(f))?;
                    std::fs::write(dir.join(f), v.trim())
                        .with_context(|| format!("writing {}", dir.join(f).display()))?;
                }
            }
        }
        Ok(())
    }

    fn write_configs(&self, net: &NodeNetwork, cluster: &Cluster) -> Result<()> {
        let d = &self.dir;
        let p = |rel: &str| d.join(rel).display().to_string();
        for sub in ["cni/net.d", "cni/ipam", "pod-logs", "kubelet", "containerd"] {
            std::fs::create_dir_all(d.join(sub))?;
        }
        std::fs::write(
            d.join("containerd.toml"),
            format!(
                r#"version = 2
root = "{root}"
state = "{state}"
oom_score = 0
[grpc]
  address = "{sock}"
[ttrpc]
  address = ""
[debug]
  address = ""
  level = "info"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # This sandbox refuses a negative oom_score_adj; without this every sandbox fails with runc's
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  # Pod netns mounts under the node's state dir, where cleanup finds them.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's state per node (default /run/containerd/runc, shared by every containerd).
        Root = "{runc_root}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
"#,
                root = p("containerd/root"),
                state = p("containerd/state"),
                sock = self.containerd_socket().display(),
                cni_conf = p("cni/net.d"),
                opt = p("containerd/opt"),
                runc_root = p("containerd/runc"),
            ),
        )?;
        std::fs::write(
            d.join("cni/net.d/10-fae2e.conflist"),
            serde_json::to_string_pretty(&serde_json::json!({
                "cniVersion": "1.0.0",
                "name": self.netns,
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": "cbr0",
                        "isGateway": true,
                        "ipMasq": true,
                        "hairpinMode": true,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": self.pod_cidr}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": p("cni/ipam"),
                        }
                    },
                    {"type": "portmap", "capabilities": {"portMappings": true}}
                ]
            }))?,
        )?;
        // The host's resolvers are not the pods' business: only the cluster DNS answers them.
        std::fs::write(d.join("resolv.conf"), "options ndots:1\n")?;
        std::fs::write(
            d.join("kubelet.yaml"),
            format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroups are v1 on these machines: kubelet >= 1.35 refuses them unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
containerRuntimeEndpoint: unix://{sock}
imageServiceEndpoint: unix://{sock}
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
clusterDomain: {domain}
clusterDNS: ["{cluster_dns}"]
resolvConf: {resolv}
podLogsDir: {pod_logs}
podCIDR: {pod_cidr}
failSwapOn: false
localStorageCapacityIsolation: false
evictionHard: {{memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
# Preloaded images must never be garbage-collected: no registry brings them back.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
syncFrequency: 10s
"#,
                cgroup_root = self.cgroup_root,
                sock = self.containerd_socket().display(),
                ip = self.ip,
                resolv = p("resolv.conf"),
                domain = crate::dns::CLUSTER_DOMAIN,
                cluster_dns = self.cluster_dns,
                pod_logs = p("pod-logs"),
                pod_cidr = self.pod_cidr,
            ),
        )?;
        let _ = net;
        crate::kubeconfig::write(
            &d.join("kubeconfig"),
            &cluster.name,
            &cluster.server,
            &cluster.ca_file,
            "admin",
            &cluster.admin_token,
        )?;
        Ok(())
    }

    /// Undoes everything (idempotent; errors are reported, not returned).
    fn cleanup(&mut self) {
        let t = Instant::now();
        // kubelet and kube-proxy first (so nothing restarts containers), then containerd.
        let mut procs = self.procs_locked();
        for name in ["kubelet", "kube-proxy", "containerd"] {
            let _ = procs.stop(&format!("{}/{name}", self.name));
        }
        procs.stop_all();
        drop(procs);
        let mounts = teardown(&self.resources(), Some(&self.bins.kube_proxy));
        eprintln!(
            "e2e: real node {} cleaned up ({:.1}s, {} mount(s))",
            self.name,
            t.elapsed().as_secs_f64(),
            mounts
        );
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// What a real node made on the host, saved as `node-state.json` in its directory so that a later
/// run can remove the leftovers of one that was killed (see [`reap_orphans`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct NodeResources {
    dir: PathBuf,
    netns: String,
    host_veth: String,
    cgroup_root: String,
    bridge: String,
}

/// Whether `GET /healthz` on `127.0.0.1:port` in netns `netns` answers 200.
fn healthz_in_netns(netns: &str, port: u16) -> bool {
    run(
        "nsenter",
        &[
            &format!("--net=/run/netns/{netns}"),
            "--",
            "bash",
            "-c",
            &format!(
                "exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3"
            ),
        ],
    )
    .is_ok_and(|s| s.contains(" 200"))
}

/// Kills every container process of a node and their shims (SIGKILL), and anything else left in
/// its pod cgroups. containerd, kubelet and kube-proxy are the caller's.
fn kill_containers(res: &NodeResources) {
    // Container processes by the pids runc recorded, then their shims (which outlive
    // containerd): the containerd-shim-runc-v2 processes whose -address is this node's socket.
    let tasks = res
        .dir
        .join("containerd/state/io.containerd.runtime.v2.task");
    let sock = res.dir.join("containerd.sock").display().to_string();
    // A pid file can outlive its container (a task containerd had not deleted when it was taken
    // down, a killed run's node), and pids come round again soon here (pid_max 32768): only a
    // process in this node's cgroups is one of its containers, never another test's hub.
    for pidfile in find_files(&tasks, &["init.pid"]) {
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .filter(|p| *p > 1 && in_cgroup_under(*p, &res.cgroup_root))
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    for pid in shim_pids(&sock) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    // Anything left in the node's pod cgroups.
    for _ in 0..50 {
        let mut alive = 0;
        for h in cgroup_hierarchies() {
            for procs in find_files(
                &h.join(res.cgroup_root.trim_start_matches('/')),
                &["cgroup.procs"],
            ) {
                for pid in std::fs::read_to_string(&procs).unwrap_or_default().lines() {
                    if let Ok(pid) = pid.trim().parse::<i32>() {
                        alive += 1;
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
        }
        if alive == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Unmounts every mount under the node's directory (overlay rootfs, shm, pod netns, kubelet
/// volumes), deepest first; lazily, as a shim may still be exiting. Returns how many.
fn unmount_all(res: &NodeResources) -> usize {
    let prefix = res.dir.display().to_string();
    let mut mounts = mount_points_under(&prefix);
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in &mounts {
        run_quiet("umount", &["--lazy", m]);
    }
    mounts.len()
}

/// Removes the node's cgroups below its root, deepest first; `with_root`: the root too.
fn remove_cgroups(res: &NodeResources, with_root: bool) {
    for h in cgroup_hierarchies() {
        let root = h.join(res.cgroup_root.trim_start_matches('/'));
        let mut dirs = find_dirs(&root);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            if with_root || d != root {
                let _ = std::fs::remove_dir(&d);
            }
        }
    }
}

/// Removes a node's containers, shims, mounts, cgroups, netns (with every iptables rule in it),
/// veth and host files; returns how many mounts it unmounted. Its own processes must be gone.
fn teardown(res: &NodeResources, kube_proxy: Option<&Path>) -> usize {
    kill_containers(res);
    // kube-proxy's and kubelet's iptables rules live in the node's netns and go with it;
    // `kube-proxy --cleanup` first anyway, as a real node would.
    if let Some(proxy) = kube_proxy
        && Path::new("/run/netns").join(&res.netns).exists()
    {
        let _ = run(
            "nsenter",
            &[
                &format!("--net=/run/netns/{}", res.netns),
                "--",
                &proxy.display().to_string(),
                "--cleanup",
            ],
        );
    }
    let mounts = unmount_all(res);
    remove_cgroups(res, true);
    if Path::new("/run/netns").join(&res.netns).exists() {
        run_quiet("ip", &["netns", "del", &res.netns]);
    }
    remove_host_leftovers(&res.dir, &res.netns);
    // Deleting the netns deletes the veth pair too, asynchronously: only a veth that stays is
    // an error.
    let veth = Path::new("/sys/class/net").join(&res.host_veth);
    if veth.exists()
        && let Err(e) = run("ip", &["link", "del", &res.host_veth])
        && veth.exists()
    {
        eprintln!("e2e: cleanup: {e:#}");
    }
    mounts
}

/// Files containerd, the CNI library and kubelet write at fixed host paths whatever their
/// configuration: shim sockets (/run/containerd/s), CNI result caches (/var/lib/cni/results,
/// named after this node's CNI network) and /var/log/containers links into this node's dir.
fn remove_host_leftovers(dir: &Path, netns: &str) {
    let tasks = dir.join("containerd/state/io.containerd.runtime.v2.task");
    for address in find_files(&tasks, &["address"]) {
        if let Ok(a) = std::fs::read_to_string(&address) {
            let path = a.trim().trim_start_matches("unix://");
            if path.starts_with("/run/containerd/s/") {
                let _ = std::fs::remove_file(path);
            }
        }
    }
    // Results are named <network>-<container id>-<ifname>: our network's, and the loopback
    // ones of our sandboxes.
    let prefix = format!("{}-", netns);
    let ids: Vec<String> = [
        tasks.join("k8s.io"),
        dir.join("containerd/state/io.containerd.grpc.v1.cri/sandboxes"),
    ]
    .iter()
    .filter_map(|d| std::fs::read_dir(d).ok())
    .flat_map(|entries| entries.flatten())
    .map(|e| e.file_name().to_string_lossy().into_owned())
    .collect();
    if let Ok(entries) = std::fs::read_dir("/var/lib/cni/results") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let loopback_of_ours = name
                .strip_prefix("cni-loopback-")
                .is_some_and(|rest| ids.iter().any(|id| rest.starts_with(id.as_str())));
            if name.starts_with(&prefix) || loopback_of_ours {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/var/log/containers") {
        for e in entries.flatten() {
            if std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(dir)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Removes what real nodes of killed runs left behind (containers, shims, mounts, cgroups, netns,
/// veths, their bridge): nodes under `$TMPDIR/flower-e2e-*/<cluster>/<node>/` with a
/// `node-state.json` and no live process of theirs (kubelet, kube-proxy and containerd all name
/// the node's directory on their command line). A node of a live run is never touched.
pub fn reap_orphans() {
    let Ok(runs) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    let mut reaped = Vec::new();
    let mut run_dirs = Vec::new();
    for run_dir in runs.flatten() {
        if !run_dir
            .file_name()
            .to_string_lossy()
            .starts_with("flower-e2e-")
        {
            continue;
        }
        let Ok(clusters) = std::fs::read_dir(run_dir.path()) else {
            continue;
        };
        for cluster in clusters.flatten() {
            let Ok(nodes) = std::fs::read_dir(cluster.path()) else {
                continue;
            };
            for node in nodes.flatten() {
                let state = node.path().join(NODE_STATE_FILE);
                let Some(res) = std::fs::read(&state)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<NodeResources>(&b).ok())
                else {
                    continue;
                };
                if node_alive(&res.dir) {
                    continue;
                }
                eprintln!(
                    "e2e: removing the leftovers of a killed run's node in {}",
                    res.dir.display()
                );
                teardown(&res, None);
                let _ = std::fs::remove_file(&state);
                reaped.push(res.bridge);
                run_dirs.push(run_dir.path());
            }
        }
    }
    if reaped.is_empty() {
        return;
    }
    for bridge in reaped {
        let brif = Path::new("/sys/class/net").join(&bridge).join("brif");
        if std::fs::read_dir(&brif).is_ok_and(|mut d| d.next().is_none()) {
            run_quiet("ip", &["link", "del", &bridge]);
        }
    }
    // The killed run's work dir (nothing of it runs any more: its control plane died with it).
    run_dirs.dedup();
    for dir in run_dirs {
        if !node_alive(&dir) && mount_points_under(&dir.display().to_string()).is_empty() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    // Host directories the killed run's components made; empty ones are made again on demand.
    // kubelet's device-plugin socket (a fixed path) is stale when no kubelet runs.
    if !any_process_named("kubelet") {
        let _ = std::fs::remove_file("/var/lib/kubelet/device-plugins/kubelet.sock");
    }
    let netns_empty = std::fs::read_dir("/run/netns").is_ok_and(|mut d| d.next().is_none());
    if netns_empty && is_mount_point("/run/netns") {
        run_quiet("umount", &["/run/netns"]);
    }
    for d in host::HOST_DIRS {
        let _ = std::fs::remove_dir(d);
    }
}

/// Whether a process whose program file is named `name` runs.
fn any_process_named(name: &str) -> bool {
    std::fs::read_dir("/proc").is_ok_and(|entries| {
        entries.flatten().any(|e| {
            std::fs::read_link(e.path().join("exe"))
                .is_ok_and(|exe| exe.file_name().is_some_and(|f| f == name))
        })
    })
}

/// Whether a process other than a container shim names `dir` on its command line.
fn node_alive(dir: &Path) -> bool {
    let needle = dir.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .any(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let text = String::from_utf8_lossy(&cmdline);
            text.contains(needle.as_str()) && !text.starts_with("/usr/bin/containerd-shim")
        })
}

/// Whether process `pid` is in cgroup `root` or below it, in any hierarchy.
fn in_cgroup_under(pid: i32, root: &str) -> bool {
    let root = root.trim_end_matches('/');
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|cgroups| {
        cgroups.lines().any(|line| {
            line.splitn(3, ':').nth(2).is_some_and(|path| {
                path == root
                    || path
                        .strip_prefix(root)
                        .is_some_and(|rest| rest.starts_with('/'))
            })
        })
    })
}

/// Pids of the containerd-shim-runc-v2 processes serving the containerd at `socket`.
fn shim_pids(socket: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.first()
                .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"))
                && args
                    .windows(2)
                    .any(|w| w[0] == b"-address" && w[1] == socket.as_bytes())
        })
        .collect()
}

/// The cgroup v1 hierarchies (and the v2 one, where mounted) under /sys/fs/cgroup.
/// The CPU weight (cgroup v1 `cpu.shares`) of a real node's pods, written so that it is one
/// number to weigh against `./test.sh`'s lanes (2048 each). Flower 1.42's SuperNodes start a
/// ClientApp per message, and it must send its first heartbeat within 30 s (not configurable):
/// at 1024, a cold run's first `flwr run` on the real nodes failed on that window beside the
/// other lanes; at 2048, the processes lane's Flower 1.25 run after a stop hung instead. Both
/// lanes run Flower on the same 2 cores: the weight moves the risk, it does not remove it.
pub const NODE_CPU_SHARES: u32 = 1024;

fn cgroup_hierarchies() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 3
                && (f[2] == "cgroup" || f[2] == "cgroup2")
                && f[1].starts_with("/sys/fs/cgroup/"))
            .then(|| PathBuf::from(f[1]))
        })
        .collect()
}

/// Mount points (from /proc/self/mountinfo) at or under `prefix`.
fn mount_points_under(prefix: &str) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(unescape_mount)
        .filter(|m| m == prefix || m.starts_with(&format!("{prefix}/")))
        .collect()
}

fn unescape_mount(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn find_files(root: &Path, names: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(path);
            } else if names.iter().any(|n| e.file_name() == *n) {
                out.push(path);
            }
        }
    }
    out
}

fn find_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if !dir.is_dir() {
            continue;
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        out.push(dir);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_process_of_the_node_cgroups_counts_as_its_container() {
        // Invariant: a stale init.pid whose pid now belongs to another process (this test's,
        // in no node's cgroup) is not killed as a container.
        let me = i32::try_from(std::process::id()).unwrap();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let path = own.lines().next().unwrap().splitn(3, ':').nth(2).unwrap();
        assert!(in_cgroup_under(me, path), "{own}");
        assert!(!in_cgroup_under(me, "/fae2e-no-such-node"), "{own}");
    }

    #[test]
    fn normalizes_references_like_docker() {
        assert_eq!(
            normalize_reference("flwr/superlink:1.42.0"),
            "docker.io/flwr/superlink:1.42.0"
        );
        assert_eq!(
            normalize_reference("debian:bookworm-slim"),
            "docker.io/library/debian:bookworm-slim"
        );
        assert_eq!(
            normalize_reference("ghcr.io/flower-addon/flower-addon:0.1.0"),
            "ghcr.io/flower-addon/flower-addon:0.1.0"
        );
        assert_eq!(
            normalize_reference("registry.k8s.io/pause:3.10.2"),
            "registry.k8s.io/pause:3.10.2"
        );
    }
}

/// A node cut off from some peers by [`RealNode::partition_from`]; healed by [`Partition::heal`]
/// or on drop.
#[derive(Debug)]
pub struct Partition {
    netns: String,
    rules: Vec<Vec<String>>,
}

impl Partition {
    fn iptables(&self, op: &str, rule: &[String]) -> Result<String> {
        let mut args = vec![
            format!("--net=/run/netns/{}", self.netns),
            "--".to_string(),
            "iptables".to_string(),
            "-w".to_string(),
            op.to_string(),
        ];
        args.extend(rule.iter().cloned());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run("nsenter", &refs)
    }

    /// Removes the DROP rules: the node reaches its peers again.
    pub fn heal(mut self) -> Result<()> {
        // Newest first; what is left after an error is tried again on drop.
        while let Some(rule) = self.rules.last().cloned() {
            self.iptables("-D", &rule)?;
            self.rules.pop();
        }
        Ok(())
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        for rule in std::mem::take(&mut self.rules).into_iter().rev() {
            if let Err(error) = self.iptables("-D", &rule) {
                eprintln!("e2e: healing a partition in {}: {error:#}", self.netns);
            }
        }
    }
}

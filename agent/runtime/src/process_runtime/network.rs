//! A SuperNode's network namespace: with `--supernode-network isolated` each replica (its
//! SuperNode, its ClientApps, its SuperExec) runs in a namespace of its own whose only interface
//! is its loopback ([`crate::netns`]), so a ClientApp reaches its own SuperNode and nothing else —
//! not another Federation's Control API or SuperNodes on the same machine, not the network.
//!
//! The SuperNode still dials its SuperLink's Fleet API at the address the hub gave
//! (`--superlink HOST:PORT`, so TLS checks the name it always did): inside, its bridge listens
//! there — the address added to the loopback, or a host name mapped by an `/etc/hosts` of the
//! namespace's own to a loopback address — and forwards to a Unix socket in the Federation's
//! directory, which the runtime serves outside by dialling the real address
//! ([`crate::netns::serve_to_tcp`]).
use crate::netns::Bridged;
use crate::sandbox::Network;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

/// Where a replica's SuperNode finds its SuperLink inside its namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FleetInside {
    /// Where the bridge listens (the address the SuperNode dials, or what its name maps to).
    pub(super) host: IpAddr,
    pub(super) port: u16,
    /// An address to add to the loopback (not one of 127.0.0.0/8 or `::1`, which are there).
    pub(super) address: Option<Ipv4Addr>,
    /// A host name the namespace's own `/etc/hosts` maps to `host`.
    pub(super) name: Option<String>,
}

/// The loopback address a Fleet host name is mapped to inside (the outside dials the name).
const NAMED_FLEET: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// Where `fleet_address` (`HOST:PORT`, `[V6]:PORT`) is found inside a replica's namespace, or why
/// it cannot be (naming the way out).
pub(super) fn fleet_inside(fleet_address: &str) -> Result<FleetInside, String> {
    let (host, port) = fleet_address
        .rsplit_once(':')
        .ok_or_else(|| format!("SuperLink address {fleet_address:?}: expected HOST:PORT"))?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("SuperLink address {fleet_address:?}: {port:?} is not a port"))?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => Ok(FleetInside {
            host: IpAddr::V4(v4),
            port,
            address: (!v4.is_loopback()).then_some(v4),
            name: None,
        }),
        Ok(IpAddr::V6(v6)) if v6.is_loopback() => Ok(FleetInside {
            host: IpAddr::V6(v6),
            port,
            address: None,
            name: None,
        }),
        Ok(IpAddr::V6(_)) => Err(format!(
            "SuperLink address {fleet_address:?}: an IPv6 address other than ::1 cannot be given to a SuperNode's own network namespace; use a host name or an IPv4 address, or run SuperNodes on the host network (--supernode-network host)"
        )),
        Err(_) if bare.is_empty() => Err(format!(
            "SuperLink address {fleet_address:?}: the host is empty"
        )),
        Err(_) if bare.eq_ignore_ascii_case("localhost") => Ok(FleetInside {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port,
            address: None,
            name: None,
        }),
        Err(_) => Ok(FleetInside {
            host: IpAddr::V4(NAMED_FLEET),
            port,
            address: None,
            name: Some(bare.to_owned()),
        }),
    }
}

/// The files of one replica's namespace bridges, in its Federation's directory (which the
/// sandbox keeps visible to the replica and hides from every other Federation's).
pub(super) struct ReplicaSockets {
    /// Served by the runtime outside, imported by the SuperNode's bridge.
    pub(super) fleet: PathBuf,
    /// Exported by the SuperNode's bridge (its ClientAppIo port), imported by its SuperExec's.
    pub(super) appio: PathBuf,
    /// The namespace's `/etc/hosts`, when the SuperLink is dialled by name.
    pub(super) hosts: PathBuf,
}

impl ReplicaSockets {
    pub(super) fn new(fed_dir: &Path, pool: &str, index: u32) -> Self {
        let dir = fed_dir.join("net");
        Self {
            fleet: dir.join(format!("{pool}-{index}.fleet.sock")),
            appio: dir.join(format!("{pool}-{index}.appio.sock")),
            hosts: dir.join(format!("{pool}-{index}.hosts")),
        }
    }
}

/// The sandbox network of a replica whose SuperLink is `inside`, writing its `/etc/hosts` when
/// it dials a name.
pub(super) fn replica_network(
    inside: &FleetInside,
    sockets: &ReplicaSockets,
) -> std::io::Result<Network> {
    let hosts = match &inside.name {
        Some(name) => {
            if let Some(dir) = sockets.hosts.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let text = format!(
                "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n{} {name}\n",
                inside.host
            );
            crate::files::write_if_changed(&sockets.hosts, text.as_bytes(), crate::files::PUBLIC)?;
            Some(sockets.hosts.clone())
        }
        None => None,
    };
    Ok(Network {
        addresses: inside.address.into_iter().collect(),
        hosts,
    })
}

/// `netns-bridge` arguments that run `program` with `args` in a replica's namespace: importing
/// `imports`, exporting `exports`.
pub(super) fn bridged_argv(
    imports: &[Bridged],
    exports: &[Bridged],
    program: &Path,
    args: &[String],
) -> Vec<String> {
    let mut argv = vec!["netns-bridge".to_owned()];
    argv.extend(imports.iter().map(|b| format!("--import={b}")));
    argv.extend(exports.iter().map(|b| format!("--export={b}")));
    argv.push("--".to_owned());
    argv.push(program.display().to_string());
    argv.extend(args.iter().cloned());
    argv
}

/// The runtime's side of a replica's Fleet socket: forwards to the SuperLink until dropped.
pub(super) struct FleetForwarder {
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    socket: PathBuf,
}

impl FleetForwarder {
    /// Serves `socket` (only its owner may connect: the replica's uid, when confined as root,
    /// gets it with its directory) by dialling `fleet_address` for each connection.
    pub(super) fn start(socket: &Path, fleet_address: &str) -> std::io::Result<Self> {
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let listener = crate::netns::bind_private(socket)?;
        let task = tokio::spawn(crate::netns::serve_to_tcp(
            listener,
            fleet_address.to_owned(),
        ));
        Ok(Self {
            task,
            socket: socket.to_path_buf(),
        })
    }
}

impl Drop for FleetForwarder {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_superlink_is_found_inside_at_the_address_it_is_dialled_at() {
        // Invariant: the SuperNode dials what it always did; inside, that address is on the
        // loopback (or its name maps to one), and what cannot be is refused naming the way out.
        let v4 = fleet_inside("198.18.0.1:9092").unwrap();
        assert_eq!(v4.host, IpAddr::from([198, 18, 0, 1]));
        assert_eq!(v4.address, Some(Ipv4Addr::new(198, 18, 0, 1)));
        assert_eq!(v4.port, 9092);
        let loopback = fleet_inside("127.0.0.1:9092").unwrap();
        assert_eq!(loopback.address, None, "127.0.0.0/8 is on every loopback");
        let v6 = fleet_inside("[::1]:9092").unwrap();
        assert_eq!((v6.host, v6.address), ("::1".parse().unwrap(), None));
        let named = fleet_inside("hub.example.org:30092").unwrap();
        assert_eq!(named.name.as_deref(), Some("hub.example.org"));
        assert_eq!(named.host, IpAddr::V4(NAMED_FLEET));
        assert_eq!(named.address, None);
        assert_eq!(
            fleet_inside("localhost:9092").unwrap().host,
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        for (bad, says) in [
            ("[2001:db8::1]:9092", "--supernode-network host"),
            ("hub", "expected HOST:PORT"),
            ("hub:0", "is not a port"),
            (":9092", "the host is empty"),
        ] {
            let err = fleet_inside(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn a_named_superlink_gets_a_hosts_file_of_the_replica_s_own() {
        let dir = tempfile::tempdir().unwrap();
        let sockets = ReplicaSockets::new(dir.path(), "edge", 3);
        assert!(sockets.fleet.ends_with("net/edge-3.fleet.sock"));
        let named = fleet_inside("hub.example.org:30092").unwrap();
        let network = replica_network(&named, &sockets).unwrap();
        let hosts = std::fs::read_to_string(network.hosts.as_ref().unwrap()).unwrap();
        assert!(hosts.contains("127.0.0.2 hub.example.org\n"), "{hosts}");
        assert!(hosts.starts_with("127.0.0.1 localhost\n"), "{hosts}");
        let literal = fleet_inside("198.18.0.1:9092").unwrap();
        let network = replica_network(&literal, &sockets).unwrap();
        assert_eq!(network.hosts, None);
        assert_eq!(network.addresses, vec![Ipv4Addr::new(198, 18, 0, 1)]);
        let argv = bridged_argv(
            &[Bridged {
                host: named.host,
                port: named.port,
                socket: sockets.fleet.clone(),
            }],
            &[],
            Path::new("/venv/bin/flower-supernode"),
            &["--superlink".into(), "hub.example.org:30092".into()],
        );
        assert_eq!(argv[0], "netns-bridge");
        assert_eq!(
            argv[1],
            format!("--import=127.0.0.2:30092={}", sockets.fleet.display())
        );
        assert_eq!(
            &argv[2..],
            [
                "--",
                "/venv/bin/flower-supernode",
                "--superlink",
                "hub.example.org:30092"
            ]
        );
    }
}

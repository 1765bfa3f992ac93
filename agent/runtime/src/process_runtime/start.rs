//! Starting a replica's processes: on the host network, or each under a `netns-bridge` in the
//! replica's own network namespace ([`super::network`]).
use super::*;

/// A replica's processes, as started.
pub(super) struct Started {
    pub(super) supernode: Supervised,
    pub(super) superexec: Option<Supervised>,
    pub(super) forwarder: Option<network::FleetForwarder>,
}

impl ProcessRuntime {
    /// Starts a replica's SuperNode (and SuperExec): on the host network, or each under a
    /// `netns-bridge` in the replica's own network namespace — the SuperNode importing its
    /// Fleet socket (served here) at the address it dials and exporting its ClientAppIo port,
    /// the SuperExec importing that.
    pub(super) fn start_replica(
        &self,
        d: &DesiredReplica,
        env: &BTreeMap<String, String>,
        log_dir: &Path,
        name: &str,
        log_file: &Path,
    ) -> Result<Started, RuntimeError> {
        let supernode_program = self.absolute_program(render::SUPERNODE_PROGRAM);
        let superexec_program = self.absolute_program(render::SUPEREXEC_PROGRAM);
        let spec =
            |what: &str, program: PathBuf, args: Vec<String>, log: PathBuf, network| ProcessSpec {
                name: format!("{what}/{}", d.key.slug()),
                program,
                args,
                env: env.clone(),
                cwd: Some(self.config.state_dir.clone()),
                log_file: log,
                sandbox: self.sandbox(&d.key, network),
            };
        let superexec_log = log_dir.join(format!("{name}.superexec.log"));
        let (Some(bridge), Some(inside)) = (self.bridge(), &d.fleet_inside) else {
            let supernode = Supervised::start(spec(
                "supernode",
                supernode_program,
                d.argv.clone(),
                log_file.to_path_buf(),
                None,
            ));
            let superexec = d.superexec_argv.clone().map(|args| {
                Supervised::start(spec(
                    "superexec",
                    superexec_program,
                    args,
                    superexec_log.clone(),
                    None,
                ))
            });
            return Ok(Started {
                supernode,
                superexec,
                forwarder: None,
            });
        };
        let sockets = network::ReplicaSockets::new(&self.fed_dir(&d.key), &d.key.pool, d.key.index);
        let io = |e: std::io::Error| {
            RuntimeError::Apply(format!(
                "replica {}: its network namespace's files in {}: {e}",
                d.key.slug(),
                sockets.fleet.parent().unwrap_or(Path::new("")).display()
            ))
        };
        let network = network::replica_network(inside, &sockets).map_err(io)?;
        let forwarder =
            network::FleetForwarder::start(&sockets.fleet, &d.fleet_address).map_err(io)?;
        let fleet = crate::netns::Bridged {
            host: inside.host,
            port: inside.port,
            socket: sockets.fleet.clone(),
        };
        let appio = crate::netns::Bridged {
            host: std::net::IpAddr::from([127, 0, 0, 1]),
            port: d.port,
            socket: sockets.appio.clone(),
        };
        let exports = if d.superexec_argv.is_some() {
            vec![appio.clone()]
        } else {
            Vec::new()
        };
        let mut supernode_spec = spec(
            "supernode",
            bridge.to_path_buf(),
            network::bridged_argv(&[fleet], &exports, &supernode_program, &d.argv),
            log_file.to_path_buf(),
            Some(network.clone()),
        );
        if inside.name.is_some() {
            // gRPC's own resolver may not read /etc/hosts; the C library's does.
            supernode_spec
                .env
                .insert("GRPC_DNS_RESOLVER".into(), "native".into());
        }
        let supernode = Supervised::start(supernode_spec);
        let superexec = d.superexec_argv.as_ref().map(|args| {
            Supervised::start(spec(
                "superexec",
                bridge.to_path_buf(),
                network::bridged_argv(std::slice::from_ref(&appio), &[], &superexec_program, args),
                superexec_log.clone(),
                Some(network.clone()),
            ))
        });
        Ok(Started {
            supernode,
            superexec,
            forwarder: Some(forwarder),
        })
    }
}

//! How a standalone SuperLink (and its SuperExec) in a network namespace of its own is reached:
//! its Unix sockets, and the `flower-hub netns-bridge` command that exports or imports them.

use std::path::PathBuf;

use flower_addon_crds::render::FlowerDialect;

use super::Listening;
use crate::core::superlink::{SuperLinkLayout, SuperLinkPorts, fleet_listen_address};
use crate::standalone::superlink::SuperLinkPaths;

/// The Unix sockets of a SuperLink in a network namespace of its own ([`crate::standalone::netns`]), in its
/// directory: Control (also the whole server in the unified dialect), the Fleet API where it has
/// a port of its own, ServerAppIO for a classic process-isolation SuperExec.
pub(super) struct Sockets {
    pub(super) control: PathBuf,
    pub(super) fleet: Option<PathBuf>,
    pub(super) serverappio: Option<PathBuf>,
}

impl Sockets {
    /// The sockets of a SuperLink with `ports` in a network namespace of its own, in its
    /// directory: Control always, Fleet when the SuperLink serves it on a port of its own, and
    /// ServerAppIO for a classic SuperLink in process isolation. Refused when a path is too long
    /// for a Unix socket.
    pub(super) fn for_superlink(
        paths: &SuperLinkPaths,
        ports: SuperLinkPorts,
        process: bool,
        dialect: FlowerDialect,
    ) -> Result<Self, super::SuperLinkError> {
        let sockets = Self {
            control: paths.dir.join("control.sock"),
            fleet: (!ports.front && ports.fleet != ports.control)
                .then(|| paths.dir.join("fleet.sock")),
            serverappio: (process
                && matches!(
                    dialect,
                    FlowerDialect::Classic | FlowerDialect::Transitional
                ))
            .then(|| paths.dir.join("serverappio.sock")),
        };
        for socket in [Some(&sockets.control), sockets.fleet.as_ref()]
            .into_iter()
            .flatten()
            .chain(&sockets.serverappio)
        {
            crate::standalone::netns::check_socket_path(socket)
                .map_err(super::SuperLinkError::SocketPath)?;
        }
        Ok(sockets)
    }

    /// The SuperLink's `netns-bridge` flags: each of its `ports` exported as its socket.
    pub(super) fn superlink_exports(&self, ports: SuperLinkPorts) -> Vec<String> {
        let mut exports = vec![format!(
            "--export={}={}",
            ports.control,
            self.control.display()
        )];
        if let Some(fleet) = &self.fleet {
            exports.push(format!("--export={}={}", ports.fleet, fleet.display()));
        }
        if let (Some(socket), Some(port)) = (&self.serverappio, ports.serverappio) {
            exports.push(format!("--export={port}={}", socket.display()));
        }
        exports
    }

    /// The ServerApp SuperExec's `netns-bridge` flag: the port it dials on its own loopback
    /// (ServerAppIO in the classic dialect, else the SuperLink's one server), imported from the
    /// SuperLink's namespace.
    pub(super) fn superexec_import(&self, ports: SuperLinkPorts) -> String {
        match (&self.serverappio, ports.serverappio) {
            (Some(socket), Some(port)) => format!("--import={port}={}", socket.display()),
            _ => format!("--import={}={}", ports.control, self.control.display()),
        }
    }
}

/// Where the SuperLink serves Fleet: its socket in a network namespace of its own, else its
/// host and port.
pub(super) fn fleet_listening(
    sockets: Option<&Sockets>,
    dialect: FlowerDialect,
    layout: &SuperLinkLayout,
) -> Listening {
    match sockets {
        Some(sockets) => Listening::Unix(
            sockets
                .fleet
                .clone()
                .unwrap_or_else(|| sockets.control.clone()),
        ),
        None => {
            let (host, port) = fleet_listen_address(dialect, layout);
            Listening::Tcp(host, port)
        }
    }
}

/// `program` with `args`, or, for a process in a network namespace of its own (`bridge` with
/// its `--export`/`--import` flags), `flower-hub netns-bridge FLAGS -- program args`.
pub(super) fn bridged(
    program: PathBuf,
    args: Vec<String>,
    bridge: Option<(&crate::standalone::NetnsBridge, Vec<String>)>,
) -> (PathBuf, Vec<String>) {
    match bridge {
        Some((bridge, flags)) => {
            let mut bridged = vec!["netns-bridge".to_owned()];
            bridged.extend(flags);
            bridged.push("--".to_owned());
            bridged.push(program.display().to_string());
            bridged.extend(args);
            (bridge.program.clone(), bridged)
        }
        None => (program, args),
    }
}

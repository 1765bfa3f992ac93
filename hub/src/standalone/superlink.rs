//! Where the SuperLink of a Federation keeps its files as a supervised local process
//! (standalone hub); its arguments come from [`crate::core::superlink`].
//!
//! TLS material comes from the hub CA (SANs: 127.0.0.1, localhost, the advertised address and
//! `spec.tls.extraSANs`); the database lives in the state directory so SuperNodes and node
//! registrations survive a SuperLink restart.
use crate::core::superlink::{SuperLinkLayout, SuperLinkPorts};
use flower_addon_crds::Federation;
use flower_addon_crds::render::FlowerDialect;
use std::path::{Path, PathBuf};

/// Where one Federation's SuperLink keeps its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperLinkPaths {
    /// `<state>/federations/<ns>/<name>`.
    pub dir: PathBuf,
    /// CA bundle (`ca.crt`).
    pub ca: PathBuf,
    /// Server certificate (`tls.crt`).
    pub cert: PathBuf,
    /// Server key (`tls.key`).
    pub key: PathBuf,
    /// SQLite database.
    pub database: PathBuf,
    /// Log file.
    pub log: PathBuf,
}

impl SuperLinkPaths {
    /// Paths of the Federation `namespace/name` under `state_dir`.
    pub fn new(state_dir: &Path, namespace: &str, name: &str) -> Self {
        let dir = state_dir.join("federations").join(namespace).join(name);
        Self {
            ca: dir.join("tls/ca.crt"),
            cert: dir.join("tls/tls.crt"),
            key: dir.join("tls/tls.key"),
            database: dir.join("superlink.db"),
            log: state_dir
                .join("logs")
                .join(format!("{namespace}-{name}-superlink.log")),
            dir,
        }
    }
}

impl SuperLinkPaths {
    /// Where the SuperLink process finds its files and listens: the spec's Fleet port (or its
    /// Fleet front's) on `bind_host`, Control on loopback unless `exposeControl`, its TLS files
    /// and database here, and SuperNode authentication with TLS (the
    /// standalone hub registers the agents' keys).
    pub fn layout(
        &self,
        fed: &Federation,
        dialect: FlowerDialect,
        bind_host: &str,
    ) -> SuperLinkLayout {
        let shown = |p: &Path| p.display().to_string();
        SuperLinkLayout {
            bind_host: bind_host.to_owned(),
            control_host: if crate::core::superlink::separate_control(fed) {
                "127.0.0.1".to_owned()
            } else {
                bind_host.to_owned()
            },
            ports: SuperLinkPorts::from_spec(fed, dialect),
            tls_files: [shown(&self.ca), shown(&self.cert), shown(&self.key)],
            database: shown(&self.database),
            supernode_auth: fed.spec.supernode_auth(),
        }
    }
}

//! The SuperLink of a Federation as a supervised local process (standalone hub).
//!
//! TLS material comes from the hub CA (SANs: 127.0.0.1, localhost, the advertised address and
//! `spec.tls.extraSANs`); the database lives in the state directory so SuperNodes and node
//! registrations survive a SuperLink restart.
use flower_addon_crds::render::{FlowerDialect, FlowerVersion};
use flower_addon_crds::{Federation, IsolationMode};
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
    /// `FLWR_HOME` used for `flwr supernode register`.
    pub flwr_home: PathBuf,
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
            flwr_home: dir.join("flwr-home"),
            dir,
        }
    }
}

/// Addresses of a standalone SuperLink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperLinkAddresses {
    /// Fleet API port (SuperNodes dial it).
    pub fleet_port: u16,
    /// Control API port (`flwr run`); equal to the fleet port in the unified dialect.
    pub control_port: u16,
    /// ServerAppIO port (classic dialect only; bound to 127.0.0.1).
    pub serverappio_port: Option<u16>,
}

/// The ports a Federation's SuperLink listens on, from `spec.superlink.service.ports`
/// (the unified dialect serves every API on the `grpc` port).
pub fn addresses(fed: &Federation, dialect: FlowerDialect) -> SuperLinkAddresses {
    let ports = &fed.spec.superlink.service.ports;
    let p = |v: i32| u16::try_from(v).unwrap_or(0);
    match dialect {
        FlowerDialect::Unified => SuperLinkAddresses {
            fleet_port: p(ports.grpc),
            control_port: p(ports.grpc),
            serverappio_port: None,
        },
        FlowerDialect::Classic => SuperLinkAddresses {
            fleet_port: p(ports.grpc),
            control_port: p(ports.extra),
            serverappio_port: Some(p(ports.server_app_io)),
        },
    }
}

/// `flower-superlink` arguments for a local process.
pub fn superlink_argv(
    fed: &Federation,
    version: FlowerVersion,
    dialect: FlowerDialect,
    bind_host: &str,
    paths: &SuperLinkPaths,
) -> Vec<String> {
    let addr = addresses(fed, dialect);
    let mut args = vec![match fed.spec.isolation_mode {
        IsolationMode::Process => "--isolation=process".to_owned(),
        IsolationMode::Subprocess => "--isolation=subprocess".to_owned(),
    }];
    if fed.spec.insecure {
        args.push("--insecure".into());
    } else {
        args.push(format!("--ssl-ca-certfile={}", paths.ca.display()));
        args.push(format!("--ssl-certfile={}", paths.cert.display()));
        args.push(format!("--ssl-keyfile={}", paths.key.display()));
        // Flower's SuperNode authentication needs TLS; the hub registers each node's key.
        args.push("--enable-supernode-auth".into());
    }
    match dialect {
        FlowerDialect::Unified => {
            args.push(format!("--host={bind_host}"));
            args.push(format!("--port={}", addr.fleet_port));
        }
        FlowerDialect::Classic => {
            args.push(format!(
                "--serverappio-api-address=127.0.0.1:{}",
                addr.serverappio_port.unwrap_or(9091)
            ));
            args.push(format!(
                "--fleet-api-address={bind_host}:{}",
                addr.fleet_port
            ));
            args.push(format!(
                "--control-api-address={bind_host}:{}",
                addr.control_port
            ));
        }
    }
    args.push(format!("--database={}", paths.database.display()));
    // The flag exists from 1.32 (checked by e2e/flower/smoke.sh); older releases never install.
    if version
        >= (FlowerVersion {
            major: 1,
            minor: 32,
            patch: 0,
        })
    {
        args.push("--disable-runtime-dependency-installation".into());
    }
    args.extend(fed.spec.superlink.extra_args.iter().cloned());
    args
}

/// `flower-superexec` arguments for the ServerApp SuperExec (process isolation).
pub fn serverapp_superexec_argv(
    fed: &Federation,
    dialect: FlowerDialect,
    paths: &SuperLinkPaths,
) -> Vec<String> {
    let addr = addresses(fed, dialect);
    match dialect {
        FlowerDialect::Classic => vec![
            "--insecure".into(),
            "--plugin-type=serverapp".into(),
            format!(
                "--appio-api-address=127.0.0.1:{}",
                addr.serverappio_port.unwrap_or(9091)
            ),
        ],
        FlowerDialect::Unified => {
            let mut args = vec![format!(
                "--runtime-api-address=127.0.0.1:{}",
                addr.fleet_port
            )];
            if fed.spec.insecure {
                args.push("--insecure".into());
            } else {
                args.push(format!("--root-certificates={}", paths.ca.display()));
            }
            args
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(yaml: &str) -> Federation {
        let value: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        serde_json::from_value(value).unwrap()
    }

    const FED: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {name: demo, namespace: default}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  insecure: false
  superlink:
    image: flwr/superlink:1.42.0
    service: {ports: {grpc: 19092, extra: 19093, serverAppIO: 19091}}
  supernodes:
    image: flwr/supernode:1.42.0
    pools: [{name: a, replicas: 1, images: {}}]
"#;

    #[test]
    fn tls_federation_runs_with_node_auth_and_a_database() {
        // TLS on means SuperNode authentication on, and the SuperLink state survives restarts.
        let f = fed(FED);
        let paths = SuperLinkPaths::new(Path::new("/s"), "default", "demo");
        let v = FlowerVersion::parse("1.42.0").unwrap();
        let argv = superlink_argv(&f, v, FlowerDialect::Unified, "0.0.0.0", &paths);
        assert!(argv.contains(&"--enable-supernode-auth".to_string()));
        assert!(argv.contains(&"--port=19092".to_string()));
        assert!(argv.contains(&"--database=/s/federations/default/demo/superlink.db".to_string()));
        assert!(argv.contains(&"--disable-runtime-dependency-installation".to_string()));
        assert!(!argv.contains(&"--insecure".to_string()));
    }

    #[test]
    fn classic_dialect_uses_three_addresses_from_the_service_ports() {
        // The classic SuperLink listens where the Federation's Service ports say, not on 9092.
        let f = fed(FED);
        let paths = SuperLinkPaths::new(Path::new("/s"), "default", "demo");
        let v = FlowerVersion::parse("1.25.0").unwrap();
        let argv = superlink_argv(&f, v, FlowerDialect::Classic, "127.0.0.1", &paths);
        assert!(argv.contains(&"--fleet-api-address=127.0.0.1:19092".to_string()));
        assert!(argv.contains(&"--control-api-address=127.0.0.1:19093".to_string()));
        assert!(argv.contains(&"--serverappio-api-address=127.0.0.1:19091".to_string()));
        assert!(!argv.iter().any(|a| a.contains("disable-runtime")));
    }
}

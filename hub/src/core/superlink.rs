//! The SuperLink's command line and certificate names — one builder for the container the
//! Kubernetes hub runs and the process the standalone hub runs (as the SuperNode side has
//! [`flower_addon_crds::render::supernode_argv`]). The adapters differ only in the
//! [`SuperLinkLayout`] they pass: where the files are and where it listens.
use flower_addon_crds::Federation;
use flower_addon_crds::render::dialect::{
    FIRST_DISABLE_RUNTIME_DEPS_VERSION, classic_ports, unified_ports,
};
use flower_addon_crds::render::{FlowerDialect, FlowerVersion, isolation_arg};

use crate::core::render::{host_of, superlink_name};

/// The ports a SuperLink listens on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuperLinkPorts {
    /// Fleet API (SuperNodes dial it).
    pub fleet: u16,
    /// Control API (`flwr`); equal to `fleet` in the unified dialect.
    pub control: u16,
    /// ServerAppIO (classic dialect only; always bound to 127.0.0.1).
    pub serverappio: Option<u16>,
}

impl SuperLinkPorts {
    /// Flower's default ports, which the SuperLink container listens on (the Service maps
    /// `spec.superlink.service.ports` to them).
    pub fn container(dialect: FlowerDialect) -> Self {
        match dialect {
            FlowerDialect::Unified => Self::single(port(unified_ports::SUPERLINK)),
            FlowerDialect::Classic => Self {
                fleet: port(classic_ports::FLEET),
                control: port(classic_ports::CONTROL),
                serverappio: Some(port(classic_ports::SERVERAPPIO)),
            },
        }
    }

    /// The ports of `spec.superlink.service.ports`, which a SuperLink process listens on
    /// directly (standalone: the hub machine's own ports, as a NodePort would be).
    pub fn from_spec(fed: &Federation, dialect: FlowerDialect) -> Self {
        let ports = &fed.spec.superlink.service.ports;
        match dialect {
            FlowerDialect::Unified => Self::single(port(ports.grpc)),
            FlowerDialect::Classic => Self {
                fleet: port(ports.grpc),
                control: port(ports.extra),
                serverappio: Some(port(ports.server_app_io)),
            },
        }
    }

    fn single(port: u16) -> Self {
        Self {
            fleet: port,
            control: port,
            serverappio: None,
        }
    }
}

fn port(n: i32) -> u16 {
    u16::try_from(n).unwrap_or(0)
}

/// Where a SuperLink finds its files and where it listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperLinkLayout {
    /// Address the Fleet (and, classic, Control) API binds.
    pub bind_host: String,
    /// Its ports.
    pub ports: SuperLinkPorts,
    /// CA bundle, certificate and key files (`ca.crt`, `tls.crt`, `tls.key`).
    pub tls_files: [String; 3],
    /// SQLite database file (keeps node registrations and runs across restarts).
    pub database: String,
    /// Whether SuperNodes must authenticate with a registered key (`--enable-supernode-auth`;
    /// TLS only). On where the hub registers the agents' keys with this SuperLink.
    pub supernode_auth: bool,
}

/// `flower-superlink` arguments: isolation, TLS (and SuperNode authentication), listen
/// addresses, database, no run-time dependency installation (from 1.32: images and venvs carry
/// the app's dependencies), then `spec.superlink.extraArgs`.
pub fn superlink_argv(
    fed: &Federation,
    version: FlowerVersion,
    dialect: FlowerDialect,
    layout: &SuperLinkLayout,
) -> Vec<String> {
    let mut args = vec![isolation_arg(&fed.spec).to_owned()];
    if fed.spec.insecure {
        args.push("--insecure".into());
    } else {
        let [ca, cert, key] = &layout.tls_files;
        args.push(format!("--ssl-ca-certfile={ca}"));
        args.push(format!("--ssl-certfile={cert}"));
        args.push(format!("--ssl-keyfile={key}"));
        if layout.supernode_auth {
            args.push("--enable-supernode-auth".into());
        }
    }
    let host = &layout.bind_host;
    let ports = layout.ports;
    match dialect {
        FlowerDialect::Unified => {
            args.push(format!("--host={host}"));
            args.push(format!("--port={}", ports.fleet));
        }
        FlowerDialect::Classic => {
            args.push(format!(
                "--serverappio-api-address=127.0.0.1:{}",
                ports
                    .serverappio
                    .unwrap_or(port(classic_ports::SERVERAPPIO))
            ));
            args.push(format!("--fleet-api-address={host}:{}", ports.fleet));
            args.push(format!("--control-api-address={host}:{}", ports.control));
        }
    }
    args.push(format!("--database={}", layout.database));
    if version >= FIRST_DISABLE_RUNTIME_DEPS_VERSION {
        args.push("--disable-runtime-dependency-installation".into());
    }
    args.extend(fed.spec.superlink.extra_args.iter().cloned());
    args
}

/// The ServerApp SuperExec's arguments (process isolation). Classic: the ServerAppIO hop is
/// loopback plaintext by design, so `--insecure` always. Unified: it dials the SuperLink's own
/// TLS port and trusts its CA.
pub fn serverapp_superexec_argv(
    fed: &Federation,
    dialect: FlowerDialect,
    layout: &SuperLinkLayout,
) -> Vec<String> {
    match dialect {
        FlowerDialect::Classic => vec![
            "--insecure".into(),
            "--plugin-type=serverapp".into(),
            format!(
                "--appio-api-address=127.0.0.1:{}",
                layout
                    .ports
                    .serverappio
                    .unwrap_or(port(classic_ports::SERVERAPPIO))
            ),
        ],
        FlowerDialect::Unified => vec![
            format!("--runtime-api-address=127.0.0.1:{}", layout.ports.fleet),
            if fed.spec.insecure {
                "--insecure".into()
            } else {
                format!("--root-certificates={}", layout.tls_files[0])
            },
        ],
    }
}

/// The in-cluster DNS names of the SuperLink Service.
pub fn in_cluster_names(fed: &Federation) -> Vec<String> {
    let name = superlink_name(fed.metadata.name.as_deref().unwrap_or_default());
    let ns = fed.metadata.namespace.as_deref().unwrap_or("default");
    vec![
        name.clone(),
        format!("{name}.{ns}"),
        format!("{name}.{ns}.svc"),
        format!("{name}.{ns}.svc.cluster.local"),
    ]
}

/// Where the hub reaches a Kubernetes-mode SuperLink's Control API: `(server name, address)` —
/// its Service's `<name>.<namespace>.svc` (one of [`in_cluster_names`], so in the certificate) and
/// the Service's Control port (the Fleet port in the unified dialect).
pub fn in_cluster_control(fed: &Federation, dialect: FlowerDialect) -> (String, String) {
    let host = in_cluster_names(fed).swap_remove(2);
    let port = SuperLinkPorts::from_spec(fed, dialect).control;
    (host.clone(), format!("{host}:{port}"))
}

/// The SANs of the SuperLink certificate: 127.0.0.1 and localhost, the names the adapter knows
/// the SuperLink is reached at (`reached_at`: in-cluster Service names and the derived
/// external host; or the standalone hub's advertised addresses), the host of
/// `spec.superlink.externalAddress`, then `spec.tls.extraSANs`; sorted, unique, no empty entry.
pub fn superlink_sans(
    fed: &Federation,
    reached_at: impl IntoIterator<Item = String>,
) -> Vec<String> {
    let mut sans = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    sans.extend(reached_at);
    if let Some(address) = fed.spec.superlink.external_address.as_deref() {
        sans.push(host_of(address).to_owned());
    }
    if let Some(tls) = &fed.spec.tls {
        sans.extend(tls.extra_sans.iter().cloned());
    }
    sans.retain(|s| !s.is_empty());
    sans.sort();
    sans.dedup();
    sans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hub_dials_control_at_the_service_name_in_the_certificate() {
        let f = fed(
            "metadata: {name: demo, namespace: team}\nspec: {mode: StatefulSet, isolationMode: subprocess, superlink: {image: \"flwr/superlink:1.42.0\", service: {ports: {grpc: 9092, extra: 9093}}}, supernodes: {image: \"flwr/supernode:1.42.0\", pools: []}}",
        );
        let (name, address) = in_cluster_control(&f, FlowerDialect::Classic);
        assert_eq!(name, "demo-superlink.team.svc");
        assert_eq!(address, "demo-superlink.team.svc:9093");
        assert!(in_cluster_names(&f).contains(&name));
        let (_, address) = in_cluster_control(&f, FlowerDialect::Unified);
        assert_eq!(address, "demo-superlink.team.svc:9092");
    }

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
    externalAddress: "hub.example:30092"
    service: {ports: {grpc: 19092, extra: 19093, serverAppIO: 19091}}
  tls: {extraSANs: [flower.example]}
  supernodes:
    image: flwr/supernode:1.42.0
    pools: [{name: a, replicas: 1, images: {}}]
"#;

    fn layout(ports: SuperLinkPorts, auth: bool) -> SuperLinkLayout {
        SuperLinkLayout {
            bind_host: "0.0.0.0".into(),
            ports,
            tls_files: ["/t/ca.crt".into(), "/t/tls.crt".into(), "/t/tls.key".into()],
            database: "/s/superlink.db".into(),
            supernode_auth: auth,
        }
    }

    #[test]
    fn unified_tls_superlink_has_auth_database_and_no_dependency_installs() {
        // TLS on and auth asked for: SuperNodes must authenticate; state survives restarts.
        let f = fed(FED);
        let v = FlowerVersion::parse("1.42.0").unwrap();
        let ports = SuperLinkPorts::from_spec(&f, FlowerDialect::Unified);
        let argv = superlink_argv(&f, v, FlowerDialect::Unified, &layout(ports, true));
        assert_eq!(
            argv,
            [
                "--isolation=subprocess",
                "--ssl-ca-certfile=/t/ca.crt",
                "--ssl-certfile=/t/tls.crt",
                "--ssl-keyfile=/t/tls.key",
                "--enable-supernode-auth",
                "--host=0.0.0.0",
                "--port=19092",
                "--database=/s/superlink.db",
                "--disable-runtime-dependency-installation",
            ]
        );
        let without = superlink_argv(&f, v, FlowerDialect::Unified, &layout(ports, false));
        assert!(!without.iter().any(|a| a == "--enable-supernode-auth"));
    }

    #[test]
    fn classic_superlink_listens_on_three_addresses_with_serverappio_on_loopback() {
        // Container: Flower's default ports; process: the spec's ports. ServerAppIO is never
        // exposed beyond loopback.
        let f = fed(FED);
        let v = FlowerVersion::parse("1.25.0").unwrap();
        let container = SuperLinkPorts::container(FlowerDialect::Classic);
        let argv = superlink_argv(&f, v, FlowerDialect::Classic, &layout(container, false));
        assert!(argv.contains(&"--fleet-api-address=0.0.0.0:9092".to_owned()));
        assert!(argv.contains(&"--control-api-address=0.0.0.0:9093".to_owned()));
        assert!(argv.contains(&"--serverappio-api-address=127.0.0.1:9091".to_owned()));
        assert!(!argv.iter().any(|a| a.contains("disable-runtime")));
        let process = SuperLinkPorts::from_spec(&f, FlowerDialect::Classic);
        let argv = superlink_argv(&f, v, FlowerDialect::Classic, &layout(process, false));
        assert!(argv.contains(&"--fleet-api-address=0.0.0.0:19092".to_owned()));
        assert!(argv.contains(&"--control-api-address=0.0.0.0:19093".to_owned()));
        assert!(argv.contains(&"--serverappio-api-address=127.0.0.1:19091".to_owned()));
        let superexec =
            serverapp_superexec_argv(&f, FlowerDialect::Classic, &layout(process, false));
        assert!(superexec.contains(&"--appio-api-address=127.0.0.1:19091".to_owned()));
    }

    #[test]
    fn sans_cover_every_address_a_supernode_or_flwr_dials() {
        // Loopback, what the adapter knows, the external host (without port) and extra SANs.
        let f = fed(FED);
        let sans = superlink_sans(&f, in_cluster_names(&f));
        for want in [
            "127.0.0.1",
            "localhost",
            "demo-superlink.default.svc",
            "demo-superlink.default.svc.cluster.local",
            "hub.example",
            "flower.example",
        ] {
            assert!(
                sans.contains(&want.to_owned()),
                "{want} missing in {sans:?}"
            );
        }
        let mut sorted = sans.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sans, sorted);
    }
}

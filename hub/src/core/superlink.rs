//! The SuperLink's command line and certificate names — one builder for the container the
//! Kubernetes hub runs and the process the standalone hub runs (as the SuperNode side has
//! [`flower_addon_crds::render::supernode_argv`]). The adapters differ only in the
//! [`SuperLinkLayout`] they pass: where the files are and where it listens.
use flower_addon_crds::Federation;
use flower_addon_crds::render::address::host_of;
use flower_addon_crds::render::dialect::{
    FIRST_DISABLE_RUNTIME_DEPS_VERSION, classic_ports, superexec_connect_args, unified_ports,
};
use flower_addon_crds::render::{FlowerDialect, FlowerVersion, isolation_arg};

/// Name of the SuperLink StatefulSet and Service, `<fed>-superlink` (the SuperLink's certificate
/// names it too).
pub fn superlink_name(federation: &str) -> String {
    format!("{federation}-superlink")
}

/// The ports a SuperLink listens on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuperLinkPorts {
    /// Where SuperNodes dial the Fleet API: the SuperLink's own Fleet port, or the Fleet
    /// front's when [`Self::front`] is set.
    pub fleet: u16,
    /// Control API (`flwr`); in the unified dialect the SuperLink's one server (Fleet, Control
    /// and Runtime APIs), which its own SuperExec dials too.
    pub control: u16,
    /// ServerAppIO (classic dialect only; always bound to 127.0.0.1).
    pub serverappio: Option<u16>,
    /// A Fleet front ([`crate::flower::front`]) listens on `fleet` and passes only Fleet
    /// requests to the SuperLink's server on `control`: the unified dialect serves Control on
    /// the same server, and `spec.superlink.service.exposeControl` is off.
    pub front: bool,
}

/// The Fleet front's container port (the classic Fleet port's number: SuperNodes see the same
/// port in both dialects).
pub const FRONT_PORT: u16 = 9092;

impl SuperLinkPorts {
    /// Flower's default ports, which the SuperLink container listens on (the Service maps
    /// `spec.superlink.service.ports` to them), and the Fleet front's.
    pub fn container(fed: &Federation, dialect: FlowerDialect) -> Self {
        match dialect {
            FlowerDialect::Unified if separate_control(fed) => Self {
                fleet: FRONT_PORT,
                control: port(unified_ports::SUPERLINK),
                serverappio: None,
                front: true,
            },
            FlowerDialect::Unified => Self::single(port(unified_ports::SUPERLINK)),
            FlowerDialect::Classic | FlowerDialect::Transitional => Self {
                fleet: port(classic_ports::FLEET),
                control: port(classic_ports::CONTROL),
                serverappio: Some(port(classic_ports::SERVERAPPIO)),
                front: false,
            },
            FlowerDialect::TransitionalHttp => Self {
                fleet: port(classic_ports::FLEET),
                control: port(classic_ports::CONTROL),
                serverappio: None,
                front: false,
            },
        }
    }

    /// The ports of `spec.superlink.service.ports`, which a SuperLink process (or its Fleet
    /// front) listens on directly (standalone: the hub machine's own ports, as a NodePort would
    /// be).
    pub fn from_spec(fed: &Federation, dialect: FlowerDialect) -> Self {
        let ports = &fed.spec.superlink.service.ports;
        match dialect {
            FlowerDialect::Unified if separate_control(fed) => Self {
                fleet: port(ports.grpc),
                control: port(ports.extra),
                serverappio: None,
                front: true,
            },
            FlowerDialect::Unified => Self::single(port(ports.grpc)),
            FlowerDialect::Classic | FlowerDialect::Transitional => Self {
                fleet: port(ports.grpc),
                control: port(ports.extra),
                serverappio: Some(port(ports.server_app_io)),
                front: false,
            },
            FlowerDialect::TransitionalHttp => Self {
                fleet: port(ports.grpc),
                control: port(ports.extra),
                serverappio: None,
                front: false,
            },
        }
    }

    fn single(port: u16) -> Self {
        Self {
            fleet: port,
            control: port,
            serverappio: None,
            front: false,
        }
    }
}

/// Whether the Control API stays off the endpoint SuperNodes reach (the default; off with
/// `spec.superlink.service.exposeControl`).
pub fn separate_control(fed: &Federation) -> bool {
    !fed.spec.superlink.service.expose_control
}

fn port(n: i32) -> u16 {
    u16::try_from(n).unwrap_or(0)
}

/// Where a SuperLink finds its files and where it listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperLinkLayout {
    /// Address the Fleet API (or the Fleet front) binds: where SuperNodes dial.
    pub bind_host: String,
    /// Address the Control API binds (in the unified dialect with a front, the SuperLink's
    /// whole server): loopback unless `exposeControl`, for a standalone process and in a pod
    /// alike (in a pod the hub reaches it through a port-forward; with `exposeControl` through
    /// Service `<name>-superlink-control`).
    pub control_host: String,
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
    let serverappio = ports
        .serverappio
        .unwrap_or(port(classic_ports::SERVERAPPIO));
    match dialect {
        FlowerDialect::Unified => {
            let host = if ports.front {
                &layout.control_host
            } else {
                host
            };
            args.push(format!("--host={host}"));
            args.push(format!("--port={}", ports.control));
        }
        FlowerDialect::TransitionalHttp => {
            // Control (and Runtime) on the HTTP(S) server; Fleet still gRPC on its own port.
            args.push(format!("--host={}", layout.control_host));
            args.push(format!("--port={}", ports.control));
            args.push(format!("--fleet-api-address={host}:{}", ports.fleet));
        }
        FlowerDialect::Transitional => {
            // The plain-HTTP server is the Runtime API only (ServerAppIO's successor): loopback.
            args.push("--host=127.0.0.1".into());
            args.push(format!("--port={serverappio}"));
            args.push(format!("--fleet-api-address={host}:{}", ports.fleet));
            args.push(format!(
                "--control-api-address={}:{}",
                layout.control_host, ports.control
            ));
        }
        FlowerDialect::Classic => {
            args.push(format!("--serverappio-api-address=127.0.0.1:{serverappio}"));
            args.push(format!("--fleet-api-address={host}:{}", ports.fleet));
            args.push(format!(
                "--control-api-address={}:{}",
                layout.control_host, ports.control
            ));
        }
    }
    args.push(format!("--database={}", layout.database));
    if version >= FIRST_DISABLE_RUNTIME_DEPS_VERSION {
        args.push("--disable-runtime-dependency-installation".into());
    }
    args.extend(fed.spec.superlink.extra_args.iter().cloned());
    args
}

/// Where the SuperLink process itself takes its SuperNodes' requests, as a loopback-dialable
/// `(host, port)`: the unified server (behind the Fleet front, if any) or the Fleet API. Once it
/// accepts a connection there, SuperNodes can activate and deactivate.
pub fn fleet_listen_address(dialect: FlowerDialect, layout: &SuperLinkLayout) -> (String, u16) {
    let (host, port) = match dialect {
        FlowerDialect::Unified if layout.ports.front => {
            (layout.control_host.as_str(), layout.ports.control)
        }
        FlowerDialect::Unified => (layout.bind_host.as_str(), layout.ports.control),
        _ => (layout.bind_host.as_str(), layout.ports.fleet),
    };
    let host = match host {
        "" | "0.0.0.0" => "127.0.0.1",
        "::" => "::1",
        h => h,
    };
    (host.to_owned(), port)
}

/// The ServerApp SuperExec's arguments (process isolation). Classic and transitional: it dials
/// the loopback plaintext ServerAppIO/Runtime API, so `--insecure` always. From 1.37 the
/// Runtime API shares the SuperLink's TLS server, so it trusts its CA. The flag names follow
/// the release ([`superexec_connect_args`]).
pub fn serverapp_superexec_argv(
    fed: &Federation,
    version: FlowerVersion,
    dialect: FlowerDialect,
    layout: &SuperLinkLayout,
) -> Vec<String> {
    match dialect {
        FlowerDialect::Classic | FlowerDialect::Transitional => {
            let serverappio = layout
                .ports
                .serverappio
                .unwrap_or(port(classic_ports::SERVERAPPIO));
            let mut args = vec!["--insecure".to_owned()];
            args.extend(superexec_connect_args(
                version,
                "serverapp",
                &format!("127.0.0.1:{serverappio}"),
            ));
            args
        }
        FlowerDialect::TransitionalHttp | FlowerDialect::Unified => {
            let mut args = superexec_connect_args(
                version,
                "serverapp",
                &format!("127.0.0.1:{}", layout.ports.control),
            );
            args.push(if fed.spec.insecure {
                "--insecure".into()
            } else {
                format!("--root-certificates={}", layout.tls_files[0])
            });
            args
        }
    }
}

/// The in-cluster DNS names of the SuperLink Services (`<fed>-superlink` and
/// `<fed>-superlink-control`).
pub fn in_cluster_names(fed: &Federation) -> Vec<String> {
    let name = superlink_name(fed.metadata.name.as_deref().unwrap_or_default());
    let ns = fed.metadata.namespace.as_deref().unwrap_or("default");
    [name.clone(), control_service_name(&name)]
        .into_iter()
        .flat_map(|name| {
            [
                name.clone(),
                format!("{name}.{ns}"),
                format!("{name}.{ns}.svc"),
                format!("{name}.{ns}.svc.cluster.local"),
            ]
        })
        .collect()
}

/// Name of the ClusterIP Service of a SuperLink's Control API, `<fed>-superlink-control`, from
/// the SuperLink's name.
pub fn control_service_name(superlink: &str) -> String {
    format!("{superlink}-control")
}

/// Where the hub reaches a Kubernetes-mode SuperLink's Control API: `(server name, address)` —
/// Service `<fed>-superlink-control.<namespace>.svc` (one of [`in_cluster_names`], so in the
/// certificate) at `spec.superlink.service.ports.extra` (the Fleet port in the unified dialect
/// when `exposeControl` serves both on one port).
pub fn in_cluster_control(fed: &Federation, dialect: FlowerDialect) -> (String, String) {
    let host = in_cluster_names(fed).swap_remove(6);
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
        assert_eq!(name, "demo-superlink-control.team.svc");
        assert_eq!(address, "demo-superlink-control.team.svc:9093");
        assert!(in_cluster_names(&f).contains(&name));
        let (_, address) = in_cluster_control(&f, FlowerDialect::Unified);
        assert_eq!(address, "demo-superlink-control.team.svc:9093");
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
            control_host: "0.0.0.0".into(),
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
                "--port=19093",
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
        let container = SuperLinkPorts::container(&f, FlowerDialect::Classic);
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
            serverapp_superexec_argv(&f, v, FlowerDialect::Classic, &layout(process, false));
        assert_eq!(
            superexec,
            [
                "--insecure",
                "--plugin-type=serverapp",
                "--appio-api-address=127.0.0.1:19091"
            ]
        );
    }

    #[test]
    fn transitional_superlinks_keep_fleet_on_grpc_and_move_runtime_then_control_to_http() {
        // NOTES.md, run on the real releases: 1.35-1.36 put only the Runtime API on the plain
        // HTTP --host/--port (loopback here), Fleet and Control stay gRPC; 1.37-1.39 serve
        // Control (and Runtime) on the TLS --host/--port, Fleet stays gRPC. Neither needs a
        // Fleet front: Fleet has a port of its own.
        let f = fed(FED);
        let standalone = |ports| SuperLinkLayout {
            control_host: "127.0.0.1".into(),
            ..layout(ports, true)
        };
        let v136 = FlowerVersion::parse("1.36.0").unwrap();
        let ports = SuperLinkPorts::from_spec(&f, FlowerDialect::Transitional);
        assert!(!ports.front);
        let argv = superlink_argv(&f, v136, FlowerDialect::Transitional, &standalone(ports));
        assert_eq!(
            argv,
            [
                "--isolation=subprocess",
                "--ssl-ca-certfile=/t/ca.crt",
                "--ssl-certfile=/t/tls.crt",
                "--ssl-keyfile=/t/tls.key",
                "--enable-supernode-auth",
                "--host=127.0.0.1",
                "--port=19091",
                "--fleet-api-address=0.0.0.0:19092",
                "--control-api-address=127.0.0.1:19093",
                "--database=/s/superlink.db",
                "--disable-runtime-dependency-installation",
            ]
        );
        assert_eq!(
            serverapp_superexec_argv(&f, v136, FlowerDialect::Transitional, &standalone(ports)),
            [
                "--insecure",
                "--plugin-type=serverapp",
                "--runtime-api-address=127.0.0.1:19091"
            ]
        );
        let container = SuperLinkPorts::container(&f, FlowerDialect::Transitional);
        assert_eq!(
            (container.fleet, container.control, container.serverappio),
            (9092, 9093, Some(9091))
        );

        let v139 = FlowerVersion::parse("1.39.0").unwrap();
        let ports = SuperLinkPorts::from_spec(&f, FlowerDialect::TransitionalHttp);
        assert_eq!(ports.serverappio, None);
        assert!(!ports.front);
        let argv = superlink_argv(
            &f,
            v139,
            FlowerDialect::TransitionalHttp,
            &standalone(ports),
        );
        assert_eq!(
            argv[5..],
            [
                "--host=127.0.0.1",
                "--port=19093",
                "--fleet-api-address=0.0.0.0:19092",
                "--database=/s/superlink.db",
                "--disable-runtime-dependency-installation",
            ]
        );
        assert_eq!(
            serverapp_superexec_argv(
                &f,
                v139,
                FlowerDialect::TransitionalHttp,
                &standalone(ports)
            ),
            [
                "--runtime-api-address=127.0.0.1:19093",
                "--root-certificates=/t/ca.crt"
            ]
        );
    }

    #[test]
    fn control_stays_off_the_fleet_endpoint_unless_exposed() {
        // Whoever reaches the Fleet port (every SuperNode) must not reach the Control API. Unified
        // (one server): a front on the Fleet port, the SuperLink on the Control port and
        // control_host (loopback for a standalone process); its own SuperExec dials that server.
        // Classic: Control on control_host. exposeControl: today's layout.
        let f = fed(FED);
        let v = FlowerVersion::parse("1.42.0").unwrap();
        let ports = SuperLinkPorts::from_spec(&f, FlowerDialect::Unified);
        assert_eq!(
            ports,
            SuperLinkPorts {
                fleet: 19092,
                control: 19093,
                serverappio: None,
                front: true
            }
        );
        let standalone = SuperLinkLayout {
            control_host: "127.0.0.1".into(),
            ..layout(ports, true)
        };
        let argv = superlink_argv(&f, v, FlowerDialect::Unified, &standalone);
        assert!(argv.contains(&"--host=127.0.0.1".to_owned()), "{argv:?}");
        assert!(argv.contains(&"--port=19093".to_owned()), "{argv:?}");
        let superexec = serverapp_superexec_argv(&f, v, FlowerDialect::Unified, &standalone);
        assert!(superexec.contains(&"--runtime-api-address=127.0.0.1:19093".to_owned()));
        let container = SuperLinkPorts::container(&f, FlowerDialect::Unified);
        assert_eq!((container.fleet, container.control), (FRONT_PORT, 8000));
        assert!(container.front);

        let classic = SuperLinkPorts::from_spec(&f, FlowerDialect::Classic);
        assert!(!classic.front);
        let argv = superlink_argv(
            &f,
            FlowerVersion::parse("1.25.0").unwrap(),
            FlowerDialect::Classic,
            &SuperLinkLayout {
                control_host: "127.0.0.1".into(),
                ..layout(classic, true)
            },
        );
        assert!(argv.contains(&"--fleet-api-address=0.0.0.0:19092".to_owned()));
        assert!(argv.contains(&"--control-api-address=127.0.0.1:19093".to_owned()));

        let mut exposed = fed(FED);
        exposed.spec.superlink.service.expose_control = true;
        let ports = SuperLinkPorts::from_spec(&exposed, FlowerDialect::Unified);
        assert_eq!(
            (ports.fleet, ports.control, ports.front),
            (19092, 19092, false)
        );
        let argv = superlink_argv(&exposed, v, FlowerDialect::Unified, &layout(ports, true));
        assert!(argv.contains(&"--host=0.0.0.0".to_owned()));
        assert!(argv.contains(&"--port=19092".to_owned()));
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
            "demo-superlink-control.default.svc",
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

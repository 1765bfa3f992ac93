//! Where spokes and `flwr` reach a placed Federation's SuperLink from outside the hub cluster.
//!
//! `spec.superlink.externalAddress` wins. Without it the address comes from the SuperLink Service
//! the hub applied: `NodePort` → the hub's node address (`flower-hub serve --node-address`) and
//! the allocated (or pinned) node port; `LoadBalancer` → the ingress IP or hostname once the
//! platform assigns one, with the Service port. A `ClusterIP` Service cannot be reached from
//! other clusters, so it needs `externalAddress` (a validation problem, see
//! [`super::render_problems`]). Pure: the controller passes the Service as applied.

use flower_addon_crds::render::FlowerDialect;
use flower_addon_crds::{Federation, ServiceType};
use k8s_openapi::api::core::v1::Service;

use flower_addon_crds::render::address::{host_of, with_default_port};

/// External Fleet and Control addresses of a SuperLink (`host:port`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalEndpoints {
    /// What spokes' SuperNodes dial (`status.endpoints.fleet`).
    pub fleet: String,
    /// What `flwr` dials from outside the hub cluster (`status.endpoints.control`), when known.
    pub control: Option<String>,
}

impl ExternalEndpoints {
    /// The host of the Fleet address (for the SuperLink certificate's SANs).
    pub fn fleet_host(&self) -> &str {
        host_of(&self.fleet)
    }
}

/// Why no external address is known (yet).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExternalAddressError {
    /// A `ClusterIP` Service and no `externalAddress`: nothing outside the cluster reaches it.
    #[error(
        "spec.superlink.externalAddress: required when spec.placementRef is set and spec.superlink.service.type is ClusterIP (spokes cannot reach a cluster IP); set it, or use service.type NodePort or LoadBalancer"
    )]
    NotExposed,
    /// A `NodePort` Service, but the hub was not told its nodes' address.
    #[error(
        "spec.superlink.externalAddress: not set, and the hub has no node address to derive it from the NodePort Service: start flower-hub serve with --node-address HOST (an address of the hub cluster's nodes that spokes reach), or set externalAddress"
    )]
    NoNodeAddress,
    /// The Service exists but Kubernetes has not filled in what the address needs yet.
    #[error("waiting for {0}")]
    Pending(String),
}

/// The external endpoints of `fed` (a Federation with `placementRef`) given its Service as
/// applied (`None` before it exists) and the hub cluster's node address. The Control address is
/// known only with `spec.superlink.service.exposeControl`: otherwise nothing outside the hub
/// cluster serves the Control API (`flower-hub connect` port-forwards to it).
pub fn external_endpoints(
    fed: &Federation,
    dialect: FlowerDialect,
    service: Option<&Service>,
    node_address: Option<&str>,
) -> Result<ExternalEndpoints, ExternalAddressError> {
    let mut endpoints = exposed_endpoints(fed, dialect, service, node_address)?;
    if crate::core::superlink::separate_control(fed) {
        endpoints.control = None;
    }
    Ok(endpoints)
}

fn exposed_endpoints(
    fed: &Federation,
    dialect: FlowerDialect,
    service: Option<&Service>,
    node_address: Option<&str>,
) -> Result<ExternalEndpoints, ExternalAddressError> {
    let superlink = &fed.spec.superlink;
    let ports = superlink.service.ports;
    // The unified dialect serves Control on the Fleet server: one address does both.
    let single_port = dialect == FlowerDialect::Unified && ports.extra == ports.grpc;
    if let Some(address) = superlink
        .external_address
        .as_deref()
        .filter(|a| !a.is_empty())
    {
        let fleet = with_default_port(address, ports.grpc);
        let control = if single_port {
            Some(fleet.clone())
        } else if fleet != address {
            // A bare host: the Service ports are exposed as they are (a load balancer, a VIP).
            Some(with_default_port(address, ports.extra))
        } else {
            None
        };
        return Ok(ExternalEndpoints { fleet, control });
    }
    match superlink.service.type_ {
        ServiceType::ClusterIP => Err(ExternalAddressError::NotExposed),
        ServiceType::LoadBalancer => {
            let ingress = service
                .and_then(|s| s.status.as_ref())
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .and_then(|list| {
                    list.iter().find_map(|i| {
                        i.ip
                            .clone()
                            .filter(|ip| !ip.is_empty())
                            .or_else(|| i.hostname.clone().filter(|h| !h.is_empty()))
                    })
                })
                .ok_or_else(|| {
                    ExternalAddressError::Pending(format!(
                        "the load balancer of Service {}-superlink to get an ingress IP or hostname",
                        fed.metadata.name.as_deref().unwrap_or_default()
                    ))
                })?;
            let fleet = with_default_port(&ingress, ports.grpc);
            let control = Some(with_default_port(&ingress, ports.extra));
            Ok(ExternalEndpoints { fleet, control })
        }
        ServiceType::NodePort => {
            let node = node_address
                .filter(|a| !a.is_empty())
                .ok_or(ExternalAddressError::NoNodeAddress)?;
            let node_port = |name: &str| {
                service
                    .and_then(|s| s.spec.as_ref())
                    .and_then(|s| s.ports.as_ref())
                    .and_then(|ports| ports.iter().find(|p| p.name.as_deref() == Some(name)))
                    .and_then(|p| p.node_port)
            };
            let fleet_port = node_port("fleet").ok_or_else(|| {
                ExternalAddressError::Pending(format!(
                    "Kubernetes to allocate the fleet node port of Service {}-superlink",
                    fed.metadata.name.as_deref().unwrap_or_default()
                ))
            })?;
            let fleet = with_default_port(node, fleet_port);
            let control = if single_port {
                Some(fleet.clone())
            } else {
                node_port("control").map(|p| with_default_port(node, p))
            };
            Ok(ExternalEndpoints { fleet, control })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, ServicePort, ServiceSpec, ServiceStatus,
    };

    fn fed(superlink: &str) -> Federation {
        let yaml = format!(
            r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {{name: f, namespace: ns}}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  superlink: {superlink}
  placementRef: {{name: p}}
  supernodes: {{image: "flwr/supernode:1.42.0", pools: [{{name: a, replicas: 1}}]}}
"#
        );
        serde_saphyr::from_str(&yaml).expect("test federation")
    }

    fn node_port_service(fleet: Option<i32>, control: Option<i32>) -> Service {
        let port = |name: &str, node_port| ServicePort {
            name: Some(name.into()),
            port: 1,
            node_port,
            ..ServicePort::default()
        };
        Service {
            spec: Some(ServiceSpec {
                ports: Some(vec![port("fleet", fleet), port("control", control)]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        }
    }

    #[test]
    fn an_explicit_external_address_wins() {
        // externalAddress is used as written even when the Service could give another address.
        let f = fed(
            r#"{image: "flwr/superlink:1.25.0", externalAddress: "hub.example:31000", service: {type: NodePort}}"#,
        );
        let svc = node_port_service(Some(30001), Some(30002));
        let got = external_endpoints(&f, FlowerDialect::Classic, Some(&svc), Some("198.18.0.1"));
        assert_eq!(
            got,
            Ok(ExternalEndpoints {
                fleet: "hub.example:31000".into(),
                control: None
            })
        );
        // A bare host gets the Service ports for both APIs, Control only when exposed.
        let f = fed(
            r#"{image: "flwr/superlink:1.25.0", externalAddress: "hub.example", service: {exposeControl: true}}"#,
        );
        let got = external_endpoints(&f, FlowerDialect::Classic, None, None).unwrap();
        assert_eq!(got.fleet, "hub.example:9092");
        assert_eq!(got.control.as_deref(), Some("hub.example:9093"));
        let f = fed(r#"{image: "flwr/superlink:1.25.0", externalAddress: "hub.example"}"#);
        let got = external_endpoints(&f, FlowerDialect::Classic, None, None).unwrap();
        assert_eq!(got.fleet, "hub.example:9092");
        assert_eq!(got.control, None);
    }

    #[test]
    fn node_port_services_give_node_address_and_node_port() {
        // No externalAddress + NodePort: spokes dial the hub's node address at the fleet node port.
        let f = fed(
            r#"{image: "flwr/superlink:1.25.0", service: {type: NodePort, exposeControl: true}}"#,
        );
        let svc = node_port_service(Some(30092), Some(30093));
        let got =
            external_endpoints(&f, FlowerDialect::Classic, Some(&svc), Some("198.18.0.1")).unwrap();
        assert_eq!(got.fleet, "198.18.0.1:30092");
        assert_eq!(got.control.as_deref(), Some("198.18.0.1:30093"));
        assert_eq!(got.fleet_host(), "198.18.0.1");
        // Not exposed (the default): no Control address outside the cluster.
        let f = fed(r#"{image: "flwr/superlink:1.42.0", service: {type: NodePort}}"#);
        let svc = node_port_service(Some(30092), None);
        let got = external_endpoints(&f, FlowerDialect::Unified, Some(&svc), Some("hub.example"))
            .unwrap();
        assert_eq!(
            got,
            ExternalEndpoints {
                fleet: "hub.example:30092".into(),
                control: None
            }
        );
        // The unified dialect with one port: Control is the same address.
        let f = fed(
            r#"{image: "flwr/superlink:1.42.0", service: {type: NodePort, exposeControl: true, ports: {grpc: 9092, extra: 9092}}}"#,
        );
        let svc = node_port_service(Some(30092), None);
        let got = external_endpoints(&f, FlowerDialect::Unified, Some(&svc), Some("hub.example"))
            .unwrap();
        assert_eq!(got.control.as_deref(), Some("hub.example:30092"));
    }

    #[test]
    fn missing_facts_are_named() {
        // Each missing piece gives its own error, never a guessed address.
        let np = fed(r#"{image: "flwr/superlink:1.25.0", service: {type: NodePort}}"#);
        assert_eq!(
            external_endpoints(&np, FlowerDialect::Classic, None, None),
            Err(ExternalAddressError::NoNodeAddress)
        );
        assert!(matches!(
            external_endpoints(&np, FlowerDialect::Classic, None, Some("198.18.0.1")),
            Err(ExternalAddressError::Pending(_))
        ));
        let cip = fed(r#"{image: "flwr/superlink:1.25.0"}"#);
        let err = external_endpoints(&cip, FlowerDialect::Classic, None, Some("h")).unwrap_err();
        assert_eq!(err, ExternalAddressError::NotExposed);
        assert!(
            err.to_string()
                .starts_with("spec.superlink.externalAddress: ")
        );
        let lb = fed(r#"{image: "flwr/superlink:1.25.0", service: {type: LoadBalancer}}"#);
        assert!(matches!(
            external_endpoints(&lb, FlowerDialect::Classic, Some(&Service::default()), None),
            Err(ExternalAddressError::Pending(_))
        ));
    }

    #[test]
    fn load_balancers_give_their_ingress() {
        // LoadBalancer: the ingress IP (or hostname) with the Service ports.
        let f = fed(
            r#"{image: "flwr/superlink:1.25.0", service: {type: LoadBalancer, exposeControl: true}}"#,
        );
        let svc = Service {
            status: Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress {
                        hostname: Some("lb.example".into()),
                        ..LoadBalancerIngress::default()
                    }]),
                }),
                ..ServiceStatus::default()
            }),
            ..Service::default()
        };
        let got = external_endpoints(&f, FlowerDialect::Classic, Some(&svc), None).unwrap();
        assert_eq!(got.fleet, "lb.example:9092");
        assert_eq!(got.control.as_deref(), Some("lb.example:9093"));
    }
}

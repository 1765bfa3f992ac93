//! The SuperLink Service `<fed>-superlink`.

use std::collections::BTreeMap;

use flower_addon_crds::render::dialect::classic_ports;
use flower_addon_crds::render::merge::merge_maps_under;
use flower_addon_crds::render::{FlowerDialect, component_labels, object_labels};
use flower_addon_crds::{Federation, IsolationMode, ServiceType};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{HubRenderError, name, namespace, superlink_name};
use crate::core::superlink::{SuperLinkPorts, control_service_name};

fn service_port(name: &str, port: i32, target: i32, node_port: Option<i32>) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port,
        target_port: Some(IntOrString::Int(target)),
        protocol: Some("TCP".to_owned()),
        node_port,
        ..ServicePort::default()
    }
}

/// Renders the SuperLink Service `<fed>-superlink` of `spec.superlink.service.type`. Port
/// `fleet` is `ports.grpc` (what SuperNodes dial; in the unified dialect the Fleet front's port
/// unless `exposeControl`), `control` is `ports.extra` (`flwr`) — only with `exposeControl`:
/// otherwise the SuperLink serves Control on its pod's loopback only, since whoever reaches it
/// (a SuperNode through a NodePort, or any pod of the cluster: another tenant's ServerApp) could
/// run code on every SuperNode. `serverappio` is `ports.serverAppIO` (classic, process mode only). When
/// the unified dialect serves Fleet and Control on one port (`exposeControl`), both ports target
/// it (one port when they are equal). User labels go under ours; the selector is ours only.
pub fn render_superlink_service(
    fed: &Federation,
    dialect: FlowerDialect,
) -> Result<Service, HubRenderError> {
    let service = &fed.spec.superlink.service;
    let ports = service.ports;
    // Pinned node ports only where Kubernetes allows them (validation refuses them on ClusterIP).
    let exposed = service.type_ != ServiceType::ClusterIP;
    let with_control = service.expose_control;
    let node = |port: Option<i32>| port.filter(|_| exposed);
    let node_ports = service.node_ports;
    let process = fed.spec.isolation_mode == IsolationMode::Process;
    let container = SuperLinkPorts::container(fed, dialect);
    let mut list = vec![service_port(
        "fleet",
        ports.grpc,
        i32::from(container.fleet),
        node(node_ports.grpc),
    )];
    let single_port =
        !container.front && dialect == FlowerDialect::Unified && ports.extra == ports.grpc;
    if with_control && !single_port {
        list.push(service_port(
            "control",
            ports.extra,
            i32::from(container.control),
            node(node_ports.extra),
        ));
    }
    if dialect == FlowerDialect::Classic && process {
        list.push(service_port(
            "serverappio",
            ports.server_app_io,
            classic_ports::SERVERAPPIO,
            node(node_ports.server_app_io),
        ));
    }
    let mut seen = BTreeMap::new();
    for p in &list {
        if let Some(other) = seen.insert(p.port, p.name.clone().unwrap_or_default()) {
            return Err(HubRenderError::PortClash(format!(
                "ports {other} and {} are both {}; they are served separately (Fleet and Control apart unless exposeControl)",
                p.name.as_deref().unwrap_or_default(),
                p.port
            )));
        }
    }
    let labels = component_labels(name(fed), "superlink", "superlink", None);
    let meta_labels = object_labels(name(fed), "superlink", "superlink", None);
    let type_ = match service.type_ {
        ServiceType::ClusterIP => "ClusterIP",
        ServiceType::NodePort => "NodePort",
        ServiceType::LoadBalancer => "LoadBalancer",
    };
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(superlink_name(name(fed))),
            namespace: Some(namespace(fed).to_owned()),
            labels: merge_maps_under(Some(&service.labels), Some(meta_labels)),
            annotations: (!service.annotations.is_empty()).then(|| service.annotations.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some(type_.to_owned()),
            selector: Some(labels),
            ports: Some(list),
            load_balancer_source_ranges: (service.type_ == ServiceType::LoadBalancer
                && !service.load_balancer_source_ranges.is_empty())
            .then(|| service.load_balancer_source_ranges.clone()),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// Renders Service `<fed>-superlink-control` (ClusterIP) of a Federation with `exposeControl`:
/// the SuperLink's Control API at `ports.extra`, where the hub registers SuperNode keys and reads
/// node state, whatever `<fed>-superlink` exposes. Without `exposeControl` there is none: Control
/// listens on the pod's loopback, and the hub and people (`flower-hub connect`) reach it through
/// a port-forward.
pub fn render_superlink_control_service(
    fed: &Federation,
    dialect: FlowerDialect,
) -> Option<Service> {
    let service = &fed.spec.superlink.service;
    if !service.expose_control {
        return None;
    }
    let container = SuperLinkPorts::container(fed, dialect);
    let labels = component_labels(name(fed), "superlink", "superlink", None);
    let meta_labels = object_labels(name(fed), "superlink", "superlink", None);
    Some(Service {
        metadata: ObjectMeta {
            name: Some(control_service_name(&superlink_name(name(fed)))),
            namespace: Some(namespace(fed).to_owned()),
            labels: merge_maps_under(Some(&service.labels), Some(meta_labels)),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(labels),
            ports: Some(vec![service_port(
                "control",
                service.ports.extra,
                i32::from(container.control),
                None,
            )]),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

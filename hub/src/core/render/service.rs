//! The SuperLink Service `<fed>-superlink`.

use std::collections::BTreeMap;

use flower_addon_crds::render::dialect::{classic_ports, unified_ports};
use flower_addon_crds::render::merge::merge_maps_under;
use flower_addon_crds::render::{FlowerDialect, component_labels, object_labels};
use flower_addon_crds::{Federation, IsolationMode, ServiceType};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{HubRenderError, name, namespace, superlink_name};

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

/// Renders the SuperLink Service. Port `fleet` is `ports.grpc` (what SuperNodes dial), `control`
/// is `ports.extra` (`flwr`), `serverappio` is `ports.serverAppIO` (classic, process mode only).
/// In the unified dialect Fleet and Control are one server, so both ports target it (one port
/// when they are equal). User labels go under ours; the selector is ours only.
pub fn render_superlink_service(
    fed: &Federation,
    dialect: FlowerDialect,
) -> Result<Service, HubRenderError> {
    let service = &fed.spec.superlink.service;
    let ports = service.ports;
    // Pinned node ports only where Kubernetes allows them (validation refuses them on ClusterIP).
    let exposed = service.type_ != ServiceType::ClusterIP;
    let node = |port: Option<i32>| port.filter(|_| exposed);
    let node_ports = service.node_ports;
    let process = fed.spec.isolation_mode == IsolationMode::Process;
    let mut list = Vec::new();
    match dialect {
        FlowerDialect::Classic => {
            list.push(service_port(
                "fleet",
                ports.grpc,
                classic_ports::FLEET,
                node(node_ports.grpc),
            ));
            list.push(service_port(
                "control",
                ports.extra,
                classic_ports::CONTROL,
                node(node_ports.extra),
            ));
            if process {
                list.push(service_port(
                    "serverappio",
                    ports.server_app_io,
                    classic_ports::SERVERAPPIO,
                    node(node_ports.server_app_io),
                ));
            }
        }
        FlowerDialect::Unified => {
            list.push(service_port(
                "fleet",
                ports.grpc,
                unified_ports::SUPERLINK,
                node(node_ports.grpc),
            ));
            if ports.extra != ports.grpc {
                list.push(service_port(
                    "control",
                    ports.extra,
                    unified_ports::SUPERLINK,
                    node(node_ports.extra),
                ));
            }
        }
    }
    let mut seen = BTreeMap::new();
    for p in &list {
        if let Some(other) = seen.insert(p.port, p.name.clone().unwrap_or_default()) {
            return Err(HubRenderError::PortClash(format!(
                "ports {other} and {} are both {}; the {} dialect serves them separately",
                p.name.as_deref().unwrap_or_default(),
                p.port,
                dialect.name()
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
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

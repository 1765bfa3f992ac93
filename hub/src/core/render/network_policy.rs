//! The NetworkPolicy `<fed>-superlink`: which ports of the SuperLink pod the pod network may
//! reach.

use flower_addon_crds::Federation;
use flower_addon_crds::render::{FlowerDialect, component_labels, object_labels};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::core::superlink::{SuperLinkPorts, separate_control};

use super::{name, namespace, superlink_name};

/// Renders NetworkPolicy `<fed>-superlink`: ingress to the SuperLink pod only on the port
/// SuperNodes dial (the Fleet API, or the Fleet front in the unified dialect), from anywhere
/// (SuperNodes of the hub cluster and, through the node port or load balancer, of spokes); the
/// Control port too with `exposeControl`. Everything else a SuperLink pod listens on is on its
/// loopback (Control, ServerAppIO, the outputs sidecar); the policy keeps it so where the network
/// plugin enforces policies, should an `extraArgs` or a future Flower bind more widely.
pub fn render_superlink_network_policy(fed: &Federation, dialect: FlowerDialect) -> NetworkPolicy {
    let ports = SuperLinkPorts::container(fed, dialect);
    let mut numbers = vec![ports.fleet];
    if !separate_control(fed) {
        numbers.push(ports.control);
    }
    numbers.sort_unstable();
    numbers.dedup();
    let fed_name = name(fed);
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(superlink_name(fed_name)),
            namespace: Some(namespace(fed).to_owned()),
            labels: Some(object_labels(fed_name, "superlink", "superlink", None)),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(component_labels(fed_name, "superlink", "superlink", None)),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: None,
                ports: Some(
                    numbers
                        .into_iter()
                        .map(|port| NetworkPolicyPort {
                            port: Some(IntOrString::Int(i32::from(port))),
                            protocol: Some("TCP".to_owned()),
                            ..NetworkPolicyPort::default()
                        })
                        .collect(),
                ),
            }]),
            ..NetworkPolicySpec::default()
        }),
    }
}

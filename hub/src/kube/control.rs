//! How the hub reaches a Federation's SuperLink Control API in Kubernetes mode: the SuperLink
//! Service's in-cluster name ([`crate::core::superlink::in_cluster_control`]), verified against
//! the Flower CA that signed the SuperLink certificate. Key registration
//! ([`crate::kube::work`]) and the FlowerRun controller ([`crate::kube::controller::runs`]) both
//! dial it this way.
use flower_addon_crds::Federation;

use crate::core::render::federation_dialect;
use crate::flower::control::ControlEndpoint;

/// The Control endpoint of `fed`'s SuperLink, TLS verified with `ca_pem` (plaintext for an
/// insecure Federation); `None` when its Flower version or images name no dialect (the
/// Federation controller reports that spec as invalid).
pub fn in_cluster_endpoint(fed: &Federation, ca_pem: &str) -> Option<ControlEndpoint> {
    let (_, dialect) = federation_dialect(fed).ok()?;
    let (server_name, address) = crate::core::superlink::in_cluster_control(fed, dialect);
    Some(ControlEndpoint {
        dialect,
        address,
        server_name,
        ca_pem: (!fed.spec.insecure).then(|| ca_pem.to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use flower_addon_crds::render::FlowerDialect;

    fn federation(insecure: bool, image: &str) -> Federation {
        serde_saphyr::from_str(&format!(
            r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {{name: fed, namespace: team}}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  insecure: {insecure}
  superlink: {{image: "{image}"}}
  supernodes: {{image: "flwr/supernode:1.42.0", pools: [{{name: a, replicas: 1}}]}}
"#
        ))
        .expect("federation")
    }

    #[test]
    fn the_superlink_is_dialled_at_its_service_verified_unless_insecure() {
        // Invariant: TLS Federations are verified with the Flower CA at the Control Service's
        // name; an insecure one is spoken to in plaintext (no CA: a TLS dial would fail).
        let tls = in_cluster_endpoint(&federation(false, "flwr/superlink:1.42.0"), "CA")
            .expect("endpoint");
        assert_eq!(tls.dialect, FlowerDialect::Unified);
        assert_eq!(tls.address, "fed-superlink-control.team.svc:9093");
        assert_eq!(tls.server_name, "fed-superlink-control.team.svc");
        assert_eq!(tls.ca_pem.as_deref(), Some("CA"));
        let insecure = in_cluster_endpoint(&federation(true, "flwr/superlink:1.42.0"), "CA")
            .expect("endpoint");
        assert_eq!(insecure.ca_pem, None);
        let classic = in_cluster_endpoint(&federation(false, "flwr/superlink:1.25.0"), "CA")
            .expect("endpoint");
        assert_eq!(classic.dialect, FlowerDialect::Classic);
    }
}

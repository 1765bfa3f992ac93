//! How the hub reaches a Federation's SuperLink Control API in Kubernetes mode. Unless the
//! Federation sets `exposeControl`, the SuperLink serves Control on its pod's loopback only (no
//! pod of the cluster — another tenant's ServerApp included — can reach it), and the hub dials it
//! through a port-forward via the API server, as `flower-hub connect` and `run fetch` do. With
//! `exposeControl` it dials Service `<fed>-superlink-control`. Either way TLS is verified against
//! the Flower CA that signed the SuperLink certificate, at the name
//! [`crate::core::superlink::in_cluster_control`] gives. Key registration
//! ([`crate::kube::work`]) and the FlowerRun controller ([`crate::kube::controller::runs`]) both
//! dial it this way.
use std::sync::Arc;

use flower_addon_crds::Federation;
use k8s_openapi::api::core::v1::Pod;

use crate::core::render::{federation_dialect, superlink_name};
use crate::core::superlink::{SuperLinkPorts, separate_control};
use crate::flower::control::{ControlEndpoint, IoStream, Opener, Opening, Tunnel};
use crate::flower::diagnose::LogSource;
use crate::registration::ca::HubCa;

/// Makes the tunnel to port `port` of pod `namespace/pod`.
pub type Forward = Arc<dyn Fn(&str, &str, u16) -> Tunnel + Send + Sync>;

/// Port-forwards through the API server with `client`'s credentials (`get` and `create` on
/// `pods/portforward` in the Federation's namespace: the hub's ClusterRole has them).
pub fn port_forward(client: kube::Client) -> Forward {
    Arc::new(move |namespace: &str, pod: &str, port: u16| Tunnel {
        describe: format!("port-forward {namespace}/{pod}:{port}"),
        opener: Arc::new(PortForward {
            client: client.clone(),
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
            port,
        }),
    })
}

struct PortForward {
    client: kube::Client,
    namespace: String,
    pod: String,
    port: u16,
}

impl Opener for PortForward {
    fn open(&self) -> Opening<'_> {
        Box::pin(async move {
            let stream =
                crate::kube::portforward::open(&self.client, &self.namespace, &self.pod, self.port)
                    .await
                    .map_err(|e| {
                        std::io::Error::other(format!(
                            "port-forward to pod {}/{} port {}: {e}",
                            self.namespace, self.pod, self.port
                        ))
                    })?;
            Ok(Box::new(stream) as Box<dyn IoStream>)
        })
    }
}

/// The Control endpoint of `fed`'s SuperLink, TLS verified with the Federation's own CA bundle
/// derived from the Flower CA `ca` (plaintext for an insecure Federation): through `forward` to
/// pod `<fed>-superlink-0` unless the Federation exposes Control; `None` when its Flower version
/// or images name no dialect (the Federation controller reports that spec as invalid).
pub fn in_cluster_endpoint(
    fed: &Federation,
    ca: &HubCa,
    forward: &Forward,
) -> Option<ControlEndpoint> {
    let (_, dialect) = federation_dialect(fed).ok()?;
    let ca_pem = if fed.spec.insecure {
        None
    } else {
        let namespace = fed.metadata.namespace.as_deref().unwrap_or("default");
        let name = fed.metadata.name.as_deref().unwrap_or_default();
        match ca.federation(namespace, name) {
            Ok(federation_ca) => Some(federation_ca.bundle_pem().to_owned()),
            Err(e) => {
                tracing::error!(%namespace, federation = %name, error = %e, "cannot derive the Federation's SuperLink CA");
                return None;
            }
        }
    };
    let (server_name, address) = crate::core::superlink::in_cluster_control(fed, dialect);
    let tunnel = separate_control(fed).then(|| {
        let pod = format!(
            "{}-0",
            superlink_name(fed.metadata.name.as_deref().unwrap_or_default())
        );
        let namespace = fed.metadata.namespace.as_deref().unwrap_or("default");
        forward(
            namespace,
            &pod,
            SuperLinkPorts::container(fed, dialect).control,
        )
    });
    Some(ControlEndpoint {
        dialect,
        address,
        server_name,
        ca_pem,
        tunnel,
    })
}

/// A [`Forward`] for tests: its tunnels describe where they lead and fail when opened.
/// Reads the SuperLink container's log through the API server (`get` on `pods/log`: the hub's
/// ClusterRole has it): what it logged since the last read ([`crate::flower::diagnose`]).
struct PodLog {
    api: kube::Api<Pod>,
    pod: String,
    read_at: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How far back the first read of a SuperLink's log goes, seconds.
const FIRST_LOG_WINDOW: u64 = 300;

impl crate::flower::diagnose::SuperLinkLog for PodLog {
    fn recent(
        &self,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<String, String>> + Send + '_>> {
        Box::pin(async move {
            let since = {
                let mut at = self.read_at.lock().unwrap_or_else(|p| p.into_inner());
                let since = at.map_or(FIRST_LOG_WINDOW, |t| t.elapsed().as_secs() + 1);
                *at = Some(std::time::Instant::now());
                since
            };
            let params = kube::api::LogParams {
                container: Some(crate::core::render::SUPERLINK_CONTAINER.to_owned()),
                since_seconds: Some(i64::try_from(since).unwrap_or(i64::MAX)),
                tail_lines: Some(2_000),
                limit_bytes: Some(
                    i64::try_from(crate::flower::diagnose::LOG_WINDOW).unwrap_or(i64::MAX),
                ),
                ..kube::api::LogParams::default()
            };
            self.api
                .logs(&self.pod, &params)
                .await
                .map_err(|e| format!("log of pod {}: {e}", self.pod))
        })
    }
}

/// The log of the Federation's SuperLink container, and where its database is and how to
/// give it room ([`crate::flower::diagnose::LogSource`]).
pub fn superlink_log(fed: &Federation, client: &kube::Client) -> LogSource {
    let name = fed.metadata.name.as_deref().unwrap_or_default();
    let namespace = fed.metadata.namespace.as_deref().unwrap_or("default");
    let statefulset = superlink_name(name);
    let pod = format!("{statefulset}-0");
    let state = crate::core::render::STATE_VOLUME;
    let storage = if fed
        .spec
        .superlink
        .volume_claim_templates
        .iter()
        .any(|c| c.metadata.name == state)
    {
        format!(
            "Its database is on the claim {state}-{pod} in namespace {namespace}: expand it \
             (raise spec.resources.requests.storage of that PersistentVolumeClaim; its \
             StorageClass must allow volume expansion) or free space on its volume"
        )
    } else {
        format!(
            "Its database is on an emptyDir of pod {namespace}/{pod}, on its node's disk: free \
             space on that node (or raise the emptyDir's sizeLimit), or give the Federation a \
             claim named {state} in spec.superlink.volumeClaimTemplates"
        )
    };
    LogSource {
        describe: format!("container superlink of pod {namespace}/{pod}"),
        storage,
        reader: Arc::new(PodLog {
            api: kube::Api::namespaced(client.clone(), namespace),
            pod,
            read_at: std::sync::Mutex::new(None),
        }),
    }
}

#[cfg(test)]
pub fn unreachable_forward() -> Forward {
    struct Fails;
    impl Opener for Fails {
        fn open(&self) -> Opening<'_> {
            Box::pin(async { Err(std::io::Error::other("no API server in this test")) })
        }
    }
    Arc::new(|namespace: &str, pod: &str, port: u16| Tunnel {
        describe: format!("port-forward {namespace}/{pod}:{port}"),
        opener: Arc::new(Fails),
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
    fn the_superlink_is_dialled_through_a_port_forward_verified_unless_insecure() {
        // Invariant: TLS Federations are verified with the Flower CA at the Control Service's
        // name; an insecure one is spoken to in plaintext (no CA: a TLS dial would fail).
        // Control is on the pod's loopback: the hub port-forwards to the pod, and only with
        // `exposeControl` dials the Service.
        let forward = unreachable_forward();
        let ca = HubCa::generate_for(crate::registration::ca::CaRole::Flower).expect("CA");
        let tls = in_cluster_endpoint(&federation(false, "flwr/superlink:1.42.0"), &ca, &forward)
            .expect("endpoint");
        assert_eq!(tls.dialect, FlowerDialect::Unified);
        assert_eq!(tls.address, "fed-superlink-control.team.svc:9093");
        assert_eq!(tls.server_name, "fed-superlink-control.team.svc");
        // The Federation's own CA, not the hub's Flower CA.
        let own = ca.federation("team", "fed").expect("Federation CA");
        assert_eq!(tls.ca_pem.as_deref(), Some(own.bundle_pem()));
        assert_ne!(tls.ca_pem.as_deref(), Some(ca.bundle_pem()));
        assert_eq!(
            tls.tunnel.as_ref().map(|t| t.describe.as_str()),
            Some("port-forward team/fed-superlink-0:8000")
        );
        let mut exposed = federation(false, "flwr/superlink:1.42.0");
        exposed.spec.superlink.service.expose_control = true;
        let exposed = in_cluster_endpoint(&exposed, &ca, &forward).expect("endpoint");
        assert_eq!(exposed.tunnel, None, "exposeControl: the Service, over TCP");
        // (Flower >= 1.40 then serves Fleet and Control on the one exposed port.)
        assert_eq!(exposed.address, "fed-superlink-control.team.svc:9092");
        let insecure =
            in_cluster_endpoint(&federation(true, "flwr/superlink:1.42.0"), &ca, &forward)
                .expect("endpoint");
        assert_eq!(insecure.ca_pem, None);
        let classic =
            in_cluster_endpoint(&federation(false, "flwr/superlink:1.25.0"), &ca, &forward)
                .expect("endpoint");
        assert_eq!(classic.dialect, FlowerDialect::Classic);
    }
}

//! The registration commands against the hub cluster's Kubernetes API: connecting (kubeconfig,
//! context or in-cluster), the address agents dial (from the Service `flower-hub`), and
//! Federations for `status`.
use crate::kube::store::HUB_SERVICE;
use anyhow::Context;
use flower_addon_crds::Federation;
use k8s_openapi::api::core::v1::{Node, Service, ServicePort};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use std::path::Path;
use std::time::Duration;

/// Placeholder host printed when the hub address cannot be derived.
pub const PLACEHOLDER_HOST: &str = "HUB_HOST";

/// A client for the hub cluster, checked to answer, and a description of where its
/// configuration came from (for messages).
pub async fn connect(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> anyhow::Result<(Client, String)> {
    let standalone = "for a standalone hub pass --state-dir DIR (or set FLOWER_HUB_STATE_DIR)";
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let (mut config, source) = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {}; {standalone}", path.display()))?;
            from_kubeconfig(
                kc,
                context,
                &options,
                &format!("kubeconfig {}", path.display()),
            )
            .await?
        }
        None => match Kubeconfig::read() {
            Ok(kc) => {
                let file = match std::env::var("KUBECONFIG") {
                    Ok(v) if !v.is_empty() => format!("kubeconfig KUBECONFIG={v}"),
                    _ => "kubeconfig ~/.kube/config".to_owned(),
                };
                from_kubeconfig(kc, context, &options, &file).await?
            }
            Err(kubeconfig_err) if context.is_none() => match Config::incluster() {
                Ok(config) => (config, "in-cluster service account".to_owned()),
                Err(incluster_err) => anyhow::bail!(
                    "no Kubernetes configuration for the hub cluster: no kubeconfig \
                     ({kubeconfig_err}) and not running in a cluster ({incluster_err}); pass \
                     --kubeconfig PATH, or {standalone}"
                ),
            },
            Err(e) => {
                return Err(e).context(format!(
                    "read the kubeconfig for --context (KUBECONFIG or ~/.kube/config); {standalone}"
                ));
            }
        },
    };
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(60));
    let url = config.cluster_url.to_string();
    let client = Client::try_from(config).with_context(|| format!("client for {source}"))?;
    match tokio::time::timeout(Duration::from_secs(20), client.apiserver_version()).await {
        Ok(Ok(_)) => Ok((client, source)),
        Ok(Err(e)) => Err(anyhow::anyhow!(
            "cannot reach the hub cluster's Kubernetes API at {url} ({source}): {e}; {standalone}"
        )),
        Err(_) => Err(anyhow::anyhow!(
            "the hub cluster's Kubernetes API at {url} ({source}) did not answer within 20 s; \
             {standalone}"
        )),
    }
}

/// Fails naming the contexts `kc` has when `context` is not one of them.
fn check_context(kc: &Kubeconfig, context: Option<&str>, file: &str) -> anyhow::Result<()> {
    let Some(context) = context else {
        return Ok(());
    };
    if kc.contexts.iter().any(|c| c.name == context) {
        return Ok(());
    }
    let names: Vec<&str> = kc.contexts.iter().map(|c| c.name.as_str()).collect();
    anyhow::bail!(
        "--context {context}: no such context in {file} (it has: {})",
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    )
}

/// `kubeconfig FILE, context NAME` for messages.
fn describe(file: &str, kc: &Kubeconfig, context: Option<&str>) -> String {
    match context.map(str::to_owned).or(kc.current_context.clone()) {
        Some(ctx) => format!("{file}, context {ctx}"),
        None => file.to_owned(),
    }
}

/// Where agents dial the hub, derived from the Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DerivedHub {
    /// `HOST:PORT`; the host is [`PLACEHOLDER_HOST`] when it could not be derived.
    pub address: String,
    /// Whether `address` is usable as is.
    pub resolved: bool,
    /// What to check or do (e.g. reachable only in-cluster, or pass --hub).
    pub hint: Option<String>,
}

fn host_port(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn placeholder(port: i32, hint: String) -> DerivedHub {
    DerivedHub {
        address: host_port(PLACEHOLDER_HOST, port),
        resolved: false,
        hint: Some(hint),
    }
}

/// The channel port of the Service: the one named `channel`, else the first.
fn channel_port(svc: &Service) -> Option<&ServicePort> {
    let ports = svc.spec.as_ref()?.ports.as_ref()?;
    ports
        .iter()
        .find(|p| p.name.as_deref() == Some("channel"))
        .or_else(|| ports.first())
}

/// `HOST:PORT` agents dial, from the Service [`HUB_SERVICE`] in `namespace`:
/// LoadBalancer → its first ingress; NodePort (or a LoadBalancer without ingress yet) → the
/// InternalIP of the first node (by name) and the node port; ClusterIP → cluster IP and port;
/// no Service → `HUB_HOST:7443` with a hint.
pub async fn derive_hub_address(client: &Client, namespace: &str) -> anyhow::Result<DerivedHub> {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let Some(svc) = services
        .get_opt(HUB_SERVICE)
        .await
        .with_context(|| format!("read Service {namespace}/{HUB_SERVICE}"))?
    else {
        return Ok(placeholder(
            7443,
            format!(
                "no Service {namespace}/{HUB_SERVICE} (manifests/hub/service.yaml): replace \
                 {PLACEHOLDER_HOST} or pass --hub HOST:PORT"
            ),
        ));
    };
    let Some(port) = channel_port(&svc) else {
        return Ok(placeholder(
            7443,
            format!("Service {namespace}/{HUB_SERVICE} has no port: pass --hub HOST:PORT"),
        ));
    };
    let spec = svc.spec.clone().unwrap_or_default();
    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
    let mut note = None;
    if type_ == "LoadBalancer" {
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .and_then(|i| i.iter().find_map(|i| i.ip.clone().or(i.hostname.clone())));
        if let Some(host) = ingress {
            return Ok(DerivedHub {
                address: host_port(&host, port.port),
                resolved: true,
                hint: None,
            });
        }
        note = Some(format!(
            "LoadBalancer Service {namespace}/{HUB_SERVICE} has no ingress address yet; "
        ));
    }
    match type_ {
        "NodePort" | "LoadBalancer" => {
            let prefix = note.unwrap_or_default();
            let Some(node_port) = port.node_port else {
                return Ok(placeholder(
                    port.port,
                    format!(
                        "{prefix}Service {namespace}/{HUB_SERVICE} has no node port yet: pass \
                         --hub HOST:PORT"
                    ),
                ));
            };
            let nodes: Api<Node> = Api::all(client.clone());
            let nodes = match nodes.list(&ListParams::default()).await {
                Ok(list) => list.items,
                Err(e) => {
                    return Ok(placeholder(
                        node_port,
                        format!(
                            "{prefix}cannot list nodes ({e}): pass --hub NODE_ADDRESS:{node_port}"
                        ),
                    ));
                }
            };
            match first_node_address(&nodes) {
                Some(host) => Ok(DerivedHub {
                    address: host_port(&host, node_port),
                    resolved: true,
                    hint: (!prefix.is_empty())
                        .then(|| format!("{prefix}using a node address and the node port")),
                }),
                None => Ok(placeholder(
                    node_port,
                    format!(
                        "{prefix}no node of the hub cluster reports an InternalIP: pass --hub \
                         NODE_ADDRESS:{node_port}"
                    ),
                )),
            }
        }
        "ExternalName" => match spec.external_name {
            Some(host) => Ok(DerivedHub {
                address: host_port(&host, port.port),
                resolved: true,
                hint: None,
            }),
            None => Ok(placeholder(
                port.port,
                format!("Service {namespace}/{HUB_SERVICE} has no externalName: pass --hub"),
            )),
        },
        _ => match spec.cluster_ip.filter(|ip| !ip.is_empty() && ip != "None") {
            Some(ip) => Ok(DerivedHub {
                address: host_port(&ip, port.port),
                resolved: true,
                hint: Some(format!(
                    "Service {namespace}/{HUB_SERVICE} is ClusterIP: {ip} is reachable only from \
                     inside the hub cluster; for other clusters make it NodePort or \
                     LoadBalancer, or pass --hub HOST:PORT"
                )),
            }),
            None => Ok(placeholder(
                port.port,
                format!("Service {namespace}/{HUB_SERVICE} has no cluster IP: pass --hub"),
            )),
        },
    }
}

/// The InternalIP (else ExternalIP) of the first node by name that has one.
fn first_node_address(nodes: &[Node]) -> Option<String> {
    let mut nodes: Vec<&Node> = nodes.iter().collect();
    nodes.sort_by_key(|n| n.name_any());
    let address = |node: &Node, type_: &str| {
        node.status
            .as_ref()?
            .addresses
            .as_ref()?
            .iter()
            .find(|a| a.type_ == type_ && !a.address.is_empty())
            .map(|a| a.address.clone())
    };
    nodes
        .iter()
        .find_map(|n| address(n, "InternalIP"))
        .or_else(|| nodes.iter().find_map(|n| address(n, "ExternalIP")))
}

/// One Federation as `status` shows it in Kubernetes mode.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FederationRow {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `StatefulSet` or `DaemonSet`.
    pub mode: String,
    /// `subprocess` or `process`.
    pub isolation: String,
    /// Clusters running pools (`status.selectedClusters`).
    pub clusters: i32,
    /// Names of those clusters that report status (`status.clusters[].name`).
    pub selected: Vec<String>,
    /// `ready/desired` SuperNodes.
    pub supernodes: String,
    /// Status of the `Ready` condition (`True`, `False`, `Unknown`).
    pub ready: String,
    /// Message of the `Ready` condition when it is not `True`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Every Federation in the hub cluster, sorted by namespace and name.
pub async fn list_federations(client: &Client) -> anyhow::Result<Vec<FederationRow>> {
    let feds = Api::<Federation>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| match &e {
            kube::Error::Api(s) if s.code == 404 => anyhow::anyhow!(
                "list Federations: the flower-addon CRDs are not installed in the hub cluster \
                 (`flower-hub crds | kubectl apply --server-side -f -`)"
            ),
            _ => anyhow::Error::new(e).context("list Federations"),
        })?;
    let mut rows: Vec<FederationRow> = feds.items.iter().map(federation_row).collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(rows)
}

fn federation_row(fed: &Federation) -> FederationRow {
    let status = fed.status.clone().unwrap_or_default();
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
    FederationRow {
        namespace: fed.namespace().unwrap_or_default(),
        name: fed.name_any(),
        mode: format!("{:?}", fed.spec.mode),
        isolation: match fed.spec.isolation_mode {
            flower_addon_crds::IsolationMode::Process => "process".into(),
            flower_addon_crds::IsolationMode::Subprocess => "subprocess".into(),
        },
        clusters: status.selected_clusters,
        selected: status.clusters.iter().map(|c| c.name.clone()).collect(),
        supernodes: status.supernodes.clone().unwrap_or_else(|| {
            format!("{}/{}", status.ready_supernodes, status.desired_supernodes)
        }),
        ready: ready.map_or_else(|| "Unknown".to_owned(), |c| c.status.clone()),
        message: ready
            .filter(|c| c.status != "True" && !c.message.is_empty())
            .map(|c| c.message.clone()),
    }
}

/// The client config of `kc` (read from `file`) for `context`, and where it came from.
async fn from_kubeconfig(
    kc: Kubeconfig,
    context: Option<&str>,
    options: &KubeConfigOptions,
    file: &str,
) -> anyhow::Result<(Config, String)> {
    check_context(&kc, context, file)?;
    let source = describe(file, &kc, context);
    let config = Config::from_custom_kubeconfig(kc, options)
        .await
        .with_context(|| format!("load {source}"))?;
    Ok((config, source))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, addresses: &[(&str, &str)]) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {"addresses": addresses.iter().map(|(t, a)| serde_json::json!({"type": t, "address": a})).collect::<Vec<_>>()},
        }))
        .expect("node")
    }

    #[test]
    fn the_node_address_is_the_first_internal_ip_by_node_name() {
        // Invariant: the derived address does not depend on list order; InternalIP wins over
        // ExternalIP; a node without addresses is skipped.
        let nodes = [
            node("b", &[("InternalIP", "10.0.0.2")]),
            node("a", &[("Hostname", "a")]),
            node(
                "c",
                &[("ExternalIP", "1.2.3.4"), ("InternalIP", "10.0.0.3")],
            ),
        ];
        assert_eq!(first_node_address(&nodes).as_deref(), Some("10.0.0.2"));
        let external = [node("a", &[("ExternalIP", "1.2.3.4")])];
        assert_eq!(first_node_address(&external).as_deref(), Some("1.2.3.4"));
        assert_eq!(first_node_address(&[node("a", &[])]), None);
        assert_eq!(host_port("fd00::1", 30443), "[fd00::1]:30443");
    }
}

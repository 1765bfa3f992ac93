//! flower-addon installed as docs/kubernetes.md's Helm path says, on clusters with real nodes: the hub
//! as its Deployment (chart defaults) in the hub cluster, and per spoke an agent from the chart
//! with the values of `flower-hub token create -o json`, accepted with labels. Used by
//! `e2e up --with-addon`; the hub pod registers SuperNode keys through the SuperLink Services,
//! so Federations get SuperNode authentication like everywhere else.
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::Api;

use crate::harness::wait_for;
use crate::pods::{check_not_crashing, pod_ready};
use crate::{Cluster, RealNode};

/// Namespace of the hub's release.
pub const HUB_NS: &str = "flower-addon-system";

/// `helm install flower-addon` into the hub cluster (CRDs applied first) and waits for the hub
/// pod to be Ready and its channel NodePort to accept connections from the host. Returns the
/// channel address agents dial (`<node ip>:<node port>`).
pub async fn install_hub(hub: &Cluster, node: &RealNode) -> Result<String> {
    let t = Instant::now();
    crate::install_crds(&hub.client).await?;
    let chart = crate::helm::chart();
    crate::helm::run(
        Some(&hub.kubeconfig),
        &[
            "install",
            "flower-addon",
            chart.to_str().context("chart path")?,
            "--namespace",
            HUB_NS,
            "--create-namespace",
            "--skip-crds",
        ],
    )?;
    let pods: Api<Pod> = Api::namespaced(hub.client.clone(), HUB_NS);
    wait_for(
        "the flower-hub Deployment's pod Ready",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            async move {
                let selector = "app.kubernetes.io/name=flower-hub";
                check_not_crashing(&pods, selector).await?;
                let Ok(list) = pods
                    .list(&kube::api::ListParams::default().labels(selector))
                    .await
                else {
                    return Ok(None);
                };
                Ok(list.items.into_iter().find(pod_ready).map(|_| ()))
            }
        },
    )
    .await?;
    let svc = Api::<Service>::namespaced(hub.client.clone(), HUB_NS)
        .get("flower-hub")
        .await?;
    let channel = format!("{}:{}", node.ip, crate::first_node_port(&svc)?);
    // kube-proxy programs the NodePort shortly after the endpoint appears.
    wait_for(
        &format!("a TCP connection to the hub's channel NodePort {channel}"),
        Duration::from_secs(60),
        || {
            let channel = channel.clone();
            async move {
                Ok(tokio::time::timeout(
                    Duration::from_secs(3),
                    tokio::net::TcpStream::connect(channel),
                )
                .await
                .ok()
                .and_then(Result::ok)
                .map(|_| ()))
            }
        },
    )
    .await?;
    eprintln!(
        "hub pod Ready and its channel {channel} reachable in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(channel)
}

/// An agent on spoke `name` from the chart, with the values `flower-hub token create -o json`
/// prints, joined to the hub pod through `channel` and accepted with `labels` (`key=value`).
pub async fn install_agent(
    hub: &Cluster,
    name: &str,
    spoke: &Cluster,
    channel: &str,
    labels: &[&str],
) -> Result<()> {
    let t = Instant::now();
    install_agent_chart(hub, name, spoke, channel)?;
    joined_and_accepted(hub, name, spoke, labels).await?;
    eprintln!(
        "agent pod on {name} joined through {channel} and was accepted in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `helm install` of the chart's agent side on spoke `name`, with the values of `flower-hub
/// token create -o json` for `channel`.
pub fn install_agent_chart(
    hub: &Cluster,
    name: &str,
    spoke: &Cluster,
    channel: &str,
) -> Result<()> {
    let json = crate::addon::hub_cli(
        &hub.kubeconfig,
        &[
            "token",
            "create",
            "--cluster-name",
            name,
            "--hub",
            channel,
            "-o",
            "json",
        ],
    )?;
    let values: serde_json::Value = serde_json::from_str(&json)?;
    let value = |key: &str| -> Result<String> {
        values[key]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("token create -o json has no {key}: {values}"))
    };
    let (token, hub_addr, ca_hash) = (value("token")?, value("hub")?, value("caHash")?);
    crate::helm::install_agent(
        &spoke.kubeconfig,
        &[
            ("token", &token),
            ("hub", &hub_addr),
            ("caHash", &ca_hash),
            ("clusterName", name),
        ],
    )?;
    Ok(())
}

/// Waits for the agent pod on spoke `name` (however it was installed) to join the hub as
/// ManagedCluster `name`, accepts it with `labels` (`key=value`: the admin decides the labels
/// Placements select on), and waits for its credentials Secret; fails at once when an agent pod
/// crash-loops.
pub async fn joined_and_accepted(
    hub: &Cluster,
    name: &str,
    spoke: &Cluster,
    labels: &[&str],
) -> Result<()> {
    let agent_pods: Api<Pod> = Api::namespaced(spoke.client.clone(), crate::addon::AGENT_NS);
    let clusters = Api::<flower_addon_crds::ManagedCluster>::all(hub.client.clone());
    wait_for(
        &format!("ManagedCluster {name} (the agent pod's join)"),
        Duration::from_secs(120),
        || {
            let (clusters, agent_pods) = (clusters.clone(), agent_pods.clone());
            async move {
                check_not_crashing(&agent_pods, "app.kubernetes.io/name=flower-agent").await?;
                Ok(clusters.get_opt(name).await.ok().flatten().map(|_| ()))
            }
        },
    )
    .await?;
    let mut accept = vec!["accept", name];
    for label in labels {
        accept.extend(["--label", label]);
    }
    crate::addon::hub_cli(&hub.kubeconfig, &accept)?;
    let secrets = Api::<Secret>::namespaced(spoke.client.clone(), crate::addon::AGENT_NS);
    wait_for(
        &format!("{name}'s credentials Secret (accepted agent)"),
        Duration::from_secs(120),
        || {
            let (secrets, agent_pods) = (secrets.clone(), agent_pods.clone());
            async move {
                check_not_crashing(&agent_pods, "app.kubernetes.io/name=flower-agent").await?;
                Ok(secrets
                    .get_opt("flower-agent-credentials")
                    .await
                    .ok()
                    .flatten()
                    .and_then(|s| s.data)
                    .filter(|d| {
                        crate::addon::CREDENTIAL_KEYS
                            .iter()
                            .all(|k| d.contains_key(*k))
                    })
                    .map(|_| ()))
            }
        },
    )
    .await?;
    Ok(())
}

//! Real SuperNode pods seen from outside: the node id a SuperNode logs, and SuperNode pods made by
//! hand from a pool's own pod template to show the SuperLink refuses them, on any cluster (the
//! hub's own or a spoke) and any Flower release.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::LogParams;

use crate::harness::wait_for;
use crate::pods::{describe, pod_phase};

/// The `SuperNode ID: <n>` a SuperNode logs once connected (1.25 and 1.42 alike).
pub fn supernode_id(log: &str) -> Option<String> {
    log.lines()
        .find_map(|l| l.split("SuperNode ID: ").nth(1))
        .map(|id| id.trim().to_string())
}

/// What a TLS handshake refused for the SuperNode's CA leaves in its log: 1.42 gives up with
/// `CERTIFICATE_VERIFY_FAILED` (exit code 305), 1.25 retries for ever with "Connection attempt
/// failed" (e2e/flower/NOTES.md).
const HANDSHAKE_REFUSED: [&str; 2] = ["CERTIFICATE_VERIFY_FAILED", "Connection attempt failed"];

/// Checks that Federation `federation`'s SuperLink (StatefulSet in `namespace` of the hub
/// cluster) runs with `--enable-supernode-auth`.
pub async fn superlink_requires_node_auth(
    client: &kube::Client,
    namespace: &str,
    federation: &str,
) -> Result<()> {
    let args = Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .get(&format!("{federation}-superlink"))
        .await?
        .spec
        .template
        .spec
        .and_then(|p| p.containers.into_iter().find(|c| c.name == "superlink"))
        .and_then(|c| c.args)
        .unwrap_or_default();
    ensure!(
        args.iter().any(|a| a == "--enable-supernode-auth"),
        "{federation}'s SuperLink args: {args:?}"
    );
    Ok(())
}

/// How hand-made SuperNodes fared (for the test's report line).
#[derive(Debug)]
pub struct Refused {
    /// Exit code of the SuperNode with an unregistered key.
    pub key_exit: i32,
    /// Time until it was refused.
    pub key_refused: Duration,
    /// How the one trusting another CA ended: `Failed` (1.42) or still retrying (1.25).
    pub ca_phase: String,
    /// Time until that was checked.
    pub ca_checked: Duration,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unregistered key refused (exit {}) in {:.1}s; the one trusting another CA has no node id after {:.1}s (TLS handshake refused, pod {})",
            self.key_exit,
            self.key_refused.as_secs_f64(),
            self.ca_checked.as_secs_f64(),
            self.ca_phase
        )
    }
}

/// SuperNode authentication against hand-made pods: two SuperNode pods made by hand in `namespace`
/// beside Federation `federation`'s pool `pool` (its StatefulSet's own pod template), each with a
/// key pair made here, never reported, so never registered:
/// - `intruder-key` trusts the Federation's CA: the SuperLink refuses the key, the SuperNode exits
///   non-zero without a node id;
/// - `intruder-ca` trusts another CA: the TLS handshake fails and it never gets a node id.
///
/// The pods and their Secrets are deleted afterwards.
pub async fn hand_made_supernodes_are_refused(
    client: &kube::Client,
    namespace: &str,
    federation: &str,
    pool: &str,
) -> Result<Refused> {
    let t = Instant::now();
    let sts = Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .get(&flower_addon_crds::render::pool_workload_name(
            federation, pool,
        ))
        .await?;
    let template = sts.spec.template;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let other_ca = flower_addon_hub::registration::ca::HubCa::generate_for(
        flower_addon_hub::registration::ca::CaRole::Flower,
    )?;
    let node_keys = flower_addon_crds::render::node_key_secret_name(federation, pool);
    let ca_secret = flower_addon_crds::render::spoke_ca_secret_name(federation);
    let mut replaced = 0;
    for (name, wrong_ca) in [("intruder-key", false), ("intruder-ca", true)] {
        let key = flower_addon_agent::node_key::generate_node_key()?;
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "stringData": {name: key.private_openssh, "ca.crt": other_ca.cert_pem()},
        }))?;
        secrets.create(&Default::default(), &secret).await?;
        let mut spec = template.spec.clone().context("pod template spec")?;
        spec.restart_policy = Some("Never".into());
        for volume in spec.volumes.iter_mut().flatten() {
            let Some(source) = volume.secret.as_mut() else {
                continue;
            };
            let from = source.secret_name.clone().unwrap_or_default();
            if from == node_keys || (wrong_ca && from == ca_secret) {
                source.secret_name = Some(name.into());
                replaced += 1;
            }
        }
        let pod = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(spec),
            status: None,
        };
        pods.create(&Default::default(), &pod).await?;
    }
    ensure!(
        replaced == 3,
        "the pool's pod template does not mount {node_keys} and {ca_secret} as expected ({replaced} of 3 volumes replaced)"
    );
    let refused = wait_for(
        "the SuperNode with an unregistered key refused (pod Failed)",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("intruder-key").await?;
                Ok((pod_phase(&p) == "Failed").then_some(p))
            }
        },
    )
    .await?;
    let log = pods.logs("intruder-key", &LogParams::default()).await?;
    let exit = refused
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .find_map(|c| c.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code));
    ensure!(
        supernode_id(&log).is_none() && exit.is_some_and(|c| c != 0),
        "the SuperNode with an unregistered key got in (exit {exit:?}):\n{log}"
    );
    let key_refused = t.elapsed();
    // The wrong-CA SuperNode started at the same time: give it as long again, at least 20 s,
    // unless it gives up first.
    let deadline = Instant::now() + key_refused.max(Duration::from_secs(20));
    let mut p = pods.get("intruder-ca").await?;
    while Instant::now() < deadline && pod_phase(&p) != "Failed" {
        tokio::time::sleep(Duration::from_secs(1)).await;
        p = pods.get("intruder-ca").await?;
    }
    let log = pods.logs("intruder-ca", &LogParams::default()).await?;
    ensure!(
        supernode_id(&log).is_none() && HANDSHAKE_REFUSED.iter().any(|m| log.contains(m)),
        "the SuperNode trusting another CA got in or was not refused at the handshake ({}):\n{log}",
        describe(&p)
    );
    let report = Refused {
        key_exit: exit.unwrap_or_default(),
        key_refused,
        ca_phase: pod_phase(&p),
        ca_checked: t.elapsed(),
    };
    for name in ["intruder-key", "intruder-ca"] {
        pods.delete(name, &Default::default()).await?;
        secrets.delete(name, &Default::default()).await?;
    }
    Ok(report)
}

//! `flower-hub token create -o secret`: the bootstrap Secret an agent installed with
//! `manifests/agent` joins with (keys read by the agent's `bootstrap` module).
use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;
use std::collections::BTreeMap;

/// Default name of the agent's bootstrap Secret.
pub const DEFAULT_SECRET_NAME: &str = "flower-agent-bootstrap";
/// Default namespace of the agent.
pub const DEFAULT_AGENT_NAMESPACE: &str = "flower-addon-agent";

/// Everything an agent needs to join, as written into its bootstrap Secret.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bootstrap {
    /// `HOST:PORT` of the hub's work channel.
    pub hub: String,
    /// Bootstrap token `<id>.<secret>`.
    pub token: String,
    /// `sha256:<hex>` of the hub CA's public key.
    pub ca_hash: String,
    /// Name the hub certificate is verified by, when it differs from the host of `hub`.
    pub server_name: Option<String>,
    /// Name the cluster joins as.
    pub cluster_name: String,
    /// Labels reported at join.
    pub labels: BTreeMap<String, String>,
    /// Claims reported at join.
    pub claims: BTreeMap<String, String>,
}

/// `key=value` pairs joined by commas (the bootstrap Secret's list format).
fn pairs(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The bootstrap Secret `namespace/name`: `stringData` keys `hub`, `token`, `caHash`,
/// `clusterName`, and `serverName`, `labels`, `claims` when set (the agent refuses empty keys).
pub fn bootstrap_secret(b: &Bootstrap, name: &str, namespace: &str) -> Secret {
    let mut data = BTreeMap::from([
        ("hub".to_owned(), b.hub.clone()),
        ("token".to_owned(), b.token.clone()),
        ("caHash".to_owned(), b.ca_hash.clone()),
        ("clusterName".to_owned(), b.cluster_name.clone()),
    ]);
    if let Some(server_name) = &b.server_name {
        data.insert("serverName".to_owned(), server_name.clone());
    }
    if !b.labels.is_empty() {
        data.insert("labels".to_owned(), pairs(&b.labels));
    }
    if !b.claims.is_empty() {
        data.insert("claims".to_owned(), pairs(&b.claims));
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/name".to_owned(),
                    "flower-agent".to_owned(),
                ),
                (
                    "app.kubernetes.io/part-of".to_owned(),
                    "flower-addon".to_owned(),
                ),
            ])),
            ..Default::default()
        },
        type_: Some("Opaque".to_owned()),
        string_data: Some(data),
        ..Default::default()
    }
}

/// [`bootstrap_secret`] as YAML, ready for `kubectl apply -f -`.
pub fn bootstrap_secret_yaml(b: &Bootstrap, name: &str, namespace: &str) -> anyhow::Result<String> {
    Ok(serde_saphyr::to_string(&bootstrap_secret(
        b, name, namespace,
    ))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bootstrap() -> Bootstrap {
        Bootstrap {
            hub: "10.0.0.1:30443".into(),
            token: "abcdef.0123456789abcdef".into(),
            ca_hash: "sha256:00ff".into(),
            server_name: Some("flower-hub.flower-addon-system.svc".into()),
            cluster_name: "spoke-1".into(),
            labels: BTreeMap::from([
                ("env".into(), "prod".into()),
                ("zone".into(), "a: b".into()),
            ]),
            claims: BTreeMap::new(),
        }
    }

    #[test]
    fn the_bootstrap_secret_round_trips_through_yaml_with_the_agent_keys() {
        // Invariant: the printed YAML is a v1 Secret whose stringData holds exactly the keys the
        // agent reads, values intact however YAML would have to quote them; unset keys absent.
        let yaml = bootstrap_secret_yaml(&bootstrap(), "boot", "agents").expect("yaml");
        let secret: Secret = serde_saphyr::from_str(&yaml).expect("parses as a Secret");
        assert!(yaml.starts_with("apiVersion: v1\n"), "{yaml}");
        assert!(yaml.contains("kind: Secret\n"), "{yaml}");
        assert_eq!(secret.metadata.name.as_deref(), Some("boot"));
        assert_eq!(secret.metadata.namespace.as_deref(), Some("agents"));
        assert_eq!(secret.type_.as_deref(), Some("Opaque"));
        let labels = secret.metadata.labels.expect("labels");
        assert_eq!(labels["app.kubernetes.io/name"], "flower-agent");
        assert_eq!(labels["app.kubernetes.io/part-of"], "flower-addon");
        let data = secret.string_data.expect("stringData");
        assert_eq!(
            data.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "caHash",
                "clusterName",
                "hub",
                "labels",
                "serverName",
                "token"
            ]
        );
        assert_eq!(data["hub"], "10.0.0.1:30443");
        assert_eq!(data["caHash"], "sha256:00ff");
        assert_eq!(data["labels"], "env=prod,zone=a: b");
        assert_eq!(data["serverName"], "flower-hub.flower-addon-system.svc");
    }
}

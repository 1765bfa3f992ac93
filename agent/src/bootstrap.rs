//! Where an agent learns how to join: command-line flags, or a bootstrap Secret in its own
//! namespace (Kubernetes mode, `flower-hub token create -o secret` prints one). Flags win over
//! the Secret, so one value can be overridden without editing it.
//!
//! Bootstrap Secret keys (all strings):
//!
//! | key           | required | meaning                                               |
//! |---------------|----------|-------------------------------------------------------|
//! | `hub`         | yes      | `HOST:PORT` of the hub's work channel                 |
//! | `token`       | yes      | bootstrap token `<id>.<secret>`                       |
//! | `caHash`      | yes      | `sha256:<hex>` of the hub CA's public key             |
//! | `clusterName` | yes      | name to register under                                |
//! | `serverName`  | no       | name the hub certificate carries (default: the host)  |
//! | `labels`      | no       | `key=value` pairs, comma-separated                    |
//! | `claims`      | no       | `name=value` pairs, comma-separated                   |
use crate::credentials::CredentialStore;
use crate::join::JoinOptions;
use crate::tls::HubAddress;
use std::collections::BTreeMap;
use std::time::Duration;

use flower_addon_runtime::cli::parse_pair;

/// Default name of the bootstrap Secret (manifests/agent/bootstrap-secret.yaml).
pub const DEFAULT_BOOTSTRAP_SECRET: &str = "flower-agent-bootstrap";
/// Default name of the Secret the agent keeps its credentials in.
pub const DEFAULT_CREDENTIALS_SECRET: &str = "flower-agent-credentials";

/// Keys a bootstrap Secret may hold.
pub const KEYS: [&str; 7] = [
    "hub",
    "token",
    "caHash",
    "clusterName",
    "serverName",
    "labels",
    "claims",
];

/// Text the shipped template holds instead of real values.
const PLACEHOLDER: &str = "REPLACE-WITH";

/// A bootstrap source is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BootstrapError {
    /// A key or flag is wrong; the message names it and the fix.
    #[error("{0}")]
    Invalid(String),
}

/// What the agent needs to join, each value optional until [`JoinSettings::into_options`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JoinSettings {
    /// `HOST:PORT` of the hub.
    pub hub: Option<String>,
    /// Bootstrap token.
    pub token: Option<String>,
    /// `sha256:<hex>` pin of the hub CA.
    pub ca_hash: Option<String>,
    /// Cluster name.
    pub cluster_name: Option<String>,
    /// Name the hub certificate carries.
    pub server_name: Option<String>,
    /// Labels reported at join.
    pub labels: BTreeMap<String, String>,
    /// Claims reported at join.
    pub claims: BTreeMap<String, String>,
}

// === impl JoinSettings ===

impl JoinSettings {
    /// Reads the keys of the bootstrap Secret `secret` (`namespace/name`, for messages).
    /// Unknown keys, empty values and the template's placeholders are errors naming the key.
    pub fn from_secret_data(
        data: &BTreeMap<String, String>,
        secret: &str,
    ) -> Result<Self, BootstrapError> {
        let fix = "fill it in from `flower-hub token create --cluster-name NAME -o secret`";
        for key in data.keys() {
            if !KEYS.contains(&key.as_str()) {
                return Err(BootstrapError::Invalid(format!(
                    "secret {secret}: unknown key {key:?}; expected {}",
                    KEYS.join(", ")
                )));
            }
        }
        let value = |key: &str| -> Result<Option<String>, BootstrapError> {
            let Some(raw) = data.get(key) else {
                return Ok(None);
            };
            let v = raw.trim();
            if v.contains(PLACEHOLDER) {
                return Err(BootstrapError::Invalid(format!(
                    "secret {secret}: key {key} still holds the template placeholder {v:?}: {fix}"
                )));
            }
            if v.is_empty() {
                return Err(BootstrapError::Invalid(format!(
                    "secret {secret}: key {key} is empty: {fix}"
                )));
            }
            Ok(Some(v.to_string()))
        };
        let pairs = |key: &str| -> Result<BTreeMap<String, String>, BootstrapError> {
            let mut out = BTreeMap::new();
            let Some(list) = data.get(key) else {
                return Ok(out);
            };
            for item in list
                .split([',', '\n'])
                .map(str::trim)
                .filter(|s| !s.is_empty())
            {
                let (k, v) = parse_pair(item).map_err(|e| {
                    BootstrapError::Invalid(format!(
                        "secret {secret}: key {key}: {e}; write comma-separated key=value pairs"
                    ))
                })?;
                out.insert(k, v);
            }
            Ok(out)
        };
        Ok(Self {
            hub: value("hub")?,
            token: value("token")?,
            ca_hash: value("caHash")?,
            cluster_name: value("clusterName")?,
            server_name: value("serverName")?,
            labels: pairs("labels")?,
            claims: pairs("claims")?,
        })
    }

    /// `self` with every value `flags` sets taken from `flags` (labels and claims merged, the
    /// flags' value winning per key).
    pub fn overlaid_by(mut self, flags: JoinSettings) -> Self {
        self.hub = flags.hub.or(self.hub);
        self.token = flags.token.or(self.token);
        self.ca_hash = flags.ca_hash.or(self.ca_hash);
        self.cluster_name = flags.cluster_name.or(self.cluster_name);
        self.server_name = flags.server_name.or(self.server_name);
        self.labels.extend(flags.labels);
        self.claims.extend(flags.claims);
        self
    }

    /// Options for [`crate::join::join`]. `source` says where values were looked for (e.g.
    /// "the flags" or "secret ns/name or the flags"); a missing one is named as both flag and key.
    pub fn into_options(
        self,
        store: CredentialStore,
        source: &str,
        max_wait: Option<Duration>,
    ) -> Result<JoinOptions, BootstrapError> {
        let need = |v: Option<String>, flag: &str, key: &str| {
            v.ok_or_else(|| {
                BootstrapError::Invalid(format!(
                    "cannot join: no {flag} (bootstrap Secret key {key}) in {source}"
                ))
            })
        };
        let hub_addr = need(self.hub, "--hub", "hub")?;
        let token = need(self.token, "--token", "token")?;
        let ca_hash = need(self.ca_hash, "--ca-hash", "caHash")?;
        let cluster_name = need(self.cluster_name, "--cluster-name", "clusterName")?;
        if !token.contains('.') {
            return Err(BootstrapError::Invalid(format!(
                "token in {source} is not <id>.<secret>: copy it whole from `flower-hub token create`"
            )));
        }
        if !ca_hash.starts_with("sha256:") {
            return Err(BootstrapError::Invalid(format!(
                "caHash {ca_hash:?} in {source} must be sha256:<hex>, as `flower-hub token create` prints it"
            )));
        }
        let mut hub = HubAddress::new(&hub_addr);
        if let Some(name) = self.server_name {
            hub.server_name = name;
        }
        Ok(JoinOptions {
            hub,
            token,
            ca_hash,
            cluster_name,
            labels: self.labels,
            claims: self.claims,
            store,
            max_wait,
            max_backoff: Duration::from_secs(30),
        })
    }
}

/// The string data of the Secret `namespace/name`, or `None` when it does not exist.
pub async fn read_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, String>>, kube::Error> {
    let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), namespace);
    Ok(api.get_opt(name).await?.map(|secret| {
        secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn complete() -> BTreeMap<String, String> {
        data(&[
            ("hub", "10.0.0.1:30443"),
            ("token", "abcdef.0123456789abcdef"),
            ("caHash", "sha256:00ff"),
            ("clusterName", "spoke-1"),
            ("serverName", "flower-hub.flower-addon-system.svc"),
            ("labels", "env=prod, region=eu\n"),
            ("claims", "gpu=a100"),
        ])
    }

    #[test]
    fn a_complete_secret_gives_join_options() {
        let settings = JoinSettings::from_secret_data(&complete(), "ns/b").unwrap();
        let options = settings
            .into_options(CredentialStore::Dir("/x".into()), "secret ns/b", None)
            .unwrap();
        assert_eq!(options.hub.hub, "10.0.0.1:30443");
        assert_eq!(
            options.hub.server_name,
            "flower-hub.flower-addon-system.svc"
        );
        assert_eq!(options.cluster_name, "spoke-1");
        assert_eq!(options.labels.get("region").map(String::as_str), Some("eu"));
        assert_eq!(options.labels.len(), 2);
        assert_eq!(options.claims.get("gpu").map(String::as_str), Some("a100"));
    }

    #[test]
    fn flags_override_the_secret_value_by_value() {
        let secret = JoinSettings::from_secret_data(&complete(), "ns/b").unwrap();
        let flags = JoinSettings {
            cluster_name: Some("edge-7".into()),
            labels: data(&[("env", "dev")]),
            ..Default::default()
        };
        let merged = secret.overlaid_by(flags);
        assert_eq!(merged.cluster_name.as_deref(), Some("edge-7"));
        assert_eq!(merged.hub.as_deref(), Some("10.0.0.1:30443"));
        assert_eq!(merged.labels.get("env").map(String::as_str), Some("dev"));
        assert_eq!(merged.labels.get("region").map(String::as_str), Some("eu"));
    }

    #[test]
    fn the_unfilled_template_is_refused_naming_the_key() {
        let mut d = complete();
        d.insert("token".into(), "REPLACE-WITH-BOOTSTRAP-TOKEN".into());
        let err = JoinSettings::from_secret_data(&d, "ns/b").unwrap_err();
        assert!(
            err.to_string()
                .contains("secret ns/b: key token still holds the template placeholder"),
            "{err}"
        );
        assert!(err.to_string().contains("flower-hub token create"), "{err}");
    }

    #[test]
    fn unknown_and_empty_keys_are_refused() {
        let mut d = complete();
        d.insert("cahash".into(), "sha256:00".into());
        let err = JoinSettings::from_secret_data(&d, "ns/b").unwrap_err();
        assert!(err.to_string().contains("unknown key \"cahash\""), "{err}");
        let mut d = complete();
        d.insert("hub".into(), "  ".into());
        let err = JoinSettings::from_secret_data(&d, "ns/b").unwrap_err();
        assert!(err.to_string().contains("key hub is empty"), "{err}");
        let mut d = complete();
        d.insert("labels".into(), "env".into());
        let err = JoinSettings::from_secret_data(&d, "ns/b").unwrap_err();
        assert!(err.to_string().contains("key labels"), "{err}");
    }

    #[test]
    fn a_missing_value_names_flag_and_key() {
        let mut d = complete();
        d.remove("clusterName");
        let err = JoinSettings::from_secret_data(&d, "ns/b")
            .unwrap()
            .into_options(CredentialStore::Dir("/x".into()), "secret ns/b", None)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot join: no --cluster-name (bootstrap Secret key clusterName) in secret ns/b"
        );
    }

    #[test]
    fn malformed_token_and_hash_are_refused() {
        let mut d = complete();
        d.insert("token".into(), "notatoken".into());
        let err = JoinSettings::from_secret_data(&d, "ns/b")
            .unwrap()
            .into_options(CredentialStore::Dir("/x".into()), "secret ns/b", None)
            .unwrap_err();
        assert!(err.to_string().contains("<id>.<secret>"), "{err}");
        let mut d = complete();
        d.insert("caHash".into(), "00ff".into());
        let err = JoinSettings::from_secret_data(&d, "ns/b")
            .unwrap()
            .into_options(CredentialStore::Dir("/x".into()), "secret ns/b", None)
            .unwrap_err();
        assert!(err.to_string().contains("sha256:<hex>"), "{err}");
    }
}

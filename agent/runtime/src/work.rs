//! The work the hub sends, decoded once into domain types. The wire messages
//! ([`flower_addon_proto::ClusterWork`]) carry specs as JSON; every runtime (Kubernetes,
//! process, the hub's own pools) and `flower-hub render --cluster` read them through
//! [`decode_federation`], so a malformed message is refused the same way everywhere and names
//! are checked before they become object names or paths.
use flower_addon_crds::render::{ClusterContext, FlowerDialect, FlowerVersion};
use flower_addon_crds::{FederationSpec, SuperNodePoolSpec};
use flower_addon_proto::{ClusterWork, FederationWork, PoolWork};

/// Why a Federation's work cannot be used. The message names the Federation and the field.
#[derive(Debug, thiserror::Error)]
pub enum WorkError {
    /// A namespace, name or pool name is not a DNS label.
    #[error(
        "federation {namespace:?}/{name:?}: {what} {value:?} {why}: refused (work names must be DNS labels)"
    )]
    Name {
        /// Namespace as sent.
        namespace: String,
        /// Federation name as sent.
        name: String,
        /// Which name is wrong.
        what: &'static str,
        /// The value.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// A JSON spec in the message does not decode.
    #[error("federation {federation}: cannot read {what}: {source}")]
    Decode {
        /// `namespace/name`.
        federation: String,
        /// Which field.
        what: String,
        /// The decoder's error.
        source: serde_json::Error,
    },
    /// The Flower version is not a release number.
    #[error(
        "federation {federation}: Flower version {version:?} is not a release number (the hub sends spec.version or the image tag, e.g. 1.42.0)"
    )]
    Version {
        /// `namespace/name`.
        federation: String,
        /// Version as sent.
        version: String,
    },
    /// A pool's name in the message and in its spec differ.
    #[error("federation {federation}: pool {wire:?} carries the spec of pool {spec:?}")]
    PoolMismatch {
        /// `namespace/name`.
        federation: String,
        /// `PoolWork.name`.
        wire: String,
        /// `spec_json.name`.
        spec: String,
    },
}

/// One pool of a Federation as this cluster runs it.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolPlan {
    /// The pool's spec (cluster overrides already merged by the hub).
    pub spec: SuperNodePoolSpec,
    /// This cluster and the pool's partitions on it.
    pub cluster: ClusterContext,
}

/// One Federation's work on this cluster, decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct FederationPlan {
    /// Namespace (a DNS label).
    pub namespace: String,
    /// Federation name (a DNS label).
    pub name: String,
    /// Flower release of the Federation.
    pub version: FlowerVersion,
    /// Argument dialect of that release.
    pub dialect: FlowerDialect,
    /// The Federation's spec.
    pub spec: FederationSpec,
    /// Fleet address the SuperNodes dial.
    pub fleet_address: String,
    /// CA bundle that signed the SuperLink certificate; `None` when `spec.insecure`.
    pub ca_bundle_pem: Option<String>,
    /// Public keys the SuperLink has registered (a SuperNode starts once its key is here).
    pub registered_node_keys: Vec<String>,
    /// Public keys the SuperLink refuses for ever: a SuperNode holding one gets a new key.
    pub retired_node_keys: Vec<String>,
    /// The pools this cluster runs, in the Federation's order.
    pub pools: Vec<PoolPlan>,
    /// The Federation's SuperNode restart mark: a change restarts every SuperNode
    /// ([`SUPERNODE_RESTART_ENV`], [`flower_addon_crds::SUPERNODE_RESTART_ANNOTATION`]).
    pub supernode_restart: Option<String>,
}

/// Pod template annotation (Kubernetes) and environment variable (processes) holding
/// [`FederationPlan::ca_digest`]: SuperNodes read their root certificates once, at start, so a
/// changed CA bundle (a CA rotation) must restart them.
pub const CA_DIGEST_ANNOTATION: &str = "flower-addon.io/ca-bundle-sha256";
/// The environment variable of [`CA_DIGEST_ANNOTATION`].
pub const CA_DIGEST_ENV: &str = "FLOWER_ADDON_CA_BUNDLE_SHA256";
/// The environment variable a process SuperNode carries its Federation's restart mark in (a
/// change restarts it, as a changed pod template annotation rolls a pool's pods).
pub const SUPERNODE_RESTART_ENV: &str = "FLOWER_ADDON_SUPERNODE_RESTART";

impl FederationPlan {
    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// SHA-256 (hex) of the set of CA certificates the SuperNodes trust, whatever their order
    /// (a promoted rotation puts the new CA first; the SuperNodes trust the same two, so they
    /// keep running); `None` without TLS or when the CA is not known (`flower-hub render`
    /// without the hub's CA).
    pub fn ca_digest(&self) -> Option<String> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        use sha2::Digest;
        let pem = self.ca_bundle_pem.as_deref().filter(|p| !p.is_empty())?;
        let mut certs: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(pem.as_bytes())
            .map(|c| c.map(|c| c.to_vec()))
            .collect::<Result<_, _>>()
            .unwrap_or_default();
        if certs.is_empty() {
            // Not PEM certificates (the agent refuses those elsewhere): the bytes as they are.
            certs.push(pem.as_bytes().to_vec());
        }
        certs.sort();
        certs.dedup();
        let mut hasher = sha2::Sha256::new();
        for cert in &certs {
            hasher.update((cert.len() as u64).to_be_bytes());
            hasher.update(cert);
        }
        Some(hex::encode(hasher.finalize()))
    }

    /// Whether SuperNodes authenticate with hub-registered keys
    /// ([`flower_addon_crds::FederationSpec::supernode_auth`]).
    pub fn secure(&self) -> bool {
        self.spec.supernode_auth()
    }
}

/// Checks the names of `fed` (they become object names and directory names).
pub fn check_names(fed: &FederationWork) -> Result<(), WorkError> {
    let pools = fed.pools.iter().map(|p| ("pool name", p.name.as_str()));
    for (what, value) in [
        ("namespace", fed.namespace.as_str()),
        ("name", fed.name.as_str()),
    ]
    .into_iter()
    .chain(pools)
    {
        flower_addon_crds::dns_label(value).map_err(|why| WorkError::Name {
            namespace: fed.namespace.clone(),
            name: fed.name.clone(),
            what,
            value: value.to_owned(),
            why: why.to_string(),
        })?;
    }
    Ok(())
}

/// Decodes one Federation of `work` (the snapshot gives the cluster's name).
pub fn decode_federation(
    work: &ClusterWork,
    fed: &FederationWork,
) -> Result<FederationPlan, WorkError> {
    check_names(fed)?;
    let federation = format!("{}/{}", fed.namespace, fed.name);
    let spec: FederationSpec =
        serde_json::from_str(&fed.federation_spec_json).map_err(|source| WorkError::Decode {
            federation: federation.clone(),
            what: "federation_spec_json".to_owned(),
            source,
        })?;
    let version_error = || WorkError::Version {
        federation: federation.clone(),
        version: fed.flower_version.clone(),
    };
    let version = FlowerVersion::parse(&fed.flower_version).ok_or_else(version_error)?;
    let dialect = FlowerDialect::of(version);
    let pools = fed
        .pools
        .iter()
        .map(|pool| decode_pool(work, fed, pool, &federation))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(FederationPlan {
        namespace: fed.namespace.clone(),
        name: fed.name.clone(),
        version,
        dialect,
        ca_bundle_pem: (!spec.insecure).then(|| fed.ca_bundle_pem.clone()),
        spec,
        fleet_address: fed.superlink_fleet_address.clone(),
        registered_node_keys: fed.registered_node_keys.clone(),
        retired_node_keys: fed.retired_node_keys.clone(),
        pools,
        supernode_restart: Some(fed.supernode_restart.trim())
            .filter(|r| !r.is_empty())
            .map(str::to_owned),
    })
}

fn decode_pool(
    work: &ClusterWork,
    fed: &FederationWork,
    pool: &PoolWork,
    federation: &str,
) -> Result<PoolPlan, WorkError> {
    let spec: SuperNodePoolSpec =
        serde_json::from_str(&pool.spec_json).map_err(|source| WorkError::Decode {
            federation: federation.to_owned(),
            what: format!("pool {:?} spec_json", pool.name),
            source,
        })?;
    if spec.name != pool.name {
        return Err(WorkError::PoolMismatch {
            federation: federation.to_owned(),
            wire: pool.name.clone(),
            spec: spec.name,
        });
    }
    Ok(PoolPlan {
        spec,
        cluster: ClusterContext {
            name: work.cluster_name.clone(),
            index: fed.cluster_index,
            clusters: fed.cluster_count.max(1),
            partition_offset: u64::from(pool.partition_offset),
            partitions: u64::from(fed.partitions_total),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(spec: serde_json::Value, pool: serde_json::Value) -> ClusterWork {
        ClusterWork {
            version: 1,
            cluster_name: "spoke-1".into(),
            federations: vec![FederationWork {
                namespace: "team".into(),
                name: "fed".into(),
                flower_version: "1.42.0".into(),
                superlink_fleet_address: "hub:30092".into(),
                ca_bundle_pem: "CA".into(),
                partitions_total: 5,
                federation_spec_json: spec.to_string(),
                cluster_index: 1,
                cluster_count: 2,
                registered_node_keys: vec!["k".into()],
                retired_node_keys: vec!["r".into()],
                supernode_restart: " 2026-12-06T06:00:00Z ".into(),
                pools: vec![PoolWork {
                    name: "a".into(),
                    partition_offset: 3,
                    spec_json: pool.to_string(),
                }],
            }],
        }
    }

    fn spec(insecure: bool) -> serde_json::Value {
        serde_json::json!({
            "mode": "StatefulSet", "isolationMode": "subprocess", "insecure": insecure,
            "superlink": {"image": "flwr/superlink:1.42.0"},
            "supernodes": {"image": "flwr/supernode:1.42.0", "pools": [{"name": "a", "replicas": 2}]},
        })
    }

    fn test_cert() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        rcgen::CertificateParams::new(vec!["ca.test".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem()
    }

    #[test]
    fn the_ca_digest_follows_the_bundle_and_is_absent_without_one() {
        // A CA rotation changes the bundle, and with it the digest that restarts SuperNodes.
        let w = work(spec(false), serde_json::json!({"name": "a", "replicas": 2}));
        let mut plan = decode_federation(&w, &w.federations[0]).expect("decodes");
        let one = plan.ca_digest().expect("TLS: a digest");
        assert_eq!(one.len(), 64);
        plan.ca_bundle_pem = Some("CA\nNEXT".into());
        assert_ne!(plan.ca_digest().as_deref(), Some(one.as_str()));
        // The same CAs in another order (a promoted rotation) keep the digest.
        let (a, b) = (test_cert(), test_cert());
        plan.ca_bundle_pem = Some(format!("{a}{b}"));
        let ab = plan.ca_digest();
        plan.ca_bundle_pem = Some(format!("{b}{a}"));
        assert_eq!(plan.ca_digest(), ab);
        plan.ca_bundle_pem = Some(a.clone());
        assert_ne!(
            plan.ca_digest(),
            ab,
            "one CA fewer (retired): another digest"
        );
        plan.ca_bundle_pem = Some(String::new());
        assert_eq!(plan.ca_digest(), None, "unknown CA (offline render): none");
        let w = work(spec(true), serde_json::json!({"name": "a", "replicas": 2}));
        let plan = decode_federation(&w, &w.federations[0]).expect("decodes");
        assert_eq!(plan.ca_digest(), None, "insecure: none");
    }

    #[test]
    fn a_federation_decodes_with_its_cluster_context() {
        // The cluster position, partitions and CA come from the message; the CA only with TLS.
        let w = work(spec(false), serde_json::json!({"name": "a", "replicas": 2}));
        let plan = decode_federation(&w, &w.federations[0]).expect("decodes");
        assert_eq!(plan.id(), "team/fed");
        assert_eq!(plan.dialect, FlowerDialect::Unified);
        assert_eq!(plan.ca_bundle_pem.as_deref(), Some("CA"));
        assert_eq!(
            (plan.registered_node_keys, plan.retired_node_keys),
            (vec!["k".to_owned()], vec!["r".to_owned()])
        );
        assert_eq!(
            plan.supernode_restart.as_deref(),
            Some("2026-12-06T06:00:00Z"),
            "the restart mark, trimmed"
        );
        assert_eq!(
            plan.pools[0].cluster,
            ClusterContext {
                name: "spoke-1".into(),
                index: 1,
                clusters: 2,
                partition_offset: 3,
                partitions: 5
            }
        );
        let w = work(spec(true), serde_json::json!({"name": "a", "replicas": 2}));
        assert_eq!(
            decode_federation(&w, &w.federations[0])
                .unwrap()
                .ca_bundle_pem,
            None
        );
    }

    #[test]
    fn malformed_work_is_refused_with_the_field() {
        // A bad spec, a transitional version, a path-like name and a pool whose spec names
        // another pool are each refused, naming what is wrong.
        let mut w = work(spec(false), serde_json::json!({"name": "b"}));
        let err = decode_federation(&w, &w.federations[0]).unwrap_err();
        assert!(
            err.to_string().contains("carries the spec of pool"),
            "{err}"
        );
        w.federations[0].pools[0].spec_json = "{".into();
        let err = decode_federation(&w, &w.federations[0]).unwrap_err();
        assert!(err.to_string().contains("pool \"a\" spec_json"), "{err}");
        w.federations[0].flower_version = "nightly".into();
        let err = decode_federation(&w, &w.federations[0]).unwrap_err();
        assert!(
            err.to_string()
                .contains("\"nightly\" is not a release number"),
            "{err}"
        );
        w.federations[0].namespace = "../..".into();
        let err = decode_federation(&w, &w.federations[0]).unwrap_err();
        assert!(err.to_string().contains("DNS labels"), "{err}");
    }
}

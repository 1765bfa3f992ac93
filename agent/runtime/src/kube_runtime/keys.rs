//! SuperNode authentication keys of the Kubernetes runtime (Federations whose
//! [`FederationPlan::secure`] is true: TLS on and `supernodeAuthentication` not off).
//!
//! Each pool has a Secret `<workload>-node-keys` in the Federation's namespace with one OpenSSH
//! private key per SuperNode, made here and never sent anywhere: data key = pod name
//! (`<workload>-<ordinal>`, StatefulSet pools) or node name (DaemonSet pools). Only the public
//! keys go to the hub ([`PoolStatus::node_public_keys`](flower_addon_proto::PoolStatus)), which
//! registers them with the SuperLink and sends back the registered ones.
//!
//! A SuperNode starts only once its key is registered (an unregistered one is refused by the
//! SuperLink and would crash-loop): a StatefulSet runs the leading ordinals whose key is
//! registered, a DaemonSet only on nodes whose key is registered (required node affinity). The
//! Secret records which names have been seen registered ([`REGISTERED_ANNOTATION`]), so a hub
//! that restarts and briefly sends fewer keys never stops running SuperNodes; only a lower
//! desired count (scale-down, removed pool or Federation) does, and it drops those keys.
//!
//! Keys are never regenerated, except one the hub lists as retired (`retired_node_keys`: the
//! SuperLink unregistered it once and never takes it back), which gets a new key pair. The
//! Secret is read first and written with optimistic concurrency
//! (create, or replace at the read `resourceVersion`), so a concurrent writer's keys are never
//! overwritten — on a conflict the Secret is read again.

use std::collections::{BTreeMap, BTreeSet};

use flower_addon_crds::render::node_key_secret_name;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodSpec,
    Secret,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, PostParams};

use super::{KubeRuntimeError, Workload, kube_err};
use crate::node_key::{NodeKey, NodeKeyError, generate_node_key, key_body, public_key_of};
use crate::render::component_labels;
use crate::work::FederationPlan;

/// Annotation of a key Secret: the comma-separated, sorted names whose key the hub has been seen
/// registering (sticky registration).
pub const REGISTERED_ANNOTATION: &str = "flower-addon.io/registered-node-keys";
/// A node name no node has (`.invalid` is reserved): the DaemonSet gate while no key is
/// registered (a `matchFields` requirement takes exactly one valid node name).
pub const NO_REGISTERED_NODE: &str = "no-registered-node-key.flower-addon.invalid";
/// How often a key Secret write is retried after a conflicting concurrent write.
const CONFLICT_RETRIES: usize = 5;

/// The node keys of one pool as stored in its Secret.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolKeys {
    /// Public key (`ecdsa-sha2-nistp384 …`) per pod or node name, for every desired one.
    pub public: BTreeMap<String, String>,
    /// Names whose key the hub has registered with the SuperLink (once seen, kept).
    pub registered: BTreeSet<String>,
}

/// The [`PoolKeys`] of one Federation's pools, by pool name.
pub type FederationKeys = BTreeMap<String, PoolKeys>;

// === which SuperNodes need a key ===

/// Pod names of a StatefulSet pool, `<name>-<ordinal>` for its ordinals
/// `[start, start + replicas)` (`spec.ordinals.start` is the pool's partition offset when it uses
/// `{partition}`).
pub fn statefulset_key_names(s: &StatefulSet) -> Vec<String> {
    let name = s.metadata.name.as_deref().unwrap_or_default();
    let start = s.spec.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0);
    let replicas = s.spec.replicas.unwrap_or(1).max(0);
    (0..replicas)
        .map(|i| format!("{name}-{}", i64::from(start) + i64::from(i)))
        .collect()
}

/// Names of the `nodes` a DaemonSet pool may run on: those matching its pod template's
/// `nodeSelector` and required node affinity, sorted. (Taints are not considered: a key for a
/// node the pool does not run on is only never used.)
pub fn daemonset_key_names(d: &DaemonSet, nodes: &[Node]) -> Vec<String> {
    let Some(pod) = d.spec.template.spec.as_ref() else {
        return Vec::new();
    };
    let mut names: Vec<String> = nodes
        .iter()
        .filter(|n| node_may_run(pod, n))
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

fn node_may_run(pod: &PodSpec, node: &Node) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let selector_ok = pod
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let required = pod
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    selector_ok
        && required.is_none_or(|r| {
            r.node_selector_terms
                .iter()
                .any(|term| term_matches(term, labels, name))
        })
}

/// A node selector term (an empty one matches nothing, as in Kubernetes).
fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>, name: &str) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            let value = (r.key == "metadata.name").then_some(name);
            requirement_matches(r, value)
        })
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    let compare = |f: fn(i64, i64) -> bool| match (value.and_then(number), values.first()) {
        (Some(v), Some(bound)) => number(bound).is_some_and(|b| f(v, b)),
        _ => false,
    };
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => compare(|v, b| v > b),
        "Lt" => compare(|v, b| v < b),
        _ => false,
    }
}

// === start gating (pure) ===

/// Lets `workload` start only SuperNodes whose key is registered; returns how many desired ones
/// wait for their registration. StatefulSet: `replicas` = the leading ordinals with a registered
/// key. DaemonSet: a required node affinity on the registered nodes' names (ANDed with the
/// user's terms).
pub fn gate_workload(workload: &mut Workload, keys: &PoolKeys) -> u32 {
    let usable = |name: &String| keys.registered.contains(name) && keys.public.contains_key(name);
    match workload {
        Workload::StatefulSet(s) => {
            let names = statefulset_key_names(s);
            let startable = names.iter().take_while(|n| usable(n)).count();
            s.spec.replicas = Some(i32::try_from(startable).unwrap_or(i32::MAX));
            u32::try_from(names.len() - startable).unwrap_or(u32::MAX)
        }
        Workload::DaemonSet(d) => {
            let nodes: Vec<&String> = keys.public.keys().filter(|n| usable(n)).collect();
            let pod = d.spec.template.spec.get_or_insert_with(PodSpec::default);
            restrict_to_nodes(pod, &nodes);
            u32::try_from(keys.public.len() - nodes.len()).unwrap_or(u32::MAX)
        }
    }
}

/// Adds `metadata.name In [node]` to every required node selector term, one copy of the terms
/// per node (a field requirement takes one value; terms are ORed, requirements within one
/// ANDed), or [`NO_REGISTERED_NODE`] when `nodes` is empty.
fn restrict_to_nodes(pod: &mut PodSpec, nodes: &[&String]) {
    let required = pod
        .affinity
        .get_or_insert_with(Affinity::default)
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(NodeSelector::default);
    let mut user_terms = std::mem::take(&mut required.node_selector_terms);
    if user_terms.is_empty() {
        user_terms.push(NodeSelectorTerm::default());
    }
    let none = NO_REGISTERED_NODE.to_owned();
    let names: Vec<&String> = if nodes.is_empty() {
        vec![&none]
    } else {
        nodes.to_vec()
    };
    for name in names {
        for term in &user_terms {
            let mut term = term.clone();
            term.match_fields
                .get_or_insert_with(Vec::new)
                .push(NodeSelectorRequirement {
                    key: "metadata.name".to_owned(),
                    operator: "In".to_owned(),
                    values: Some(vec![name.clone()]),
                });
            required.node_selector_terms.push(term);
        }
    }
}

// === the key Secret (pure) ===

/// The key Secret's content after one reconcile.
#[derive(Clone, Debug, PartialEq)]
pub struct MergedKeys {
    /// Private keys by name (`data`).
    pub data: BTreeMap<String, ByteString>,
    /// What the pool's SuperNodes may use.
    pub keys: PoolKeys,
    /// Names recorded as registered whose key is gone from the Secret (someone edited it) and
    /// was made anew.
    pub lost: Vec<String>,
}

/// Merges `existing` Secret data with the `desired` names: stored keys are kept byte for byte
/// unless their public key is in `retired_public` (the SuperLink refuses it for ever), missing
/// and retired ones made with `generate`, others dropped; a name is registered if it was
/// recorded so before (and its key kept) or its public key is in `registered_public` (the hub's
/// list). `what` names the Secret in errors.
pub fn merge_pool_keys(
    existing: Option<&Secret>,
    what: &str,
    desired: &[String],
    (registered_public, retired_public): (&[String], &[String]),
    mut generate: impl FnMut() -> Result<NodeKey, NodeKeyError>,
) -> Result<MergedKeys, KubeRuntimeError> {
    let empty = BTreeMap::new();
    let stored = existing.and_then(|s| s.data.as_ref()).unwrap_or(&empty);
    let recorded = existing.map(recorded_registered).unwrap_or_default();
    let registered_public: BTreeSet<&str> = registered_public.iter().map(|k| key_body(k)).collect();
    let retired_public: BTreeSet<&str> = retired_public.iter().map(|k| key_body(k)).collect();
    let key_err = |name: &str| {
        let what = format!("{what} data key {name:?}");
        move |source| KubeRuntimeError::NodeKey { what, source }
    };
    let mut out = MergedKeys {
        data: BTreeMap::new(),
        keys: PoolKeys::default(),
        lost: Vec::new(),
    };
    for name in desired {
        if recorded.contains(name) && !stored.contains_key(name) {
            out.lost.push(name.clone());
        }
        let kept = match stored.get(name) {
            Some(bytes) => {
                let text = String::from_utf8_lossy(&bytes.0);
                let public = public_key_of(&text, "stored key").map_err(key_err(name))?;
                if retired_public.contains(key_body(&public)) {
                    tracing::info!(secret = %what, key = %name, "the SuperLink will not take this SuperNode's key back (unregistered before): making a new one");
                    None
                } else {
                    Some((bytes.clone(), public))
                }
            }
            None => None,
        };
        let (bytes, public, fresh) = match kept {
            Some((bytes, public)) => (bytes, public, false),
            None => {
                let key = generate().map_err(key_err(name))?;
                let bytes = ByteString(key.private_openssh.into_bytes());
                (bytes, key.public_openssh, true)
            }
        };
        if (!fresh && recorded.contains(name)) || registered_public.contains(key_body(&public)) {
            out.keys.registered.insert(name.clone());
        }
        out.keys.public.insert(name.clone(), public);
        out.data.insert(name.clone(), bytes);
    }
    Ok(out)
}

fn recorded_registered(secret: &Secret) -> BTreeSet<String> {
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REGISTERED_ANNOTATION))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The key Secret of `pool` holding `merged`, built on `existing` (its other labels,
/// annotations and owners are kept) or new, labelled like the pool's other objects so pruning
/// finds it.
pub fn key_secret(
    plan: &FederationPlan,
    pool: &str,
    existing: Option<&Secret>,
    merged: &MergedKeys,
) -> Secret {
    let mut secret = existing.cloned().unwrap_or_else(|| Secret {
        metadata: ObjectMeta {
            name: Some(node_key_secret_name(&plan.name, pool)),
            namespace: Some(plan.namespace.clone()),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    });
    let labels = secret.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.extend(component_labels(
        &plan.name,
        "supernode-node-keys",
        &format!("pool-{pool}"),
        Some(pool),
    ));
    super::render::mark(&mut secret.metadata);
    let annotations = secret
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    if merged.keys.registered.is_empty() {
        annotations.remove(REGISTERED_ANNOTATION);
    } else {
        let names: Vec<&str> = merged.keys.registered.iter().map(String::as_str).collect();
        annotations.insert(REGISTERED_ANNOTATION.to_owned(), names.join(","));
    }
    if annotations.is_empty() {
        secret.metadata.annotations = None;
    }
    // The apiserver drops an empty map; so do we, or every reconcile would see a change.
    secret.data = (!merged.data.is_empty()).then(|| merged.data.clone());
    secret.metadata.managed_fields = None;
    secret
}

// === Kubernetes I/O ===

/// What [`ensure_pool_keys`] found and did.
#[derive(Debug)]
pub(super) struct EnsuredKeys {
    /// What the pool's SuperNodes may use.
    pub keys: PoolKeys,
    /// Keys that were in use and are gone, made anew: said as a Warning event on the Secret.
    pub lost: Option<LostKeys>,
}

/// Node keys a pool's SuperNodes were using that someone deleted; new ones were made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct LostKeys {
    /// The key Secret, `Secret <ns>/<name>`.
    pub secret: String,
    /// Its uid after the write (the event's object).
    pub uid: Option<String>,
    /// The pool's workload that mounts it, `StatefulSet <ns>/<name>`, when the whole Secret was
    /// deleted; `None` when keys were deleted from it.
    pub deleted_under: Option<String>,
    /// The pods or nodes whose key was made anew.
    pub names: Vec<String>,
}

/// The Warning event's reason for [`LostKeys`].
pub const NODE_KEYS_RECREATED: &str = "NodeKeysRecreated";

impl LostKeys {
    /// The event's note: what was lost, what it costs and what to do.
    pub fn note(&self) -> String {
        let what = match &self.deleted_under {
            Some(workload) => format!("{} was deleted while {workload} used it", self.secret),
            None => format!("keys of {} were deleted", self.secret),
        };
        format!(
            "{what}: made new SuperNode keys for {}. Those SuperNodes stop until the hub has \
             registered the new keys with the SuperLink, which forgets the old ones (their runs \
             lose them). The keys are the SuperNodes' identities: leave this Secret to \
             flower-agent (it is removed with its pool).",
            self.names.join(", ")
        )
    }
}

/// Whether the pool's workload (`kind` `name`, as the runtime renders it) exists and mounts the
/// key Secret `secret`: a missing Secret was then deleted, not never made.
async fn workload_mounts(
    client: &Client,
    namespace: &str,
    workload: &Workload,
    secret: &str,
) -> Result<Option<String>, KubeRuntimeError> {
    let (kind, name, template) = match workload {
        Workload::StatefulSet(s) => {
            let name = s.metadata.name.clone().unwrap_or_default();
            let found = Api::<StatefulSet>::namespaced(client.clone(), namespace)
                .get_opt(&name)
                .await
                .map_err(kube_err(format!("get StatefulSet {namespace}/{name}")))?;
            ("StatefulSet", name, found.map(|s| s.spec.template))
        }
        Workload::DaemonSet(d) => {
            let name = d.metadata.name.clone().unwrap_or_default();
            let found = Api::<DaemonSet>::namespaced(client.clone(), namespace)
                .get_opt(&name)
                .await
                .map_err(kube_err(format!("get DaemonSet {namespace}/{name}")))?;
            ("DaemonSet", name, found.map(|d| d.spec.template))
        }
    };
    let mounts = template
        .and_then(|t| t.spec)
        .and_then(|spec| spec.volumes)
        .unwrap_or_default()
        .iter()
        .any(|v| {
            v.secret
                .as_ref()
                .is_some_and(|s| s.secret_name.as_deref() == Some(secret))
        });
    Ok(mounts.then(|| format!("{kind} {namespace}/{name}")))
}

/// Makes sure `pool`'s key Secret holds a key for each of `names` (and no other), records the
/// names the hub registered, and returns the keys; writes nothing when nothing changed. Keys in
/// use that someone deleted (the whole Secret while `workload` mounts it, or registered keys
/// from it) are made anew and returned as [`EnsuredKeys::lost`].
pub(super) async fn ensure_pool_keys(
    client: &Client,
    applier: &super::Applier,
    plan: &FederationPlan,
    (pool, workload): (&str, &Workload),
    names: &[String],
) -> Result<EnsuredKeys, KubeRuntimeError> {
    let name = node_key_secret_name(&plan.name, pool);
    let what = format!("Secret {}/{name}", plan.namespace);
    let api = Api::<Secret>::namespaced(client.clone(), &plan.namespace);
    let params = PostParams {
        field_manager: Some(applier.manager().to_owned()),
        ..PostParams::default()
    };
    for _ in 0..CONFLICT_RETRIES {
        let existing = api
            .get_opt(&name)
            .await
            .map_err(kube_err(format!("get {what}")))?;
        let merged = merge_pool_keys(
            existing.as_ref(),
            &what,
            names,
            (&plan.registered_node_keys, &plan.retired_node_keys),
            generate_node_key,
        )?;
        let mut secret = key_secret(plan, pool, existing.as_ref(), &merged);
        applier.stamp(&mut secret.metadata, &plan.namespace, &plan.name);
        let written = match &existing {
            None => api.create(&params, &secret).await,
            Some(old) if unchanged(old, &secret) => {
                return Ok(EnsuredKeys {
                    keys: merged.keys,
                    lost: None,
                });
            }
            // `secret` carries the read resourceVersion: a write in between is a conflict.
            Some(_) => api.replace(&name, &params, &secret).await,
        };
        match written {
            Ok(stored) => {
                tracing::info!(secret = %what, keys = merged.keys.public.len(), registered = merged.keys.registered.len(), "node keys written");
                let deleted_under = match existing {
                    None if !names.is_empty() => {
                        workload_mounts(client, &plan.namespace, workload, &name).await?
                    }
                    _ => None,
                };
                let lost = match deleted_under {
                    Some(workload) => Some((Some(workload), names.to_vec())),
                    None if !merged.lost.is_empty() => Some((None, merged.lost)),
                    None => None,
                }
                .map(|(deleted_under, names)| LostKeys {
                    secret: what.clone(),
                    uid: stored.metadata.uid,
                    deleted_under,
                    names,
                });
                if let Some(lost) = &lost {
                    tracing::warn!(secret = %what, "{}", lost.note());
                }
                return Ok(EnsuredKeys {
                    keys: merged.keys,
                    lost,
                });
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::debug!(secret = %what, "node keys changed concurrently; reading again");
            }
            Err(source) => {
                return Err(KubeRuntimeError::Kube {
                    action: format!("write {what}"),
                    source,
                });
            }
        }
    }
    Err(KubeRuntimeError::Conflict { what })
}

fn unchanged(old: &Secret, new: &Secret) -> bool {
    let mut old = old.clone();
    old.metadata.managed_fields = None;
    &old == new
}

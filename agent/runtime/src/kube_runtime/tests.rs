use super::*;
use flower_addon_proto::PoolWork;
use status::{Counts, ready_condition};

fn work(insecure: bool) -> ClusterWork {
    let spec = serde_json::json!({
        "mode": "StatefulSet",
        "isolationMode": "subprocess",
        "insecure": insecure,
        "superlink": {"image": "flwr/superlink:1.42.0"},
        "supernodes": {"image": "flwr/supernode:1.42.0", "pools": [
            {"name": "a", "replicas": 2, "images": {}},
        ]},
    });
    ClusterWork {
        version: 1,
        cluster_name: "spoke-1".into(),
        federations: vec![FederationWork {
            namespace: "team".into(),
            name: "fed".into(),
            flower_version: "1.42.0".into(),
            superlink_fleet_address: "hub.example:30092".into(),
            ca_bundle_pem: "PEM".into(),
            partitions_total: 2,
            federation_spec_json: spec.to_string(),
            pools: vec![PoolWork {
                name: "a".into(),
                partition_offset: 0,
                spec_json: spec["supernodes"]["pools"][0].to_string(),
            }],
            ..FederationWork::default()
        }],
    }
}

fn render(w: &ClusterWork) -> Result<Rendered, KubeRuntimeError> {
    render_federation(&crate::work::decode_federation(w, &w.federations[0])?)
}

#[test]
fn rendered_objects_carry_the_prune_label_outside_the_selector() {
    // Pruning finds what the agent applied, and adding the label never touches an immutable selector.
    let w = work(false);
    let rendered = render(&w).unwrap();
    let secret = rendered.secret.unwrap();
    assert_eq!(secret.metadata.name.as_deref(), Some("fed-superlink-ca"));
    assert_eq!(
        secret.metadata.labels.as_ref().unwrap()[APPLIED_BY_LABEL],
        AGENT_FIELD_MANAGER
    );
    let Workload::StatefulSet(s) = &rendered.workloads[0].1 else {
        panic!("StatefulSet mode renders a StatefulSet");
    };
    assert_eq!(
        s.metadata.labels.as_ref().unwrap()[APPLIED_BY_LABEL],
        AGENT_FIELD_MANAGER
    );
    let selector = s.spec.selector.match_labels.as_ref().unwrap();
    assert!(!selector.contains_key(APPLIED_BY_LABEL));
}

#[test]
fn insecure_work_has_no_ca_secret() {
    // Without TLS nothing mounts a CA bundle, so none is applied (and an old one is pruned).
    let w = work(true);
    assert!(render(&w).unwrap().secret.is_none());
}

#[test]
fn a_new_ca_bundle_rolls_the_supernodes() {
    // SuperNodes read their root certificates once: a rotated bundle changes the pod template.
    let digest = |w: &ClusterWork| {
        let Workload::StatefulSet(s) = render(w).unwrap().workloads.remove(0).1 else {
            panic!("StatefulSet mode renders a StatefulSet");
        };
        let meta = s.spec.template.metadata.unwrap_or_default();
        meta.annotations
            .unwrap_or_default()
            .get(crate::work::CA_DIGEST_ANNOTATION)
            .cloned()
    };
    let mut w = work(false);
    let before = digest(&w).expect("TLS: the bundle's digest");
    w.federations[0].ca_bundle_pem = "PEM\nNEXT".into();
    let after = digest(&w).expect("TLS: the bundle's digest");
    assert_ne!(before, after);
    assert_eq!(digest(&work(true)), None, "insecure: no CA, no digest");
}

#[test]
fn a_new_restart_mark_rolls_the_supernodes() {
    // The Federation's restart mark is on every pool's pod template: a new one rolls the pods
    // (a StatefulSet keeps their names, so their keys); none, no annotation.
    let mark = |w: &ClusterWork| {
        render(w)
            .unwrap()
            .workloads
            .into_iter()
            .map(|(_, workload)| {
                let template = match workload {
                    Workload::StatefulSet(s) => s.spec.template,
                    Workload::DaemonSet(d) => d.spec.template,
                };
                template
                    .metadata
                    .unwrap_or_default()
                    .annotations
                    .unwrap_or_default()
                    .get(flower_addon_crds::SUPERNODE_RESTART_ANNOTATION)
                    .cloned()
            })
            .collect::<Vec<_>>()
    };
    let mut w = work(false);
    assert!(mark(&w).iter().all(Option::is_none), "{:?}", mark(&w));
    w.federations[0].supernode_restart = "2026-12-06T06:00:00Z".into();
    let first = mark(&w);
    assert!(
        !first.is_empty()
            && first
                .iter()
                .all(|m| m.as_deref() == Some("2026-12-06T06:00:00Z")),
        "{first:?}"
    );
    w.federations[0].supernode_restart = "2026-12-06T07:00:00Z".into();
    assert_ne!(mark(&w), first);
}

#[test]
fn rendering_is_deterministic() {
    // The same snapshot gives byte-identical objects, so re-applying changes nothing.
    let w = work(false);
    let a = render(&w).unwrap();
    let b = render(&w).unwrap();
    assert_eq!(a.workloads[0].1, b.workloads[0].1);
    assert_eq!(a.secret, b.secret);
}

#[test]
fn readiness_needs_every_replica_and_a_fresh_status() {
    // Ready=True only when the controller saw the latest spec and all replicas are ready.
    let c = |desired, ready, stale| Counts {
        desired,
        ready,
        stale,
        waiting: 0,
        rolling: None,
    };
    assert_eq!(ready_condition("x", c(2, 2, false)).status, "True");
    assert_eq!(ready_condition("x", c(2, 1, false)).status, "False");
    assert!(ready_condition("x", c(2, 1, false)).message.contains("1/2"));
    assert_eq!(ready_condition("x", c(2, 2, true)).status, "False");
}

// === SuperNode keys ===

use k8s_openapi::api::core::v1::Node;
use keys::{
    NO_REGISTERED_NODE, REGISTERED_ANNOTATION, daemonset_key_names, key_secret, merge_pool_keys,
    statefulset_key_names,
};

fn plan(w: &ClusterWork) -> FederationPlan {
    crate::work::decode_federation(w, &w.federations[0]).unwrap()
}

fn statefulset(rendered: &Rendered) -> &StatefulSet {
    match &rendered.workloads[0].1 {
        Workload::StatefulSet(s) => s,
        Workload::DaemonSet(_) => panic!("StatefulSet mode renders a StatefulSet"),
    }
}

fn supernode_args(s: &StatefulSet) -> Vec<String> {
    let pod = s.spec.template.spec.as_ref().unwrap();
    pod.containers[0].args.clone().unwrap()
}

fn pool_keys(names: &[&str], registered: &[&str]) -> PoolKeys {
    PoolKeys {
        public: names
            .iter()
            .map(|n| ((*n).to_owned(), format!("ecdsa-sha2-nistp384 {n}")))
            .collect(),
        registered: registered.iter().map(|n| (*n).to_owned()).collect(),
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|n| (*n).to_owned()).collect()
}

fn no_new_keys() -> Result<crate::node_key::NodeKey, crate::node_key::NodeKeyError> {
    panic!("a stored key must never be regenerated")
}

#[test]
fn secure_pools_read_their_own_key_and_the_offline_render_starts_every_replica() {
    // `render --cluster` shows the desired replicas with the key mount; insecure pools get none.
    let rendered = render(&work(false)).unwrap();
    let s = statefulset(&rendered);
    assert_eq!(s.spec.replicas, Some(2));
    assert_eq!(
        supernode_args(s).last().unwrap(),
        "--auth-supernode-private-key=/var/run/flower-addon/node-key/$(FLWR_POD_NAME)"
    );
    let volumes = s
        .spec
        .template
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .clone()
        .unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref())
                == Some("fed-supernode-a-node-keys"))
    );
    let insecure = render(&work(true)).unwrap();
    let s = statefulset(&insecure);
    assert_eq!(s.spec.replicas, Some(2));
    assert!(
        !supernode_args(s)
            .iter()
            .any(|a| a.contains("auth-supernode"))
    );
    assert!(s.spec.template.spec.as_ref().unwrap().volumes.is_none());
}

#[test]
fn only_leading_ordinals_with_a_registered_key_start() {
    // A StatefulSet starts pods in ordinal order: replicas count the registered prefix only.
    let w = work(false);
    let plan = plan(&w);
    for (registered, replicas, waiting) in [
        (&[][..], 0, 2),
        (&["fed-supernode-a-1"][..], 0, 2),
        (&["fed-supernode-a-0"][..], 1, 1),
        (&["fed-supernode-a-0", "fed-supernode-a-1"][..], 2, 0),
    ] {
        let keys = FederationKeys::from([(
            "a".to_owned(),
            pool_keys(&["fed-supernode-a-0", "fed-supernode-a-1"], registered),
        )]);
        let rendered = render_federation_with_keys(&plan, &keys).unwrap();
        assert_eq!(
            statefulset(&rendered).spec.replicas,
            Some(replicas),
            "{registered:?}"
        );
        let (pool, _) = &rendered.workloads[0];
        assert_eq!(pool.waiting, waiting, "{registered:?}");
        assert_eq!(
            pool.node_public_keys.len(),
            2,
            "every desired key is reported"
        );
    }
    // A pool without keys starts nothing; insecure Federations are not gated.
    let rendered = render_federation_with_keys(&plan, &FederationKeys::new()).unwrap();
    assert_eq!(statefulset(&rendered).spec.replicas, Some(0));
    let insecure = render_federation_with_keys(&self::plan(&work(true)), &FederationKeys::new());
    assert_eq!(statefulset(&insecure.unwrap()).spec.replicas, Some(2));
}

#[test]
fn rendering_with_keys_is_deterministic() {
    // The same keys give byte-identical objects: a reconcile never changes an unchanged pool.
    let plan = plan(&work(false));
    let keys = FederationKeys::from([(
        "a".to_owned(),
        pool_keys(
            &["fed-supernode-a-0", "fed-supernode-a-1"],
            &["fed-supernode-a-0"],
        ),
    )]);
    let a = render_federation_with_keys(&plan, &keys).unwrap();
    let b = render_federation_with_keys(&plan, &keys).unwrap();
    assert_eq!(a.to_values().unwrap(), b.to_values().unwrap());
    assert_eq!(a.workloads[0].0, b.workloads[0].0);
}

#[test]
fn pods_are_named_by_ordinal_from_the_partition_offset() {
    // Pools using {partition} number pods from their offset; keys follow the pod names.
    let mut w = work(false);
    let pool = r#"{"name": "a", "replicas": 2, "images": {}, "nodeConfig": {"p": "{partition}"}}"#;
    w.federations[0].pools[0].spec_json = pool.to_owned();
    w.federations[0].pools[0].partition_offset = 3;
    let rendered = render(&w).unwrap();
    assert_eq!(
        statefulset_key_names(statefulset(&rendered)),
        names(&["fed-supernode-a-3", "fed-supernode-a-4"])
    );
}

#[test]
fn a_key_the_hub_did_not_register_never_starts_its_pod() {
    // Negative: keys in the hub's list that are not this pod's (or comments, whitespace) never
    // count as its registration.
    let desired = names(&["fed-supernode-a-0"]);
    let merged = merge_pool_keys(
        None,
        "Secret team/k",
        &desired,
        (&[], &[]),
        crate::node_key::generate_node_key,
    )
    .unwrap();
    let other = crate::node_key::generate_node_key().unwrap().public_openssh;
    let existing = key_secret(&plan(&work(false)), "a", None, &merged);
    let again = merge_pool_keys(
        Some(&existing),
        "Secret team/k",
        &desired,
        (&[other], &[]),
        no_new_keys,
    )
    .unwrap();
    assert!(again.keys.registered.is_empty());
    let mut w = work(false);
    w.federations[0].pools[0].spec_json = r#"{"name": "a", "replicas": 1, "images": {}}"#.into();
    let rendered = render_federation_with_keys(
        &plan(&w),
        &FederationKeys::from([("a".to_owned(), again.keys.clone())]),
    )
    .unwrap();
    assert_eq!(statefulset(&rendered).spec.replicas, Some(0));
    // Its own key, with a comment and a trailing newline, does count.
    let own = format!(
        "{} fed-supernode-a-0\n",
        again.keys.public["fed-supernode-a-0"]
    );
    let registered = merge_pool_keys(
        Some(&existing),
        "Secret team/k",
        &desired,
        (&[own], &[]),
        no_new_keys,
    )
    .unwrap();
    assert_eq!(registered.keys.registered.len(), 1);
}

/// Keys made for pool a's pods a-0 and a-1, then the hub's list with a-0's: the first merge, the
/// second, and the Secret holding the first.
fn keys_with_a0_registered(
    plan: &crate::work::FederationPlan,
) -> (super::keys::MergedKeys, super::keys::MergedKeys, Secret) {
    let desired = names(&["fed-supernode-a-0", "fed-supernode-a-1"]);
    let first = merge_pool_keys(
        None,
        "Secret team/k",
        &desired,
        (&[], &[]),
        crate::node_key::generate_node_key,
    )
    .unwrap();
    let secret = key_secret(plan, "a", None, &first);
    let hub_list = vec![first.keys.public["fed-supernode-a-0"].clone()];
    let seen = merge_pool_keys(
        Some(&secret),
        "Secret team/k",
        &desired,
        (&hub_list, &[]),
        no_new_keys,
    )
    .unwrap();
    (first, seen, secret)
}

#[test]
fn stored_keys_are_kept_and_registration_is_sticky() {
    // A key in the Secret is never regenerated, and once the hub registered it the pod keeps
    // running even when a restarted hub briefly sends no keys.
    let plan = plan(&work(false));
    let desired = names(&["fed-supernode-a-0", "fed-supernode-a-1"]);
    let (first, seen, secret) = keys_with_a0_registered(&plan);
    assert!(first.keys.registered.is_empty());
    assert_eq!(seen.data, first.data, "stored keys are kept byte for byte");
    assert_eq!(
        seen.keys.registered,
        BTreeSet::from(["fed-supernode-a-0".to_owned()])
    );
    let secret = key_secret(&plan, "a", Some(&secret), &seen);
    assert_eq!(
        secret.metadata.annotations.as_ref().unwrap()[REGISTERED_ANNOTATION],
        "fed-supernode-a-0"
    );
    let after_restart = merge_pool_keys(
        Some(&secret),
        "Secret team/k",
        &desired,
        (&[], &[]),
        no_new_keys,
    )
    .unwrap();
    assert_eq!(after_restart, seen);
    assert_eq!(
        key_secret(&plan, "a", Some(&secret), &after_restart),
        secret
    );
}

#[test]
fn a_registered_key_deleted_from_the_secret_is_made_anew_and_named_lost() {
    // A key someone deleted from the Secret while it was registered gets a new key pair that
    // waits for its own registration, and is reported so the runtime can say so; a key never
    // registered (a new pod) is not "lost".
    let plan = plan(&work(false));
    let (first, seen, _) = keys_with_a0_registered(&plan);
    assert!(first.lost.is_empty(), "a first Secret loses nothing");
    assert!(seen.lost.is_empty(), "a registration loses nothing");
    let mut edited = key_secret(&plan, "a", None, &seen);
    let data = edited.data.as_mut().unwrap();
    data.remove("fed-supernode-a-0");
    data.remove("fed-supernode-a-1");
    let remade = merge_pool_keys(
        Some(&edited),
        "Secret team/k",
        &names(&["fed-supernode-a-0", "fed-supernode-a-1"]),
        (&[], &[]),
        crate::node_key::generate_node_key,
    )
    .unwrap();
    assert_eq!(remade.lost, names(&["fed-supernode-a-0"]));
    assert_ne!(
        remade.keys.public["fed-supernode-a-0"],
        first.keys.public["fed-supernode-a-0"]
    );
    assert!(
        remade.keys.registered.is_empty(),
        "a new key waits for its registration"
    );
}

#[test]
fn scale_down_removes_keys_and_their_registration() {
    // Ordinals beyond the desired count lose key and registration: scaling up again makes a new
    // identity that waits for its own registration.
    let plan = plan(&work(false));
    let three = names(&[
        "fed-supernode-a-0",
        "fed-supernode-a-1",
        "fed-supernode-a-2",
    ]);
    let made = merge_pool_keys(
        None,
        "s",
        &three,
        (&[], &[]),
        crate::node_key::generate_node_key,
    )
    .unwrap();
    let all: Vec<String> = made.keys.public.values().cloned().collect();
    let registered = merge_pool_keys(
        Some(&key_secret(&plan, "a", None, &made)),
        "s",
        &three,
        (&all, &[]),
        no_new_keys,
    )
    .unwrap();
    let secret = key_secret(&plan, "a", None, &registered);
    let two = merge_pool_keys(Some(&secret), "s", &three[..2], (&[], &[]), no_new_keys).unwrap();
    assert_eq!(two.data.len(), 2);
    assert_eq!(two.keys.registered.len(), 2);
    let secret = key_secret(&plan, "a", Some(&secret), &two);
    assert!(
        !secret
            .data
            .as_ref()
            .unwrap()
            .contains_key("fed-supernode-a-2")
    );
    let up = merge_pool_keys(
        Some(&secret),
        "s",
        &three,
        (&[], &[]),
        crate::node_key::generate_node_key,
    )
    .unwrap();
    assert_ne!(up.data["fed-supernode-a-2"], made.data["fed-supernode-a-2"]);
    assert!(!up.keys.registered.contains("fed-supernode-a-2"));
    // A key that vanished from the Secret (deleted by hand) is made anew and not registered,
    // even though the annotation still names it.
    let mut damaged = secret.clone();
    damaged.data.as_mut().unwrap().remove("fed-supernode-a-1");
    let remade = merge_pool_keys(
        Some(&damaged),
        "s",
        &three[..2],
        (&[], &[]),
        crate::node_key::generate_node_key,
    )
    .unwrap();
    assert_eq!(
        remade.keys.registered,
        BTreeSet::from(["fed-supernode-a-0".to_owned()])
    );
}

#[test]
fn a_key_the_superlink_retired_is_replaced_and_waits_for_its_new_registration() {
    // Flower never registers a key again once it was unregistered: a stored key the hub lists
    // as retired gets a new key pair (its name loses the sticky registration), the others stay.
    let plan = plan(&work(false));
    let two = names(&["fed-supernode-a-0", "fed-supernode-a-1"]);
    let made = merge_pool_keys(
        None,
        "s",
        &two,
        (&[], &[]),
        crate::node_key::generate_node_key,
    )
    .unwrap();
    let all: Vec<String> = made.keys.public.values().cloned().collect();
    let registered = merge_pool_keys(
        Some(&key_secret(&plan, "a", None, &made)),
        "s",
        &two,
        (&all, &[]),
        no_new_keys,
    )
    .unwrap();
    assert_eq!(registered.keys.registered.len(), 2);
    let secret = key_secret(&plan, "a", None, &registered);
    let retired = vec![format!(
        "{} a comment",
        made.keys.public["fed-supernode-a-1"]
    )];
    let replaced = merge_pool_keys(
        Some(&secret),
        "s",
        &two,
        (&all, &retired),
        crate::node_key::generate_node_key,
    )
    .unwrap();
    assert_eq!(
        replaced.data["fed-supernode-a-0"],
        made.data["fed-supernode-a-0"]
    );
    assert_ne!(
        replaced.data["fed-supernode-a-1"],
        made.data["fed-supernode-a-1"]
    );
    assert_ne!(
        replaced.keys.public["fed-supernode-a-1"],
        made.keys.public["fed-supernode-a-1"]
    );
    assert_eq!(
        replaced.keys.registered,
        BTreeSet::from(["fed-supernode-a-0".to_owned()])
    );
}

#[test]
fn a_corrupt_stored_key_is_an_error_naming_the_secret_and_key() {
    // Never replaced silently (the pod may be registered with it): the error says where it is.
    let secret = Secret {
        data: Some(BTreeMap::from([(
            "fed-supernode-a-0".to_owned(),
            ByteString(b"not a key".to_vec()),
        )])),
        ..Secret::default()
    };
    let err = merge_pool_keys(
        Some(&secret),
        "Secret team/fed-supernode-a-node-keys",
        &names(&["fed-supernode-a-0"]),
        (&[], &[]),
        no_new_keys,
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("Secret team/fed-supernode-a-node-keys data key \"fed-supernode-a-0\""),
        "{text}"
    );
    assert_eq!(err.metric_label(), "node_key");
}

#[test]
fn the_key_secret_is_pruned_with_its_federation() {
    // Pruning selects on managed-by + applied-by and keeps Federations by their instance label.
    let plan = plan(&work(false));
    let merged = merge_pool_keys(None, "s", &[], (&[], &[]), no_new_keys).unwrap();
    let secret = key_secret(&plan, "a", None, &merged);
    assert_eq!(
        secret.metadata.name.as_deref(),
        Some("fed-supernode-a-node-keys")
    );
    let labels = secret.metadata.labels.unwrap();
    assert_eq!(labels[APPLIED_BY_LABEL], AGENT_FIELD_MANAGER);
    assert_eq!(
        labels["app.kubernetes.io/managed-by"],
        crate::render::MANAGED_BY
    );
    assert_eq!(labels["app.kubernetes.io/instance"], "fed");
    assert!(secret.metadata.annotations.is_none());
}

fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

fn daemonset_work(pod_template: serde_json::Value) -> ClusterWork {
    let mut w = work(false);
    let mut spec: serde_json::Value =
        serde_json::from_str(&w.federations[0].federation_spec_json).unwrap();
    spec["mode"] = "DaemonSet".into();
    let pool = serde_json::json!({"name": "a", "images": {}, "podTemplate": pod_template});
    spec["supernodes"]["pools"] = serde_json::json!([pool.clone()]);
    w.federations[0].federation_spec_json = spec.to_string();
    w.federations[0].pools[0].spec_json = pool.to_string();
    w
}

fn daemonset(rendered: &Rendered) -> &k8s_openapi::api::apps::v1::DaemonSet {
    match &rendered.workloads[0].1 {
        Workload::DaemonSet(d) => d,
        Workload::StatefulSet(_) => panic!("DaemonSet mode renders a DaemonSet"),
    }
}

/// `metadata.name` values and label expressions of each required term, as `(node, labels)`.
fn required_terms(d: &k8s_openapi::api::apps::v1::DaemonSet) -> Vec<(String, Vec<String>)> {
    let pod = d.spec.template.spec.as_ref().unwrap();
    let required = pod
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap();
    let terms = &required
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    terms
        .iter()
        .map(|t| {
            let fields = t.match_fields.as_ref().unwrap();
            assert_eq!(fields.len(), 1);
            let expressions = t.match_expressions.iter().flatten().map(|e| e.key.clone());
            (
                fields[0].values.as_ref().unwrap()[0].clone(),
                expressions.collect(),
            )
        })
        .collect()
}

#[test]
fn daemonset_pools_have_a_key_per_node_they_may_run_on() {
    // Keys are made for nodes matching the pool's nodeSelector and required node affinity.
    let w = daemonset_work(serde_json::json!({"spec": {
        "nodeSelector": {"gpu": "yes"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n-special"]}]},
            ]}}},
        "containers": []}}));
    let rendered = render(&w).unwrap();
    let nodes = [
        node("n-a", &[("gpu", "yes"), ("zone", "a")]),
        node("n-c", &[("gpu", "yes"), ("zone", "c")]),
        node("n-special", &[("gpu", "yes")]),
        node("n-nogpu", &[("zone", "a")]),
        node("n-b", &[("gpu", "yes"), ("zone", "b")]),
    ];
    assert_eq!(
        daemonset_key_names(daemonset(&rendered), &nodes),
        names(&["n-a", "n-b", "n-special"])
    );
    let all = daemonset_work(serde_json::json!({"spec": {"containers": []}}));
    assert_eq!(
        daemonset_key_names(daemonset(&render(&all).unwrap()), &nodes).len(),
        5
    );
}

#[test]
fn daemonset_pools_run_only_on_registered_nodes() {
    // The node gate is ANDed with the user's terms (one copy per registered node: a field
    // requirement takes one value), and with none registered the pool runs nowhere.
    let w = daemonset_work(serde_json::json!({"spec": {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
                {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
            ]}}},
        "containers": []}}));
    let plan = plan(&w);
    let keys = |registered: &[&str]| {
        FederationKeys::from([("a".to_owned(), pool_keys(&["n1", "n2", "n3"], registered))])
    };
    let gated = render_federation_with_keys(&plan, &keys(&["n3", "n1"])).unwrap();
    let terms = required_terms(daemonset(&gated));
    let zone = || vec!["zone".to_owned()];
    let gpu = || vec!["gpu".to_owned()];
    assert_eq!(
        terms,
        [
            ("n1".to_owned(), zone()),
            ("n1".to_owned(), gpu()),
            ("n3".to_owned(), zone()),
            ("n3".to_owned(), gpu()),
        ]
    );
    assert_eq!(gated.workloads[0].0.waiting, 1);
    let none = render_federation_with_keys(&plan, &keys(&[])).unwrap();
    let terms = required_terms(daemonset(&none));
    assert!(terms.iter().all(|(n, _)| n == NO_REGISTERED_NODE));
    assert_eq!(none.workloads[0].0.waiting, 3);
    // The pod reads the key named after its node.
    let pod = daemonset(&none).spec.template.spec.as_ref().unwrap();
    assert!(
        pod.containers[0]
            .args
            .as_ref()
            .unwrap()
            .last()
            .unwrap()
            .ends_with("/$(FLWR_NODE_NAME)")
    );
    // No user affinity: one term per registered node.
    let plain = self::plan(&daemonset_work(
        serde_json::json!({"spec": {"containers": []}}),
    ));
    let gated = render_federation_with_keys(&plain, &keys(&["n2"])).unwrap();
    assert_eq!(
        required_terms(daemonset(&gated)),
        [("n2".to_owned(), vec![])]
    );
}

#[test]
fn readiness_says_when_supernodes_wait_for_their_key() {
    // Desired keeps counting SuperNodes that wait for registration, and the message says why.
    let waiting = Counts {
        desired: 2,
        ready: 0,
        stale: false,
        waiting: 2,
        rolling: None,
    };
    let cond = ready_condition("x", waiting);
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("False", "NodeKeysNotRegistered")
    );
    assert!(
        cond.message.contains("0/2") && cond.message.contains("2 waiting"),
        "{}",
        cond.message
    );
}

#[test]
fn without_supernode_authentication_pools_get_no_keys_and_no_gate() {
    // supernodeAuthentication: false (TLS still on) is the switch the SuperLink and the hub
    // follow too: no key mount, every replica starts, nothing waits for a registration.
    let mut w = work(false);
    let mut spec: serde_json::Value =
        serde_json::from_str(&w.federations[0].federation_spec_json).unwrap();
    spec["supernodeAuthentication"] = false.into();
    w.federations[0].federation_spec_json = spec.to_string();
    let rendered = render_federation_with_keys(&plan(&w), &FederationKeys::new()).unwrap();
    let s = statefulset(&rendered);
    assert_eq!(s.spec.replicas, Some(2));
    assert!(
        !supernode_args(s)
            .iter()
            .any(|a| a.contains("auth-supernode"))
    );
    assert!(
        supernode_args(s)
            .iter()
            .any(|a| a.starts_with("--root-certificates="))
    );
    assert_eq!(rendered.workloads[0].0.waiting, 0);
}

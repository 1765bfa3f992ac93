use super::*;
use flower_addon_proto::PoolWork;

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
    };
    assert_eq!(ready_condition("x", c(2, 2, false)).status, "True");
    assert_eq!(ready_condition("x", c(2, 1, false)).status, "False");
    assert!(ready_condition("x", c(2, 1, false)).message.contains("1/2"));
    assert_eq!(ready_condition("x", c(2, 2, true)).status, "False");
}

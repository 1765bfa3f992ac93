//! Unit tests of validate_federation / validate_placement, one per rule.

use flower_addon_crds::rules::*;
use flower_addon_crds::*;

fn fed(yaml_spec: &str) -> Federation {
    let text = format!(
        "apiVersion: flower-addon.io/v1alpha1\nkind: Federation\nmetadata:\n  name: f\nspec:\n{yaml_spec}"
    );
    match parse_documents("t.yaml", &text).unwrap().remove(0) {
        Object::Federation(f) => f,
        other => panic!("{other:?}"),
    }
}

const STS: &str = "  mode: StatefulSet\n  isolationMode: subprocess\n  superlink:\n    image: s\n  supernodes:\n    image: n\n    pools:\n";

fn errors(f: &Federation) -> Vec<(String, String)> {
    validate_federation(f)
        .into_iter()
        .map(|e| (e.path, e.message))
        .collect()
}

// A minimal StatefulSet Federation is valid and gets flower-operator's defaults.
#[test]
fn minimal_is_valid_with_defaults() {
    let f = fed(&format!(
        "{STS}      - name: a\n        replicas: 1\n        images: {{}}\n"
    ));
    assert!(errors(&f).is_empty());
    // Unlike flower-operator (insecure by default), TLS and SuperNode authentication are on.
    assert!(!f.spec.insecure);
    assert!(f.spec.supernode_auth());
    assert_eq!(
        f.spec.superlink.service.ports,
        SuperLinkPorts {
            grpc: 9092,
            server_app_io: 9091,
            extra: 9093
        }
    );
    assert_eq!(f.spec.superlink.service.type_, ServiceType::ClusterIP);
}

// Replicas below 1 are rejected with the schema message and the StatefulSet rule.
#[test]
fn replicas_zero() {
    let f = fed(&format!(
        "{STS}      - name: a\n        replicas: 0\n        images: {{}}\n"
    ));
    let e = errors(&f);
    assert!(e.contains(&(
        "spec.supernodes.pools[0].replicas".into(),
        "must be greater than or equal to 1".into()
    )));
    assert!(e.contains(&(
        "spec.supernodes.pools[0].replicas".into(),
        MSG_STATEFULSET_REPLICAS.into()
    )));
}

// Replicas above MAX_REPLICAS (pool or cluster override) are refused by validate_federation and
// by the CRD schema, with a message naming the limit; MAX_REPLICAS itself passes.
#[test]
fn replicas_above_the_maximum() {
    let over = MAX_REPLICAS + 1;
    let f = fed(&format!(
        "{STS}      - name: a\n        replicas: 2147483647\n        images: {{}}\n  placementRef: {{name: p}}\n  clusterOverrides:\n    - clusterSelector: {{matchLabels: {{gpu: \"yes\"}}}}\n      replicas: {over}\n"
    ));
    let got = errors(&f);
    let paths: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.supernodes.pools[0].replicas",
            "spec.clusterOverrides[0].replicas"
        ],
        "{got:?}"
    );
    for (_, message) in &got {
        assert!(
            message.contains(&format!("less than or equal to {MAX_REPLICAS}")),
            "{message}"
        );
    }
    let at_max = fed(&format!(
        "{STS}      - name: a\n        replicas: {MAX_REPLICAS}\n        images: {{}}\n"
    ));
    assert!(errors(&at_max).is_empty(), "{:?}", errors(&at_max));

    let schema = serde_json::to_value(<Federation as kube::CustomResourceExt>::crd()).expect("crd");
    let spec = &schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let pool = &spec["supernodes"]["properties"]["pools"]["items"]["properties"]["replicas"];
    let override_ = &spec["clusterOverrides"]["items"]["properties"]["replicas"];
    for field in [pool, override_] {
        assert_eq!(
            field["maximum"].as_f64(),
            Some(f64::from(MAX_REPLICAS)),
            "{field}"
        );
    }
}

// Pool names must be DNS labels of at most 63 characters.
#[test]
fn pool_name_dns_label() {
    for bad in ["Upper", "-a", "a-", "a_b", &"a".repeat(64)] {
        let f = fed(&format!(
            "{STS}      - name: \"{bad}\"\n        replicas: 1\n        images: {{}}\n"
        ));
        assert!(
            errors(&f)
                .iter()
                .any(|(p, _)| p == "spec.supernodes.pools[0].name"),
            "{bad}"
        );
    }
}

// More than 16 pools is rejected.
#[test]
fn at_most_16_pools() {
    let pools: String = (0..17)
        .map(|i| format!("      - name: p{i}\n        replicas: 1\n        images: {{}}\n"))
        .collect();
    let f = fed(&format!("{STS}{pools}"));
    assert_eq!(
        errors(&f),
        vec![(
            "spec.supernodes.pools".into(),
            "must have at most 16 items".into()
        )]
    );
}

// gpu.count must be at least 1.
#[test]
fn gpu_count_at_least_one() {
    let f = fed(&format!(
        "{STS}      - name: a\n        replicas: 1\n        images: {{}}\n        gpu:\n          count: 0\n"
    ));
    assert_eq!(
        errors(&f),
        vec![(
            "spec.supernodes.pools[0].gpu.count".into(),
            "must be greater than or equal to 1".into()
        )]
    );
}

// Service ports must be 1..65535.
#[test]
fn service_ports_range() {
    let f = fed(
        "  mode: StatefulSet\n  isolationMode: subprocess\n  superlink:\n    image: s\n    service:\n      ports:\n        grpc: 70000\n  supernodes:\n    image: n\n    pools:\n      - name: a\n        replicas: 1\n        images: {}\n",
    );
    assert_eq!(
        errors(&f),
        vec![(
            "spec.superlink.service.ports.grpc".into(),
            "must be between 1 and 65535".into()
        )]
    );
}

// The Control API's node port only with exposeControl; source ranges are CIDRs of a
// LoadBalancer.
#[test]
fn control_exposure_and_source_ranges() {
    let with_service = |service: &str| {
        fed(&format!(
            "  mode: StatefulSet\n  isolationMode: subprocess\n  superlink:\n    image: s\n    service: {service}\n  supernodes:\n    image: n\n    pools:\n      - name: a\n        replicas: 1\n        images: {{}}\n"
        ))
    };
    let e = errors(&with_service("{type: NodePort, nodePorts: {extra: 30093}}"));
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].0, "spec.superlink.service.nodePorts.extra");
    assert!(e[0].1.contains("exposeControl"), "{e:?}");
    assert!(
        errors(&with_service(
            "{type: NodePort, exposeControl: true, nodePorts: {extra: 30093}}"
        ))
        .is_empty()
    );
    assert!(
        errors(&with_service(
            "{type: LoadBalancer, exposeControl: true, loadBalancerSourceRanges: [203.0.113.0/24, \"2001:db8::/32\"]}"
        ))
        .is_empty()
    );
    let e = errors(&with_service(
        "{type: LoadBalancer, loadBalancerSourceRanges: [203.0.113.0/33, office, 198.51.100.7]}",
    ));
    let paths: Vec<&str> = e.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.superlink.service.loadBalancerSourceRanges[0]",
            "spec.superlink.service.loadBalancerSourceRanges[1]",
            "spec.superlink.service.loadBalancerSourceRanges[2]",
        ],
        "{e:?}"
    );
    let e = errors(&with_service(
        "{type: NodePort, loadBalancerSourceRanges: [203.0.113.0/24]}",
    ));
    assert_eq!(
        e[0].0, "spec.superlink.service.loadBalancerSourceRanges",
        "{e:?}"
    );
}

// The DaemonSet placeholder rule names the exact nodeConfig key; StatefulSet allows {index}.
#[test]
fn daemonset_placeholders_named_by_key() {
    let ds = fed(
        "  mode: DaemonSet\n  isolationMode: subprocess\n  superlink:\n    image: s\n  supernodes:\n    image: n\n    pools:\n      - name: a\n        images: {}\n        nodeConfig:\n          n: \"{replicas}\"\n",
    );
    assert_eq!(
        errors(&ds),
        vec![(
            "spec.supernodes.pools[0].nodeConfig.n".into(),
            MSG_DAEMONSET_PLACEHOLDER.into()
        )]
    );
    let sts = fed(&format!(
        "{STS}      - name: a\n        replicas: 2\n        images: {{}}\n        nodeConfig:\n          n: \"{{index}}\"\n"
    ));
    assert!(errors(&sts).is_empty());
}

// nodeConfig values: integers pass, booleans get a hint, a value with both quotes is named, '$HOME' is fine.
#[test]
fn node_config_values() {
    let f = fed(&format!(
        "{STS}      - name: a\n        replicas: 1\n        images: {{}}\n        nodeConfig:\n          i: 3\n          b: true\n          h: $HOME\n          q: 'a\"b''c'\n"
    ));
    let e = errors(&f);
    assert_eq!(e.len(), 2, "{e:?}");
    assert_eq!(e[0].0, "spec.supernodes.pools[0].nodeConfig.b");
    assert!(e[0].1.contains("\"true\""));
    assert_eq!(
        e[1],
        (
            "spec.supernodes.pools[0].nodeConfig.q".into(),
            MSG_NODE_CONFIG_QUOTES.into()
        )
    );
}

// nodeConfig keys must survive key=value splitting and TOML parsing.
#[test]
fn node_config_keys() {
    let f = fed(&format!(
        "{STS}      - name: a\n        replicas: 1\n        images: {{}}\n        nodeConfig:\n          \"a b\": x\n          ok.nested-key_1: yy\n"
    ));
    let e = errors(&f);
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].0, "spec.supernodes.pools[0].nodeConfig.a b");
}

// externalAddress must be host[:port] with a valid port.
#[test]
fn external_address() {
    for (addr, ok) in [
        ("h.example:30092", true),
        ("[::1]:9092", true),
        ("10.0.0.1", true),
        ("https://h", false),
        ("h:0", false),
        ("h:x", false),
    ] {
        let f = fed(&format!(
            "  mode: StatefulSet\n  isolationMode: subprocess\n  superlink:\n    image: s\n    externalAddress: \"{addr}\"\n  supernodes:\n    image: n\n    pools:\n      - name: a\n        replicas: 1\n        images: {{}}\n"
        ));
        assert_eq!(errors(&f).is_empty(), ok, "{addr}");
    }
}

// Placement: In needs values, Exists forbids them, toleration Exists has no value.
#[test]
fn placement_rules() {
    let text = "apiVersion: flower-addon.io/v1alpha1\nkind: Placement\nmetadata:\n  name: p\nspec:\n  predicates:\n    - requiredClusterSelector:\n        claimSelector:\n          matchExpressions:\n            - key: k\n              operator: In\n  tolerations:\n    - key: t\n      operator: Exists\n      value: v\n";
    let Object::Placement(p) = parse_documents("p.yaml", text).unwrap().remove(0) else {
        panic!()
    };
    let paths: Vec<String> = validate_placement(&p).into_iter().map(|e| e.path).collect();
    assert_eq!(
        paths,
        vec![
            "spec.predicates[0].requiredClusterSelector.claimSelector.matchExpressions[0].values"
                .to_string(),
            "spec.tolerations[0].value".to_string(),
        ]
    );
}

// Placement: a toleration of OCM's taint keys would never match this hub's taints.
#[test]
fn placement_tolerating_ocm_taint_keys_is_refused_with_ours_named() {
    let text = "apiVersion: flower-addon.io/v1alpha1\nkind: Placement\nmetadata:\n  name: p\nspec:\n  tolerations:\n    - key: cluster.flower-addon.io/unreachable\n      operator: Exists\n    - key: cluster.open-cluster-management.io/unreachable\n      operator: Exists\n      tolerationSeconds: 300\n    - key: cluster.open-cluster-management.io/unavailable\n      operator: Exists\n";
    let Object::Placement(p) = parse_documents("p.yaml", text).unwrap().remove(0) else {
        panic!()
    };
    let errors = validate_placement(&p);
    let got: Vec<(String, String)> = errors.into_iter().map(|e| (e.path, e.message)).collect();
    assert_eq!(
        got,
        vec![
            (
                "spec.tolerations[1].key".to_string(),
                "\"cluster.open-cluster-management.io/unreachable\" is OCM's taint, which this hub never sets: tolerate \"cluster.flower-addon.io/unreachable\" instead".to_string()
            ),
            (
                "spec.tolerations[2].key".to_string(),
                "\"cluster.open-cluster-management.io/unavailable\" is OCM's taint, which this hub never sets: tolerate \"cluster.flower-addon.io/unavailable\" instead".to_string()
            ),
        ]
    );
}

// Node ports can be pinned only where Kubernetes allows them, each once, and every field named.
#[test]
fn node_ports_need_an_exposed_service_and_distinct_values() {
    let spec = |service: &str| {
        format!(
            "  mode: StatefulSet\n  isolationMode: subprocess\n  superlink:\n    image: s\n    service: {service}\n  supernodes:\n    image: n\n    pools:\n      - name: a\n        replicas: 1\n"
        )
    };
    let ok = fed(&spec(
        "{type: NodePort, exposeControl: true, nodePorts: {grpc: 30092, extra: 30093}}",
    ));
    assert!(errors(&ok).is_empty(), "{:?}", errors(&ok));
    assert_eq!(ok.spec.superlink.service.node_ports.grpc, Some(30092));

    let cluster_ip = fed(&spec("{nodePorts: {grpc: 30092}}"));
    let errs = errors(&cluster_ip);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].0, "spec.superlink.service.nodePorts.grpc");
    assert!(
        errs[0].1.contains("type NodePort or LoadBalancer"),
        "{errs:?}"
    );

    let twice = fed(&spec(
        "{type: LoadBalancer, exposeControl: true, nodePorts: {grpc: 30092, extra: 30092}}",
    ));
    let errs = errors(&twice);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].0, "spec.superlink.service.nodePorts.extra");
    assert!(errs[0].1.contains("also nodePorts.grpc"), "{errs:?}");
}

// Placement: prioritizers are OCM's built-ins; add-on scores and unknown names are refused with
// the field and the names that work, never ignored.
#[test]
fn placement_prioritizers_are_known_built_ins() {
    let text = "apiVersion: flower-addon.io/v1alpha1\nkind: Placement\nmetadata:\n  name: p\nspec:\n  numberOfClusters: 1\n  prioritizerPolicy:\n    mode: Exact\n    configurations:\n      - scoreCoordinate: {type: BuiltIn, builtIn: ResourceAllocatableCPU}\n        weight: 2\n      - scoreCoordinate: {type: AddOn, addOn: {resourceName: r, scoreName: s}}\n      - scoreCoordinate: {type: BuiltIn, builtIn: Spread}\n      - scoreCoordinate: {type: BuiltIn}\n";
    let Object::Placement(p) = parse_documents("p.yaml", text).unwrap().remove(0) else {
        panic!()
    };
    let got: Vec<(String, String)> = validate_placement(&p)
        .into_iter()
        .map(|e| (e.path, e.message))
        .collect();
    let paths: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.prioritizerPolicy.configurations[1].scoreCoordinate.type",
            "spec.prioritizerPolicy.configurations[2].scoreCoordinate.builtIn",
            "spec.prioritizerPolicy.configurations[3].scoreCoordinate.builtIn",
        ]
    );
    assert!(
        got[1].1.contains("unknown prioritizer \"Spread\""),
        "{got:?}"
    );
    assert!(got[1].1.contains("ResourceAllocatableMemory"), "{got:?}");
}

// clusterOverrides select Placement clusters, name real pools and follow the pool rules of the
// mode; each problem names its field.
#[test]
fn cluster_overrides_are_checked_field_by_field() {
    let base = "  mode: DaemonSet\n  isolationMode: subprocess\n  superlink:\n    image: s\n  supernodes:\n    image: n\n    pools:\n      - name: a\n";
    let f = fed(&format!(
        "{base}  clusterOverrides:\n    - clusterSelector: {{matchLabels: {{gpu: \"yes\"}}}}\n      pools: [a, ghost]\n      replicas: 2\n      nodeConfig: {{shard: \"{{index}}\"}}\n"
    ));
    let got = errors(&f);
    let paths: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.clusterOverrides",
            "spec.clusterOverrides[0].pools[1]",
            "spec.clusterOverrides[0].replicas",
            "spec.clusterOverrides[0].nodeConfig.shard",
        ],
        "{got:?}"
    );
    assert!(got[0].1.contains("needs spec.placementRef"), "{got:?}");
    assert!(got[1].1.contains("no pool named \"ghost\""), "{got:?}");

    let ok = fed(&format!(
        "{base}  placementRef: {{name: p}}\n  clusterOverrides:\n    - clusterSelector: {{matchLabels: {{gpu: \"yes\"}}}}\n      image: example/supernode-gpu:1\n      env: [{{name: MODE, value: gpu}}]\n"
    ));
    assert!(errors(&ok).is_empty(), "{:?}", errors(&ok));
}

// A pool's clusterSelector picks among Placement clusters: without placementRef the pools run in
// the hub cluster only, so a selector there would mean something different in each hub mode.
#[test]
fn pool_cluster_selector_needs_a_placement() {
    let pools = "  mode: StatefulSet\n  isolationMode: subprocess\n  superlink:\n    image: s\n  supernodes:\n    image: n\n    pools:\n      - name: a\n        replicas: 1\n        clusterSelector: {matchLabels: {gpu: \"yes\"}}\n";
    let got = errors(&fed(pools));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "spec.supernodes.pools[0].clusterSelector");
    assert!(
        got[0]
            .1
            .contains("set placementRef or remove clusterSelector"),
        "{got:?}"
    );
    let placed = fed(&format!("{pools}  placementRef: {{name: p}}\n"));
    assert!(errors(&placed).is_empty(), "{:?}", errors(&placed));
}

// Names become object names and (standalone, agents) directories: only DNS labels pass.
#[test]
fn metadata_names_must_be_dns_labels() {
    for (name, namespace, field) in [
        ("ok", "../../..", "metadata.namespace"),
        ("a/b", "default", "metadata.name"),
        ("..", "default", "metadata.name"),
        ("UPPER", "default", "metadata.name"),
    ] {
        let text = format!(
            "apiVersion: flower-addon.io/v1alpha1\nkind: Federation\nmetadata:\n  name: \"{name}\"\n  namespace: \"{namespace}\"\nspec:\n{STS}      - name: a\n        replicas: 1\n"
        );
        let f = match parse_documents("t.yaml", &text).unwrap().remove(0) {
            Object::Federation(f) => f,
            other => panic!("{other:?}"),
        };
        let paths: Vec<String> = errors(&f).into_iter().map(|(p, _)| p).collect();
        assert_eq!(paths, [field], "{name} in {namespace}");
        let text = format!(
            "apiVersion: flower-addon.io/v1alpha1\nkind: Placement\nmetadata:\n  name: \"{name}\"\n  namespace: \"{namespace}\"\nspec: {{}}\n"
        );
        let Object::Placement(p) = parse_documents("p.yaml", &text).unwrap().remove(0) else {
            panic!()
        };
        let paths: Vec<String> = validate_placement(&p).into_iter().map(|e| e.path).collect();
        assert_eq!(paths, [field], "placement {name} in {namespace}");
    }
}

//! SuperNode pool rendering: arguments per dialect, placeholders, nodeConfig encoding, GPU,
//! TLS, merges and determinism.

use std::collections::BTreeMap;

use flower_addon_crds::FederationSpec;
use flower_addon_crds::render::{
    ClusterContext, FlowerDialect, ProcessReplica, RenderError, SuperNodePoolInput, Workload,
    mount_node_keys, node_key_secret_name, render_supernode_pool, supernode_argv,
};
use k8s_openapi::api::core::v1::{Container, PodSpec};

fn spec(yaml: &str) -> FederationSpec {
    serde_saphyr::from_str(yaml).expect("test spec parses")
}

/// The context of pool `pool` on cluster `c<index>` of `clusters` that all run every pool: what
/// the hub's work split gives in that case (cluster-major, then pool order).
fn cluster(spec: &FederationSpec, pool: usize, index: u32, clusters: u32) -> ClusterContext {
    let replicas = |p: &flower_addon_crds::SuperNodePoolSpec| p.replicas.unwrap_or(0).max(0) as u64;
    let per_cluster: u64 = spec.supernodes.pools.iter().map(replicas).sum();
    let before: u64 = spec.supernodes.pools[..pool].iter().map(replicas).sum();
    ClusterContext {
        name: format!("c{index}"),
        index,
        clusters,
        partition_offset: u64::from(index) * per_cluster + before,
        partitions: per_cluster * u64::from(clusters),
    }
}

/// A release of each dialect (the ones `test.sh` runs the quickstart with).
fn version_of(dialect: FlowerDialect) -> flower_addon_crds::render::FlowerVersion {
    let text = match dialect {
        FlowerDialect::Classic => "1.25.0",
        FlowerDialect::Transitional => "1.35.0",
        FlowerDialect::TransitionalHttp => "1.39.0",
        FlowerDialect::Unified => "1.42.0",
    };
    flower_addon_crds::render::FlowerVersion::parse(text).expect("a release")
}

fn render_with(
    spec: &FederationSpec,
    pool: usize,
    dialect: FlowerDialect,
    cluster: &ClusterContext,
) -> Result<Workload, RenderError> {
    render_supernode_pool(&SuperNodePoolInput {
        federation: "fed",
        namespace: "ns",
        spec,
        pool: &spec.supernodes.pools[pool],
        dialect,
        version: version_of(dialect),
        fleet_address: "fed-superlink.ns.svc:9092",
        ca_secret_name: "fed-superlink-ca",
        cluster,
    })
}

fn render(spec: &FederationSpec) -> Workload {
    let cluster = cluster(spec, 0, 0, 1);
    render_with(spec, 0, FlowerDialect::Classic, &cluster).expect("renders")
}

fn pod(workload: &Workload) -> &PodSpec {
    match workload {
        Workload::StatefulSet(s) => s.spec.template.spec.as_ref().expect("pod spec"),
        Workload::DaemonSet(d) => d.spec.template.spec.as_ref().expect("pod spec"),
    }
}

fn container<'a>(workload: &'a Workload, name: &str) -> &'a Container {
    pod(workload)
        .containers
        .iter()
        .find(|c| c.name == name)
        .expect("container exists")
}

fn args(workload: &Workload, name: &str) -> Vec<String> {
    container(workload, name).args.clone().unwrap_or_default()
}

const BASIC: &str = r#"
mode: StatefulSet
isolationMode: subprocess
insecure: true
superlink: { image: "flwr/superlink:1.25.0" }
supernodes:
  image: "flwr/supernode:1.25.0"
  pools:
    - name: default
      replicas: 2
      images: {}
"#;

// === Flower's node-config parser, reimplemented ===

/// Kubernetes' `$(VAR)` / `$$` expansion of container arguments (k8s.io/kubernetes
/// third_party/forked/golang/expansion), for checking what a container really receives.
fn kubernetes_expand(input: &str, env: &BTreeMap<&str, &str>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::new();
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            let advance = match rest.as_bytes()[0] {
                b'$' => {
                    out.push('$');
                    1
                }
                b'(' => match rest.find(')') {
                    Some(close) => {
                        let name = &rest[1..close];
                        match env.get(name) {
                            Some(v) => out.push_str(v),
                            None => out.push_str(&format!("$({name})")),
                        }
                        close + 1
                    }
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                _ => {
                    let c = rest.chars().next().expect("non-empty");
                    out.push('$');
                    out.push(c);
                    c.len_utf8()
                }
            };
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    if checkpoint < bytes.len() {
        out.push_str(&input[checkpoint..]);
    }
    out
}

/// `flwr.common.config.parse_config_args` for one argument: regex pairs, one TOML line each.
fn flower_parse(config: &str) -> toml::Table {
    let pattern = regex::Regex::new(r#"(\S+?)=('[^']*'|"[^"]*"|\S+)"#).expect("regex");
    let doc: Vec<String> = pattern
        .captures_iter(config)
        .map(|c| format!("{} = {}", &c[1], &c[2]))
        .collect();
    toml::from_str(&doc.join("\n"))
        .unwrap_or_else(|e| panic!("Flower cannot parse {config:?}: {e}"))
}

fn node_config_arg(args: &[String]) -> &str {
    args.iter()
        .find_map(|a| a.strip_prefix("--node-config="))
        .expect("--node-config present")
}

const NASTY: &[&str] = &[
    "has spaces  and  more",
    r#"say "hi""#,
    "it's",
    r"C:\new\table",
    r#"back\slash "and" quote"#,
    "$HOME",
    "$(X)",
    "$$(Y) $ $$ $",
    "a=b=c",
    "ünïcødé ✓ 漢字",
    "",
    "  leading and trailing  ",
    "tab\there",
    "x.toml",
    "-1.5",
    "007",
    "--flag",
    "{unknown}",
];

fn nasty_spec() -> FederationSpec {
    let mut spec = spec(BASIC);
    let config = &mut spec.supernodes.pools[0].node_config;
    for (i, value) in NASTY.iter().enumerate() {
        config.insert(
            format!("k{i:02}"),
            flower_addon_crds::NodeConfigValue::String((*value).to_owned()),
        );
    }
    config.insert("int".into(), flower_addon_crds::NodeConfigValue::Int(-42));
    config.insert(
        "flag".into(),
        flower_addon_crds::NodeConfigValue::Bool(true),
    );
    config.insert(
        "dotted.key".into(),
        flower_addon_crds::NodeConfigValue::String("v".into()),
    );
    spec
}

fn assert_round_trip(parsed: &toml::Table) {
    for (i, value) in NASTY.iter().enumerate() {
        assert_eq!(
            parsed.get(&format!("k{i:02}")).and_then(|v| v.as_str()),
            Some(*value),
            "value {value:?} did not survive"
        );
    }
    assert_eq!(parsed.get("int").and_then(|v| v.as_integer()), Some(-42));
    assert_eq!(parsed.get("flag").and_then(|v| v.as_bool()), Some(true));
    assert_eq!(
        parsed
            .get("dotted")
            .and_then(|v| v.get("key"))
            .and_then(|v| v.as_str()),
        Some("v")
    );
}

#[test]
fn nasty_values_reach_flower_unchanged_through_kubernetes() {
    // Values with spaces, quotes, `$`, backslashes and unicode survive Kubernetes expansion and Flower's parser.
    let workload = render(&nasty_spec());
    let args = args(&workload, "supernode");
    let received = kubernetes_expand(node_config_arg(&args), &BTreeMap::new());
    assert_round_trip(&flower_parse(&received));
}

#[test]
fn nasty_values_reach_flower_unchanged_in_process_mode() {
    // The process runtime passes argv directly: same values, no Kubernetes escaping.
    let spec = nasty_spec();
    let cluster = cluster(&spec, 0, 0, 1);
    let argv =
        supernode_argv(&input(&spec, &cluster, FlowerDialect::Classic), &replica(0)).expect("argv");
    assert_round_trip(&flower_parse(node_config_arg(&argv)));
}

#[test]
fn node_config_is_one_argv_element() {
    // A nodeConfig with spaces must stay one argument; splitting it breaks Flower's parsing.
    let workload = render(&nasty_spec());
    let args = args(&workload, "supernode");
    assert_eq!(
        args.iter()
            .filter(|a| a.starts_with("--node-config"))
            .count(),
        1
    );
    assert!(args.last().expect("args").starts_with("--node-config="));
}

fn input<'a>(
    spec: &'a FederationSpec,
    cluster: &'a ClusterContext,
    dialect: FlowerDialect,
) -> SuperNodePoolInput<'a> {
    SuperNodePoolInput {
        federation: "fed",
        namespace: "ns",
        spec,
        pool: &spec.supernodes.pools[0],
        dialect,
        version: version_of(dialect),
        fleet_address: "hub.example:30092",
        ca_secret_name: "fed-superlink-ca",
        cluster,
    }
}

fn replica(index: u32) -> ProcessReplica<'static> {
    ProcessReplica {
        index,
        runtime_port: 9200 + u16::try_from(index).expect("small"),
        node_name: "edge-1",
        root_certificates: None,
    }
}

// === placeholders ===

const PLACEHOLDERS: &str = r#"
mode: StatefulSet
isolationMode: subprocess
insecure: true
superlink: { image: "flwr/superlink:1.25.0" }
supernodes:
  image: "flwr/supernode:1.25.0"
  pools:
    - name: cpu
      replicas: 3
      images: {}
    - name: gpu
      replicas: 2
      images: {}
      nodeConfig:
        partition-id: "{partition}"
        num-partitions: "{partitions}"
        name: "{cluster}/{clusterIndex}/{clusters}/{pool}/{replicas}/{node}"
"#;

#[test]
fn partition_ids_are_global_and_kubernetes_numbers_pods_by_partition() {
    // {partition} is stable and unique over clusters: ordinals start at the pool's global offset.
    let spec = spec(PLACEHOLDERS);
    let cluster = cluster(&spec, 1, 2, 4);
    assert_eq!(
        (cluster.partition_offset, cluster.partitions),
        (2 * 5 + 3, 20)
    );
    let workload = render_with(&spec, 1, FlowerDialect::Classic, &cluster).expect("renders");
    let Workload::StatefulSet(sts) = &workload else {
        panic!("StatefulSet expected")
    };
    assert_eq!(sts.spec.ordinals.as_ref().and_then(|o| o.start), Some(13));
    let env: BTreeMap<&str, &str> = [("FLWR_POD_INDEX", "14"), ("FLWR_NODE_NAME", "node-a")].into();
    let received = kubernetes_expand(node_config_arg(&args(&workload, "supernode")), &env);
    let parsed = flower_parse(&received);
    assert_eq!(parsed["partition-id"].as_integer(), Some(14));
    assert_eq!(parsed["num-partitions"].as_integer(), Some(20));
    assert_eq!(parsed["name"].as_str(), Some("c2/2/4/gpu/2/node-a"));
    let names: Vec<_> = container(&workload, "supernode")
        .env
        .iter()
        .flatten()
        .map(|e| {
            let path = e
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str());
            (e.name.as_str(), path)
        })
        .collect();
    assert_eq!(
        names,
        [
            (
                "FLWR_POD_INDEX",
                Some("metadata.labels['apps.kubernetes.io/pod-index']")
            ),
            ("FLWR_NODE_NAME", Some("spec.nodeName"))
        ]
    );
}

#[test]
fn process_mode_expands_every_placeholder_natively() {
    // The edge runtime gets the same partition ids as Kubernetes, computed without Kubernetes.
    let spec = spec(PLACEHOLDERS);
    let cluster = cluster(&spec, 1, 2, 4);
    let mut input = input(&spec, &cluster, FlowerDialect::Unified);
    input.pool = &spec.supernodes.pools[1];
    let argv = supernode_argv(&input, &replica(1)).expect("argv");
    assert_eq!(
        argv,
        [
            "--superlink=hub.example:30092",
            "--isolation=subprocess",
            "--insecure",
            "--host=127.0.0.1",
            "--port=9201",
            r#"--node-config=name="c2/2/4/gpu/2/edge-1" num-partitions=20 partition-id=14"#,
        ]
    );
}

#[test]
fn index_and_partition_together_are_rejected() {
    // With ordinals shifted to the partition, {index} would be wrong; refuse instead of lying.
    let mut spec = spec(PLACEHOLDERS);
    spec.supernodes.pools[1].node_config.insert(
        "i".into(),
        flower_addon_crds::NodeConfigValue::String("{index}".into()),
    );
    let cluster = cluster(&spec, 1, 0, 1);
    let err = render_with(&spec, 1, FlowerDialect::Classic, &cluster).unwrap_err();
    assert!(
        matches!(err, RenderError::IndexWithPartition { .. }),
        "{err}"
    );
}

#[test]
fn index_renders_from_the_pod_index_label() {
    // flower-operator's nodeConfig example: {index} via downward API, no shell, image entrypoint kept.
    let mut spec = spec(BASIC);
    spec.supernodes.pools[0].node_config.insert(
        "partition-id".into(),
        flower_addon_crds::NodeConfigValue::String("{index}".into()),
    );
    let workload = render(&spec);
    let Workload::StatefulSet(sts) = &workload else {
        panic!("StatefulSet expected")
    };
    assert_eq!(sts.spec.ordinals, None);
    let supernode = container(&workload, "supernode");
    assert_eq!(supernode.command, None);
    assert_eq!(
        node_config_arg(supernode.args.as_deref().unwrap_or_default()),
        "partition-id=$(FLWR_POD_INDEX)"
    );
}

#[test]
fn daemonset_pools_refuse_replica_placeholders() {
    // A DaemonSet has no index or replica count; rendering one must fail, not emit garbage.
    for placeholder in ["{index}", "{replicas}", "{partition}", "{partitions}"] {
        let mut spec = spec(BASIC);
        spec.mode = flower_addon_crds::DeploymentMode::DaemonSet;
        spec.supernodes.pools[0].replicas = None;
        spec.supernodes.pools[0].node_config.insert(
            "x".into(),
            flower_addon_crds::NodeConfigValue::String(placeholder.into()),
        );
        let cluster = cluster(&spec, 0, 0, 1);
        let err = render_with(&spec, 0, FlowerDialect::Classic, &cluster).unwrap_err();
        assert!(
            err.to_string().contains("DaemonSet"),
            "{placeholder}: {err}"
        );
    }
}

// === arguments per dialect ===

#[test]
fn classic_subprocess_arguments_match_flower_operator() {
    // Parity: --superlink, --isolation, --insecure; the fleet address is the one given (real port).
    let workload = render(&spec(BASIC));
    assert_eq!(
        args(&workload, "supernode"),
        [
            "--superlink=fed-superlink.ns.svc:9092",
            "--isolation=subprocess",
            "--insecure"
        ]
    );
    assert_eq!(pod(&workload).containers.len(), 1);
}

const PROCESS: &str = r#"
mode: StatefulSet
isolationMode: process
insecure: true
superlink: { image: "flwr/superlink:1.42.0", superexecImage: "flwr/superexec:1.42.0" }
supernodes:
  image: "flwr/supernode:1.42.0"
  pools:
    - name: gpu
      replicas: 1
      images: { superexecClientApp: "flwr/superexec:1.42.0" }
      gpu: { enabled: true, vendor: amd, count: 2 }
      extraArgs: ["--max-retries=0"]
"#;

#[test]
fn process_isolation_adds_the_clientapp_sidecar_per_dialect() {
    // Process mode: runtime address on the SuperNode, SuperExec sidecar dialing it, GPU on the sidecar.
    let spec = spec(PROCESS);
    let cluster = cluster(&spec, 0, 0, 1);
    let unified = render_with(&spec, 0, FlowerDialect::Unified, &cluster).expect("renders");
    assert_eq!(
        args(&unified, "supernode"),
        [
            "--superlink=fed-superlink.ns.svc:9092",
            "--isolation=process",
            "--insecure",
            "--host=127.0.0.1",
            "--port=9094",
            "--max-retries=0"
        ]
    );
    assert_eq!(
        args(&unified, "superexec-clientapp"),
        ["--runtime-api-address=127.0.0.1:9094", "--insecure"]
    );
    let classic = render_with(&spec, 0, FlowerDialect::Classic, &cluster).expect("renders");
    assert_eq!(
        args(&classic, "supernode")[3],
        "--clientappio-api-address=127.0.0.1:9094"
    );
    assert_eq!(
        args(&classic, "superexec-clientapp"),
        [
            "--plugin-type=clientapp",
            "--appio-api-address=127.0.0.1:9094",
            "--insecure"
        ]
    );
    // 1.35-1.39: the SuperNode binds like the unified dialect; the SuperExec's flags follow
    // the release (1.35 still --appio-api-address and --plugin-type; 1.39 neither).
    for (dialect, superexec) in [
        (
            FlowerDialect::Transitional,
            &[
                "--plugin-type=clientapp",
                "--appio-api-address=127.0.0.1:9094",
                "--insecure",
            ][..],
        ),
        (
            FlowerDialect::TransitionalHttp,
            &["--runtime-api-address=127.0.0.1:9094", "--insecure"][..],
        ),
    ] {
        let w = render_with(&spec, 0, dialect, &cluster).expect("renders");
        assert_eq!(
            args(&w, "supernode")[3..5],
            ["--host=127.0.0.1", "--port=9094"]
        );
        assert_eq!(args(&w, "superexec-clientapp"), superexec, "{dialect:?}");
    }
    let sidecar = container(&classic, "superexec-clientapp");
    let limits = sidecar
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .expect("limits");
    assert_eq!(limits["amd.com/gpu"].0, "2");
    assert_eq!(container(&classic, "supernode").resources, None);
}

#[test]
fn gpu_count_goes_on_the_supernode_in_subprocess_mode() {
    // Subprocess: the SuperNode runs the ClientApp, so it holds the GPU request (limits and requests).
    let mut spec = spec(BASIC);
    spec.supernodes.pools[0].gpu = Some(flower_addon_crds::GpuConfig {
        enabled: true,
        resource_name: Some("example.com/gpu".into()),
        ..Default::default()
    });
    let workload = render(&spec);
    let resources = container(&workload, "supernode")
        .resources
        .clone()
        .expect("resources");
    assert_eq!(resources.limits.expect("limits")["example.com/gpu"].0, "1");
    assert_eq!(
        resources.requests.expect("requests")["example.com/gpu"].0,
        "1"
    );
}

#[test]
fn mount_all_gpus_per_vendor() {
    // mountAll nvidia: runtime class + env; amd: device host paths, env and privileged.
    let mut spec = spec(BASIC);
    spec.supernodes.pools[0].gpu = Some(flower_addon_crds::GpuConfig {
        mount_all: true,
        vendor: Some(flower_addon_crds::GpuVendor::Nvidia),
        ..Default::default()
    });
    let nvidia = render(&spec);
    assert_eq!(pod(&nvidia).runtime_class_name.as_deref(), Some("nvidia"));
    let env = container(&nvidia, "supernode").env.clone().expect("env");
    assert_eq!(
        (env[0].name.as_str(), env[0].value.as_deref()),
        ("NVIDIA_VISIBLE_DEVICES", Some("all"))
    );
    assert_eq!(container(&nvidia, "supernode").resources, None);

    spec.supernodes.pools[0].gpu.as_mut().expect("gpu").vendor =
        Some(flower_addon_crds::GpuVendor::Amd);
    let amd = render(&spec);
    let volumes: Vec<_> = pod(&amd)
        .volumes
        .iter()
        .flatten()
        .map(|v| {
            v.host_path
                .as_ref()
                .map(|h| (h.path.as_str(), h.type_.as_deref()))
        })
        .collect();
    assert_eq!(
        volumes,
        [
            Some(("/dev/kfd", Some("CharDevice"))),
            Some(("/dev/dri", Some("Directory")))
        ]
    );
    let supernode = container(&amd, "supernode");
    assert_eq!(
        supernode
            .security_context
            .as_ref()
            .and_then(|s| s.privileged),
        Some(true)
    );
    assert_eq!(
        supernode.env.as_ref().expect("env")[0].name,
        "ROCR_VISIBLE_DEVICES"
    );
    assert_eq!(supernode.volume_mounts.as_ref().expect("mounts").len(), 2);
}

#[test]
fn tls_mounts_only_the_ca_bundle() {
    // insecure: false → --root-certificates from the CA Secret, mounting only ca.crt.
    let mut spec = spec(BASIC);
    spec.insecure = false;
    let workload = render(&spec);
    let args = args(&workload, "supernode");
    assert_eq!(args[2], "--root-certificates=/etc/flwr/superlink-ca/ca.crt");
    assert!(!args.contains(&"--insecure".to_owned()));
    let volume = &pod(&workload).volumes.as_ref().expect("volumes")[0];
    let secret = volume.secret.as_ref().expect("secret volume");
    assert_eq!(secret.secret_name.as_deref(), Some("fed-superlink-ca"));
    assert_eq!(secret.items.as_ref().expect("items")[0].key, "ca.crt");
    let mount = &container(&workload, "supernode")
        .volume_mounts
        .as_ref()
        .expect("mounts")[0];
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        ("/etc/flwr/superlink-ca", Some(true))
    );
}

// === merges and determinism ===

const MERGES: &str = r#"
mode: StatefulSet
isolationMode: subprocess
insecure: true
superlink: { image: "flwr/superlink:1.25.0" }
supernodes:
  image: "flwr/supernode:1.25.0"
  env: [{ name: A, value: "1" }, { name: B, value: "2" }, { name: C, value: "3" }]
  pools:
    - name: default
      replicas: 2
      images: { supernode: "custom/supernode:1.25.0" }
      env: [{ name: Z, value: "26" }, { name: B, value: "pool" }]
      volumes: [{ name: data, emptyDir: {} }, { name: cache, emptyDir: {} }]
      volumeMounts: [{ name: data, mountPath: /data }, { name: cache, mountPath: /cache }]
      volumeClaimTemplates:
        - metadata: { name: models }
          spec: { accessModes: [ReadWriteOnce], resources: { requests: { storage: 1Gi } } }
      podTemplate:
        metadata: { labels: { team: ml, app.kubernetes.io/name: hijack } }
        spec:
          nodeSelector: { gpu: "yes" }
          tolerations: [{ key: gpu, operator: Exists }]
          imagePullSecrets: [{ name: regcred }, { name: regcred }]
          volumes: [{ name: data, hostPath: { path: /ignored } }, { name: extra, emptyDir: {} }]
          containers: []
"#;

#[test]
fn merges_are_stable_and_user_overrides_apply() {
    // Pool env overrides by name in place; volumes append without duplicates; scheduling overrides.
    let workload = render(&spec(MERGES));
    let supernode = container(&workload, "supernode");
    assert_eq!(supernode.image.as_deref(), Some("custom/supernode:1.25.0"));
    let env: Vec<_> = supernode
        .env
        .iter()
        .flatten()
        .map(|e| format!("{}={}", e.name, e.value.as_deref().unwrap_or_default()))
        .collect();
    assert_eq!(env, ["A=1", "B=pool", "C=3", "Z=26"]);
    let pod = pod(&workload);
    let volumes: Vec<_> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(volumes, ["data", "cache", "extra"]);
    assert!(
        pod.volumes.as_ref().expect("volumes")[0]
            .empty_dir
            .is_some()
    );
    let mounts: Vec<_> = supernode
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(mounts, ["/data", "/cache"]);
    assert_eq!(
        pod.node_selector.as_ref().expect("nodeSelector")["gpu"],
        "yes"
    );
    assert_eq!(pod.image_pull_secrets.as_ref().expect("secrets").len(), 1);
    let Workload::StatefulSet(sts) = &workload else {
        panic!("StatefulSet expected")
    };
    let labels = sts
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref())
        .expect("labels");
    assert_eq!(labels["team"], "ml");
    assert_eq!(labels["app.kubernetes.io/name"], "supernode");
    let claims = sts.spec.volume_claim_templates.as_ref().expect("claims");
    assert_eq!(claims[0].metadata.name.as_deref(), Some("models"));
}

#[test]
fn unchanged_input_renders_byte_identical_objects() {
    // An unchanged Federation must never change the pod template (no restarts on reconcile).
    let spec = spec(MERGES);
    let first = serde_json::to_string(&render(&spec).to_value().expect("json")).expect("string");
    for _ in 0..20 {
        let again =
            serde_json::to_string(&render(&spec).to_value().expect("json")).expect("string");
        assert_eq!(first, again);
    }
}

#[test]
fn workload_names_and_labels_follow_flower_operator() {
    // `<fed>-supernode-<pool>`, app.kubernetes.io labels with our manager, and the pool label.
    let workload = render(&spec(BASIC));
    let meta = workload.metadata();
    assert_eq!(meta.name.as_deref(), Some("fed-supernode-default"));
    let labels = meta.labels.clone().expect("labels");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "flower-addon");
    assert_eq!(labels["app.kubernetes.io/component"], "pool-default");
    assert_eq!(labels["flower-addon.io/pool"], "default");
}

#[test]
fn pods_carry_flower_operator_labels_but_selectors_stay_ours() {
    // flower-operator users select SuperNode pods with flower.flwr.ai/* labels; the selector
    // (immutable on StatefulSets and DaemonSets) must not change, so upgrades keep applying.
    let workload = render(&spec(BASIC));
    let Workload::StatefulSet(sts) = &workload else {
        panic!("BASIC renders a StatefulSet")
    };
    for labels in [
        sts.metadata.labels.as_ref().expect("object labels"),
        sts.spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref())
            .expect("pod labels"),
    ] {
        assert_eq!(labels["flower.flwr.ai/component"], "supernode");
        assert_eq!(labels["flower.flwr.ai/federation"], "fed");
        assert_eq!(labels["flower.flwr.ai/pool"], "default");
        assert_eq!(labels["app.kubernetes.io/instance"], "fed");
    }
    let selector = sts.spec.selector.match_labels.as_ref().expect("selector");
    assert!(
        selector.keys().all(|k| !k.starts_with("flower.flwr.ai/")),
        "selector changed: {selector:?}"
    );
}

// === SuperNode authentication keys ===

/// `--auth-supernode-private-key` as the container receives it, for `env` (downward API values).
fn key_arg(workload: &Workload, env: &BTreeMap<&str, &str>) -> String {
    let last = args(workload, "supernode").pop().expect("arguments");
    kubernetes_expand(&last, env)
}

#[test]
fn each_statefulset_pod_reads_its_own_key_from_the_pool_secret() {
    // Pod fed-supernode-default-3 gets exactly the file named after it, from a read-only mount
    // of the pool's key Secret, readable by Flower's uid through the pod's fsGroup only.
    let mut spec = spec(BASIC);
    spec.insecure = false;
    let mut workload = render(&spec);
    mount_node_keys(&mut workload, &node_key_secret_name("fed", "default"));
    let env = BTreeMap::from([("FLWR_POD_NAME", "fed-supernode-default-3")]);
    assert_eq!(
        key_arg(&workload, &env),
        "--auth-supernode-private-key=/var/run/flower-addon/node-key/fed-supernode-default-3"
    );
    let supernode = container(&workload, "supernode");
    let pod_name = supernode
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "FLWR_POD_NAME")
        .expect("pod name variable");
    let field = pod_name
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref());
    assert_eq!(field.map(|f| f.field_path.as_str()), Some("metadata.name"));
    let mount = supernode
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/var/run/flower-addon/node-key")
        .expect("key mount");
    assert_eq!(mount.read_only, Some(true));
    let volume = pod(&workload)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .and_then(|v| v.secret.as_ref())
        .expect("secret volume");
    assert_eq!(
        volume.secret_name.as_deref(),
        Some("fed-supernode-default-node-keys")
    );
    assert_eq!(volume.default_mode, Some(0o440));
    let security = pod(&workload)
        .security_context
        .as_ref()
        .expect("pod security");
    assert_eq!(security.fs_group, Some(49999));
}

#[test]
fn daemonset_pods_read_the_key_of_their_node() {
    // DaemonSet pools keep one key per node: the file is named by spec.nodeName.
    let mut spec = spec(BASIC);
    spec.insecure = false;
    spec.mode = flower_addon_crds::DeploymentMode::DaemonSet;
    spec.supernodes.pools[0].replicas = None;
    let mut workload = render(&spec);
    mount_node_keys(&mut workload, "keys");
    let env = BTreeMap::from([("FLWR_NODE_NAME", "worker-7")]);
    assert_eq!(
        key_arg(&workload, &env),
        "--auth-supernode-private-key=/var/run/flower-addon/node-key/worker-7"
    );
    let node_name = container(&workload, "supernode")
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "FLWR_NODE_NAME")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(node_name.as_deref(), Some("spec.nodeName"));
}

#[test]
fn a_user_fs_group_is_kept_and_other_pod_security_settings_too() {
    // The user's podTemplate fsGroup wins (every container still gets it as a supplementary
    // group, so the key stays readable); without one, ours joins the user's other settings.
    let with_group = BASIC.replace(
        "      images: {}",
        "      images: {}\n      podTemplate: { spec: { securityContext: { fsGroup: 1000, runAsNonRoot: true }, containers: [] } }",
    );
    let mut workload = render(&spec(&with_group));
    mount_node_keys(&mut workload, "keys");
    let security = pod(&workload).security_context.clone().expect("security");
    assert_eq!(
        (security.fs_group, security.run_as_non_root),
        (Some(1000), Some(true))
    );
    let without_group = BASIC.replace(
        "      images: {}",
        "      images: {}\n      podTemplate: { spec: { securityContext: { runAsNonRoot: true }, containers: [] } }",
    );
    let mut workload = render(&spec(&without_group));
    mount_node_keys(&mut workload, "keys");
    let security = pod(&workload).security_context.clone().expect("security");
    assert_eq!(
        (security.fs_group, security.run_as_non_root),
        (Some(49999), Some(true))
    );
}

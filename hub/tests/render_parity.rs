//! One test per flower-operator defect we must not copy (each would fail if we had it): SuperNodes
//! dialing a port the SuperLink does not serve, spokes given a cluster-internal address, the
//! dialect not following the version, labels left behind on the Service, unstable env and volume
//! order, node-config values expanded by a shell, plaintext by default; and the hub side's
//! rendering facts (SuperLink StatefulSet and Service).

use flower_addon_agent::kube_runtime::Rendered;
use flower_addon_crds::Federation;
use flower_addon_crds::render::{FlowerDialect, FlowerVersion, Workload};
use flower_addon_hub::cli::spoke::{SpokeSelection, hub_local_objects, spoke_objects};
use flower_addon_hub::core::render::{
    HubObjects, render_hub, render_problems, render_superlink, render_superlink_service,
};
use k8s_openapi::api::core::v1::{Container, PodSpec};

fn fed(yaml: &str) -> Federation {
    serde_saphyr::from_str(yaml).expect("test Federation parses")
}

/// flower-operator's rendering is plaintext by default; ours is TLS with SuperNode authentication
/// (see [`without_insecure_the_default_is_tls_with_supernode_authentication`]), so the parity
/// base says `insecure: true`, as a flower-operator user's manifest would to keep its behaviour.
const BASE: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: { name: fed, namespace: ns }
spec:
  mode: StatefulSet
  isolationMode: subprocess
  insecure: true
  superlink: { image: "flwr/superlink:1.25.0" }
  supernodes:
    image: "flwr/supernode:1.25.0"
    pools: [{ name: default, replicas: 2, images: {} }]
"#;

fn hub(fed: &Federation) -> HubObjects {
    render_hub(fed).expect("renders")
}

/// The pools the hub cluster runs for a Federation without placementRef.
fn local(fed: &Federation) -> Rendered {
    hub_local_objects(fed)
        .expect("renders")
        .expect("the hub cluster runs the pools")
}

fn superlink_pod(objects: &HubObjects) -> &PodSpec {
    objects.superlink.spec.template.spec.as_ref().expect("pod")
}

fn container<'a>(pod: &'a PodSpec, name: &str) -> &'a Container {
    pod.containers
        .iter()
        .find(|c| c.name == name)
        .expect("container")
}

fn pool_args(objects: &Rendered) -> Vec<String> {
    let Workload::StatefulSet(sts) = &objects.workloads[0].1 else {
        panic!("StatefulSet expected")
    };
    let pod = sts.spec.template.spec.as_ref().expect("pod");
    container(pod, "supernode").args.clone().expect("args")
}

fn v(text: &str) -> FlowerVersion {
    FlowerVersion::parse(text).expect("version")
}

#[test]
fn supernodes_dial_the_real_fleet_port() {
    // flower-operator always dialed :9092; ours follows service.ports.grpc.
    let mut f = fed(BASE);
    f.spec.superlink.service.ports.grpc = 30092;
    let objects = hub(&f);
    assert_eq!(
        pool_args(&local(&f))[0],
        "--superlink=fed-superlink.ns.svc:30092"
    );
    let ports = objects
        .service
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .expect("ports");
    assert_eq!(
        (ports[0].name.as_deref(), ports[0].port),
        (Some("fleet"), 30092)
    );
}

#[test]
fn spokes_dial_the_external_address_with_a_real_port() {
    // Spokes cannot reach a cluster-local name: they dial externalAddress (port defaulted to grpc).
    let mut f = fed(BASE);
    f.spec.placement_ref = Some(flower_addon_crds::PlacementRef::named("p"));
    f.spec.superlink.external_address = Some("hub.example".into());
    f.spec.superlink.service.ports.grpc = 31000;
    let selection = SpokeSelection::positional("c", 0, 1, &Default::default());
    let fleet = flower_addon_hub::core::render::spoke_fleet_address(&f, None).expect("fleet");
    let rendered = spoke_objects(&f, &selection, &fleet, "")
        .expect("renders")
        .expect("c runs the pool");
    let Workload::StatefulSet(sts) = &rendered.workloads[0].1 else {
        panic!("StatefulSet expected")
    };
    let pod = sts.spec.template.spec.as_ref().expect("pod");
    assert_eq!(
        container(pod, "supernode").args.as_ref().expect("args")[0],
        "--superlink=hub.example:31000"
    );
    assert!(
        hub_local_objects(&f).expect("renders").is_none(),
        "pools of a placed Federation do not run in the hub cluster"
    );
    // Without it the address is not a spec problem (the hub derives one from a NodePort or
    // LoadBalancer Service, or the standalone hub's address); a ClusterIP Service cannot be
    // reached from spokes, which the Kubernetes hub reports naming the field.
    f.spec.superlink.external_address = None;
    assert!(render_problems(&f).is_empty(), "{:?}", render_problems(&f));
    let (_, dialect) = flower_addon_hub::core::render::federation_dialect(&f).expect("dialect");
    let err =
        flower_addon_hub::core::render::external_endpoints(&f, dialect, None, Some("198.18.0.1"))
            .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("spec.superlink.externalAddress: required"),
        "{err}"
    );
}

#[test]
fn version_selects_the_dialect() {
    // flower-operator ignored spec.version; ours renders unified flags for 1.42 even with a 1.25 tag.
    let mut f = fed(BASE);
    f.spec.version = Some("1.42.0".into());
    let objects = hub(&f);
    let args = container(superlink_pod(&objects), "superlink")
        .args
        .clone()
        .expect("args");
    assert!(
        // The SuperLink's one server on the pod's loopback: the Fleet front faces SuperNodes.
        args.contains(&"--host=127.0.0.1".to_owned()) && args.contains(&"--port=8000".to_owned()),
        "{args:?}"
    );
    let ports = objects
        .service
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .expect("ports");
    // Fleet reaches the SuperLink through the fleet-front sidecar; Control is on the pod's
    // loopback (no control port on the Service: flower-operator's ClusterIP one is opt-in with
    // exposeControl, since any pod of the cluster could run code through it).
    let targets: Vec<_> = ports
        .iter()
        .map(|p| (p.name.clone().unwrap_or_default(), p.target_port.clone()))
        .collect();
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int;
    assert_eq!(targets, [("fleet".to_owned(), Some(Int(9092)))]);
    let front = container(superlink_pod(&objects), "fleet-front");
    assert_eq!(
        front.args.clone().expect("args")[..3],
        [
            "fleet-front",
            "--listen=0.0.0.0:9092",
            "--upstream=127.0.0.1:8000"
        ]
    );
    f.spec.version = Some("nightly".into());
    assert_eq!(render_problems(&f)[0].0, "spec.version");
}

#[test]
fn labels_removed_from_the_spec_vanish_from_the_service() {
    // The rendered Service is the whole desired state: a label dropped from the spec is not kept.
    let mut f = fed(BASE);
    f.spec
        .superlink
        .service
        .labels
        .insert("team".into(), "ml".into());
    f.spec
        .superlink
        .service
        .labels
        .insert("app.kubernetes.io/name".into(), "hijack".into());
    let with = hub(&f).service;
    let labels = with.metadata.labels.expect("labels");
    assert_eq!(labels["team"], "ml");
    assert_eq!(
        labels["app.kubernetes.io/name"], "superlink",
        "our labels win"
    );
    f.spec.superlink.service.labels.clear();
    let without = hub(&f).service.metadata.labels.expect("labels");
    assert!(!without.contains_key("team"));
    let selector = hub(&f)
        .service
        .spec
        .and_then(|s| s.selector)
        .expect("selector");
    assert!(!selector.contains_key("team"));
}

#[test]
fn env_and_volume_order_is_stable() {
    // flower-operator merged through Go maps: order changed every reconcile and pods restarted.
    let f = fed(&BASE.replace(
        "pools: [{ name: default, replicas: 2, images: {} }]",
        "env: [{ name: A, value: a }, { name: B, value: b }]\n    pools: [{ name: default, replicas: 2, images: {}, env: [{ name: C, value: c }, { name: A, value: pool }], volumes: [{ name: v1, emptyDir: {} }, { name: v2, emptyDir: {} }], volumeMounts: [{ name: v2, mountPath: /b }, { name: v1, mountPath: /a }] }]",
    ));
    let all = |f: &Federation| {
        let mut values = hub(f).to_values().expect("json");
        values.extend(local(f).to_values().expect("json"));
        serde_json::to_string(&values).expect("string")
    };
    let first = all(&f);
    for _ in 0..50 {
        assert_eq!(all(&f), first);
    }
    let objects = local(&f);
    let Workload::StatefulSet(sts) = &objects.workloads[0].1 else {
        panic!("StatefulSet expected")
    };
    let pod = sts.spec.template.spec.as_ref().expect("pod");
    let env: Vec<_> = container(pod, "supernode")
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(env, ["A", "B", "C"]);
    let mounts: Vec<_> = container(pod, "supernode")
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(mounts, ["/b", "/a"]);
}

#[test]
fn node_config_values_are_escaped_not_shell_expanded() {
    // flower-operator put values into a shell unescaped; ours quote for TOML and double `$` for Kubernetes.
    let f = fed(&BASE.replace(
        "images: {} }]",
        "images: {}, nodeConfig: { a: \"$HOME\", b: 'say \"hi\"', c: \"x y\" } }]",
    ));
    let args = pool_args(&local(&f));
    assert_eq!(
        args.last().expect("args"),
        r#"--node-config=a="$$HOME" b='say "hi"' c="x y""#
    );
    assert!(
        container(superlink_pod(&hub(&f)), "superlink")
            .command
            .is_none()
    );
}

#[test]
fn superlink_renders_flower_operator_facts_plus_a_persistent_database() {
    // 1-replica StatefulSet, image entrypoint, --isolation/--insecure, ports, database on a volume.
    let f = fed(BASE);
    let objects = hub(&f);
    assert_eq!(
        objects.superlink.metadata.name.as_deref(),
        Some("fed-superlink")
    );
    assert_eq!(objects.superlink.spec.replicas, Some(1));
    let pod = superlink_pod(&objects);
    let superlink = container(pod, "superlink");
    assert_eq!(
        superlink.args.clone().expect("args"),
        [
            "--isolation=subprocess",
            "--insecure",
            "--serverappio-api-address=127.0.0.1:9091",
            "--fleet-api-address=0.0.0.0:9092",
            // Deliberately not flower-operator's 0.0.0.0: Control on the pod's loopback.
            "--control-api-address=127.0.0.1:9093",
            "--database=/var/lib/flwr/state/superlink.db"
        ]
    );
    let ports: Vec<_> = superlink
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref().unwrap_or_default(), p.container_port))
        .collect();
    assert_eq!(ports, [("fleet", 9092), ("control", 9093)]);
    let state = &pod.volumes.as_ref().expect("volumes")[0];
    assert_eq!(state.name, "superlink-state");
    assert!(state.empty_dir.is_some());
    assert_eq!(pod.containers.len(), 1);
}

#[test]
fn superlink_state_can_live_on_a_claim() {
    // A volumeClaimTemplate named superlink-state replaces the emptyDir (survives pod deletion).
    let f = fed(&BASE.replace(
        "superlink: { image: \"flwr/superlink:1.25.0\" }",
        "superlink: { image: \"flwr/superlink:1.25.0\", volumeClaimTemplates: [{ metadata: { name: superlink-state }, spec: { accessModes: [ReadWriteOnce], resources: { requests: { storage: 1Gi } } } }] }",
    ));
    let objects = hub(&f);
    assert!(superlink_pod(&objects).volumes.is_none());
    assert_eq!(
        objects
            .superlink
            .spec
            .volume_claim_templates
            .as_ref()
            .expect("claims")
            .len(),
        1
    );
    // The claimed volume is root-owned; Flower's images run as uid/gid 49999, which can write
    // it only through the pod's fsGroup (checked on a real node by e2e real_federation).
    let fs_group = |objects: &HubObjects| {
        superlink_pod(objects)
            .security_context
            .as_ref()
            .and_then(|s| s.fs_group)
    };
    assert_eq!(fs_group(&objects), Some(49999));
    assert_eq!(fs_group(&hub(&fed(BASE))), None, "an emptyDir needs none");
    let mut own = f.clone();
    own.spec.superlink.pod_template = Some(
        serde_json::from_value(serde_json::json!({"spec": {"securityContext": {"fsGroup": 7}}}))
            .expect("template"),
    );
    assert_eq!(
        fs_group(&hub(&own)),
        Some(7),
        "the podTemplate's fsGroup wins"
    );
}

#[test]
fn outputs_are_a_volume_of_the_superlink_with_a_read_only_sidecar() {
    let with = |outputs: &str| {
        fed(&BASE.replace(
            "superlink: { image: \"flwr/superlink:1.25.0\" }",
            &format!("superlink: {{ image: \"flwr/superlink:1.25.0\" }}\n  outputs: {outputs}"),
        ))
    };
    let mount_of = |container: &Container| {
        container
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "outputs")
            .map(|m| (m.mount_path.clone(), m.read_only.unwrap_or(false)))
    };
    // A claim template: the StatefulSet's claim `outputs`, mounted read-write on the SuperLink
    // and read-only on the sidecar that serves it; the pod gets Flower's fsGroup.
    let objects = hub(&with(
        "{ volumeClaimTemplate: { spec: { accessModes: [ReadWriteOnce], resources: { requests: { storage: 1Gi } } } } }",
    ));
    let claims = objects
        .superlink
        .spec
        .volume_claim_templates
        .clone()
        .expect("claims");
    assert_eq!(
        claims
            .iter()
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect::<Vec<_>>(),
        ["outputs"]
    );
    let pod = superlink_pod(&objects);
    assert!(
        pod.volumes.iter().flatten().all(|v| v.name != "outputs"),
        "no pod volume besides the claim"
    );
    assert_eq!(
        mount_of(container(pod, "superlink")),
        Some(("/var/lib/flwr/outputs".to_owned(), false))
    );
    let sidecar = container(pod, "outputs");
    assert_eq!(
        mount_of(sidecar),
        Some(("/var/lib/flwr/outputs".to_owned(), true))
    );
    assert_eq!(
        sidecar.args.clone().expect("args"),
        [
            "outputs-server",
            "--listen=127.0.0.1:9099",
            "--dir=/var/lib/flwr/outputs",
            "--max-bytes=1073741824"
        ]
    );
    assert_eq!(
        pod.security_context.as_ref().and_then(|s| s.fs_group),
        Some(49999)
    );
    // An existing claim is a pod volume; nothing at all is an emptyDir (and needs no fsGroup).
    let existing = hub(&with("{ claimName: runs }"));
    let volume = superlink_pod(&existing)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "outputs")
        .cloned()
        .expect("outputs volume");
    assert_eq!(
        volume.persistent_volume_claim.map(|c| c.claim_name),
        Some("runs".to_owned())
    );
    let empty = hub(&with("{}"));
    let pod = superlink_pod(&empty);
    let size_limit = |pod: &k8s_openapi::api::core::v1::PodSpec| {
        pod.volumes
            .iter()
            .flatten()
            .find(|v| v.name == "outputs")
            .and_then(|v| v.empty_dir.clone())
            .and_then(|e| e.size_limit)
            .map(|q| q.0)
    };
    // The emptyDir is held to spec.outputs.sizeLimit (1Gi unless set), as is the sidecar.
    assert_eq!(size_limit(pod).as_deref(), Some("1Gi"));
    let limited = hub(&with("{ sizeLimit: 200Mi }"));
    assert_eq!(
        size_limit(superlink_pod(&limited)).as_deref(),
        Some("200Mi")
    );
    assert!(
        container(superlink_pod(&limited), "outputs")
            .args
            .iter()
            .flatten()
            .any(|a| a == "--max-bytes=209715200")
    );
    assert_eq!(pod.security_context.as_ref().and_then(|s| s.fs_group), None);
    // Without outputs: no volume, no sidecar.
    let none = hub(&fed(BASE));
    assert!(
        superlink_pod(&none)
            .containers
            .iter()
            .all(|c| c.name != "outputs")
    );
}

#[test]
fn process_mode_and_tls_per_dialect() {
    // Process: serverapp sidecar (classic plaintext appio hop; unified dials its own HTTPS port with the CA).
    let mut f = fed(&BASE
        .replace("isolationMode: subprocess", "isolationMode: process")
        .replace("superlink: { image: \"flwr/superlink:1.25.0\" }", "superlink: { image: \"flwr/superlink:1.25.0\", superexecImage: \"flwr/superexec:1.25.0\" }"));
    f.spec.insecure = false;
    let classic = render_superlink(&f, v("1.25.0"), FlowerDialect::Classic).expect("renders");
    let pod = classic.spec.template.spec.as_ref().expect("pod");
    assert_eq!(
        container(pod, "superlink").args.clone().expect("args")[1..4],
        [
            "--ssl-ca-certfile=/etc/flwr/tls/ca.crt",
            "--ssl-certfile=/etc/flwr/tls/tls.crt",
            "--ssl-keyfile=/etc/flwr/tls/tls.key"
        ]
    );
    assert_eq!(
        container(pod, "superexec-serverapp")
            .args
            .clone()
            .expect("args"),
        [
            "--insecure",
            "--plugin-type=serverapp",
            "--appio-api-address=127.0.0.1:9091"
        ]
    );
    let unified = render_superlink(&f, v("1.42.0"), FlowerDialect::Unified).expect("renders");
    let pod = unified.spec.template.spec.as_ref().expect("pod");
    assert_eq!(
        container(pod, "superexec-serverapp")
            .args
            .clone()
            .expect("args"),
        [
            "--runtime-api-address=127.0.0.1:8000",
            "--root-certificates=/etc/flwr/tls/ca.crt"
        ]
    );
    assert!(
        container(pod, "superlink")
            .args
            .clone()
            .expect("args")
            .contains(&"--disable-runtime-dependency-installation".to_owned())
    );
    let service = render_superlink_service(&f, FlowerDialect::Classic).expect("renders");
    let names: Vec<_> = service
        .spec
        .and_then(|s| s.ports)
        .expect("ports")
        .into_iter()
        .map(|p| p.name.unwrap_or_default())
        .collect();
    assert_eq!(names, ["fleet", "serverappio"]);
}

#[test]
fn clashing_service_ports_are_reported() {
    // Two Service ports on one number would be rejected by the API server; say so before applying.
    let mut f = fed(BASE);
    f.spec.superlink.service.ports.extra = f.spec.superlink.service.ports.grpc;
    assert_eq!(render_problems(&f)[0].0, "spec.superlink.service.ports");
    f.spec.version = Some("1.42.0".into());
    // Unified: Fleet (the front) and Control (the SuperLink) listen apart unless exposed.
    let problems = render_problems(&f);
    assert!(
        !problems.is_empty()
            && problems
                .iter()
                .all(|(path, message)| path == "spec.superlink.service.ports"
                    && message.contains("exposeControl")),
        "{problems:?}"
    );
    f.spec.superlink.service.expose_control = true;
    assert!(
        render_problems(&f).is_empty(),
        "unified with exposeControl serves both on one port"
    );
}

#[test]
fn without_insecure_the_default_is_tls_with_supernode_authentication() {
    // A deliberate difference from flower-operator (`insecure` defaulted to true there): a
    // Federation that says nothing runs TLS, and its SuperLink requires registered SuperNode keys.
    let f = fed(&BASE.replace("  insecure: true\n", ""));
    assert!(!f.spec.insecure && f.spec.supernode_auth());
    let args = container(superlink_pod(&hub(&f)), "superlink")
        .args
        .clone()
        .expect("args");
    assert!(!args.iter().any(|a| a == "--insecure"), "{args:?}");
    for want in [
        "--ssl-certfile=/etc/flwr/tls/tls.crt",
        "--enable-supernode-auth",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} not in {args:?}");
    }
    let pool = pool_args(&local(&f));
    assert!(!pool.iter().any(|a| a == "--insecure"), "{pool:?}");
}

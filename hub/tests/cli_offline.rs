//! The real `flower-hub` binary on the examples and on invalid variants: `crds`, `validate`,
//! `render`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn hub(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flower-hub"))
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .expect("flower-hub runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn write(dir: &tempfile::TempDir, name: &str, content: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, content).expect("write");
    path.display().to_string()
}

const VALID: &str = "apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: { name: fed }
spec:
  mode: StatefulSet
  isolationMode: subprocess
  superlink: { image: flwr/superlink:1.25.0 }
  supernodes:
    image: flwr/supernode:1.25.0
    pools: [{ name: a, replicas: 1, images: {} }]
";

#[test]
fn every_example_validates() {
    // The shipped examples are valid: exit 0 and nothing on stderr, with the allowances the
    // AMD GPU example names (its pool runs in the hub cluster: see the next test).
    let files = examples();
    assert!(!files.is_empty());
    let args: Vec<&str> = files
        .iter()
        .map(|p| p.to_str().expect("utf-8 path"))
        .collect();
    let mut all = vec!["validate", "--allow", "privileged,host-path"];
    all.extend(&args);
    let out = hub(&all);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn a_hub_local_amd_gpu_pool_needs_the_hub_admins_allowance() {
    // Invariant: by default the hub refuses a pod in its own cluster with host paths or a
    // privileged container (the AMD pool of a Federation without a Placement), naming the pool,
    // the field and the `flower-hub serve` flag; with the flags it validates and renders.
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/federation-mixed-gpu.yaml");
    let file = file.to_str().expect("utf-8 path");
    let out = hub(&["validate", file]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 3, "{err}");
    for part in [
        "spec.supernodes.pools[2]: volume dev-kfd (hostPath /dev/kfd) is not allowed in the hub cluster",
        "`flower-hub serve --allow host-path`",
        "container supernode: privileged is not allowed in the hub cluster",
        "`flower-hub serve --allow privileged`",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    let out = hub(&["render", file]);
    assert!(!out.status.success(), "render refuses the same");
    assert_eq!(text(&out.stderr), err);
    let out = hub(&[
        "render",
        "--allow",
        "privileged",
        "--allow",
        "host-path",
        file,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("privileged: true"));
}

#[test]
fn invalid_examples_fail_with_one_line_per_problem() {
    // Each invalid variant exits 1 with `FILE: <field path>: <message>` lines on stderr.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/invalid");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("invalid dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let shown = file.to_str().expect("utf-8 path");
        let out = hub(&["validate", shown]);
        assert_eq!(out.status.code(), Some(1), "{shown}");
        let stderr = text(&out.stderr);
        assert!(!stderr.is_empty(), "{shown}");
        for line in stderr.lines() {
            let rest = line
                .strip_prefix(&format!("{shown}: "))
                .unwrap_or_else(|| panic!("{line}"));
            assert!(
                rest.starts_with("spec.") || rest.starts_with("metadata"),
                "{line}"
            );
        }
    }
}

#[test]
fn broken_files_name_the_file_and_line_and_never_panic() {
    // Malformed YAML, unknown fields and unknown kinds are clear errors, not panics: each problem
    // is one stderr line starting with the file (`FILE:LINE: message` where the line is known),
    // from `validate` and from `render` alike.
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "malformed.yaml",
            format!("{VALID}  pools: [unclosed\n"),
            ":11: malformed YAML: unclosed bracket",
        ),
        (
            "unknown-field.yaml",
            VALID.replace("mode: StatefulSet", "mode: StatefulSet\n  colour: blue"),
            ":6: invalid Federation: unknown field `colour`, expected one of",
        ),
        (
            "unknown-top-level-field.yaml",
            format!("{VALID}colour: blue\n"),
            ":1: unknown field `colour` at the top level of a Federation",
        ),
        (
            "unknown-kind.yaml",
            VALID.replace("kind: Federation", "kind: Frobnicator"),
            ":1: unsupported apiVersion \"flower-addon.io/v1alpha1\" kind \"Frobnicator\"; supported: flower-addon.io/v1alpha1 Federation,",
        ),
        (
            "second-doc.yaml",
            format!(
                "{VALID}---\n{}",
                VALID.replace("kind: Federation", "kind: Nope")
            ),
            ":12: unsupported apiVersion \"flower-addon.io/v1alpha1\" kind \"Nope\"",
        ),
        (
            "second-doc-field.yaml",
            format!(
                "{VALID}---\n# comment\n{}",
                VALID.replace("isolationMode: subprocess", "isolationMode: sub")
            ),
            ":18: invalid Federation: unknown variant `sub`, expected one of process, subprocess",
        ),
        (
            "latest.yaml",
            VALID.replace("superlink:1.25.0", "superlink:latest"),
            ": spec.version",
        ),
        (
            "nightly.yaml",
            VALID.replace(
                "mode: StatefulSet",
                "mode: StatefulSet\n  version: \"nightly\"",
            ),
            ": spec.version: \"nightly\" is not a Flower version",
        ),
    ];
    for (name, content, needle) in cases {
        let path = write(&dir, name, &content);
        for command in ["validate", "render"] {
            let out = hub(&[command, &path]);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{command} {name}: {stderr}");
            assert!(
                stderr.contains(&format!("{path}{needle}")),
                "{command} {name}: {stderr}"
            );
            assert!(!stderr.contains("panicked"), "{command} {name}: {stderr}");
            assert!(!stderr.is_empty(), "{command} {name}");
            for line in stderr.lines() {
                assert!(line.starts_with(&path), "{command} {name}: {line}");
            }
        }
    }
    for command in ["validate", "render"] {
        let missing = hub(&[command, "/nonexistent/file.yaml"]);
        assert_eq!(missing.status.code(), Some(1));
        let stderr = text(&missing.stderr);
        assert!(
            stderr.starts_with("/nonexistent/file.yaml: cannot read:"),
            "{command}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{command}: {stderr}");
    }
}

#[test]
fn render_prints_a_parseable_stream_for_the_hub_and_for_a_spoke() {
    // `render` output is valid YAML; the hub gets SuperLink objects (no Control Service: Control
    // is on the pod's loopback; a NetworkPolicy admitting the Fleet port), a spoke its placed
    // pools.
    let dir = tempfile::tempdir().expect("tempdir");
    let local = write(&dir, "local.yaml", VALID);
    let out = hub(&["render", &local]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text(&out.stdout)).expect("YAML stream");
    let kinds: Vec<_> = docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "StatefulSet",
            "Service",
            "NetworkPolicy",
            "StatefulSet",
            "Service"
        ]
    );
    // The SuperLink's Service carries the Fleet port only, and its NetworkPolicy admits only
    // that port: no pod of the cluster reaches Control.
    let service_ports: Vec<_> = docs[1]["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(service_ports, ["fleet"]);
    assert_eq!(docs[2]["metadata"]["name"], "fed-superlink");
    assert_eq!(
        docs[2]["spec"]["ingress"][0]["ports"],
        serde_json::json!([{"port": 9092, "protocol": "TCP"}])
    );
    assert_eq!(docs[3]["metadata"]["name"], "fed-supernode-a");
    // The pool's headless Service, the one its StatefulSet names in serviceName.
    assert_eq!(docs[4]["metadata"]["name"], "fed-supernode-a");
    assert_eq!(docs[3]["spec"]["serviceName"], "fed-supernode-a");
    assert_eq!(docs[4]["spec"]["clusterIP"], "None");

    let placed = VALID.replace(
        "superlink: { image: flwr/superlink:1.25.0 }",
        "placementRef: { name: p }\n  superlink: { image: flwr/superlink:1.25.0, externalAddress: \"hub.example:30092\" }",
    );
    let placed = write(&dir, "placed.yaml", &placed);
    let out = hub(&[
        "render",
        &placed,
        "--cluster",
        "east",
        "--cluster-index",
        "1",
        "--clusters",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text(&out.stdout)).expect("YAML stream");
    assert_eq!(docs.len(), 2, "the pool and its headless Service");
    assert_eq!(docs[1]["kind"], "Service");
    assert_eq!(
        docs[0]["spec"]["template"]["spec"]["containers"][0]["args"][0],
        "--superlink=hub.example:30092"
    );
    let out = hub(&["render", &placed]);
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text(&out.stdout)).expect("YAML stream");
    assert_eq!(
        docs.len(),
        3,
        "placed pools are not rendered for the hub (SuperLink StatefulSet + 2 Services)"
    );
    let out = hub(&[
        "render",
        &placed,
        "--cluster",
        "east",
        "--cluster-index",
        "2",
        "--clusters",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn crds_prints_every_definition() {
    // `crds` prints the generated CustomResourceDefinitions as a YAML stream.
    let out = hub(&["crds"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text(&out.stdout)).expect("YAML stream");
    assert!(docs.len() >= 4);
    assert!(docs.iter().all(|d| d["kind"] == "CustomResourceDefinition"));
}

#[test]
fn render_for_a_labelled_cluster_merges_its_overrides() {
    // `render --cluster X --label …` prints the pools as the hub sends them to X: the override
    // selected by the label is merged (image, replicas, memory limit, batch size), other values
    // of the pool stay; a cluster without the label gets the pool as written.
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/cluster-overrides.yaml")
        .display()
        .to_string();
    let render = |labels: &[&str]| {
        let mut args = vec![
            "render",
            file.as_str(),
            "--cluster",
            "site-1",
            "--node-address",
            "198.18.0.1",
        ];
        for l in labels {
            args.extend(["--label", l]);
        }
        let out = hub(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let gpu = render(&["gpu=yes", "flower=enabled"]);
    assert!(
        gpu.contains("image: example.org/flwr/supernode-cuda:1.42.0"),
        "{gpu}"
    );
    assert!(gpu.contains("replicas: 4"), "{gpu}");
    assert!(gpu.contains("memory: 16Gi"), "{gpu}");
    assert!(
        gpu.contains("cpu: \"2\""),
        "the pool's CPU limit stays: {gpu}"
    );
    assert!(gpu.contains("batch-size=128"), "{gpu}");
    assert!(gpu.contains("--superlink=198.18.0.1:30092"), "{gpu}");
    let plain = render(&["flower=enabled"]);
    assert!(plain.contains("image: flwr/supernode:1.42.0"), "{plain}");
    assert!(
        plain.contains("replicas: 2") && plain.contains("batch-size=32"),
        "{plain}"
    );
    let edge = render(&["site=edge"]);
    assert!(edge.contains("value: edge"), "{edge}");
}

#[test]
fn serving_what_the_namespaces_pod_security_refuses_is_said_at_start() {
    // Invariant: `flower-hub serve --allow host-pid` with the default `baseline` namespace
    // label would give pods the API server refuses; the hub says so before it connects, naming
    // both flags; `validate` and `render` judge the Federation alone and take the same flags.
    let out = hub(&["serve", "--allow", "host-pid,secrets"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    for part in [
        "`flower-hub serve --allow host-pid` with --namespace-pod-security baseline",
        "also pass --namespace-pod-security privileged (or none",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/federation-mixed-gpu.yaml");
    let out = hub(&[
        "validate",
        "--allow",
        "privileged,host-path",
        file.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

//! The FlowerRun API: its CEL rules (evaluated by kube's CEL validator on the generated CRD)
//! agree with `validate_flower_run`, the spec is immutable but for `suspend`, and bad
//! run-config values are refused with the key named.

use flower_addon_crds::rules::{FLOWER_RUN_RULES, MSG_RUN_IMMUTABLE};
use flower_addon_crds::{FlowerRun, Object, crds, parse_documents, validate_flower_run};
use kube::core::cel::Validator;
use serde_json::{Value, json};

fn run_schema() -> Value {
    let crd = crds()
        .into_iter()
        .find(|c| c.spec.names.kind == "FlowerRun")
        .expect("a FlowerRun CRD");
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

fn cel(object: &Value, old: Option<&Value>) -> Vec<String> {
    let mut msgs: Vec<String> = match Validator::new().validate(&run_schema(), object, old) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.into_vec().into_iter().map(|e| e.message).collect(),
    };
    msgs.sort();
    msgs.dedup();
    msgs
}

fn valid() -> Value {
    json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "FlowerRun",
        "metadata": {"name": "fedavg", "namespace": "default"},
        "spec": {
            "federationRef": {"name": "quickstart"},
            "app": {"fab": {"configMapRef": {"name": "fedavg-fab", "key": "app.fab"}}},
            "runConfig": {"num-server-rounds": 3, "lr": 0.1, "name": "x", "verbose": true},
            "backoffLimit": 1,
        }
    })
}

fn offline(object: &Value) -> Vec<String> {
    let run: FlowerRun = serde_json::from_value(object.clone()).unwrap();
    let mut msgs: Vec<String> = validate_flower_run(&run)
        .into_iter()
        .map(|e| e.message)
        .collect();
    msgs.sort();
    msgs
}

// Each FAB-source rule fails in CEL exactly when validate_flower_run reports it, and a valid run
// passes both.
#[test]
fn fab_source_rules_agree_with_validate() {
    let sha = "a".repeat(64);
    let cases: Vec<(&str, Value)> = vec![
        ("valid", valid()),
        (
            "both",
            json!({"configMapRef": {"name": "f", "key": "k"}, "url": "https://h/a.fab", "sha256": sha}),
        ),
        ("neither", json!({})),
        ("url without sha256", json!({"url": "https://h/a.fab"})),
        (
            "sha256 without url",
            json!({"configMapRef": {"name": "f", "key": "k"}, "sha256": sha}),
        ),
        (
            "url with sha256",
            json!({"url": "https://h/a.fab", "sha256": sha}),
        ),
    ];
    let rule_messages: Vec<&str> = FLOWER_RUN_RULES.iter().map(|r| r.message).collect();
    let mut failing = 0;
    for (name, fab) in cases {
        let mut object = valid();
        if name != "valid" {
            object["spec"]["app"]["fab"] = fab;
        }
        let cel = cel(&object, None);
        let off: Vec<String> = offline(&object)
            .into_iter()
            .filter(|m| rule_messages.contains(&m.as_str()))
            .collect();
        assert_eq!(cel, off, "{name}: CEL vs validate_flower_run");
        failing += usize::from(!cel.is_empty());
    }
    assert_eq!(failing, 4, "four of the cases break a rule");
}

// Changing anything but `suspend` is refused with one message that says what to do; suspending
// is allowed. (`runConfig` is free-form, invisible to CEL: the hub's core holds it, see
// hub/src/core/run/tests.rs.)
#[test]
fn the_spec_is_immutable_except_suspend() {
    let old = valid();
    let mut suspended = old.clone();
    suspended["spec"]["suspend"] = json!(true);
    assert_eq!(cel(&suspended, Some(&old)), Vec::<String>::new());
    type Change = Box<dyn Fn(&mut Value)>;
    let changes: Vec<(&str, Change)> = vec![
        (
            "federationRef",
            Box::new(|o| o["spec"]["federationRef"]["name"] = json!("other")),
        ),
        (
            "app",
            Box::new(|o| o["spec"]["app"]["fab"]["configMapRef"]["key"] = json!("b.fab")),
        ),
        (
            "activeDeadlineSeconds added",
            Box::new(|o| o["spec"]["activeDeadlineSeconds"] = json!(60)),
        ),
        (
            "backoffLimit",
            Box::new(|o| o["spec"]["backoffLimit"] = json!(2)),
        ),
        (
            "ttlSecondsAfterFinished added",
            Box::new(|o| o["spec"]["ttlSecondsAfterFinished"] = json!(1)),
        ),
    ];
    for (name, change) in changes {
        let mut new = old.clone();
        change(&mut new);
        assert_eq!(
            cel(&new, Some(&old)),
            vec![MSG_RUN_IMMUTABLE.to_string()],
            "changing {name}"
        );
    }
}

// A list, a map or null as a run-config value keeps the object readable and is refused with
// the key named; so are a bad SHA-256, URL and deadline.
#[test]
fn bad_values_are_refused_with_the_field_named() {
    let mut object = valid();
    object["spec"]["runConfig"]["layers"] = json!([1, 2]);
    object["spec"]["runConfig"]["opts"] = json!({"a": 1});
    let run: FlowerRun = serde_json::from_value(object).unwrap();
    let errors = validate_flower_run(&run);
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        ["spec.runConfig.layers", "spec.runConfig.opts"],
        "{errors:?}"
    );
    assert!(errors[0].message.contains("not a list"), "{errors:?}");
    assert!(errors[1].message.contains("not a map"), "{errors:?}");

    let mut object = valid();
    object["spec"]["app"]["fab"] = json!({"url": "ftp://h/a.fab", "sha256": "ABC"});
    object["spec"]["activeDeadlineSeconds"] = json!(0);
    let run: FlowerRun = serde_json::from_value(object).unwrap();
    let paths: Vec<String> = validate_flower_run(&run)
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(
        paths,
        [
            "spec.app.fab.url",
            "spec.app.fab.sha256",
            "spec.activeDeadlineSeconds"
        ]
    );
}

// The YAML front door (`flower-hub validate`, the standalone manifests) reads a FlowerRun with
// typed run-config values.
#[test]
fn a_flower_run_parses_from_yaml_with_typed_values() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/flowerrun-fedavg.yaml"),
    )
    .unwrap();
    let objects = parse_documents("flowerrun-fedavg.yaml", &text).unwrap();
    let [Object::FlowerRun(run)] = objects.as_slice() else {
        panic!("one FlowerRun expected: {objects:?}");
    };
    assert_eq!(
        run.spec.run_config.get("num-server-rounds"),
        Some(&flower_addon_crds::RunConfigValue::Int(3))
    );
    assert_eq!(run.spec.backoff_limit(), 1);
    assert!(validate_flower_run(run).is_empty());
}

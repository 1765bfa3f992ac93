//! `flower-hub run list` on a standalone hub's state directory: a table for people, and every
//! run with its whole status as JSON or YAML for scripts (`-o json|yaml`), sorted.
use std::process::Command;

use flower_addon_crds::run::FlowerRunStatus;
use flower_addon_hub::standalone::runs::RunEntry;
use flower_addon_hub::standalone::status::HubStatus;

fn run_list(dir: &std::path::Path, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_flower-hub"))
        .args(["run", "list", "--state-dir"])
        .arg(dir)
        .args(extra)
        .output()
        .expect("flower-hub");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn run_list_speaks_json_and_yaml_for_scripts() {
    // Invariant: -o json and -o yaml give the same runs, with their status, sorted by
    // namespace and name; --federation-namespace narrows them; the table stays the default.
    let dir = tempfile::tempdir().expect("tmp");
    let entry = |namespace: &str, name: &str, flower: &str| RunEntry {
        namespace: namespace.into(),
        name: name.into(),
        federation: "quickstart".into(),
        status: FlowerRunStatus {
            run_id: Some("42".into()),
            flower_status: Some(flower.into()),
            ..FlowerRunStatus::default()
        },
    };
    let status = HubStatus {
        runs: vec![
            entry("team", "b", "running"),
            entry("default", "z", "finished:completed"),
            entry("team", "a", "pending"),
        ],
        ..HubStatus::default()
    };
    std::fs::write(
        dir.path().join("status.json"),
        serde_json::to_vec(&status).expect("json"),
    )
    .expect("write");
    let json: serde_json::Value =
        serde_json::from_str(&run_list(dir.path(), &["-o", "json"])).expect("JSON");
    let names: Vec<String> = json
        .as_array()
        .expect("array")
        .iter()
        .map(|r| {
            format!(
                "{}/{}",
                r["namespace"].as_str().unwrap(),
                r["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(names, ["default/z", "team/a", "team/b"]);
    assert_eq!(json[1]["status"]["flowerStatus"], "pending");
    assert_eq!(json[1]["federation"], "quickstart");
    let yaml: serde_json::Value =
        serde_saphyr::from_str(&run_list(dir.path(), &["-o", "yaml"])).expect("YAML");
    assert_eq!(yaml, json);
    let narrowed: serde_json::Value = serde_json::from_str(&run_list(
        dir.path(),
        &["-o", "json", "--federation-namespace", "team"],
    ))
    .expect("JSON");
    assert_eq!(narrowed.as_array().expect("array").len(), 2);
    let table = run_list(dir.path(), &[]);
    assert!(
        table.contains("team") && table.contains("pending"),
        "{table}"
    );
}

//! Every example parses and validates; every invalid example fails with exactly its message.

use std::path::{Path, PathBuf};

use flower_addon_crds::{
    Object, parse_documents, validate_cluster_set, validate_cluster_set_binding,
    validate_federation, validate_flower_run, validate_placement,
};

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn messages(obj: &Object) -> Vec<String> {
    let errors = match obj {
        Object::Federation(f) => validate_federation(f),
        Object::Placement(p) => validate_placement(p),
        Object::ManagedClusterSet(s) => validate_cluster_set(s),
        Object::ManagedClusterSetBinding(b) => validate_cluster_set_binding(b),
        Object::FlowerRun(r) => validate_flower_run(r),
        _ => Vec::new(),
    };
    errors.into_iter().map(|e| e.message).collect()
}

// Every README example (in our apiVersion) and the multi-cluster example are accepted as written.
#[test]
fn valid_examples_validate() {
    let files = yaml_files(&examples_dir());
    assert!(files.len() >= 12, "expected the examples, found {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let objects =
            parse_documents(&file.display().to_string(), &text).unwrap_or_else(|e| panic!("{e}"));
        assert!(!objects.is_empty(), "{}: no objects", file.display());
        for obj in &objects {
            assert_eq!(messages(obj), Vec::<String>::new(), "{}", file.display());
        }
    }
}

// Each invalid example fails with exactly the message its `# expect:` line names.
#[test]
fn invalid_examples_fail_with_their_message() {
    let files = yaml_files(&examples_dir().join("invalid"));
    assert!(files.len() >= 10, "expected one invalid example per rule");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let expected = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{}: no `# expect:` line", file.display()));
        let objects = parse_documents(&file.display().to_string(), &text).unwrap();
        assert_eq!(objects.len(), 1);
        assert_eq!(
            messages(&objects[0]),
            vec![expected.to_string()],
            "{}",
            file.display()
        );
    }
}

// Every CEL rule has an invalid example, so the apiserver tests can exercise each rule.
#[test]
fn every_cel_rule_has_an_invalid_example() {
    let dir = examples_dir().join("invalid");
    let all: String = yaml_files(&dir)
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    for rule in flower_addon_crds::rules::FEDERATION_SPEC_RULES {
        assert!(
            all.contains(&format!("# expect: {}\n", rule.message)),
            "no invalid example for {:?}",
            rule.message
        );
    }
}

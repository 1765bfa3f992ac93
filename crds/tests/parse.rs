//! parse_documents: clear errors naming file and line, never a panic.

use flower_addon_crds::{Object, parse_documents};

const FED: &str = "apiVersion: flower-addon.io/v1alpha1\nkind: Federation\nmetadata:\n  name: f\nspec:\n  mode: DaemonSet\n  isolationMode: subprocess\n  superlink:\n    image: s\n  supernodes:\n    image: n\n    pools:\n      - name: a\n        images: {}\n";

// A multi-document stream yields every object in order; empty documents are skipped.
#[test]
fn multi_document() {
    let text = format!(
        "# comment\n---\n{FED}---\n---\napiVersion: flower-addon.io/v1alpha1\nkind: Placement\nmetadata:\n  name: p\nspec: {{}}\n"
    );
    let objs = parse_documents("m.yaml", &text).unwrap();
    assert_eq!(
        objs.iter().map(Object::kind).collect::<Vec<_>>(),
        ["Federation", "Placement"]
    );
    assert_eq!(objs[1].name(), "p");
}

// Malformed YAML is an error naming the file and a line.
#[test]
fn malformed_yaml() {
    let e = parse_documents("bad.yaml", "apiVersion: [\n  kind: x\n").unwrap_err();
    assert_eq!(e.file, "bad.yaml");
    assert!(e.line.is_some());
    assert!(e.to_string().starts_with("bad.yaml:"), "{e}");
}

// An unknown field inside our spec is an error with the line of the second document.
#[test]
fn unknown_field() {
    let text = format!(
        "{FED}---\n{}",
        FED.replace("  mode: DaemonSet\n", "  mode: DaemonSet\n  modee: x\n")
    );
    let e = parse_documents("u.yaml", &text).unwrap_err();
    assert!(e.message.contains("modee"), "{e}");
    assert_eq!(e.line, Some(22), "{e}");
}

// An unknown top-level field is an error too.
#[test]
fn unknown_top_level_field() {
    let e = parse_documents("t.yaml", &format!("{FED}extra: 1\n")).unwrap_err();
    assert!(e.message.contains("extra"), "{e}");
}

// Unknown kinds and wrong apiVersions list the supported kinds.
#[test]
fn unknown_kind_and_api_version() {
    for text in [
        FED.replace("kind: Federation", "kind: Deployment"),
        FED.replace("flower-addon.io/v1alpha1", "flwr.exalsius.ai/v1"),
        "just a string\n".to_string(),
    ] {
        let e = parse_documents("k.yaml", &text).unwrap_err();
        assert!(e.to_string().starts_with("k.yaml:1:"), "{e}");
    }
    let e = parse_documents(
        "k.yaml",
        &FED.replace("kind: Federation", "kind: Deployment"),
    )
    .unwrap_err();
    assert!(
        e.message.contains("flower-addon.io/v1alpha1 Federation"),
        "{e}"
    );
}

// Garbage never panics.
#[test]
fn garbage_never_panics() {
    for text in [
        "",
        "---",
        ":",
        "- a\n- b",
        "\t\tx: [}",
        "a: &x *x",
        "{{{{",
        "apiVersion: 1\nkind: 2",
    ] {
        let _ = parse_documents("g.yaml", text);
    }
}

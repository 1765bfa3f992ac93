//! Every `flower-hub` subcommand's `--help` shows an example, and `completions` prints scripts
//! the shells accept.

use std::process::Command;

fn hub(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flower-hub"))
        .args(args)
        .output()
        .expect("flower-hub runs")
}

const SUBCOMMANDS: [&str; 9] = [
    "crds",
    "validate",
    "render",
    "serve",
    "token",
    "accept",
    "revoke",
    "status",
    "completions",
];

#[test]
fn every_subcommand_help_has_an_example() {
    for sub in SUBCOMMANDS {
        let out = hub(&[sub, "--help"]);
        assert!(out.status.success(), "{sub} --help failed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("Example") && text.contains("flower-hub "),
            "{sub} --help has no example:\n{text}"
        );
    }
}

#[test]
fn token_subcommands_have_examples_too() {
    for sub in ["create", "list", "delete"] {
        let out = hub(&["token", sub, "--help"]);
        assert!(out.status.success(), "token {sub} --help failed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("Example") && text.contains("flower-hub token "),
            "token {sub} --help has no example:\n{text}"
        );
    }
}

#[test]
fn bash_completion_names_every_subcommand_and_parses() {
    let out = hub(&["completions", "bash"]);
    assert!(out.status.success());
    let script = String::from_utf8_lossy(&out.stdout).into_owned();
    for sub in SUBCOMMANDS {
        assert!(
            script.contains(sub),
            "{sub} missing from the bash completion"
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("flower-hub.bash");
    std::fs::write(&file, &script).expect("write");
    let check = Command::new("bash")
        .arg("-n")
        .arg(&file)
        .output()
        .expect("bash runs");
    assert!(
        check.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    for shell in ["zsh", "fish"] {
        let out = hub(&["completions", shell]);
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let bad = hub(&["completions", "tcsh"]);
    assert!(!bad.status.success(), "an unknown shell is an error");
}

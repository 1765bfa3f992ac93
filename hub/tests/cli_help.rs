//! Every `flower-hub` subcommand's `--help` shows an example, and `completions` prints scripts
//! the shells accept.
//!
//! The subcommands are read from the binary's own `--help` (recursively: `token create`,
//! `ca rotate`, …), so a new one is checked without editing this file; a floor of subcommands
//! known to exist keeps a parsing slip from turning the checks into no checks.

#[path = "help_support/mod.rs"]
mod help_support;
use help_support::listed_subcommands;
use std::process::Command;

const BIN: &str = "flower-hub";

fn hub(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flower-hub"))
        .args(args)
        .output()
        .expect("flower-hub runs")
}

/// Subcommands that exist (as `flower-hub` words): whatever `--help` lists must include them.
const KNOWN: [&str; 17] = [
    "crds",
    "validate",
    "render",
    "serve",
    "token",
    "token create",
    "token list",
    "token delete",
    "ca",
    "ca status",
    "ca rotate",
    "accept",
    "revoke",
    "status",
    "connect",
    "fleet-front",
    "completions",
];

#[test]
fn every_subcommand_help_has_an_example() {
    // An example is a line of the help that runs the subcommand itself, e.g.
    // `  flower-hub token create --cluster-name spoke-1`; the `Usage:` line does not count.
    for (path, text) in help_support::every_subcommand(
        std::path::Path::new(env!("CARGO_BIN_EXE_flower-hub")),
        &KNOWN,
    ) {
        let command = format!("{BIN} {path}");
        let example = text.lines().map(str::trim_start).any(|line| {
            line.strip_prefix(&command)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
        });
        assert!(example, "`{command} --help` has no example of it:\n{text}");
    }
}

#[test]
fn subcommands_are_read_from_the_help() {
    // The reading itself, on a help text with a wrapped description and clap's `help`.
    let text = "About.\n\nUsage: x <COMMAND>\n\nCommands:\n  one    First,\n         wrapped\n  two-words  Second\n  help   Print this message\n\nOptions:\n  -h, --help  Print help\n";
    assert_eq!(listed_subcommands(text), ["one", "two-words"]);
    assert!(listed_subcommands("Usage: x\n\nOptions:\n  -h  Help\n").is_empty());
}

#[test]
fn bash_completion_names_every_subcommand_and_parses() {
    let out = hub(&["completions", "bash"]);
    assert!(out.status.success());
    let script = String::from_utf8_lossy(&out.stdout).into_owned();
    // The words the script offers after each command (its `opts="…"` lists).
    let offered: std::collections::BTreeSet<&str> = script
        .lines()
        .filter_map(|line| line.trim().strip_prefix("opts=\""))
        .flat_map(|rest| rest.trim_end_matches('"').split_whitespace())
        .collect();
    for (path, _) in help_support::every_subcommand(
        std::path::Path::new(env!("CARGO_BIN_EXE_flower-hub")),
        &KNOWN,
    ) {
        let name = path.rsplit(' ').next().expect("a name");
        assert!(
            offered.contains(name),
            "{path} missing from the bash completion, which offers {offered:?}"
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

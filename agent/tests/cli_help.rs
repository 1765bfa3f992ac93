//! `flower-agent` subcommands show an example in `--help`, and `completions` works.
//!
//! The subcommands are read from the binary's own `--help` (recursively, should one get
//! subcommands of its own), so a new one is checked without editing this file; a floor of
//! subcommands known to exist keeps a parsing slip from turning the checks into no checks.

#[path = "../../hub/tests/help_support/mod.rs"]
mod help_support;
use help_support::listed_subcommands;
use std::process::Command;

const BIN: &str = "flower-agent";

fn agent(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flower-agent"))
        .args(args)
        .output()
        .expect("flower-agent runs")
}

/// Subcommands that exist: whatever `--help` lists must include them.
const KNOWN: [&str; 4] = ["join", "run", "netns-bridge", "completions"];

#[test]
fn every_subcommand_help_has_an_example_and_completions_work() {
    // An example is a line of the help that runs the subcommand itself, e.g.
    // `  flower-agent join --hub hub.example.org:7443 …`; the `Usage:` line does not count.
    let subcommands = help_support::every_subcommand(
        std::path::Path::new(env!("CARGO_BIN_EXE_flower-agent")),
        &KNOWN,
    );
    for (path, text) in &subcommands {
        let command = format!("{BIN} {path}");
        let example = text.lines().map(str::trim_start).any(|line| {
            line.strip_prefix(&command)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
        });
        assert!(example, "`{command} --help` has no example of it:\n{text}");
    }
    let out = agent(&["completions", "bash"]);
    assert!(out.status.success());
    let script = String::from_utf8_lossy(&out.stdout);
    // The words the script offers after each command (its `opts="…"` lists).
    let offered: std::collections::BTreeSet<&str> = script
        .lines()
        .filter_map(|line| line.trim().strip_prefix("opts=\""))
        .flat_map(|rest| rest.trim_end_matches('"').split_whitespace())
        .collect();
    for (path, _) in &subcommands {
        let name = path.rsplit(' ').next().expect("a name");
        assert!(
            offered.contains(name),
            "{path} missing from the bash completion, which offers {offered:?}"
        );
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
fn allowing_what_the_namespaces_pod_security_refuses_is_said_at_start() {
    // Invariant: `--allow privileged` with the default `baseline` namespace label would give
    // pods the API server refuses; the agent says so before it connects anywhere, naming both
    // flags (the levels that admit them are the policy's unit tests).
    let out = agent(&[
        "run",
        "--runtime",
        "kubernetes",
        "--hub",
        "127.0.0.1:1",
        "--allow",
        "privileged,host-path",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for part in [
        "`flower-agent run --allow host-path,privileged` with --namespace-pod-security baseline",
        "also pass --namespace-pod-security privileged",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
}

//! `flower-agent` subcommands show an example in `--help`, and `completions` works.
//!
//! The subcommands are read from the binary's own `--help` (recursively, should one get
//! subcommands of its own), so a new one is checked without editing this file; a floor of
//! subcommands known to exist keeps a parsing slip from turning the checks into no checks.

use std::process::Command;

const BIN: &str = "flower-agent";

fn agent(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flower-agent"))
        .args(args)
        .output()
        .expect("flower-agent runs")
}

/// Subcommands that exist: whatever `--help` lists must include them.
const KNOWN: [&str; 3] = ["join", "run", "completions"];

/// The `--help` text of `flower-agent <path>`, which must succeed.
fn help(path: &[&str]) -> String {
    let mut args = path.to_vec();
    args.push("--help");
    let out = agent(&args);
    assert!(
        out.status.success(),
        "{BIN} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The subcommands a clap `--help` lists under `Commands:` (each on a line of its own, indented
/// by two spaces; wrapped descriptions are indented further), without clap's own `help`.
fn listed_subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| line.trim_end() != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with(' '))
        .filter_map(|line| line.strip_prefix("  "))
        .filter(|rest| !rest.starts_with(' '))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Every subcommand of `flower-agent`, nested ones too, as space-separated paths with their
/// `--help` text, read from the help itself; checked against [`KNOWN`].
fn every_subcommand() -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut pending: Vec<Vec<String>> = listed_subcommands(&help(&[]))
        .into_iter()
        .map(|name| vec![name])
        .collect();
    while let Some(path) = pending.pop() {
        let words: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&words);
        for child in listed_subcommands(&text) {
            let mut nested = path.clone();
            nested.push(child);
            pending.push(nested);
        }
        found.push((path.join(" "), text));
    }
    found.sort();
    let names: Vec<&str> = found.iter().map(|(path, _)| path.as_str()).collect();
    assert!(!names.is_empty(), "no subcommand found in `{BIN} --help`");
    let missing: Vec<&str> = KNOWN
        .iter()
        .copied()
        .filter(|known| !names.contains(known))
        .collect();
    assert!(
        missing.is_empty(),
        "`{BIN} --help` (read recursively) does not list {missing:?}; found {names:?}"
    );
    found
}

#[test]
fn every_subcommand_help_has_an_example_and_completions_work() {
    // An example is a line of the help that runs the subcommand itself, e.g.
    // `  flower-agent join --hub hub.example.org:7443 …`; the `Usage:` line does not count.
    let subcommands = every_subcommand();
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

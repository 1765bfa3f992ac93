//! Reading a clap binary's subcommands from its own `--help`, recursively, for the CLI help
//! tests of `flower-hub` (hub/tests/cli_help.rs) and `flower-agent` (agent/tests/cli_help.rs,
//! which includes this file by path).
#![allow(dead_code)]
use std::path::Path;
use std::process::Command;

/// The `--help` text of `bin <path>`, which must succeed.
pub fn help(bin: &Path, path: &[&str]) -> String {
    let mut args = path.to_vec();
    args.push("--help");
    let out = Command::new(bin)
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("{} runs: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} {} failed: {}",
        bin.display(),
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The subcommands a clap `--help` lists under `Commands:` (each on a line of its own, indented
/// by two spaces; wrapped descriptions are indented further), without clap's own `help`.
pub fn listed_subcommands(help: &str) -> Vec<String> {
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

/// Every subcommand of `bin`, nested ones too, as space-separated paths with their `--help`
/// text, read from the help itself; each of `known` must be among them (a floor that keeps a
/// parsing slip from turning the checks into no checks).
pub fn every_subcommand(bin: &Path, known: &[&str]) -> Vec<(String, String)> {
    let name = bin
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut found = Vec::new();
    let mut pending: Vec<Vec<String>> = listed_subcommands(&help(bin, &[]))
        .into_iter()
        .map(|name| vec![name])
        .collect();
    while let Some(path) = pending.pop() {
        let words: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(bin, &words);
        for child in listed_subcommands(&text) {
            let mut nested = path.clone();
            nested.push(child);
            pending.push(nested);
        }
        found.push((path.join(" "), text));
    }
    found.sort();
    let names: Vec<&str> = found.iter().map(|(path, _)| path.as_str()).collect();
    assert!(!names.is_empty(), "no subcommand found in `{name} --help`");
    let missing: Vec<&str> = known
        .iter()
        .copied()
        .filter(|known| !names.contains(known))
        .collect();
    assert!(
        missing.is_empty(),
        "`{name} --help` (read recursively) does not list {missing:?}; found {names:?}"
    );
    found
}

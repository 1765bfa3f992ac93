//! `flower-agent` subcommands show an example in `--help`, and `completions` works.

use std::process::Command;

fn agent(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flower-agent"))
        .args(args)
        .output()
        .expect("flower-agent runs")
}

#[test]
fn every_subcommand_help_has_an_example_and_completions_work() {
    for sub in ["join", "run", "completions"] {
        let out = agent(&[sub, "--help"]);
        assert!(out.status.success(), "{sub} --help failed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("Example") && text.contains("flower-agent "),
            "{sub} --help has no example:\n{text}"
        );
    }
    let out = agent(&["completions", "bash"]);
    assert!(out.status.success());
    let script = String::from_utf8_lossy(&out.stdout);
    assert!(script.contains("join") && script.contains("run"));
}

//! The docs cannot drift from the command line: every `flower-hub …` and `flower-agent …` command
//! written in the README and in docs/ names subcommands that exist, and each `--flag` it gives
//! is one that subcommand's `--help` lists.
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, ensure};

/// The README and every page under docs/.
fn documents() -> Result<Vec<PathBuf>> {
    let root = e2e::repo_root();
    let mut files = vec![root.join("README.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    Ok(files)
}

/// The `--help` of `binary` with `path` (cached).
struct Helps {
    binaries: BTreeMap<&'static str, PathBuf>,
    cache: BTreeMap<(String, Vec<String>), String>,
}

impl Helps {
    fn help(&mut self, binary: &str, path: &[String]) -> Result<String> {
        let key = (binary.to_owned(), path.to_vec());
        if let Some(text) = self.cache.get(&key) {
            return Ok(text.clone());
        }
        let program = self
            .binaries
            .get(binary)
            .with_context(|| format!("no binary {binary}"))?;
        let out = Command::new(program).args(path).arg("--help").output()?;
        ensure!(
            out.status.success(),
            "{binary} {} --help failed: {}",
            path.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        self.cache.insert(key, text.clone());
        Ok(text)
    }
}

/// The subcommands a `--help` lists under `Commands:`.
fn subcommands(help: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut inside = false;
    for line in help.lines() {
        if line.trim_end() == "Commands:" {
            inside = true;
            continue;
        }
        if inside {
            if line.trim().is_empty() || !line.starts_with(' ') {
                if !line.trim().is_empty() {
                    inside = false;
                }
                continue;
            }
            if let Some(name) = line.split_whitespace().next() {
                out.insert(name.to_owned());
            }
        }
    }
    out
}

/// Whether `help` lists the long option `flag` (`--name`).
fn lists_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(at, _)| {
        let before = help[..at].chars().next_back();
        let after = help[at + flag.len()..].chars().next();
        before.is_none_or(|c| c.is_whitespace() || c == ',' || c == '[')
            && after.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-'))
    })
}

/// `text` with everything outside code (fenced blocks and inline code spans) blanked out, line
/// breaks kept: commands are only what the docs show as code.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut fenced = false;
    // An inline code span may continue on the next line of its paragraph.
    let mut inside = false;
    for line in text.split_inclusive('\n') {
        if line.trim().is_empty() {
            inside = false;
        }
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.extend(line.chars().map(|c| if c == '\n' { c } else { ' ' }));
            continue;
        }
        if fenced {
            out.push_str(line);
            continue;
        }
        // Inline code: what is between backticks.
        for c in line.chars() {
            if c == '`' {
                inside = !inside;
                out.push('`');
            } else if inside || c == '\n' {
                out.push(c);
            } else {
                out.push(' ');
            }
        }
    }
    out
}

/// Each command line of `text` that runs `binary`, in code: from the binary's name to the end
/// of the command (a line end not continued by `\`, a pipe, `&&`, `;`, a closing backtick or
/// parenthesis).
fn commands(text: &str, binary: &str) -> Vec<(usize, String)> {
    let joined = code_only(text).replace("\\\n", " ");
    let mut out = Vec::new();
    for (at, _) in joined.match_indices(binary) {
        let before = joined[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '/' || c == '_') {
            continue;
        }
        let rest = &joined[at + binary.len()..];
        let line_start = joined[..at].rfind('\n').map_or(0, |i| i + 1);
        if !rest.starts_with(' ') || joined[line_start..at].contains('#') {
            // Not a command, or in a shell comment.
            continue;
        }
        let end = rest
            .find(['\n', '|', ';', '`', ')', '#'])
            .unwrap_or(rest.len());
        let command = rest[..end]
            .split("&&")
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let line = joined[..at].matches('\n').count() + 1;
        out.push((line, command));
    }
    out
}

#[test]
fn every_documented_command_and_flag_exists() -> Result<()> {
    // Invariant: a documented subcommand or flag that the binaries do not have fails here, with
    // the file, the line and the command.
    let mut helps = Helps {
        binaries: BTreeMap::from([
            ("flower-hub", e2e::binary("flower-hub")?),
            ("flower-agent", e2e::binary("flower-agent")?),
        ]),
        cache: BTreeMap::new(),
    };
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in documents()? {
        let text = std::fs::read_to_string(&file)?;
        let shown = file
            .strip_prefix(e2e::repo_root())
            .unwrap_or(&file)
            .display()
            .to_string();
        for binary in ["flower-hub", "flower-agent"] {
            for (line, command) in commands(&text, binary) {
                checked += 1;
                check(&mut helps, binary, &command, &shown, line, &mut problems)?;
            }
        }
    }
    eprintln!("docs_commands: {checked} documented commands checked");
    ensure!(checked > 50, "only {checked} commands found in the docs");
    ensure!(
        problems.is_empty(),
        "documented commands the binaries do not have:\n{}",
        problems.join("\n")
    );
    Ok(())
}

fn check(
    helps: &mut Helps,
    binary: &str,
    command: &str,
    file: &str,
    line: usize,
    problems: &mut Vec<String>,
) -> Result<()> {
    let tokens: Vec<&str> = command.split_whitespace().collect();
    let mut path: Vec<String> = Vec::new();
    let mut rest = tokens.as_slice();
    // Descend while the next word is a subcommand of where we are.
    while let Some((first, tail)) = rest.split_first() {
        let known = subcommands(&helps.help(binary, &path)?);
        let mut hidden = || {
            !first.starts_with('-') && {
                let mut deeper = path.clone();
                deeper.push((*first).to_owned());
                helps.help(binary, &deeper).is_ok()
            }
        };
        if known.contains(*first) || hidden() {
            path.push((*first).to_owned());
            rest = tail;
        } else {
            break;
        }
    }
    if path.is_empty() {
        // The binary named alone (`flower-hub`), or with a global flag, is fine; a word that is
        // no subcommand is not.
        if let Some(first) = rest.first()
            && !first.starts_with('-')
        {
            problems.push(format!(
                "{file}:{line}: `{binary} {command}`: {first:?} is not a subcommand of {binary}"
            ));
        }
        return Ok(());
    }
    let help = helps.help(binary, &path)?;
    // A command with subcommands takes no other word: one that is not listed is a typo.
    if !subcommands(&help).is_empty()
        && let Some(first) = rest.first()
        && !first.starts_with('-')
    {
        problems.push(format!(
            "{file}:{line}: `{binary} {command}`: {first:?} is not a subcommand of `{binary} {}`",
            path.join(" ")
        ));
    }
    for token in rest {
        let Some(flag) = token.strip_prefix("--") else {
            continue;
        };
        let name: String = flag
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if name.is_empty() || name == "help" {
            continue;
        }
        let flag = format!("--{name}");
        if !lists_flag(&help, &flag) {
            problems.push(format!(
                "{file}:{line}: `{binary} {command}`: `{binary} {}` has no {flag}",
                path.join(" ")
            ));
        }
    }
    Ok(())
}

#[test]
fn the_parser_finds_commands_and_flags() {
    // Invariant: continued lines join, a pipe or backtick ends a command, and a flag is matched
    // whole (`--allow` is not `--allow-service-account`).
    let text = "run `flower-hub token create --cluster-name x -o json` and\n\
                ```\nflower-agent run --state-dir /v \\\n  --runtime process | tee log\n```\n";
    assert_eq!(
        commands(text, "flower-hub"),
        [(1, "token create --cluster-name x -o json".to_owned())]
    );
    assert_eq!(
        commands(text, "flower-agent"),
        [(3, "run --state-dir /v --runtime process".to_owned())]
    );
    let help = "Options:\n      --allow-service-account <NAME>\n      --allow <ALLOW>\n";
    assert!(lists_flag(help, "--allow"));
    assert!(lists_flag(help, "--allow-service-account"));
    assert!(!lists_flag(
        "      --allow-service-account <NAME>\n",
        "--allow"
    ));
}

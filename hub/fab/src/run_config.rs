//! Run-config overrides: `flwr run --run-config` text read as Flower's `parse_config_args`
//! reads it, and overrides held to the app's `[tool.flwr.app.config]`. Flower itself only checks
//! override keys (1.42 at `StartRun`; 1.25 not until the ServerApp starts, failing the run) and
//! never their types.

use std::collections::BTreeMap;

use super::ConfigValue;
use super::pathspec::py_isspace;
use super::toml::{self, Table, Toml};

/// Why run-config text or overrides are refused; each message says what to change.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RunConfigError {
    /// An argument naming a TOML file, which Flower would open.
    #[error(
        "run-config `{arg}` ends in .toml: Flower reads such an argument as the path of a TOML file, which the hub cannot read; give the values as key=value pairs"
    )]
    TomlFile {
        /// The argument.
        arg: String,
    },
    /// Text that is no `key=value` pair (Flower would silently ignore it).
    #[error(
        "run-config `{arg}`: `{text}` is not a key=value pair: write key=value with no spaces around `=`, separate pairs with spaces, and quote strings, e.g. `num-server-rounds=5 learning-rate=0.1 name=\"run-1\"`"
    )]
    NotAPair {
        /// The argument.
        arg: String,
        /// The text no pair covers.
        text: String,
    },
    /// The pairs do not read as TOML.
    #[error(
        "run-config `{arg}` is not valid TOML ({reason}): values are TOML booleans, integers, floats or quoted strings, e.g. `num-server-rounds=5 learning-rate=0.1 name=\"run-1\" verbose=true`"
    )]
    Syntax {
        /// The argument.
        arg: String,
        /// The TOML parser's message.
        reason: String,
    },
    /// A value Flower cannot send (array, date).
    #[error(
        "run-config key `{key}` is {found}; Flower run-config values are booleans, integers, floats or strings (tables become dotted keys)"
    )]
    NotScalar {
        /// The dotted key.
        key: String,
        /// What it is.
        found: &'static str,
    },
    /// A key the app does not declare.
    #[error(
        "run-config key `{key}` is not in the app's [tool.flwr.app.config] ({}): fix its spelling, or declare it with a default in the app's pyproject.toml",
        keys_list(.keys)
    )]
    UnknownKey {
        /// The key.
        key: String,
        /// The app's keys.
        keys: Vec<String>,
    },
    /// A value of another type than the app's default.
    #[error(
        "run-config key `{key}` is {expected} in the app's [tool.flwr.app.config] (default {default}), but {given} was given ({value}): give {expected}, e.g. {key}={default}"
    )]
    WrongType {
        /// The key.
        key: String,
        /// The default's type ("an integer", …).
        expected: &'static str,
        /// The given value's type.
        given: &'static str,
        /// The app's default, as TOML.
        default: String,
        /// The given value, as TOML.
        value: String,
    },
}

fn keys_list(keys: &[String]) -> String {
    if keys.is_empty() {
        "which declares no keys".to_owned()
    } else {
        format!("keys: {}", keys.join(", "))
    }
}

/// Reads `flwr run --run-config` arguments as Flower does: each argument holds `key=value`
/// pairs separated by whitespace (a value may be quoted with `'` or `"`), each read as a TOML
/// line; a later argument's top-level key replaces an earlier one's; nested keys are flattened
/// with dots. Stricter than Flower: text outside the pairs, which Flower ignores, is refused.
pub fn parse_run_config(args: &[String]) -> Result<BTreeMap<String, ConfigValue>, RunConfigError> {
    if let Some(arg) = args.iter().find(|a| a.ends_with(".toml")) {
        return Err(RunConfigError::TomlFile { arg: arg.clone() });
    }
    let mut overrides: Table = Vec::new();
    let mut flat = BTreeMap::new();
    for arg in args.iter().filter(|a| !a.is_empty()) {
        let (pairs, stray) = find_pairs(arg);
        if let Some(text) = stray {
            return Err(RunConfigError::NotAPair {
                arg: arg.clone(),
                text,
            });
        }
        let lines: Vec<String> = pairs.iter().map(|(k, v)| format!("{k} = {v}")).collect();
        let parsed = toml::parse(&lines.join("\n")).map_err(|e| {
            // Line n of the TOML text is pair n.
            let (k, v) = pairs
                .get(e.line.saturating_sub(1))
                .copied()
                .unwrap_or_default();
            RunConfigError::Syntax {
                arg: arg.clone(),
                reason: format!("in `{k}={v}`: {}", e.message),
            }
        })?;
        for (k, v) in parsed {
            match overrides.iter_mut().find(|(key, _)| *key == k) {
                Some(slot) => slot.1 = v,
                None => overrides.push((k, v)),
            }
        }
        flat = BTreeMap::new();
        flatten(&overrides, "", &mut flat)?;
    }
    Ok(flat)
}

/// The pairs `re.findall(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)", arg)` finds (with Python's `\s`),
/// and the first stretch of non-space text outside them, if any.
fn find_pairs(arg: &str) -> (Vec<(&str, &str)>, Option<String>) {
    let chars: Vec<(usize, char)> = arg.char_indices().collect();
    let at = |i: usize| chars.get(i).map(|(_, c)| *c);
    let byte = |i: usize| chars.get(i).map_or(arg.len(), |(b, _)| *b);
    let non_space = |i: usize| at(i).is_some_and(|c| !py_isspace(c));
    let mut pairs = Vec::new();
    let mut stray = None;
    let mut covered = 0; // chars before this index belong to a pair or were checked
    let mut start = 0;
    while start < chars.len() {
        let found = (|| {
            // The key is lazy: the shortest run of non-space text followed by `=` and a value.
            let mut eq = start + 1;
            while non_space(eq - 1) {
                if at(eq) == Some('=') {
                    let v = eq + 1;
                    for quote in ['\'', '"'] {
                        if at(v) == Some(quote)
                            && let Some(close) =
                                (v + 1..chars.len()).find(|&i| at(i) == Some(quote))
                        {
                            return Some((eq, close + 1));
                        }
                    }
                    let mut end = v;
                    while non_space(end) {
                        end += 1;
                    }
                    if end > v {
                        return Some((eq, end));
                    }
                }
                eq += 1;
            }
            None
        })();
        match found {
            Some((eq, end)) => {
                if stray.is_none() {
                    stray = stray_text(arg, byte(covered), byte(start));
                }
                pairs.push((&arg[byte(start)..byte(eq)], &arg[byte(eq + 1)..byte(end)]));
                covered = end;
                start = end;
            }
            None => start += 1,
        }
    }
    if stray.is_none() {
        stray = stray_text(arg, byte(covered), arg.len());
    }
    (pairs, stray)
}

fn stray_text(arg: &str, from: usize, to: usize) -> Option<String> {
    let text = arg[from..to].trim_matches(py_isspace);
    (!text.is_empty()).then(|| text.to_owned())
}

/// `flatten_dict` for overrides: anything but a scalar or a table is refused.
fn flatten(
    table: &Table,
    prefix: &str,
    out: &mut BTreeMap<String, ConfigValue>,
) -> Result<(), RunConfigError> {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if let Some(value) = ConfigValue::from_toml(v) {
            out.insert(key, value);
        } else if let Toml::Table(t) = v {
            flatten(t, &key, out)?;
        } else {
            return Err(RunConfigError::NotScalar {
                key,
                found: v.kind(),
            });
        }
    }
    Ok(())
}

/// Holds `overrides` to the app's flattened config (`app`, e.g. [`super::Fab::config`]): every
/// key must be the app's, and every value of the default's type, but an integer for a float
/// key, which becomes a float (Kubernetes stores `3.0` as `3`). Returns the overrides to send.
pub fn check_overrides(
    app: &BTreeMap<String, ConfigValue>,
    overrides: &BTreeMap<String, ConfigValue>,
) -> Result<BTreeMap<String, ConfigValue>, RunConfigError> {
    let mut checked = BTreeMap::new();
    for (key, value) in overrides {
        let Some(default) = app.get(key) else {
            return Err(RunConfigError::UnknownKey {
                key: key.clone(),
                keys: app.keys().cloned().collect(),
            });
        };
        let value = match (default, value) {
            (ConfigValue::Float(_), ConfigValue::Int(i)) => ConfigValue::Float(*i as f64),
            (d, v) if std::mem::discriminant(d) == std::mem::discriminant(v) => v.clone(),
            (d, v) => {
                return Err(RunConfigError::WrongType {
                    key: key.clone(),
                    expected: d.kind(),
                    given: v.kind(),
                    default: d.to_string(),
                    value: v.to_string(),
                });
            }
        };
        checked.insert(key.clone(), value);
    }
    Ok(checked)
}

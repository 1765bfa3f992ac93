//! `nodeConfig` → the single `--node-config` string Flower parses.
//!
//! Flower (`flwr.common.config.parse_config_args`) finds pairs with the regex
//! `(\S+?)=('[^']*'|"[^"]*"|\S+)` and reads each as a TOML `key = value` line. So: keys sorted,
//! pairs joined by one space, integers and `true`/`false` bare, every other value a TOML string —
//! `"…"` (basic) when it holds no `"` and no `\`, else `'…'` (literal, no escapes at all), except
//! that a value with both `\` and `'` is a basic string with `\\` for each backslash. A value with
//! both quote kinds, or with control characters, has no encoding and is an error; so is a key TOML
//! would not read as a bare or dotted key.

use std::collections::BTreeMap;

use crate::NodeConfigValue;

use super::placeholders::{INTEGER_PLACEHOLDERS, PlaceholderError, Placeholders};

/// Why a `nodeConfig` cannot be encoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeConfigError {
    /// The key is not a TOML bare or dotted key (letters, digits, `-`, `_`, dots between parts).
    #[error(
        "nodeConfig key {key:?} must be made of letters, digits, '-' and '_' (dots separate parts)"
    )]
    BadKey {
        /// The key.
        key: String,
    },
    /// A key is both a value and a table (`a` and `a.b`).
    #[error(
        "nodeConfig keys {key:?} and {nested:?} conflict: {key:?} cannot be both a value and a table"
    )]
    KeyConflict {
        /// The shorter key.
        key: String,
        /// The key nested under it.
        nested: String,
    },
    /// The value holds both `'` and `"`, which Flower's parser cannot carry.
    #[error("nodeConfig value of {key:?} contains both ' and \" quotes, which Flower cannot parse")]
    BothQuotes {
        /// The key.
        key: String,
    },
    /// The value holds a control character (TOML strings cannot).
    #[error(
        "nodeConfig value of {key:?} contains a control character (newline, …), which Flower cannot parse"
    )]
    ControlCharacter {
        /// The key.
        key: String,
    },
    /// A placeholder is used where its value is unknown.
    #[error("nodeConfig value of {key:?}: {source}")]
    Placeholder {
        /// The key.
        key: String,
        /// The placeholder problem.
        source: PlaceholderError,
    },
}

/// Encodes `entries` as one `--node-config` value, expanding placeholders with `placeholders`.
/// Returns `None` for an empty map (no `--node-config` argument at all).
pub fn encode_node_config(
    entries: &BTreeMap<String, NodeConfigValue>,
    placeholders: &Placeholders,
) -> Result<Option<String>, NodeConfigError> {
    if entries.is_empty() {
        return Ok(None);
    }
    check_keys(entries.keys())?;
    let mut out = String::new();
    for (key, value) in entries {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(key);
        out.push('=');
        match value {
            NodeConfigValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            NodeConfigValue::Int(i) => out.push_str(&i.to_string()),
            NodeConfigValue::String(template) => {
                let expanded = placeholders.expand(template).map_err(|source| {
                    NodeConfigError::Placeholder {
                        key: key.clone(),
                        source,
                    }
                })?;
                if is_bare(template) {
                    out.push_str(&expanded);
                } else {
                    push_quoted(&mut out, key, &expanded)?;
                }
            }
        }
    }
    Ok(Some(out))
}

/// Checks that every key of a `nodeConfig` can be encoded (used by validation too).
pub fn check_keys<'a>(keys: impl Iterator<Item = &'a String>) -> Result<(), NodeConfigError> {
    let keys: Vec<&String> = keys.collect();
    for key in &keys {
        let ok = !key.is_empty()
            && key.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            });
        if !ok {
            return Err(NodeConfigError::BadKey {
                key: (*key).clone(),
            });
        }
    }
    let all: std::collections::BTreeSet<&str> = keys.iter().map(|k| k.as_str()).collect();
    for key in &keys {
        for (dot, _) in key.match_indices('.') {
            if all.contains(&key[..dot]) {
                return Err(NodeConfigError::KeyConflict {
                    key: key[..dot].to_owned(),
                    nested: (*key).clone(),
                });
            }
        }
    }
    Ok(())
}

/// Checks that a string value can be encoded (used by validation too): not both quote kinds and
/// no control characters other than tab.
pub fn check_string_value(key: &str, value: &str) -> Result<(), NodeConfigError> {
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(NodeConfigError::ControlCharacter {
            key: key.to_owned(),
        });
    }
    if value.contains('"') && value.contains('\'') {
        return Err(NodeConfigError::BothQuotes {
            key: key.to_owned(),
        });
    }
    Ok(())
}

/// A string template written bare: `true`/`false`, an `i64` literal in TOML form, or exactly one
/// integer placeholder.
fn is_bare(template: &str) -> bool {
    if template == "true" || template == "false" {
        return true;
    }
    if let Some(name) = template.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        return INTEGER_PLACEHOLDERS.contains(&name);
    }
    let digits = template.strip_prefix('-').unwrap_or(template);
    let toml_integer = !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    toml_integer && template.parse::<i64>().is_ok()
}

fn push_quoted(out: &mut String, key: &str, value: &str) -> Result<(), NodeConfigError> {
    check_string_value(key, value)?;
    if value.contains('\\') && value.contains('\'') {
        // Neither literal form fits (`'` ends a literal string): a basic string with the
        // backslashes escaped (the value has no `"`, or check_string_value refused it).
        out.push('"');
        out.push_str(&value.replace('\\', "\\\\"));
        out.push('"');
        return Ok(());
    }
    let quote = if value.contains('"') || value.contains('\\') {
        '\''
    } else {
        '"'
    };
    out.push(quote);
    out.push_str(value);
    out.push(quote);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::placeholders::{Expansion, Target};

    fn entries(pairs: &[(&str, NodeConfigValue)]) -> BTreeMap<String, NodeConfigValue> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    fn s(v: &str) -> NodeConfigValue {
        NodeConfigValue::String(v.to_owned())
    }

    #[test]
    fn flower_operator_example_renders_sorted_and_typed() {
        // flower-operator's nodeConfig example: sorted keys, integers bare, strings quoted.
        let p = Placeholders::new(Target::Kubernetes)
            .set("index", Expansion::KubernetesEnv("FLWR_POD_INDEX"))
            .set("replicas", Expansion::Text("4".into()))
            .set("pool", Expansion::Text("default".into()));
        let config = entries(&[
            ("partition-id", s("{index}")),
            ("num-partitions", s("{replicas}")),
            ("name", s("client_{pool}_{index}")),
        ]);
        assert_eq!(
            encode_node_config(&config, &p).unwrap().unwrap(),
            r#"name="client_default_$(FLWR_POD_INDEX)" num-partitions=4 partition-id=$(FLWR_POD_INDEX)"#
        );
    }

    #[test]
    fn quoting_follows_the_value() {
        // `"…"` when safe, `'…'` for `"` or `\`, `"…"` with `\\` for `\` and `'` together (found
        // by the property test: `'\''` ended the literal early), bare only for integers and
        // booleans.
        let p = Placeholders::new(Target::Process);
        let config = entries(&[
            ("a", s("has space")),
            ("b", s(r#"say "hi""#)),
            ("c", s(r"C:\path")),
            ("d", s("it's")),
            ("e", s("007")),
            ("f", s("true")),
            ("g", NodeConfigValue::Int(-3)),
            ("h", NodeConfigValue::Bool(false)),
            ("i", s("99999999999999999999")),
            ("j", s("")),
            ("k", s("3.5")),
            ("l", s(r"C:\it's")),
        ]);
        assert_eq!(
            encode_node_config(&config, &p).unwrap().unwrap(),
            r#"a="has space" b='say "hi"' c='C:\path' d="it's" e="007" f=true g=-3 h=false i="99999999999999999999" j="" k="3.5" l="C:\\it's""#
        );
    }

    #[test]
    fn unencodable_values_and_keys_are_errors() {
        // Values Flower cannot parse are refused instead of silently corrupted.
        let p = Placeholders::new(Target::Process);
        let both = entries(&[("k", s(r#"a'b"c"#))]);
        assert_eq!(
            encode_node_config(&both, &p).unwrap_err(),
            NodeConfigError::BothQuotes { key: "k".into() }
        );
        let newline = entries(&[("k", s("a\nb"))]);
        assert!(matches!(
            encode_node_config(&newline, &p),
            Err(NodeConfigError::ControlCharacter { .. })
        ));
        for key in ["a b", "a=b", "", "a..b", ".a", "ключ"] {
            let bad = entries(&[(key, s("v"))]);
            assert!(
                matches!(
                    encode_node_config(&bad, &p),
                    Err(NodeConfigError::BadKey { .. })
                ),
                "{key:?}"
            );
        }
        let conflict = entries(&[("a", s("v")), ("a-b", s("x")), ("a.b", s("w"))]);
        assert!(matches!(
            encode_node_config(&conflict, &p),
            Err(NodeConfigError::KeyConflict { .. })
        ));
        assert_eq!(encode_node_config(&BTreeMap::new(), &p).unwrap(), None);
    }
}

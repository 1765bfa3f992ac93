//! Property tests on what enters from users: `nodeConfig` encoding round-trips
//! through Flower's own parsing rule, and manifest parsing never panics and round-trips the
//! Federations it accepts. Case counts are set per property (see `CASES_*`) to keep the suite
//! inside its time budget; the counts are printed by `cargo test -- --nocapture`.

use std::collections::BTreeMap;

use flower_addon_crds::NodeConfigValue;
use flower_addon_crds::render::placeholders::{Placeholders, Target};
use flower_addon_crds::render::{NodeConfigError, encode_node_config};
use flower_addon_crds::{Object, parse_documents};
use proptest::prelude::*;

const CASES_NODE_CONFIG: u32 = 50_000;
const CASES_PARSE_TEXT: u32 = 4_000;
const CASES_FEDERATION: u32 = 2_000;

/// `flwr.common.config.parse_config_args` for one argument: the regex pairs, one TOML line each.
fn flower_parse(config: &str) -> Result<toml::Table, toml::de::Error> {
    static PATTERN: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let pattern = PATTERN
        .get_or_init(|| regex::Regex::new(r#"(\S+?)=('[^']*'|"[^"]*"|\S+)"#).expect("regex"));
    let doc: Vec<String> = pattern
        .captures_iter(config)
        .map(|c| format!("{} = {}", &c[1], &c[2]))
        .collect();
    toml::from_str(&doc.join("\n"))
}

/// What Flower reads for a value: strings that are TOML integers or booleans are written bare
/// and read typed (that is how `{index}`-style values become integers).
fn expected(value: &NodeConfigValue) -> toml::Value {
    match value {
        NodeConfigValue::Bool(b) => toml::Value::Boolean(*b),
        NodeConfigValue::Int(i) => toml::Value::Integer(*i),
        NodeConfigValue::String(s) if s == "true" || s == "false" => {
            toml::Value::Boolean(s == "true")
        }
        NodeConfigValue::String(s) => {
            let digits = s.strip_prefix('-').unwrap_or(s);
            let integer = !digits.is_empty()
                && digits.chars().all(|c| c.is_ascii_digit())
                && (digits == "0" || !digits.starts_with('0'));
            match s.parse::<i64>() {
                Ok(i) if integer => toml::Value::Integer(i),
                _ => toml::Value::String(s.clone()),
            }
        }
    }
}

fn value() -> impl Strategy<Value = NodeConfigValue> {
    prop_oneof![
        any::<bool>().prop_map(NodeConfigValue::Bool),
        any::<i64>().prop_map(NodeConfigValue::Int),
        // Any text without placeholders braces: quotes, backslashes, spaces, `=`, unicode,
        // control characters (refused), numbers and booleans as strings.
        "[^{}]{0,24}".prop_map(NodeConfigValue::String),
        "-?[0-9]{1,20}".prop_map(NodeConfigValue::String),
        prop_oneof![Just("true"), Just("false")].prop_map(|s| NodeConfigValue::String(s.into())),
    ]
}

fn entries() -> impl Strategy<Value = BTreeMap<String, NodeConfigValue>> {
    prop::collection::btree_map("[A-Za-z0-9_-]{1,12}", value(), 0..6)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES_NODE_CONFIG, failure_persistence: None, ..ProptestConfig::default() })]

    /// Invariant: every nodeConfig the encoder accepts is read back by Flower's rule with the
    /// same keys and typed values; what it refuses is a value Flower cannot carry, named.
    #[test]
    fn node_config_round_trips_through_flowers_parser(entries in entries()) {
        let placeholders = Placeholders::new(Target::Process);
        match encode_node_config(&entries, &placeholders) {
            Ok(None) => prop_assert!(entries.is_empty()),
            Ok(Some(encoded)) => {
                let table = flower_parse(&encoded)
                    .map_err(|e| TestCaseError::fail(format!("{encoded:?}: {e}")))?;
                prop_assert_eq!(table.len(), entries.len(), "{:?}", encoded);
                for (key, value) in &entries {
                    prop_assert_eq!(table.get(key), Some(&expected(value)), "{:?}", encoded);
                }
            }
            Err(NodeConfigError::ControlCharacter { key }) => {
                let NodeConfigValue::String(s) = &entries[&key] else {
                    return Err(TestCaseError::fail("control character in a non-string"));
                };
                prop_assert!(s.chars().any(|c| c.is_control() && c != '\t'));
            }
            Err(NodeConfigError::BothQuotes { key }) => {
                let NodeConfigValue::String(s) = &entries[&key] else {
                    return Err(TestCaseError::fail("quotes in a non-string"));
                };
                prop_assert!(s.contains('"') && s.contains('\''));
            }
            Err(other) => return Err(TestCaseError::fail(format!("unexpected refusal: {other}"))),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES_PARSE_TEXT, failure_persistence: None, ..ProptestConfig::default() })]

    /// Invariant: any text given as a manifest file is parsed or refused with an error naming
    /// the file; it never panics.
    #[test]
    fn manifest_parsing_never_panics(text in "(apiVersion|kind|metadata|spec|name|replicas|pools|---|:|-|\\{|\\}|\\[|\\]|&a|\\*a|!!|\"|'| |\n|[a-z0-9.]{1,6}){0,40}") {
        if let Err(e) = parse_documents("f.yaml", &text) {
            prop_assert!(e.to_string().starts_with("f.yaml"), "{}", e);
        }
    }

    /// The same for arbitrary unicode.
    #[test]
    fn manifest_parsing_never_panics_on_any_text(text in "\\PC{0,200}") {
        if let Err(e) = parse_documents("f.yaml", &text) {
            prop_assert!(e.to_string().starts_with("f.yaml"), "{}", e);
        }
    }
}

fn federation_yaml() -> impl Strategy<Value = (String, String, Vec<(String, u32)>, bool)> {
    (
        "[a-z][a-z0-9-]{0,20}[a-z0-9]",
        "[a-z][a-z0-9-]{0,10}[a-z0-9]",
        prop::collection::vec(("[a-z][a-z0-9]{0,8}", 0u32..50), 1..5),
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES_FEDERATION, failure_persistence: None, ..ProptestConfig::default() })]

    /// Invariant: a Federation that parses serializes back to YAML that parses to the same
    /// Federation (what `render` and the standalone hub read is what was written).
    #[test]
    fn federations_round_trip_through_yaml((name, namespace, pools, insecure) in federation_yaml()) {
        let mut pools = pools;
        pools.sort();
        pools.dedup_by(|a, b| a.0 == b.0);
        let pools: Vec<String> = pools
            .iter()
            .map(|(p, r)| format!("{{name: {p}, replicas: {r}, images: {{}}}}"))
            .collect();
        let yaml = format!(
            "apiVersion: flower-addon.io/v1alpha1\nkind: Federation\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  mode: StatefulSet\n  isolationMode: subprocess\n  insecure: {insecure}\n  superlink: {{image: \"flwr/superlink:1.42.0\"}}\n  supernodes:\n    image: \"flwr/supernode:1.42.0\"\n    pools: [{}]\n",
            pools.join(", ")
        );
        let first = parse_documents("f.yaml", &yaml).map_err(|e| TestCaseError::fail(format!("{yaml}\n{e}")))?;
        let [Object::Federation(fed)] = &first[..] else {
            return Err(TestCaseError::fail(format!("{first:?}")));
        };
        let again_text = serde_saphyr::to_string(fed).expect("serializes");
        let again = parse_documents("f.yaml", &again_text)
            .map_err(|e| TestCaseError::fail(format!("{again_text}\n{e}")))?;
        let [Object::Federation(again)] = &again[..] else {
            return Err(TestCaseError::fail(format!("{again:?}")));
        };
        prop_assert_eq!(again, fed);
    }
}

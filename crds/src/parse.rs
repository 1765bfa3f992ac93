//! Reading our resources from YAML files (multi-document streams), for the offline CLI and the
//! standalone hub. Errors name the file and, where known, the line; bad input never panics.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::API_VERSION;
use crate::cluster::ManagedCluster;
use crate::clusterset::{ManagedClusterSet, ManagedClusterSetBinding};
use crate::federation::Federation;
use crate::placement::{Placement, PlacementDecision};
use crate::run::FlowerRun;

/// The kinds `parse_documents` accepts, as `apiVersion`/`kind` pairs.
pub const SUPPORTED_KINDS: [&str; 7] = [
    "Federation",
    "Placement",
    "PlacementDecision",
    "ManagedCluster",
    "ManagedClusterSet",
    "ManagedClusterSetBinding",
    "FlowerRun",
];

/// One parsed resource.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum Object {
    /// A `Federation`.
    Federation(Federation),
    /// A `Placement`.
    Placement(Placement),
    /// A `PlacementDecision`.
    PlacementDecision(PlacementDecision),
    /// A `ManagedCluster`.
    ManagedCluster(ManagedCluster),
    /// A `ManagedClusterSet`.
    ManagedClusterSet(ManagedClusterSet),
    /// A `ManagedClusterSetBinding`.
    ManagedClusterSetBinding(ManagedClusterSetBinding),
    /// A `FlowerRun`.
    FlowerRun(FlowerRun),
    /// A core `v1` `ConfigMap` (the FAB of a FlowerRun's `configMapRef`, so the same files
    /// serve both hub modes).
    ConfigMap(k8s_openapi::api::core::v1::ConfigMap),
}

impl Object {
    /// The object's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Federation(_) => "Federation",
            Self::Placement(_) => "Placement",
            Self::PlacementDecision(_) => "PlacementDecision",
            Self::ManagedCluster(_) => "ManagedCluster",
            Self::ManagedClusterSet(_) => "ManagedClusterSet",
            Self::ManagedClusterSetBinding(_) => "ManagedClusterSetBinding",
            Self::FlowerRun(_) => "FlowerRun",
            Self::ConfigMap(_) => "ConfigMap",
        }
    }

    /// The object's `metadata.name` (empty when unset).
    pub fn name(&self) -> &str {
        let meta = match self {
            Self::Federation(o) => &o.metadata,
            Self::Placement(o) => &o.metadata,
            Self::PlacementDecision(o) => &o.metadata,
            Self::ManagedCluster(o) => &o.metadata,
            Self::ManagedClusterSet(o) => &o.metadata,
            Self::ManagedClusterSetBinding(o) => &o.metadata,
            Self::FlowerRun(o) => &o.metadata,
            Self::ConfigMap(o) => &o.metadata,
        };
        meta.name.as_deref().unwrap_or("")
    }
}

/// Why a file could not be read as our resources.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ParseError {
    /// The file name given to `parse_documents`.
    pub file: String,
    /// 1-based line in the file, when known.
    pub line: Option<u64>,
    /// What is wrong.
    pub message: String,
}

/// Parses every YAML document of `text` (documents separated by `---`) into our resources.
/// Empty documents are skipped. Unknown fields, unknown `apiVersion`/`kind` and malformed YAML
/// are errors naming `file_name` and the line where known.
pub fn parse_documents(file_name: &str, text: &str) -> Result<Vec<Object>, ParseError> {
    let mut objects = Vec::new();
    for (first_line, doc) in split_documents(text) {
        let err = |line: Option<u64>, message: String| ParseError {
            file: file_name.to_string(),
            line,
            message,
        };
        // Header problems point at the document's first line of content, not at leading
        // comments or blank lines.
        let header_line = first_line
            + doc
                .lines()
                .take_while(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
                .count() as u64;
        let header: Value = serde_saphyr::from_str(&doc).map_err(|e| {
            let line = e
                .location()
                .map(|l| first_line + l.line().saturating_sub(1));
            err(
                line.or(Some(first_line)),
                format!("malformed YAML: {}", one_line(&e, first_line)),
            )
        })?;
        let map = match header {
            Value::Null => continue,
            Value::Object(map) => map,
            _ => {
                return Err(err(
                    Some(header_line),
                    "a document must be a mapping (a Kubernetes object)".into(),
                ));
            }
        };
        let api_version = map.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = map.get("kind").and_then(Value::as_str).unwrap_or("");
        let supported = || {
            SUPPORTED_KINDS
                .iter()
                .map(|k| format!("{API_VERSION} {k}"))
                .chain(["v1 ConfigMap".to_owned()])
                .collect::<Vec<_>>()
                .join(", ")
        };
        let config_map = api_version == "v1" && kind == "ConfigMap";
        if !config_map && (api_version != API_VERSION || !SUPPORTED_KINDS.contains(&kind)) {
            return Err(err(
                Some(header_line),
                format!(
                    "unsupported apiVersion {api_version:?} kind {kind:?}; supported: {}",
                    supported()
                ),
            ));
        }
        let top: &[&str] = if config_map {
            &[
                "apiVersion",
                "kind",
                "metadata",
                "data",
                "binaryData",
                "immutable",
            ]
        } else {
            &["apiVersion", "kind", "metadata", "spec", "status"]
        };
        if let Some(unknown) = map.keys().find(|k| !top.contains(&k.as_str())) {
            return Err(err(
                Some(header_line),
                format!("unknown field `{unknown}` at the top level of a {kind}"),
            ));
        }
        let typed = |e: serde_saphyr::Error| {
            let line = e
                .location()
                .map(|l| first_line + l.line().saturating_sub(1));
            err(
                line,
                format!("invalid {kind}: {}", one_line(&e, first_line)),
            )
        };
        let object = match kind {
            _ if config_map => Object::ConfigMap(typed_doc(&doc).map_err(typed)?),
            "Federation" => Object::Federation(typed_doc(&doc).map_err(typed)?),
            "Placement" => Object::Placement(typed_doc(&doc).map_err(typed)?),
            "PlacementDecision" => Object::PlacementDecision(typed_doc(&doc).map_err(typed)?),
            "ManagedClusterSet" => Object::ManagedClusterSet(typed_doc(&doc).map_err(typed)?),
            "ManagedClusterSetBinding" => {
                Object::ManagedClusterSetBinding(typed_doc(&doc).map_err(typed)?)
            }
            "FlowerRun" => Object::FlowerRun(typed_doc(&doc).map_err(typed)?),
            _ => Object::ManagedCluster(typed_doc(&doc).map_err(typed)?),
        };
        objects.push(object);
    }
    Ok(objects)
}

/// A parser error as one line (no source snippet), its line numbers counted in the file rather
/// than in the document that starts at `first_line`.
fn one_line(e: &serde_saphyr::Error, first_line: u64) -> String {
    let options = serde_saphyr::render_options! {
        snippets: serde_saphyr::SnippetMode::Off,
        line_offset: first_line.saturating_sub(1),
    };
    e.render_with_options(options)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn typed_doc<T: DeserializeOwned>(doc: &str) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_str(doc)
}

/// Splits a YAML stream at `---` / `...` lines (column 0, where YAML ends a document even inside a
/// block scalar), keeping each document's first line number so errors point into the file.
/// Separator lines are blanked, not removed, so line numbers inside a document stay right.
fn split_documents(text: &str) -> Vec<(u64, String)> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut start = 1u64;
    for (i, line) in text.lines().enumerate() {
        let lineno = i as u64 + 1;
        let is_start = line == "---" || line.starts_with("--- ") || line.starts_with("---\t");
        let is_end = line == "..." || line.starts_with("... ");
        if is_start || is_end {
            if !current.trim().is_empty() {
                docs.push((start, std::mem::take(&mut current)));
            }
            current.clear();
            start = lineno + 1;
            if is_start {
                // Content after `--- ` on the same line belongs to the next document.
                let rest = line[3..].trim_start();
                if !rest.is_empty() && !rest.starts_with('#') {
                    start = lineno;
                    current.push_str(rest);
                    current.push('\n');
                }
            }
            continue;
        }
        current.push_str(line);
        current.push('\n');
    }
    if !current.trim().is_empty() {
        docs.push((start, current));
    }
    docs
}

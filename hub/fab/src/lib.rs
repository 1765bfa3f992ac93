//! Flower App Bundles (FABs), the zip a run's app travels in to a SuperLink (Control API
//! `StartRun` with `Fab { hash_str, content }`), and the run-config overrides sent with it.
//!
//! - [`build_from_files`] / [`build_from_dir`] make the FAB `flwr build` of Flower 1.42 makes,
//!   byte for byte (so the same sha256 that `flwr build` prints and the SuperLink computes): the
//!   same files (publish rules, the app's `.gitignore`, `fab-include`/`fab-exclude`, Flower's
//!   built-in patterns), pyproject.toml rewritten as `tomli_w` writes it without
//!   `[tool.flwr.federations]`, and CPython `zipfile`'s layout.
//! - [`read`] checks a FAB the hub is given as Flower's SuperLink and installer would, and more
//!   strictly where Flower would only fail later (the manifest, unsafe paths).
//! - [`parse_run_config`] reads `flwr run --run-config` text as Flower does, and
//!   [`check_overrides`] holds overrides to the app's `[tool.flwr.app.config]`.
//!
//! Everything here is pure but [`build_from_dir`], which only lists and reads the app's files.

mod build;
mod pathspec;
mod pyproject;
mod read;
mod run_config;
mod toml;
mod zip;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use build::{build_from_dir, build_from_files};
pub use read::read;
pub use run_config::{RunConfigError, check_overrides, parse_run_config};

/// The largest FAB Flower builds or accepts (`FAB_MAX_SIZE`, 10 MiB).
pub const FAB_MAX_SIZE: usize = 10 * 1024 * 1024;

/// One run-config value (Flower's `UserConfigValue`, sent as a protobuf `Scalar`). In JSON and
/// YAML it is the plain value (`true`, `3`, `0.5`, `"x"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ConfigValue {
    /// A boolean (`Scalar.bool`).
    Bool(bool),
    /// An integer (`Scalar.sint64`).
    Int(i64),
    /// A float (`Scalar.double`).
    Float(f64),
    /// A string (`Scalar.string`).
    Str(String),
}

// === impl ConfigValue ===

impl ConfigValue {
    /// The value's type for messages: "a boolean", "an integer", "a float" or "a string".
    pub fn kind(&self) -> &'static str {
        match self {
            ConfigValue::Bool(_) => "a boolean",
            ConfigValue::Int(_) => "an integer",
            ConfigValue::Float(_) => "a float",
            ConfigValue::Str(_) => "a string",
        }
    }

    /// The scalar a TOML value is, if it is one.
    fn from_toml(v: &toml::Toml) -> Option<Self> {
        match v {
            toml::Toml::Bool(b) => Some(ConfigValue::Bool(*b)),
            toml::Toml::Int(i) => Some(ConfigValue::Int(*i)),
            toml::Toml::Float(f) => Some(ConfigValue::Float(*f)),
            toml::Toml::Str(s) => Some(ConfigValue::Str(s.clone())),
            _ => None,
        }
    }
}

/// The value as a TOML literal (`true`, `3`, `0.05`, `1e+16`, `"text"`), as `tomli_w` writes it
/// and `--run-config` reads it back.
impl fmt::Display for ConfigValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigValue::Bool(b) => write!(f, "{b}"),
            ConfigValue::Int(i) => write!(f, "{i}"),
            ConfigValue::Float(x) => f.write_str(&toml::py_float_repr(*x)),
            ConfigValue::Str(s) => f.write_str(&toml::quote(s)),
        }
    }
}

/// A checked FAB and what Flower reads from it.
#[derive(Clone, PartialEq)]
pub struct Fab {
    /// The archive.
    pub bytes: Vec<u8>,
    /// Lowercase hex sha256 of [`Fab::bytes`] (`Fab.hash_str`).
    pub hash: String,
    /// `publisher/name` from pyproject.toml.
    pub fab_id: String,
    /// `[project] version`.
    pub version: String,
    /// `[tool.flwr.app.config]` flattened with dotted keys, as Flower flattens it.
    pub config: BTreeMap<String, ConfigValue>,
}

/// Without the archive's bytes.
impl fmt::Debug for Fab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fab")
            .field("bytes", &format_args!("<{} bytes>", self.bytes.len()))
            .field("hash", &self.hash)
            .field("fab_id", &self.fab_id)
            .field("version", &self.version)
            .field("config", &self.config)
            .finish()
    }
}

/// Why a FAB cannot be built or is not acceptable; each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum FabError {
    /// Over [`FAB_MAX_SIZE`].
    #[error(
        "the FAB is {} ({size} bytes); Flower accepts at most 10 MB ({FAB_MAX_SIZE} bytes): narrow `fab-include` or add `fab-exclude` patterns in [tool.flwr.app], or list large files in the app's .gitignore",
        megabytes(*.size)
    )]
    TooLarge {
        /// The FAB's size in bytes.
        size: usize,
    },
    /// More entries than a plain zip holds.
    #[error(
        "the app has {count} files to bundle; a FAB holds at most 65,533: exclude generated files in .gitignore or with `fab-exclude`"
    )]
    TooManyFiles {
        /// How many files were selected.
        count: usize,
    },
    /// Not a zip archive Python's `zipfile` reads.
    #[error(
        "the FAB is not a zip archive Flower can read ({reason}): give the .fab file that `flwr build` writes"
    )]
    NotZip {
        /// What is wrong with it.
        reason: String,
    },
    /// One entry of the archive cannot be read.
    #[error("FAB entry `{name}` {reason}: rebuild the FAB with `flwr build`")]
    Entry {
        /// The entry's name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file path a FAB cannot hold.
    #[error("path `{path}` {reason}")]
    BadPath {
        /// The path.
        path: String,
        /// Why, and what to do.
        reason: &'static str,
    },
    /// The same path twice in one FAB.
    #[error("FAB entry `{path}` appears twice: rebuild the FAB with `flwr build`")]
    DuplicateEntry {
        /// The path.
        path: String,
    },
    /// Deeper than Flower allows (`MAX_DIR_DEPTH`).
    #[error(
        "`{path}` is more than 10 directories deep, which Flower refuses: flatten the app's layout, or list it in the app's .gitignore if it is not part of the app"
    )]
    TooDeep {
        /// The path.
        path: String,
    },
    /// The app directory does not exist or is not a directory.
    #[error(
        "{} is not a directory: give the Flower app's directory (the one holding pyproject.toml)",
        .path.display()
    )]
    NotADirectory {
        /// The path given.
        path: PathBuf,
    },
    /// Reading the app's files failed.
    #[error("reading {}: {source}", .path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// No pyproject.toml at the top.
    #[error(
        "no pyproject.toml at the top of the {place}: a Flower app is a directory with pyproject.toml at its top level"
    )]
    PyprojectMissing {
        /// "app" or "FAB".
        place: &'static str,
    },
    /// pyproject.toml is matched by the app's .gitignore.
    #[error(
        "pyproject.toml is excluded by the app's .gitignore: remove the pattern that matches it, since a FAB needs it"
    )]
    PyprojectIgnored,
    /// pyproject.toml is not UTF-8.
    #[error("pyproject.toml is not UTF-8 text: save it as UTF-8")]
    PyprojectEncoding,
    /// pyproject.toml is not TOML.
    #[error(
        "pyproject.toml is not valid TOML ({reason}): correct it there (Flower reads TOML 1.1)"
    )]
    PyprojectSyntax {
        /// The parser's message.
        reason: String,
    },
    /// A required table is missing.
    #[error("pyproject.toml has no [{table}] table: {purpose}")]
    MissingTable {
        /// The table, dotted.
        table: &'static str,
        /// What Flower needs it for (and an example).
        purpose: &'static str,
    },
    /// A required field is missing.
    #[error("pyproject.toml has no `{field}` in [{table}]: add it, e.g. {example}")]
    MissingField {
        /// The table, dotted.
        table: &'static str,
        /// The field.
        field: &'static str,
        /// A line to add.
        example: &'static str,
    },
    /// A field of the wrong type.
    #[error("pyproject.toml `{field}` is {found}; Flower needs {expected}")]
    FieldType {
        /// The field, dotted.
        field: String,
        /// What it must be.
        expected: &'static str,
        /// What it is.
        found: &'static str,
    },
    /// An app name `flwr build` refuses.
    #[error(
        "[project] name `{name}` is invalid: a Flower app name starts with a letter, holds only letters, digits and hyphens, and has at most 32 characters"
    )]
    InvalidName {
        /// The name.
        name: String,
    },
    /// A publisher that cannot form a FAB id.
    #[error(
        "[tool.flwr.app] publisher `{publisher}` is invalid: give a non-empty name without `/` (the FAB id is publisher/name)"
    )]
    InvalidPublisher {
        /// The publisher.
        publisher: String,
    },
    /// A component reference without module or attribute.
    #[error(
        "[tool.flwr.app.components] {component} = \"{value}\" is not an object reference: write `module:attribute`, e.g. \"my_app.server_app:app\""
    )]
    ComponentRef {
        /// `serverapp`, `clientapp` or `agentapp`.
        component: &'static str,
        /// The reference.
        value: String,
    },
    /// A run-config default that is not a scalar.
    #[error(
        "[tool.flwr.app.config] `{key}` is {found}; run-config values are booleans, integers, floats or strings (nested tables become dotted keys)"
    )]
    ConfigValue {
        /// The dotted key.
        key: String,
        /// What it is.
        found: &'static str,
    },
    /// A malformed `fab-include` / `fab-exclude`.
    #[error("[tool.flwr.app] `{key}` {reason}")]
    PatternList {
        /// `fab-include` or `fab-exclude`.
        key: &'static str,
        /// What is wrong, and what to do.
        reason: &'static str,
    },
    /// A pattern Flower's pattern matcher refuses.
    #[error("{source_name} pattern `{pattern}` is invalid ({reason}): correct it or remove it")]
    Pattern {
        /// Where it comes from (`.gitignore`, `fab-include`, …).
        source_name: &'static str,
        /// The pattern.
        pattern: String,
        /// The matcher's reason.
        reason: String,
    },
    /// A `fab-include` / `fab-exclude` pattern that selects nothing (Flower refuses these).
    #[error(
        "`{key}` pattern `{pattern}` in [tool.flwr.app] matches no file: correct the pattern or remove it"
    )]
    PatternUnmatched {
        /// `fab-include` or `fab-exclude`.
        key: &'static str,
        /// The pattern.
        pattern: String,
    },
    /// `fab-include` selects files of a kind no FAB holds.
    #[error(
        "`fab-include` selects files a FAB never holds (only *.py, *.toml, *.md, *.yaml, *.yml, *.json, *.jsonl and /LICENSE): {}; remove the patterns that select them from `fab-include`",
        .files.join(", ")
    )]
    BuiltInConflict {
        /// The files.
        files: Vec<String>,
    },
    /// `fab-format-version` rules.
    #[error("[tool.flwr.app] fab-format-version: {reason}")]
    FabFormat {
        /// What is wrong, and what to do.
        reason: String,
    },
    /// `[project] dependencies` rules.
    #[error("[project] dependencies {reason}")]
    Dependencies {
        /// What is wrong, and what to do.
        reason: String,
    },
    /// No `.info/CONTENT` manifest.
    #[error(
        "the FAB has no .info/CONTENT manifest, so Flower cannot verify it (\"File hashes couldn't be verified\"): build it with `flwr build`"
    )]
    NoManifest,
    /// A malformed `.info/CONTENT`.
    #[error("the FAB's .info/CONTENT manifest {reason}: rebuild the FAB with `flwr build`")]
    Manifest {
        /// What is wrong.
        reason: String,
    },
    /// An entry that differs from its manifest line.
    #[error(
        "FAB entry `{path}` does not match .info/CONTENT ({reason}): the FAB changed after it was built; rebuild it with `flwr build`"
    )]
    ManifestMismatch {
        /// The path.
        path: String,
        /// Which field differs.
        reason: String,
    },
    /// An entry the manifest does not list.
    #[error(
        "FAB entry `{path}` is not listed in .info/CONTENT, so Flower would install it unverified: rebuild the FAB with `flwr build`"
    )]
    Unlisted {
        /// The path.
        path: String,
    },
}

/// A size in MiB with one decimal, as "12.3 MB".
fn megabytes(size: usize) -> String {
    format!("{:.1} MB", size as f64 / (1024.0 * 1024.0))
}

/// Whether `path` is a plain relative POSIX path (`a/b.py`): no leading `/`, no empty, `.` or
/// `..` parts, no backslash or NUL.
fn is_plain_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.contains(['\\', '\0'])
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

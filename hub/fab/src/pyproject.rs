//! The checks Flower 1.42 makes of an app's pyproject.toml (`validate_config(config,
//! check_module=False)`, `validate_project_name`, `normalize_and_validate_fab_format`), run on
//! both the app a FAB is built from and the pyproject.toml inside a FAB it is given.

use std::collections::BTreeMap;

use super::pathspec::py_isspace;
use super::toml::{self, Table, Toml};
use super::{ConfigValue, FabError};

/// Flower's limit on an app's name (`MAX_NAME_LENGTH`).
const MAX_NAME_LENGTH: usize = 32;
/// The pattern keys of `[tool.flwr.app]`.
pub const FAB_INCLUDE_KEY: &str = "fab-include";
/// See [`FAB_INCLUDE_KEY`].
pub const FAB_EXCLUDE_KEY: &str = "fab-exclude";

/// A checked pyproject.toml.
#[derive(Clone, Debug)]
pub struct App {
    /// The whole document, in order.
    pub doc: Table,
    /// `[project] name`.
    pub name: String,
    /// `[project] version`.
    pub version: String,
    /// `[tool.flwr.app] publisher`.
    pub publisher: String,
    /// `[tool.flwr.app.config]`, flattened with dotted keys.
    pub config: BTreeMap<String, ConfigValue>,
    /// `[tool.flwr.app] fab-include`, if set.
    pub include: Option<Vec<String>>,
    /// `[tool.flwr.app] fab-exclude`, if set.
    pub exclude: Option<Vec<String>>,
    /// The license file a `fab-format-version = 1` app must ship.
    pub license_file: Option<String>,
}

// === impl App ===

impl App {
    /// Reads and checks pyproject.toml's bytes. `building`: the app name is held to
    /// `flwr build`'s rule too (a FAB made by an older `flwr` may carry any name).
    pub fn parse(bytes: &[u8], building: bool) -> Result<Self, FabError> {
        let text = std::str::from_utf8(bytes).map_err(|_| FabError::PyprojectEncoding)?;
        let doc = toml::parse(text).map_err(|e| FabError::PyprojectSyntax {
            reason: e.to_string(),
        })?;

        let project = table_at(
            &doc,
            "project",
            &["project"],
            "a Flower app declares its name and version there",
        )?;
        let name = string_field(project, "project", "name", "name = \"my-app\"")?;
        if building {
            check_name(&name)?;
        } else if name.is_empty() || name.contains('/') {
            return Err(FabError::InvalidName { name });
        }
        let version = string_field(project, "project", "version", "version = \"1.0.0\"")?;
        if version.trim_matches(py_isspace).is_empty() {
            return Err(FabError::MissingField {
                table: "project",
                field: "version",
                example: "version = \"1.0.0\"",
            });
        }

        let app = table_at(
            &doc,
            "tool.flwr.app",
            &["tool", "flwr", "app"],
            "a Flower app declares publisher and components there",
        )?;
        let publisher = string_field(app, "tool.flwr.app", "publisher", "publisher = \"my-org\"")?;
        if publisher.is_empty() || publisher.contains('/') {
            return Err(FabError::InvalidPublisher { publisher });
        }
        let include = pattern_list(app, FAB_INCLUDE_KEY)?;
        let exclude = pattern_list(app, FAB_EXCLUDE_KEY)?;
        let mut config = BTreeMap::new();
        match toml::get(app, "config") {
            None => {}
            Some(Toml::Table(t)) => flatten(t, "", &mut config)?,
            Some(other) => {
                return Err(FabError::FieldType {
                    field: "tool.flwr.app.config".to_owned(),
                    expected: "a table of run-config values",
                    found: other.kind(),
                });
            }
        }
        check_components(app)?;
        let license_file = check_fab_format(&doc, app)?;
        Ok(Self {
            doc,
            name,
            version,
            publisher,
            config,
            include,
            exclude,
            license_file,
        })
    }

    /// `publisher/name`, the FAB id Flower records for a run.
    pub fn fab_id(&self) -> String {
        format!("{}/{}", self.publisher, self.name)
    }

    /// The document `flwr build` writes into a FAB: without `[tool.flwr.federations]`
    /// (connection settings stay on the submitter's machine).
    pub fn without_federations(&self) -> Table {
        let mut doc = self.doc.clone();
        if let Some(flwr) = table_mut(&mut doc, &["tool", "flwr"]) {
            flwr.retain(|(k, _)| k != "federations");
        }
        doc
    }
}

/// `validate_project_name`: starts with a letter; letters, digits and hyphens; at most 32
/// characters (Flower also strips surrounding whitespace but then uses the name unstripped in the
/// FAB id, so we refuse it).
fn check_name(name: &str) -> Result<(), FabError> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(char::is_alphabetic)
        && chars.all(|c| c.is_alphanumeric() || c == '-')
        && name.chars().count() <= MAX_NAME_LENGTH;
    if valid {
        Ok(())
    } else {
        Err(FabError::InvalidName {
            name: name.to_owned(),
        })
    }
}

fn table_at<'a>(
    doc: &'a Table,
    display: &'static str,
    path: &[&str],
    purpose: &'static str,
) -> Result<&'a Table, FabError> {
    let mut table = doc;
    for (i, key) in path.iter().enumerate() {
        match toml::get(table, key) {
            Some(Toml::Table(t)) => table = t,
            None => {
                return Err(FabError::MissingTable {
                    table: display,
                    purpose,
                });
            }
            Some(other) => {
                return Err(FabError::FieldType {
                    field: path[..=i].join("."),
                    expected: "a table",
                    found: other.kind(),
                });
            }
        }
    }
    Ok(table)
}

fn table_mut<'a>(doc: &'a mut Table, path: &[&str]) -> Option<&'a mut Table> {
    let mut table = doc;
    for key in path {
        let (_, value) = table.iter_mut().find(|(k, _)| k == key)?;
        match value {
            Toml::Table(t) => table = t,
            _ => return None,
        }
    }
    Some(table)
}

fn string_field(
    table: &Table,
    display: &'static str,
    field: &'static str,
    example: &'static str,
) -> Result<String, FabError> {
    match toml::get(table, field) {
        Some(Toml::Str(s)) => Ok(s.clone()),
        None => Err(FabError::MissingField {
            table: display,
            field,
            example,
        }),
        Some(other) => Err(FabError::FieldType {
            field: format!("{display}.{field}"),
            expected: "a string",
            found: other.kind(),
        }),
    }
}

/// `check_pattern_list_value`: absent, or a non-empty list of non-blank strings.
fn pattern_list(app: &Table, key: &'static str) -> Result<Option<Vec<String>>, FabError> {
    let Some(value) = toml::get(app, key) else {
        return Ok(None);
    };
    let reason = match value {
        Toml::Array(items) if items.is_empty() => {
            "must not be an empty list: remove the key to use Flower's built-in patterns, or give at least one pattern"
        }
        Toml::Array(items) => {
            let patterns: Option<Vec<String>> = items
                .iter()
                .map(|v| match v {
                    Toml::Str(s) if !s.trim_matches(py_isspace).is_empty() => Some(s.clone()),
                    _ => None,
                })
                .collect();
            match patterns {
                Some(p) => return Ok(Some(p)),
                None => "must hold only non-empty strings (gitignore-style patterns)",
            }
        }
        _ => "must be a list of strings (gitignore-style patterns), e.g. [\"**/*.py\"]",
    };
    Err(FabError::PatternList { key, reason })
}

/// `flatten_dict`: nested tables become dotted keys; anything but a scalar is refused. A later
/// duplicate (`"a.b" = 1` beside `[a] b = 2`) wins, as in Flower.
pub fn flatten(
    table: &Table,
    prefix: &str,
    out: &mut BTreeMap<String, ConfigValue>,
) -> Result<(), FabError> {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match ConfigValue::from_toml(v) {
            Some(value) => {
                out.insert(key, value);
            }
            None => match v {
                Toml::Table(t) => flatten(t, &key, out)?,
                other => {
                    return Err(FabError::ConfigValue {
                        key,
                        found: other.kind(),
                    });
                }
            },
        }
    }
    Ok(())
}

/// `[tool.flwr.app.components]`: `serverapp` and `clientapp` (or an `agentapp`), each a
/// `module:attribute` reference.
fn check_components(app: &Table) -> Result<(), FabError> {
    const PURPOSE: &str = "a Flower app names its ServerApp and ClientApp there, e.g. \
                           serverapp = \"my_app.server_app:app\"";
    let components = match toml::get(app, "components") {
        Some(Toml::Table(t)) => t,
        None => {
            return Err(FabError::MissingTable {
                table: "tool.flwr.app.components",
                purpose: PURPOSE,
            });
        }
        Some(other) => {
            return Err(FabError::FieldType {
                field: "tool.flwr.app.components".to_owned(),
                expected: "a table",
                found: other.kind(),
            });
        }
    };
    let agentapp = toml::get(components, "agentapp").is_some();
    if !agentapp {
        for (field, example) in [
            ("serverapp", "serverapp = \"my_app.server_app:app\""),
            ("clientapp", "clientapp = \"my_app.client_app:app\""),
        ] {
            if toml::get(components, field).is_none() {
                return Err(FabError::MissingField {
                    table: "tool.flwr.app.components",
                    field,
                    example,
                });
            }
        }
    }
    for component in ["agentapp", "serverapp", "clientapp"] {
        let Some(value) = toml::get(components, component) else {
            continue;
        };
        let Toml::Str(reference) = value else {
            return Err(FabError::FieldType {
                field: format!("tool.flwr.app.components.{component}"),
                expected: "a string `module:attribute`",
                found: value.kind(),
            });
        };
        let (module, attribute) = reference.split_once(':').unwrap_or((reference, ""));
        if module.is_empty() || attribute.is_empty() {
            return Err(FabError::ComponentRef {
                component,
                value: reference.clone(),
            });
        }
    }
    Ok(())
}

/// `normalize_and_validate_fab_format`: format 0 (the default) only checks the dependency list;
/// format 1 also needs `flwr-version-target`, a license file and a `flwr>=` dependency. Returns
/// the license file a format-1 FAB must contain. (Flower also compares the target with the
/// `flwr` specifiers by PEP 440; that comparison is left to Flower.)
fn check_fab_format(doc: &Table, app: &Table) -> Result<Option<String>, FabError> {
    let format = match toml::get(app, "fab-format-version") {
        None => 0,
        Some(Toml::Int(v)) if *v >= 0 => *v,
        Some(_) => {
            return Err(FabError::FabFormat {
                reason: "must be a non-negative integer".to_owned(),
            });
        }
    };
    let project = toml::get(doc, "project").and_then(Toml::as_table);
    let flwr_dependency = flwr_dependency(project)?;
    match format {
        0 => Ok(None),
        1 => {
            match toml::get(app, "flwr-version-target") {
                Some(Toml::Str(_)) => {}
                None => {
                    return Err(FabError::FabFormat {
                        reason: "fab-format-version = 1 needs flwr-version-target in [tool.flwr.app], e.g. flwr-version-target = \"1.42.0\"".to_owned(),
                    });
                }
                Some(other) => {
                    return Err(FabError::FabFormat {
                        reason: format!(
                            "flwr-version-target must be a string, not {}",
                            other.kind()
                        ),
                    });
                }
            }
            let license = project.and_then(|p| toml::get(p, "license"));
            let file = match license {
                Some(Toml::Table(t)) => match toml::get(t, "file") {
                    Some(Toml::Str(f)) if f == "LICENSE" || f == "LICENSE.md" => f.clone(),
                    _ => {
                        return Err(FabError::FabFormat {
                            reason: LICENSE_NEEDED.to_owned(),
                        });
                    }
                },
                _ => {
                    return Err(FabError::FabFormat {
                        reason: LICENSE_NEEDED.to_owned(),
                    });
                }
            };
            match flwr_dependency {
                Some(spec) if spec.contains(">=") => Ok(Some(file)),
                Some(_) => Err(FabError::FabFormat {
                    reason: "fab-format-version = 1 needs a lower bound on flwr in [project] dependencies, e.g. \"flwr>=1.42.0\"".to_owned(),
                }),
                None => Err(FabError::FabFormat {
                    reason: "fab-format-version = 1 needs a flwr dependency in [project] dependencies, e.g. \"flwr>=1.42.0\"".to_owned(),
                }),
            }
        }
        other => Err(FabError::FabFormat {
            reason: format!("version {other} is not supported (Flower 1.42 knows 0 and 1)"),
        }),
    }
}

const LICENSE_NEEDED: &str = "fab-format-version = 1 needs [project] license = { file = \"LICENSE\" } \
                              (or \"LICENSE.md\"), a file at the app's top level";

/// The version specifiers of the one `flwr` requirement in `[project] dependencies` (if any);
/// the list must hold strings and at most one `flwr` (as Flower's packaging check).
fn flwr_dependency(project: Option<&Table>) -> Result<Option<String>, FabError> {
    let Some(dependencies) = project.and_then(|p| toml::get(p, "dependencies")) else {
        return Ok(None);
    };
    let Toml::Array(items) = dependencies else {
        return Err(FabError::Dependencies {
            reason: "must be a list of requirement strings, e.g. [\"flwr>=1.42.0\"]".to_owned(),
        });
    };
    let mut flwr = Vec::new();
    for item in items {
        let Toml::Str(requirement) = item else {
            return Err(FabError::Dependencies {
                reason: format!("must hold only strings, not {}", item.kind()),
            });
        };
        let text = requirement.trim_start();
        let name_len = text
            .find(|c: char| !(c.is_ascii_alphanumeric() || "._-".contains(c)))
            .unwrap_or(text.len());
        let name = text[..name_len].trim_end_matches(['.', '_', '-']);
        if name.is_empty() {
            return Err(FabError::Dependencies {
                reason: format!(
                    "\"{requirement}\" is not a requirement (PEP 508), e.g. \"numpy>=1.26\""
                ),
            });
        }
        if name == "flwr" {
            flwr.push(text[name.len()..].to_owned());
        }
    }
    if flwr.len() > 1 {
        return Err(FabError::Dependencies {
            reason: "declare flwr once (Flower refuses several flwr requirements)".to_owned(),
        });
    }
    Ok(flwr.pop())
}

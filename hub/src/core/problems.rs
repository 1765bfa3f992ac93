//! What keeps a Federation from being applied, the same in both hub modes and in
//! `flower-hub validate`: the CRD's own rules first, then what the renderer would refuse.
use flower_addon_crds::{Federation, validate_federation};

use crate::core::render::render_problems;

/// Problems that keep a Federation from being applied, as `(field path, message)`.
pub fn problems(fed: &Federation) -> Vec<(String, String)> {
    let errors = validate_federation(fed);
    if errors.is_empty() {
        render_problems(fed)
    } else {
        errors.into_iter().map(|e| (e.path, e.message)).collect()
    }
}

/// The problems as one line, `path: message; …`.
pub fn joined(problems: &[(String, String)]) -> String {
    problems
        .iter()
        .map(|(p, m)| format!("{p}: {m}"))
        .collect::<Vec<_>>()
        .join("; ")
}

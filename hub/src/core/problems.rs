//! What keeps a Federation from being applied, the same in both hub modes and in
//! `flower-hub validate`: the CRD's own rules first, then what the renderer would refuse, then
//! what the hub's pod policy refuses.
use flower_addon_crds::policy::PodPolicy;
use flower_addon_crds::{Federation, validate_federation};

use crate::core::render::{policy_problems, render_problems};

/// Problems that keep a Federation from being applied, as `(field path, message)`: the CRD's
/// rules, then the renderer's, then what the hub's pod `policy` refuses in the pods it would
/// make in the hub cluster ([`policy_problems`]).
pub fn problems(fed: &Federation, policy: &PodPolicy) -> Vec<(String, String)> {
    let errors = validate_federation(fed);
    if !errors.is_empty() {
        return errors.into_iter().map(|e| (e.path, e.message)).collect();
    }
    let render = render_problems(fed);
    if !render.is_empty() {
        return render;
    }
    policy_problems(fed, policy)
}

/// The problems as one line, `path: message; …`.
pub fn joined(problems: &[(String, String)]) -> String {
    problems
        .iter()
        .map(|(p, m)| format!("{p}: {m}"))
        .collect::<Vec<_>>()
        .join("; ")
}

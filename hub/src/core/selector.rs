//! Kubernetes label selectors over a cluster's labels (or claims): what a Placement, a cluster set
//! and a pool's `clusterSelector` select by.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// True when `labels` satisfy the Kubernetes label selector (an empty selector matches all).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
        && selector
            .match_expressions
            .iter()
            .flatten()
            .all(|req| requirement_matches(req, labels))
}

pub(super) fn requirement_matches(
    req: &LabelSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let values = req.values.as_deref().unwrap_or(&[]);
    let value = labels.get(&req.key);
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        // Unknown operators match nothing; validation reports them before we get here.
        _ => false,
    }
}

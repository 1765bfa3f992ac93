//! Validation of a Placement (the CRD schema's rules plus what the schema cannot say).
use super::*;
use crate::placement::Toleration;
use crate::{ClusterPredicate, PrioritizerPolicy};

/// Validates a Placement: what its schema enforces and what OCM rejects as misconfigured.
pub fn validate_placement(placement: &Placement) -> Vec<FieldError> {
    let spec = &placement.spec;
    let mut errors = Vec::new();
    check_object_names(&mut errors, &placement.metadata);
    if spec.cluster_sets.len() > 32 {
        errors.push(FieldError::new(
            "spec.clusterSets",
            "must have at most 32 items",
        ));
    }
    for (i, set) in spec.cluster_sets.iter().enumerate() {
        if let Err(why) = check_dns_label(set) {
            errors.push(FieldError::new(format!("spec.clusterSets[{i}]"), why));
        }
    }
    if spec.predicates.len() > 32 {
        errors.push(FieldError::new(
            "spec.predicates",
            "must have at most 32 items",
        ));
    }
    if let Some(n) = spec.number_of_clusters
        && n < 0
    {
        errors.push(FieldError::new(
            "spec.numberOfClusters",
            "must be greater than or equal to 0",
        ));
    }
    for (i, pred) in spec.predicates.iter().enumerate() {
        check_predicate(&mut errors, i, pred);
    }
    if let Some(policy) = &spec.prioritizer_policy {
        check_prioritizers(&mut errors, policy);
    }
    if spec.tolerations.len() > 32 {
        errors.push(FieldError::new(
            "spec.tolerations",
            "must have at most 32 items",
        ));
    }
    for (i, t) in spec.tolerations.iter().enumerate() {
        check_toleration(&mut errors, i, t);
    }
    errors
}

/// `spec.predicates[i]`: each selector requirement of its required cluster selector.
fn check_predicate(errors: &mut Vec<FieldError>, i: usize, pred: &ClusterPredicate) {
    let Some(sel) = &pred.required_cluster_selector else {
        return;
    };
    let at = format!("spec.predicates[{i}].requiredClusterSelector");
    if let Some(ls) = &sel.label_selector {
        for (j, req) in ls.match_expressions.iter().flatten().enumerate() {
            check_selector_requirement(
                errors,
                &format!("{at}.labelSelector.matchExpressions[{j}]"),
                &req.operator,
                req.values.as_deref().unwrap_or(&[]),
            );
        }
    }
    if let Some(cs) = &sel.claim_selector {
        for (j, req) in cs.match_expressions.iter().enumerate() {
            check_selector_requirement(
                errors,
                &format!("{at}.claimSelector.matchExpressions[{j}]"),
                &req.operator,
                req.values.as_deref().unwrap_or(&[]),
            );
        }
    }
}

/// `spec.prioritizerPolicy.configurations`: built-in prioritizers only, weights in -10..=10.
fn check_prioritizers(errors: &mut Vec<FieldError>, policy: &PrioritizerPolicy) {
    for (i, config) in policy.configurations.iter().enumerate() {
        let at = format!("spec.prioritizerPolicy.configurations[{i}]");
        let coordinate = &config.score_coordinate;
        match coordinate.type_ {
                ScoreCoordinateType::AddOn => errors.push(FieldError::new(
                    format!("{at}.scoreCoordinate.type"),
                    "AddOn scores (OCM's AddOnPlacementScore) are not served by flower-addon; use type BuiltIn with one of Balance, Steady, ResourceAllocatableCPU, ResourceAllocatableMemory",
                )),
                ScoreCoordinateType::BuiltIn => match coordinate.built_in.as_deref() {
                    Some(name) if BUILT_IN_PRIORITIZERS.contains(&name) => {}
                    Some(name) => errors.push(FieldError::new(
                        format!("{at}.scoreCoordinate.builtIn"),
                        format!(
                            "unknown prioritizer {name:?}: use one of {}",
                            BUILT_IN_PRIORITIZERS.join(", ")
                        ),
                    )),
                    None => errors.push(FieldError::new(
                        format!("{at}.scoreCoordinate.builtIn"),
                        format!(
                            "required with type BuiltIn: one of {}",
                            BUILT_IN_PRIORITIZERS.join(", ")
                        ),
                    )),
                },
            }
        if !(-10..=10).contains(&config.weight) {
            errors.push(FieldError::new(
                format!("{at}.weight"),
                "must be between -10 and 10",
            ));
        }
    }
}

/// `spec.tolerations[i]`.
fn check_toleration(errors: &mut Vec<FieldError>, i: usize, t: &Toleration) {
    let at = format!("spec.tolerations[{i}]");
    let key_empty = t.key.as_deref().unwrap_or("").is_empty();
    match t.operator.unwrap_or(TolerationOperator::Equal) {
        TolerationOperator::Exists if t.value.as_deref().is_some_and(|v| !v.is_empty()) => {
            errors.push(FieldError::new(
                format!("{at}.value"),
                "must be empty when operator is Exists",
            ));
        }
        TolerationOperator::Equal if key_empty => errors.push(FieldError::new(
            format!("{at}.key"),
            "must be set when operator is Equal",
        )),
        _ => {}
    }
    // OCM's own taint keys never appear on this hub's clusters: tolerating them would
    // silently not keep a cluster through an outage.
    if let Some(ours) = t.key.as_deref().and_then(|k| match k {
        "cluster.open-cluster-management.io/unreachable" => Some(crate::TAINT_UNREACHABLE),
        "cluster.open-cluster-management.io/unavailable" => Some(crate::TAINT_UNAVAILABLE),
        _ => None,
    }) {
        errors.push(FieldError::new(
            format!("{at}.key"),
            format!(
                "{:?} is OCM's taint, which this hub never sets: tolerate {ours:?} instead",
                t.key.as_deref().unwrap_or_default()
            ),
        ));
    }
    if t.toleration_seconds.is_some_and(|s| s < 0) {
        errors.push(FieldError::new(
            format!("{at}.tolerationSeconds"),
            "must be greater than or equal to 0",
        ));
    }
}

pub(super) fn check_selector_requirement(
    errors: &mut Vec<FieldError>,
    at: &str,
    operator: &str,
    values: &[String],
) {
    match operator {
        "In" | "NotIn" if values.is_empty() => errors.push(FieldError::new(
            format!("{at}.values"),
            "must be non-empty when operator is In or NotIn",
        )),
        "Exists" | "DoesNotExist" if !values.is_empty() => errors.push(FieldError::new(
            format!("{at}.values"),
            "must be empty when operator is Exists or DoesNotExist",
        )),
        "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
        _ => errors.push(FieldError::new(
            format!("{at}.operator"),
            "must be one of In, NotIn, Exists, DoesNotExist",
        )),
    }
}

//! Validation of ManagedClusterSets and their bindings (the CRD's rules, for the standalone hub
//! and `flower-hub validate`).
use super::*;
use crate::clusterset::{ClusterSetSelectorType, ManagedClusterSet, ManagedClusterSetBinding};

/// Validates a ManagedClusterSet: a DNS-label name; `labelSelector` with `selectorType:
/// LabelSelector` and only then.
pub fn validate_cluster_set(set: &ManagedClusterSet) -> Vec<FieldError> {
    let mut errors = Vec::new();
    check_object_names(&mut errors, &set.metadata);
    if set.metadata.namespace.is_some() {
        errors.push(FieldError::new(
            "metadata.namespace",
            "must not be set: a ManagedClusterSet is cluster-scoped",
        ));
    }
    let selector = &set.spec.cluster_selector;
    match (selector.selector_type, &selector.label_selector) {
        (ClusterSetSelectorType::LabelSelector, None) => errors.push(FieldError::new(
            "spec.clusterSelector",
            "labelSelector is required with selectorType LabelSelector (use {} to select every cluster)",
        )),
        (ClusterSetSelectorType::ExclusiveClusterSetLabel, Some(_)) => {
            errors.push(FieldError::new(
                "spec.clusterSelector",
                "labelSelector is not allowed with selectorType ExclusiveClusterSetLabel (members carry the label cluster.open-cluster-management.io/clusterset=<set name>); set selectorType: LabelSelector to select by labels",
            ))
        }
        (_, Some(ls)) => {
            for (j, req) in ls.match_expressions.iter().flatten().enumerate() {
                super::placement::check_selector_requirement(
                    &mut errors,
                    &format!("spec.clusterSelector.labelSelector.matchExpressions[{j}]"),
                    &req.operator,
                    req.values.as_deref().unwrap_or(&[]),
                );
            }
        }
        _ => {}
    }
    errors
}

/// Validates a ManagedClusterSetBinding: DNS-label names, `spec.clusterSet` equal to the
/// binding's name (OCM's rule).
pub fn validate_cluster_set_binding(binding: &ManagedClusterSetBinding) -> Vec<FieldError> {
    let mut errors = Vec::new();
    check_object_names(&mut errors, &binding.metadata);
    if let Err(why) = check_dns_label(&binding.spec.cluster_set) {
        errors.push(FieldError::new("spec.clusterSet", why));
    } else if binding.metadata.name.as_deref() != Some(binding.spec.cluster_set.as_str()) {
        errors.push(FieldError::new(
            "spec.clusterSet",
            "metadata.name must equal spec.clusterSet: a binding is named after its ManagedClusterSet",
        ));
    }
    errors
}

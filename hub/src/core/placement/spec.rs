//! A Placement's policy as the core evaluates it, from our Placement's spec or OCM's.
use super::*;

/// The selection policy of `placement` (API types → the pure view used here), its cluster sets
/// resolved from every ManagedClusterSet and the `(namespace, set)` of every valid binding.
pub fn placement_policy(
    placement: &flower_addon_crds::Placement,
    sets: &[crate::core::clustersets::ClusterSetView],
    bindings: &[(String, String)],
) -> PlacementPolicy {
    let namespace = placement.metadata.namespace.as_deref().unwrap_or("default");
    PlacementPolicy {
        cluster_sets: crate::core::clustersets::usable_sets(
            namespace,
            &placement.spec.cluster_sets,
            sets,
            bindings,
        ),
        ..policy_from_spec(&placement.spec)
    }
}

/// The selection policy of a `Placement` spec without its cluster sets (see
/// [`placement_policy`]).
pub fn policy_from_spec(spec: &flower_addon_crds::PlacementSpec) -> PlacementPolicy {
    use flower_addon_crds::{TaintEffect as ApiEffect, TolerationOperator};
    let effect = |e: ApiEffect| match e {
        ApiEffect::NoSelect => TaintEffect::NoSelect,
        ApiEffect::PreferNoSelect => TaintEffect::PreferNoSelect,
        ApiEffect::NoSelectIfNew => TaintEffect::NoSelectIfNew,
    };
    PlacementPolicy {
        cluster_sets: Vec::new(),
        predicates: spec
            .predicates
            .iter()
            .map(|p| {
                let sel = p.required_cluster_selector.clone().unwrap_or_default();
                PredicateView {
                    label_selector: sel.label_selector,
                    claim_selector: sel
                        .claim_selector
                        .map(|c| c.match_expressions)
                        .unwrap_or_default(),
                }
            })
            .collect(),
        number_of_clusters: spec.number_of_clusters.map(|n| n.max(0) as u32),
        prioritizers: spec.prioritizer_policy.as_ref().map(prioritizers_from_spec),
        tolerations: spec
            .tolerations
            .iter()
            .map(|t| TolerationView {
                key: t.key.clone().unwrap_or_default(),
                operator: match t.operator {
                    Some(TolerationOperator::Exists) => "Exists".into(),
                    _ => "Equal".into(),
                },
                value: t.value.clone().unwrap_or_default(),
                effect: t.effect.map(effect),
                toleration_seconds: t.toleration_seconds,
            })
            .collect(),
    }
}

/// The weighted prioritizers of a `prioritizerPolicy`: `Exact` → the configured ones;
/// `Additive` → [`DEFAULT_PRIORITIZERS`] with configured weights replacing or adding to them.
/// Unknown names and add-on scores are left out here (validation refuses them first).
pub(super) fn prioritizers_from_spec(
    policy: &flower_addon_crds::PrioritizerPolicy,
) -> Vec<(Prioritizer, i32)> {
    let mut out: Vec<(Prioritizer, i32)> = match policy.mode {
        flower_addon_crds::PrioritizerPolicyMode::Additive => DEFAULT_PRIORITIZERS.to_vec(),
        flower_addon_crds::PrioritizerPolicyMode::Exact => Vec::new(),
    };
    for config in &policy.configurations {
        let Some(p) = config
            .score_coordinate
            .built_in
            .as_deref()
            .and_then(Prioritizer::parse)
        else {
            continue;
        };
        match out.iter_mut().find(|(q, _)| *q == p) {
            Some(slot) => slot.1 = config.weight,
            None => out.push((p, config.weight)),
        }
    }
    out
}

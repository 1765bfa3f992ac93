//! Cluster sets: which clusters the Placements of a namespace may select (OCM's
//! `ManagedClusterSet` + `ManagedClusterSetBinding`), as pure functions both hub modes call.
//!
//! A Placement in namespace N selects only from the sets that exist, are bound to N by a
//! `ManagedClusterSetBinding` (named after its set) and, when `spec.clusterSets` is not empty,
//! are named there. A cluster outside those sets is never considered and never named in the
//! Placement's status: a tenant does not learn of clusters it may not use. No usable set → nothing
//! is selected, with reason `NoManagedClusterSetBindings`; usable sets without a cluster →
//! `AllManagedClusterSetsEmpty`.

use std::collections::{BTreeMap, BTreeSet};

use flower_addon_crds::{
    CLUSTERSET_LABEL, ClusterSetSelectorType, ManagedClusterSet, ManagedClusterSetBinding,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::selector::selector_matches;

/// Which clusters a set holds.
#[derive(Clone, Debug, PartialEq)]
pub enum SetSelector {
    /// Clusters labelled [`CLUSTERSET_LABEL`]`=<set name>`.
    Exclusive,
    /// Clusters whose labels match (an empty selector matches every cluster).
    Labels(LabelSelector),
}

/// What placement needs to know about one ManagedClusterSet.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSetView {
    /// Set name.
    pub name: String,
    /// How it selects its clusters.
    pub selector: SetSelector,
}

impl ClusterSetView {
    /// The view of a ManagedClusterSet object.
    pub fn from_api(set: &ManagedClusterSet) -> Self {
        let selector = &set.spec.cluster_selector;
        Self {
            name: set.metadata.name.clone().unwrap_or_default(),
            selector: match selector.selector_type {
                ClusterSetSelectorType::ExclusiveClusterSetLabel => SetSelector::Exclusive,
                ClusterSetSelectorType::LabelSelector => {
                    SetSelector::Labels(selector.label_selector.clone().unwrap_or_default())
                }
            },
        }
    }

    /// A set of every cluster (`selectorType: LabelSelector`, `labelSelector: {}`; OCM's
    /// `global`).
    pub fn every_cluster(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            selector: SetSelector::Labels(LabelSelector::default()),
        }
    }

    /// Whether a cluster with these (admin-set) labels is in the set.
    pub fn contains(&self, labels: &BTreeMap<String, String>) -> bool {
        match &self.selector {
            SetSelector::Exclusive => labels.get(CLUSTERSET_LABEL) == Some(&self.name),
            SetSelector::Labels(selector) => selector_matches(selector, labels),
        }
    }
}

/// The sets a Placement in `namespace` may select from: existing sets bound to `namespace`,
/// narrowed to `requested` (`spec.clusterSets`) when that is not empty; sorted by name.
/// `bindings` are `(namespace, set)` of valid bindings.
pub fn usable_sets(
    namespace: &str,
    requested: &[String],
    sets: &[ClusterSetView],
    bindings: &[(String, String)],
) -> Vec<ClusterSetView> {
    let bound: BTreeSet<&str> = bindings
        .iter()
        .filter(|(ns, _)| ns == namespace)
        .map(|(_, set)| set.as_str())
        .collect();
    let mut usable: Vec<ClusterSetView> = sets
        .iter()
        .filter(|s| bound.contains(s.name.as_str()))
        .filter(|s| requested.is_empty() || requested.contains(&s.name))
        .cloned()
        .collect();
    usable.sort_by(|a, b| a.name.cmp(&b.name));
    usable.dedup_by(|a, b| a.name == b.name);
    usable
}

/// `(namespace, set)` of the bindings that are valid ([`flower_addon_crds::validate_cluster_set_binding`]);
/// an invalid one binds nothing.
pub fn binding_pairs<'a>(
    bindings: impl IntoIterator<Item = &'a ManagedClusterSetBinding>,
) -> Vec<(String, String)> {
    bindings
        .into_iter()
        .filter(|b| flower_addon_crds::validate_cluster_set_binding(b).is_empty())
        .filter_map(|b| Some((b.metadata.namespace.clone()?, b.spec.cluster_set.clone())))
        .collect()
}

/// Why a Placement's cluster sets leave it nothing to select from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScopeProblem {
    /// No existing set is bound to the namespace (and named in `spec.clusterSets`).
    NoBindings,
    /// Usable sets exist but hold no cluster.
    AllSetsEmpty,
}

impl ScopeProblem {
    /// The `PlacementSatisfied=False` reason (OCM's).
    pub fn reason(self) -> &'static str {
        match self {
            Self::NoBindings => "NoManagedClusterSetBindings",
            Self::AllSetsEmpty => "AllManagedClusterSetsEmpty",
        }
    }

    /// What the user reads, naming the namespace, the requested sets and the fix.
    pub fn message(self, namespace: &str, requested: &[String]) -> String {
        let which = if requested.is_empty() {
            String::new()
        } else {
            format!(" named in spec.clusterSets ({})", requested.join(", "))
        };
        match self {
            Self::NoBindings => format!(
                "no ManagedClusterSet{which} is bound to namespace {namespace}: nothing can be selected until someone allowed to bind a set creates a ManagedClusterSetBinding in {namespace} named after an existing ManagedClusterSet"
            ),
            Self::AllSetsEmpty => format!(
                "the ManagedClusterSets{which} bound to namespace {namespace} hold no cluster: label clusters {CLUSTERSET_LABEL}=<set>, or widen the set's labelSelector"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn exclusive(name: &str) -> ClusterSetView {
        ClusterSetView {
            name: name.into(),
            selector: SetSelector::Exclusive,
        }
    }

    #[test]
    fn membership_by_the_exclusive_label_or_a_selector() {
        let red = exclusive("red");
        assert!(red.contains(&labels(&[(CLUSTERSET_LABEL, "red")])));
        assert!(!red.contains(&labels(&[(CLUSTERSET_LABEL, "blue")])));
        assert!(!red.contains(&labels(&[("red", "true")])));
        let eu = ClusterSetView {
            name: "eu".into(),
            selector: SetSelector::Labels(LabelSelector {
                match_labels: Some([("region".to_string(), "eu".to_string())].into()),
                ..Default::default()
            }),
        };
        assert!(eu.contains(&labels(&[("region", "eu")])));
        assert!(!eu.contains(&labels(&[("region", "us")])));
        assert!(ClusterSetView::every_cluster("global").contains(&labels(&[])));
    }

    #[test]
    fn only_sets_bound_to_the_namespace_and_requested_are_usable() {
        let sets = vec![exclusive("red"), exclusive("blue"), exclusive("green")];
        let bindings = vec![
            ("team-a".to_string(), "red".to_string()),
            ("team-a".to_string(), "blue".to_string()),
            ("team-a".to_string(), "missing".to_string()),
            ("team-b".to_string(), "green".to_string()),
        ];
        let names = |v: Vec<ClusterSetView>| v.into_iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(
            names(usable_sets("team-a", &[], &sets, &bindings)),
            ["blue", "red"]
        );
        assert_eq!(
            names(usable_sets(
                "team-a",
                &["red".into(), "green".into()],
                &sets,
                &bindings
            )),
            ["red"]
        );
        assert!(usable_sets("team-c", &[], &sets, &bindings).is_empty());
        // A binding to a set that does not exist binds nothing.
        assert!(usable_sets("team-a", &["missing".into()], &sets, &bindings).is_empty());
    }

    #[test]
    fn a_binding_not_named_after_its_set_binds_nothing() {
        let mut binding = ManagedClusterSetBinding::new(
            "red",
            flower_addon_crds::ManagedClusterSetBindingSpec {
                cluster_set: "blue".into(),
            },
        );
        binding.metadata.namespace = Some("team-a".into());
        assert!(binding_pairs([&binding]).is_empty());
        binding.spec.cluster_set = "red".into();
        assert_eq!(
            binding_pairs([&binding]),
            [("team-a".to_string(), "red".to_string())]
        );
    }

    #[test]
    fn messages_name_the_namespace_the_sets_and_the_fix() {
        let m = ScopeProblem::NoBindings.message("team-a", &["red".into()]);
        assert!(
            m.contains("team-a") && m.contains("red") && m.contains("ManagedClusterSetBinding")
        );
        let m = ScopeProblem::AllSetsEmpty.message("team-a", &[]);
        assert!(m.contains(CLUSTERSET_LABEL));
        assert_eq!(
            ScopeProblem::NoBindings.reason(),
            "NoManagedClusterSetBindings"
        );
    }
}

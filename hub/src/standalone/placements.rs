//! Placement decisions of the standalone hub. Every Placement of the manifests directory is
//! evaluated once per pass, as the Kubernetes Placement controller evaluates each Placement (not
//! each Federation that names it), and `Balance` counts how many *other Placements* selected each
//! cluster, as the Kubernetes controller counts other PlacementDecisions. So Federations that
//! share a Placement run on the same clusters, in both modes.
use super::StandaloneHub;
use crate::core::placement::{self, ClusterView};
use crate::registration::store::ClusterStore;
use std::collections::{BTreeMap, BTreeSet};

/// `(namespace, name)` of a Placement.
pub(super) type PlacementKey = (String, String);

/// What one Placement selected in this pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Decision {
    /// Selected cluster names, sorted.
    pub selected: Vec<String>,
    /// Why the Placement cannot select anything (its cluster sets), for the status.
    pub problem: Option<String>,
}

impl<S: ClusterStore> StandaloneHub<S> {
    /// Evaluates every Placement of the manifests directory against `views`, in namespace/name
    /// order, each keeping what it selected before where that still qualifies; forgets the
    /// selections of Placements that are gone.
    pub(super) fn decide_placements(
        &mut self,
        views: &[ClusterView],
        now: i64,
    ) -> BTreeMap<PlacementKey, Decision> {
        let placements: Vec<_> = self.manifests.placements().cloned().collect();
        let sets = self.manifests.cluster_sets();
        let bindings = self.manifests.cluster_set_bindings();
        let live: BTreeSet<PlacementKey> = placements.iter().map(placement_key).collect();
        self.selections.retain(|k, _| live.contains(k));
        let mut decisions = BTreeMap::new();
        for placement in &placements {
            let key = placement_key(placement);
            let policy = placement::placement_policy(placement, &sets, &bindings);
            let previous = self.selections.get(&key).cloned().unwrap_or_default();
            let views = with_other_decisions(views, &self.selections, &key);
            let outcome = placement::evaluate(&policy, &views, &previous, now);
            let problem = outcome.scope.map(|scope| {
                format!(
                    "Placement {}/{}: {}: {}",
                    key.0,
                    key.1,
                    scope.reason(),
                    scope.message(&key.0, &placement.spec.cluster_sets)
                )
            });
            self.selections
                .insert(key.clone(), outcome.selected.iter().cloned().collect());
            decisions.insert(
                key,
                Decision {
                    selected: outcome.selected,
                    problem,
                },
            );
        }
        decisions
    }
}

/// `(namespace, name)` of `placement`.
pub(super) fn placement_key(placement: &flower_addon_crds::Placement) -> PlacementKey {
    (
        placement.metadata.namespace.clone().unwrap_or_default(),
        placement.metadata.name.clone().unwrap_or_default(),
    )
}

/// `views` with each cluster's `other_decisions`: how many Placements other than `own` hold it
/// in their last selection (what `Balance` spreads by).
fn with_other_decisions(
    views: &[ClusterView],
    selections: &BTreeMap<PlacementKey, BTreeSet<String>>,
    own: &PlacementKey,
) -> Vec<ClusterView> {
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for (key, selected) in selections {
        if key != own {
            for cluster in selected {
                *counts.entry(cluster.as_str()).or_default() += 1;
            }
        }
    }
    views
        .iter()
        .map(|v| ClusterView {
            other_decisions: counts.get(v.name.as_str()).copied().unwrap_or(0),
            ..v.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &str) -> ClusterView {
        ClusterView {
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn other_decisions_count_other_placements_only() {
        let own = ("ns".to_owned(), "p".to_owned());
        let selections = BTreeMap::from([
            (own.clone(), BTreeSet::from(["a".to_owned()])),
            (
                ("ns".to_owned(), "q".to_owned()),
                BTreeSet::from(["a".to_owned(), "b".to_owned()]),
            ),
            (
                ("other".to_owned(), "p".to_owned()),
                BTreeSet::from(["a".to_owned()]),
            ),
        ]);
        let views = with_other_decisions(&[view("a"), view("b"), view("c")], &selections, &own);
        let counts: Vec<u32> = views.iter().map(|v| v.other_decisions).collect();
        assert_eq!(counts, vec![2, 1, 0]);
    }
}

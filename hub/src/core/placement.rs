//! Placement: which registered clusters a `Placement` selects (OCM semantics), as a pure function.
//!
//! - predicates are ORed; inside one predicate the label and claim selectors are ANDed; no
//!   predicate at all selects every eligible cluster;
//! - only clusters in the Placement's usable cluster sets are considered
//!   ([`super::clustersets`]); the others are not named in the outcome;
//! - only accepted clusters are eligible;
//! - taints with effect `NoSelect` drop a cluster unless a toleration matches (and, with
//!   `tolerationSeconds`, only until that many seconds after the taint was added);
//!   `NoSelectIfNew` keeps an already-selected cluster but never adds it; `PreferNoSelect` clusters
//!   are taken last;
//! - `numberOfClusters` caps the selection; which qualifying clusters fill it is decided by the
//!   prioritizers (`prioritizerPolicy`): each scores a cluster from -100 to 100 and the weighted
//!   sum ranks them (ties keep selected clusters, then go by name, so the result is stable). `Additive` mode (the default) uses
//!   `Balance` (weight 1) and `Steady` (weight 2, see [`DEFAULT_PRIORITIZERS`]) plus the
//!   configured ones (a configured default takes its new weight); `Exact` uses only the
//!   configured ones:
//!   - `Steady`: 100 for clusters selected before (no churn), 0 for new ones;
//!   - `Balance`: 100 for the cluster with the fewest decisions of other Placements, down to
//!     -100 for the one with the most;
//!   - `ResourceAllocatableCPU` / `ResourceAllocatableMemory`: the allocatable capacity the
//!     agent reports, 100 for the largest, -100 for the smallest or unknown.
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use std::collections::{BTreeMap, BTreeSet};

use super::selector::{requirement_matches, selector_matches};

pub use flower_addon_crds::{TAINT_UNAVAILABLE, TAINT_UNREACHABLE};
mod spec;
pub use spec::{placement_policy, policy_from_spec};
/// Decisions per `PlacementDecision` object (OCM paginates at 100).
pub const DECISIONS_PER_PAGE: usize = 100;

/// What placement needs to know about one registered cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// ManagedCluster name.
    pub name: String,
    /// Labels of the ManagedCluster.
    pub labels: BTreeMap<String, String>,
    /// Cluster claims reported by the agent.
    pub claims: BTreeMap<String, String>,
    /// Whether the hub accepted the cluster (`hubAcceptsClient`).
    pub accepted: bool,
    /// Taints on the ManagedCluster.
    pub taints: Vec<TaintView>,
    /// Allocatable CPU the agent reports, in millicores (None: not reported).
    pub allocatable_cpu_millis: Option<i64>,
    /// Allocatable memory the agent reports, in bytes (None: not reported).
    pub allocatable_memory_bytes: Option<i64>,
    /// Decisions other Placements hold for this cluster (`Balance`).
    pub other_decisions: u32,
}

/// A built-in prioritizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Prioritizer {
    /// Keeps clusters selected before.
    Steady,
    /// Spreads decisions over clusters.
    Balance,
    /// Prefers clusters with more allocatable CPU.
    ResourceAllocatableCpu,
    /// Prefers clusters with more allocatable memory.
    ResourceAllocatableMemory,
}

impl Prioritizer {
    /// Parses OCM's name (`Steady`, `Balance`, `ResourceAllocatableCPU`,
    /// `ResourceAllocatableMemory`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "Steady" => Some(Self::Steady),
            "Balance" => Some(Self::Balance),
            "ResourceAllocatableCPU" => Some(Self::ResourceAllocatableCpu),
            "ResourceAllocatableMemory" => Some(Self::ResourceAllocatableMemory),
            _ => None,
        }
    }
}

/// The `Additive` defaults: OCM's `Balance` (weight 1) and `Steady`, with weight 2 instead of
/// OCM's 1 so that Balance alone (at most 200 points between two clusters) never displaces a
/// selected cluster (at most it ties, and ties keep the selected one): a Placement without a
/// policy keeps its clusters (no churn), as the README promises; configured weights replace
/// these.
pub const DEFAULT_PRIORITIZERS: [(Prioritizer, i32); 2] =
    [(Prioritizer::Balance, 1), (Prioritizer::Steady, 2)];

/// Effect of a taint on placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TaintEffect {
    /// The cluster is not selected unless the taint is tolerated.
    NoSelect,
    /// The cluster is selected only when no other cluster qualifies.
    PreferNoSelect,
    /// The cluster stays selected if it already was, but is never newly selected.
    NoSelectIfNew,
}

impl TaintEffect {
    /// Parses the API spelling (`NoSelect`, `PreferNoSelect`, `NoSelectIfNew`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "NoSelect" => Some(Self::NoSelect),
            "PreferNoSelect" => Some(Self::PreferNoSelect),
            "NoSelectIfNew" => Some(Self::NoSelectIfNew),
            _ => None,
        }
    }

    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSelect => "NoSelect",
            Self::PreferNoSelect => "PreferNoSelect",
            Self::NoSelectIfNew => "NoSelectIfNew",
        }
    }
}

/// One taint on a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaintView {
    /// Taint key.
    pub key: String,
    /// Taint value (empty when unset).
    pub value: String,
    /// Taint effect.
    pub effect: TaintEffect,
    /// When the taint was added, in Unix seconds (None: unknown, treated as "now").
    pub time_added: Option<i64>,
}

/// A toleration in a Placement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TolerationView {
    /// Key to match; empty with `Exists` matches every key.
    pub key: String,
    /// `Equal` (default) or `Exists`.
    pub operator: String,
    /// Value to match with `Equal`.
    pub value: String,
    /// Effect to match; None matches every effect.
    pub effect: Option<TaintEffect>,
    /// How long after the taint was added the toleration holds; None: forever.
    pub toleration_seconds: Option<i64>,
}

/// One OR-ed predicate: label selector AND claim selector.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PredicateView {
    /// Selector on cluster labels.
    pub label_selector: Option<LabelSelector>,
    /// Selector on cluster claims (match expressions only, as in OCM).
    pub claim_selector: Vec<LabelSelectorRequirement>,
}

/// The parts of a Placement that decide the selection.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlacementPolicy {
    /// The cluster sets the Placement may select from ([`super::clustersets::usable_sets`]);
    /// empty: nothing is selected.
    pub cluster_sets: Vec<super::clustersets::ClusterSetView>,
    /// ORed predicates; empty selects every eligible cluster.
    pub predicates: Vec<PredicateView>,
    /// Upper bound on the selection; None: every qualifying cluster.
    pub number_of_clusters: Option<u32>,
    /// Tolerations of taints.
    pub tolerations: Vec<TolerationView>,
    /// Weighted prioritizers; None: [`DEFAULT_PRIORITIZERS`].
    pub prioritizers: Option<Vec<(Prioritizer, i32)>>,
}

/// Why a cluster was left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exclusion {
    /// The hub has not accepted the cluster.
    NotAccepted,
    /// No predicate matches the cluster's labels and claims.
    PredicatesNotMatched,
    /// A taint that no toleration covers.
    Tainted {
        /// The taint key.
        key: String,
        /// Its effect.
        effect: TaintEffect,
    },
    /// The cluster qualified but `numberOfClusters` was reached.
    NumberOfClustersReached,
}

impl std::fmt::Display for Exclusion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotAccepted => write!(
                f,
                "cluster not accepted by the hub (hubAcceptsClient=false)"
            ),
            Self::PredicatesNotMatched => {
                write!(f, "no predicate matches the cluster's labels and claims")
            }
            Self::Tainted { key, effect } => {
                write!(f, "taint {key}:{} is not tolerated", effect.as_str())
            }
            Self::NumberOfClustersReached => write!(f, "numberOfClusters reached"),
        }
    }
}

/// The outcome of evaluating a Placement.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlacementOutcome {
    /// Selected cluster names, sorted.
    pub selected: Vec<String>,
    /// Clusters left out, with the reason.
    pub excluded: BTreeMap<String, Exclusion>,
    /// True when the selection has every cluster asked for (`numberOfClusters`, or at least one
    /// cluster when it is unset).
    pub satisfied: bool,
    /// Seconds from `now` until a toleration expires and the result may change.
    pub requeue_after_secs: Option<i64>,
    /// Set when the cluster sets leave nothing to select from.
    pub scope: Option<super::clustersets::ScopeProblem>,
}

/// Evaluates `policy` against `clusters`. `previous` holds the clusters selected by the last
/// evaluation (for Steady selection and `NoSelectIfNew`); `now` is Unix seconds.
pub fn evaluate(
    policy: &PlacementPolicy,
    clusters: &[ClusterView],
    previous: &BTreeSet<String>,
    now: i64,
) -> PlacementOutcome {
    let mut out = PlacementOutcome::default();
    let mut kept = Vec::new(); // previously selected, still qualifying
    let mut fresh = Vec::new(); // qualifying, new
    let mut preferred_not = Vec::new(); // qualifying only through PreferNoSelect
    let mut sorted: Vec<&ClusterView> = clusters.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    sorted.dedup_by(|a, b| a.name == b.name);
    // Clusters outside every usable set are not considered, nor named.
    sorted.retain(|c| policy.cluster_sets.iter().any(|s| s.contains(&c.labels)));
    if policy.cluster_sets.is_empty() {
        out.scope = Some(super::clustersets::ScopeProblem::NoBindings);
    } else if sorted.is_empty() {
        out.scope = Some(super::clustersets::ScopeProblem::AllSetsEmpty);
    }

    for cluster in sorted {
        if !cluster.accepted {
            out.excluded
                .insert(cluster.name.clone(), Exclusion::NotAccepted);
            continue;
        }
        if !matches_predicates(&policy.predicates, cluster) {
            out.excluded
                .insert(cluster.name.clone(), Exclusion::PredicatesNotMatched);
            continue;
        }
        let was_selected = previous.contains(&cluster.name);
        let mut blocked = None;
        let mut prefer_not = false;
        for taint in &cluster.taints {
            match tolerated(&policy.tolerations, taint, now) {
                Tolerated::Yes { expires_in } => {
                    if let Some(secs) = expires_in {
                        out.requeue_after_secs =
                            Some(out.requeue_after_secs.map_or(secs, |cur| cur.min(secs)));
                    }
                }
                Tolerated::No => match taint.effect {
                    TaintEffect::NoSelect => blocked = Some(taint),
                    TaintEffect::NoSelectIfNew if !was_selected => blocked = Some(taint),
                    TaintEffect::NoSelectIfNew => {}
                    TaintEffect::PreferNoSelect => prefer_not = true,
                },
            }
            if blocked.is_some() {
                break;
            }
        }
        if let Some(taint) = blocked {
            out.excluded.insert(
                cluster.name.clone(),
                Exclusion::Tainted {
                    key: taint.key.clone(),
                    effect: taint.effect,
                },
            );
        } else if was_selected {
            kept.push(cluster.name.clone());
        } else if prefer_not {
            preferred_not.push(cluster.name.clone());
        } else {
            fresh.push(cluster.name.clone());
        }
    }

    let cap = policy
        .number_of_clusters
        .map(|n| n as usize)
        .unwrap_or(usize::MAX);
    // Highest weighted score first; ties keep selected clusters, then go by name;
    // PreferNoSelect clusters only after every other qualifying one.
    let prioritizers = policy
        .prioritizers
        .as_deref()
        .unwrap_or(&DEFAULT_PRIORITIZERS);
    let by_name: BTreeMap<&str, &ClusterView> =
        clusters.iter().map(|c| (c.name.as_str(), c)).collect();
    let qualifying: Vec<&ClusterView> = kept
        .iter()
        .chain(&fresh)
        .filter_map(|name| by_name.get(name.as_str()).copied())
        .collect();
    let scores = weighted_scores(prioritizers, &qualifying, previous);
    let rank = |names: Vec<String>| {
        let mut names = names;
        names.sort_by(|a, b| {
            let (sa, sb) = (scores.get(a).unwrap_or(&0), scores.get(b).unwrap_or(&0));
            sb.cmp(sa)
                .then_with(|| previous.contains(b).cmp(&previous.contains(a)))
                .then_with(|| a.cmp(b))
        });
        names
    };
    let mut selected = Vec::new();
    let mut ordered = rank(kept.into_iter().chain(fresh).collect());
    ordered.extend(preferred_not);
    for name in ordered {
        if selected.len() < cap {
            selected.push(name);
        } else {
            out.excluded
                .insert(name, Exclusion::NumberOfClustersReached);
        }
    }
    selected.sort();
    out.satisfied = match policy.number_of_clusters {
        Some(n) => selected.len() == n as usize,
        None => !selected.is_empty(),
    };
    out.selected = selected;
    out
}

/// The weighted score of each of `candidates` (see the module doc for each prioritizer). Each
/// prioritizer's extremes over the candidates are found once, so this is linear in them.
fn weighted_scores(
    prioritizers: &[(Prioritizer, i32)],
    candidates: &[&ClusterView],
    previous: &BTreeSet<String>,
) -> BTreeMap<String, i64> {
    let mut total: BTreeMap<String, i64> = candidates.iter().map(|c| (c.name.clone(), 0)).collect();
    for &(prioritizer, weight) in prioritizers {
        let score: Box<dyn Fn(&ClusterView) -> i64> = match prioritizer {
            Prioritizer::Steady => Box::new(|c| if previous.contains(&c.name) { 100 } else { 0 }),
            Prioritizer::Balance => {
                let max = candidates
                    .iter()
                    .map(|c| c.other_decisions)
                    .max()
                    .unwrap_or(0);
                Box::new(move |c| {
                    if max == 0 {
                        100
                    } else {
                        100 - 200 * i64::from(c.other_decisions) / i64::from(max)
                    }
                })
            }
            Prioritizer::ResourceAllocatableCpu => {
                let range = range_of(candidates, |c| c.allocatable_cpu_millis);
                Box::new(move |c| normalized(range, c.allocatable_cpu_millis))
            }
            Prioritizer::ResourceAllocatableMemory => {
                let range = range_of(candidates, |c| c.allocatable_memory_bytes);
                Box::new(move |c| normalized(range, c.allocatable_memory_bytes))
            }
        };
        for c in candidates {
            if let Some(t) = total.get_mut(&c.name) {
                *t += i64::from(weight) * score(c);
            }
        }
    }
    total
}

/// The smallest and largest known `value` among `candidates` (None: none is known).
fn range_of(
    candidates: &[&ClusterView],
    value: impl Fn(&ClusterView) -> Option<i64>,
) -> Option<(i64, i64)> {
    candidates
        .iter()
        .filter_map(|c| value(c))
        .fold(None, |range, v| match range {
            None => Some((v, v)),
            Some((min, max)) => Some((min.min(v), max.max(v))),
        })
}

/// `value` scaled to -100 (the smallest of `range`, or unknown) … 100 (the largest).
fn normalized(range: Option<(i64, i64)>, value: Option<i64>) -> i64 {
    let (Some((min, max)), Some(v)) = (range, value) else {
        return -100;
    };
    if max == min {
        return 100;
    }
    let scaled = i128::from(v - min) * 200 / i128::from(max - min) - 100;
    i64::try_from(scaled).unwrap_or(0)
}

enum Tolerated {
    Yes { expires_in: Option<i64> },
    No,
}

fn tolerated(tolerations: &[TolerationView], taint: &TaintView, now: i64) -> Tolerated {
    for t in tolerations {
        if let Some(effect) = t.effect
            && effect != taint.effect
        {
            continue;
        }
        let key_ok = match t.operator.as_str() {
            "Exists" => t.key.is_empty() || t.key == taint.key,
            _ => t.key == taint.key && t.value == taint.value,
        };
        if !key_ok {
            continue;
        }
        match t.toleration_seconds {
            None => return Tolerated::Yes { expires_in: None },
            Some(secs) => {
                let added = taint.time_added.unwrap_or(now);
                let left = added + secs - now;
                if left > 0 {
                    return Tolerated::Yes {
                        expires_in: Some(left),
                    };
                }
            }
        }
    }
    Tolerated::No
}

fn matches_predicates(predicates: &[PredicateView], cluster: &ClusterView) -> bool {
    if predicates.is_empty() {
        return true;
    }
    predicates.iter().any(|p| {
        p.label_selector
            .as_ref()
            .is_none_or(|sel| selector_matches(sel, &cluster.labels))
            && p.claim_selector
                .iter()
                .all(|req| requirement_matches(req, &cluster.claims))
    })
}

/// Allocatable CPU (millicores) and memory (bytes) from reported quantities (`cpu`, `memory`).
pub fn allocatable_view(allocatable: &BTreeMap<String, String>) -> (Option<i64>, Option<i64>) {
    let parse = |key: &str, scale: f64| {
        allocatable
            .get(key)
            .and_then(|q| flower_addon_crds::parse_quantity(q))
            .map(|v| (v * scale).round() as i64)
    };
    (parse("cpu", 1000.0), parse("memory", 1.0))
}

/// Splits a sorted selection into pages of at most [`DECISIONS_PER_PAGE`], named
/// `<placement>-decision-<n>` with n from 1.
pub fn paginate(placement: &str, selected: &[String]) -> Vec<(String, Vec<String>)> {
    selected
        .chunks(DECISIONS_PER_PAGE)
        .enumerate()
        .map(|(i, chunk)| (format!("{placement}-decision-{}", i + 1), chunk.to_vec()))
        .collect()
}

#[cfg(test)]
mod tests;

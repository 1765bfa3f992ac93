//! Holding a Federation's work back while its SuperLink is not up: the one rule of both hub modes.
//!
//! A changed CA bundle or spec restarts SuperNodes, and a SuperNode restarted while its SuperLink
//! is down cannot deactivate, so Flower refuses its successor until the old one times out (about
//! a minute). So while a Federation's SuperLink is (re)starting, each cluster keeps that
//! Federation's work as it was last sent ([`hold`]); the other Federations' changes go out. What
//! "(re)starting" means is each mode's own observation: the standalone hub probes the SuperLink
//! process's port; the Kubernetes hub reads the SuperLink StatefulSet's rollout
//! ([`superlink_rolling`]). Both hold at most a bounded time.
use flower_addon_proto::{ClusterWork, FederationWork};
use std::collections::BTreeSet;

/// A cluster's work with the Federations in `held` as they were last sent (`sent`): a changed
/// CA bundle or spec restarts SuperNodes, and a SuperNode restarted while its SuperLink is down
/// cannot deactivate, so Flower refuses its successor until the old one times out (about a
/// minute, seen after a CA rotation's hub restart). None: nothing was sent to the cluster yet
/// and it runs a held Federation, so it gets no work until the SuperLink listens (the agent keeps
/// what it runs).
pub fn hold(
    wanted: Vec<FederationWork>,
    sent: Option<&ClusterWork>,
    held: &BTreeSet<(String, String)>,
) -> Option<Vec<FederationWork>> {
    let is_held = |w: &FederationWork| held.contains(&(w.namespace.clone(), w.name.clone()));
    let Some(sent) = sent else {
        return (!wanted.iter().any(is_held)).then_some(wanted);
    };
    let previous = |w: &FederationWork| {
        sent.federations
            .iter()
            .find(|s| s.namespace == w.namespace && s.name == w.name)
            .cloned()
    };
    let mut federations: Vec<FederationWork> = wanted
        .iter()
        .filter_map(|w| {
            if is_held(w) {
                previous(w)
            } else {
                Some(w.clone())
            }
        })
        .collect();
    federations.extend(
        sent.federations
            .iter()
            .filter(|s| is_held(s))
            .filter(|s| {
                !wanted
                    .iter()
                    .any(|w| w.namespace == s.namespace && w.name == s.name)
            })
            .cloned(),
    );
    Some(federations)
}

/// The rollout state of a SuperLink StatefulSet, as its controller reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rollout {
    /// `metadata.generation`.
    pub generation: i64,
    /// `status.observedGeneration`.
    pub observed_generation: i64,
    /// `spec.replicas`.
    pub replicas: i32,
    /// `status.readyReplicas`.
    pub ready: i32,
    /// `status.updatedReplicas`.
    pub updated: i32,
    /// `status.currentRevision` and `status.updateRevision`.
    pub revisions: (Option<String>, Option<String>),
}

/// Whether a Federation's SuperLink is (re)starting in Kubernetes mode, so its work is held:
/// the Federation controller has not applied the Federation's current spec yet
/// (`status.observedGeneration` behind `generation`; a Federation it never reconciled is not
/// held), or the SuperLink StatefulSet has not rolled out that spec and become ready. A missing
/// StatefulSet (not created yet) holds nothing: no SuperNode of it can have been running.
pub fn superlink_rolling(
    fed_generation: Option<i64>,
    fed_observed: Option<i64>,
    superlink: Option<&Rollout>,
) -> bool {
    if let (Some(generation), Some(observed)) = (fed_generation, fed_observed)
        && observed < generation
    {
        return true;
    }
    let Some(sts) = superlink else {
        return false;
    };
    sts.observed_generation < sts.generation
        || sts.updated < sts.replicas
        || sts.ready < sts.replicas
        || (sts.revisions.0.is_some() && sts.revisions.0 != sts.revisions.1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn work(name: &str, fleet: &str) -> FederationWork {
        FederationWork {
            namespace: "default".into(),
            name: name.into(),
            superlink_fleet_address: fleet.into(),
            ..Default::default()
        }
    }

    fn sent(federations: Vec<FederationWork>) -> ClusterWork {
        ClusterWork {
            federations,
            ..Default::default()
        }
    }

    fn held(names: &[&str]) -> BTreeSet<(String, String)> {
        names
            .iter()
            .map(|n| ("default".to_owned(), (*n).to_owned()))
            .collect()
    }

    #[test]
    fn nothing_held_sends_what_is_wanted() {
        let wanted = vec![work("a", "new"), work("b", "new")];
        let before = sent(vec![work("a", "old")]);
        assert_eq!(
            hold(wanted.clone(), Some(&before), &held(&[])),
            Some(wanted.clone())
        );
        assert_eq!(hold(wanted.clone(), None, &held(&[])), Some(wanted));
    }

    #[test]
    fn a_held_federation_stays_as_it_was_sent_and_the_others_change() {
        // a: changed but held (old kept); b: changed, not held (new); c: held and gone from the
        // wanted work (kept until its SuperLink listens); d: held and new here (not sent yet).
        let wanted = vec![work("a", "new"), work("b", "new"), work("d", "new")];
        let before = sent(vec![work("a", "old"), work("b", "old"), work("c", "old")]);
        assert_eq!(
            hold(wanted, Some(&before), &held(&["a", "c", "d"])),
            Some(vec![work("a", "old"), work("b", "new"), work("c", "old")])
        );
    }

    #[test]
    fn a_cluster_sent_nothing_yet_waits_for_its_held_federations() {
        // After a hub restart nothing was sent: the agent keeps what it runs (no work at all)
        // rather than a list without the held Federation, which would stop its SuperNodes.
        let wanted = vec![work("a", "new"), work("b", "new")];
        assert_eq!(hold(wanted.clone(), None, &held(&["a"])), None);
        assert_eq!(hold(wanted.clone(), None, &held(&["z"])), Some(wanted));
        assert_eq!(hold(Vec::new(), None, &held(&["a"])), Some(Vec::new()));
    }

    #[test]
    fn a_superlink_rolls_until_its_statefulset_has_the_spec_and_is_ready() {
        let done = Rollout {
            generation: 2,
            observed_generation: 2,
            replicas: 1,
            ready: 1,
            updated: 1,
            revisions: (Some("r2".into()), Some("r2".into())),
        };
        assert!(!superlink_rolling(Some(5), Some(5), Some(&done)));
        assert!(
            !superlink_rolling(Some(5), None, None),
            "never reconciled: nothing to hold"
        );
        assert!(!superlink_rolling(Some(5), Some(5), None));
        assert!(
            superlink_rolling(Some(6), Some(5), Some(&done)),
            "spec not applied yet"
        );
        for rolling in [
            Rollout {
                observed_generation: 1,
                ..done.clone()
            },
            Rollout {
                updated: 0,
                ..done.clone()
            },
            Rollout {
                ready: 0,
                ..done.clone()
            },
            Rollout {
                revisions: (Some("r1".into()), Some("r2".into())),
                ..done.clone()
            },
        ] {
            assert!(
                superlink_rolling(Some(5), Some(5), Some(&rolling)),
                "{rolling:?}"
            );
        }
    }
}

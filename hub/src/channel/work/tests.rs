use super::*;
use crate::registration::store::{CONDITION_HUB_ACCEPTED, ClusterStatus};

fn status_of(conditions: &[(&str, &str)]) -> ClusterStatus {
    let mut st = ClusterStatus::default();
    for (t, v) in conditions {
        st.set_condition(t, v, "Before", "", 1);
    }
    st
}

fn get<'a>(st: &'a ClusterStatus, t: &str) -> Option<(&'a str, &'a str)> {
    st.condition(t)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

#[test]
fn revoking_an_accepted_available_cluster_turns_both_conditions_false() {
    let mut st = status_of(&[
        (CONDITION_HUB_ACCEPTED, "True"),
        (CONDITION_AVAILABLE, "True"),
    ]);
    assert!(acceptance_conditions(&mut st, false, 5));
    assert_eq!(
        get(&st, CONDITION_HUB_ACCEPTED),
        Some(("False", REASON_ADMIN_REVOKED))
    );
    assert_eq!(
        get(&st, CONDITION_AVAILABLE),
        Some(("False", REASON_REVOKED))
    );
    // Idempotent: the write's own change event finds nothing to do.
    assert!(!acceptance_conditions(&mut st, false, 6));
}

#[test]
fn a_cluster_waiting_for_acceptance_keeps_its_reason() {
    let mut st = ClusterStatus::default();
    st.set_condition(
        CONDITION_HUB_ACCEPTED,
        "False",
        "WaitingForAcceptance",
        "",
        1,
    );
    assert!(!acceptance_conditions(&mut st, false, 5));
    assert_eq!(
        get(&st, CONDITION_HUB_ACCEPTED),
        Some(("False", "WaitingForAcceptance"))
    );
    assert!(get(&st, CONDITION_AVAILABLE).is_none());
}

#[test]
fn accepting_sets_hub_accepted_true_once() {
    let mut st = status_of(&[(CONDITION_HUB_ACCEPTED, "False")]);
    assert!(acceptance_conditions(&mut st, true, 5));
    assert_eq!(
        get(&st, CONDITION_HUB_ACCEPTED),
        Some(("True", "HubClusterAdminAccepted"))
    );
    assert!(!acceptance_conditions(&mut st, true, 6));
    // Available is the lease's business, not acceptance's.
    assert!(get(&st, CONDITION_AVAILABLE).is_none());
}

#[test]
fn a_stream_on_the_previous_key_stays_trusted_until_a_second_rekey() {
    // An OCM addon agent's klusterlet renews with a new key and the pod sees it later: the
    // stream it holds (previous key) is not cut when the hub binds the new one, but a key two
    // renewals old is.
    let record =
        |current: &str, previous: Option<&str>| crate::registration::store::ClusterRecord {
            registration: crate::registration::store::ClusterRegistration {
                name: "edge-1".into(),
                labels: Default::default(),
                claims: Default::default(),
                key_fingerprint: current.into(),
                previous_key_fingerprint: previous.map(str::to_owned),
                agent_version: String::new(),
                token_id: String::new(),
                created_unix: 0,
            },
            hub_accepts_client: true,
            lease_duration: None,
            status: ClusterStatus::default(),
        };
    assert!(distrust("edge-1", Some(&record("k2", Some("k1"))), Some("k1")).is_none());
    assert!(distrust("edge-1", Some(&record("k2", Some("k1"))), Some("k2")).is_none());
    let (state, _, _) =
        distrust("edge-1", Some(&record("k3", Some("k2"))), Some("k1")).expect("distrusted");
    assert_eq!(state, flower_addon_proto::CLUSTER_REKEYED);
    // A joined cluster has no previous key: only its own key is trusted.
    assert!(distrust("edge-1", Some(&record("k2", None)), Some("k1")).is_some());
}

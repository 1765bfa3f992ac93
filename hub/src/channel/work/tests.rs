use super::*;

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

//! A cluster's acceptance conditions, as the hub's `hubAcceptsClient` decides them: what the work
//! stream ([`super::work`]) and the lease keeper ([`super::lease`]) both write.

use crate::registration::store::{CONDITION_AVAILABLE, CONDITION_HUB_ACCEPTED, ClusterStatus};

/// Reason of `Available=False` on a cluster the hub no longer accepts (`hubAcceptsClient=false`).
pub const REASON_REVOKED: &str = "ClusterRevoked";

/// Reason of `HubAcceptedManagedCluster=False` once an accepted cluster is revoked.
pub const REASON_ADMIN_REVOKED: &str = "HubClusterAdminRevoked";

/// Brings the acceptance conditions of `status` in line with `hub_accepts_client`: accepted →
/// `HubAcceptedManagedCluster=True`; revoked after having been accepted →
/// `HubAcceptedManagedCluster=False` and `Available=False` (a cluster still waiting for
/// acceptance keeps its `WaitingForAcceptance`). Returns whether a condition's status changed.
pub fn acceptance_conditions(
    status: &mut ClusterStatus,
    hub_accepts_client: bool,
    now: u64,
) -> bool {
    let is = |st: &ClusterStatus, t: &str, v: &str| st.condition(t).is_some_and(|c| c.status == v);
    if hub_accepts_client {
        if is(status, CONDITION_HUB_ACCEPTED, "True") {
            return false;
        }
        return status.set_condition(
            CONDITION_HUB_ACCEPTED,
            "True",
            "HubClusterAdminAccepted",
            "",
            now,
        );
    }
    let mut changed = false;
    if is(status, CONDITION_HUB_ACCEPTED, "True") {
        changed |= status.set_condition(
            CONDITION_HUB_ACCEPTED,
            "False",
            REASON_ADMIN_REVOKED,
            "hubAcceptsClient=false: set it to true (`flower-hub accept`) to let the cluster back in",
            now,
        );
    }
    if is(status, CONDITION_AVAILABLE, "True") {
        changed |= status.set_condition(
            CONDITION_AVAILABLE,
            "False",
            REASON_REVOKED,
            "hubAcceptsClient=false: the hub closed the cluster's work stream and sends it no work",
            now,
        );
    }
    changed
}

//! The Placement's status: `numberOfSelectedClusters`, the `PlacementSatisfied` and
//! `PlacementMisconfigured` conditions and the clusters left out, written only when it changed.

use std::collections::BTreeMap;

use flower_addon_crds::{Placement, PlacementStatus, UnselectedCluster};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;

use super::{CONDITION_MISCONFIGURED, CONDITION_SATISFIED, PlacementContext, time_at};
use crate::core::placement::PlacementOutcome;
use crate::kube::controller::Result;

/// The Placement status for `outcome` (conditions keep their transition time when unchanged).
pub fn placement_status(
    placement: &Placement,
    outcome: &PlacementOutcome,
    now: i64,
) -> PlacementStatus {
    let mut status = placement.status.clone().unwrap_or_default();
    status.number_of_selected_clusters = i32::try_from(outcome.selected.len()).unwrap_or(i32::MAX);
    let generation = placement.metadata.generation;
    set_condition(
        &mut status.conditions,
        CONDITION_MISCONFIGURED,
        "False",
        "Succeedconfigured",
        "Placement configurations check pass",
        generation,
        now,
    );
    let wanted = placement
        .spec
        .number_of_clusters
        .map_or_else(|| "at least 1".to_owned(), |n| n.to_string());
    let namespace = placement.namespace().unwrap_or_default();
    let (state, reason, message) = if let Some(scope) = outcome.scope {
        (
            "False",
            scope.reason(),
            scope.message(&namespace, &placement.spec.cluster_sets),
        )
    } else if outcome.satisfied {
        (
            "True",
            "AllDecisionsScheduled",
            format!("{} cluster(s) selected", outcome.selected.len()),
        )
    } else if outcome.selected.is_empty() {
        (
            "False",
            "NoManagedClusterMatched",
            format!("no cluster qualifies (wanted {wanted})"),
        )
    } else {
        (
            "False",
            "NotAllDecisionsScheduled",
            format!("{} of {wanted} cluster(s) selected", outcome.selected.len()),
        )
    };
    set_condition(
        &mut status.conditions,
        CONDITION_SATISFIED,
        state,
        reason,
        &message,
        generation,
        now,
    );
    status.unselected_clusters = outcome
        .excluded
        .iter()
        .map(|(cluster, why)| UnselectedCluster {
            cluster_name: cluster.clone(),
            reason: why.to_string(),
        })
        .collect();
    status
}

pub(super) fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: i64,
) {
    let fresh = Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time: time_at(now),
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if c.status == status => {
            c.reason = fresh.reason;
            c.message = fresh.message;
            c.observed_generation = fresh.observed_generation;
        }
        Some(c) => *c = fresh,
        None => conditions.push(fresh),
    }
}

/// Writes the status with server-side apply when it differs from the stored one.
pub(super) async fn write_status(
    placement: &Placement,
    ctx: &PlacementContext,
    namespace: &str,
    status: PlacementStatus,
) -> Result<()> {
    if placement.status.as_ref() == Some(&status) {
        return Ok(());
    }
    crate::kube::controller::apply::patch_status::<Placement>(
        &ctx.client,
        namespace,
        &placement.name_any(),
        &status,
    )
    .await
}

/// Unselected clusters by name (for tests and status readers).
pub fn unselected(status: &PlacementStatus) -> BTreeMap<String, String> {
    status
        .unselected_clusters
        .iter()
        .map(|u| (u.cluster_name.clone(), u.reason.clone()))
        .collect()
}

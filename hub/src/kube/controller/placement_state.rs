//! The state of the Placement a Federation names (none, OCM's, or ours), and how soon a
//! Federation is looked at again for it.
use super::*;

/// The state of the Placement `fed` names (none, OCM's, or ours from the cache).
pub(super) async fn placement_state(
    fed: &Federation,
    ctx: &Context,
    namespace: &str,
) -> PlacementState {
    match &fed.spec.placement_ref {
        None => PlacementState::NotReferenced,
        Some(r) if r.is_ocm() => ocm_placement_state(&ctx.client, namespace, &r.name).await,
        Some(r) => {
            let found = cache::cached(&ctx.caches.placements, namespace, &r.name);
            PlacementState::of(&r.name, found.as_deref())
        }
    }
}

/// How often a Federation naming an OCM Placement is reconciled at least: the hub does not
/// watch OCM's Placements, so their `PlacementSatisfied` reaches the Federation this late at most.
pub const OCM_PLACEMENT_RESYNC: Duration = Duration::from_secs(30);

/// When to reconcile again: at the resync, or when the SuperLink certificate is due if that is
/// sooner, and for an OCM-placed Federation within [`OCM_PLACEMENT_RESYNC`].
pub(super) fn requeue_after(renew_in: Option<Duration>, ocm: bool) -> Duration {
    let next = renew_in.map_or(RESYNC, |due| {
        due.clamp(Duration::from_secs(1), RESYNC) + Duration::from_millis(100)
    });
    if ocm {
        next.min(OCM_PLACEMENT_RESYNC)
    } else {
        next
    }
}

/// The state of OCM Placement `namespace/name` (read from the API server at each reconcile: only
/// Federations that name one pay for it), or that OCM is not installed.
pub(super) async fn ocm_placement_state(
    client: &Client,
    namespace: &str,
    name: &str,
) -> PlacementState {
    if !crate::kube::ocm::installed(client).await {
        return PlacementState::OcmNotInstalled {
            name: name.to_owned(),
        };
    }
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &crate::kube::ocm::placement_resource(),
    );
    match api.get_opt(name).await {
        Ok(None) => PlacementState::NotFound {
            name: name.to_owned(),
        },
        Ok(Some(placement)) => PlacementState::Found {
            name: name.to_owned(),
            satisfied: placement.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "PlacementSatisfied")
                .map(|c| {
                    let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
                    (text("status"), text("reason"), text("message"))
                }),
        },
        Err(e) => {
            tracing::warn!(%namespace, placement = %name, error = %e, "cannot read the OCM Placement");
            PlacementState::Found {
                name: name.to_owned(),
                satisfied: None,
            }
        }
    }
}

#[cfg(test)]
#[cfg(test)]
mod requeue_tests {
    use super::*;

    #[test]
    fn an_ocm_placed_federation_is_reconciled_often_enough_to_mirror_ocms_status() {
        assert_eq!(requeue_after(None, false), RESYNC);
        assert_eq!(requeue_after(None, true), OCM_PLACEMENT_RESYNC);
        let soon = Duration::from_secs(5);
        assert_eq!(
            requeue_after(Some(soon), true),
            soon + Duration::from_millis(100)
        );
        assert_eq!(
            requeue_after(Some(soon), false),
            soon + Duration::from_millis(100)
        );
        assert_eq!(
            requeue_after(Some(Duration::from_secs(3600)), false),
            RESYNC + Duration::from_millis(100)
        );
    }
}

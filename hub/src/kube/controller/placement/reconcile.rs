//! One reconcile of a Placement: its decisions from the clusters' views, written to its
//! PlacementDecisions, and its status.
use super::*;

/// Reconciles one Placement: evaluate → decisions → prune surplus pages → status.
pub async fn reconcile(placement: Arc<Placement>, ctx: Arc<PlacementContext>) -> Result<Action> {
    let name = placement.name_any();
    let namespace = placement
        .namespace()
        .ok_or_else(|| Error::NoNamespace(format!("Placement {name}")))?;
    if placement.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let now = now_seconds();
    let problems = validate_placement(&placement);
    if !problems.is_empty() {
        misconfigured(&placement, &ctx, &namespace, &problems, now).await?;
        return Ok(Action::await_change());
    }
    // The first reconciles can come before the watches have listed once (and several
    // Placements' reconciles wait at once: see `until_listed`).
    if crate::kube::list_gate::until_listed(&ctx.clusters)
        .await
        .is_err()
        || crate::kube::list_gate::until_listed(&ctx.decisions)
            .await
            .is_err()
        || crate::kube::list_gate::until_listed(&ctx.sets)
            .await
            .is_err()
        || crate::kube::list_gate::until_listed(&ctx.bindings)
            .await
            .is_err()
    {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let uid = placement.uid().unwrap_or_default();
    // Every Placement's decisions, from the cache: ours (the previous selection) and the
    // others' (how loaded each cluster is, for the Balance prioritizer).
    let (existing, others): (Vec<PlacementDecision>, Vec<PlacementDecision>) = ctx
        .decisions
        .state()
        .iter()
        .map(|d| d.as_ref().clone())
        .partition(|d| {
            d.namespace().as_deref() == Some(namespace.as_str())
                && d.labels().get(PLACEMENT_LABEL) == Some(&name)
                && d.owner_references().iter().any(|r| r.uid == uid)
        });
    let clusters = cluster_views(&ctx, &others);
    let previous: BTreeSet<String> = existing
        .iter()
        .flat_map(|d| d.status.iter().flat_map(|s| s.decisions.iter()))
        .map(|d| d.cluster_name.clone())
        .collect();
    let sets: Vec<ClusterSetView> = ctx
        .sets
        .state()
        .iter()
        .map(|s| ClusterSetView::from_api(s))
        .collect();
    let bindings = binding_pairs(ctx.bindings.state().iter().map(|b| b.as_ref()));
    let outcome = evaluate(
        &placement_policy(&placement, &sets, &bindings),
        &clusters,
        &previous,
        now,
    );
    let decisions_api = Api::<PlacementDecision>::namespaced(ctx.client.clone(), &namespace);
    write_decisions(&placement, &decisions_api, &existing, &outcome.selected).await?;
    let status = placement_status(&placement, &outcome, now);
    write_status(&placement, &ctx, &namespace, status).await?;
    if outcome.selected.iter().collect::<BTreeSet<_>>() != previous.iter().collect() {
        let named = crate::core::status::name_few(&outcome.selected);
        tracing::info!(placement = %name, %namespace, clusters = outcome.selected.len(), selected = %named, "decisions updated");
        let note = if outcome.selected.is_empty() {
            "no cluster selected".to_owned()
        } else {
            format!("selected: {named}")
        };
        ctx.publish(&placement, EventType::Normal, "DecisionUpdate", note)
            .await;
    }
    Ok(match outcome.requeue_after_secs {
        Some(secs) => Action::requeue(Duration::from_secs(secs.max(0) as u64 + 1).min(RESYNC)),
        None => Action::requeue(RESYNC),
    })
}

/// A misconfigured Placement keeps its decisions: its `PlacementMisconfigured` condition says
/// why (a Warning event when the message is new).
async fn misconfigured(
    placement: &Placement,
    ctx: &PlacementContext,
    namespace: &str,
    problems: &[flower_addon_crds::validate::FieldError],
    now: i64,
) -> Result<()> {
    let message = problems
        .iter()
        .map(|e| format!("{}: {}", e.path, e.message))
        .collect::<Vec<_>>()
        .join("; ");
    tracing::info!(placement = %placement.name_any(), %namespace, %message, "misconfigured; decisions kept");
    if placement
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == CONDITION_MISCONFIGURED)
        })
        .is_none_or(|c| c.status != "True" || c.message != message)
    {
        ctx.publish(
            placement,
            EventType::Warning,
            "Misconfigured",
            message.clone(),
        )
        .await;
    }
    let mut status = placement.status.clone().unwrap_or_default();
    set_condition(
        &mut status.conditions,
        CONDITION_MISCONFIGURED,
        "True",
        "Misconfigured",
        &message,
        placement.metadata.generation,
        now,
    );
    write_status(placement, ctx, namespace, status).await
}

/// Every ManagedCluster as placement sees it, by name, with how many decisions of `others`
/// (the other Placements) name it.
fn cluster_views(ctx: &PlacementContext, others: &[PlacementDecision]) -> Vec<ClusterView> {
    let mut clusters: Vec<ClusterView> = ctx
        .clusters
        .state()
        .iter()
        .map(|mc| cluster_view(mc))
        .collect();
    clusters.sort_by(|a, b| a.name.cmp(&b.name));
    let mut other_decisions: BTreeMap<String, u32> = BTreeMap::new();
    for d in others {
        for decision in d.status.iter().flat_map(|s| s.decisions.iter()) {
            *other_decisions
                .entry(decision.cluster_name.clone())
                .or_default() += 1;
        }
    }
    for cluster in &mut clusters {
        cluster.other_decisions = other_decisions.get(&cluster.name).copied().unwrap_or(0);
    }
    clusters
}

/// Applies the decision pages (one empty page when nothing is selected) and deletes the rest.
pub(super) async fn write_decisions(
    placement: &Placement,
    api: &Api<PlacementDecision>,
    existing: &[PlacementDecision],
    selected: &[String],
) -> Result<()> {
    let name = placement.name_any();
    let mut pages = paginate(&name, selected);
    if pages.is_empty() {
        pages.push((format!("{name}-decision-1"), Vec::new()));
    }
    let owner = crate::kube::controller::apply::controller_ref(placement);
    let params = PatchParams::apply(HUB_FIELD_MANAGER).force();
    for (page, clusters) in &pages {
        debug_assert!(clusters.len() <= DECISIONS_PER_PAGE);
        let decisions: Vec<ClusterDecision> = clusters
            .iter()
            .map(|c| ClusterDecision {
                cluster_name: c.clone(),
                reason: String::new(),
            })
            .collect();
        let current = existing.iter().find(|d| d.name_any() == *page);
        let meta_ok = current.is_some_and(|d| {
            d.labels().get(PLACEMENT_LABEL) == Some(&name)
                && d.owner_references()
                    .iter()
                    .any(|r| Some(r) == owner.as_ref())
        });
        if !meta_ok {
            let body = serde_json::json!({
                "apiVersion": API_VERSION,
                "kind": "PlacementDecision",
                "metadata": {
                    "name": page,
                    "labels": {PLACEMENT_LABEL: name},
                    "ownerReferences": owner.iter().collect::<Vec<_>>(),
                },
                "spec": {},
            });
            api.patch(page, &params, &Patch::Apply(&body))
                .await
                .map_err(kube_err(format!("apply PlacementDecision {page}")))?;
        }
        let stored = current
            .and_then(|d| d.status.as_ref())
            .map(|s| s.decisions.as_slice())
            .unwrap_or_default();
        if !meta_ok || stored != decisions.as_slice() {
            let body = serde_json::json!({
                "apiVersion": API_VERSION,
                "kind": "PlacementDecision",
                "status": {"decisions": decisions},
            });
            api.patch_status(page, &params, &Patch::Apply(&body))
                .await
                .map_err(kube_err(format!(
                    "patch status of PlacementDecision {page}"
                )))?;
        }
    }
    let wanted: BTreeSet<&str> = pages.iter().map(|(p, _)| p.as_str()).collect();
    for surplus in existing
        .iter()
        .filter(|d| !wanted.contains(d.name_any().as_str()))
    {
        let page = surplus.name_any();
        match api.delete(&page, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(placement = %name, %page, "surplus decision page deleted"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => {
                return Err(Error::Kube {
                    action: format!("delete PlacementDecision {page}"),
                    source,
                });
            }
        }
    }
    Ok(())
}

//! The objects one Federation's work becomes in a spoke: pure, also what `flower-hub render
//! --cluster` prints.
use super::*;

/// Renders one Federation's work: the CA Secret (TLS on), one workload per pool and the
/// headless Service of each StatefulSet pool, each marked with [`APPLIED_BY_LABEL`]. With SuperNode
/// authentication ([`FederationPlan::secure`]), each SuperNode reads its own key from the pool's key Secret ([`mount_node_keys`]); every
/// desired SuperNode is started (what `flower-hub render --cluster` prints). The agent applies
/// [`render_federation_with_keys`] instead, which starts only registered SuperNodes.
pub fn render_federation(plan: &FederationPlan) -> Result<Rendered, KubeRuntimeError> {
    let ca_secret_name = spoke_ca_secret_name(&plan.name);
    let secret = plan
        .ca_bundle_pem
        .as_deref()
        .map(|pem| ca_secret(plan, pem, &ca_secret_name));
    let mut workloads = Vec::with_capacity(plan.pools.len());
    let mut services = Vec::new();
    for pool in &plan.pools {
        let mut workload = render_supernode_pool(&SuperNodePoolInput {
            federation: &plan.name,
            namespace: &plan.namespace,
            spec: &plan.spec,
            pool: &pool.spec,
            dialect: plan.dialect,
            version: plan.version,
            fleet_address: &plan.fleet_address,
            ca_secret_name: &ca_secret_name,
            cluster: &pool.cluster,
        })
        .map_err(|source| KubeRuntimeError::Render {
            federation: plan.id(),
            source,
        })?;
        // A new CA bundle rolls the SuperNodes (they read it once, at start); so does a new
        // restart mark.
        let marks = [
            (crate::work::CA_DIGEST_ANNOTATION, plan.ca_digest()),
            (
                flower_addon_crds::SUPERNODE_RESTART_ANNOTATION,
                plan.supernode_restart.clone(),
            ),
        ];
        for (annotation, value) in marks {
            let Some(value) = value else { continue };
            let template = match &mut workload {
                Workload::StatefulSet(s) => &mut s.spec.template,
                Workload::DaemonSet(d) => &mut d.spec.template,
            };
            template
                .metadata
                .get_or_insert_with(Default::default)
                .annotations
                .get_or_insert_with(Default::default)
                .insert(annotation.to_owned(), value);
        }
        if plan.secure() {
            mount_node_keys(
                &mut workload,
                &node_key_secret_name(&plan.name, &pool.spec.name),
            );
        }
        let kind = match &mut workload {
            Workload::StatefulSet(s) => {
                mark(&mut s.metadata);
                let mut service =
                    pool_headless_service(&plan.name, &plan.namespace, &pool.spec.name);
                mark(&mut service.metadata);
                services.push(service);
                Kind::StatefulSet
            }
            Workload::DaemonSet(d) => {
                mark(&mut d.metadata);
                Kind::DaemonSet
            }
        };
        workloads.push((
            AppliedPool {
                name: pool.spec.name.clone(),
                workload: pool_workload_name(&plan.name, &pool.spec.name),
                kind,
                node_public_keys: Vec::new(),
                waiting: 0,
            },
            workload,
        ));
    }
    Ok(Rendered {
        secret,
        workloads,
        services,
    })
}

/// [`render_federation`] with the pools' SuperNode keys as they are on the cluster: each
/// pool starts only the SuperNodes whose key is registered ([`keys::gate_workload`]; a pool
/// missing from `keys` starts none) and reports every desired SuperNode's public key.
/// Federations without SuperNode authentication are rendered as by [`render_federation`].
pub fn render_federation_with_keys(
    plan: &FederationPlan,
    keys: &FederationKeys,
) -> Result<Rendered, KubeRuntimeError> {
    let mut rendered = render_federation(plan)?;
    if plan.secure() {
        let none = PoolKeys::default();
        for (pool, workload) in &mut rendered.workloads {
            let pool_keys = keys.get(&pool.name).unwrap_or(&none);
            pool.waiting = keys::gate_workload(workload, pool_keys);
            pool.node_public_keys = pool_keys.public.values().cloned().collect();
        }
    }
    Ok(rendered)
}

/// The pools a Federation's work declares, for status when it could not be rendered.
pub(super) fn declared_pools(fed: &FederationWork) -> Vec<AppliedPool> {
    let mode = serde_json::from_str::<FederationSpec>(&fed.federation_spec_json)
        .map(|s| s.mode)
        .unwrap_or(DeploymentMode::StatefulSet);
    fed.pools
        .iter()
        .map(|p| AppliedPool {
            name: p.name.clone(),
            workload: pool_workload_name(&fed.name, &p.name),
            kind: match mode {
                DeploymentMode::StatefulSet => Kind::StatefulSet,
                DeploymentMode::DaemonSet => Kind::DaemonSet,
            },
            node_public_keys: Vec::new(),
            waiting: 0,
        })
        .collect()
}

/// Adds the agent's ownership label (metadata only: selectors are immutable and stay the
/// renderer's).
pub(super) fn mark(meta: &mut ObjectMeta) {
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(APPLIED_BY_LABEL.to_owned(), AGENT_FIELD_MANAGER.to_owned());
}

/// The Secret with the SuperLink CA bundle (`ca.crt`) the pools mount.
fn ca_secret(plan: &FederationPlan, pem: &str, name: &str) -> Secret {
    let mut metadata = ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(plan.namespace.clone()),
        labels: Some(component_labels(
            &plan.name,
            "superlink-ca",
            "superlink-ca",
            None,
        )),
        ..ObjectMeta::default()
    };
    mark(&mut metadata);
    Secret {
        metadata,
        data: Some(BTreeMap::from([(
            CA_KEY.to_owned(),
            ByteString(pem.as_bytes().to_vec()),
        )])),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    }
}

//! What the hub renders for a Federation: the SuperLink (StatefulSet + Service) in the hub
//! cluster. The SuperNode pools are per-cluster work ([`crate::core::work`]) that each cluster's
//! runtime renders with the shared pure renderer ([`flower_addon_crds::render`], the only
//! SuperNode renderer): a spoke's agent, or the runtime the hub embeds for its own cluster.
//! [`render_problems`] checks here what that renderer would refuse.
//!
//! Everything here is pure and deterministic; owner references and server-side apply are the
//! controller's business.

mod address;
mod network_policy;
mod service;
mod superlink;

use flower_addon_crds::Federation;
use flower_addon_crds::render::{
    ClusterContext, DialectError, FlowerDialect, FlowerVersion, RenderError, SuperNodePoolInput,
    Workload, pool_workload_name, render_supernode_pool,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::NetworkPolicy;

pub use address::{ExternalAddressError, ExternalEndpoints, external_endpoints};
pub use flower_addon_crds::render::address::{host_of, with_default_port};
pub use network_policy::render_superlink_network_policy;
pub use service::{render_superlink_control_service, render_superlink_service};
pub use superlink::{
    OUTPUTS_MOUNT_DIR, OUTPUTS_PORT, STATE_MOUNT_DIR, STATE_VOLUME, SUPERLINK_CONTAINER,
    TLS_MOUNT_DIR, render_superlink,
};

/// Why a Federation cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HubRenderError {
    /// No Flower dialect could be chosen.
    #[error(transparent)]
    Dialect(#[from] DialectError),
    /// A pool cannot be rendered.
    #[error("spec.supernodes.pools[{index}]: {source}")]
    Pool {
        /// Position of the pool in the spec.
        index: usize,
        /// What is wrong.
        source: RenderError,
    },
    /// Pools run in spokes but no address for them to dial is known.
    #[error(transparent)]
    ExternalAddress(#[from] ExternalAddressError),
    /// Two Service ports share a number.
    #[error("spec.superlink.service.ports: {0}")]
    PortClash(String),
    /// Process isolation without a ServerApp SuperExec image.
    #[error(
        "spec.superlink.superexecImage: spec.superlink.superexecImage is required when isolationMode=process"
    )]
    MissingSuperExecImage,
    /// The Federation has no namespace or name.
    #[error("metadata: {0}")]
    Metadata(&'static str),
}

/// Objects the hub applies in its own cluster for one Federation.
#[derive(Clone, Debug, PartialEq)]
pub struct HubObjects {
    /// SuperLink StatefulSet `<fed>-superlink`.
    pub superlink: StatefulSet,
    /// SuperLink Service `<fed>-superlink` (what SuperNodes dial).
    pub service: Service,
    /// Control API Service `<fed>-superlink-control` (ClusterIP), only with `exposeControl`.
    pub control_service: Option<Service>,
    /// NetworkPolicy `<fed>-superlink`: the pod network reaches the SuperLink pod's Fleet port
    /// only (and Control with `exposeControl`).
    pub network_policy: NetworkPolicy,
}

impl HubObjects {
    /// Every object as JSON, in apply order (StatefulSet, Services, NetworkPolicy).
    pub fn to_values(&self) -> Result<Vec<serde_json::Value>, serde_json::Error> {
        let mut values = vec![
            serde_json::to_value(&self.superlink)?,
            serde_json::to_value(&self.service)?,
        ];
        if let Some(control) = &self.control_service {
            values.push(serde_json::to_value(control)?);
        }
        values.push(serde_json::to_value(&self.network_policy)?);
        Ok(values)
    }
}

/// The Federation's Flower version and dialect (`spec.version`, else the SuperLink image tag).
pub fn federation_dialect(
    fed: &Federation,
) -> Result<(FlowerVersion, FlowerDialect), HubRenderError> {
    Ok(FlowerDialect::select(
        fed.spec.version.as_deref(),
        &fed.spec.superlink.image,
    )?)
}

/// The warning for a Federation on a Flower release newer than the ones flower-addon is
/// verified with ([`FlowerVersion::unverified_warning`]): both modes show it (condition
/// `FlowerVersionVerified=False`; `warning` in `status.json`).
pub fn version_warning(fed: &Federation) -> Option<String> {
    federation_dialect(fed).ok()?.0.unverified_warning()
}

pub use crate::core::superlink::superlink_name;

/// Name of the Secret with the SuperLink's `tls.crt`, `tls.key` and `ca.crt`: `spec.tls.secretName`
/// or `<fed>-superlink-tls` (issued by the hub CA).
pub fn superlink_tls_secret_name(fed: &Federation) -> String {
    fed.spec
        .tls
        .as_ref()
        .and_then(|t| t.secret_name.clone())
        .unwrap_or_else(|| format!("{}-superlink-tls", name(fed)))
}

/// Fleet address for SuperNodes in the hub cluster: `<fed>-superlink.<ns>.svc:<ports.grpc>`, the
/// Service's real port (flower-operator always dialed 9092).
pub fn in_cluster_fleet_address(fed: &Federation) -> String {
    format!(
        "{}.{}.svc:{}",
        superlink_name(name(fed)),
        namespace(fed),
        fed.spec.superlink.service.ports.grpc
    )
}

/// Fleet address for SuperNodes in spoke clusters when it needs no live Service:
/// `spec.superlink.externalAddress` (with the Fleet port added when it has none), else the address
/// [`external_endpoints`] derives from the rendered Service (pinned node ports) and `node_address`.
pub fn spoke_fleet_address(
    fed: &Federation,
    node_address: Option<&str>,
) -> Result<String, HubRenderError> {
    let (_, dialect) = federation_dialect(fed)?;
    let service = render_superlink_service(fed, dialect)?;
    external_endpoints(fed, dialect, Some(&service), node_address)
        .map(|e| e.fleet)
        .map_err(HubRenderError::from)
}

fn name(fed: &Federation) -> &str {
    fed.metadata.name.as_deref().unwrap_or_default()
}

fn namespace(fed: &Federation) -> &str {
    fed.metadata.namespace.as_deref().unwrap_or("default")
}

fn check_metadata(fed: &Federation) -> Result<(), HubRenderError> {
    if name(fed).is_empty() {
        return Err(HubRenderError::Metadata("the Federation has no name"));
    }
    Ok(())
}

/// What the Federation controller applies in the hub cluster: the SuperLink StatefulSet and
/// Service. The pools, wherever they run, are per-cluster work ([`crate::core::work`]); without
/// `placementRef` that cluster is the hub's own ([`crate::core::HUB_CLUSTER`]).
pub fn render_hub(fed: &Federation) -> Result<HubObjects, HubRenderError> {
    check_metadata(fed)?;
    let (version, dialect) = federation_dialect(fed)?;
    let superlink = render_superlink(fed, version, dialect)?;
    let service = render_superlink_service(fed, dialect)?;
    let control_service = render_superlink_control_service(fed, dialect);
    let network_policy = render_superlink_network_policy(fed, dialect);
    Ok(HubObjects {
        superlink,
        service,
        control_service,
        network_policy,
    })
}

/// What the hub's pod policy refuses in the pods this Federation makes in the hub cluster, as
/// `(field path, message)` pairs: its SuperLink pod (`spec.superlink`), and, for a Federation
/// without a Placement (its pools run in the hub cluster), each pool
/// (`spec.supernodes.pools[i]`). Each message names the field and the `flower-hub serve`
/// flag that allows it. Rendered as the hub applies them (hardened, the template merged), so
/// what is judged is what would run. Empty when the Federation does not render (its render
/// problems say why).
pub fn policy_problems(
    fed: &Federation,
    policy: &flower_addon_crds::policy::PodPolicy,
) -> Vec<(String, String)> {
    let Ok((version, dialect)) = federation_dialect(fed) else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    if let Ok(superlink) = render_superlink(fed, version, dialect) {
        let own = std::collections::BTreeSet::from([superlink_tls_secret_name(fed)]);
        if let Some(spec) = &superlink.spec.template.spec {
            for v in policy.pod_violations(spec, &own) {
                problems.push(("spec.superlink".to_owned(), v));
            }
        }
    }
    if fed.spec.placement_ref.is_some() {
        return problems;
    }
    let fleet = in_cluster_fleet_address(fed);
    let ca = flower_addon_crds::render::spoke_ca_secret_name(name(fed));
    for (index, pool, rendered) in render_pools_alone(fed, version, dialect, &fleet, &ca) {
        let Ok(workload) = rendered else {
            continue;
        };
        let workload_name = pool_workload_name(name(fed), &pool);
        let own =
            std::collections::BTreeSet::from([ca.clone(), format!("{workload_name}-node-keys")]);
        let spec = match &workload {
            Workload::StatefulSet(s) => s.spec.template.spec.as_ref(),
            Workload::DaemonSet(d) => d.spec.template.spec.as_ref(),
        };
        for v in spec
            .map(|spec| policy.pod_violations(spec, &own))
            .unwrap_or_default()
        {
            problems.push((format!("spec.supernodes.pools[{index}]"), v));
        }
    }
    problems
}

/// Each pool of `fed` rendered as if it alone ran on one cluster (all of its replicas there),
/// dialling `fleet` with the CA Secret `ca`: `(index in spec.supernodes.pools, pool name,
/// result)`. What [`render_problems`] and [`policy_problems`] judge.
fn render_pools_alone(
    fed: &Federation,
    version: FlowerVersion,
    dialect: FlowerDialect,
    fleet: &str,
    ca: &str,
) -> Vec<(usize, String, Result<Workload, RenderError>)> {
    let shares =
        crate::core::work::split_work(&fed.spec, &["check".to_owned()], |p, _| Some(p.clone()));
    let share = shares.first().map(|s| &s.pools[..]).unwrap_or_default();
    share
        .iter()
        .map(|pool| {
            let context = ClusterContext {
                name: "check".to_owned(),
                index: 0,
                clusters: 1,
                partition_offset: u64::from(pool.partition_offset),
                partitions: shares.first().map_or(0, |s| u64::from(s.partitions_total)),
            };
            let input = SuperNodePoolInput {
                federation: name(fed),
                namespace: namespace(fed),
                spec: &fed.spec,
                pool: &pool.spec,
                dialect,
                version,
                fleet_address: fleet,
                ca_secret_name: ca,
                cluster: &context,
            };
            let index = fed
                .spec
                .supernodes
                .pools
                .iter()
                .position(|p| p.name == pool.spec.name)
                .unwrap_or_default();
            (index, pool.spec.name.clone(), render_supernode_pool(&input))
        })
        .collect()
}

/// Everything the renderer would refuse, as `(field path, message)` pairs, so `validate` reports
/// it before anything is applied (Flower version, placeholders the runtime cannot expand,
/// clashing ports).
pub fn render_problems(fed: &Federation) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let mut push = |err: HubRenderError| {
        let text = err.to_string();
        match text.split_once(": ") {
            Some((path, message)) => problems.push((path.to_owned(), message.to_owned())),
            None => problems.push((String::new(), text)),
        }
    };
    let (version, dialect) = match federation_dialect(fed) {
        Ok(found) => found,
        Err(err) => {
            push(err);
            return problems;
        }
    };
    if let Err(err) = render_superlink_service(fed, dialect) {
        push(err);
    }
    let ports = crate::core::superlink::SuperLinkPorts::from_spec(fed, dialect);
    if dialect.fleet_on_own_port() && ports.fleet == ports.control {
        // Flower < 1.40 serves Fleet (gRPC) and Control on servers of their own.
        push(HubRenderError::PortClash(format!(
            "grpc and extra are both {}: Flower {} serves the Fleet API (grpc) and the Control API (extra) on separate servers; give them different ports",
            ports.fleet, version
        )));
    } else if ports.front && ports.fleet == ports.control {
        // Standalone binds both on the hub machine; the rule holds in both modes alike.
        push(HubRenderError::PortClash(format!(
            "grpc and extra are both {}: the Fleet API (grpc, what SuperNodes dial) and the Control API (extra, kept off the Fleet endpoint) need their own ports unless exposeControl is set",
            ports.fleet
        )));
    }
    let fleet = if fed.spec.placement_ref.is_some() {
        // Where spokes dial depends on the mode (Kubernetes: the Service the hub creates;
        // standalone: the hub machine's address), so a missing externalAddress is not a spec
        // problem: the hub reports it in the Federation's status when it cannot derive one.
        external_endpoints(fed, dialect, None, Some("superlink.invalid"))
            .map_or_else(|_| "superlink.invalid:9092".to_owned(), |e| e.fleet)
    } else {
        in_cluster_fleet_address(fed)
    };
    for (index, _, rendered) in render_pools_alone(fed, version, dialect, &fleet, "check") {
        if let Err(source) = rendered {
            push(HubRenderError::Pool { index, source });
        }
    }
    problems
}

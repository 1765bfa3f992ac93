//! Federations and clusters as the standalone hub's passes see them.
use super::*;

pub(super) fn fed_key(fed: &Federation) -> FedKey {
    crate::core::federation_key(fed)
}

/// The Flower version and dialect of a Federation (`spec.version`, else the SuperLink tag);
/// versions without a supported dialect are refused with the field to fix.
pub fn federation_dialect(fed: &Federation) -> Result<(FlowerVersion, FlowerDialect), String> {
    crate::core::render::federation_dialect(fed).map_err(|e| e.to_string())
}

/// The placement view of a registered cluster, with the availability taint its `Available`
/// condition calls for — the same rule as Kubernetes mode
/// ([`ClusterStatus::availability_taint`](crate::registration::store::ClusterStatus::availability_taint)):
/// the channel's lease checker sets `Unknown` after [`crate::registration::store::LEASE_GRACE_TIMES`] missed
/// leases (also for clusters known before a hub restart), revocation sets `False`.
pub(super) fn cluster_view(record: &ClusterRecord) -> ClusterView {
    let taints = record
        .status
        .availability_taint()
        .map(|(key, added)| TaintView {
            key: key.into(),
            value: String::new(),
            effect: TaintEffect::NoSelect,
            time_added: Some(i64::try_from(added).unwrap_or(i64::MAX)),
        })
        .into_iter()
        .collect();
    let (allocatable_cpu_millis, allocatable_memory_bytes) =
        placement::allocatable_view(&record.status.allocatable);
    ClusterView {
        name: record.registration.name.clone(),
        labels: record.registration.labels.clone(),
        claims: record.registration.claims.clone(),
        accepted: record.hub_accepts_client,
        taints,
        allocatable_cpu_millis,
        allocatable_memory_bytes,
        other_decisions: 0,
    }
}

/// Why a pass could not place a Federation (shown in its status): one variant per step.
#[derive(Debug, thiserror::Error)]
pub(super) enum FederationError {
    /// `spec.version` or the SuperLink image names a Flower version without a dialect.
    #[error("{0}")]
    Dialect(#[from] crate::core::render::HubRenderError),
    /// Its SuperLink's certificate, process or host ports.
    #[error("{0}")]
    SuperLink(#[from] super::running::SuperLinkError),
    /// An OCM Placement, which only a Kubernetes hub reads.
    #[error(
        "spec.placementRef.apiGroup: cluster.open-cluster-management.io Placements are read from an Open Cluster Management hub, which a standalone hub does not have: drop apiGroup and place with a Placement in the manifests directory"
    )]
    OcmPlacement,
    /// The Placement it names is not in the manifests directory.
    #[error(
        "spec.placementRef.name: Placement {namespace}/{name} not found in the manifests directory"
    )]
    PlacementMissing { namespace: String, name: String },
    /// Its pools' work could not be encoded.
    #[error("{0}")]
    Work(#[from] serde_json::Error),
}

/// Where a Federation's pools go, from [`StandaloneHub::reconcile_federation`].
pub(super) struct Placed {
    /// Selected clusters.
    pub(super) selected: Vec<String>,
    /// Pools no selected cluster runs.
    pub(super) unplaced: Vec<String>,
    /// Why the Placement's cluster sets leave nothing to select from.
    pub(super) placement_problem: Option<String>,
    /// The certificate names the hub refused ([`crate::core::sans`]), shown as the error.
    pub(super) refused: Option<String>,
}

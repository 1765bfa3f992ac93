//! The flower-addon work channel (`flower.addon.v1`): Join, Renew and the Connect stream.
//!
//! The `.proto` files under `proto/flower/addon/v1/` are the source of truth; this crate only
//! includes the code generated from them by `build.rs` (protox + tonic-prost-build).
#![forbid(unsafe_code)]

/// Generated messages and services of package `flower.addon.v1`.
pub mod v1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("flower.addon.v1");
}

pub use v1::*;

/// Flower's SuperLink Control API (package `flwr.proto`): the few messages the hub uses to
/// register SuperNode keys and read node and run state, written from Flower's own descriptors.
pub mod flwr {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("flwr.proto");
}

/// Well-known protobuf types (`google.protobuf.Timestamp`) used by the messages.
pub use prost_types;

/// gRPC metadata key on a `PERMISSION_DENIED` that ends (or refuses) a cluster's work stream,
/// saying what the hub holds about the cluster: [`CLUSTER_DELETED`], [`CLUSTER_NOT_ACCEPTED`] or
/// [`CLUSTER_REKEYED`]. An agent stops its SuperNodes on any of them: the hub no longer trusts it
/// to run the Federations' code.
pub const CLUSTER_STATE_KEY: &str = "flower-addon-cluster-state";
/// The cluster is not registered with the hub (deleted).
pub const CLUSTER_DELETED: &str = "deleted";
/// The hub does not accept the cluster (`hubAcceptsClient: false`: pending or revoked).
pub const CLUSTER_NOT_ACCEPTED: &str = "not-accepted";
/// The cluster name is registered with another key (this agent's identity is stale).
pub const CLUSTER_REKEYED: &str = "rekeyed";

/// The agent as an Open Cluster Management addon: the name of its `ClusterManagementAddOn` and
/// `ManagedClusterAddOn`s (`manifests/ocm/`).
pub const OCM_ADDON_NAME: &str = "flower-addon";
/// The `signerName` of the addon's CSRs: flower-hub signs them with the work-channel CA, after
/// checking that the klusterlet of the cluster they name asked.
pub const OCM_ADDON_SIGNER: &str = "flower-addon.io/work-channel";
/// Common name of every certificate the hub issues to an addon agent (the `customSigner.subject`
/// of the `AddOnTemplate`, which OCM's klusterlet compares with the issued certificate); the
/// cluster is in the URI SAN [`OCM_ADDON_CLUSTER_URI_PREFIX`]`<cluster>`.
pub const OCM_ADDON_AGENT_CN: &str = "flower-addon-agent";
/// Prefix of the URI SAN naming the cluster in an addon agent's certificate.
pub const OCM_ADDON_CLUSTER_URI_PREFIX: &str = "urn:flower-addon:cluster:";

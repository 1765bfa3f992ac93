//! What a replica's arguments are computed from, owned (ports are chosen before arguments).
use super::*;

/// An owned copy of what a [`SuperNodePoolInput`] borrows, so argv can be computed after ports.
pub(super) struct OwnedInput {
    pub(super) federation: String,
    pub(super) namespace: String,
    pub(super) spec: FederationSpec,
    pub(super) pool: SuperNodePoolSpec,
    pub(super) dialect: FlowerDialect,
    pub(super) version: flower_addon_crds::render::FlowerVersion,
    pub(super) fleet_address: String,
    pub(super) ca_secret_name: String,
    pub(super) cluster: ClusterContext,
}

impl OwnedInput {
    pub(super) fn input(&self) -> SuperNodePoolInput<'_> {
        SuperNodePoolInput {
            federation: &self.federation,
            namespace: &self.namespace,
            spec: &self.spec,
            pool: &self.pool,
            dialect: self.dialect,
            version: self.version,
            fleet_address: &self.fleet_address,
            ca_secret_name: &self.ca_secret_name,
            cluster: &self.cluster,
        }
    }
}

pub(super) fn input_owned(input: &SuperNodePoolInput<'_>, cluster: &ClusterContext) -> OwnedInput {
    OwnedInput {
        federation: input.federation.to_owned(),
        namespace: input.namespace.to_owned(),
        spec: input.spec.clone(),
        pool: input.pool.clone(),
        dialect: input.dialect,
        version: input.version,
        fleet_address: input.fleet_address.to_owned(),
        ca_secret_name: input.ca_secret_name.to_owned(),
        cluster: cluster.clone(),
    }
}

//! Global partition numbering across every selected cluster.
//!
//! Every selected cluster runs every pool. SuperNodes are numbered cluster-major, then by pool
//! order in the spec, then by replica index: the replica `i` of pool `p` on the cluster at
//! position `c` gets `partition = c × per_cluster + offset(p) + i`, where `per_cluster` is the sum
//! of the StatefulSet pools' replicas. The numbering depends only on the spec and the cluster's
//! position, so it is the same whichever cluster computes it, and ids are unique and dense
//! (`0 … partitions-1`). DaemonSet pools have no replica count and take no partitions.

use crate::{DeploymentMode, FederationSpec};

/// Partition layout of one Federation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionPlan {
    pool_offsets: Vec<u64>,
    per_cluster: u64,
}

impl PartitionPlan {
    /// The layout of `spec`'s pools (replicas < 1 count as 0; validation rejects them).
    pub fn new(spec: &FederationSpec) -> Self {
        let mut pool_offsets = Vec::with_capacity(spec.supernodes.pools.len());
        let mut per_cluster = 0u64;
        for pool in &spec.supernodes.pools {
            pool_offsets.push(per_cluster);
            if spec.mode == DeploymentMode::StatefulSet {
                per_cluster += u64::try_from(pool.replicas.unwrap_or(0)).unwrap_or(0);
            }
        }
        Self {
            pool_offsets,
            per_cluster,
        }
    }

    /// SuperNodes (partitions) each cluster runs.
    pub fn per_cluster(&self) -> u64 {
        self.per_cluster
    }

    /// Partitions over `clusters` selected clusters.
    pub fn total(&self, clusters: u32) -> u64 {
        self.per_cluster * u64::from(clusters)
    }

    /// The partition of replica 0 of pool number `pool_index` on the cluster at `cluster_index`.
    pub fn offset(&self, cluster_index: u32, pool_index: usize) -> u64 {
        u64::from(cluster_index) * self.per_cluster
            + self.pool_offsets.get(pool_index).copied().unwrap_or(0)
    }
}

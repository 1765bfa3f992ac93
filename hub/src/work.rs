//! Per-cluster work: which pools each selected cluster runs, and the global partition numbering.
//!
//! Clusters are ordered by name (that order gives `{clusterIndex}`); inside a cluster, pools keep
//! the Federation's order. Partition offsets count every SuperNode before this pool on this
//! cluster across that order, so `{partition}` = offset + replica index is unique and stable over
//! all selected clusters and `{partitions}` is the total. DaemonSet pools have no replica count
//! known to the hub: they get no partition range (validation forbids `{partition}` there).
use flower_addon_crds::federation::{DeploymentMode, FederationSpec, SuperNodePoolSpec};

/// One pool on one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolShare {
    /// Pool name.
    pub pool: String,
    /// Replicas of the pool on this cluster (None for DaemonSet pools).
    pub replicas: Option<u32>,
    /// First global partition id of this pool on this cluster.
    pub partition_offset: u32,
}

/// What one selected cluster runs for a Federation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterShare {
    /// ManagedCluster name.
    pub cluster: String,
    /// Position of the cluster among the selected clusters (sorted by name), from 0.
    pub cluster_index: u32,
    /// Number of selected clusters.
    pub clusters: u32,
    /// Pools this cluster runs, in the Federation's order.
    pub pools: Vec<PoolShare>,
    /// SuperNodes over all selected clusters (`{partitions}`).
    pub partitions_total: u32,
}

/// Splits a Federation's pools over the selected clusters. `runs_on(pool, cluster)` says whether
/// a pool runs on a cluster (every pool runs on every cluster unless the pool narrows it).
pub fn split_work(
    spec: &FederationSpec,
    selected: &[String],
    runs_on: impl Fn(&SuperNodePoolSpec, &str) -> bool,
) -> Vec<ClusterShare> {
    let mut clusters: Vec<&String> = selected.iter().collect();
    clusters.sort();
    clusters.dedup();
    let count = u32::try_from(clusters.len()).unwrap_or(u32::MAX);
    let mut next_partition = 0u32;
    let mut shares: Vec<ClusterShare> = clusters
        .iter()
        .enumerate()
        .map(|(i, cluster)| {
            let pools = spec
                .supernodes
                .pools
                .iter()
                .filter(|pool| runs_on(pool, cluster))
                .map(|pool| {
                    let replicas = match spec.mode {
                        DeploymentMode::StatefulSet => {
                            Some(u32::try_from(pool.replicas.unwrap_or(1)).unwrap_or(0))
                        }
                        DeploymentMode::DaemonSet => None,
                    };
                    let share = PoolShare {
                        pool: pool.name.clone(),
                        replicas,
                        partition_offset: next_partition,
                    };
                    next_partition = next_partition.saturating_add(replicas.unwrap_or(0));
                    share
                })
                .collect();
            ClusterShare {
                cluster: (*cluster).clone(),
                cluster_index: u32::try_from(i).unwrap_or(u32::MAX),
                clusters: count,
                pools,
                partitions_total: 0,
            }
        })
        .collect();
    for share in &mut shares {
        share.partitions_total = next_partition;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> FederationSpec {
        serde_json::from_value(serde_saphyr::from_str::<serde_json::Value>(yaml).unwrap()).unwrap()
    }

    const TWO_POOLS: &str = r#"
mode: StatefulSet
isolationMode: subprocess
superlink: {image: "flwr/superlink:1.42.0"}
supernodes:
  image: "flwr/supernode:1.42.0"
  pools:
    - {name: a, replicas: 2, images: {}}
    - {name: b, replicas: 3, images: {}}
"#;

    #[test]
    fn partitions_are_global_and_stable_across_clusters() {
        // {partition} never repeats across clusters and does not depend on input order.
        let spec = spec(TWO_POOLS);
        let one = split_work(&spec, &["s2".into(), "s1".into()], |_, _| true);
        let two = split_work(&spec, &["s1".into(), "s2".into()], |_, _| true);
        assert_eq!(one, two);
        assert_eq!(one[0].cluster, "s1");
        assert_eq!(one[0].cluster_index, 0);
        assert_eq!(one[1].cluster_index, 1);
        let offsets: Vec<u32> = one
            .iter()
            .flat_map(|c| c.pools.iter().map(|p| p.partition_offset))
            .collect();
        assert_eq!(offsets, vec![0, 2, 5, 7]);
        assert!(
            one.iter()
                .all(|c| c.partitions_total == 10 && c.clusters == 2)
        );
    }

    #[test]
    fn pools_narrowed_to_clusters_only_count_where_they_run() {
        // A pool limited to one cluster adds partitions only there.
        let spec = spec(TWO_POOLS);
        let shares = split_work(&spec, &["s1".into(), "s2".into()], |pool, cluster| {
            (pool.name == "a") == (cluster == "s1")
        });
        assert_eq!(shares[0].pools.len(), 1);
        assert_eq!(shares[0].pools[0].pool, "a");
        assert_eq!(shares[1].pools[0].pool, "b");
        assert_eq!(shares[1].pools[0].partition_offset, 2);
        assert_eq!(shares[0].partitions_total, 5);
    }

    #[test]
    fn no_selected_cluster_means_no_work() {
        // An empty selection yields no shares rather than a share for a phantom cluster.
        assert!(split_work(&spec(TWO_POOLS), &[], |_, _| true).is_empty());
    }
}

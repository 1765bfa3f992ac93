//! Per-cluster work: which pools each selected cluster runs, the global partition numbering, and
//! the [`FederationWork`] message each cluster gets — one function for both hub modes.
//!
//! Clusters are ordered by name (that order gives `{clusterIndex}`); inside a cluster, pools keep
//! the Federation's order. Partition offsets count every SuperNode before this pool on this
//! cluster across that order, so `{partition}` = offset + replica index is unique and stable over
//! all selected clusters and `{partitions}` is the total. DaemonSet pools have no replica count
//! known to the hub: they get no partition range (validation forbids `{partition}` there).
use std::collections::BTreeMap;

use flower_addon_crds::federation::{
    ClusterOverride, DeploymentMode, FederationSpec, SuperNodePoolSpec,
};
use flower_addon_crds::render::FlowerVersion;
use flower_addon_crds::render::merge::merge_env;
use flower_addon_crds::{Federation, PLACEMENT_LABEL, PlacementDecision};
use flower_addon_proto::{FederationWork, PoolWork};
use k8s_openapi::api::core::v1::ResourceRequirements;

use crate::core::selector::selector_matches;

/// One pool on one cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolShare {
    /// Pool name.
    pub pool: String,
    /// The pool as this cluster runs it (cluster overrides merged in).
    pub spec: SuperNodePoolSpec,
    /// Replicas of the pool on this cluster (None for DaemonSet pools).
    pub replicas: Option<u32>,
    /// First global partition id of this pool on this cluster.
    pub partition_offset: u32,
}

/// What one selected cluster runs for a Federation.
#[derive(Clone, Debug, PartialEq)]
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

/// The pool as cluster `labels` runs it, or `None` when its `clusterSelector` leaves the
/// cluster out (no labels known: only pools without a selector run). Every
/// `spec.clusterOverrides` entry whose selector matches and that names this pool (or none) is
/// merged over it, in order.
pub fn pool_on_cluster(
    spec: &FederationSpec,
    pool: &SuperNodePoolSpec,
    labels: Option<&BTreeMap<String, String>>,
) -> Option<SuperNodePoolSpec> {
    match (&pool.cluster_selector, labels) {
        (Some(selector), Some(labels)) if !selector_matches(selector, labels) => return None,
        (Some(_), None) => return None,
        _ => {}
    }
    let mut effective = pool.clone();
    let Some(labels) = labels else {
        return Some(effective);
    };
    for o in &spec.cluster_overrides {
        let names_pool = o.pools.is_empty() || o.pools.contains(&pool.name);
        if names_pool && selector_matches(&o.cluster_selector, labels) {
            apply_override(&mut effective, o);
        }
    }
    Some(effective)
}

/// Merges one override over a pool: `image` and `replicas` replace, `env` merges by name,
/// `nodeConfig` by key, resources by resource name.
fn apply_override(pool: &mut SuperNodePoolSpec, o: &ClusterOverride) {
    if let Some(image) = &o.image {
        pool.images.supernode = Some(image.clone());
    }
    if let Some(replicas) = o.replicas {
        pool.replicas = Some(replicas);
    }
    merge_resources(
        &mut pool.supernode_resources,
        o.supernode_resources.as_ref(),
    );
    merge_resources(
        &mut pool.superexec_resources,
        o.superexec_resources.as_ref(),
    );
    pool.env = merge_env(&pool.env, &o.env);
    pool.node_config
        .extend(o.node_config.iter().map(|(k, v)| (k.clone(), v.clone())));
}

fn merge_resources(into: &mut Option<ResourceRequirements>, over: Option<&ResourceRequirements>) {
    let Some(over) = over else { return };
    let target = into.get_or_insert_with(ResourceRequirements::default);
    for (mine, theirs) in [
        (&mut target.limits, &over.limits),
        (&mut target.requests, &over.requests),
    ] {
        if let Some(theirs) = theirs {
            mine.get_or_insert_with(BTreeMap::new)
                .extend(theirs.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
}

/// Splits a Federation's pools over the selected clusters. `pool_for(pool, cluster)` gives the
/// pool as that cluster runs it, `None` when it does not run there ([`pool_on_cluster`]).
pub fn split_work(
    spec: &FederationSpec,
    selected: &[String],
    pool_for: impl Fn(&SuperNodePoolSpec, &str) -> Option<SuperNodePoolSpec>,
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
                .filter_map(|pool| pool_for(pool, cluster))
                .map(|pool| {
                    let replicas = match spec.mode {
                        DeploymentMode::StatefulSet => {
                            Some(u32::try_from(pool.replicas.unwrap_or(1)).unwrap_or(0))
                        }
                        DeploymentMode::DaemonSet => None,
                    };
                    let share = PoolShare {
                        pool: pool.name.clone(),
                        spec: pool,
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

/// Clusters decided for Placement `namespace/placement` (sorted, unique) that pass `known`,
/// from the `PlacementDecision`s labelled with that Placement.
pub fn decided<'a>(
    decisions: impl IntoIterator<Item = &'a PlacementDecision>,
    namespace: &str,
    placement: &str,
    known: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut selected: Vec<String> = decisions
        .into_iter()
        .filter(|d| {
            d.metadata.namespace.as_deref() == Some(namespace)
                && d.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(PLACEMENT_LABEL))
                    .map(String::as_str)
                    == Some(placement)
        })
        .flat_map(|d| d.status.iter().flat_map(|s| s.decisions.iter()))
        .map(|d| d.cluster_name.clone())
        .filter(|c| known(c))
        .collect();
    selected.sort();
    selected.dedup();
    selected
}

/// The clusters `fed`'s pools run in: those its Placement decided ([`decided`]), or the hub's
/// own cluster [`crate::core::HUB_CLUSTER`] when it has no `placementRef`.
pub fn placed_on<'a>(
    fed: &flower_addon_crds::Federation,
    decisions: impl IntoIterator<Item = &'a PlacementDecision>,
    known: impl Fn(&str) -> bool,
) -> Vec<String> {
    match &fed.spec.placement_ref {
        None => vec![crate::core::HUB_CLUSTER.to_owned()],
        Some(placement) => decided(
            decisions,
            fed.metadata.namespace.as_deref().unwrap_or_default(),
            &placement.name,
            known,
        ),
    }
}

/// What the per-cluster work of a Federation is computed from, besides the Federation.
#[derive(Clone, Copy, Debug)]
pub struct WorkInputs<'a> {
    /// Clusters selected for the Federation (any order; duplicates ignored).
    pub selected: &'a [String],
    /// Labels of every known cluster (pool `clusterSelector`, `spec.clusterOverrides`).
    pub labels: &'a BTreeMap<String, BTreeMap<String, String>>,
    /// Fleet address the selected clusters' SuperNodes dial.
    pub fleet_address: &'a str,
    /// CA bundle that signed the SuperLink certificate (ignored when `spec.insecure`).
    pub ca_pem: &'a str,
    /// SuperNode public keys registered with the Federation's SuperLink.
    pub registered_node_keys: &'a [String],
    /// SuperNode public keys the SuperLink refuses for ever (to be replaced by the agents).
    pub retired_node_keys: &'a [String],
}

/// A Federation's work, per selected cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct FederationWorks {
    /// `(cluster, work)` for each selected cluster, sorted by cluster name.
    pub per_cluster: Vec<(String, FederationWork)>,
    /// Pools that no selected cluster runs (their `clusterSelector` matches none).
    pub unplaced_pools: Vec<String>,
}

/// The work of `fed` (Flower `version`) for each selected cluster: its pools as that cluster runs
/// them (overrides merged, narrowed by `clusterSelector`), partitions numbered across clusters,
/// the Fleet address, the CA bundle (TLS on) and the registered node keys.
pub fn federation_work(
    fed: &Federation,
    version: FlowerVersion,
    inputs: &WorkInputs<'_>,
) -> Result<FederationWorks, serde_json::Error> {
    let spec = &fed.spec;
    let shares = split_work(spec, inputs.selected, |pool, cluster| {
        pool_on_cluster(spec, pool, inputs.labels.get(cluster))
    });
    let unplaced_pools = spec
        .supernodes
        .pools
        .iter()
        .filter(|p| {
            !shares
                .iter()
                .any(|s| s.pools.iter().any(|x| x.pool == p.name))
        })
        .map(|p| p.name.clone())
        .collect();
    let spec_json = serde_json::to_string(spec)?;
    let sorted = |keys: &[String]| {
        let mut keys = keys.to_vec();
        keys.sort();
        keys.dedup();
        keys
    };
    let (keys, retired) = if spec.supernode_auth() {
        (
            sorted(inputs.registered_node_keys),
            sorted(inputs.retired_node_keys),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let mut per_cluster = Vec::with_capacity(shares.len());
    for share in shares {
        let pools = share
            .pools
            .iter()
            .map(|p| {
                Ok(PoolWork {
                    name: p.pool.clone(),
                    partition_offset: p.partition_offset,
                    spec_json: serde_json::to_string(&p.spec)?,
                })
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()?;
        let (namespace, name) = super::federation_key(fed);
        let work = FederationWork {
            namespace,
            name,
            flower_version: format!("{}.{}.{}", version.major, version.minor, version.patch),
            superlink_fleet_address: inputs.fleet_address.to_owned(),
            ca_bundle_pem: if spec.insecure {
                String::new()
            } else {
                inputs.ca_pem.to_owned()
            },
            partitions_total: share.partitions_total,
            pools,
            federation_spec_json: spec_json.clone(),
            cluster_index: share.cluster_index,
            cluster_count: share.clusters,
            registered_node_keys: keys.clone(),
            retired_node_keys: retired.clone(),
            supernode_restart: flower_addon_crds::supernode_restart_mark(fed).unwrap_or_default(),
        };
        per_cluster.push((share.cluster, work));
    }
    Ok(FederationWorks {
        per_cluster,
        unplaced_pools,
    })
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
        let one = split_work(&spec, &["s2".into(), "s1".into()], |p, _| Some(p.clone()));
        let two = split_work(&spec, &["s1".into(), "s2".into()], |p, _| Some(p.clone()));
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
            ((pool.name == "a") == (cluster == "s1")).then(|| pool.clone())
        });
        assert_eq!(shares[0].pools.len(), 1);
        assert_eq!(shares[0].pools[0].pool, "a");
        assert_eq!(shares[1].pools[0].pool, "b");
        assert_eq!(shares[1].pools[0].partition_offset, 2);
        assert_eq!(shares[0].partitions_total, 5);
    }

    #[test]
    fn the_restart_mark_goes_to_every_selected_cluster() {
        // The Federation's annotation, trimmed, is in each cluster's work; absent, empty.
        let mut fed = Federation::new("fed", spec(TWO_POOLS));
        fed.metadata.namespace = Some("team".into());
        let selected = ["c1".to_owned(), "c2".to_owned()];
        let labels = BTreeMap::new();
        let inputs = WorkInputs {
            selected: &selected,
            labels: &labels,
            fleet_address: "hub:30092",
            ca_pem: "CA",
            registered_node_keys: &[],
            retired_node_keys: &[],
        };
        let marks = |fed: &Federation| -> Vec<String> {
            federation_work(
                fed,
                FlowerVersion::parse("1.42.0").expect("version"),
                &inputs,
            )
            .expect("work")
            .per_cluster
            .into_iter()
            .map(|(_, w)| w.supernode_restart)
            .collect()
        };
        assert_eq!(marks(&fed), ["", ""]);
        fed.metadata.annotations = Some(BTreeMap::from([(
            flower_addon_crds::SUPERNODE_RESTART_ANNOTATION.to_owned(),
            " 2026-12-06T06:00:00Z ".to_owned(),
        )]));
        assert_eq!(
            marks(&fed),
            ["2026-12-06T06:00:00Z", "2026-12-06T06:00:00Z"]
        );
    }

    #[test]
    fn no_selected_cluster_means_no_work() {
        // An empty selection yields no shares rather than a share for a phantom cluster.
        assert!(split_work(&spec(TWO_POOLS), &[], |p, _| Some(p.clone())).is_empty());
    }

    const OVERRIDES: &str = r#"
mode: StatefulSet
isolationMode: subprocess
placementRef: {name: p}
superlink: {image: "flwr/superlink:1.42.0"}
supernodes:
  image: "flwr/supernode:1.42.0"
  pools:
    - name: a
      replicas: 2
      env: [{name: KEEP, value: pool}, {name: MODE, value: pool}]
      nodeConfig: {lr: "0.1", batch: 32}
      supernodeResources: {limits: {cpu: "1", memory: 1Gi}}
    - {name: b, replicas: 1}
clusterOverrides:
  - clusterSelector: {matchLabels: {gpu: "yes"}}
    pools: [a]
    image: "example/supernode-gpu:1.42.0"
    replicas: 4
    env: [{name: MODE, value: gpu}]
    nodeConfig: {batch: 128}
    supernodeResources: {limits: {memory: 8Gi}}
  - clusterSelector: {matchLabels: {site: edge}}
    env: [{name: MODE, value: edge}]
"#;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn overrides_merge_over_pools_on_matching_clusters_only() {
        // env by name, nodeConfig by key, resources by name; image and replicas replace; a
        // cluster the selector does not match, or a pool the override does not name, is as
        // written.
        let spec = spec(OVERRIDES);
        let a = &spec.supernodes.pools[0];
        let gpu = pool_on_cluster(&spec, a, Some(&labels(&[("gpu", "yes")]))).unwrap();
        assert_eq!(gpu.replicas, Some(4));
        assert_eq!(
            gpu.images.supernode.as_deref(),
            Some("example/supernode-gpu:1.42.0")
        );
        let env: Vec<(String, String)> = gpu
            .env
            .iter()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(
            env,
            [
                ("KEEP".into(), "pool".into()),
                ("MODE".into(), "gpu".into())
            ]
        );
        assert_eq!(gpu.node_config["batch"].to_string(), "128");
        assert_eq!(gpu.node_config["lr"].to_string(), "0.1");
        let limits = gpu.supernode_resources.unwrap().limits.unwrap();
        assert_eq!(limits["cpu"].0, "1");
        assert_eq!(limits["memory"].0, "8Gi");

        let plain = pool_on_cluster(&spec, a, Some(&labels(&[("gpu", "no")]))).unwrap();
        assert_eq!(&plain, a);
        // Pool b is not named by the gpu override; the edge override names every pool.
        let b = &spec.supernodes.pools[1];
        assert_eq!(
            &pool_on_cluster(&spec, b, Some(&labels(&[("gpu", "yes")]))).unwrap(),
            b
        );
        // Both overrides match: applied in order, the later one wins on MODE.
        let both =
            pool_on_cluster(&spec, a, Some(&labels(&[("gpu", "yes"), ("site", "edge")]))).unwrap();
        assert_eq!(both.replicas, Some(4));
        assert!(
            both.env
                .iter()
                .any(|e| e.name == "MODE" && e.value.as_deref() == Some("edge"))
        );
    }

    #[test]
    fn overridden_replicas_count_in_the_global_partitions() {
        // s1 runs pool a with 4 replicas (override), s2 with 2: partitions stay dense and unique.
        let spec = spec(OVERRIDES);
        let all = BTreeMap::from([
            ("s1".to_string(), labels(&[("gpu", "yes")])),
            ("s2".to_string(), labels(&[])),
        ]);
        let shares = split_work(&spec, &["s1".into(), "s2".into()], |pool, cluster| {
            pool_on_cluster(&spec, pool, all.get(cluster))
        });
        let offsets: Vec<(u32, Option<u32>)> = shares
            .iter()
            .flat_map(|c| c.pools.iter().map(|p| (p.partition_offset, p.replicas)))
            .collect();
        assert_eq!(
            offsets,
            [(0, Some(4)), (4, Some(1)), (5, Some(2)), (7, Some(1))]
        );
        assert!(shares.iter().all(|c| c.partitions_total == 8));
        assert_eq!(shares[0].pools[0].spec.replicas, Some(4));
    }
}

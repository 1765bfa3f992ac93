//! [`WorkSource`] of the Kubernetes-mode hub: per-cluster work computed from the Federations
//! with a `placementRef` and the `PlacementDecision`s of their Placements on the hub apiserver.
//!
//! Three reflectors (Federations, PlacementDecisions, ManagedClusters) feed one recompute loop;
//! each pass splits every Federation's pools over the clusters its Placement decided
//! ([`crate::work::split_work`], pool `clusterSelector` on the ManagedCluster's labels) and hands
//! the clusters whose content changed to an [`InMemoryWorkSource`] (which versions the snapshots).
//! Nothing is computed before every reflector has listed once ([`KubeWorkSource::start`] waits),
//! so a restarted hub never sends a cluster an empty snapshot that would prune its workloads.
//! A Federation the hub cannot turn into work (invalid spec, no external address) keeps the work
//! it had: running SuperNodes keep running while the spec is fixed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use flower_addon_crds::{Federation, ManagedCluster, PLACEMENT_LABEL, PlacementDecision};
use flower_addon_proto::{ClusterWork, FederationWork, PoolWork, Status as AgentStatus};
use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::channel::{InMemoryWorkSource, WorkSource};
use crate::controller::placement::cluster_view;
use crate::placement::selector_matches;
use crate::render::{federation_dialect, spoke_fleet_address};
use crate::work::split_work;

/// How long the loop waits for more events before recomputing (coalesces bursts).
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Upper bound of the coalescing delay.
const MAX_DELAY: Duration = Duration::from_secs(1);
/// How long [`KubeWorkSource::start`] waits for the first lists.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the work source could not start.
#[derive(Debug, thiserror::Error)]
pub enum KubeWorkError {
    /// The reflectors did not list within the timeout (apiserver down, RBAC missing).
    #[error(
        "the hub apiserver did not list Federations, PlacementDecisions and ManagedClusters in {0:?}"
    )]
    NotReady(Duration),
}

/// The work of every cluster, kept current from the hub apiserver.
pub struct KubeWorkSource {
    inner: Arc<InMemoryWorkSource>,
    task: JoinHandle<()>,
}

impl Drop for KubeWorkSource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for KubeWorkSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeWorkSource").finish_non_exhaustive()
    }
}

struct Stores {
    federations: Store<Federation>,
    decisions: Store<PlacementDecision>,
    clusters: Store<ManagedCluster>,
}

impl KubeWorkSource {
    /// Starts the reflectors on `client`, waits until each has listed, computes the first work
    /// and returns. `ca_pem` is the CA bundle spokes use to verify SuperLinks.
    pub async fn start(client: Client, ca_pem: String) -> Result<Self, KubeWorkError> {
        let (federations, fed_writer) = reflector::store::<Federation>();
        let (decisions, dec_writer) = reflector::store::<PlacementDecision>();
        let (clusters, mc_writer) = reflector::store::<ManagedCluster>();
        let feds = reflector::reflector(
            fed_writer,
            watcher(Api::<Federation>::all(client.clone()), Default::default()),
        )
        .default_backoff()
        .map(|_| ())
        .boxed();
        let decs = reflector::reflector(
            dec_writer,
            watcher(
                Api::<PlacementDecision>::all(client.clone()),
                watcher::Config::default().labels(PLACEMENT_LABEL),
            ),
        )
        .default_backoff()
        .map(|_| ())
        .boxed();
        let mcs = reflector::reflector(
            mc_writer,
            watcher(Api::<ManagedCluster>::all(client), Default::default()),
        )
        .default_backoff()
        .map(|_| ())
        .boxed();
        let mut events = futures::stream::select_all([feds, decs, mcs]);
        let stores = Stores {
            federations,
            decisions,
            clusters,
        };
        let inner = Arc::new(InMemoryWorkSource::new());
        let (ready_tx, mut ready_rx) = watch::channel(false);
        let work = inner.clone();
        let task = tokio::spawn(async move {
            let mut state = State {
                ca_pem,
                sent: BTreeMap::new(),
                last_good: BTreeMap::new(),
            };
            let mut ready = false;
            while events.next().await.is_some() {
                // Coalesce a burst of events into one pass (bounded, so a steady stream of
                // heartbeats cannot starve the recompute).
                let deadline = tokio::time::Instant::now() + MAX_DELAY;
                while let Ok(Some(_)) = tokio::time::timeout_at(
                    deadline.min(tokio::time::Instant::now() + DEBOUNCE),
                    events.next(),
                )
                .await
                {}
                if !ready {
                    ready = is_ready(&stores);
                    if !ready {
                        continue;
                    }
                }
                state.recompute(&stores, &work);
                let _ = ready_tx.send(true);
            }
            tracing::warn!("work source watches ended");
        });
        let waited = tokio::time::timeout(READY_TIMEOUT, ready_rx.wait_for(|r| *r)).await;
        if !matches!(waited, Ok(Ok(_))) {
            task.abort();
            return Err(KubeWorkError::NotReady(READY_TIMEOUT));
        }
        Ok(Self { inner, task })
    }

    /// The in-memory source behind this one (acks and last status per cluster).
    pub fn inner(&self) -> &Arc<InMemoryWorkSource> {
        &self.inner
    }
}

fn is_ready(stores: &Stores) -> bool {
    use futures::FutureExt;
    // A store is ready once its first list is complete.
    [
        stores.federations.wait_until_ready().boxed().now_or_never(),
        stores.decisions.wait_until_ready().boxed().now_or_never(),
        stores.clusters.wait_until_ready().boxed().now_or_never(),
    ]
    .iter()
    .all(|r| matches!(r, Some(Ok(()))))
}

type FedKey = (String, String);

struct State {
    ca_pem: String,
    sent: BTreeMap<String, ClusterWork>,
    last_good: BTreeMap<FedKey, Vec<(String, FederationWork)>>,
}

impl State {
    fn recompute(&mut self, stores: &Stores, work: &InMemoryWorkSource) {
        let clusters: Vec<Arc<ManagedCluster>> = stores.clusters.state();
        let labels: BTreeMap<String, BTreeMap<String, String>> = clusters
            .iter()
            .map(|mc| {
                let view = cluster_view(mc);
                (view.name, view.labels)
            })
            .collect();
        let decisions = stores.decisions.state();
        let mut per_cluster: BTreeMap<String, Vec<FederationWork>> = BTreeMap::new();
        let mut live = BTreeSet::new();
        for fed in stores.federations.state() {
            let Some(placement) = fed.spec.placement_ref.as_ref() else {
                continue;
            };
            let namespace = fed.namespace().unwrap_or_default();
            let key = (namespace.clone(), fed.name_any());
            live.insert(key.clone());
            let mut selected: Vec<String> = decisions
                .iter()
                .filter(|d| {
                    d.namespace().as_deref() == Some(namespace.as_str())
                        && d.labels().get(PLACEMENT_LABEL) == Some(&placement.name)
                })
                .flat_map(|d| d.status.iter().flat_map(|s| s.decisions.iter()))
                .map(|d| d.cluster_name.clone())
                .filter(|c| labels.contains_key(c))
                .collect();
            selected.sort();
            selected.dedup();
            let works = match federation_work(&fed, &selected, &labels, &self.ca_pem) {
                Ok(works) => {
                    self.last_good.insert(key.clone(), works.clone());
                    works
                }
                Err(error) => {
                    tracing::warn!(namespace = %key.0, federation = %key.1, %error, "no new work for this Federation; keeping what runs");
                    self.last_good.get(&key).cloned().unwrap_or_default()
                }
            };
            for (cluster, fw) in works {
                per_cluster.entry(cluster).or_default().push(fw);
            }
        }
        self.last_good.retain(|k, _| live.contains(k));

        let names: BTreeSet<String> = labels
            .keys()
            .cloned()
            .chain(self.sent.keys().cloned())
            .collect();
        let mut changed = Vec::new();
        for name in names {
            let content = ClusterWork {
                version: 0,
                cluster_name: name.clone(),
                cluster_index: 0,
                cluster_count: 0,
                federations: per_cluster.remove(&name).unwrap_or_default(),
            };
            if self.sent.get(&name) != Some(&content) {
                tracing::info!(cluster = %name, federations = content.federations.len(), "work changed: sending a new snapshot");
                self.sent.insert(name.clone(), content.clone());
                changed.push((name, content));
            }
        }
        if !changed.is_empty() {
            work.set_many(changed);
        }
    }
}

/// The work of `fed` for each cluster of `selected` (sorted names), as `(cluster, work)`.
/// `labels` holds each cluster's labels (for pools with a `clusterSelector`).
#[allow(clippy::needless_update)]
pub fn federation_work(
    fed: &Federation,
    selected: &[String],
    labels: &BTreeMap<String, BTreeMap<String, String>>,
    ca_pem: &str,
) -> Result<Vec<(String, FederationWork)>, String> {
    let problems = crate::controller::problems(fed);
    if !problems.is_empty() {
        return Err(problems
            .iter()
            .map(|(p, m)| format!("{p}: {m}"))
            .collect::<Vec<_>>()
            .join("; "));
    }
    let (version, _dialect) = federation_dialect(fed).map_err(|e| e.to_string())?;
    let fleet = spoke_fleet_address(fed).map_err(|e| e.to_string())?;
    let spec_json = serde_json::to_string(&fed.spec).map_err(|e| e.to_string())?;
    let shares = split_work(&fed.spec, selected, |pool, cluster| {
        match (&pool.cluster_selector, labels.get(cluster)) {
            (Some(sel), Some(labels)) => selector_matches(sel, labels),
            (Some(_), None) => false,
            (None, _) => true,
        }
    });
    let mut out = Vec::with_capacity(shares.len());
    for share in shares {
        let mut pools = Vec::with_capacity(share.pools.len());
        for p in &share.pools {
            let Some(pool) = fed.spec.supernodes.pools.iter().find(|x| x.name == p.pool) else {
                continue;
            };
            pools.push(PoolWork {
                name: p.pool.clone(),
                partition_offset: p.partition_offset,
                spec_json: serde_json::to_string(pool).map_err(|e| e.to_string())?,
            });
        }
        out.push((
            share.cluster.clone(),
            FederationWork {
                namespace: fed.namespace().unwrap_or_default(),
                name: fed.name_any(),
                flower_version: format!("{}.{}.{}", version.major, version.minor, version.patch),
                mode: format!("{:?}", fed.spec.mode),
                isolation_mode: match fed.spec.isolation_mode {
                    flower_addon_crds::IsolationMode::Process => "process".into(),
                    flower_addon_crds::IsolationMode::Subprocess => "subprocess".into(),
                },
                insecure: fed.spec.insecure,
                superlink_fleet_address: fleet.clone(),
                ca_bundle_pem: if fed.spec.insecure {
                    String::new()
                } else {
                    ca_pem.to_owned()
                },
                partitions_total: share.partitions_total,
                pools,
                federation_spec_json: spec_json.clone(),
                cluster_index: share.cluster_index,
                cluster_count: share.clusters,
                registered_node_keys: Vec::new(),
                // Fields added to the message later keep their defaults here.
                ..Default::default()
            },
        ));
    }
    Ok(out)
}

impl WorkSource for KubeWorkSource {
    fn snapshot(&self, cluster: &str) -> ClusterWork {
        self.inner.snapshot(cluster)
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes()
    }

    fn on_ack(&self, cluster: &str, version: u64) {
        self.inner.on_ack(cluster, version);
    }

    fn on_status(&self, cluster: &str, status: &AgentStatus) {
        self.inner.on_status(cluster, status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn federation(pools: &str) -> Federation {
        let yaml = format!(
            r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {{name: fed, namespace: team}}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  insecure: false
  placementRef: {{name: both}}
  superlink: {{image: "flwr/superlink:1.42.0", externalAddress: "hub.example:30092"}}
  supernodes:
    image: "flwr/supernode:1.42.0"
    pools: {pools}
"#
        );
        serde_saphyr::from_str(&yaml).expect("federation")
    }

    #[test]
    fn pools_split_over_the_decided_clusters_with_global_partitions() {
        // Invariant: every decided cluster gets every pool (unless its clusterSelector excludes
        // the cluster), partitions are numbered across clusters by name, and the spoke gets the
        // external Fleet address and the CA bundle.
        let fed = federation(
            r#"[{name: a, replicas: 2, images: {}},
                {name: gpu, replicas: 1, images: {}, clusterSelector: {matchLabels: {gpu: "yes"}}}]"#,
        );
        let labels = BTreeMap::from([
            ("s1".to_string(), BTreeMap::new()),
            (
                "s2".to_string(),
                BTreeMap::from([("gpu".to_string(), "yes".to_string())]),
            ),
        ]);
        let works =
            federation_work(&fed, &["s1".into(), "s2".into()], &labels, "CA").expect("work");
        assert_eq!(works.len(), 2);
        let (c1, w1) = &works[0];
        let (c2, w2) = &works[1];
        assert_eq!((c1.as_str(), c2.as_str()), ("s1", "s2"));
        assert_eq!(
            w1.pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
        assert_eq!(
            w2.pools
                .iter()
                .map(|p| (p.name.as_str(), p.partition_offset))
                .collect::<Vec<_>>(),
            [("a", 2), ("gpu", 4)]
        );
        assert_eq!(w1.partitions_total, 5);
        assert_eq!(w2.superlink_fleet_address, "hub.example:30092");
        assert_eq!(w2.ca_bundle_pem, "CA");
        assert_eq!((w1.cluster_index, w1.cluster_count), (0, 2));
    }

    #[test]
    fn an_invalid_federation_yields_no_new_work() {
        // Invariant: a Federation the renderer refuses gives an error (the caller keeps the old
        // work) instead of an empty list that would prune running SuperNodes.
        let mut fed = federation("[{name: a, replicas: 1, images: {}}]");
        fed.spec.superlink.external_address = None;
        assert!(federation_work(&fed, &["s1".into()], &BTreeMap::new(), "CA").is_err());
    }
}

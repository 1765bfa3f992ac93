//! One pass of the work source: every Federation's work per cluster, recomputed only for the
//! Federations whose inputs changed, and the clusters whose work changed handed on.
use super::*;

/// A hash of `work`'s encoding (what tells whether a cluster's work changed).
pub(super) fn work_hash(work: &ClusterWork) -> u64 {
    use prost::Message;
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    work.encode_to_vec().hash(&mut hasher);
    hasher.finish()
}

pub(super) struct State {
    pub(super) ca: Arc<HubCa>,
    /// The hub admin's pod policy ([`crate::core::problems`]).
    pub(super) policy: PodPolicy,
    pub(super) registry: Arc<NodeKeyRegistry>,
    /// A hash of the work last sent to each cluster (the work itself is the inner source's):
    /// 10,000 clusters' work is held once, not once more here.
    pub(super) sent: BTreeMap<String, u64>,
    pub(super) last_good: BTreeMap<FedKey, Arc<Vec<(String, FederationWork)>>>,
    /// Each Federation's last computed work and the fingerprint of what it was computed from
    /// ([`work_inputs`]): a pass renders only the Federations whose inputs changed, so its cost
    /// grows with what changed, not with how many Federations there are.
    pub(super) memo: BTreeMap<FedKey, (u64, Rendered)>,
    /// Federations whose work is held while their SuperLink rolls out.
    pub(super) holds: hold::Holds,
}

/// The work of one Federation per cluster, or why there is none.
pub(super) type Rendered = Result<Arc<Vec<(String, FederationWork)>>, String>;

/// Fingerprint of everything [`federation_work`] reads besides the CA (fixed for a source's
/// life): the Federation's identity and spec (its `generation`), its Fleet address, the clusters
/// selected, their labels and the SuperLink's node keys. `None` when the Federation has no
/// generation (never from an apiserver): it is then computed every pass.
pub(super) fn work_inputs(
    fed: &Federation,
    selected: &[String],
    labels: &BTreeMap<String, BTreeMap<String, String>>,
    registered: &[String],
    retired: &[String],
) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let generation = fed.metadata.generation?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    fed.metadata.uid.hash(&mut hasher);
    generation.hash(&mut hasher);
    fed.status
        .as_ref()
        .and_then(|s| s.endpoints.as_ref())
        .and_then(|e| e.fleet.as_deref())
        .hash(&mut hasher);
    for cluster in selected {
        cluster.hash(&mut hasher);
        labels.get(cluster).hash(&mut hasher);
    }
    registered.hash(&mut hasher);
    retired.hash(&mut hasher);
    flower_addon_crds::supernode_restart_mark(fed).hash(&mut hasher);
    Some(hasher.finish())
}

impl State {
    /// Recomputes every cluster's work; returns when a hold runs out (recompute again then).
    pub(super) fn recompute(
        &mut self,
        stores: &Stores,
        work: &InMemoryWorkSource,
    ) -> Option<tokio::time::Instant> {
        let clusters: Vec<Arc<ManagedCluster>> = stores.clusters.state();
        let mut labels: BTreeMap<String, BTreeMap<String, String>> = clusters
            .iter()
            .map(|mc| {
                let view = cluster_view(mc);
                (view.name, view.labels)
            })
            .collect();
        // The hub's own cluster (pools of Federations without placementRef) has no
        // ManagedCluster and no labels (validation refuses a pool clusterSelector there).
        labels.insert(HUB_CLUSTER.to_owned(), BTreeMap::new());
        let decided = Decided::of(stores);
        let mut per_cluster: BTreeMap<String, Vec<FederationWork>> = BTreeMap::new();
        let mut live = BTreeSet::new();
        let federations = stores.federations.state();
        let (held, hold_ends) = self.holds.update(
            &federations,
            &stores.superlinks,
            tokio::time::Instant::now(),
        );
        for fed in federations {
            let namespace = fed.namespace().unwrap_or_default();
            let key = (namespace.clone(), fed.name_any());
            live.insert(key.clone());
            let selected = decided.placed_on(&fed, |c| c != HUB_CLUSTER && labels.contains_key(c));
            let fed_labels = decided.labels(&fed, &labels);
            let registered = self.registry.registered(&key);
            let retired = self.registry.retired(&key);
            let inputs = work_inputs(&fed, &selected, fed_labels, &registered, &retired);
            let memo = self
                .memo
                .get(&key)
                .filter(|(at, _)| inputs == Some(*at))
                .map(|(_, result)| result.clone());
            let fresh = memo.is_none();
            let result = memo.unwrap_or_else(|| {
                let bundle = self
                    .ca
                    .federation(&key.0, &key.1)
                    .map_err(|e| format!("cannot derive the Federation's SuperLink CA: {e}"))?;
                federation_work(
                    &fed,
                    &selected,
                    fed_labels,
                    bundle.bundle_pem(),
                    &registered,
                    &retired,
                    &self.policy,
                )
                .map(Arc::new)
            });
            if let Some(inputs) = inputs.filter(|_| fresh) {
                self.memo.insert(key.clone(), (inputs, result.clone()));
            }
            let works = match result {
                Ok(works) => {
                    if fresh {
                        self.last_good.insert(key.clone(), works.clone());
                    }
                    works
                }
                Err(error) => {
                    if fresh {
                        tracing::warn!(namespace = %key.0, federation = %key.1, %error, "no new work for this Federation; keeping what runs");
                    }
                    self.last_good.get(&key).cloned().unwrap_or_default()
                }
            };
            for (cluster, fw) in works.iter() {
                per_cluster
                    .entry(cluster.clone())
                    .or_default()
                    .push(fw.clone());
            }
        }
        self.last_good.retain(|k, _| live.contains(k));
        self.memo.retain(|k, _| live.contains(k));

        let names: BTreeSet<String> = labels
            .keys()
            .cloned()
            .chain(self.sent.keys().cloned())
            .collect();
        let mut changed = Vec::new();
        for name in names {
            let wanted = per_cluster.remove(&name).unwrap_or_default();
            let sent = self.sent.contains_key(&name).then(|| work.snapshot(&name));
            let Some(federations) = crate::core::hold::hold(wanted, sent.as_ref(), &held) else {
                continue;
            };
            let content = ClusterWork {
                version: 0,
                cluster_name: name.clone(),
                federations,
            };
            let hash = work_hash(&content);
            if self.sent.get(&name) != Some(&hash) {
                tracing::debug!(cluster = %name, federations = content.federations.len(), "work changed: sending a new snapshot");
                self.sent.insert(name.clone(), hash);
                changed.push((name, content));
            }
        }
        if !changed.is_empty() {
            let names: Vec<String> = changed.iter().map(|(n, _)| n.clone()).collect();
            tracing::info!(clusters = names.len(), changed = %crate::core::status::name_few(&names), "work changed: sending new snapshots");
            work.set_many(changed);
        }
        hold_ends
    }
}

/// The Fleet address spokes dial: `externalAddress` as written (Fleet port added), else what the
/// Federation controller derived from the SuperLink Service into `status.endpoints.fleet`.
pub(super) fn fleet_address(fed: &Federation) -> Result<String, String> {
    if fed.spec.superlink.external_address.is_some() {
        return spoke_fleet_address(fed, None).map_err(|e| e.to_string());
    }
    fed.status
        .as_ref()
        .and_then(|s| s.endpoints.as_ref())
        .and_then(|e| e.fleet.clone())
        .ok_or_else(|| {
            "waiting for the SuperLink's external address (status.endpoints.fleet, derived from its Service)".to_owned()
        })
}

/// The work of `fed` for each cluster of `selected`, as `(cluster, work)` sorted by cluster
/// ([`crate::core::work::federation_work`] with the Kubernetes mode's inputs). `labels` holds
/// each cluster's labels (for pools with a `clusterSelector`).
pub fn federation_work(
    fed: &Federation,
    selected: &[String],
    labels: &BTreeMap<String, BTreeMap<String, String>>,
    ca_pem: &str,
    registered_node_keys: &[String],
    retired_node_keys: &[String],
    policy: &PodPolicy,
) -> Result<Vec<(String, FederationWork)>, String> {
    let problems = crate::core::problems::problems(fed, policy);
    if !problems.is_empty() {
        return Err(crate::core::problems::joined(&problems));
    }
    let (version, _dialect) = federation_dialect(fed).map_err(|e| e.to_string())?;
    // In the hub's own cluster SuperNodes dial the SuperLink Service by its in-cluster name.
    let fleet = match fed.spec.placement_ref {
        None => in_cluster_fleet_address(fed),
        Some(_) => fleet_address(fed)?,
    };
    let inputs = WorkInputs {
        selected,
        labels,
        fleet_address: &fleet,
        ca_pem,
        registered_node_keys,
        retired_node_keys,
    };
    crate::core::work::federation_work(fed, version, &inputs)
        .map(|w| w.per_cluster)
        .map_err(|e| e.to_string())
}

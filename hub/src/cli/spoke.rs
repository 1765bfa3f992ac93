//! `flower-hub render --cluster X`: what X's agent applies, computed by the code that runs — the
//! hub's work split ([`crate::core::work::federation_work`]) produces the message X gets, and
//! the agent's decoder and renderer ([`flower_addon_runtime::work::decode_federation`],
//! [`flower_addon_runtime::kube_runtime::render_federation`]) turn it into objects.
use std::collections::BTreeMap;

use flower_addon_crds::{Federation, ManagedCluster, Object};
use flower_addon_proto::ClusterWork;
use flower_addon_runtime::kube_runtime::{Rendered, render_federation};

use crate::core::render::federation_dialect;
use crate::core::work::{WorkInputs, decided, federation_work};

/// The clusters a Federation is split over, as `render --cluster` knows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpokeSelection {
    /// The cluster rendered.
    pub cluster: String,
    /// Every selected cluster (the rendered one included).
    pub selected: Vec<String>,
    /// Labels of the clusters.
    pub labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl SpokeSelection {
    /// `cluster` at position `index` of `clusters` selected clusters (sorted by name), the
    /// others standing in with the same labels (so they run the same pools): exact when every
    /// selected cluster runs the same pools, and for `{cluster}`/`{clusterIndex}`/`{clusters}`.
    pub fn positional(
        cluster: &str,
        index: u32,
        clusters: u32,
        labels: &BTreeMap<String, String>,
    ) -> Self {
        // Stand-in names sort before ('\u{1}') or after ('\u{7f}') any DNS label.
        let selected: Vec<String> = (0..clusters.max(1))
            .map(|i| match i.cmp(&index) {
                std::cmp::Ordering::Less => format!("\u{1}{i:05}"),
                std::cmp::Ordering::Equal => cluster.to_owned(),
                std::cmp::Ordering::Greater => format!("\u{7f}{i:05}"),
            })
            .collect();
        let labels = selected
            .iter()
            .map(|c| (c.clone(), labels.clone()))
            .collect();
        Self {
            cluster: cluster.to_owned(),
            selected,
            labels,
        }
    }

    /// The hub's own selection when `objects` hold the PlacementDecisions of `fed`'s Placement
    /// (and the ManagedClusters, for labels): exactly what the hub computes. `None` when they
    /// decide nothing for it. `labels` are used for `cluster` when its ManagedCluster is absent.
    pub fn from_decisions(
        fed: &Federation,
        cluster: &str,
        objects: &[Object],
        labels: &BTreeMap<String, String>,
    ) -> Option<Self> {
        // OCM's decisions are not among the addon's objects.
        let placement = fed.spec.placement_ref.as_ref().filter(|r| !r.is_ocm())?;
        let namespace = fed.metadata.namespace.as_deref().unwrap_or("default");
        let decisions = objects.iter().filter_map(|o| match o {
            Object::PlacementDecision(d) => Some(d),
            _ => None,
        });
        let selected = decided(decisions, namespace, &placement.name, |_| true);
        if selected.is_empty() {
            return None;
        }
        let mut known: BTreeMap<String, BTreeMap<String, String>> = objects
            .iter()
            .filter_map(|o| match o {
                Object::ManagedCluster(mc) => Some(cluster_labels(mc)),
                _ => None,
            })
            .collect();
        known
            .entry(cluster.to_owned())
            .or_insert_with(|| labels.clone());
        Some(Self {
            cluster: cluster.to_owned(),
            selected,
            labels: known,
        })
    }
}

fn cluster_labels(mc: &ManagedCluster) -> (String, BTreeMap<String, String>) {
    let view = crate::kube::controller::placement::cluster_view(mc);
    (view.name, view.labels)
}

/// What `selection.cluster`'s agent applies for `fed` when the hub sends `fleet` as the Fleet
/// address and `ca_pem` as the CA bundle; `None` when the cluster runs nothing of it. The CA
/// Secret is left out (its content is the running hub's CA), and with `ca_pem` empty (offline,
/// the CA unknown) so is the pod templates' CA digest.
pub fn spoke_objects(
    fed: &Federation,
    selection: &SpokeSelection,
    fleet: &str,
    ca_pem: &str,
) -> anyhow::Result<Option<Rendered>> {
    if fed.spec.placement_ref.is_none() {
        return Ok(None);
    }
    cluster_objects(fed, selection, fleet, ca_pem)
}

/// The objects of `rendered` as `render` prints them: each workload, then the headless Services.
pub fn printed(rendered: &Rendered) -> Result<Vec<serde_json::Value>, serde_json::Error> {
    let mut values = Vec::new();
    for (_, workload) in &rendered.workloads {
        values.push(workload.to_value()?);
    }
    for service in &rendered.services {
        values.push(serde_json::to_value(service)?);
    }
    Ok(values)
}

/// What the hub cluster runs for `fed` when it has no `placementRef`: the work of
/// [`crate::core::HUB_CLUSTER`] (SuperNodes dial the SuperLink Service in the cluster) rendered
/// by the runtime the hub embeds, marked as [`crate::kube::hub_pools`] applies it. The CA Secret is
/// left out (its content is the running hub's CA). `None` for a placed Federation.
pub fn hub_local_objects(fed: &Federation) -> anyhow::Result<Option<Rendered>> {
    if fed.spec.placement_ref.is_some() {
        return Ok(None);
    }
    let hub = crate::core::HUB_CLUSTER;
    let selection = SpokeSelection::positional(hub, 0, 1, &BTreeMap::new());
    let fleet = crate::core::render::in_cluster_fleet_address(fed);
    let Some(mut rendered) = cluster_objects(fed, &selection, &fleet, "")? else {
        return Ok(None);
    };
    let applier = crate::kube::hub_pools::offline_applier();
    let (ns, name) = (
        fed.metadata.namespace.as_deref().unwrap_or("default"),
        fed.metadata.name.as_deref().unwrap_or_default(),
    );
    for service in &mut rendered.services {
        applier.stamp(&mut service.metadata, ns, name);
    }
    for (_, workload) in &mut rendered.workloads {
        match workload {
            flower_addon_crds::render::Workload::StatefulSet(s) => {
                applier.stamp(&mut s.metadata, ns, name);
            }
            flower_addon_crds::render::Workload::DaemonSet(d) => {
                applier.stamp(&mut d.metadata, ns, name);
            }
        }
    }
    Ok(Some(rendered))
}

/// What `selection.cluster`'s runtime applies for `fed` when the hub sends `fleet` as the Fleet
/// address and `ca_pem` as the CA bundle (the CA Secret left out).
fn cluster_objects(
    fed: &Federation,
    selection: &SpokeSelection,
    fleet: &str,
    ca_pem: &str,
) -> anyhow::Result<Option<Rendered>> {
    let (version, _) = federation_dialect(fed)?;
    let works = federation_work(
        fed,
        version,
        &WorkInputs {
            selected: &selection.selected,
            labels: &selection.labels,
            fleet_address: fleet,
            ca_pem,
            registered_node_keys: &[],
            retired_node_keys: &[],
        },
    )?;
    let Some((_, work)) = works
        .per_cluster
        .into_iter()
        .find(|(c, _)| *c == selection.cluster)
    else {
        return Ok(None);
    };
    let snapshot = ClusterWork {
        version: 0,
        cluster_name: selection.cluster.clone(),
        federations: vec![work],
    };
    let plan = flower_addon_runtime::work::decode_federation(&snapshot, &snapshot.federations[0])?;
    let mut rendered = render_federation(&plan)?;
    rendered.secret = None;
    Ok(Some(rendered))
}

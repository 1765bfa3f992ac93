//! SuperNode keys in Kubernetes mode: every few seconds (and when an agent reports), each
//! Federation with SuperNode authentication gets its SuperLink synced to the keys its placed
//! clusters report (the hub's own cluster for a Federation without `placementRef`) ([`crate::core::nodekeys::wanted_keys`]) through the
//! Control API at the SuperLink Service's in-cluster name
//! ([`crate::kube::control::in_cluster_endpoint`]). When what a SuperLink holds changes, the
//! work is recomputed so agents start the SuperNodes whose keys are now registered. A change
//! of a SuperLink StatefulSet (its pod deleted, back Ready) makes that SuperLink due at once:
//! restarted on an emptyDir database it has lost every registration, and its SuperNodes
//! crash-loop until their keys are back.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use flower_addon_crds::Federation;
use flower_addon_crds::render::MANAGED_BY;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

use super::{Report, Stores};
use crate::flower::diagnose::LogSource;
use crate::flower::registry::{FedKey, KeyTarget, NodeKeyRegistry};
use crate::kube::backoff::ShortBackoff;
use crate::registration::ca::HubCa;

/// How often SuperLinks are synced without new reports.
const SYNC_EVERY: Duration = Duration::from_secs(3);

/// Syncs the SuperLinks' keys until the reports channel closes; bumps `keys_changed` when any
/// SuperLink's registered or online keys changed.
pub(super) async fn sync_node_keys(
    client: Client,
    stores: Stores,
    reports: Arc<DashMap<String, Report>>,
    registry: Arc<NodeKeyRegistry>,
    ca: Arc<HubCa>,
    mut reported: watch::Receiver<u64>,
    keys_changed: watch::Sender<u64>,
) {
    let selector =
        format!("app.kubernetes.io/component=superlink,app.kubernetes.io/managed-by={MANAGED_BY}");
    let forward = crate::kube::control::port_forward(client.clone());
    let superlinks = watcher(
        Api::<StatefulSet>::all(client.clone()),
        watcher::Config::default().labels(&selector),
    )
    .backoff(ShortBackoff::default())
    .applied_objects();
    let mut superlinks = std::pin::pin!(superlinks);
    loop {
        tokio::select! {
            changed = reported.changed() => if changed.is_err() { return },
            Some(event) = superlinks.next() => {
                if let Some(fed) = event.ok().as_ref().and_then(superlink_federation) {
                    registry.relist_soon(&fed);
                }
            }
            _ = tokio::time::sleep(SYNC_EVERY) => {}
        }
        let log = |fed: &Federation| Some(crate::kube::control::superlink_log(fed, &client));
        let targets = targets(&stores, &reports, &ca, &forward, &log);
        if !registry.sync(targets).await.is_empty() {
            keys_changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// The Federation a SuperLink StatefulSet belongs to (its namespace and instance label).
fn superlink_federation(sts: &StatefulSet) -> Option<FedKey> {
    let name = sts.labels().get("app.kubernetes.io/instance")?;
    Some((sts.namespace()?, name.clone()))
}

/// What each SuperLink should hold; nothing until every store has listed once (an unlisted
/// decisions store reads as "placed nowhere", and such a target, complete, would unregister every
/// running SuperNode, as happened when a restarted hub synced before its reflectors had listed).
fn targets(
    stores: &Stores,
    reports: &DashMap<String, Report>,
    ca: &HubCa,
    forward: &crate::kube::control::Forward,
    log: &dyn Fn(&Federation) -> Option<LogSource>,
) -> Vec<KeyTarget> {
    if !super::is_ready(stores) {
        return Vec::new();
    }
    let clusters: BTreeSet<String> = stores
        .clusters
        .state()
        .iter()
        .map(|c| c.name_any())
        .collect();
    let decided = super::Decided::of(stores);
    // Each cluster's labels, as the work builder sees them (which pools it runs).
    let labels: BTreeMap<String, BTreeMap<String, String>> = stores
        .clusters
        .state()
        .iter()
        .map(|mc| {
            let view = crate::kube::controller::placement::cluster_view(mc);
            (view.name, view.labels)
        })
        .collect();
    let mut out = Vec::new();
    for fed in stores.federations.state() {
        if !fed.spec.supernode_auth() {
            continue;
        }
        let Some(endpoint) = crate::kube::control::in_cluster_endpoint(&fed, ca, forward) else {
            continue;
        };
        let namespace = fed.namespace().unwrap_or_default();
        let key = (namespace.clone(), fed.name_any());
        let placed_on: BTreeSet<String> = decided
            .placed_on(&fed, |c| clusters.contains(c))
            .into_iter()
            .collect();
        let limits =
            crate::core::nodekeys::key_limits(&fed.spec, &placed_on, decided.labels(&fed, &labels));
        let wanted = crate::core::nodekeys::wanted(&key, &placed_on, &limits, |c| {
            reports.get(c).map(|r| r.status.clone())
        });
        out.push(KeyTarget {
            federation: key,
            endpoint,
            wanted: wanted.keys,
            complete: wanted.complete,
            log: log(&fed),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::{decision, federation, managed, stores};
    use super::*;
    use flower_addon_crds::PlacementDecision;
    use flower_addon_proto::{FederationStatus, PoolStatus, Status};

    fn report(fed: &str, keys: &[&str]) -> Report {
        Report {
            status: Status {
                federations: vec![FederationStatus {
                    supernode_restart: String::new(),
                    namespace: "team".into(),
                    name: fed.into(),
                    pools: vec![PoolStatus {
                        name: "a".into(),
                        node_public_keys: keys.iter().map(|k| (*k).to_owned()).collect(),
                        ..Default::default()
                    }],
                }],
                ..Default::default()
            },
            at: 0,
        }
    }

    fn flower_ca() -> HubCa {
        HubCa::generate_for(crate::registration::ca::CaRole::Flower).unwrap()
    }

    #[test]
    fn targets_hold_only_the_placed_clusters_keys_and_port_forward_to_the_superlink() {
        // Invariant: the SuperLink is asked to hold exactly the keys reported for this Federation
        // by the clusters its Placement decided; a cluster not decided cannot get a key in.
        // Federations without SuperNode authentication get no target.
        let ca = flower_ca();
        let fed = federation("[{name: a, replicas: 1, images: {}}]");
        let mut open = fed.clone();
        open.metadata.name = Some("open".into());
        open.spec.supernode_authentication = false;
        let stores = stores(
            vec![fed, open],
            vec![decision("both", &["s1", "s2"])],
            vec![managed("s1", &[]), managed("s2", &[]), managed("s3", &[])],
        );
        let reports = DashMap::new();
        reports.insert("s1".to_owned(), report("fed", &["k1"]));
        reports.insert("s2".to_owned(), report("other", &["k2"]));
        reports.insert("s3".to_owned(), report("fed", &["k3"]));
        let targets = targets(
            &stores,
            &reports,
            &ca,
            &crate::kube::control::unreachable_forward(),
            &|_| None,
        );
        assert_eq!(targets.len(), 1, "{targets:?}");
        let t = &targets[0];
        assert_eq!(t.federation, ("team".to_owned(), "fed".to_owned()));
        assert_eq!(t.wanted, BTreeSet::from(["k1".to_owned()]));
        assert_eq!(t.endpoint.address, "fed-superlink-control.team.svc:9093");
        assert_eq!(t.endpoint.server_name, "fed-superlink-control.team.svc");
        assert_eq!(
            t.endpoint.tunnel.as_ref().map(|t| t.describe.as_str()),
            Some("port-forward team/fed-superlink-0:8000"),
            "Control is on the pod's loopback: the hub port-forwards"
        );
        assert_eq!(
            t.endpoint.ca_pem.as_deref(),
            Some(ca.federation("team", "fed").unwrap().bundle_pem()),
            "the Federation's own CA"
        );
    }

    #[test]
    fn nothing_is_targeted_before_the_decisions_are_listed() {
        // Invariant: a hub whose PlacementDecision reflector has not listed yet must not read
        // "placed nowhere" (a complete empty target unregisters every SuperNode).
        let fed = federation("[{name: a, replicas: 1, images: {}}]");
        let mut unlisted = stores(vec![fed], vec![], vec![managed("s1", &[])]);
        unlisted.decisions = kube::runtime::reflector::store::<PlacementDecision>().0;
        let reports = DashMap::new();
        reports.insert("s1".to_owned(), report("fed", &["k1"]));
        assert!(
            targets(
                &unlisted,
                &reports,
                &flower_ca(),
                &crate::kube::control::unreachable_forward(),
                &|_| None
            )
            .is_empty()
        );
    }

    #[test]
    fn keys_are_unregistered_only_once_every_placed_cluster_has_reported() {
        // Invariant: a restarted hub knows no cluster's keys until its agent reports; it must not
        // unregister what the SuperLink holds meanwhile (that stops every running SuperNode), so a
        // target is `complete` only when every placed cluster has reported.
        let fed = federation("[{name: a, replicas: 1, images: {}}]");
        let stores = stores(
            vec![fed],
            vec![decision("both", &["s1", "s2"])],
            vec![managed("s1", &[]), managed("s2", &[])],
        );
        let reports = DashMap::new();
        assert!(
            !targets(
                &stores,
                &reports,
                &flower_ca(),
                &crate::kube::control::unreachable_forward(),
                &|_| None
            )[0]
            .complete,
            "nothing reported"
        );
        reports.insert("s1".to_owned(), report("fed", &["k1"]));
        let one = targets(
            &stores,
            &reports,
            &flower_ca(),
            &crate::kube::control::unreachable_forward(),
            &|_| None,
        );
        assert!(!one[0].complete, "s2 not reported");
        assert_eq!(one[0].wanted, BTreeSet::from(["k1".to_owned()]));
        reports.insert("s2".to_owned(), report("fed", &[]));
        assert!(
            targets(
                &stores,
                &reports,
                &flower_ca(),
                &crate::kube::control::unreachable_forward(),
                &|_| None
            )[0]
            .complete
        );
    }
}

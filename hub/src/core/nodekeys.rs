//! Which SuperNode keys a Federation's SuperLink holds: exactly the keys that the clusters the
//! Federation is placed on report for it (a cluster not selected for a Federation cannot get a
//! SuperNode into it; a dropped or revoked cluster's keys are unregistered). Both hub modes compute
//! the wanted set here and hand the difference to the Control API client.
use flower_addon_proto::Status;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff;

/// A node as the SuperLink lists it (adapter-independent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListedNode {
    /// The SuperLink's node id.
    pub node_id: u64,
    /// `registered`, `online`, `offline` or `unregistered`.
    pub status: String,
    /// DER `SubjectPublicKeyInfo` of its key (`None` when the SuperLink listed no PEM).
    pub public_key_der: Option<Vec<u8>>,
    /// How long before the listing the SuperNode last reached the SuperLink (its activation or
    /// heartbeat), by the SuperLink's own clock ([`contact_age`]); `None` when the SuperLink
    /// does not say.
    pub last_contact_age: Option<Duration>,
    /// The heartbeat interval the SuperNode announced (`None` when not listed).
    pub heartbeat_interval: Option<Duration>,
}

/// Flower's `HEARTBEAT_PATIENCE` (1.25 to 1.42): a SuperNode stays `online` until this many
/// heartbeat intervals after its last heartbeat or activation (`online_until`).
pub const HEARTBEAT_PATIENCE: u32 = 2;

impl ListedNode {
    /// Whether the SuperLink lists this SuperNode `online`. Flower keeps a SuperNode that stopped
    /// without saying goodbye (killed, its node powered off) `online` for up to
    /// [`HEARTBEAT_PATIENCE`] heartbeat intervals (60 s) after its last heartbeat: use
    /// [`Self::serving`] for "connected now".
    pub fn online(&self) -> bool {
        self.status == "online"
    }

    /// Whether this SuperNode is connected now: `online`, and its last heartbeat or activation
    /// no older than [`SERVING_WITHIN`] heartbeat intervals. A live SuperNode sends a heartbeat
    /// every 0.8 intervals (±10 %), so it always passes; one that died silently stops passing
    /// 45 s after its last heartbeat instead of Flower's 60 s. A listing without the heartbeat
    /// fields falls back to `online`.
    pub fn serving(&self) -> bool {
        self.online()
            && match (self.last_contact_age, self.heartbeat_interval) {
                (Some(age), Some(interval)) => age <= interval.mul_f64(SERVING_WITHIN),
                _ => true,
            }
    }
}

/// How many heartbeat intervals after its last contact a SuperNode still counts as serving
/// ([`ListedNode::serving`]): heartbeats come every 0.88 intervals at most, so 1.5 leaves a
/// late heartbeat 18 s (at Flower's 30 s interval) before a live SuperNode is counted out.
pub const SERVING_WITHIN: f64 = 1.5;

/// How long before `now` (the SuperLink's `ListNodesResponse.now`, RFC 3339) a node with
/// `online_until` (seconds since the epoch) and `heartbeat_interval` (seconds) last reached the
/// SuperLink: Flower sets `online_until` to that moment plus [`HEARTBEAT_PATIENCE`] intervals at
/// each activation and heartbeat. `None` when a value is missing or unreadable; a contact after
/// `now` (rounding) is age zero.
pub fn contact_age(now: &str, online_until: f64, heartbeat_interval: f64) -> Option<Duration> {
    if !(online_until.is_finite() && heartbeat_interval.is_finite())
        || online_until <= 0.0
        || heartbeat_interval <= 0.0
    {
        return None;
    }
    let now: jiff::Timestamp = now.trim().parse().ok()?;
    let now = now.as_nanosecond() as f64 / 1e9;
    let contact = online_until - f64::from(HEARTBEAT_PATIENCE) * heartbeat_interval;
    Duration::try_from_secs_f64((now - contact).max(0.0)).ok()
}

/// How many keys each `(cluster, pool)` may have registered: the pool's replicas on that cluster
/// (`Some`, StatefulSet pools), or `None` for a DaemonSet pool (one per node: as many as the
/// cluster reports it runs, at most [`flower_addon_crds::MAX_REPLICAS`]). A pool that does not
/// run on a cluster (its `clusterSelector` leaves it out, or the cluster is not placed) is not
/// in the map: no key of it counts.
pub type KeyLimits = BTreeMap<(String, String), Option<u32>>;

/// [`KeyLimits`] of a Federation `spec` placed on `placed_on`, each cluster with its `labels`:
/// the pools as the work builder splits them ([`crate::core::work::split_work`]).
pub fn key_limits(
    spec: &flower_addon_crds::FederationSpec,
    placed_on: &BTreeSet<String>,
    labels: &BTreeMap<String, BTreeMap<String, String>>,
) -> KeyLimits {
    let selected: Vec<String> = placed_on.iter().cloned().collect();
    crate::core::work::split_work(spec, &selected, |pool, cluster| {
        crate::core::work::pool_on_cluster(spec, pool, labels.get(cluster))
    })
    .into_iter()
    .flat_map(|share| {
        let cluster = share.cluster;
        share
            .pools
            .into_iter()
            .map(move |p| ((cluster.clone(), p.pool), p.replicas))
    })
    .collect()
}

/// The public keys (OpenSSH lines) the Federation `(namespace, name)` wants registered: those
/// reported for it by the clusters in `placed_on` (its selected clusters, or the hub's own for
/// a Federation without placement), from each cluster's last status, for the pools `limits`
/// lets the cluster run and at most as many per pool as it allows (the first in sorted order):
/// a cluster cannot register keys beyond its pools' replicas, nor for pools it does not run.
/// Keys other clusters report for it are ignored.
pub fn wanted_keys<'a>(
    federation: &(String, String),
    placed_on: &BTreeSet<String>,
    limits: &KeyLimits,
    statuses: impl IntoIterator<Item = (&'a str, &'a Status)>,
) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for (cluster, status) in statuses {
        if !placed_on.contains(cluster) {
            continue;
        }
        for fed in status
            .federations
            .iter()
            .filter(|f| f.namespace == federation.0 && f.name == federation.1)
        {
            for pool in &fed.pools {
                let Some(limit) = limits.get(&(cluster.to_owned(), pool.name.clone())) else {
                    continue;
                };
                let max = limit.unwrap_or(pool.desired).min(MAX_KEYS_PER_POOL) as usize;
                let reported: BTreeSet<String> = pool
                    .node_public_keys
                    .iter()
                    .map(|k| k.trim().to_owned())
                    .filter(|k| !k.is_empty())
                    .collect();
                keys.extend(reported.into_iter().take(max));
            }
        }
    }
    keys
}

/// At most this many keys of one pool on one cluster ([`flower_addon_crds::MAX_REPLICAS`]).
const MAX_KEYS_PER_POOL: u32 = flower_addon_crds::MAX_REPLICAS as u32;

/// The keys a Federation's SuperLink should hold ([`wanted_keys`] of the clusters' reports) and
/// whether they are all known: only when every cluster it is placed on has reported since the
/// hub started may other keys be unregistered (a restarted hub must not stop running
/// SuperNodes before their agents report).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WantedKeys {
    /// OpenSSH lines.
    pub keys: BTreeSet<String>,
    /// Every placed cluster has reported.
    pub complete: bool,
}

/// [`WantedKeys`] of `federation` placed on `placed_on` within `limits` ([`key_limits`]), with
/// `report` giving a cluster's last report since the hub started (both modes call this).
pub fn wanted(
    federation: &(String, String),
    placed_on: &BTreeSet<String>,
    limits: &KeyLimits,
    report: impl Fn(&str) -> Option<Status>,
) -> WantedKeys {
    let statuses: Vec<(&str, Status)> = placed_on
        .iter()
        .filter_map(|c| report(c).map(|s| (c.as_str(), s)))
        .collect();
    WantedKeys {
        keys: wanted_keys(
            federation,
            placed_on,
            limits,
            statuses.iter().map(|(c, s)| (*c, s)),
        ),
        complete: statuses.len() == placed_on.len(),
    }
}

/// What to change on a SuperLink so it holds exactly the wanted keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyPlan {
    /// Wanted keys (OpenSSH lines) the SuperLink does not hold: register them.
    pub register: Vec<String>,
    /// Nodes whose key is not wanted: unregister them (every node of the SuperLink is the
    /// hub's to manage; a key added by hand is removed too).
    pub unregister: Vec<u64>,
    /// Wanted keys the SuperLink already holds.
    pub registered: BTreeSet<String>,
    /// Wanted keys whose SuperNode is connected ([`ListedNode::serving`]: `online`, and not
    /// a session Flower still lists after its SuperNode died).
    pub online: BTreeSet<String>,
    /// Wanted keys the SuperLink lists as `unregistered`: Flower refuses to register a key
    /// again once it was unregistered (code 23, "already in use", in every release 1.25-1.42),
    /// so their SuperNodes need new keys (sent to the agents as `retired_node_keys`).
    pub retired: BTreeSet<String>,
}

/// The plan from the wanted keys (DER → OpenSSH line) and the SuperLink's node list.
pub fn plan(wanted: &BTreeMap<Vec<u8>, String>, listed: &[ListedNode]) -> KeyPlan {
    let mut out = KeyPlan::default();
    let mut held: BTreeSet<&[u8]> = BTreeSet::new();
    for node in listed.iter().filter(|n| n.status == "unregistered") {
        if let Some((der, line)) = node
            .public_key_der
            .as_deref()
            .and_then(|der| wanted.get(der).map(|line| (der, line)))
        {
            held.insert(der);
            out.retired.insert(line.clone());
        }
    }
    for node in listed.iter().filter(|n| n.status != "unregistered") {
        match node
            .public_key_der
            .as_deref()
            .and_then(|der| wanted.get(der).map(|line| (der, line)))
        {
            Some((der, line)) => {
                held.insert(der);
                out.registered.insert(line.clone());
                if node.serving() {
                    out.online.insert(line.clone());
                }
            }
            None => out.unregister.push(node.node_id),
        }
    }
    out.register = wanted
        .iter()
        .filter(|(der, _)| !held.contains(der.as_slice()))
        .map(|(_, line)| line.clone())
        .collect();
    out.unregister.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use flower_addon_proto::{FederationStatus, PoolStatus};

    fn status(fed: &str, keys: &[&str]) -> Status {
        Status {
            federations: vec![FederationStatus {
                supernode_restart: String::new(),
                namespace: "ns".into(),
                name: fed.into(),
                pools: vec![PoolStatus {
                    name: "p".into(),
                    node_public_keys: keys.iter().map(|k| (*k).to_owned()).collect(),
                    ..Default::default()
                }],
            }],
            ..Default::default()
        }
    }

    #[test]
    fn only_placed_clusters_keys_for_that_federation_count() {
        let a = status("fed", &["ka1", "ka2 "]);
        let b = status("fed", &["kb"]);
        let other = status("other", &["ko"]);
        let placed: BTreeSet<String> = ["a".to_owned(), "c".to_owned()].into();
        let limits: KeyLimits = [
            (("a".to_owned(), "p".to_owned()), Some(2)),
            (("c".to_owned(), "p".to_owned()), Some(2)),
        ]
        .into();
        let wanted = wanted_keys(
            &("ns".into(), "fed".into()),
            &placed,
            &limits,
            [("a", &a), ("b", &b), ("c", &other)],
        );
        assert_eq!(wanted, BTreeSet::from(["ka1".to_owned(), "ka2".to_owned()]));
    }

    #[test]
    fn a_cluster_registers_at_most_its_pools_replicas_and_only_for_pools_it_runs() {
        // A placed cluster reporting 400 keys for a `replicas: 1` pool gets 1 registered; keys
        // for a pool its clusterSelector leaves out count not at all; a DaemonSet pool counts
        // as many keys as the nodes the cluster reports (desired).
        let flood: Vec<String> = (0..400).map(|i| format!("k{i:03}")).collect();
        let flood: Vec<&str> = flood.iter().map(String::as_str).collect();
        let mut report = status("fed", &flood);
        report.federations[0].pools.push(PoolStatus {
            name: "elsewhere".into(),
            node_public_keys: vec!["ke".into()],
            ..Default::default()
        });
        report.federations[0].pools.push(PoolStatus {
            name: "daemons".into(),
            desired: 2,
            node_public_keys: vec!["d1".into(), "d2".into(), "d3".into()],
            ..Default::default()
        });
        let placed: BTreeSet<String> = ["a".to_owned()].into();
        let limits: KeyLimits = [
            (("a".to_owned(), "p".to_owned()), Some(1)),
            (("a".to_owned(), "daemons".to_owned()), None),
        ]
        .into();
        let wanted = wanted_keys(
            &("ns".into(), "fed".into()),
            &placed,
            &limits,
            [("a", &report)],
        );
        assert_eq!(
            wanted,
            BTreeSet::from(["d1".to_owned(), "d2".to_owned(), "k000".to_owned()])
        );
    }

    #[test]
    fn limits_follow_the_work_split_and_cluster_selectors() {
        let spec: flower_addon_crds::FederationSpec = serde_saphyr::from_str(
            r#"
mode: StatefulSet
isolationMode: subprocess
superlink: {image: "flwr/superlink:1.42.0"}
supernodes:
  image: "flwr/supernode:1.42.0"
  pools:
    - {name: gpu, replicas: 3, clusterSelector: {matchLabels: {gpu: "true"}}}
    - {name: cpu, replicas: 2}
"#,
        )
        .expect("spec");
        let placed: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
        let labels: BTreeMap<String, BTreeMap<String, String>> = [
            (
                "a".to_owned(),
                [("gpu".to_owned(), "true".to_owned())].into(),
            ),
            ("b".to_owned(), BTreeMap::new()),
        ]
        .into();
        let limits = key_limits(&spec, &placed, &labels);
        assert_eq!(limits.get(&("a".into(), "gpu".into())), Some(&Some(3)));
        assert_eq!(limits.get(&("b".into(), "gpu".into())), None);
        assert_eq!(limits.get(&("b".into(), "cpu".into())), Some(&Some(2)));
    }

    #[test]
    fn plan_registers_missing_and_unregisters_unwanted() {
        // Key two was unregistered before: Flower never registers it again (it answers "already
        // in use"), so it is retired for a new key instead of registered in vain.
        let wanted: BTreeMap<Vec<u8>, String> = [
            (vec![1], "one".into()),
            (vec![2], "two".into()),
            (vec![4], "four".into()),
        ]
        .into();
        let listed = vec![
            ListedNode {
                node_id: 7,
                status: "online".into(),
                public_key_der: Some(vec![1]),
                ..ListedNode::default()
            },
            ListedNode {
                node_id: 9,
                status: "registered".into(),
                public_key_der: Some(vec![3]),
                ..ListedNode::default()
            },
            ListedNode {
                node_id: 5,
                status: "offline".into(),
                public_key_der: None,
                ..ListedNode::default()
            },
            ListedNode {
                node_id: 11,
                status: "unregistered".into(),
                public_key_der: Some(vec![2]),
                ..ListedNode::default()
            },
        ];
        let p = plan(&wanted, &listed);
        assert_eq!(p.register, vec!["four".to_owned()]);
        assert_eq!(p.retired, BTreeSet::from(["two".to_owned()]));
        assert_eq!(p.unregister, vec![5, 9]);
        assert_eq!(p.registered, BTreeSet::from(["one".to_owned()]));
        assert_eq!(p.online, BTreeSet::from(["one".to_owned()]));
        // Nothing wanted: everything the SuperLink holds goes.
        let p = plan(&BTreeMap::new(), &listed[..2]);
        assert_eq!(p.unregister, vec![7, 9]);
        assert!(p.register.is_empty());
    }

    #[test]
    fn contact_age_reads_flowers_online_until() {
        // Invariant: the last contact is `online_until` minus two heartbeat intervals, measured
        // on the SuperLink's own clock (its `now`), whatever the hub's clock says.
        let now = "2026-12-05T19:30:00.500000+00:00";
        let epoch = 1_796_499_000.5; // 2026-12-05T19:30:00.5Z
        assert_eq!(
            contact_age(now, epoch + 60.0 - 10.0, 30.0),
            Some(Duration::from_secs(10))
        );
        // Just activated (online_until = now + 2 intervals): age zero, also past rounding.
        assert_eq!(contact_age(now, epoch + 60.0, 30.0), Some(Duration::ZERO));
        assert_eq!(contact_age(now, epoch + 61.0, 30.0), Some(Duration::ZERO));
        for (now, until, interval) in [
            ("not a time", epoch, 30.0),
            (now, 0.0, 30.0),
            (now, epoch, 0.0),
            (now, f64::NAN, 30.0),
            (now, epoch, f64::INFINITY),
        ] {
            assert_eq!(
                contact_age(now, until, interval),
                None,
                "{now} {until} {interval}"
            );
        }
    }

    #[test]
    fn a_session_flower_still_lists_after_its_supernode_died_is_not_serving() {
        // Invariant: a SuperNode whose last heartbeat is older than 1.5 intervals does not count
        // as connected (Flower lists it `online` for up to 2 intervals), one within it does, and
        // a listing without heartbeat fields trusts Flower's status.
        let node = |status: &str, age: Option<u64>| ListedNode {
            node_id: 1,
            status: status.into(),
            public_key_der: Some(vec![1]),
            last_contact_age: age.map(Duration::from_secs),
            heartbeat_interval: age.map(|_| Duration::from_secs(30)),
        };
        assert!(node("online", Some(0)).serving());
        assert!(node("online", Some(45)).serving());
        assert!(!node("online", Some(46)).serving());
        assert!(node("online", Some(46)).online());
        assert!(node("online", None).serving());
        assert!(!node("offline", Some(0)).serving());
        let wanted = BTreeMap::from([(vec![1], "k1".to_owned())]);
        assert!(plan(&wanted, &[node("online", Some(50))]).online.is_empty());
        assert_eq!(
            plan(&wanted, &[node("online", Some(20))]).online,
            BTreeSet::from(["k1".to_owned()])
        );
    }
}

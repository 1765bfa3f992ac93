//! Status roll-up, the same in both hub modes: a Federation's entry for one cluster from that
//! cluster's last agent report, per-pool totals over the selected clusters, and which entries
//! a status lists one by one (a bounded number, so that a Federation over 10,000 clusters stays
//! far below etcd's 1.5 MiB object limit).
use flower_addon_crds::{
    ClusterStatus, ClusterTotals, Federation, FederationStatus, PoolStatus, PoolTotal,
};
use flower_addon_proto::Status as AgentStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The status of Federation `namespace/federation` in cluster `cluster`: its pools'
/// `ready/desired` from `report` (the agent's last report and when it arrived, Unix seconds),
/// whether the cluster is connected (`Available=True`), and what is missing, naming the pools
/// that are not ready and why their runtime says so. With `online` (the keys whose SuperNode the
/// Federation's SuperLink lists online), a SuperNode is ready only when it is connected to the
/// SuperLink: each pool's `ready` is at most the number of its keys online. `mark` is the
/// Federation's restart mark ([`flower_addon_crds::supernode_restart_mark`]): a report from
/// pools applied under another mark is a restart not done yet.
pub fn cluster_status(
    namespace: &str,
    federation: &str,
    cluster: &str,
    connected: bool,
    report: Option<(&AgentStatus, i64)>,
    online: Option<&std::collections::BTreeSet<String>>,
    mark: Option<&str>,
) -> ClusterStatus {
    let observed = report.and_then(|(status, _)| {
        status
            .federations
            .iter()
            .find(|f| f.namespace == namespace && f.name == federation)
    });
    let pools: Vec<PoolStatus> = observed
        .map(|f| {
            f.pools
                .iter()
                .map(|p| {
                    let mut ready = i32::try_from(p.ready).unwrap_or(i32::MAX);
                    if let Some(online) = online {
                        ready = ready.min(pool_online(p, online));
                    }
                    PoolStatus {
                        name: p.name.clone(),
                        kind: None,
                        desired: i32::try_from(p.desired).unwrap_or(i32::MAX),
                        ready,
                        conditions: Vec::new(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let desired: i32 = pools.iter().map(|p| p.desired).sum();
    let ready: i32 = pools.iter().map(|p| p.ready.min(p.desired)).sum();
    let applied = observed
        .map(|f| f.supernode_restart.trim())
        .filter(|m| !m.is_empty());
    let message = match observed {
        None => Some("no status report for this Federation from the agent yet".to_owned()),
        Some(_) if !connected => {
            Some("the cluster's agent is not connected (lease expired)".to_owned())
        }
        Some(_) if applied != mark => Some(format!(
            "restarting its SuperNodes: the agent has not yet applied restart mark {:?}",
            mark.unwrap_or("")
        )),
        // A pool whose runtime says it is not Ready is not, whatever its counts: a rollout (a
        // restart mark) keeps most replicas ready while it replaces them one by one.
        Some(f) if ready < desired || f.pools.iter().any(said_not_ready) => {
            let why: Vec<String> = f
                .pools
                .iter()
                .filter(|p| p.ready < p.desired || said_not_ready(p))
                .filter_map(|p| {
                    let message = &p.conditions.iter().find(|c| c.r#type == "Ready")?.message;
                    (!message.is_empty()).then(|| format!("pool {}: {message}", p.name))
                })
                .collect();
            Some(if why.is_empty() {
                format!("{ready}/{desired} SuperNodes ready")
            } else {
                format!("{ready}/{desired} SuperNodes ready ({})", why.join("; "))
            })
        }
        Some(_) => None,
    };
    let online_count = online
        .zip(observed)
        .map(|(online, f)| f.pools.iter().map(|p| pool_online(p, online)).sum::<i32>());
    let message = match (message, online_count) {
        (Some(m), Some(n)) if ready < desired && n < desired => Some(format!(
            "{m}; {n}/{desired} SuperNodes connected to the SuperLink"
        )),
        (m, _) => m,
    };
    ClusterStatus {
        name: cluster.to_owned(),
        supernodes: observed.map(|_| format!("{ready}/{desired}")),
        pools,
        connected,
        online: online_count,
        last_report: report
            .and_then(|(_, at)| k8s_openapi::jiff::Timestamp::from_second(at).ok())
            .map(Time),
        message,
        supernode_restart: applied.map(str::to_owned),
    }
}

/// Why a run may not be sent to `fed` yet because its SuperNodes' restart
/// ([`flower_addon_crds::supernode_restart_mark`]) is not done: a listed cluster still reports
/// pools applied under another mark, or (with a mark) reports them not all ready. Read from the
/// listed entries themselves, so a `Ready` condition not yet recomputed after a new mark does
/// not let a run through.
pub fn restart_pending(fed: &Federation) -> Option<String> {
    let mark = flower_addon_crds::supernode_restart_mark(fed);
    let listed = fed.status.as_ref().map_or(&[][..], |s| &s.clusters[..]);
    restart_pending_of(mark.as_deref(), listed)
}

/// [`restart_pending`] of a Federation whose restart mark is `mark`, from its listed cluster
/// entries.
pub fn restart_pending_of(mark: Option<&str>, listed: &[ClusterStatus]) -> Option<String> {
    let behind = listed.iter().find(|c| {
        c.supernode_restart.as_deref() != mark || (mark.is_some() && c.message.is_some())
    })?;
    let what = match &behind.message {
        Some(message) => message.clone(),
        None => format!(
            "pools applied under restart mark {:?}",
            behind.supernode_restart.as_deref().unwrap_or("")
        ),
    };
    Some(format!(
        "its SuperNodes are restarting (restart mark {:?}): cluster {}: {what}",
        mark.unwrap_or(""),
        behind.name
    ))
}

/// Whether the agent's `Ready` condition of `pool` is `False` (e.g. `RollingOut`: a new pod
/// template replacing its SuperNodes one by one while the others count as ready).
fn said_not_ready(pool: &flower_addon_proto::PoolStatus) -> bool {
    pool.conditions
        .iter()
        .any(|c| c.r#type == "Ready" && c.status == "False")
}

/// How many of a pool's reported keys the SuperLink lists online.
fn pool_online(
    pool: &flower_addon_proto::PoolStatus,
    online: &std::collections::BTreeSet<String>,
) -> i32 {
    let n = pool
        .node_public_keys
        .iter()
        .filter(|k| online.contains(k.trim()))
        .count();
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Each pool of `fed`'s spec summed over `clusters` (a pool no cluster runs is 0/0).
pub fn pool_totals(fed: &Federation, clusters: &[ClusterStatus]) -> Vec<PoolTotal> {
    pool_totals_of(&spec_pools(fed), clusters)
}

/// The names of `fed`'s pools, in spec order.
pub fn spec_pools(fed: &Federation) -> Vec<String> {
    fed.spec
        .supernodes
        .pools
        .iter()
        .map(|p| p.name.clone())
        .collect()
}

/// Each of `pools` summed over `clusters`.
fn pool_totals_of(pools: &[String], clusters: &[ClusterStatus]) -> Vec<PoolTotal> {
    pools
        .iter()
        .map(|pool| {
            let (desired, ready) = clusters
                .iter()
                .flat_map(|c| c.pools.iter())
                .filter(|p| p.name == *pool)
                .fold((0, 0), |(d, r), p| {
                    (d + p.desired, r + p.ready.min(p.desired))
                });
            PoolTotal {
                name: pool.clone(),
                desired,
                ready,
            }
        })
        .collect()
}

/// Most clusters a Federation's status lists one by one (`status.clusters`, and the standalone
/// hub's `clusters` of each Federation); [`cluster_totals`] covers every cluster.
pub const LISTED_CLUSTERS: usize = 100;

/// Most problems a `Ready` message names; the rest are counted.
pub const LISTED_PROBLEMS: usize = 10;

/// Totals over `all` (every selected cluster's entry) for `fed`, listing `listed` of them.
pub fn cluster_totals(fed: &Federation, all: &[ClusterStatus], listed: usize) -> ClusterTotals {
    cluster_totals_of(&spec_pools(fed), all, listed)
}

/// [`cluster_totals`] for the spec pools `pools`.
pub fn cluster_totals_of(pools: &[String], all: &[ClusterStatus], listed: usize) -> ClusterTotals {
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    ClusterTotals {
        selected: count(all.len()),
        connected: count(all.iter().filter(|c| c.connected).count()),
        with_problems: count(all.iter().filter(|c| c.message.is_some()).count()),
        listed: count(listed),
        online: all
            .iter()
            .filter_map(|c| c.online)
            .reduce(|a, b| a.saturating_add(b)),
        pools: pool_totals_of(pools, all),
    }
}

/// The totals of a Federation status: its `clusterTotals`, or, in a status written before
/// those existed, the totals of the clusters it lists.
pub fn totals_of(fed: &Federation, status: &FederationStatus) -> ClusterTotals {
    status
        .cluster_totals
        .clone()
        .unwrap_or_else(|| cluster_totals(fed, &status.clusters, status.clusters.len()))
}

/// The entries a status lists: all of them when at most [`LISTED_CLUSTERS`]; otherwise those
/// with something wrong first, then the others, each group in the given order, up to
/// [`LISTED_CLUSTERS`], and then back in the given order.
pub fn listed_clusters(all: Vec<ClusterStatus>) -> Vec<ClusterStatus> {
    if all.len() <= LISTED_CLUSTERS {
        return all;
    }
    let mut indexed: Vec<(usize, ClusterStatus)> = all.into_iter().enumerate().collect();
    indexed.sort_by_key(|(i, c)| (c.message.is_none(), *i));
    indexed.truncate(LISTED_CLUSTERS);
    indexed.sort_by_key(|(i, _)| *i);
    indexed.into_iter().map(|(_, c)| c).collect()
}

/// Condition type saying whether the Federation's SuperLink works: `False` while it fails the
/// hub's calls or its SuperNodes' heartbeats and its log says why ([`crate::flower::diagnose`]:
/// reason `DatabaseStorageFull` or `UnexpectedError`, the message naming the fix). Written for
/// Federations with SuperNode authentication (the hub calls their SuperLink), by both hub modes.
pub const SUPERLINK_HEALTHY: &str = "SuperLinkHealthy";

/// `(status, reason, message)` of [`SUPERLINK_HEALTHY`] given the `(reason, message)` of what
/// the SuperLink last logged as failing, while it fails.
pub fn superlink_health(
    problem: Option<(&'static str, &str)>,
) -> (&'static str, &'static str, String) {
    match problem {
        Some((reason, message)) => ("False", reason, message.to_owned()),
        None => (
            "True",
            "NoFailuresLogged",
            "the SuperLink answers the hub's calls and logged no failure when last read".to_owned(),
        ),
    }
}

/// Whether a Federation is ready: the one rule of both hub modes. It is ready when its SuperLink
/// runs (`superlink`), nothing keeps it from being placed or reached (`problems`: its Placement,
/// its external address, pools that no selected cluster can run), at least one cluster is
/// selected, and no selected cluster has a problem ([`cluster_status`]'s message: no report yet,
/// agent not connected, SuperNodes not ready or not connected to the SuperLink). `listed` are
/// the entries the status lists ([`listed_clusters`]), named in the message; the other troubled
/// clusters are counted from `totals`. `Err` is the `Ready=False` message.
pub fn readiness(
    superlink: Result<(), String>,
    problems: &[String],
    placed: bool,
    listed: &[ClusterStatus],
    totals: &ClusterTotals,
) -> Result<(), String> {
    let mut not_ready: Vec<String> = Vec::new();
    if let Err(why) = superlink {
        not_ready.push(why);
    }
    not_ready.extend(problems.iter().cloned());
    if totals.selected == 0 {
        not_ready.push(if placed {
            "no cluster selected by the Placement (yet)".to_owned()
        } else {
            "no report from the hub cluster's pools yet".to_owned()
        });
    }
    let mut listed_troubled = 0usize;
    for cluster in listed {
        // The entry's message says it all; an entry without one is still checked (an older
        // status, a hand-written one).
        let why = match &cluster.message {
            Some(message) => {
                listed_troubled += 1;
                vec![message.clone()]
            }
            None => (!cluster.connected)
                .then(|| "agent not connected".to_owned())
                .into_iter()
                .chain(
                    cluster
                        .pools
                        .iter()
                        .filter(|p| p.ready < p.desired)
                        .map(|p| format!("pool {}: {}/{} ready", p.name, p.ready, p.desired)),
                )
                .collect(),
        };
        if !why.is_empty() {
            not_ready.push(format!("cluster {}: {}", cluster.name, why.join(", ")));
        }
    }
    let unlisted = usize::try_from(totals.with_problems)
        .unwrap_or(0)
        .saturating_sub(listed_troubled);
    if not_ready.is_empty() && unlisted == 0 {
        Ok(())
    } else {
        Err(join_problems(&not_ready, unlisted))
    }
}

/// `problems` joined with "; ", the first [`LISTED_PROBLEMS`] of them and a count of the rest
/// (`unlisted` more that are not in `problems` at all are added to that count).
pub fn join_problems(problems: &[String], unlisted: usize) -> String {
    let shown = problems.len().min(LISTED_PROBLEMS);
    let mut parts: Vec<String> = problems[..shown].to_vec();
    let more = problems.len() - shown + unlisted;
    if more > 0 {
        parts.push(format!("and {more} more"));
    }
    parts.join("; ")
}

/// `names` for a log line or an Event (whose note must stay under 1 KiB): the first
/// [`LISTED_PROBLEMS`] joined with ", ", and a count of the rest.
pub fn name_few(names: &[String]) -> String {
    let shown = names.len().min(LISTED_PROBLEMS);
    let mut text = names[..shown].join(", ");
    if names.len() > shown {
        text.push_str(&format!(" and {} more", names.len() - shown));
    }
    text
}

#[cfg(test)]
mod tests;

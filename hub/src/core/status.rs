//! Status roll-up, the same in both hub modes: a Federation's entry for one cluster from that
//! cluster's last agent report, and per-pool totals over the selected clusters.
use flower_addon_crds::{ClusterStatus, Federation, PoolStatus};
use flower_addon_proto::Status as AgentStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The status of Federation `namespace/federation` in cluster `cluster`: its pools'
/// `ready/desired` from `report` (the agent's last report and when it arrived, Unix seconds),
/// whether the cluster is connected (`Available=True`), and what is missing, naming the pools
/// that are not ready and why their runtime says so. With `online` (the keys whose SuperNode the
/// Federation's SuperLink lists online), a SuperNode is ready only when it is connected to the
/// SuperLink: each pool's `ready` is at most the number of its keys online.
pub fn cluster_status(
    namespace: &str,
    federation: &str,
    cluster: &str,
    connected: bool,
    report: Option<(&AgentStatus, i64)>,
    online: Option<&std::collections::BTreeSet<String>>,
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
    let message = match observed {
        None => Some("no status report for this Federation from the agent yet".to_owned()),
        Some(_) if !connected => {
            Some("the cluster's agent is not connected (lease expired)".to_owned())
        }
        Some(f) if ready < desired => {
            let why: Vec<String> = f
                .pools
                .iter()
                .filter(|p| p.ready < p.desired)
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
    }
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

/// Readiness of one pool summed over clusters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolTotal {
    /// Pool name.
    pub name: String,
    /// SuperNodes wanted over all clusters.
    pub desired: i32,
    /// SuperNodes ready over all clusters (at most `desired` per cluster).
    pub ready: i32,
}

/// Each pool of `fed`'s spec summed over `clusters` (a pool no cluster runs is 0/0).
pub fn pool_totals(fed: &Federation, clusters: &[ClusterStatus]) -> Vec<PoolTotal> {
    fed.spec
        .supernodes
        .pools
        .iter()
        .map(|pool| {
            let (desired, ready) = clusters
                .iter()
                .flat_map(|c| c.pools.iter())
                .filter(|p| p.name == pool.name)
                .fold((0, 0), |(d, r), p| {
                    (d + p.desired, r + p.ready.min(p.desired))
                });
            PoolTotal {
                name: pool.name.clone(),
                desired,
                ready,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use flower_addon_proto::{Condition, FederationStatus, PoolStatus as WirePool};

    fn report(ready: u32, why: &str) -> AgentStatus {
        AgentStatus {
            cluster_name: "s1".into(),
            federations: vec![FederationStatus {
                namespace: "team".into(),
                name: "fed".into(),
                pools: vec![WirePool {
                    name: "a".into(),
                    desired: 2,
                    ready,
                    conditions: vec![Condition {
                        r#type: "Ready".into(),
                        status: if ready == 2 { "True" } else { "False" }.into(),
                        reason: String::new(),
                        message: why.into(),
                    }],
                    ..Default::default()
                }],
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_cluster_entry_sums_its_pools_and_names_what_is_missing() {
        // No report, a disconnected agent and a pool short of replicas each say why, the last
        // with the runtime's own reason.
        let none = cluster_status("team", "fed", "s1", true, None, None);
        assert_eq!(none.supernodes, None);
        assert!(none.message.unwrap().contains("no status report"));
        let r = report(1, "pod fed-a-1 is Pending");
        let short = cluster_status("team", "fed", "s1", true, Some((&r, 1_700_000_000)), None);
        assert_eq!(short.supernodes.as_deref(), Some("1/2"));
        assert_eq!(
            short.message.as_deref(),
            Some("1/2 SuperNodes ready (pool a: pod fed-a-1 is Pending)")
        );
        assert!(short.last_report.is_some());
        let gone = cluster_status("team", "fed", "s1", false, Some((&r, 1_700_000_000)), None);
        assert!(gone.message.unwrap().contains("not connected"));
        let full = report(2, "");
        assert_eq!(
            cluster_status("team", "fed", "s1", true, Some((&full, 0)), None).message,
            None
        );
        // Another Federation's report is not this one's.
        assert_eq!(
            cluster_status("team", "other", "s1", true, Some((&full, 0)), None).supernodes,
            None
        );
    }

    #[test]
    fn with_the_superlinks_node_list_ready_means_connected() {
        // Invariant: with SuperNode authentication, a pool is ready only for the SuperNodes the
        // SuperLink lists online, whatever the agent says about its containers.
        let mut r = report(2, "");
        r.federations[0].pools[0].node_public_keys = vec!["k1".into(), "k2 ".into()];
        let one: std::collections::BTreeSet<String> = ["k2".to_owned()].into();
        let s = cluster_status("team", "fed", "s1", true, Some((&r, 0)), Some(&one));
        assert_eq!(s.supernodes.as_deref(), Some("1/2"));
        assert_eq!(s.online, Some(1));
        assert_eq!(
            s.message.as_deref(),
            Some("1/2 SuperNodes ready; 1/2 SuperNodes connected to the SuperLink")
        );
        let both: std::collections::BTreeSet<String> = ["k1".to_owned(), "k2".to_owned()].into();
        let s = cluster_status("team", "fed", "s1", true, Some((&r, 0)), Some(&both));
        assert_eq!(
            (s.supernodes.as_deref(), s.online, s.message),
            (Some("2/2"), Some(2), None)
        );
        // Without the list (insecure Federation), the agent's readiness stands.
        let s = cluster_status("team", "fed", "s1", true, Some((&r, 0)), None);
        assert_eq!((s.supernodes.as_deref(), s.online), (Some("2/2"), None));
    }
}

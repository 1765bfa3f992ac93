//! Status roll-up, the same in both hub modes: a Federation's entry for one cluster from that
//! cluster's last agent report, and per-pool totals over the selected clusters.
use flower_addon_crds::{ClusterStatus, Federation, PoolStatus};
use flower_addon_proto::Status as AgentStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The status of Federation `namespace/federation` in cluster `cluster`: its pools'
/// `ready/desired` from `report` (the agent's last report and when it arrived, Unix seconds),
/// whether the cluster is connected (`Available=True`), and what is missing, naming the pools
/// that are not ready and why their runtime says so.
pub fn cluster_status(
    namespace: &str,
    federation: &str,
    cluster: &str,
    connected: bool,
    report: Option<(&AgentStatus, i64)>,
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
                .map(|p| PoolStatus {
                    name: p.name.clone(),
                    kind: None,
                    desired: i32::try_from(p.desired).unwrap_or(i32::MAX),
                    ready: i32::try_from(p.ready).unwrap_or(i32::MAX),
                    conditions: Vec::new(),
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
    ClusterStatus {
        name: cluster.to_owned(),
        supernodes: observed.map(|_| format!("{ready}/{desired}")),
        pools,
        connected,
        last_report: report
            .and_then(|(_, at)| k8s_openapi::jiff::Timestamp::from_second(at).ok())
            .map(Time),
        message,
    }
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
        let none = cluster_status("team", "fed", "s1", true, None);
        assert_eq!(none.supernodes, None);
        assert!(none.message.unwrap().contains("no status report"));
        let r = report(1, "pod fed-a-1 is Pending");
        let short = cluster_status("team", "fed", "s1", true, Some((&r, 1_700_000_000)));
        assert_eq!(short.supernodes.as_deref(), Some("1/2"));
        assert_eq!(
            short.message.as_deref(),
            Some("1/2 SuperNodes ready (pool a: pod fed-a-1 is Pending)")
        );
        assert!(short.last_report.is_some());
        let gone = cluster_status("team", "fed", "s1", false, Some((&r, 1_700_000_000)));
        assert!(gone.message.unwrap().contains("not connected"));
        let full = report(2, "");
        assert_eq!(
            cluster_status("team", "fed", "s1", true, Some((&full, 0))).message,
            None
        );
        // Another Federation's report is not this one's.
        assert_eq!(
            cluster_status("team", "other", "s1", true, Some((&full, 0))).supernodes,
            None
        );
    }
}

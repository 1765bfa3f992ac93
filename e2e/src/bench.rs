//! What the benches (`run_bench`, `reconcile_bench`) measure the same way: the hub's own
//! apiserver requests, the hub's CPU time, and how latencies and request counts are summed up.
//!
//! Requests are counted by the apiserver, not by the hub: [`install_flow_schemas`] creates
//! FlowSchemas that match only the hub's ServiceAccount, one per verb group ([`GROUPS`]) and
//! resource, and [`hub_requests`] reads how many requests each dispatched from
//! `apiserver_flowcontrol_dispatched_requests_total` on the apiserver's `/metrics`. A request is
//! counted when it is dispatched, so a watch counts once, when it is opened. The counts are
//! cumulative; a bench takes two readings and subtracts them with [`counter_deltas`].
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::ControlPlane;
use crate::addon::HUB_NS;

/// Verb groups counted; `events` is any verb on Events, `other` any verb not listed.
pub const GROUPS: [&str; 9] = [
    "events", "get", "list", "watch", "create", "update", "patch", "delete", "other",
];

/// The hub's ServiceAccount (`manifests/hub/rbac.yaml`): the only subject the FlowSchemas match.
const HUB_SA: &str = "flower-hub";

/// The metric the FlowSchemas' counts are read from.
const DISPATCHED: &str = "apiserver_flowcontrol_dispatched_requests_total";

// === The hub's requests (FlowSchemas) ===

/// The FlowSchemas that count the hub's requests: `flower-hub-events`, then
/// `flower-hub-<verb>-<resource>` for each of [`GROUPS`] × `resources` (`/` spelled `.`), then
/// `flower-hub-<verb>-other`; each matches only the hub's ServiceAccount.
pub fn flow_schemas(resources: &[&str]) -> Vec<serde_json::Value> {
    let subjects = json!([{
        "kind": "ServiceAccount",
        "serviceAccount": {"name": HUB_SA, "namespace": HUB_NS}
    }]);
    let schema = |name: String, precedence: usize, rule: serde_json::Value| {
        let mut rule = rule;
        rule["subjects"] = subjects.clone();
        json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": format!("flower-hub-{name}")},
            "spec": {
                // Before every built-in schema that could match a ServiceAccount (the
                // `service-accounts` one is at 9000); at the priority level that one names.
                "matchingPrecedence": precedence,
                "priorityLevelConfiguration": {"name": "workload-low"},
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [rule],
            }
        })
    };
    let verbs_of = |group: &str| -> Vec<String> {
        match group {
            "other" => vec!["*".into()],
            "delete" => vec!["delete".into(), "deletecollection".into()],
            verb => vec![verb.into()],
        }
    };
    let mut out = vec![schema(
        "events".into(),
        1000,
        json!({"resourceRules": [{
            "verbs": ["*"], "apiGroups": ["", "events.k8s.io"], "resources": ["events"],
            "namespaces": ["*"],
        }]}),
    )];
    for (i, group) in GROUPS.iter().filter(|g| **g != "events").enumerate() {
        for (j, resource) in resources.iter().enumerate() {
            out.push(schema(
                format!("{group}-{}", resource.replace('/', ".")),
                1100 + i * 50 + j,
                json!({"resourceRules": [{
                    "verbs": verbs_of(group), "apiGroups": ["*"], "resources": [resource],
                    "namespaces": ["*"], "clusterScope": true,
                }]}),
            ));
        }
        // Discovery and other non-resource requests count as `<verb>-other`.
        out.push(schema(
            format!("{group}-other"),
            2000 + i,
            json!({
                "resourceRules": [{
                    "verbs": verbs_of(group), "apiGroups": ["*"], "resources": ["*"],
                    "namespaces": ["*"], "clusterScope": true,
                }],
                "nonResourceRules": [{"verbs": verbs_of(group), "nonResourceURLs": ["*"]}],
            }),
        ));
    }
    out
}

/// Creates the FlowSchemas of [`flow_schemas`] (server-side apply as `field_manager`) and waits
/// until the apiserver has taken each up (condition `Dangling=False`: its priority level exists
/// and it is in force).
pub async fn install_flow_schemas(
    admin: &Client,
    resources: &[&str],
    field_manager: &str,
) -> Result<()> {
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("flowcontrol.apiserver.k8s.io", "v1", "FlowSchema"),
        "flowschemas",
    );
    let api = Api::<kube::api::DynamicObject>::all_with(admin.clone(), &resource);
    let schemas = flow_schemas(resources);
    for schema in &schemas {
        let name = schema["metadata"]["name"].as_str().unwrap_or_default();
        api.patch(
            name,
            &PatchParams::apply(field_manager),
            &Patch::Apply(schema),
        )
        .await
        .with_context(|| format!("creating FlowSchema {name} (counts the hub's requests)"))?;
    }
    crate::wait_until(
        "FlowSchemas taken up (Dangling=False)",
        Duration::from_secs(30),
        || async {
            let taken_up = api
                .list(&Default::default())
                .await?
                .items
                .iter()
                .filter(|s| s.name_any().starts_with("flower-hub-"))
                .filter(|s| {
                    s.data["status"]["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Dangling" && c["status"] == "False")
                    })
                })
                .count();
            Ok(taken_up == schemas.len())
        },
    )
    .await?;
    Ok(())
}

/// The apiserver's `/metrics` text (Prometheus format).
pub async fn apiserver_metrics(admin: &Client) -> Result<String> {
    admin
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await
        .context("GET /metrics from the hub apiserver")
}

/// The value of one sample line of Prometheus text (the number after its last space).
pub fn metric_value(line: &str) -> Result<f64> {
    line.rsplit(' ')
        .next()
        .unwrap_or_default()
        .parse()
        .with_context(|| format!("metric line {line}"))
}

/// The hub's dispatched requests so far by `<verb>/<resource>` (`events/events` for Events),
/// read from the apiserver's `/metrics`.
pub async fn hub_requests(admin: &Client) -> Result<BTreeMap<String, u64>> {
    hub_requests_in(&apiserver_metrics(admin).await?)
}

/// The hub's dispatched requests in a `/metrics` text, as [`hub_requests`] returns them.
fn hub_requests_in(text: &str) -> Result<BTreeMap<String, u64>> {
    ensure!(
        text.contains(DISPATCHED),
        "the apiserver's /metrics has no {DISPATCHED}: the hub's requests cannot be counted"
    );
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(labels) = line
            .strip_prefix(DISPATCHED)
            .and_then(|rest| rest.strip_prefix('{'))
        else {
            continue;
        };
        let Some(schema) = labels
            .split("flow_schema=\"flower-hub-")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        let key = match schema.split_once('-') {
            Some((verb, resource)) => format!("{verb}/{}", resource.replace('.', "/")),
            None => format!("{schema}/{schema}"),
        };
        *out.entry(key).or_default() += metric_value(line)? as u64;
    }
    Ok(out)
}

/// Checks that the hub's start-up (caches: LIST and WATCH) shows up in the counters, and
/// returns the counts so far (what the start-up made).
pub async fn validate_counting(
    cp: &mut ControlPlane,
    admin: &Client,
) -> Result<BTreeMap<String, u64>> {
    let counted = crate::wait_for(
        "the hub's start-up LIST and WATCH requests counted by its FlowSchemas",
        Duration::from_secs(30),
        || async {
            let counts = hub_requests(admin).await?;
            let groups = by_group(&counts);
            Ok((groups["list"] > 0 && groups["watch"] > 0).then_some(counts))
        },
    )
    .await;
    cp.processes().check_alive()?;
    counted
}

// === Request tables ===

/// Requests by verb group ([`GROUPS`]).
pub fn by_group(requests: &BTreeMap<String, u64>) -> BTreeMap<&'static str, u64> {
    GROUPS
        .iter()
        .map(|g| {
            let n = requests
                .iter()
                .filter(|(k, _)| k.split('/').next() == Some(*g))
                .map(|(_, n)| n)
                .sum();
            (*g, n)
        })
        .collect()
}

/// Requests of any verb on `resource` and its subresources (`flowerruns` counts
/// `flowerruns/status` too).
pub fn requests_on(requests: &BTreeMap<String, u64>, resource: &str) -> u64 {
    requests
        .iter()
        .filter(|(k, _)| k.split('/').nth(1) == Some(resource))
        .map(|(_, n)| n)
        .sum()
}

/// One entry per verb group with requests, divided by `per` (whole numbers when `per` is 1):
/// `patch 4.00 (flowerruns/status 3.00, leases 1.00)`.
pub fn per_resource(requests: &BTreeMap<String, u64>, per: f64) -> Vec<String> {
    let number = |n: u64| {
        let n = n as f64 / per;
        if per == 1.0 {
            format!("{n:.0}")
        } else {
            format!("{n:.2}")
        }
    };
    let mut out = Vec::new();
    for (group, total) in by_group(requests) {
        if total == 0 {
            continue;
        }
        let parts: Vec<String> = requests
            .iter()
            .filter_map(|(k, n)| {
                let (g, resource) = k.split_once('/')?;
                (g == group && *n > 0 && group != "events")
                    .then(|| format!("{resource} {}", number(*n)))
            })
            .collect();
        if parts.is_empty() {
            out.push(format!("{group} {}", number(total)));
        } else {
            out.push(format!("{group} {} ({})", number(total), parts.join(", ")));
        }
    }
    if out.is_empty() {
        out.push("none".into());
    }
    out
}

/// What counters grew by from `start` to `end`, key by key (a key missing at `start` counts from
/// 0; a counter that went down counts 0, as after a restart).
pub fn counter_deltas<K: Ord + Clone>(
    start: &BTreeMap<K, u64>,
    end: &BTreeMap<K, u64>,
) -> BTreeMap<K, u64> {
    end.iter()
        .map(|(k, n)| (k.clone(), n - start.get(k).copied().unwrap_or(0).min(*n)))
        .collect()
}

// === Process and numbers ===

/// `utime + stime` of a process so far (`/proc/<pid>/stat`, at USER_HZ = 100, so in steps of
/// 10 ms).
pub fn cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat (has the hub exited?)"))?;
    Ok(cpu_time_in(&stat))
}

/// `utime + stime` in the text of a `/proc/<pid>/stat`.
fn cpu_time_in(stat: &str) -> Duration {
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> u64 { fields.get(i).and_then(|f| f.parse().ok()).unwrap_or(0) };
    // utime and stime are fields 14 and 15 of stat; here 0-based after the state (field 3).
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// The nearest-rank percentile `p` (0 to 1) of a sorted list; 0 for an empty one.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// A sorted copy, for [`percentile`].
pub fn sorted(v: &[Duration]) -> Vec<Duration> {
    let mut v = v.to_vec();
    v.sort();
    v
}

/// `PASS` when a target is met, `MISS` when not: a missed target is a figure, not an error.
pub fn verdict(ok: bool) -> &'static str {
    if ok { "PASS" } else { "MISS" }
}

/// How long ago a binary was built (`built 42 s ago`), so that a stale one shows.
pub fn binary_age(path: &Path) -> String {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .map_or_else(
            || "unknown age".into(),
            |d| format!("built {} s ago", d.as_secs()),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requests(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    }

    #[test]
    fn percentile_is_nearest_rank() {
        // p50 of 4 values is the 2nd, p90 and max the 4th; an empty list gives 0.
        let v: Vec<Duration> = (1..=4).map(Duration::from_secs).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_secs(2));
        assert_eq!(percentile(&v, 0.9), Duration::from_secs(4));
        assert_eq!(percentile(&v, 1.0), Duration::from_secs(4));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn hub_requests_are_read_from_the_hub_schemas_only() {
        // Only `flower-hub-…` schemas count; `.` in a schema name is the `/` of a subresource.
        let text = "\
# HELP apiserver_flowcontrol_dispatched_requests_total x
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"flower-hub-patch-flowerruns.status\",priority_level=\"workload-low\"} 3
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"flower-hub-events\",priority_level=\"workload-low\"} 2
apiserver_flowcontrol_dispatched_requests_total{flow_schema=\"service-accounts\",priority_level=\"workload-low\"} 9
";
        let counts = hub_requests_in(text).expect("parsed");
        assert_eq!(
            counts,
            requests(&[("patch/flowerruns/status", 3), ("events/events", 2)])
        );
        assert!(hub_requests_in("other_metric 1").is_err());
    }

    #[test]
    fn per_resource_names_resources_but_not_for_events() {
        // Groups in GROUPS order, resources per group, none listed for Events.
        let r = requests(&[
            ("events/events", 2),
            ("patch/flowerruns/status", 3),
            ("patch/leases", 1),
        ]);
        assert_eq!(
            per_resource(&r, 1.0),
            ["events 2", "patch 4 (flowerruns/status 3, leases 1)"]
        );
        assert_eq!(
            per_resource(&r, 2.0),
            [
                "events 1.00",
                "patch 2.00 (flowerruns/status 1.50, leases 0.50)"
            ]
        );
        assert_eq!(per_resource(&BTreeMap::new(), 1.0), ["none"]);
    }

    #[test]
    fn requests_on_counts_subresources() {
        // `flowerruns` covers `flowerruns/status`, any verb; other resources do not count.
        let r = requests(&[
            ("get/flowerruns", 1),
            ("patch/flowerruns/status", 3),
            ("update/leases", 5),
        ]);
        assert_eq!(requests_on(&r, "flowerruns"), 4);
        assert_eq!(requests_on(&r, "leases"), 5);
    }

    #[test]
    fn counter_deltas_never_go_below_zero() {
        // A new key counts from 0; a counter that went down (a restart) counts 0.
        let start = requests(&[("get/leases", 5), ("list/secrets", 9)]);
        let end = requests(&[("get/leases", 7), ("list/secrets", 2), ("watch/pods", 1)]);
        assert_eq!(
            counter_deltas(&start, &end),
            requests(&[("get/leases", 2), ("list/secrets", 0), ("watch/pods", 1)])
        );
    }

    #[test]
    fn cpu_time_reads_utime_and_stime_after_the_command_name() {
        // A command name with spaces and parentheses does not shift the fields.
        let stat = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 150 25 0 0 20 0";
        assert_eq!(cpu_time_in(stat), Duration::from_millis(1750));
    }
}

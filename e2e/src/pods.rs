//! Waiting on real pods (real nodes): phases, readiness, completion with logs, crash detection.

use std::time::Duration;

use anyhow::{Result, anyhow};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;

use crate::harness::{fatal, wait_for};

/// A pod's `status.phase` ("" when unknown).
pub fn pod_phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// Whether a pod has condition `Ready=True`.
pub fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The restarts of all a pod's containers, summed.
pub fn container_restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |c| c.iter().map(|c| c.restart_count).sum())
}

/// A pod's status as one line (for failure messages).
pub fn describe(p: &Pod) -> String {
    serde_json::to_string(&p.status).unwrap_or_default()
}

/// Waits for a `restartPolicy: Never` pod to succeed and returns its log; fails with the log and
/// status when it fails.
pub async fn run_to_completion(pods: &Api<Pod>, name: &str) -> Result<String> {
    run_to_completion_within(pods, name, Duration::from_secs(120)).await
}

/// [`run_to_completion`] with a timeout of its own.
pub async fn run_to_completion_within(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
) -> Result<String> {
    wait_for(&format!("{name} Succeeded"), timeout, || {
        let pods = pods.clone();
        async move {
            let Ok(p) = pods.get(name).await else {
                return Ok(None);
            };
            match pod_phase(&p).as_str() {
                "Succeeded" => Ok(Some(())),
                "Failed" => {
                    let log = pods
                        .logs(name, &LogParams::default())
                        .await
                        .unwrap_or_default();
                    Err(fatal(anyhow!("{name} failed: {log}\n{}", describe(&p))))
                }
                _ => Ok(None),
            }
        }
    })
    .await?;
    Ok(pods.logs(name, &LogParams::default()).await?)
}

/// Fails with the previous container's log when a pod matching `selector` restarted or failed;
/// the error is [`fatal`], so a wait whose probe calls this ends at once.
pub async fn check_not_crashing(pods: &Api<Pod>, selector: &str) -> Result<()> {
    let Ok(list) = pods
        .list(&kube::api::ListParams::default().labels(selector))
        .await
    else {
        return Ok(());
    };
    for p in list.items {
        let restarts = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .map_or(0, |c| c.restart_count);
        if restarts > 0 || pod_phase(&p) == "Failed" {
            let name = p.metadata.name.clone().unwrap_or_default();
            let log = pods
                .logs(
                    &name,
                    &LogParams {
                        previous: restarts > 0,
                        ..Default::default()
                    },
                )
                .await
                .unwrap_or_default();
            return Err(fatal(anyhow!(
                "pod {name} crashed: {log}\n{}",
                describe(&p)
            )));
        }
    }
    Ok(())
}

/// For failure messages: every pod whose name starts with `prefix`, with its phase, each
/// container's restart count, state and last termination, and the tails of its current and
/// previous logs.
pub async fn dump(pods: &Api<Pod>, prefix: &str) -> String {
    let Ok(list) = pods.list(&Default::default()).await else {
        return format!("(cannot list pods for {prefix}*)");
    };
    let tail = |previous, container: &str| LogParams {
        previous,
        container: Some(container.to_owned()),
        tail_lines: Some(60),
        ..Default::default()
    };
    let mut out = String::new();
    for p in list.items {
        let name = p.metadata.name.clone().unwrap_or_default();
        if !name.starts_with(prefix) {
            continue;
        }
        out.push_str(&format!("--- pod {name} phase={}\n", pod_phase(&p)));
        let statuses = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone())
            .unwrap_or_default();
        for c in &statuses {
            out.push_str(&format!(
                "container {} ready={} restarts={} state={} last={}\n",
                c.name,
                c.ready,
                c.restart_count,
                serde_json::to_string(&c.state).unwrap_or_default(),
                serde_json::to_string(&c.last_state).unwrap_or_default(),
            ));
        }
        // Each container's log: a pod of several (a SuperLink and its fleet-front) names none.
        for c in &statuses {
            let now = pods
                .logs(&name, &tail(false, &c.name))
                .await
                .unwrap_or_default();
            out.push_str(&format!("{} log (tail):\n{now}\n", c.name));
            if c.restart_count > 0 {
                let before = pods
                    .logs(&name, &tail(true, &c.name))
                    .await
                    .unwrap_or_default();
                out.push_str(&format!(
                    "{} previous container's log (tail):\n{before}\n",
                    c.name
                ));
            }
        }
    }
    out
}

/// Deletes pod `name` (a StatefulSet's) and waits until its replacement, a new pod of the same
/// name, is Ready (at most `timeout`).
pub async fn delete_and_wait_replaced(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
) -> Result<()> {
    let old = pods.get(name).await?.metadata.uid;
    pods.delete(name, &Default::default()).await?;
    wait_for(&format!("pod {name} back and Ready"), timeout, || {
        let (pods, old) = (pods.clone(), old.clone());
        async move {
            let Some(pod) = pods.get_opt(name).await? else {
                return Ok(None);
            };
            Ok((pod.metadata.uid != old && pod_ready(&pod)).then_some(()))
        }
    })
    .await
}

/// How often each pod that `lp` selects logged `needle` (its container `container`, or its only
/// one), keyed by pod UID: `(name, count)`. Pods whose log cannot be read count 0.
pub async fn log_counts(
    pods: &Api<Pod>,
    lp: &kube::api::ListParams,
    container: Option<&str>,
    needle: &str,
) -> Result<std::collections::BTreeMap<String, (String, usize)>> {
    let mut counts = std::collections::BTreeMap::new();
    for pod in pods.list(lp).await?.items {
        let (Some(name), Some(uid)) = (pod.metadata.name, pod.metadata.uid) else {
            continue;
        };
        let params = LogParams {
            container: container.map(str::to_owned),
            ..Default::default()
        };
        let n = pods
            .logs(&name, &params)
            .await
            .map_or(0, |log| log.matches(needle).count());
        counts.insert(uid, (name, n));
    }
    Ok(counts)
}

/// The pods of `after` that logged more than in `before` (see [`log_counts`]).
pub fn logged_since(
    before: &std::collections::BTreeMap<String, (String, usize)>,
    after: &std::collections::BTreeMap<String, (String, usize)>,
) -> Vec<String> {
    after
        .iter()
        .filter(|(uid, (_, n))| *n > before.get(*uid).map_or(0, |(_, b)| *b))
        .map(|(_, (name, _))| name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pods_whose_count_grew_are_named() {
        let m = |v: &[(&str, &str, usize)]| {
            v.iter()
                .map(|(uid, name, n)| ((*uid).to_owned(), ((*name).to_owned(), *n)))
                .collect()
        };
        let before = m(&[("u1", "a-0", 1), ("u2", "a-1", 0)]);
        let after = m(&[
            ("u1", "a-0", 1),
            ("u2", "a-1", 2),
            ("u3", "a-2", 1),
            ("u4", "a-3", 0),
        ]);
        assert_eq!(logged_since(&before, &after), ["a-1", "a-2"]);
        assert!(logged_since(&after, &after).is_empty());
    }
}

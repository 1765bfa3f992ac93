//! The hub's metrics (`flower_addon_hub_*`), process-wide like controller-runtime's registry. The
//! channel, the controllers and the standalone hub record into [`hub`]; the per-Federation and
//! per-cluster gauges are snapshots, replaced whole by each mode from what it already holds
//! ([`HubMetrics::set_federations`], [`HubMetrics::set_clusters`]), so a deleted Federation
//! leaves no series behind. `flower-hub serve` serves [`registry`] on `--metrics-bind-address`.
use flower_addon_runtime::metrics::latency_buckets;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

/// Labels of the reconcile metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `federation`, `placement` or `local-pools` (the hub cluster's own pools).
    pub controller: &'static str,
}

/// Labels of failed reconciles.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// As in [`ControllerLabels`].
    pub controller: &'static str,
    /// A stable error kind (`kube`, `render`, …).
    pub reason: &'static str,
}

/// Labels of join attempts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JoinLabels {
    /// `accepted` (certificate issued), `pending` (waits for `flower-hub accept`) or `refused`.
    pub result: &'static str,
    /// Why it was refused: the gRPC code (`unauthenticated`: bad token; `permission_denied`;
    /// `resource_exhausted`: rate limit; `invalid_argument`; `already_exists`: another key);
    /// empty otherwise.
    pub reason: &'static str,
}

/// Labels of the cluster availability gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AvailabilityLabels {
    /// The `ManagedClusterConditionAvailable` status: `True`, `False` or `Unknown` (also for a
    /// cluster that has none yet).
    pub available: String,
}

/// Labels of per-Federation gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct FederationLabels {
    /// The Federation's namespace.
    pub namespace: String,
    /// The Federation's name.
    pub federation: String,
}

/// Labels of the SuperNode gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SupernodeLabels {
    /// The Federation's namespace.
    pub namespace: String,
    /// The Federation's name.
    pub federation: String,
    /// `desired`, `ready`, or `online` (connected to the SuperLink; only with SuperNode
    /// authentication, where the hub lists the SuperLink's nodes).
    pub state: &'static str,
}

/// One Federation's figures for the per-Federation gauges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FederationSample {
    /// SuperNodes wanted over every cluster.
    pub desired: i64,
    /// SuperNodes ready over every cluster.
    pub ready: i64,
    /// SuperNodes the SuperLink lists online, when it is known.
    pub online: Option<i64>,
    /// Restarts of the SuperLink seen (process or container restarts), when known.
    pub superlink_restarts: Option<i64>,
}

impl FederationSample {
    /// The figures of a Federation status (online: the clusters' totals,
    /// [`crate::core::status::cluster_totals`]), the same in both modes.
    pub fn of(desired: i32, ready: i32, totals: &flower_addon_crds::ClusterTotals) -> Self {
        Self {
            desired: desired.into(),
            ready: ready.into(),
            online: totals.online.map(i64::from),
            superlink_restarts: None,
        }
    }
}

/// Every hub metric.
#[derive(Debug)]
pub struct HubMetrics {
    reconciles: Family<ControllerLabels, Counter>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: Family<ControllerLabels, Histogram>,
    /// Agents with an open work stream.
    pub connected_agents: Gauge,
    /// From a work change to the agent's ack of it.
    pub fanout: Histogram,
    clusters: Family<AvailabilityLabels, Gauge>,
    joins: Family<JoinLabels, Counter>,
    superlink_restarts: Family<FederationLabels, Gauge>,
    supernodes: Family<SupernodeLabels, Gauge>,
}

static HUB: LazyLock<HubMetrics> = LazyLock::new(|| HubMetrics {
    reconciles: Family::default(),
    reconcile_errors: Family::default(),
    reconcile_duration: Family::new_with_constructor(|| Histogram::new(latency_buckets())),
    connected_agents: Gauge::default(),
    fanout: Histogram::new(latency_buckets()),
    clusters: Family::default(),
    joins: Family::default(),
    superlink_restarts: Family::default(),
    supernodes: Family::default(),
});

/// The process's hub metrics.
pub fn hub() -> &'static HubMetrics {
    &HUB
}

impl HubMetrics {
    /// Records one reconcile of `controller` that took `took`; `error` is the failed one's kind.
    pub fn reconciled(
        &self,
        controller: &'static str,
        took: Duration,
        error: Option<&'static str>,
    ) {
        let labels = ControllerLabels { controller };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if let Some(reason) = error {
            self.reconcile_errors
                .get_or_create(&ErrorLabels { controller, reason })
                .inc();
        }
    }

    /// Records a join attempt's outcome.
    pub fn joined(&self, result: &'static str, reason: &'static str) {
        self.joins
            .get_or_create(&JoinLabels { result, reason })
            .inc();
    }

    /// Replaces the clusters-by-availability gauge with the counts of `statuses` (each a
    /// cluster's `Available` condition status, `None` when it has none).
    pub fn set_clusters<'a>(&self, statuses: impl IntoIterator<Item = Option<&'a str>>) {
        let mut counts: BTreeMap<String, i64> = ["True", "False", "Unknown"]
            .into_iter()
            .map(|s| (s.to_owned(), 0))
            .collect();
        for status in statuses {
            *counts
                .entry(status.unwrap_or("Unknown").to_owned())
                .or_default() += 1;
        }
        self.clusters.clear();
        for (available, n) in counts {
            self.clusters
                .get_or_create(&AvailabilityLabels { available })
                .set(n);
        }
    }

    /// Replaces every per-Federation gauge with `federations`.
    pub fn set_federations(
        &self,
        federations: impl IntoIterator<Item = (FederationLabels, FederationSample)>,
    ) {
        self.supernodes.clear();
        self.superlink_restarts.clear();
        for (labels, sample) in federations {
            let states = [
                ("desired", Some(sample.desired)),
                ("ready", Some(sample.ready)),
                ("online", sample.online),
            ];
            for (state, value) in states {
                if let Some(value) = value {
                    self.supernodes
                        .get_or_create(&SupernodeLabels {
                            namespace: labels.namespace.clone(),
                            federation: labels.federation.clone(),
                            state,
                        })
                        .set(value);
                }
            }
            if let Some(restarts) = sample.superlink_restarts {
                self.superlink_restarts.get_or_create(&labels).set(restarts);
            }
        }
    }
}

/// The reason label of a refused gRPC call.
pub fn code_label(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::InvalidArgument => "invalid_argument",
        tonic::Code::Unauthenticated => "unauthenticated",
        tonic::Code::PermissionDenied => "permission_denied",
        tonic::Code::ResourceExhausted => "resource_exhausted",
        tonic::Code::AlreadyExists => "already_exists",
        tonic::Code::Aborted => "aborted",
        tonic::Code::DeadlineExceeded => "deadline_exceeded",
        tonic::Code::Unavailable => "unavailable",
        _ => "internal",
    }
}

/// A registry of the hub metrics, as `flower-hub serve` serves them; `processes` adds the
/// supervisor's (standalone mode supervises its SuperLinks).
pub fn registry(processes: bool) -> Registry {
    let m = hub();
    let mut r = Registry::default();
    r.register(
        "flower_addon_hub_reconciles",
        "Reconciles run, by controller",
        m.reconciles.clone(),
    );
    r.register(
        "flower_addon_hub_reconcile_errors",
        "Reconciles that failed, by controller and reason",
        m.reconcile_errors.clone(),
    );
    r.register(
        "flower_addon_hub_reconcile_duration_seconds",
        "How long one reconcile took, by controller",
        m.reconcile_duration.clone(),
    );
    r.register(
        "flower_addon_hub_connected_agents",
        "Agents with an open work stream",
        m.connected_agents.clone(),
    );
    r.register(
        "flower_addon_hub_work_fanout_seconds",
        "From a change of a cluster's work to its agent's ack of the new version",
        m.fanout.clone(),
    );
    r.register(
        "flower_addon_hub_clusters",
        "Registered clusters by their Available condition",
        m.clusters.clone(),
    );
    r.register(
        "flower_addon_hub_joins",
        "Join attempts by result and, for refusals, reason",
        m.joins.clone(),
    );
    r.register(
        "flower_addon_hub_superlink_restarts",
        "Restarts of each Federation's SuperLink seen by the hub (process restarts in standalone mode, container restarts in Kubernetes mode)",
        m.superlink_restarts.clone(),
    );
    r.register(
        "flower_addon_hub_supernodes",
        "SuperNodes per Federation: desired, ready, and online at the SuperLink",
        m.supernodes.clone(),
    );
    if processes {
        flower_addon_runtime::metrics::register_processes(&mut r, "flower_addon_hub");
    }
    flower_addon_runtime::metrics::register_resident_memory(&mut r);
    r
}

/// Sets the scrape-time gauges of the process itself (resident memory).
pub fn refresh_process() {
    flower_addon_runtime::metrics::refresh();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded() -> String {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry(false))
            .expect("encode");
        out
    }

    #[test]
    fn federation_gauges_are_replaced_whole() {
        // Invariant: a Federation gone from the snapshot leaves no series; `online` appears only
        // when known.
        let m = hub();
        let key = |n: &str| FederationLabels {
            namespace: "metrics-test".into(),
            federation: n.into(),
        };
        m.set_federations([
            (
                key("a"),
                FederationSample {
                    desired: 3,
                    ready: 2,
                    online: Some(1),
                    superlink_restarts: Some(4),
                },
            ),
            (key("b"), FederationSample::default()),
        ]);
        let text = encoded();
        assert!(
            text.contains(r#"flower_addon_hub_supernodes{namespace="metrics-test",federation="a",state="online"} 1"#),
            "{text}"
        );
        assert!(!text.contains(r#"federation="b",state="online""#), "{text}");
        m.set_federations([(key("b"), FederationSample::default())]);
        let text = encoded();
        assert!(!text.contains(r#"federation="a""#), "{text}");
    }

    #[test]
    fn clusters_are_counted_by_availability() {
        // Invariant: every availability value is present (0 when none), a missing condition
        // counts as Unknown.
        hub().set_clusters([Some("True"), Some("True"), None, Some("False")]);
        let text = encoded();
        for line in [
            r#"flower_addon_hub_clusters{available="True"} 2"#,
            r#"flower_addon_hub_clusters{available="False"} 1"#,
            r#"flower_addon_hub_clusters{available="Unknown"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
    }
}

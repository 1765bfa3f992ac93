//! Status of the standalone hub, written to `<state>/status.json` after every reconcile pass and
//! printed by `flower-hub status` (a table like `kubectl get federation`, or JSON).
use crate::channel::source::InMemoryWorkSource;
use crate::core::placement::ClusterView;
use crate::registration::store::{CONDITION_AVAILABLE, ClusterRecord};
use flower_addon_crds::Federation;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Name of the status file in the state directory.
pub const STATUS_FILE: &str = "status.json";

/// Everything `flower-hub status` shows.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HubStatus {
    /// One entry per valid Federation.
    pub federations: Vec<FederationSummary>,
    /// One entry per registered cluster.
    pub clusters: Vec<ClusterSummary>,
    /// Problems in the manifests directory (`FILE: field: message`).
    #[serde(default)]
    pub problems: Vec<String>,
    /// The manifests directory the hub reads (where `flower-hub run submit` writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifests_dir: Option<String>,
    /// One entry per FlowerRun (kept by the standalone run reconciler, `runs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<RunEntry>,
}

/// One FlowerRun in `status.json` (`flower-hub status`, `flower-hub run list`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunEntry {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The Federation it runs on.
    pub federation: String,
    /// Its status, as a FlowerRun's `status` in Kubernetes mode.
    pub status: flower_addon_crds::run::FlowerRunStatus,
}

/// Status of one Federation.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FederationSummary {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// StatefulSet or DaemonSet.
    pub mode: String,
    /// subprocess or process.
    pub isolation: String,
    /// Selected clusters.
    pub selected: Vec<String>,
    /// `ready/desired` SuperNodes over all clusters.
    pub supernodes: String,
    /// Ready SuperNodes.
    pub ready_supernodes: u32,
    /// Desired SuperNodes.
    pub desired_supernodes: u32,
    /// Whether the SuperLink process runs.
    pub superlink_running: bool,
    /// The one readiness rule of both modes ([`crate::core::status::readiness`]): the SuperLink
    /// runs, the Federation is placed, and every selected cluster runs its SuperNodes.
    pub ready: bool,
    /// Why it is not ready (or an error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A warning that does not stop it: a Flower release newer than the verified ones
    /// ([`crate::core::render::version_warning`]; condition `FlowerVersionVerified` in
    /// Kubernetes mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// Error that stopped reconciling this Federation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether its SuperLink works, as condition `SuperLinkHealthy` says in Kubernetes mode
    /// ([`crate::core::status::superlink_health`]; SuperNode authentication only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superlink_healthy: Option<HealthSummary>,
    /// Fleet address the SuperNodes dial (`status.endpoints.fleet` in Kubernetes mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<String>,
    /// Control address `flwr` dials (`status.endpoints.control` in Kubernetes mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<String>,
    /// Per listed cluster (those of `clusters`) and pool: `cluster/pool` → `ready/desired`.
    pub pools: BTreeMap<String, String>,
    /// Why the Placement selects nothing because of its cluster sets (reason and message of
    /// `PlacementSatisfied=False` on the Placement in Kubernetes mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// Pools that no selected cluster runs (no available cluster matches their selector).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unplaced_pools: Vec<String>,
    /// Per selected cluster (at most [`crate::core::status::LISTED_CLUSTERS`], those with
    /// something wrong first), the same entries as `status.clusters` in Kubernetes mode.
    #[serde(default)]
    pub clusters: Vec<flower_addon_crds::ClusterStatus>,
    /// Totals over every selected cluster (`status.clusterTotals` in Kubernetes mode).
    #[serde(default)]
    pub cluster_totals: flower_addon_crds::ClusterTotals,
    /// The spec's pools, in order (for the totals).
    #[serde(skip)]
    spec_pools: Vec<String>,
    /// Whether the spec names a Placement (else its pools run on the hub machine).
    #[serde(skip)]
    placed: bool,
    /// The restart mark its SuperNodes must run under
    /// ([`flower_addon_crds::supernode_restart_mark`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supernode_restart: Option<String>,
}

impl FederationSummary {
    /// A summary with the spec's facts filled in.
    pub fn new(fed: &Federation) -> Self {
        let (namespace, name) = crate::core::federation_key(fed);
        Self {
            namespace,
            name,
            mode: format!("{:?}", fed.spec.mode),
            isolation: match fed.spec.isolation_mode {
                flower_addon_crds::IsolationMode::Process => "process".into(),
                flower_addon_crds::IsolationMode::Subprocess => "subprocess".into(),
            },
            warning: crate::core::render::version_warning(fed),
            spec_pools: crate::core::status::spec_pools(fed),
            placed: fed.spec.placement_ref.is_some(),
            supernode_restart: flower_addon_crds::supernode_restart_mark(fed),
            ..Self::default()
        }
    }

    /// Fills in readiness from the agents' last reports, per cluster exactly as Kubernetes mode
    /// writes `status.clusters` ([`crate::core::status::cluster_status`]); `connected` says
    /// which clusters are `Available=True`; `online`, the keys the SuperLink lists online (SuperNode
    /// authentication on), makes readiness mean "connected to the SuperLink".
    pub fn finish(
        mut self,
        work: &InMemoryWorkSource,
        superlinks: &BTreeMap<(String, String), bool>,
        keys: Option<&crate::flower::registry::FederationKeys>,
        connected: impl Fn(&str) -> bool,
    ) -> Self {
        let online = keys.map(|k| &k.online);
        self.superlink_healthy = keys.map(|k| {
            let (status, reason, message) = crate::core::status::superlink_health(
                k.problem
                    .as_ref()
                    .map(crate::flower::registry::Diagnosis::health),
            );
            HealthSummary {
                status: status.to_owned(),
                reason: reason.to_owned(),
                message,
            }
        });
        self.superlink_running = superlinks
            .get(&(self.namespace.clone(), self.name.clone()))
            .copied()
            .unwrap_or(false);
        // What keeps it from being placed: the Placement, pools no selected cluster can run.
        let problems: Vec<String> = self
            .placement
            .iter()
            .cloned()
            .chain(
                self.unplaced_pools
                    .iter()
                    .map(|p| format!("pool {p}: no available cluster matches its clusterSelector")),
            )
            .collect();
        let now = crate::registration::tokens::unix_now() as i64;
        let mut entries = Vec::with_capacity(self.selected.len());
        for cluster in &self.selected {
            let report = work.last_status(cluster);
            let entry = crate::core::status::cluster_status(
                &self.namespace,
                &self.name,
                cluster,
                connected(cluster),
                report.as_ref().map(|r| (r, now)),
                online,
                self.supernode_restart.as_deref(),
            );
            for pool in &entry.pools {
                self.ready_supernodes += u32::try_from(pool.ready.min(pool.desired)).unwrap_or(0);
                self.desired_supernodes += u32::try_from(pool.desired).unwrap_or(0);
            }
            entries.push(entry);
        }
        let listed_count = entries.len().min(crate::core::status::LISTED_CLUSTERS);
        self.cluster_totals =
            crate::core::status::cluster_totals_of(&self.spec_pools, &entries, listed_count);
        let listed = crate::core::status::listed_clusters(entries);
        for entry in &listed {
            for pool in &entry.pools {
                self.pools.insert(
                    format!("{}/{}", entry.name, pool.name),
                    format!("{}/{}", pool.ready, pool.desired),
                );
            }
        }
        self.supernodes = format!("{}/{}", self.ready_supernodes, self.desired_supernodes);
        // The same rule as Kubernetes mode's Ready condition ([`crate::core::status::readiness`]);
        // a spec the hub refused (`error`) is not ready, as a Degraded Federation there.
        let readiness = crate::core::status::readiness(
            if self.superlink_running {
                Ok(())
            } else {
                Err("SuperLink not running".into())
            },
            &problems,
            self.placed,
            &listed,
            &self.cluster_totals,
        );
        self.clusters = listed;
        self.ready = self.error.is_none() && readiness.is_ok();
        self.message = match (&self.error, readiness) {
            (Some(e), _) => Some(e.clone()),
            (None, Err(message)) => Some(message),
            (None, Ok(())) => self.warning.clone(),
        };
        self
    }
}

/// A condition as `status.json` shows it: `status` (`True`/`False`), `reason`, `message`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HealthSummary {
    /// `True` or `False`.
    pub status: String,
    /// CamelCase reason.
    pub reason: String,
    /// What happened and what to do.
    pub message: String,
}

/// Status of one registered cluster.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSummary {
    /// Cluster name.
    pub name: String,
    /// hubAcceptsClient.
    pub accepted: bool,
    /// `Available` condition status (`True`, `False`, `Unknown`).
    pub available: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Taint keys placement sees.
    pub taints: Vec<String>,
    /// Seconds since the last heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_unix: Option<u64>,
}

impl ClusterSummary {
    /// The summary of a stored cluster and its placement view.
    pub fn new(record: &ClusterRecord, view: &ClusterView) -> Self {
        Self {
            name: record.registration.name.clone(),
            accepted: record.hub_accepts_client,
            available: record
                .status
                .condition(CONDITION_AVAILABLE)
                .map(|c| c.status.clone())
                .unwrap_or_else(|| "Unknown".into()),
            labels: record.registration.labels.clone(),
            taints: view.taints.iter().map(|t| t.key.clone()).collect(),
            last_heartbeat_unix: record.status.last_heartbeat_unix,
        }
    }
}

impl HubStatus {
    /// Writes `status.json` atomically (temp + rename).
    pub fn write(&self, state_dir: &Path) -> std::io::Result<()> {
        let path = state_dir.join(STATUS_FILE);
        let tmp = state_dir.join(".status.json.tmp");
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            return Ok(());
        }
        std::fs::write(&tmp, text)?;
        std::fs::rename(tmp, path)
    }

    /// Reads `status.json`.
    /// The FlowerRuns as `kubectl get flowerrun -A` shows them.
    pub fn run_table(&self) -> String {
        let mut rows = vec![[
            "NAMESPACE".to_owned(),
            "NAME".to_owned(),
            "FEDERATION".to_owned(),
            "RUN-ID".to_owned(),
            "STATUS".to_owned(),
            "PROGRESS".to_owned(),
        ]];
        for r in &self.runs {
            let failed = r
                .status
                .conditions
                .iter()
                .find(|c| c.type_ == "Failed" && c.status == "True")
                .map(|c| format!(" ({})", c.reason));
            rows.push([
                r.namespace.clone(),
                r.name.clone(),
                r.federation.clone(),
                r.status.run_id.clone().unwrap_or_else(|| "-".into()),
                format!(
                    "{}{}",
                    r.status
                        .flower_status
                        .as_deref()
                        .unwrap_or(if failed.is_some() {
                            "failed"
                        } else {
                            "waiting"
                        }),
                    failed.unwrap_or_default()
                ),
                r.status
                    .progress
                    .as_ref()
                    .map_or_else(|| "-".into(), |p| p.text.clone()),
            ]);
        }
        let widths: Vec<usize> = (0..6)
            .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
            .collect();
        rows.iter()
            .map(|r| {
                let cells: Vec<String> = r
                    .iter()
                    .zip(&widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect();
                format!("{}\n", cells.join("   ").trim_end())
            })
            .collect()
    }

    pub fn read(state_dir: &Path) -> std::io::Result<Self> {
        let text = std::fs::read_to_string(state_dir.join(STATUS_FILE))?;
        serde_json::from_str(&text).map_err(std::io::Error::other)
    }

    /// The Federation table (`kubectl get federation` columns).
    pub fn federation_table(&self) -> String {
        let mut rows = vec![[
            "NAMESPACE".to_string(),
            "NAME".into(),
            "MODE".into(),
            "ISOLATION".into(),
            "CLUSTERS".into(),
            "SUPERNODES".into(),
            "READY".into(),
            "MESSAGE".into(),
        ]];
        for f in &self.federations {
            rows.push([
                f.namespace.clone(),
                f.name.clone(),
                f.mode.clone(),
                f.isolation.clone(),
                f.selected.len().to_string(),
                f.supernodes.clone(),
                if f.ready {
                    "True".into()
                } else {
                    "False".into()
                },
                f.message.clone().unwrap_or_default(),
            ]);
        }
        table(&rows)
    }
}

/// Left-aligned columns three spaces apart, like `kubectl get` (no trailing spaces).
pub fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(version: &str) -> Federation {
        serde_saphyr::from_str(&format!(
            "metadata: {{name: f, namespace: team}}\nspec: {{mode: StatefulSet, isolationMode: subprocess, version: \"{version}\", superlink: {{image: \"flwr/superlink:{version}\"}}, supernodes: {{image: \"flwr/supernode:{version}\", pools: []}}}}"
        ))
        .unwrap()
    }

    #[test]
    fn a_release_newer_than_the_verified_ones_is_shown_as_a_warning() {
        // Same rule as Kubernetes mode's FlowerVersionVerified condition: the Federation runs
        // (ready as usual), and `flower-hub status` says why it may not.
        let work = InMemoryWorkSource::new();
        let running = BTreeMap::from([(("team".to_owned(), "f".to_owned()), true)]);
        let finish = |version: &str| {
            FederationSummary::new(&fed(version)).finish(&work, &running, None, |_| true)
        };
        let verified = finish("1.42.0");
        assert_eq!(verified.warning, None);
        let newer = finish("1.50.0");
        let warning = newer.warning.clone().unwrap();
        assert!(
            warning.starts_with("spec.version: Flower 1.50.0 is newer"),
            "{warning}"
        );
        // Not ready here only because nothing ran yet; that message comes first.
        assert_eq!(
            newer.message.as_deref(),
            Some("no report from the hub cluster's pools yet")
        );
        let json = serde_json::to_value(&newer).unwrap();
        assert_eq!(json["warning"].as_str(), Some(warning.as_str()));
    }
}

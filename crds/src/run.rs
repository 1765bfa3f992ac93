//! The `FlowerRun` resource: one Flower run of a Federation in the same namespace — the app (a
//! FAB), its run config and a batch-`Job`-style life cycle, with status in Flower's own words.
//!
//! The conventions are those of `batch/v1` Job (`suspend`, `activeDeadlineSeconds`,
//! `backoffLimit`, `ttlSecondsAfterFinished`, conditions `Complete`/`Failed`/`Suspended`), so a
//! user who knows Jobs knows this. What to do next for a run is decided by the hub's core from
//! this spec, this status and what the SuperLink reports.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// Flower's own limit on a FAB (`FAB_MAX_SIZE`): 10 MB.
pub const FAB_MAX_BYTES: usize = 10 * 1024 * 1024;
/// Most run-config entries a FlowerRun may set.
pub const MAX_RUN_CONFIG_ENTRIES: usize = 64;

/// A FlowerRun `runConfig`: a map whose values are strings, integers, floats or booleans.
///
/// A structural schema cannot say "one of four scalar types", so each value is free-form
/// (`x-kubernetes-preserve-unknown-fields`); `validate_flower_run` and the hub reject lists and
/// objects with a message naming the key.
fn run_config_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": MAX_RUN_CONFIG_ENTRIES,
        "additionalProperties": {
            "x-kubernetes-preserve-unknown-fields": true,
        },
    })
}

/// One FlowerRun `runConfig` value (see [`run_config_schema`]).
fn run_config_value_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Lines of the run's log kept in `status.logTail`.
pub const LOG_TAIL_LINES: usize = 50;
/// Finalizer that stops the Flower run before a deleted FlowerRun goes away.
pub const RUN_FINALIZER: &str = "flower-addon.io/stop-run";

/// Condition type: the run was handed to the SuperLink (it has a Flower run id).
pub const RUN_SUBMITTED: &str = "Submitted";
/// Condition type: Flower reports the run `running`.
pub const RUN_RUNNING: &str = "Running";
/// Condition type: Flower reports `finished:completed`.
pub const RUN_COMPLETE: &str = "Complete";
/// Condition type: the run failed for good (the reason says why).
pub const RUN_FAILED: &str = "Failed";
/// Condition type: `spec.suspend` holds the run (before it started) or stopped it.
pub const RUN_SUSPENDED: &str = "Suspended";

/// Why a FlowerRun is `Failed` (or, for the first three, waiting).
pub mod reason {
    /// The FAB cannot be used (missing, too big, wrong hash, not a Flower app).
    pub const INVALID_APP: &str = "InvalidApp";
    /// `spec.runConfig` names a key the app does not declare or gives a value of the wrong type.
    pub const INVALID_RUN_CONFIG: &str = "InvalidRunConfig";
    /// The Federation is missing or not Ready (the run waits; not a failure).
    pub const FEDERATION_NOT_READY: &str = "FederationNotReady";
    /// The SuperLink's Control API does not answer (the run waits and retries).
    pub const SUPERLINK_UNAVAILABLE: &str = "SuperLinkUnavailable";
    /// A retry waits for the Federation's SuperNodes to reach the SuperLink again after the
    /// failed attempt (not a failure).
    pub const SUPERNODES_NOT_SERVING: &str = "SuperNodesNotServing";
    /// A run waits while the hub restarts the Federation's SuperNodes after a Flower run that
    /// ended without completing (not a failure).
    pub const SUPERNODES_RESTARTING: &str = "SuperNodesRestarting";
    /// Flower ended the run `finished:failed` and no retries are left.
    pub const FLOWER_FAILED: &str = "FlowerFailed";
    /// The run was stopped (`spec.suspend` while running, or by someone else).
    pub const STOPPED: &str = "Stopped";
    /// `spec.activeDeadlineSeconds` passed.
    pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
    /// `backoffLimit` attempts were used up.
    pub const BACKOFF_LIMIT_EXCEEDED: &str = "BackoffLimitExceeded";
    /// The run's outputs are over the Federation's `spec.outputs.sizeLimit` (condition
    /// `OutputsListed=False`): neither listed nor fetched.
    pub const OUTPUTS_OVER_QUOTA: &str = "OutputsOverQuota";
}

/// Desired state of one Flower run.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "flower-addon.io",
    version = "v1alpha1",
    derive = "PartialEq",
    kind = "FlowerRun",
    plural = "flowerruns",
    namespaced,
    status = "FlowerRunStatus",
    shortname = "frun",
    printcolumn = r#"{"name":"Federation","type":"string","jsonPath":".spec.federationRef.name"}"#,
    printcolumn = r#"{"name":"Run-ID","type":"string","jsonPath":".status.runId"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.flowerStatus"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress.text"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlowerRunSpec {
    /// The Federation (in the same namespace) whose SuperLink runs the app.
    pub federation_ref: FederationRef,
    /// The Flower app to run.
    pub app: RunApp,
    /// Values for the app's `[tool.flwr.app.config]` keys (Flower's `override_config`): strings,
    /// integers, floats and booleans. A key the app does not declare fails the run before any
    /// Flower call.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "run_config_schema")]
    pub run_config: BTreeMap<String, RunConfigValue>,
    /// `true` before the run started holds it; `true` while it runs stops it (Flower's
    /// `StopRun`), ending `Failed` with reason `Stopped`. The only field that may change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// Seconds from the first submission after which a run still going is stopped and fails
    /// with reason `DeadlineExceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,
    /// How many times a run Flower ended `finished:failed` is submitted again, as a new Flower
    /// run. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10))]
    pub backoff_limit: Option<i32>,
    /// Seconds after the run finished (completed or failed) after which the hub deletes the
    /// FlowerRun. Unset: kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
}

/// A reference to a Federation in the FlowerRun's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FederationRef {
    /// Name of the Federation.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The app of a run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunApp {
    /// The Flower App Bundle: exactly one of `configMapRef` and `url`.
    pub fab: FabSource,
}

/// Where the FAB comes from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FabSource {
    /// A ConfigMap of the FlowerRun's namespace holding the FAB (as `flwr build` writes it) in
    /// `binaryData` under `key` (`flower-hub run submit` makes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ConfigMapKeyRef>,
    /// An `https://` or `http://` URL the hub downloads the FAB from (at most 10 MB); needs
    /// `sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub url: Option<String>,
    /// Lower-case hex SHA-256 of the FAB at `url`; a download that does not match fails the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: Option<String>,
}

/// A key of a ConfigMap in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigMapKeyRef {
    /// ConfigMap name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key in its `binaryData` (or `data`).
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// One run-config value: Flower's scalar types (and, to be refused, anything else).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(untagged)]
#[schemars(schema_with = "run_config_value_schema")]
pub enum RunConfigValue {
    /// `true`/`false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// Anything else (a list, an object, null): kept so that one bad value cannot make the
    /// object unreadable, and refused by validation with the key named.
    Other(serde_json::Value),
}

impl std::fmt::Display for RunConfigValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bool(b) => write!(f, "{b}"),
            Self::Int(i) => write!(f, "{i}"),
            Self::Float(x) => write!(f, "{x:?}"),
            Self::Str(s) => write!(f, "{s:?}"),
            Self::Other(v) => write!(f, "{v}"),
        }
    }
}

/// Observed state of a FlowerRun.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowerRunStatus {
    /// The Flower run id of the current attempt (a string: Flower's ids are 64-bit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Flower's status of that run, in Flower's words: `pending`, `starting`, `running`,
    /// `finished:completed`, `finished:failed`, `finished:stopped`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flower_status: Option<String>,
    /// Flower's details of that status (e.g. the error of a failed run), or what the hub waits
    /// for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<String>,
    /// Flower runs submitted for this FlowerRun (1 + retries).
    #[serde(default)]
    pub attempts: i32,
    /// When the current attempt was handed to the SuperLink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_at: Option<Time>,
    /// When the first attempt was handed to the SuperLink (`activeDeadlineSeconds` counts from
    /// here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_submitted_at: Option<Time>,
    /// When Flower reported the current attempt running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the run finished for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// SHA-256 of `spec.runConfig` when the hub first acted on the run: a later change (which
    /// CEL cannot see) stops and fails the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_config_hash: Option<String>,
    /// SHA-256 of the FAB submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fab_hash: Option<String>,
    /// A submission the hub started and has not yet seen answered: after a hub restart it is
    /// adopted from the SuperLink's run list instead of submitted again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_submission: Option<PendingSubmission>,
    /// When this run, waiting to be submitted, saw its Federation's SuperNodes back after a
    /// restart by the hub: it is submitted once every SuperNode the SuperLink lists online has
    /// reached it since (a restarted SuperNode's old session stays listed for up to 60 s, and a
    /// message for it then fails `Node Unavailable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supernodes_restarted_at: Option<Time>,
    /// Why the hub asked Flower to stop the run (`Stopped`, `DeadlineExceeded`), until Flower
    /// reports it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// Rounds, where Flower's log states them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<RunProgress>,
    /// The last lines of the run's log.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_tail: Vec<String>,
    /// Flower's timestamp of the last log line read (log streaming resumes after it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_timestamp: Option<f64>,
    /// Files the run wrote to its output directory, listed after it finished.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<RunOutput>,
    /// When `outputs` was listed (or given up on): a finished run's outputs are listed once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs_listed_at: Option<Time>,
    /// Generation last processed by the hub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Submitted`, `Running`, `Complete`, `Failed`, `Suspended`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A submission sent (or about to be sent) to the SuperLink whose answer was not recorded.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingSubmission {
    /// Which attempt (1-based).
    pub attempt: i32,
    /// The FAB hash sent.
    pub fab_hash: String,
    /// When the hub started sending it (RFC 3339).
    pub since: Time,
    /// Flower runs of the same FAB and run config that existed before it was sent (Flower's
    /// run ids are random, not increasing): the adopted run is one not among them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = 100))]
    pub known_run_ids: Vec<String>,
}

/// Round progress of a run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunProgress {
    /// The current (or last finished) round.
    pub current: i32,
    /// Rounds in all, when the log states it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<i32>,
    /// `current/total` (or `current`) for printing.
    pub text: String,
}

/// One file of a run's output directory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunOutput {
    /// Path relative to the run's output directory.
    pub path: String,
    /// Size in bytes.
    pub size: i64,
    /// Lower-case hex SHA-256.
    pub sha256: String,
}

impl FlowerRunSpec {
    /// `spec.suspend`, false when unset.
    pub fn suspended(&self) -> bool {
        self.suspend.unwrap_or(false)
    }

    /// `spec.backoffLimit`, 0 when unset.
    pub fn backoff_limit(&self) -> i32 {
        self.backoff_limit.unwrap_or(0).max(0)
    }
}

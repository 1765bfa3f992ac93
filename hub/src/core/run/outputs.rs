//! A finished run's outputs: when they are listed and what the status says of them.
use super::*;

/// How long after a run finished the hub keeps trying to list its outputs (the SuperLink pod
/// may be restarting); then `status.details` says why there is no list.
pub const OUTPUTS_LIST_WINDOW: Duration = Duration::from_secs(600);
/// How soon to try listing outputs again after a failure.
pub const OUTPUTS_RETRY: Duration = Duration::from_secs(15);

/// Where a run's outputs go (its Federation's `spec.outputs`): the run-config key and the
/// directory, as the ServerApp sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputDir {
    /// The run-config key (`spec.outputs.runConfigKey`).
    pub key: String,
    /// `<outputs root>/<namespace>/<run name>`.
    pub dir: String,
}

impl OutputDir {
    /// The run `namespace/name`'s directory under `root` for a Federation with `outputs`.
    pub fn new(
        outputs: &flower_addon_crds::OutputsSpec,
        root: &str,
        namespace: &str,
        name: &str,
    ) -> Self {
        Self {
            key: outputs.run_config_key().to_owned(),
            dir: format!("{}/{namespace}/{name}", root.trim_end_matches('/')),
        }
    }
}

/// Whether the run's outputs are to be listed now: it finished after a Flower run, its
/// Federation declares outputs and they were not listed yet. A finished run is listed once.
pub fn outputs_to_list(status: &FlowerRunStatus, declared: bool) -> bool {
    declared && is_finished(status) && status.run_id.is_some() && status.outputs_listed_at.is_none()
}

/// Why a run's outputs could not be listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputsFailure {
    /// For now (the SuperLink pod is restarting, the listing timed out): tried again.
    Retry(String),
    /// The run's files are over the Federation's `spec.outputs.sizeLimit`: for good.
    OverQuota(String),
}

/// How long listing a finished run's outputs may take, in both hub modes.
pub const OUTPUTS_LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// The condition a run gets when its outputs are not listed for good.
pub const OUTPUTS_LISTED: &str = "OutputsListed";

/// Records a listing of the run's outputs (or why there is none); returns when to try again
/// (`None`: done). Failures are retried for [`OUTPUTS_LIST_WINDOW`] after the run finished.
pub fn record_outputs(
    status: &mut FlowerRunStatus,
    listed: Result<Vec<flower_addon_crds::run::RunOutput>, OutputsFailure>,
    now: Timestamp,
) -> Option<Duration> {
    let listed = match listed {
        Ok(files) => Ok(files),
        Err(OutputsFailure::OverQuota(message)) => {
            // Over the Federation's limit it stays: not retried; said by a condition.
            let message = crate::core::text::bounded(&message, crate::core::text::MAX_DETAILS);
            status.outputs_listed_at = Some(Time(now));
            status.details = Some(message.clone());
            set(
                status,
                OUTPUTS_LISTED,
                false,
                reason::OUTPUTS_OVER_QUOTA,
                &message,
                now,
            );
            return None;
        }
        Err(OutputsFailure::Retry(why)) => Err(why),
    };
    match listed {
        Ok(files) => {
            // File names are the app's: bounded and stripped like its log.
            status.outputs = files
                .into_iter()
                .map(|f| flower_addon_crds::run::RunOutput {
                    path: crate::core::text::bounded_line(
                        &f.path,
                        crate::core::text::MAX_OUTPUT_PATH,
                    ),
                    ..f
                })
                .collect();
            status.outputs_listed_at = Some(Time(now));
            None
        }
        Err(why) => {
            let finished = status.finished_at.as_ref().map_or(now, |t| t.0);
            let waited = now.duration_since(finished);
            if waited >= SignedDuration::try_from(OUTPUTS_LIST_WINDOW).unwrap_or_default() {
                status.outputs_listed_at = Some(Time(now));
                status.details = Some(format!(
                    "outputs not listed: {why} (gave up {} s after the run finished;                      `flower-hub run fetch` still tries)",
                    OUTPUTS_LIST_WINDOW.as_secs()
                ));
                None
            } else {
                status.details = Some(format!("listing outputs: {why}; retried"));
                Some(OUTPUTS_RETRY)
            }
        }
    }
}

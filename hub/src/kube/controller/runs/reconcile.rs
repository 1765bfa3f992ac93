//! One reconcile of a FlowerRun: the facts (Federation, app, SuperLink, claimed run ids), the
//! core's decision, then the calls and writes it asks for, in the order that keeps `StartRun`
//! from being sent twice: finalizer, status with the pending submission, `StartRun`, result.
use std::sync::Arc;
use std::time::Duration;

use flower_addon_crds::Federation;
use flower_addon_crds::run::{
    FlowerRun, FlowerRunSpec, FlowerRunStatus, RUN_FAILED, RUN_SUBMITTED, reason,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;

use super::store::{self, Written};
use super::{CONFLICT_RETRY, FedKey, RunContext, RunKey, has_finalizer};
use crate::core::render::superlink_name;
use crate::core::run::{
    self as core_run, ACTIVE_POLL, Action as RunAction, AppState, FederationState, RunEvent,
    SuperLinkState, SuperNodesState, UNREACHABLE_RETRY,
};
use crate::flower::control::ControlClient;
use crate::flower::outputs;
use crate::flower::runs::{self as flower_runs, CheckedApp, ConfigMapSource};
use crate::kube::controller::{Error, Result};

/// How soon a run whose FAB is being downloaded from its URL is looked at again.
const DOWNLOAD_RETRY: Duration = Duration::from_secs(3);
/// How long the rest of a finished run's log is read.
const FINAL_LOG_WAIT: Duration = Duration::from_secs(5);

/// Reconciles one FlowerRun: facts → [`core_run::decide`] → act → store.
pub async fn reconcile(run: Arc<FlowerRun>, ctx: Arc<RunContext>) -> Result<Action> {
    let name = run.name_any();
    let namespace = run
        .namespace()
        .ok_or_else(|| Error::NoNamespace(format!("FlowerRun {name}")))?;
    let key: RunKey = (namespace.clone(), name.clone());
    // Followers of runs deleted meanwhile stop (a run deleted without the finalizer is never
    // reconciled again).
    ctx.followers()
        .retain(|k| ctx.runs.get(&ObjectRef::new(&k.1).within(&k.0)).is_some() || *k == key);
    let deleting = run.metadata.deletion_timestamp.is_some();
    if deleting && !has_finalizer(&run) {
        ctx.followers().stop(&key);
        return Ok(Action::await_change());
    }
    let run_name = format!("{namespace}/{name}");
    let current = run.status.clone().unwrap_or_default();
    let spec = &run.spec;
    let fed_key: FedKey = (namespace.clone(), spec.federation_ref.name.clone());
    let fed = ctx
        .federations
        .get(&ObjectRef::new(&fed_key.1).within(&namespace));
    let federation = federation_state(fed.as_deref());
    // A finished run is not followed any more: it gets no client, so it makes no call.
    let client = fed
        .as_deref()
        .filter(|_| deleting || !core_run::is_finished(&current))
        .and_then(|f| ctx.control_client(&fed_key, f));
    let mut checked: Option<CheckedApp> = None;
    let app = if core_run::needs_app(&current, deleting)
        && (federation == FederationState::Ready || current.pending_submission.is_some())
    {
        let output = fed
            .as_deref()
            .and_then(|f| output_dir(f, &namespace, &name));
        let (state, app) = load_app(&ctx, &namespace, spec, output.as_ref()).await?;
        checked = app;
        Some(state)
    } else {
        None
    };
    let superlink = if asks_superlink(&current, spec, deleting, &federation, app.as_ref()) {
        match &client {
            Some(client) => ctx.list_runs(&fed_key, client).await,
            None => SuperLinkState::Unreachable(format!(
                "Federation {} has no SuperLink to reach",
                fed_key.1
            )),
        }
    } else {
        SuperLinkState::NotAsked
    };
    let claimed = ctx
        .runs
        .state()
        .iter()
        .filter(|r| r.namespace().as_deref() == Some(namespace.as_str()) && r.name_any() != name)
        .filter(|r| r.spec.federation_ref.name == fed_key.1)
        .filter_map(|r| r.status.as_ref()?.run_id.as_deref()?.parse().ok())
        .collect();
    let supernodes = match &client {
        Some(client)
            if federation == FederationState::Ready
                && core_run::needs_supernodes(&current, deleting) =>
        {
            flower_runs::supernodes(client).await
        }
        _ => SuperNodesState::NotAsked,
    };
    let facts = core_run::Facts {
        run_name: &run_name,
        spec,
        generation: run.metadata.generation,
        deleting,
        federation,
        app,
        superlink,
        supernodes,
        config_text: flower_runs::config_text(&spec.run_config, checked.as_ref()),
        run_config_hash: core_run::run_config_hash(spec),
        claimed,
        now: now(),
    };
    let decision = core_run::decide(&current, &facts);
    let mut events = decision.events;
    let mut status = decision.status;
    let mut requeue = decision.requeue;
    // A FAB still downloading (or whose URL failed for now) wakes no watch: look again.
    if spec.app.fab.url.is_some() && matches!(facts.app, Some(AppState::Missing { .. })) {
        requeue = Some(requeue.map_or(DOWNLOAD_RETRY, |r| r.min(DOWNLOAD_RETRY)));
    }
    // What the apiserver holds, and the resourceVersion a write is conditional on.
    let mut stored = current.clone();
    let mut read_at = run.resource_version();
    match (&decision.action, &client) {
        (RunAction::Submit, Some(client)) => {
            let Some(app) = &checked else {
                // The app went missing between the submission and its retry: stored, not sent.
                return finish(&ctx, &run, &stored, status, read_at, events, requeue).await;
            };
            if !has_finalizer(&run) {
                // Before the first submission: a deletion from here on stops the Flower run.
                match store::add_finalizer(&ctx.client, &run).await? {
                    // The status decided on must still be the apiserver's: the pending
                    // submission is then written conditional on the patched object.
                    Written::Stored(patched)
                        if patched.status.clone().unwrap_or_default() == current =>
                    {
                        read_at = patched.resource_version();
                    }
                    _ => return Ok(Action::requeue(CONFLICT_RETRY)),
                }
            }
            // Stored before it is sent: a crash from here on is adopted, not sent again.
            match store::write_status(&ctx.client, &run, &status, read_at.as_deref()).await? {
                Written::Stale => return Ok(Action::requeue(CONFLICT_RETRY)),
                Written::Stored(_) => {}
            }
            publish(&ctx, &run, std::mem::take(&mut events)).await;
            stored = status.clone();
            // This pass holds the newest status (its write just went through): the result is
            // stored whatever happened to the object's metadata meanwhile.
            read_at = None;
            status = flower_runs::submit(client, &status, app).await;
            ctx.forget_list(&fed_key);
            events.push(submission_event(&status));
            requeue = Some(if status.run_id.is_some() {
                ACTIVE_POLL
            } else {
                UNREACHABLE_RETRY
            });
        }
        (RunAction::Stop(run_id) | RunAction::StopAndRelease(run_id), Some(client)) => {
            let stopped = flower_runs::stop(client, *run_id).await;
            ctx.forget_list(&fed_key);
            if let Err(why) = stopped {
                status.details = Some(format!("stopping Flower run {run_id}: {why}"));
                requeue = Some(UNREACHABLE_RETRY);
            } else if matches!(decision.action, RunAction::StopAndRelease(_)) {
                tracing::info!(run = %run_name, run_id, "stopped; releasing");
                return release(&ctx, &run, &key, events).await;
            }
        }
        (RunAction::Release, _) => return release(&ctx, &run, &key, events).await,
        (RunAction::Delete, _) => {
            ctx.followers().stop(&key);
            store::delete(&ctx.client, &run).await?;
            tracing::info!(run = %run_name, "deleted: ttlSecondsAfterFinished passed");
            publish(&ctx, &run, events).await;
            return Ok(Action::await_change());
        }
        _ => {}
    }
    if let Some(client) = &client {
        read_log(&ctx, client, &key, &current, &mut status, deleting).await;
    }
    if let Some(fed) = fed.as_deref()
        && !deleting
        && core_run::outputs_to_list(&status, fed.spec.outputs.is_some())
    {
        let pod = format!("{}-0", superlink_name(&fed_key.1));
        let listing = outputs::list_via_api(&ctx.client, &namespace, &pod, &namespace, &name);
        let listed = match tokio::time::timeout(core_run::OUTPUTS_LIST_TIMEOUT, listing).await {
            Ok(Ok(files)) => Ok(files),
            Ok(Err(outputs::OutputsError::OverQuota { message })) => {
                Err(core_run::OutputsFailure::OverQuota(message))
            }
            Ok(Err(e)) => Err(core_run::OutputsFailure::Retry(e.to_string())),
            Err(_) => Err(core_run::OutputsFailure::Retry(format!(
                "pod {namespace}/{pod} did not answer within {} s",
                core_run::OUTPUTS_LIST_TIMEOUT.as_secs()
            ))),
        };
        if let Some(retry) = core_run::record_outputs(&mut status, listed, now()) {
            requeue = Some(requeue.map_or(retry, |r| r.min(retry)));
        }
    }
    finish(&ctx, &run, &stored, status, read_at, events, requeue).await
}

/// Where the run `namespace/name` writes its outputs, when its Federation keeps them: under
/// the outputs volume's mount in the SuperLink pod.
fn output_dir(fed: &Federation, namespace: &str, name: &str) -> Option<core_run::OutputDir> {
    let outputs = fed.spec.outputs.as_ref()?;
    Some(core_run::OutputDir::new(
        outputs,
        outputs::OUTPUTS_MOUNT_DIR,
        namespace,
        name,
    ))
}

/// Whether the SuperLink's run list is asked for: when [`core_run::needs_superlink`] says so,
/// except for a run not submitted yet that the core decides on without it (held by `suspend`,
/// its Federation not Ready, its app missing or invalid) — the same decision, without a call.
fn asks_superlink(
    current: &FlowerRunStatus,
    spec: &FlowerRunSpec,
    deleting: bool,
    federation: &FederationState,
    app: Option<&AppState>,
) -> bool {
    if !core_run::needs_superlink(current, deleting) {
        return false;
    }
    deleting
        || current.run_id.is_some()
        || current.pending_submission.is_some()
        || (*federation == FederationState::Ready
            && !spec.suspended()
            && matches!(app, Some(AppState::Ready { .. })))
}

/// The Federation as the core sees it: missing, not Ready (the message of its `Ready`
/// condition), or Ready.
pub(super) fn federation_state(fed: Option<&Federation>) -> FederationState {
    let Some(fed) = fed else {
        return FederationState::Missing;
    };
    let ready = fed
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => FederationState::Ready,
        Some(c) if !c.message.is_empty() => FederationState::NotReady(c.message.clone()),
        Some(c) => FederationState::NotReady(c.reason.clone()),
        None => FederationState::NotReady("it has no Ready condition yet".into()),
    }
}

/// The run's app from the ConfigMap its spec names (absent: the run waits for it), checked
/// against its run config. An apiserver error is an error (retried), never a verdict on the app.
async fn load_app(
    ctx: &RunContext,
    namespace: &str,
    spec: &FlowerRunSpec,
    output: Option<&core_run::OutputDir>,
) -> Result<(AppState, Option<CheckedApp>)> {
    let config_map = match &spec.app.fab.config_map_ref {
        Some(reference) => Api::<ConfigMap>::namespaced(ctx.client.clone(), namespace)
            .get_opt(&reference.name)
            .await
            .map_err(|source| Error::Kube {
                action: format!("get ConfigMap {namespace}/{}", reference.name),
                source,
            })?,
        None => None,
    };
    let (source, bytes) = flower_runs::fab_bytes_from(
        namespace,
        &spec.app.fab,
        config_map.as_ref(),
        ConfigMapSource::Cluster,
        &ctx.fab_urls,
    )
    .await;
    Ok(flower_runs::check_app(
        &source,
        bytes,
        &spec.run_config,
        output,
    ))
}

/// The event of a submission's answer (the core's `submitted`, `submit_refused` or
/// `submit_unanswered` wrote it into the conditions).
fn submission_event(status: &FlowerRunStatus) -> RunEvent {
    let condition = |type_: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    if status.run_id.is_some() {
        let message = condition(RUN_SUBMITTED).map_or_else(String::new, |c| c.message.clone());
        return RunEvent {
            warning: false,
            reason: "Submitted",
            message: format!("submitted: {message}"),
        };
    }
    let (reason, message) = match condition(RUN_FAILED) {
        Some(c) if c.reason == reason::INVALID_APP => (reason::INVALID_APP, c.message.clone()),
        Some(c) => (reason::FLOWER_FAILED, c.message.clone()),
        None => (
            reason::SUPERLINK_UNAVAILABLE,
            status.details.clone().unwrap_or_default(),
        ),
    };
    RunEvent {
        warning: true,
        reason,
        message,
    }
}

/// The log: followed while the run goes on; the rest read once when it finished (as the
/// standalone hub does).
async fn read_log(
    ctx: &RunContext,
    client: &Arc<ControlClient>,
    key: &RunKey,
    current: &FlowerRunStatus,
    status: &mut FlowerRunStatus,
    deleting: bool,
) {
    let Some(run_id) = status
        .run_id
        .as_deref()
        .and_then(|id| id.parse::<u64>().ok())
    else {
        return;
    };
    let after = status.log_timestamp.unwrap_or(0.0);
    let chunks = if core_run::active_run(status).is_some() && !deleting {
        ctx.followers().drain(key, client, run_id, after)
    } else if core_run::active_run(current).is_some() || current.run_id != status.run_id {
        ctx.followers().stop(key);
        flower_runs::final_log(client, run_id, after, FINAL_LOG_WAIT).await
    } else {
        Vec::new()
    };
    for chunk in chunks {
        core_run::add_log(status, &chunk.text, chunk.timestamp);
    }
}

/// Stores `status` when it differs from what the apiserver holds (`stored`), then publishes
/// the events; a write refused as stale publishes nothing and looks again soon.
async fn finish(
    ctx: &RunContext,
    run: &FlowerRun,
    stored: &FlowerRunStatus,
    status: FlowerRunStatus,
    read_at: Option<String>,
    events: Vec<RunEvent>,
    requeue: Option<Duration>,
) -> Result<Action> {
    if status != *stored {
        if let Written::Stale =
            store::write_status(&ctx.client, run, &status, read_at.as_deref()).await?
        {
            return Ok(Action::requeue(CONFLICT_RETRY));
        }
        tracing::debug!(
            run = %run.name_any(),
            namespace = run.namespace().unwrap_or_default(),
            flower_status = status.flower_status.as_deref().unwrap_or("-"),
            "status updated"
        );
    }
    publish(ctx, run, events).await;
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// Removes the finalizer (the Flower run is stopped or there is none) and forgets the run.
async fn release(
    ctx: &RunContext,
    run: &FlowerRun,
    key: &RunKey,
    events: Vec<RunEvent>,
) -> Result<Action> {
    ctx.followers().stop(key);
    if let Written::Stale = store::remove_finalizer(&ctx.client, run).await? {
        return Ok(Action::requeue(CONFLICT_RETRY));
    }
    publish(ctx, run, events).await;
    Ok(Action::await_change())
}

/// Records the decision's events on the run (and in the hub's log).
async fn publish(ctx: &RunContext, run: &FlowerRun, events: Vec<RunEvent>) {
    let name = format!("{}/{}", run.namespace().unwrap_or_default(), run.name_any());
    for event in events {
        let type_ = if event.warning {
            tracing::warn!(run = %name, reason = event.reason, "{}", event.message);
            EventType::Warning
        } else {
            tracing::info!(run = %name, reason = event.reason, "{}", event.message);
            EventType::Normal
        };
        super::super::apply::publish(
            &ctx.recorder,
            run,
            type_,
            "Reconcile",
            event.reason,
            event.message,
        )
        .await;
    }
}

/// Now, to the second: what the apiserver keeps of a time, so an unchanged run computes the
/// status it read.
fn now() -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH)
}

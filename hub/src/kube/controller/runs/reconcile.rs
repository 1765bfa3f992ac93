//! One reconcile of a FlowerRun in Kubernetes mode: the run, its Federation and the run ids
//! other runs hold from the caches, then [`crate::runs::reconcile`] (the same as the standalone
//! hub's) over this mode's [`RunHost`]: ConfigMaps and the outputs listing through the API, the
//! pending submission stored with the finalizer, conditional on the resourceVersion read.
use std::sync::Arc;
use std::time::Duration;

use flower_addon_crds::Federation;
use flower_addon_crds::run::{FlowerRun, FlowerRunStatus, RunOutput};
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
use crate::core::run::{FederationState, OutputDir, OutputsFailure, RunEvent, SuperLinkState};
use crate::flower::control::ControlClient;
use crate::flower::fab_url::FabUrlCache;
use crate::flower::outputs;
use crate::flower::runs::{ConfigMapSource, LogFollowers};
use crate::kube::controller::{Error, Result};
use crate::runs::{Outcome, RunHost, Stored};

/// Reconciles one FlowerRun: [`crate::runs::reconcile`], then the write, release or delete
/// it asks for.
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
    let current = run.status.clone().unwrap_or_default();
    let fed_key: FedKey = (namespace.clone(), run.spec.federation_ref.name.clone());
    let fed = ctx
        .federations
        .get(&ObjectRef::new(&fed_key.1).within(&namespace));
    let claimed = ctx
        .runs
        .state()
        .iter()
        .filter(|r| r.namespace().as_deref() == Some(namespace.as_str()) && r.name_any() != name)
        .filter(|r| r.spec.federation_ref.name == fed_key.1)
        .filter_map(|r| r.status.as_ref()?.run_id.as_deref()?.parse().ok())
        .collect();
    let mut host = KubeRunHost {
        ctx: &ctx,
        run: &run,
        fed: fed.as_deref(),
        fed_key: &fed_key,
        stored: current.clone(),
        read_at: run.resource_version(),
    };
    let outcome = crate::runs::reconcile(
        &mut host,
        crate::runs::Run {
            key: &key,
            spec: &run.spec,
            generation: run.metadata.generation,
            current: &current,
            deleting,
            federation: federation_state(fed.as_deref()),
            keeps_outputs: fed.as_deref().is_some_and(|f| f.spec.outputs.is_some()),
            client: fed.as_deref().and_then(|f| ctx.control_client(&fed_key, f)),
            claimed,
            restarted_after: fed.as_deref().and_then(restarted_after),
            restarting: fed
                .as_deref()
                .and_then(crate::core::status::restart_pending),
            // Not read from the SuperLink pod yet: a restarted hub leaves it running.
            superlink_started_at: None,
        },
    )
    .await?;
    let KubeRunHost {
        stored, read_at, ..
    } = host;
    match outcome {
        Outcome::Stale => Ok(Action::requeue(CONFLICT_RETRY)),
        Outcome::Release { events } => release(&ctx, &run, &key, events).await,
        Outcome::Delete { events, .. } => {
            ctx.followers().stop(&key);
            store::delete(&ctx.client, &run).await?;
            publish(&ctx, &run, events).await;
            Ok(Action::await_change())
        }
        Outcome::Store {
            status,
            events,
            requeue,
        } => finish(&ctx, &run, &stored, status, read_at, events, requeue).await,
    }
}

/// The Kubernetes mode's side of one run's reconcile.
struct KubeRunHost<'a> {
    ctx: &'a RunContext,
    run: &'a FlowerRun,
    fed: Option<&'a Federation>,
    fed_key: &'a FedKey,
    /// What the apiserver holds.
    stored: FlowerRunStatus,
    /// The resourceVersion a write is conditional on (`None`: this pass wrote the newest).
    read_at: Option<String>,
}

impl RunHost for KubeRunHost<'_> {
    type Error = Error;

    async fn config_map(&mut self, name: &str) -> Result<Option<ConfigMap>> {
        let namespace = &self.fed_key.0;
        Api::<ConfigMap>::namespaced(self.ctx.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|source| Error::Kube {
                action: format!("get ConfigMap {namespace}/{name}"),
                source,
            })
    }

    fn config_map_source(&self) -> ConfigMapSource {
        ConfigMapSource::Cluster
    }

    fn fab_urls(&self) -> &FabUrlCache {
        &self.ctx.fab_urls
    }

    /// Under the outputs volume's mount in the SuperLink pod.
    fn output_dir(&mut self) -> Option<OutputDir> {
        let outputs = self.fed?.spec.outputs.as_ref()?;
        Some(OutputDir::new(
            outputs,
            outputs::OUTPUTS_MOUNT_DIR,
            &self.fed_key.0,
            &self.run.name_any(),
        ))
    }

    async fn list_runs(&mut self, client: &ControlClient) -> SuperLinkState {
        self.ctx.list_runs(self.fed_key, client).await
    }

    fn forget_list(&mut self) {
        self.ctx.forget_list(self.fed_key);
    }

    async fn store_pending(
        &mut self,
        status: &FlowerRunStatus,
        events: Vec<RunEvent>,
    ) -> Result<Stored> {
        if !has_finalizer(self.run) {
            // Before the first submission: a deletion from here on stops the Flower run.
            match store::add_finalizer(&self.ctx.client, self.run).await? {
                // The status decided on must still be the apiserver's: the pending
                // submission is then written conditional on the patched object.
                Written::Stored(patched)
                    if patched.status.clone().unwrap_or_default() == self.stored =>
                {
                    self.read_at = patched.resource_version();
                }
                _ => return Ok(Stored::Stale),
            }
        }
        match store::write_status(&self.ctx.client, self.run, status, self.read_at.as_deref())
            .await?
        {
            Written::Stale => return Ok(Stored::Stale),
            Written::Stored(_) => {}
        }
        publish(self.ctx, self.run, events).await;
        self.stored = status.clone();
        // This pass holds the newest status (its write just went through): the result is
        // stored whatever happened to the object's metadata meanwhile.
        self.read_at = None;
        Ok(Stored::Yes)
    }

    fn with_followers<T>(&mut self, f: impl FnOnce(&mut LogFollowers<RunKey>) -> T) -> T {
        f(&mut self.ctx.followers())
    }

    /// Through the API's exec into the SuperLink pod.
    async fn list_outputs(&mut self) -> std::result::Result<Vec<RunOutput>, OutputsFailure> {
        let namespace = &self.fed_key.0;
        let pod = format!("{}-0", superlink_name(&self.fed_key.1));
        outputs::list_via_api(
            &self.ctx.client,
            namespace,
            &pod,
            namespace,
            &self.run.name_any(),
        )
        .await
        .map_err(|e| match e {
            outputs::OutputsError::OverQuota { message } => OutputsFailure::OverQuota(message),
            e => OutputsFailure::Retry(e.to_string()),
        })
    }

    fn now(&self) -> Timestamp {
        (self.ctx.clock)()
    }

    async fn restart_supernodes(&mut self, after_run: u64) -> Result<bool> {
        self.ctx
            .restart_supernodes(self.fed_key, self.fed, after_run)
            .await
    }
}

/// `status.supernodeRestartAfterRun` of `fed`.
pub(super) fn restarted_after(fed: &Federation) -> Option<u64> {
    fed.status
        .as_ref()?
        .supernode_restart_after_run
        .as_deref()?
        .trim()
        .parse()
        .ok()
}

/// The Federation as the core sees it: missing, not Ready (the message of its `Ready`
/// condition), or Ready.
pub(super) fn federation_state(fed: Option<&Federation>) -> FederationState {
    let ready = fed.map(|fed| {
        fed.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
    });
    crate::runs::federation_state(ready.map(|c| match c {
        Some(c) => (c.status == "True", c.message.as_str(), c.reason.as_str()),
        None => (false, "", ""),
    }))
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

//! The hub's Kubernetes-mode Federation controller (kube-runtime).
//!
//! Reconcile is a pipeline `validate → build → apply → prune → status`:
//! - validate: [`crate::core::problems`], the CRD rules plus everything the renderer would
//!   refuse; an invalid Federation gets `Degraded=True` naming the fields and nothing is applied
//!   or deleted (running workloads keep running);
//! - build: [`render_hub`] (SuperLink StatefulSet and Service) plus the SuperLink TLS Secret
//!   issued by the hub CA when TLS is on ([`tls`]);
//! - apply: server-side apply under one field manager ([`HUB_FIELD_MANAGER`]), every object
//!   owned by the Federation (garbage-collected with it), labelled for pruning. Fields the build
//!   stops setting (Service labels removed from the spec) vanish because one manager owns them;
//! - prune: labelled, owned objects the build no longer returns (removed pools, the old kind after
//!   a mode switch) are deleted;
//! - status: written with server-side apply on the status subresource, only when it changed.
//!
//! Pools run where the work source puts them ([`crate::kube::work`]): in spoke clusters through
//! the work channel, or, without `placementRef`, in the hub cluster by [`crate::kube::hub_pools`];
//! this controller applies only the SuperLink side, and sums the per-cluster status into the
//! totals and conditions.
//!
//! Beside it: the Placement controller ([`placement`]) and the FlowerRun controller ([`runs`]).

pub(crate) mod apply;
pub mod cache;
mod context;
mod error;
pub mod placement;
mod placement_state;
pub mod runs;
mod status;
pub mod tls;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use flower_addon_crds::{Federation, FederationStatus, Placement};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};

use crate::core::render::{
    ExternalAddressError, ExternalEndpoints, HubRenderError, external_endpoints,
    federation_dialect, render_hub, superlink_tls_secret_name,
};
use crate::core::sans::SuperLinkNames;
use crate::kube::backoff::ShortBackoff;
use crate::registration::ca::{CaError, HubCa};
use flower_addon_runtime::ops::Health;

pub(crate) use apply::controller_ref;
pub use apply::{APPLIED_BY_LABEL, HUB_FIELD_MANAGER};
pub use cache::Caches;
use context::WRITTEN_MAX;
pub use context::{Context, RENEWAL_WAITS, Settings};
pub use error::{Error, Result};
pub use placement_state::OCM_PLACEMENT_RESYNC;
use placement_state::*;
pub use status::{Outcome, PlacementState, WorkloadReadiness, federation_status};
pub use tls::hub_issues_tls;

/// How often a converged Federation is reconciled anyway (drift, certificate renewal).
pub const RESYNC: Duration = Duration::from_secs(300);

/// The readiness check of the Federation controller.
pub const READY_CHECK: &str = "federation-controller";

/// What triggers a reconcile of a Federation: its spec (generation), its deletion, and the
/// per-cluster status and totals the work source writes (the controller sums them up). The controller's own
/// status writes change none of these, so they trigger nothing.
fn reconcile_inputs(fed: &Federation) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    fed.metadata.generation.hash(&mut hasher);
    fed.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    let clusters = fed
        .status
        .as_ref()
        .map(|s| (&s.clusters, &s.cluster_totals));
    serde_json::to_string(&clusters)
        .unwrap_or_default()
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// What of a namespace its Federations' reconciles read: its Pod Security labels.
fn pod_security_labels(ns: &Namespace) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    ns.labels()
        .iter()
        .filter(|(k, _)| k.starts_with("pod-security.kubernetes.io/"))
        .for_each(|label| label.hash(&mut hasher));
    Some(hasher.finish())
}

/// Runs the Federation controller until `shutdown` resolves (graceful: running reconciles end):
/// the Federation watch (filtered by [`reconcile_inputs`]), the watches of what the hub applied
/// and of Placements, each feeding a cache ([`Caches`]) the reconcile reads. `health` gets the
/// check [`READY_CHECK`], passing once every cache has listed.
pub async fn run(
    client: Client,
    ca: Arc<HubCa>,
    settings: Settings,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    use kube::runtime::{PredicateConfig, WatchStreamExt, reflector};
    let listed = crate::kube::list_gate::ListGate::new(
        health,
        READY_CHECK,
        &[
            "federations",
            "statefulsets",
            "services",
            "networkpolicies",
            "secrets",
            "placements",
            "namespaces",
        ],
    );
    let owned =
        watcher::Config::default().labels(&format!("{APPLIED_BY_LABEL}={HUB_FIELD_MANAGER}"));
    let (federations, fed_writer) = reflector::store::<Federation>();
    let (statefulsets, sts_writer) = reflector::store::<StatefulSet>();
    let (services, svc_writer) = reflector::store::<Service>();
    let (network_policies, policy_writer) = reflector::store::<NetworkPolicy>();
    let (secrets, secret_writer) = reflector::store::<Secret>();
    let (placements, placement_writer) = reflector::store::<Placement>();
    let (namespaces, namespace_writer) = reflector::store::<Namespace>();
    let feds = listed
        .watch(
            "federations",
            watcher(Api::<Federation>::all(client.clone()), Default::default())
                .backoff(ShortBackoff::default()),
        )
        .reflect(fed_writer)
        .applied_objects()
        .predicate_filter(reconcile_inputs, PredicateConfig::default());
    let sts = owned_objects(&listed, "statefulsets", &client, &owned, sts_writer);
    let svcs = owned_objects(&listed, "services", &client, &owned, svc_writer);
    let policies = owned_objects(&listed, "networkpolicies", &client, &owned, policy_writer);
    let tls = owned_objects(&listed, "secrets", &client, &owned, secret_writer);
    let placement_events = listed
        .watch(
            "placements",
            watcher(Api::<Placement>::all(client.clone()), Default::default())
                .backoff(ShortBackoff::default()),
        )
        .reflect(placement_writer)
        .touched_objects();
    let namespace_events = listed
        .watch(
            "namespaces",
            watcher(Api::<Namespace>::all(client.clone()), Default::default())
                .backoff(ShortBackoff::default()),
        )
        .reflect(namespace_writer)
        .touched_objects()
        .predicate_filter(pod_security_labels, PredicateConfig::default());
    let mut context = Context::new(
        client,
        ca,
        Caches {
            statefulsets,
            services,
            network_policies,
            secrets,
            placements,
            namespaces,
        },
    );
    context.settings = settings;
    Controller::for_stream(feds, federations.clone())
        // A namespace's Pod Security labels decide whether its Federations may run there.
        .watches_stream(namespace_events, federations_in(federations.clone()))
        // A Placement's PlacementSatisfied is mirrored on the Federations that reference it.
        .watches_stream(placement_events, federations_placed_by(federations))
        .owns_stream(sts)
        .owns_stream(svcs)
        .owns_stream(policies)
        .owns_stream(tls)
        .trigger_backoff(ShortBackoff::default())
        .graceful_shutdown_on(shutdown)
        .run(
            |fed, ctx| measured("federation", reconcile(fed, ctx)),
            error_policy,
            Arc::new(context),
        )
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(federation = %object, "reconciled"),
                Err(error) => tracing::warn!(%error, "reconcile failed"),
            }
        })
        .await;
    tracing::info!("federation controller stopped");
}

/// The Federations of a namespace (from the cache `federations`).
fn federations_in(
    federations: kube::runtime::reflector::Store<Federation>,
) -> impl Fn(Namespace) -> Vec<ObjectRef<Federation>> + Send + Sync + 'static {
    move |ns: Namespace| {
        let namespace = ns.name_any();
        federations
            .state()
            .iter()
            .filter(|f| f.namespace().as_deref() == Some(namespace.as_str()))
            .map(|f| ObjectRef::from_obj(f.as_ref()))
            .collect()
    }
}

/// The Federations that reference a Placement (from the cache `federations`).
fn federations_placed_by(
    federations: kube::runtime::reflector::Store<Federation>,
) -> impl Fn(Placement) -> Vec<ObjectRef<Federation>> + Send + Sync + 'static {
    move |placement: Placement| {
        let namespace = placement.namespace();
        let name = placement.name_any();
        federations
            .state()
            .iter()
            .filter(|f| {
                f.namespace() == namespace
                    && f.spec
                        .placement_ref
                        .as_ref()
                        .is_some_and(|r| r.name == name)
            })
            .map(|f| ObjectRef::from_obj(f.as_ref()))
            .collect()
    }
}

/// The watch of a kind the hub applies (`owned`: its label), feeding `writer`'s cache; every
/// object it touches wakes the reconcile of the Federation that owns it.
fn owned_objects<K>(
    listed: &Arc<crate::kube::list_gate::ListGate>,
    name: &'static str,
    client: &Client,
    owned: &watcher::Config,
    writer: kube::runtime::reflector::store::Writer<K>,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + use<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    use kube::runtime::WatchStreamExt;
    listed
        .watch(
            name,
            watcher(Api::<K>::all(client.clone()), owned.clone()).backoff(ShortBackoff::default()),
        )
        .reflect(writer)
        .touched_objects()
}

/// Runs one reconcile of `controller`, counting it, its time and its error kind in the metrics.
pub(crate) async fn measured(
    controller: &'static str,
    reconcile: impl Future<Output = Result<Action>>,
) -> Result<Action> {
    let started = std::time::Instant::now();
    let result = reconcile.await;
    crate::metrics::hub().reconciled(
        controller,
        started.elapsed(),
        result.as_ref().err().map(Error::metric_label),
    );
    result
}

/// Requeue with a delay after a failed reconcile.
pub fn error_policy(fed: Arc<Federation>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(
        federation = %fed.name_any(),
        namespace = fed.namespace().unwrap_or_default(),
        kind = error.metric_label(),
        %error,
        "reconcile error"
    );
    Action::requeue(Duration::from_secs(15))
}

pub use crate::core::problems::problems;

/// Reconciles one Federation: validate → build → apply → prune → status.
pub async fn reconcile(fed: Arc<Federation>, ctx: Arc<Context>) -> Result<Action> {
    let name = fed.name_any();
    let namespace = fed
        .namespace()
        .ok_or_else(|| Error::NoNamespace(format!("Federation {name}")))?;
    if fed.meta().deletion_timestamp.is_some() {
        // Owner references let the garbage collector remove everything.
        ctx.renewals.forget(&(namespace, name));
        return Ok(Action::await_change());
    }
    ctx.caches.ready().await?;
    let mut problems = problems(&fed, &ctx.settings.pod_policy);
    if problems.is_empty() {
        problems = crate::core::sans::san_problems(&fed, &ctx.settings.superlink_names);
    }
    if problems.is_empty() {
        problems = namespace_problems(&ctx, &namespace).await?;
    }
    let mut renew_in = None;
    let outcome = if problems.is_empty() {
        match apply_federation(&fed, &ctx, &namespace).await {
            Ok((outcome, renew)) => {
                renew_in = renew;
                outcome
            }
            Err(error) => {
                // Said where the admin looks (the Federation's conditions and events), not only
                // in the hub's log; retried by `error_policy`.
                let message = format!("{error}; {}", error.fix());
                ctx.publish(&fed, EventType::Warning, "ReconcileFailed", message.clone())
                    .await;
                let placement = placement_state(&fed, &ctx, &namespace).await;
                if let Err(status_error) = write_status(
                    &fed,
                    &ctx,
                    &namespace,
                    &Outcome::Failed(message),
                    &placement,
                )
                .await
                {
                    tracing::warn!(federation = %name, %namespace, error = %status_error, "cannot record the reconcile error in the status");
                }
                return Err(error);
            }
        }
    } else {
        let message = crate::core::problems::joined(&problems);
        tracing::info!(federation = %name, %namespace, %message, "invalid; nothing applied");
        ctx.publish(&fed, EventType::Warning, "InvalidSpec", message)
            .await;
        Outcome::Invalid(problems)
    };
    let placement = placement_state(&fed, &ctx, &namespace).await;
    write_status(&fed, &ctx, &namespace, &outcome, &placement).await?;
    let ocm = fed.spec.placement_ref.as_ref().is_some_and(|r| r.is_ocm());
    Ok(Action::requeue(requeue_after(renew_in, ocm)))
}

/// Why the Federation's namespace may not take its SuperLink (its Pod Security `enforce` label is
/// weaker than the hub's `--namespace-pod-security`, and `--allow weaker-namespaces` was not
/// given); the labels it lacks are added first, as on spokes
/// ([`flower_addon_runtime::kube_runtime::ensure_namespace`]), so the API server enforces the
/// same level on every pod there.
async fn namespace_problems(ctx: &Context, namespace: &str) -> Result<Vec<(String, String)>> {
    use flower_addon_runtime::kube_runtime::{ensure_namespace, label_namespace};
    let policy = &ctx.settings.pod_policy;
    let cached = ctx.caches.namespaces.get(&ObjectRef::new(namespace));
    let refusal = match cached {
        // Read from the cache: a converged Federation costs no request.
        Some(ns) => match policy.existing_namespace(namespace, ns.labels()) {
            Ok(add) => label_namespace(&ctx.client, namespace, add, apply::HUB_FIELD_MANAGER)
                .await
                .map(|()| None),
            Err(refusal) => Ok(Some(refusal)),
        },
        // A namespace made a moment ago, not in the cache yet.
        None => ensure_namespace(&ctx.client, namespace, policy, apply::HUB_FIELD_MANAGER).await,
    }
    .map_err(|error| match error {
        flower_addon_runtime::kube_runtime::KubeRuntimeError::Kube { action, source } => {
            Error::Kube { action, source }
        }
        other => Error::Kube {
            action: format!("label Namespace {namespace}: {other}"),
            source: kube::Error::Service(other.to_string().into()),
        },
    })?;
    Ok(refusal
        .map(|why| vec![("metadata.namespace".to_owned(), why)])
        .unwrap_or_default())
}

/// Applies the SuperLink Services, the TLS Secret and the SuperLink, then prunes; each apply is
/// skipped when the cached object already holds it ([`cache::apply`]). The Services go first
/// when the hub issues the certificate of a placed Federation: its external address (and so the
/// certificate's SANs) may come from the node port or load balancer the Service gets. Otherwise
/// the SuperLink does not wait for them: with a hub certificate it goes (after the certificate,
/// which its pod mounts) alongside them; without one it goes first and they follow.
///
/// With the hub's certificate, the SuperLink's pod template carries the certificate's end of
/// validity ([`tls::NOT_AFTER_ANNOTATION`]): a renewed certificate rolls the SuperLink pod, so
/// the process serves it (its state survives in `--database`). Also returns when the
/// certificate is due for renewal.
async fn apply_federation(
    fed: &Federation,
    ctx: &Context,
    namespace: &str,
) -> Result<(Outcome, Option<Duration>)> {
    let client = &ctx.client;
    let caches = &ctx.caches;
    let name = fed.name_any();
    let mut objects = render_hub(fed)?;
    let (_, dialect) = federation_dialect(fed)?;
    let services_api = Api::<Service>::namespaced(client.clone(), namespace);
    let sts_api = Api::<StatefulSet>::namespaced(client.clone(), namespace);
    let policies_api = Api::<NetworkPolicy>::namespaced(client.clone(), namespace);
    apply::own(&mut objects.service.metadata, fed);
    if let Some(control) = &mut objects.control_service {
        apply::own(&mut control.metadata, fed);
    }
    apply::own(&mut objects.network_policy.metadata, fed);
    apply::own(&mut objects.superlink.metadata, fed);
    let service_name = objects.service.name_any();
    let control_name = objects.control_service.as_ref().map(|c| c.name_any());
    let policy_name = objects.network_policy.name_any();
    let superlink_name = objects.superlink.name_any();
    let apply_service = cache::apply(
        &services_api,
        &objects.service,
        cache::cached(&caches.services, namespace, &service_name),
    );
    let apply_control = async {
        match (&objects.control_service, &control_name) {
            (Some(control), Some(name)) => cache::apply(
                &services_api,
                control,
                cache::cached(&caches.services, namespace, name),
            )
            .await
            .map(Some),
            _ => Ok(None),
        }
    };
    // The policy goes with the Services: the pod's Fleet port is open to the network, the
    // rest of it (Control on loopback) is not.
    let apply_policy = cache::apply(
        &policies_api,
        &objects.network_policy,
        cache::cached(&caches.network_policies, namespace, &policy_name),
    );
    let apply_services = async { tokio::try_join!(apply_service, apply_control, apply_policy) };
    let cached_superlink = cache::cached(&caches.statefulsets, namespace, &superlink_name);
    let issues_tls = tls::hub_issues_tls(fed);
    let mut renew_in = None;
    let ((service, control, policy), superlink) = if issues_tls && fed.spec.placement_ref.is_none()
    {
        // A hub-local SuperLink's certificate names only in-cluster names: nothing of it waits
        // for the Services, so the certificate and the SuperLink go alongside them.
        let mut superlink = std::mem::take(&mut objects.superlink);
        let certified_superlink = async {
            let certificate = tls::ensure_certificate(fed, ctx, namespace, None).await?;
            tls::annotate_not_after(&mut superlink, certificate.not_after);
            let applied = cache::apply(&sts_api, &superlink, cached_superlink).await?;
            Ok::<_, Error>((applied, certificate.renew_in))
        };
        let (services, (superlink, renew)) = tokio::try_join!(apply_services, certified_superlink)?;
        renew_in = Some(renew);
        (services, superlink)
    } else if issues_tls {
        let services = apply_services.await?;
        let external = external_of(fed, dialect, &services.0, ctx);
        let certificate = tls::ensure_certificate(fed, ctx, namespace, external.as_ref()).await?;
        renew_in = Some(certificate.renew_in);
        tls::annotate_not_after(&mut objects.superlink, certificate.not_after);
        let superlink = cache::apply(&sts_api, &objects.superlink, cached_superlink).await?;
        (services, superlink)
    } else {
        // The SuperLink first (its pod is what takes long to start), the Services right after:
        // on a busy apiserver a write shared with two others lands later.
        let superlink = cache::apply(&sts_api, &objects.superlink, cached_superlink).await?;
        (apply_services.await?, superlink)
    };
    // The write of one object triggers the next reconcile (owned objects are watched) while the
    // others may still be on their way to the caches: wait for them, so that reconcile reads
    // what was just written instead of writing it again.
    tokio::join!(
        cache::caught_up(&caches.services, &service),
        async {
            if let Some(control) = &control {
                cache::caught_up(&caches.services, control).await;
            }
        },
        cache::caught_up(&caches.network_policies, &policy),
        cache::caught_up(&caches.statefulsets, &superlink),
    );
    let external = external_of(fed, dialect, &service, ctx);

    // The pools of a Federation without placementRef are the hub cluster's work, applied by
    // crate::kube::hub_pools under its own manager; this controller's objects are the SuperLink's.
    let statefulsets = BTreeSet::from([superlink_name]);
    let services: BTreeSet<String> = std::iter::once(service_name).chain(control_name).collect();
    let policies = BTreeSet::from([policy_name]);
    let secrets: BTreeSet<String> = issues_tls
        .then(|| superlink_tls_secret_name(fed))
        .into_iter()
        .collect();
    let mut pruned = apply::prune(client, &caches.statefulsets, fed, &statefulsets).await?;
    pruned.extend(apply::prune(client, &caches.services, fed, &services).await?);
    pruned.extend(apply::prune(client, &caches.network_policies, fed, &policies).await?);
    pruned.extend(apply::prune(client, &caches.secrets, fed, &secrets).await?);
    if !pruned.is_empty() {
        ctx.publish(fed, EventType::Normal, "Pruned", pruned.join(", "))
            .await;
    }
    tracing::debug!(federation = %name, %namespace, "applied");
    let outcome = Outcome::Applied {
        superlink: WorkloadReadiness::of_statefulset("superlink", &superlink),
        external,
    };
    Ok((outcome, renew_in))
}

/// The external endpoints of a placed Federation (spokes reach its SuperLink there).
fn external_of(
    fed: &Federation,
    dialect: flower_addon_crds::render::FlowerDialect,
    service: &Service,
    ctx: &Context,
) -> Option<Result<ExternalEndpoints, ExternalAddressError>> {
    fed.spec.placement_ref.as_ref().map(|_| {
        external_endpoints(
            fed,
            dialect,
            Some(service),
            ctx.settings.node_address.as_deref(),
        )
    })
}

/// Writes the status with server-side apply when it differs from the stored one.
async fn write_status(
    fed: &Federation,
    ctx: &Context,
    namespace: &str,
    outcome: &Outcome,
    placement: &PlacementState,
) -> Result<()> {
    let now = Time(
        k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second())
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    );
    let status = federation_status(fed, outcome, placement, &now);
    // `status.clusters` is the work source's (its own field manager); compare the rest.
    // Fields other writers own: the clusters' reports (the work source) and the hub's
    // SuperNode restart (the FlowerRun controller).
    let current = fed.status.clone().map(|mut s| {
        s.clusters.clear();
        s.cluster_totals = None;
        s.supernode_restart_after_run = None;
        s
    });
    if current.as_ref() == Some(&status) {
        return Ok(());
    }
    // A reconcile may run on a cached Federation that does not show this controller's last
    // status write yet (it triggers nothing, so the cache is not waited for): when the cached
    // object is still the one that write was computed from and the status is the same, the
    // apiserver already has it.
    let uid = fed.uid().unwrap_or_default();
    let basis = fed.resource_version();
    let same_as_written = ctx
        .written
        .lock()
        .ok()
        .and_then(|w| w.get(&uid).map(|(rv, st)| *rv == basis && *st == status))
        .unwrap_or(false);
    if same_as_written {
        return Ok(());
    }
    let name = fed.name_any();
    apply::patch_status::<Federation>(&ctx.client, namespace, &name, &status).await?;
    if let Ok(mut written) = ctx.written.lock() {
        if written.len() >= WRITTEN_MAX {
            written.clear();
        }
        written.insert(uid, (basis, status.clone()));
    }
    tracing::info!(
        federation = %name,
        %namespace,
        supernodes = status.supernodes.as_deref().unwrap_or("-"),
        "status updated"
    );
    Ok(())
}

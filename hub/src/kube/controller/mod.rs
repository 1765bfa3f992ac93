//! The hub's Kubernetes-mode Federation controller (kube-runtime).
//!
//! Reconcile is a pipeline `validate → build → apply → prune → status`:
//! - validate: [`crate::core::problems`], the CRD rules plus everything the renderer would
//!   refuse; an invalid Federation gets `Degraded=True` naming the fields and nothing is applied
//!   or deleted (running workloads keep running);
//! - build: [`render_hub`] (SuperLink StatefulSet and Service) plus the SuperLink TLS Secret
//!   issued by the hub CA when TLS is on;
//! - apply: server-side apply under one field manager ([`HUB_FIELD_MANAGER`]), every object
//!   owned by the Federation (garbage-collected with it), labelled for pruning. Fields the build
//!   stops setting (Service labels removed from the spec) vanish because one manager owns them;
//! - prune: labelled, owned objects the build no longer returns (removed pools, the old kind after
//!   a mode switch) are deleted;
//! - status: written with server-side apply on the status subresource, only when it changed.
//!
//! Pools run where the work source puts them ([`crate::kube::work`]): in spoke clusters through
//! the work channel, or, without `placementRef`, in the hub cluster by [`crate::kube::local`];
//! this controller applies only the SuperLink side, and sums the per-cluster status into the
//! totals and conditions.

mod apply;
pub mod placement;
mod status;
mod tls;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use flower_addon_crds::{Federation, Placement};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};

use crate::core::render::{
    HubRenderError, external_endpoints, federation_dialect, render_hub, superlink_tls_secret_name,
};
use crate::registration::ca::{CaError, HubCa};

pub(crate) use apply::controller_ref;
pub use apply::{APPLIED_BY_LABEL, HUB_FIELD_MANAGER};
pub use status::{Outcome, PlacementState, WorkloadReadiness, federation_status};
pub use tls::hub_issues_tls;

/// How often a converged Federation is reconciled anyway (drift, certificate renewal).
pub const RESYNC: Duration = Duration::from_secs(300);

/// Why a reconcile failed (retried by [`error_policy`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The apiserver refused a request.
    #[error("{action}: {source}")]
    Kube {
        /// What the controller was doing, e.g. `apply StatefulSet f-superlink`.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// An object could not be serialized.
    #[error("serialize {what}: {source}")]
    Serialize {
        /// The object.
        what: String,
        /// The serialization error.
        source: serde_json::Error,
    },
    /// The hub CA could not issue the SuperLink certificate.
    #[error("issue the SuperLink certificate: {0}")]
    Ca(CaError),
    /// The renderer refused a spec that validation accepted.
    #[error(transparent)]
    Render(#[from] HubRenderError),
    /// The object lacks its namespace (the CRD is namespaced; only a broken cache gives this).
    #[error("Federation {0} has no namespace")]
    NoNamespace(String),
}

/// `Result` of the controller.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A stable, low-cardinality name of the error kind (metrics, logs).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "kube",
            Self::Serialize { .. } => "serialize",
            Self::Ca(_) => "ca",
            Self::Render(_) => "render",
            Self::NoNamespace(_) => "no_namespace",
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    /// Client of the hub cluster.
    pub client: Client,
    /// CA issuing SuperLink certificates.
    pub ca: Arc<HubCa>,
    /// Event recorder (reporting controller [`HUB_FIELD_MANAGER`]).
    pub recorder: Recorder,
    /// Address of the hub cluster's nodes that spokes reach (`serve --node-address`), for the
    /// Fleet address of NodePort Federations without `externalAddress`.
    pub node_address: Option<String>,
}

impl Context {
    /// A context for `client` and `ca`.
    pub fn new(client: Client, ca: Arc<HubCa>) -> Self {
        let recorder = apply::recorder(client.clone());
        Self {
            client,
            ca,
            recorder,
            node_address: None,
        }
    }

    async fn publish(&self, fed: &Federation, type_: EventType, reason: &str, note: String) {
        apply::publish(&self.recorder, fed, type_, "Reconcile", reason, note).await;
    }
}

/// Runs the Federation controller until `shutdown` resolves (graceful: running reconciles end).
pub async fn run(
    client: Client,
    ca: Arc<HubCa>,
    node_address: Option<String>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let mut context = Context::new(client, ca);
    context.node_address = node_address;
    run_with(context, shutdown).await;
}

/// [`run`] with an explicit [`Context`].
pub async fn run_with(
    context: Context,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = context.client.clone();
    let owned =
        watcher::Config::default().labels(&format!("{APPLIED_BY_LABEL}={HUB_FIELD_MANAGER}"));
    let controller = Controller::new(
        Api::<Federation>::all(client.clone()),
        watcher::Config::default(),
    );
    let federations = controller.store();
    controller
        // A Placement's PlacementSatisfied is mirrored on the Federations that reference it.
        .watches(
            Api::<Placement>::all(client.clone()),
            watcher::Config::default(),
            move |placement| {
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
                    .collect::<Vec<_>>()
            },
        )
        .owns(Api::<StatefulSet>::all(client.clone()), owned.clone())
        .owns(Api::<Service>::all(client.clone()), owned.clone())
        .owns(Api::<Secret>::all(client.clone()), owned)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, Arc::new(context))
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(federation = %object, "reconciled"),
                Err(error) => tracing::warn!(%error, "reconcile failed"),
            }
        })
        .await;
    tracing::info!("federation controller stopped");
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
        .ok_or_else(|| Error::NoNamespace(name.clone()))?;
    if fed.meta().deletion_timestamp.is_some() {
        // Owner references let the garbage collector remove everything.
        return Ok(Action::await_change());
    }
    let problems = problems(&fed);
    let outcome = if problems.is_empty() {
        apply_federation(&fed, &ctx, &namespace).await?
    } else {
        let message = crate::core::problems::joined(&problems);
        tracing::info!(federation = %name, %namespace, %message, "invalid; nothing applied");
        ctx.publish(&fed, EventType::Warning, "InvalidSpec", message)
            .await;
        Outcome::Invalid(problems)
    };
    let placement = match &fed.spec.placement_ref {
        None => PlacementState::NotReferenced,
        Some(r) => {
            let found = Api::<Placement>::namespaced(ctx.client.clone(), &namespace)
                .get_opt(&r.name)
                .await
                .map_err(|source| Error::Kube {
                    action: format!("read Placement {}", r.name),
                    source,
                })?;
            PlacementState::of(&r.name, found.as_ref())
        }
    };
    write_status(&fed, &ctx, &namespace, &outcome, &placement).await?;
    Ok(Action::requeue(RESYNC))
}

/// Applies the SuperLink Services, the TLS Secret and the SuperLink, then prunes. The Service goes first: a placed Federation's external address (and so the
/// certificate's SANs) may come from the node port or load balancer it gets.
async fn apply_federation(fed: &Federation, ctx: &Context, namespace: &str) -> Result<Outcome> {
    let client = &ctx.client;
    let name = fed.name_any();
    let mut objects = render_hub(fed)?;
    let (_, dialect) = federation_dialect(fed)?;

    apply::own(&mut objects.service.metadata, fed);
    let service = apply::apply(
        &Api::<Service>::namespaced(client.clone(), namespace),
        &objects.service,
    )
    .await?;
    let external = fed
        .spec
        .placement_ref
        .as_ref()
        .map(|_| external_endpoints(fed, dialect, Some(&service), ctx.node_address.as_deref()));

    let mut secrets = BTreeSet::new();
    if tls::hub_issues_tls(fed) {
        let secret_name = superlink_tls_secret_name(fed);
        secrets.insert(secret_name.clone());
        let secrets_api = Api::<Secret>::namespaced(client.clone(), namespace);
        let mut reached_at = crate::core::superlink::in_cluster_names(fed);
        if let Some(Ok(endpoints)) = &external {
            reached_at.push(endpoints.fleet_host().to_owned());
        }
        let sans = crate::core::superlink::superlink_sans(fed, reached_at);
        let existing = secrets_api
            .get_opt(&secret_name)
            .await
            .map_err(|source| Error::Kube {
                action: format!("get Secret {secret_name}"),
                source,
            })?;
        let owned = existing.as_ref().is_some_and(|s| {
            s.owner_references()
                .iter()
                .any(|r| Some(&r.uid) == fed.uid().as_ref())
        });
        let keep = existing
            .as_ref()
            .is_some_and(|s| owned && tls::still_valid(s, &sans, &ctx.ca, SystemTime::now()));
        if !keep {
            let secret = tls::issue_secret(fed, &ctx.ca, &sans)?;
            apply::apply(&secrets_api, &secret).await?;
            tracing::info!(federation = %name, %namespace, sans = %sans.join(","), "SuperLink certificate issued");
            ctx.publish(
                fed,
                EventType::Normal,
                "CertificateIssued",
                format!("SuperLink certificate issued for {}", sans.join(", ")),
            )
            .await;
        }
    }

    apply::own(&mut objects.control_service.metadata, fed);
    apply::apply(
        &Api::<Service>::namespaced(client.clone(), namespace),
        &objects.control_service,
    )
    .await?;

    apply::own(&mut objects.superlink.metadata, fed);
    let sts_api = Api::<StatefulSet>::namespaced(client.clone(), namespace);
    let superlink = apply::apply(&sts_api, &objects.superlink).await?;

    // The pools of a Federation without placementRef are the hub cluster's work, applied by
    // crate::kube::local under its own manager; this controller's objects are the SuperLink's.
    let statefulsets = BTreeSet::from([superlink.name_any()]);
    let services = BTreeSet::from([
        objects.service.name_any(),
        objects.control_service.name_any(),
    ]);
    let mut pruned = apply::prune::<StatefulSet>(client, fed, &statefulsets).await?;
    pruned.extend(apply::prune::<Service>(client, fed, &services).await?);
    pruned.extend(apply::prune::<Secret>(client, fed, &secrets).await?);
    if !pruned.is_empty() {
        ctx.publish(fed, EventType::Normal, "Pruned", pruned.join(", "))
            .await;
    }
    tracing::debug!(federation = %name, %namespace, "applied");
    Ok(Outcome::Applied {
        superlink: WorkloadReadiness::of_statefulset("superlink", &superlink),
        external,
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
    let current = fed.status.clone().map(|mut s| {
        s.clusters.clear();
        s
    });
    if current.as_ref() == Some(&status) {
        return Ok(());
    }
    let name = fed.name_any();
    apply::patch_status::<Federation>(&ctx.client, namespace, &name, &status).await?;
    tracing::info!(
        federation = %name,
        %namespace,
        supernodes = status.supernodes.as_deref().unwrap_or("-"),
        "status updated"
    );
    Ok(())
}

//! `flower-hub serve` in Kubernetes mode: the controllers, the work source, the hub's own pools
//! and the work channel on the hub cluster's API, optionally behind leader election; and the
//! CA Secrets they share with the registration commands.
use super::{
    CHANNEL_READY, ServeArgs, bind, channel_config, serve_ops, shutdown_signal, wait_stop,
};
use crate::channel::ChannelServer;
use crate::core::sans::SuperLinkNames;
use crate::registration::ca::{CaRole, HubCa};
use anyhow::Context;
use flower_addon_runtime::ops::{Health, Refresh};
use std::process::ExitCode;
use std::sync::Arc;

/// Readiness check: this replica leads (only with `--leader-elect`).
const LEADER_READY: &str = "leader";
/// Readiness check: the Kubernetes work source's reflectors listed.
const WORK_SOURCE_READY: &str = "work-source";

/// Name of the Secret holding the hub CA in Kubernetes mode.
pub use crate::kube::store::CA_SECRET;

/// Kubernetes mode: the Federation controller (SuperLink, Service, TLS Secret and, for
/// Federations without `placementRef`, the pools in this cluster), the Placement controller
/// (PlacementDecisions from ManagedClusters), the FlowerRun controller (runs submitted to,
/// followed on and stopped at the Federations' SuperLinks), and the work channel on `--listen`
/// (agents join into ManagedClusters, tokens are Secrets, work comes from Federations +
/// PlacementDecisions), with the hub CA kept in the Secret `flower-hub-ca` of `--namespace`.
///
/// In steps: check the flags; serve health and metrics; connect to the API; with
/// `--leader-elect`, wait to lead; load the CAs; start the work source and the controllers; serve
/// the work channel until stopped.
pub(super) fn serve_kubernetes(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let leader = leader_config(&args)?;
    if let Some(why) = args.pod_policy.policy()?.level_conflict("flower-hub serve") {
        anyhow::bail!(why);
    }
    runtime.block_on(serve(args, leader))?;
    Ok(ExitCode::SUCCESS)
}

/// `--leader-elect`'s settings, checked.
fn leader_config(args: &ServeArgs) -> anyhow::Result<Option<crate::kube::leader::LeaderConfig>> {
    let leader = args
        .leader_elect
        .then(|| crate::kube::leader::LeaderConfig {
            namespace: args.namespace.clone(),
            name: args.leader_elect_resource_name.clone(),
            identity: crate::kube::leader::identity(),
            lease_duration: args.leader_elect_lease_duration,
            renew_deadline: args.leader_elect_renew_deadline,
            retry_period: args.leader_elect_retry_period,
        });
    if let Some(config) = &leader {
        config.validate().map_err(anyhow::Error::msg)?;
    }
    Ok(leader)
}

/// How the hub stops: on a signal, or when it lost the lead (then it exits with that error).
struct Stop {
    tx: Arc<tokio::sync::watch::Sender<bool>>,
    rx: tokio::sync::watch::Receiver<bool>,
    lost: Arc<std::sync::Mutex<Option<crate::kube::leader::LeadershipLost>>>,
}

impl Stop {
    /// Stops on SIGTERM/SIGINT.
    fn on_signal() -> Self {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let tx = Arc::new(tx);
        {
            let tx = tx.clone();
            tokio::spawn(async move {
                shutdown_signal().await;
                tracing::info!("stopping");
                let _ = tx.send(true);
            });
        }
        Self {
            tx,
            rx,
            lost: Arc::default(),
        }
    }

    fn wait(&self) -> impl Future<Output = ()> + Send + 'static {
        wait_stop(self.rx.clone())
    }
}

async fn serve(
    args: ServeArgs,
    leader: Option<crate::kube::leader::LeaderConfig>,
) -> anyhow::Result<()> {
    let (health, refresh) = serve_health_and_metrics(&args, leader.is_some()).await?;
    let kube_config = kube::Config::infer()
        .await
        .context("connect to the hub cluster's Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let fab_egress = api_server_refused(
        crate::flower::fab_url::Egress::allowing(&args.fab_url_allow)
            .map_err(anyhow::Error::msg)?,
        &kube_config.cluster_url,
    )
    .await;
    let client = kube::Client::try_from(kube_config)
        .context("connect to the hub cluster's Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let stop = Stop::on_signal();
    let elector =
        leader.map(|config| Arc::new(crate::kube::leader::Elector::new(client.clone(), config)));
    if let Some(elector) = &elector
        && !lead(elector, &health, &stop).await
    {
        return Ok(());
    }
    let (ca, flower_ca) = load_cas(&client, &args.namespace, &stop.rx).await?;
    let store = Arc::new(
        crate::kube::store::KubeStore::new(client.clone(), args.namespace.clone())
            .with_lease_duration(args.lease_duration),
    );
    let listeners = bind(&args.listen).await?;
    health.set(CHANNEL_READY, true);
    let pod_policy = args.pod_policy.policy()?;
    let work = Arc::new(
        crate::kube::work::KubeWorkSource::start_with_policy(
            client.clone(),
            flower_ca.clone(),
            pod_policy.clone(),
        )
        .await?,
    );
    health.set(WORK_SOURCE_READY, true);
    let _ = refresh.set(crate::kube::metrics::refresh(
        client.clone(),
        work.federations(),
        work.clusters(),
    ));
    let config = channel_config(
        &args,
        kubernetes_advertise(&args.advertise_address, &args.namespace),
    );
    let controllers = spawn_controllers(
        &args,
        Controllers {
            client,
            work: work.clone(),
            store: store.clone(),
            ca: ca.clone(),
            flower_ca,
            cert_validity: config.cert_validity,
            fab_egress,
            pod_policy,
            health,
        },
        &stop,
    )?;
    println!(
        "flower-hub: serving the work channel on {}",
        args.listen
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    ChannelServer::new(store, work, ca, config)
        .serve(listeners, stop.wait())
        .await?;
    for task in controllers {
        let _ = task.await;
    }
    if let Some(lost) = stop.lost.lock().ok().and_then(|mut l| l.take()) {
        return Err(anyhow::Error::new(lost));
    }
    // Stopped on a signal: a standby takes over at its next try.
    if let Some(elector) = &elector {
        elector.release().await;
    }
    Ok(())
}

/// Serves /healthz, /readyz and /metrics. The scrape-time gauges read the work source's caches,
/// which exist only once it has started: until the returned cell is set a scrape shows the
/// counters alone.
async fn serve_health_and_metrics(
    args: &ServeArgs,
    leader_elect: bool,
) -> anyhow::Result<(Arc<Health>, Arc<std::sync::OnceLock<Refresh>>)> {
    let mut checks = vec![
        CHANNEL_READY,
        WORK_SOURCE_READY,
        crate::kube::controller::READY_CHECK,
        crate::kube::controller::placement::READY_CHECK,
    ];
    if leader_elect {
        checks.push(LEADER_READY);
    }
    let health = Health::new(&checks);
    let refresh: Arc<std::sync::OnceLock<Refresh>> = Arc::default();
    let deferred: Refresh = {
        let refresh = refresh.clone();
        Arc::new(move || match refresh.get() {
            Some(r) => r(),
            None => Box::pin(async { crate::metrics::refresh_process() }),
        })
    };
    serve_ops(args, health.clone(), false, Some(deferred)).await?;
    Ok((health, refresh))
}

/// A standby waits here, serving /healthz but not ready, until it holds the Lease; then a task
/// keeps it and stops the hub when it is lost. False: stopped before leading.
async fn lead(elector: &Arc<crate::kube::leader::Elector>, health: &Health, stop: &Stop) -> bool {
    let config = elector.config();
    println!(
        "flower-hub: leader election on Lease {}/{} as {}: waiting to lead",
        config.namespace, config.name, config.identity
    );
    if !elector.acquire(stop.wait()).await {
        return false;
    }
    println!("flower-hub: leading");
    health.set(LEADER_READY, true);
    let (elector, lost, tx) = (elector.clone(), stop.lost.clone(), stop.tx.clone());
    tokio::spawn(async move {
        let why = elector.hold().await;
        tracing::error!(error = %why, "no longer the leader: stopping");
        if let Ok(mut lost) = lost.lock() {
            *lost = Some(why);
        }
        let _ = tx.send(true);
    });
    true
}

/// The work-channel CA and the Flower CA from their Secrets (made when missing; a lost Flower CA
/// is replaced and said so), both marked in force.
///
/// Just after an outage the apiserver answers /readyz before every request succeeds (504s while
/// its storage clients reconnect): a new leader retries these reads instead of exiting (which
/// cost the hub pod a second restart per etcd outage). Anything else (the lost-CA refusal among
/// them) still stops the hub.
async fn load_cas(
    client: &kube::Client,
    namespace: &str,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<(Arc<HubCa>, Arc<HubCa>)> {
    let ca = Arc::new(
        retry_transient("reading the work-channel CA", stop, || {
            load_or_create_ca_secret(client.clone(), namespace)
        })
        .await?,
    );
    let flower_ca = retry_transient("reading the Flower CA", stop, || async {
        let store = crate::kube::store::KubeStore::without_watch(client.clone(), namespace);
        crate::registration::store::load_or_create_ca_noting_loss(&store, CaRole::Flower)
            .await
            .with_context(|| {
                format!(
                    "the CA Secret {namespace}/{}",
                    crate::kube::store::FLOWER_CA_SECRET
                )
            })
    })
    .await?;
    if let Some(message) = &flower_ca.replaced_lost {
        publish_lost_flower_ca(client.clone(), namespace, message).await;
    }
    let flower_ca = Arc::new(flower_ca.ca);
    retry_transient("marking the CAs in force", stop, || async {
        super::mark_cas_in_force(
            &crate::kube::store::KubeStore::without_watch(client.clone(), namespace),
            &ca,
            &flower_ca,
        )
        .await
    })
    .await?;
    println!(
        "flower-hub: Kubernetes mode, work-channel CA in secret {namespace}/{CA_SECRET} (hash {}), SuperLink certificates from the Flower CA in {namespace}/{}",
        ca.hash(),
        crate::kube::store::FLOWER_CA_SECRET
    );
    Ok((ca, flower_ca))
}

/// What the controllers share.
struct Controllers {
    client: kube::Client,
    work: Arc<crate::kube::work::KubeWorkSource>,
    store: Arc<crate::kube::store::KubeStore>,
    ca: Arc<HubCa>,
    flower_ca: Arc<HubCa>,
    cert_validity: std::time::Duration,
    fab_egress: crate::flower::fab_url::Egress,
    pod_policy: flower_addon_crds::policy::PodPolicy,
    health: Arc<Health>,
}

/// Starts the Federation, hub-pool, FlowerRun, OCM addon and Placement controllers; each ends
/// when the hub stops.
fn spawn_controllers(
    args: &ServeArgs,
    c: Controllers,
    stop: &Stop,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let node_address = args.node_address.clone().filter(|a| !a.is_empty());
    let superlink_names = SuperLinkNames::new(
        args.advertise_address
            .iter()
            .chain(&node_address)
            .map(String::as_str),
        &args.superlink_name,
    )?;
    let federations = tokio::spawn(crate::kube::controller::run(
        c.client.clone(),
        c.flower_ca.clone(),
        crate::kube::controller::Settings {
            node_address,
            superlink_cert_validity: args.superlink_cert_validity,
            superlink_names,
            pod_policy: c.pod_policy.clone(),
            fab_egress: c.fab_egress.clone(),
        },
        c.health.clone(),
        stop.wait(),
    ));
    let local_pools = tokio::spawn(crate::kube::hub_pools::run(
        c.client.clone(),
        c.work,
        c.pod_policy,
        stop.wait(),
    ));
    let runs = tokio::spawn(crate::kube::controller::runs::run(
        c.client.clone(),
        c.flower_ca,
        c.fab_egress,
        stop.wait(),
    ));
    let ocm_addon = tokio::spawn(crate::kube::ocm_addon::run(
        c.client.clone(),
        c.store,
        c.ca,
        c.cert_validity,
        stop.wait(),
    ));
    let placements = tokio::spawn(crate::kube::controller::placement::run(
        c.client,
        c.health,
        stop.wait(),
    ));
    Ok(vec![federations, local_pools, placements, ocm_addon, runs])
}

/// Names in the hub's server certificate in Kubernetes mode: `--advertise-address` values, then
/// the DNS names of the Service [`crate::kube::store::HUB_SERVICE`] in `namespace` (agents that
/// dial a node or load-balancer address verify the certificate by `flower-hub.<ns>.svc`).
pub fn kubernetes_advertise(advertise: &[String], namespace: &str) -> Vec<String> {
    let mut names = advertise.to_vec();
    for name in crate::kube::store::hub_service_dns_names(namespace) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// Loads the hub's work-channel CA from its Secret [`CA_SECRET`] in `namespace`, creating both
/// on first start (create, not apply: two hubs starting at once end up with one CA).
pub async fn load_or_create_ca_secret(
    client: kube::Client,
    namespace: &str,
) -> anyhow::Result<HubCa> {
    load_or_create_ca_secret_for(client, namespace, CaRole::Channel).await
}

/// Whether `error` is the API server briefly unable to answer (HTTP 5xx or 429, a connection or
/// timeout error), however deeply the store wrapped it: worth retrying, not exiting for.
fn is_transient(error: &anyhow::Error) -> bool {
    error.chain().any(|e| {
        let kube = e.downcast_ref::<kube::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<kube::Error>())
        });
        match kube {
            Some(kube::Error::Api(status)) => status.code >= 500 || status.code == 429,
            Some(kube::Error::HyperError(_) | kube::Error::Service(_)) => true,
            _ => false,
        }
    })
}

/// Runs `step` until it succeeds, retrying [`is_transient`] errors with a back-off (0.5 s
/// doubling to 5 s) until `stop`; any other error is returned at once.
async fn retry_transient<T, Fut>(
    what: &str,
    stop: &tokio::sync::watch::Receiver<bool>,
    mut step: impl FnMut() -> Fut,
) -> anyhow::Result<T>
where
    Fut: Future<Output = anyhow::Result<T>>,
{
    let mut delay = std::time::Duration::from_millis(500);
    loop {
        match step().await {
            Ok(value) => return Ok(value),
            Err(error) if is_transient(&error) && !*stop.borrow() => {
                tracing::warn!(error = %format!("{error:#}"), "{what}: the API server did not answer; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(5));
            }
            Err(error) => return Err(error),
        }
    }
}

/// The CA of `role` from its Secret in `namespace` (created on first start).
/// A Warning event `FlowerCaRecreated` on the new Flower CA Secret (best effort: the hub log
/// has the same warning).
pub async fn publish_lost_flower_ca(client: kube::Client, namespace: &str, message: &str) {
    let secrets =
        kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), namespace);
    match secrets.get(crate::kube::store::FLOWER_CA_SECRET).await {
        Ok(secret) => {
            crate::kube::controller::apply::publish(
                &crate::kube::controller::apply::recorder(client),
                &secret,
                kube::runtime::events::EventType::Warning,
                "Start",
                LOST_FLOWER_CA_REASON,
                message.to_owned(),
            )
            .await;
        }
        Err(error) => tracing::debug!(%error, "no event for the new Flower CA"),
    }
}

/// Event reason: the Flower CA was missing and made anew.
pub const LOST_FLOWER_CA_REASON: &str = "FlowerCaRecreated";

pub async fn load_or_create_ca_secret_for(
    client: kube::Client,
    namespace: &str,
    role: CaRole,
) -> anyhow::Result<HubCa> {
    let store = crate::kube::store::KubeStore::without_watch(client, namespace);
    crate::registration::store::load_or_create_ca_for(&store, role)
        .await
        .with_context(|| {
            format!(
                "the CA Secret {namespace}/{}",
                crate::kube::store::ca_secret_name(role)
            )
        })
}

/// `egress` refusing the addresses of the API server at `url` (what a FAB URL must not reach
/// from inside the hub).
async fn api_server_refused(
    mut egress: crate::flower::fab_url::Egress,
    url: &http::Uri,
) -> crate::flower::fab_url::Egress {
    let Some(host) = url.host() else {
        return egress;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = url.port_u16().unwrap_or(443);
    match tokio::net::lookup_host((host, port)).await {
        Ok(addresses) => {
            for address in addresses {
                egress = egress.refusing_api_server(address.ip());
            }
        }
        Err(e) => {
            tracing::warn!(%host, error = %e, "cannot resolve the API server's host; FAB downloads refuse it by the other rules only")
        }
    }
    egress
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn store_error(code: u16) -> anyhow::Error {
        let status = kube::core::Status::failure("etcd not ready", "Timeout").with_code(code);
        anyhow::Error::new(crate::registration::store::StoreError::Io {
            path: "get Secret flower-addon-system/flower-hub-ca".into(),
            source: std::io::Error::other(kube::Error::Api(Box::new(status))),
        })
        .context("the CA Secret flower-addon-system/flower-hub-ca")
    }

    #[test]
    fn only_an_apiserver_that_cannot_answer_yet_is_retried() {
        // The 504 an apiserver gives while etcd comes back, however the store wrapped it, is
        // retried; a refusal (403) or the lost-CA refusal stops the hub as before.
        assert!(is_transient(&store_error(504)));
        assert!(is_transient(&store_error(503)));
        assert!(is_transient(&store_error(429)));
        assert!(!is_transient(&store_error(403)));
        assert!(!is_transient(&store_error(404)));
        assert!(!is_transient(&anyhow::anyhow!("the CA Secret is missing")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_error_is_retried_and_another_is_returned() {
        let (_tx, stop) = tokio::sync::watch::channel(false);
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let value = retry_transient("test", &stop, || {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move { if n < 3 { Err(store_error(504)) } else { Ok(n) } }
        })
        .await
        .expect("retried until it worked");
        assert_eq!(value, 3);
        let refused: anyhow::Result<()> =
            retry_transient("test", &stop, || async { Err(store_error(403)) }).await;
        assert!(refused.is_err(), "a refusal is returned at once");
        // Stopping ends the retries.
        let (tx, stop) = tokio::sync::watch::channel(false);
        tx.send(true).expect("send");
        let stopped: anyhow::Result<()> =
            retry_transient("test", &stop, || async { Err(store_error(504)) }).await;
        assert!(stopped.is_err());
    }

    #[test]
    fn the_kubernetes_server_certificate_names_the_hub_service() {
        // Invariant: agents dialling the Service (or a node IP with serverName
        // flower-hub.<ns>.svc) can verify the hub certificate; advertised names come first.
        let names = kubernetes_advertise(&["hub.example".into(), "flower-hub".into()], "ns");
        assert_eq!(
            names,
            [
                "hub.example",
                "flower-hub",
                "flower-hub.ns",
                "flower-hub.ns.svc",
                "flower-hub.ns.svc.cluster.local"
            ]
        );
        let ca = HubCa::generate().expect("ca");
        let issued = ca
            .issue_server_cert(&names, Duration::from_secs(3600))
            .expect("cert");
        let (_, pem) = x509_parser::pem::parse_x509_pem(issued.cert_pem.as_bytes()).expect("pem");
        let cert = pem.parse_x509().expect("x509");
        let san = cert
            .subject_alternative_name()
            .expect("san")
            .expect("present");
        let dns: Vec<String> = san
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                _ => None,
            })
            .collect();
        for name in &names {
            assert!(dns.contains(name), "{name} missing from {dns:?}");
        }
    }
}

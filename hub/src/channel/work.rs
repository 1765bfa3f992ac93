//! `Work.Connect`: one bidirectional stream per cluster. The hub sends the full snapshot of the
//! cluster's work on connect and whenever it changes; the agent acks versions, reports status and
//! heartbeats (which renew the cluster lease).
use super::lease::renew_lease;
use super::tls::PeerInfo;
use super::{Shared, internal};
use crate::registration::store::{CONDITION_AVAILABLE, ClusterStore};
use crate::registration::tokens::unix_now;
use flower_addon_proto::agent_message::Kind as AgentKind;
use flower_addon_proto::hub_message::Kind as HubKind;
use flower_addon_proto::work_server::Work;
use flower_addon_proto::{AgentMessage, HubMessage, Ping};
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

pub use super::acceptance::{REASON_ADMIN_REVOKED, REASON_REVOKED, acceptance_conditions};

/// The open stream of one cluster, so a newer stream or a revocation can stop it.
pub(crate) struct StreamEntry {
    pub(super) id: u64,
    key_fingerprint: String,
    stop: oneshot::Sender<Status>,
}

impl StreamEntry {
    /// Ends the stream with `status` sent to the agent.
    pub(crate) fn stop(self, status: Status) {
        let _ = self.stop.send(status);
    }
}

pub(crate) struct WorkService<S, W> {
    pub(crate) shared: Arc<Shared<S, W>>,
}

#[tonic::async_trait]
impl<S: ClusterStore, W: crate::channel::source::WorkSource> Work for WorkService<S, W> {
    type ConnectStream = ReceiverStream<Result<HubMessage, Status>>;

    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let peer = request.extensions().get::<PeerInfo>().cloned();
        let identity = peer.as_ref().and_then(|p| p.identity.clone());
        let record = self.shared.authorize(identity.as_deref()).await?;
        let name = record.registration.name.clone();
        let remote = peer.map(|p| p.remote.to_string()).unwrap_or_default();

        let id = self.shared.next_stream_id.fetch_add(1, Ordering::Relaxed);
        let (stop_tx, stop_rx) = oneshot::channel();
        let entry = StreamEntry {
            id,
            // The key this stream holds (the bound one, or for an OCM addon agent the one
            // bound before it until its pod gets the renewed certificate).
            key_fingerprint: identity.as_ref().map_or_else(
                || record.registration.key_fingerprint.clone(),
                |i| i.key_fingerprint.clone(),
            ),
            stop: stop_tx,
        };
        if let Some(old) = self.shared.streams.insert(name.clone(), entry) {
            tracing::info!(cluster = %name, %remote, "a new stream replaces the open one");
            old.stop(Status::aborted(
                "replaced by a newer stream from the same cluster",
            ));
        }
        // A revocation announced between the authorization above and this registration found
        // no stream to close: check again now that the stream is registered (from the cache:
        // the cache has a change before it is announced).
        if let Err(status) = self.shared.authorize(identity.as_deref()).await {
            self.shared.streams.remove_if(&name, |_, e| e.id == id);
            return Err(status);
        }
        let (tx, rx) = mpsc::channel(16);
        let shared = self.shared.clone();
        let lease = record
            .lease_duration
            .unwrap_or(self.shared.config.lease_duration);
        tokio::spawn(run_stream(
            shared,
            name,
            id,
            lease,
            request.into_inner(),
            tx,
            stop_rx,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Drives one cluster's stream until the agent leaves, the stream is replaced or revoked, or the
/// hub stops.
async fn run_stream<S: ClusterStore, W: crate::channel::source::WorkSource>(
    shared: Arc<Shared<S, W>>,
    name: String,
    id: u64,
    lease: Duration,
    mut inbound: Streaming<AgentMessage>,
    tx: mpsc::Sender<Result<HubMessage, Status>>,
    mut stop: oneshot::Receiver<Status>,
) {
    tracing::info!(cluster = %name, stream = id, "work stream opened");
    let metrics = crate::metrics::hub();
    metrics.connected_agents.inc();
    // A version sent because the work changed, and when the change was seen: its ack ends one
    // fan-out (the first snapshot of a stream is a reconnect, not a change).
    let mut changed_at: Option<(u64, Instant)> = None;
    let mut changes = shared.work.changes();
    // `lease` is read once per stream (from the record it was authorized with): a changed
    // leaseDurationSeconds applies from the next connection.
    let ping_every = (lease / 3).max(Duration::from_millis(100));
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + ping_every, ping_every);
    let send_timeout = Duration::from_secs(30);
    // Nothing is sent until the cluster's work is decided (a restarted standalone hub's first
    // pass); the agent keeps what it runs meanwhile.
    let first = shared
        .work
        .decided(&name)
        .then(|| shared.work.snapshot(&name));
    let mut last_sent = first.as_ref().map(|s| s.version);
    // Every Ping carries the CA bundle's digest: an agent holding another bundle (a CA rotation
    // under way) renews at once. The first goes right after the first work.
    let ping_message = || {
        HubKind::Ping(Ping {
            ca_bundle_sha256: shared.ca_bundle_sha256.clone(),
        })
    };
    let end: Option<Status> = 'stream: {
        if let Some(snapshot) = first
            && !send(&tx, HubKind::Work(snapshot), send_timeout).await
        {
            break 'stream None;
        }
        if !send(&tx, ping_message(), send_timeout).await {
            break 'stream None;
        }
        loop {
            tokio::select! {
                reason = &mut stop => break 'stream reason.ok(),
                changed = changes.changed() => {
                    if changed.is_err() {
                        break 'stream Some(Status::unavailable("the hub is shutting down"));
                    }
                    if !shared.work.decided(&name) {
                        continue;
                    }
                    let snapshot = shared.work.snapshot(&name);
                    if last_sent != Some(snapshot.version) {
                        // The first work of a stream is not a fan-out of a change.
                        if last_sent.is_some() {
                            changed_at = Some((snapshot.version, Instant::now()));
                        }
                        last_sent = Some(snapshot.version);
                        tracing::debug!(cluster = %name, version = snapshot.version, "sending work");
                        if !send(&tx, HubKind::Work(snapshot), send_timeout).await {
                            break 'stream None;
                        }
                    }
                }
                message = inbound.next() => match message {
                    None => break 'stream None,
                    Some(Err(status)) => {
                        tracing::info!(cluster = %name, code = ?status.code(), message = status.message(), "agent stream failed");
                        // Report decode errors (e.g. oversized messages) back to the agent.
                        break 'stream Some(status);
                    }
                    Some(Ok(message)) => {
                        if let (Some(AgentKind::Ack(ack)), Some((version, at))) = (&message.kind, changed_at)
                            && ack.version == version
                        {
                            metrics.fanout.observe(at.elapsed().as_secs_f64());
                            changed_at = None;
                        }
                        if let Err(status) = handle_agent_message(&shared, &name, id, lease, message).await {
                            tracing::warn!(cluster = %name, message = status.message(), "agent message refused");
                            break 'stream Some(status);
                        }
                    }
                },
                _ = ping.tick() => {
                    if !send(&tx, ping_message(), send_timeout).await {
                        break 'stream None;
                    }
                }
            }
        }
    };
    if let Some(status) = end {
        let _ = tx.try_send(Err(status));
    }
    shared.streams.remove_if(&name, |_, e| e.id == id);
    metrics.connected_agents.dec();
    tracing::info!(cluster = %name, stream = id, "work stream closed");
}

async fn send(
    tx: &mpsc::Sender<Result<HubMessage, Status>>,
    kind: HubKind,
    timeout: Duration,
) -> bool {
    matches!(
        tokio::time::timeout(timeout, tx.send(Ok(HubMessage { kind: Some(kind) }))).await,
        Ok(Ok(()))
    )
}

/// Checks that a message speaks only for the stream's own cluster, then records it.
async fn handle_agent_message<S: ClusterStore, W: crate::channel::source::WorkSource>(
    shared: &Arc<Shared<S, W>>,
    name: &str,
    stream: u64,
    lease: Duration,
    message: AgentMessage,
) -> Result<(), Status> {
    let claimed = match &message.kind {
        Some(AgentKind::Ack(ack)) => &ack.cluster_name,
        Some(AgentKind::Status(status)) => &status.cluster_name,
        Some(AgentKind::Heartbeat(hb)) => &hb.cluster_name,
        None => {
            return Err(Status::invalid_argument(
                "empty AgentMessage: set ack, status or heartbeat",
            ));
        }
    };
    if !claimed.is_empty() && claimed != name {
        return Err(Status::permission_denied(format!(
            "this stream is authenticated as cluster {name:?}; it cannot speak for cluster {claimed:?}"
        )));
    }
    match message.kind {
        Some(AgentKind::Ack(ack)) => {
            tracing::debug!(cluster = %name, version = ack.version, "work acked");
            shared.work.on_ack(name, ack.version);
        }
        Some(AgentKind::Status(status)) => {
            if let Err(why) = super::report::check_status(&status) {
                tracing::warn!(cluster = %name, %why, "refused a status report");
                return Err(Status::invalid_argument(format!(
                    "status report refused: {why}"
                )));
            }
            shared.work.on_status(name, &status);
            record_allocatable(shared, name, &status.allocatable);
        }
        _ => {}
    }
    renew_lease(shared, name, stream, lease);
    Ok(())
}

/// Stores the allocatable resources a cluster reports (for the `ResourceAllocatable*`
/// prioritizers) when they changed; bounded to the two keys placement reads. Written beside the
/// stream, like the heartbeat.
fn record_allocatable<S: ClusterStore, W: crate::channel::source::WorkSource>(
    shared: &Arc<Shared<S, W>>,
    name: &str,
    reported: &std::collections::HashMap<String, String>,
) {
    let wanted: std::collections::BTreeMap<String, String> = reported
        .iter()
        .filter(|(k, v)| matches!(k.as_str(), "cpu" | "memory") && v.len() <= 64)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if wanted.is_empty() {
        return;
    }
    let known = shared
        .known_allocatable
        .get(name)
        .is_some_and(|a| *a == wanted);
    if known {
        return;
    }
    let shared = shared.clone();
    let name = name.to_owned();
    tokio::spawn(async move {
        let _permit = shared.store_writes.acquire().await;
        let stored = wanted.clone();
        match shared
            .update_status(&name, move |st| st.allocatable = stored.clone())
            .await
        {
            Ok(()) => {
                shared.known_allocatable.insert(name, wanted);
            }
            Err(error) => {
                tracing::warn!(cluster = %name, %error, "cannot store the reported allocatable resources")
            }
        }
    });
}

/// Closes the stream of any cluster that is deleted, no longer accepted or re-bound to another
/// key, as soon as the store announces the change.
pub(crate) fn spawn_revocation_watcher<S: ClusterStore, W: crate::channel::source::WorkSource>(
    shared: Arc<Shared<S, W>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut events = shared.store.changes();
    tokio::spawn(async move {
        // Changes made while no hub ran (subscribed above, so nothing falls in between).
        match shared.store.list_clusters().await {
            Ok(all) => {
                for record in all {
                    sync_acceptance_of(&shared, record).await;
                }
            }
            Err(error) => tracing::warn!(%error, "cannot list clusters to check acceptance"),
        }
        loop {
            let event = tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                event = events.recv() => event,
            };
            let names: Vec<String> = match event {
                Ok(name) => vec![name],
                // Missed events (a burst of new clusters): check every cluster, from the cache
                // when the store keeps one, and every open stream.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::info!(missed, "cluster changes missed; checking every cluster");
                    every_cluster(&shared).await
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            };
            for name in names {
                // Every cluster's conditions follow hubAcceptsClient, also for clusters without
                // a stream (e.g. revoked while this hub was down, or accepted by `kubectl`).
                sync_acceptance(&shared, &name).await;
                let fingerprint = shared.streams.get(&name).map(|e| e.key_fingerprint.clone());
                // Only clusters this hub tracks (open stream or lease) can need anything more.
                if fingerprint.is_none() && !shared.leases.contains_key(&name) {
                    continue;
                }
                // The cache answers "nothing to do"; anything else is confirmed by a fresh read.
                let cached_fine = shared
                    .store
                    .cached_cluster(&name)
                    .is_some_and(|r| distrust(&name, Some(&r), fingerprint.as_deref()).is_none());
                let (reason, revoked) = if cached_fine {
                    (None, false)
                } else {
                    match shared.store.get_cluster(&name).await {
                        Ok(record) => {
                            match distrust(&name, record.as_ref(), fingerprint.as_deref()) {
                                Some((state, reason, revoked)) => (Some((state, reason)), revoked),
                                None => (None, false),
                            }
                        }
                        Err(error) => {
                            tracing::warn!(cluster = %name, %error, "cannot check revocation");
                            (None, false)
                        }
                    }
                };
                let Some((state, reason)) = reason else {
                    continue;
                };
                if let Some((_, entry)) = shared.streams.remove(&name) {
                    tracing::warn!(cluster = %name, %reason, "closing revoked stream");
                    entry.stop(super::refused(state, reason));
                }
                // Out of lease tracking, so the lease checker leaves the cluster alone; a revoked
                // cluster is recorded unavailable (it keeps no stream and gets no work).
                shared.leases.remove(&name);
                if revoked {
                    mark_revoked(&shared, &name).await;
                }
            }
        }
    });
}

/// The names of every stored cluster and every open stream, sorted, without duplicates.
async fn every_cluster<S: ClusterStore, W: crate::channel::source::WorkSource>(
    shared: &Shared<S, W>,
) -> Vec<String> {
    let stored = match shared.store.cached_clusters() {
        Some(records) => records,
        None => shared.store.list_clusters().await.unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot list clusters; checking the open streams only");
            Vec::new()
        }),
    };
    let mut names: Vec<String> = stored
        .into_iter()
        .map(|r| r.registration.name)
        .chain(shared.streams.iter().map(|e| e.key().clone()))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Why the hub no longer trusts cluster `name` as stored in `record` (`None`: deleted), whose
/// open stream (if any) holds the key `fingerprint`: the refusal's state, its message, and
/// whether it is a revocation (the cluster is kept, unavailable). `None`: still trusted.
fn distrust(
    name: &str,
    record: Option<&crate::registration::store::ClusterRecord>,
    fingerprint: Option<&str>,
) -> Option<(&'static str, String, bool)> {
    match record {
        None => Some((
            flower_addon_proto::CLUSTER_DELETED,
            format!("cluster {name:?} was deleted on the hub"),
            false,
        )),
        Some(r) if !r.hub_accepts_client => Some((
            flower_addon_proto::CLUSTER_NOT_ACCEPTED,
            format!("cluster {name:?} is no longer accepted by the hub (hubAcceptsClient=false)"),
            true,
        )),
        Some(r) if fingerprint.is_some_and(|f| !r.registration.binds(f)) => Some((
            flower_addon_proto::CLUSTER_REKEYED,
            format!("cluster {name:?} was re-registered with another key"),
            false,
        )),
        Some(_) => None,
    }
}

/// Writes [`acceptance_conditions`] for cluster `name` when they change anything (so the
/// write's own change event finds nothing to do).
async fn sync_acceptance<S: ClusterStore, W: crate::channel::source::WorkSource>(
    shared: &Shared<S, W>,
    name: &str,
) {
    // The cache holds the change that was announced (it is filled first).
    if let Some(record) = shared.store.cached_cluster(name) {
        return sync_acceptance_of(shared, record).await;
    }
    match shared.store.get_cluster(name).await {
        Ok(Some(record)) => sync_acceptance_of(shared, record).await,
        Ok(None) => {}
        Err(error) => tracing::warn!(cluster = %name, %error, "cannot read the cluster"),
    }
}

/// [`sync_acceptance`] of a record already read (no read when nothing changes).
async fn sync_acceptance_of<S: ClusterStore, W: crate::channel::source::WorkSource>(
    shared: &Shared<S, W>,
    record: crate::registration::store::ClusterRecord,
) {
    let name = record.registration.name.as_str();
    let now = unix_now();
    let mut probe = record.status.clone();
    if !acceptance_conditions(&mut probe, record.hub_accepts_client, now) {
        return;
    }
    let accepted = record.hub_accepts_client;
    let result = shared
        .update_status(name, |st| {
            acceptance_conditions(st, accepted, now);
        })
        .await;
    match result {
        Ok(()) => tracing::info!(cluster = %name, accepted, "acceptance conditions updated"),
        Err(error) => {
            let _ = internal("recording the acceptance", error);
        }
    }
}

/// Records `Available=False` (reason [`REASON_REVOKED`]) on a cluster whose acceptance the
/// admin withdrew.
async fn mark_revoked<S: ClusterStore, W: crate::channel::source::WorkSource>(
    shared: &Shared<S, W>,
    name: &str,
) {
    let at = unix_now();
    let result = shared
        .update_status(name, |st| {
            if st.set_condition(
                CONDITION_AVAILABLE,
                "False",
                REASON_REVOKED,
                "hubAcceptsClient=false: the hub closed the cluster's work stream and sends it no work",
                at,
            ) {
                tracing::info!(cluster = %name, "revoked cluster unavailable");
            }
        })
        .await;
    if let Err(error) = result {
        let _ = internal("recording the revocation", error);
    }
}

#[cfg(test)]
mod tests;

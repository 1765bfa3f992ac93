//! Cluster leases: every message of a cluster's stream renews its lease; no heartbeat for
//! [`LEASE_GRACE_TIMES`] leases makes it `Available=Unknown` (OCM's rule), counted afresh from a
//! hub start for clusters the hub does not hear from.
use super::work::is_current;
use super::{Shared, internal};
use crate::registration::store::{CONDITION_AVAILABLE, ClusterStore, LEASE_GRACE_TIMES};
use crate::registration::tokens::unix_now;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Lease bookkeeping of one cluster.
pub(crate) struct Lease {
    last_heartbeat: Instant,
    persisted: Instant,
    available: bool,
    /// The cluster's lease duration (its `leaseDurationSeconds`, else the hub's).
    duration: Duration,
}

/// The lease duration of cluster `name`: its own (`spec.leaseDurationSeconds`) or the hub's.
pub(super) async fn lease_of<S: ClusterStore, W: super::WorkSource>(
    shared: &Shared<S, W>,
    name: &str,
) -> Duration {
    match shared.store.get_cluster(name).await {
        Ok(Some(record)) => record
            .lease_duration
            .unwrap_or(shared.config.lease_duration),
        _ => shared.config.lease_duration,
    }
}

/// Renews the cluster lease; persists the heartbeat when the cluster becomes available and at
/// most every half lease after that (so 10,000 agents do not turn into 10,000 writes a second).
/// Only the cluster's current stream renews: a message that raced a revocation must not make
/// the revoked cluster Available again.
pub(super) async fn renew_lease<S: ClusterStore, W: super::WorkSource>(
    shared: &Shared<S, W>,
    name: &str,
    stream: u64,
    lease_duration: Duration,
) {
    if !is_current(shared, name, stream) {
        return;
    }
    let now = Instant::now();
    let persist_every = lease_duration / 2;
    let must_persist = {
        let mut lease = shared.leases.entry(name.to_string()).or_insert(Lease {
            last_heartbeat: now,
            persisted: now,
            available: false,
            duration: lease_duration,
        });
        lease.last_heartbeat = now;
        lease.duration = lease_duration;
        let due = !lease.available || now.duration_since(lease.persisted) >= persist_every;
        if due {
            lease.available = true;
            lease.persisted = now;
        }
        due
    };
    if must_persist {
        let at = unix_now();
        let result = shared
            .update_status(name, |st| {
                // Checked again under the status lock: the revocation watcher removes the stream
                // before it records Available=False under the same lock.
                if !is_current(shared, name, stream) {
                    return;
                }
                st.last_heartbeat_unix = Some(at);
                if st.set_condition(CONDITION_AVAILABLE, "True", "ClusterAvailable", "", at) {
                    tracing::info!(cluster = %name, "cluster available");
                }
            })
            .await;
        if let Err(error) = result {
            let _ = internal("recording the heartbeat", error);
        }
    }
}

/// Marks clusters unavailable when their lease runs out: no heartbeat for
/// [`LEASE_GRACE_TIMES`] × the lease. Clusters the store says are available when the hub starts
/// get a fresh grace period from the start, so one whose agent died while no hub ran does not
/// stay `Available=True` for ever.
pub(crate) fn spawn_lease_checker<S: ClusterStore, W: super::WorkSource>(
    shared: Arc<Shared<S, W>>,
    mut stop: watch::Receiver<bool>,
) {
    let lease = shared.config.lease_duration;
    tokio::spawn(async move {
        seed_leases(&shared).await;
        let every = (lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = tick.tick() => {}
            }
            let expired: Vec<String> = shared
                .leases
                .iter_mut()
                .filter_map(|mut e| {
                    if e.available && e.last_heartbeat.elapsed() > e.duration * LEASE_GRACE_TIMES {
                        e.available = false;
                        Some(e.key().clone())
                    } else {
                        None
                    }
                })
                .collect();
            for name in expired {
                let at = unix_now();
                tracing::warn!(cluster = %name, "lease expired: cluster unavailable");
                let result = shared
                    .update_status(&name, |st| {
                        st.set_condition(
                            CONDITION_AVAILABLE,
                            "Unknown",
                            "ClusterLeaseExpired",
                            "no heartbeat from the agent within 5 lease durations",
                            at,
                        );
                    })
                    .await;
                if let Err(error) = result {
                    let _ = internal("recording the lease expiry", error);
                }
            }
        }
    });
}

/// Starts a grace period now for every accepted cluster the store records as available (or
/// never saw), unless its stream already renewed the lease.
async fn seed_leases<S: ClusterStore, W: super::WorkSource>(shared: &Shared<S, W>) {
    let clusters = match shared.store.list_clusters().await {
        Ok(clusters) => clusters,
        Err(error) => {
            tracing::warn!(%error, "cannot list clusters to start their leases");
            return;
        }
    };
    let now = Instant::now();
    let mut seeded = 0usize;
    for record in clusters {
        let shown_available = record
            .status
            .condition(CONDITION_AVAILABLE)
            .is_none_or(|c| c.status == "True");
        if record.hub_accepts_client && shown_available {
            shared
                .leases
                .entry(record.registration.name.clone())
                .or_insert_with(|| {
                    seeded += 1;
                    Lease {
                        last_heartbeat: now,
                        persisted: now,
                        available: true,
                        duration: record
                            .lease_duration
                            .unwrap_or(shared.config.lease_duration),
                    }
                });
        }
    }
    if seeded > 0 {
        tracing::info!(
            clusters = seeded,
            "leases started for the known clusters; those not heard from within the grace become unavailable"
        );
    }
}

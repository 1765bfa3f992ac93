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
    /// The stream whose heartbeat was last written (None: a lease started at hub start by
    /// [`seed_leases`]): the first heartbeat of each new stream is written at once, so the store
    /// shows a cluster is back after its agent or the hub restarted.
    stream: Option<u64>,
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

/// How often, at least, the last heartbeat of a connected cluster is written to the store
/// besides each change of its availability: a coarse "last seen". Availability itself is the
/// lease the hub keeps in memory (and a restarted hub gives every cluster a fresh grace), so
/// 10,000 connected clusters cost under 20 store writes a second, not one per heartbeat.
pub const LAST_SEEN_EVERY: Duration = Duration::from_secs(600);

/// When cluster `name`'s last-seen time is written again after `persisted`: half a lease, but
/// no sooner than [`LAST_SEEN_EVERY`] plus a share of it fixed per cluster (up to half of it),
/// so that clusters which connected together do not all write at once ever after.
fn last_seen_due(name: &str, lease_duration: Duration) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut hasher);
    let spread = LAST_SEEN_EVERY.mul_f64((hasher.finish() % 1000) as f64 / 2000.0);
    (lease_duration / 2).max(LAST_SEEN_EVERY + spread)
}

/// Renews the cluster lease; persists the heartbeat when the cluster becomes available, on the
/// first message of each stream (a reconnection, also after a hub restart), and then only as a
/// coarse last-seen ([`last_seen_due`]). Only the cluster's current stream renews: a
/// message that raced a revocation must not make the revoked cluster Available again.
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
    let persist_every = last_seen_due(name, lease_duration);
    let must_persist = {
        let mut lease = shared.leases.entry(name.to_string()).or_insert(Lease {
            last_heartbeat: now,
            persisted: now,
            available: false,
            stream: None,
            duration: lease_duration,
        });
        lease.last_heartbeat = now;
        lease.duration = lease_duration;
        let due = !lease.available
            || lease.stream != Some(stream)
            || now.duration_since(lease.persisted) >= persist_every;
        if due {
            lease.available = true;
            lease.stream = Some(stream);
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
                        stream: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_seen_time_is_written_coarsely_and_spread_over_clusters() {
        // #12 item 4: a connected cluster's heartbeat is persisted at most every 10–15 minutes
        // (not every half lease), each cluster at its own offset, so 10,000 clusters stay under
        // 20 writes a second; a lease longer than that still writes every half lease.
        let lease = Duration::from_secs(60);
        let dues: Vec<Duration> = (0..10_000)
            .map(|i| last_seen_due(&format!("cluster-{i}"), lease))
            .collect();
        let (min, max) = (
            dues.iter().min().copied().unwrap_or_default(),
            dues.iter().max().copied().unwrap_or_default(),
        );
        assert!(min >= LAST_SEEN_EVERY, "{min:?}");
        assert!(max <= LAST_SEEN_EVERY.mul_f64(1.5), "{max:?}");
        assert!(
            max - min >= LAST_SEEN_EVERY / 3,
            "not spread: {min:?}..{max:?}"
        );
        let writes_per_second: f64 = dues.iter().map(|d| 1.0 / d.as_secs_f64()).sum();
        assert!(writes_per_second <= 20.0, "{writes_per_second}");
        assert_eq!(
            last_seen_due("c", lease),
            last_seen_due("c", lease),
            "stable per cluster"
        );
        assert_eq!(
            last_seen_due("c", Duration::from_secs(3600)),
            Duration::from_secs(1800)
        );
    }
}

//! Cluster leases: every message of a cluster's stream renews its lease; no heartbeat for
//! [`LEASE_GRACE_TIMES`] leases makes it `Available=Unknown` (OCM's rule), counted afresh from a
//! hub start for clusters the hub does not hear from.
use super::{Shared, internal};
use crate::registration::store::{CONDITION_AVAILABLE, ClusterStore, LEASE_GRACE_TIMES};
use crate::registration::tokens::unix_now;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Lease bookkeeping of one cluster.
pub(crate) struct Lease {
    last_heartbeat: Instant,
    /// The [`last_seen_slot`] of the last write of the heartbeat.
    slot: u64,
    available: bool,
    /// The stream whose heartbeat was last written (None: a lease started at hub start by
    /// [`seed_leases`]): the first heartbeat of each new stream is written at once, so the store
    /// shows a cluster is back after its agent or the hub restarted.
    stream: Option<u64>,
    /// The cluster's lease duration (its `leaseDurationSeconds`, else the hub's).
    duration: Duration,
}

/// How often the last heartbeat of a connected cluster is written to the store besides each
/// change of its availability: a coarse "last seen". Availability itself is the lease the hub
/// keeps in memory (and a restarted hub gives every cluster a fresh grace), so 10,000 connected
/// clusters cost about 11 store writes a second, not one per heartbeat.
pub const LAST_SEEN_EVERY: Duration = Duration::from_secs(900);

/// The last-seen slot of cluster `name` at `unix` seconds. It changes once a period
/// ([`LAST_SEEN_EVERY`], or half a lease if that is longer) at a second of the period fixed per
/// cluster, and a cluster's heartbeat is written when its slot has changed: once per period, and
/// clusters that connected together (after an outage, a hub restart) write spread evenly over
/// the next period rather than all at once again.
fn last_seen_slot(name: &str, lease_duration: Duration, unix: u64) -> u64 {
    use std::hash::{Hash, Hasher};
    let period = (lease_duration / 2).max(LAST_SEEN_EVERY).as_secs().max(1);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut hasher);
    (unix + hasher.finish() % period) / period
}

/// Renews the cluster lease; persists the heartbeat when the cluster becomes available, on the
/// first message of each stream (a reconnection, also after a hub restart), and then only as a
/// coarse last-seen ([`last_seen_slot`]). Only the cluster's current stream renews: a
/// message that raced a revocation must not make the revoked cluster Available again.
pub(super) fn renew_lease<S: ClusterStore, W: crate::channel::source::WorkSource>(
    shared: &Arc<Shared<S, W>>,
    name: &str,
    stream: u64,
    lease_duration: Duration,
) {
    if !shared.is_current(name, stream) {
        return;
    }
    let now = Instant::now();
    let slot = last_seen_slot(name, lease_duration, unix_now());
    let must_persist = {
        let mut lease = shared.leases.entry(name.to_string()).or_insert(Lease {
            last_heartbeat: now,
            slot,
            available: false,
            stream: None,
            duration: lease_duration,
        });
        lease.last_heartbeat = now;
        lease.duration = lease_duration;
        let due = !lease.available || lease.stream != Some(stream) || lease.slot != slot;
        if due {
            lease.available = true;
            lease.stream = Some(stream);
            lease.slot = slot;
        }
        due
    };
    if must_persist {
        // Written beside the stream, not in it: the stream goes on delivering work while the
        // store is slow (10,000 first heartbeats after a connect storm or a hub restart).
        let shared = shared.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            let _permit = shared.store_writes.acquire().await;
            let at = unix_now();
            let result = shared
                .update_status(&name, |st| {
                    // Checked again under the status lock: the revocation watcher removes the
                    // stream before it records Available=False under the same lock.
                    if !shared.is_current(&name, stream) {
                        return;
                    }
                    st.last_heartbeat_unix = Some(at);
                    if st.set_condition(CONDITION_AVAILABLE, "True", "ClusterAvailable", "", at) {
                        tracing::info!(cluster = %name, "cluster available");
                    }
                    // The stream was authorized, so the cluster is accepted: a HubAccepted
                    // condition the revocation watcher has not written yet goes with this write.
                    super::acceptance::acceptance_conditions(st, true, at);
                })
                .await;
            if let Err(error) = result {
                let _ = internal("recording the heartbeat", error);
                // Not written: the stream's next message tries again (else the store would
                // show the cluster's old state until its next last-seen slot, 15 minutes on).
                if let Some(mut lease) = shared.leases.get_mut(&name)
                    && lease.stream == Some(stream)
                {
                    lease.stream = None;
                }
            }
        });
    }
}

/// Marks clusters unavailable when their lease runs out: no heartbeat for
/// [`LEASE_GRACE_TIMES`] × the lease. Clusters the store says are available when the hub starts
/// get a fresh grace period from the start, so one whose agent died while no hub ran does not
/// stay `Available=True` for ever.
pub(crate) fn spawn_lease_checker<S: ClusterStore, W: crate::channel::source::WorkSource>(
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
async fn seed_leases<S: ClusterStore, W: crate::channel::source::WorkSource>(
    shared: &Shared<S, W>,
) {
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
                        // Written on the first message of a stream anyway (`stream: None`).
                        slot: 0,
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
    fn the_last_seen_time_is_written_once_a_period_spread_evenly_over_clusters() {
        // 10,000 clusters connect in the same second (a storm, a hub restart) and their first
        // heartbeats are written then; after that each is written once per LAST_SEEN_EVERY, and in
        // no minute do they all come due together: every 60 s window stays under 20 writes a second
        // from the start, not only on average.
        let lease = Duration::from_secs(60);
        let period = LAST_SEEN_EVERY.as_secs();
        let t0 = 1_800_000_123u64;
        let names: Vec<String> = (0..10_000).map(|i| format!("cluster-{i}")).collect();
        let mut slots: Vec<u64> = names.iter().map(|n| last_seen_slot(n, lease, t0)).collect();
        let mut last_write = vec![t0; names.len()];
        let mut per_minute = vec![0u32; (3 * period / 60) as usize];
        // Heartbeats every 30 s (half the lease), at a per-cluster second.
        for t in t0 + 1..t0 + 3 * period {
            for (i, name) in names.iter().enumerate() {
                if !(t + i as u64).is_multiple_of(30) {
                    continue;
                }
                let slot = last_seen_slot(name, lease, t);
                if slot != slots[i] {
                    slots[i] = slot;
                    assert!(
                        t - last_write[i] <= period + 30,
                        "{name} unwritten for {} s",
                        t - last_write[i]
                    );
                    last_write[i] = t;
                    per_minute[((t - t0) / 60) as usize] += 1;
                }
            }
        }
        let busiest = per_minute.iter().max().copied().unwrap_or_default();
        assert!(
            f64::from(busiest) / 60.0 <= 20.0,
            "{busiest} writes in one minute"
        );
        let total: u32 = per_minute.iter().sum();
        // Three periods: each cluster about three times.
        assert!((29_000..=31_000).contains(&total), "{total} writes");
        assert!(
            last_write
                .iter()
                .all(|&t| t0 + 3 * period - t <= period + 30),
            "every cluster written within the last period"
        );
        // A lease longer than twice the period: half a lease.
        let long = Duration::from_secs(4 * period);
        let changes = (0..4 * period)
            .filter(|t| last_seen_slot("c", long, t0 + t) != last_seen_slot("c", long, t0 + t + 1))
            .count();
        assert_eq!(changes, 2);
    }
}

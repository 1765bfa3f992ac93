//! Readiness from watch streams: a check of the hub's `/readyz` passes once each of a set of
//! watches has listed once (its first `InitDone`).
//!
//! Seen in the stream rather than by awaiting `Store::wait_until_ready`: kube-runtime's store
//! readiness wakes only the last task that polled it, so a second waiter (the controller itself
//! waits on its reader store) could leave the other asleep for ever.
use flower_addon_runtime::ops::Health;
use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// Watches that have not listed yet, for one readiness check.
pub struct ListGate {
    health: Arc<Health>,
    check: &'static str,
    pending: Mutex<BTreeSet<&'static str>>,
}

impl ListGate {
    /// Check `check` of `health` fails until every watch in `watches` has listed.
    pub fn new(health: Arc<Health>, check: &'static str, watches: &[&'static str]) -> Arc<Self> {
        health.set(check, watches.is_empty());
        Arc::new(Self {
            health,
            check,
            pending: Mutex::new(watches.iter().copied().collect()),
        })
    }

    /// `stream` unchanged, recording its first `InitDone` as watch `name` listed.
    pub fn watch<S, K>(
        self: &Arc<Self>,
        name: &'static str,
        stream: S,
    ) -> impl Stream<Item = S::Item> + use<S, K>
    where
        S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    {
        let this = self.clone();
        stream.inspect(move |event| {
            if matches!(event, Ok(watcher::Event::InitDone)) {
                this.listed(name);
            }
        })
    }

    fn listed(&self, name: &'static str) {
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        if pending.remove(name) && pending.is_empty() {
            tracing::debug!(check = self.check, "every watch listed: ready");
            self.health.set(self.check, true);
        }
    }
}

/// Waits until `store` has listed once, safe with other waiters: kube-runtime's
/// `Store::wait_until_ready` wakes only the last task that polled it, so each waiter polls again
/// every 100 ms and none sleeps for ever. Never use it on a store a `Controller` reads from (its
/// own waiter does not poll again). `Err` when the store's writer is gone.
pub async fn until_listed<K>(
    store: &kube::runtime::reflector::Store<K>,
) -> Result<(), kube::runtime::reflector::store::WriterDropped>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        if let Ok(done) = tokio::time::timeout(
            std::time::Duration::from_millis(100),
            store.wait_until_ready(),
        )
        .await
        {
            return done;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    #[tokio::test]
    async fn ready_once_every_watch_listed_and_only_then() {
        // Invariant: the check passes after the last watch's first InitDone, not before, and a
        // later relist changes nothing.
        let health = Health::new(&[]);
        let listed = ListGate::new(health.clone(), "c", &["a", "b"]);
        assert!(!health.ready());
        let events = |n| {
            futures::stream::iter(
                (0..n).map(|_| Ok::<_, watcher::Error>(watcher::Event::<Pod>::InitDone)),
            )
        };
        let _: Vec<_> = listed.watch("a", events(2)).collect().await;
        assert!(!health.ready());
        let _: Vec<_> = listed.watch("b", events(1)).collect().await;
        assert!(health.ready());
    }

    #[tokio::test]
    async fn every_waiter_sees_the_store_listed() {
        // Invariant: two tasks waiting on one store both return once it lists (kube-runtime's
        // own wait wakes only one of them).
        let (store, mut writer) = kube::runtime::reflector::store::<Pod>();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move { until_listed(&store).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        for waiter in waiters {
            tokio::time::timeout(std::time::Duration::from_secs(2), waiter)
                .await
                .expect("a waiter slept through the listing")
                .expect("join")
                .expect("listed");
        }
    }
}

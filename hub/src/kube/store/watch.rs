//! The ManagedCluster watch behind [`super::KubeStore`]: it keeps the store's cache of every
//! ManagedCluster (without `managedFields`) and announces on
//! [`crate::registration::store::ClusterStore::changes`] only what can close a cluster's stream
//! ([`ChangeFilter`]: acceptance, the bound key, existence), so the hub's own status writes wake
//! nobody.

use std::sync::Arc;

use dashmap::DashMap;
use flower_addon_crds::ManagedCluster;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::ANN_KEY_FINGERPRINT;
use crate::kube::backoff::ShortBackoff;

/// Which ManagedCluster watch events [`crate::registration::store::ClusterStore::changes`]
/// announces: a change of acceptance or of the bound key, a new cluster, a deletion (also one
/// missed while the watch was down). The hub's own status writes (a heartbeat, 10,000 at a hub
/// restart) change none of these and wake nobody.
#[derive(Default)]
pub(super) struct ChangeFilter {
    seen: std::collections::HashMap<String, (bool, Option<String>)>,
    relisted: std::collections::HashSet<String>,
}

impl ChangeFilter {
    /// The names to announce for `event`.
    pub(super) fn on_event(&mut self, event: &watcher::Event<ManagedCluster>) -> Vec<String> {
        let key = |mc: &ManagedCluster| {
            (
                mc.spec.hub_accepts_client,
                mc.annotations().get(ANN_KEY_FINGERPRINT).cloned(),
            )
        };
        match event {
            watcher::Event::Apply(mc) | watcher::Event::InitApply(mc) => {
                let name = mc.name_any();
                if matches!(event, watcher::Event::InitApply(_)) {
                    self.relisted.insert(name.clone());
                }
                let changed = self.seen.insert(name.clone(), key(mc)) != Some(key(mc));
                changed.then_some(name).into_iter().collect()
            }
            watcher::Event::Delete(mc) => {
                let name = mc.name_any();
                self.seen.remove(&name);
                vec![name]
            }
            watcher::Event::Init => {
                self.relisted.clear();
                Vec::new()
            }
            watcher::Event::InitDone => {
                let gone: Vec<String> = self
                    .seen
                    .keys()
                    .filter(|n| !self.relisted.contains(*n))
                    .cloned()
                    .collect();
                for name in &gone {
                    self.seen.remove(name);
                }
                self.relisted.clear();
                gone
            }
        }
    }
}

/// Starts the watch of every ManagedCluster on `client`: it fills `cache` and sends on `changes`
/// the names [`ChangeFilter`] announces (after the cache holds the change).
pub(super) fn spawn(
    client: Client,
    changes: broadcast::Sender<String>,
    cache: Arc<DashMap<String, Arc<ManagedCluster>>>,
) -> JoinHandle<()> {
    let api = Api::<ManagedCluster>::all(client);
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default())
            .modify(crate::kube::strip_managed_fields)
            .backoff(ShortBackoff::default())
            .boxed();
        let mut filter = ChangeFilter::default();
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => {
                    let announced = filter.on_event(&event);
                    // The cache first: whoever hears of a change finds it there.
                    match &event {
                        watcher::Event::Apply(mc) | watcher::Event::InitApply(mc) => {
                            cache.insert(mc.name_any(), Arc::new(mc.clone()));
                        }
                        watcher::Event::Delete(mc) => {
                            cache.remove(&mc.name_any());
                        }
                        // Deleted while the watch was down.
                        watcher::Event::InitDone => {
                            for name in &announced {
                                cache.remove(name);
                            }
                        }
                        watcher::Event::Init => {}
                    }
                    for name in announced {
                        let _ = changes.send(name);
                    }
                }
                Err(error) => tracing::warn!(%error, "ManagedCluster watch"),
            }
        }
    })
}

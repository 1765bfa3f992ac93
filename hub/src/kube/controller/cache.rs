//! What the Federation controller reads instead of asking the apiserver: reflector stores of the
//! objects it applied (selected by its [`super::APPLIED_BY_LABEL`]) and of Placements, fed by
//! the same watches that trigger its reconciles.
//!
//! Each applied object carries [`APPLIED_HASH_ANNOTATION`], a hash of everything the hub sets
//! in it. An apply is skipped when the cached object carries the hash of the desired object and
//! still holds every value the hub sets ([`holds`]): nothing the hub owns changed on either side.
//! A field the build stops setting changes the hash, so the apply that drops it still happens; a
//! value someone else changed fails [`holds`], so the periodic resync puts it back.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use flower_addon_crds::Placement;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store, store};
use kube::runtime::watcher;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::Error;

/// Annotation with the hash of what the hub last applied to an object (see the module doc).
pub const APPLIED_HASH_ANNOTATION: &str = "flower-addon.io/applied-hash";
/// How long a reconcile waits for the caches' first lists before it fails (and is retried).
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The controller's reflector stores.
#[derive(Clone)]
pub struct Caches {
    /// SuperLink StatefulSets the hub applied.
    pub statefulsets: Store<StatefulSet>,
    /// SuperLink Services the hub applied.
    pub services: Store<Service>,
    /// SuperLink NetworkPolicies the hub applied.
    pub network_policies: Store<NetworkPolicy>,
    /// SuperLink TLS Secrets the hub issued.
    pub secrets: Store<Secret>,
    /// Every Placement (a Federation mirrors its Placement's `PlacementSatisfied`).
    pub placements: Store<Placement>,
    /// Every namespace (the Pod Security labels of the Federations' own are checked and set:
    /// [`super::namespace_problems`]).
    pub namespaces: Store<Namespace>,
}

impl Caches {
    /// Stores filled once from `objects` and marked listed (tests, and a reconcile run outside
    /// the controller); nothing updates them afterwards.
    pub fn fixed(
        statefulsets: Vec<StatefulSet>,
        services: Vec<Service>,
        network_policies: Vec<NetworkPolicy>,
        secrets: Vec<Secret>,
        placements: Vec<Placement>,
    ) -> Self {
        Self {
            statefulsets: fixed_store(statefulsets),
            services: fixed_store(services),
            network_policies: fixed_store(network_policies),
            secrets: fixed_store(secrets),
            placements: fixed_store(placements),
            namespaces: fixed_store(Vec::new()),
        }
    }

    /// These stores with `namespaces` as the namespaces' (tests).
    pub fn with_namespaces(self, namespaces: Vec<Namespace>) -> Self {
        Self {
            namespaces: fixed_store(namespaces),
            ..self
        }
    }

    /// Stores filled from one list of each kind (as the controller's watches select them), for
    /// a reconcile run outside the controller.
    pub async fn listed(client: &kube::Client) -> Result<Self, Error> {
        use kube::api::ListParams;
        let owned = ListParams::default().labels(&format!(
            "{}={}",
            super::APPLIED_BY_LABEL,
            super::HUB_FIELD_MANAGER
        ));
        async fn list<K>(client: &kube::Client, params: &ListParams) -> Result<Vec<K>, Error>
        where
            K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
        {
            Api::<K>::all(client.clone())
                .list(params)
                .await
                .map(|l| l.items)
                .map_err(|source| Error::Kube {
                    action: format!("list {}", K::kind(&())),
                    source,
                })
        }
        Ok(Self::fixed(
            list(client, &owned).await?,
            list(client, &owned).await?,
            list(client, &owned).await?,
            list(client, &owned).await?,
            list(client, &ListParams::default()).await?,
        )
        .with_namespaces(list(client, &ListParams::default()).await?))
    }

    /// Waits until every store has listed once, so a reconcile never takes "not cached" for
    /// "does not exist" (which would prune nothing and re-issue certificates).
    pub(super) async fn ready(&self) -> Result<(), Error> {
        let all = async {
            // Reconciles of several Federations wait at once: see `until_listed`.
            use crate::kube::list_gate::until_listed;
            until_listed(&self.statefulsets).await.ok();
            until_listed(&self.services).await.ok();
            until_listed(&self.network_policies).await.ok();
            until_listed(&self.secrets).await.ok();
            until_listed(&self.placements).await.ok();
            until_listed(&self.namespaces).await.ok();
        };
        tokio::time::timeout(READY_TIMEOUT, all)
            .await
            .map_err(|_| Error::NotCached(READY_TIMEOUT))
    }
}

fn fixed_store<K>(objects: Vec<K>) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let (reader, mut writer) = store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for object in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    reader
}

/// The cached `K` `namespace/name`, if any.
pub(super) fn cached<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store.get(&ObjectRef::new(name).within(namespace))
}

/// How long a reconcile waits at most for its writes to reach the caches ([`caught_up`]).
const CATCH_UP: Duration = Duration::from_millis(250);

/// Waits until `store` holds `object` at its resourceVersion or a later one, for at most
/// [`CATCH_UP`]. Returns at once for an object without a numeric resourceVersion (e.g. one
/// that was not written).
pub(super) async fn caught_up<K>(store: &Store<K>, object: &K)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let version = |k: &K| k.meta().resource_version.as_deref()?.parse::<u64>().ok();
    let (Some(written), Some(namespace)) = (version(object), object.meta().namespace.as_deref())
    else {
        return;
    };
    let name = name_of(object);
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    while cached(store, namespace, &name)
        .and_then(|k| version(&k))
        .is_none_or(|seen| seen < written)
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `object` as the JSON body the hub applies: with [`APPLIED_HASH_ANNOTATION`] set to the hash of
/// the rest.
pub(super) fn body<K: Resource<DynamicType = ()> + Serialize>(object: &K) -> Result<Value, Error> {
    let serialize = |source| Error::Serialize {
        what: format!("{} {}", K::kind(&()), name_of(object)),
        source,
    };
    let mut body = serde_json::to_value(object).map_err(serialize)?;
    let bytes = serde_json::to_vec(&body).map_err(serialize)?;
    let hash = hex::encode(&Sha256::digest(&bytes)[..12]);
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(map) = annotations.as_object_mut() {
            map.insert(APPLIED_HASH_ANNOTATION.to_owned(), Value::String(hash));
        }
    }
    Ok(body)
}

fn name_of<K: Resource>(object: &K) -> String {
    object.meta().name.clone().unwrap_or_default()
}

/// Whether `live` holds every value of `desired` (objects: each key; lists: same length, each
/// item; an absent value stands for null, `{}` and `[]`, which the apiserver drops).
pub fn holds(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Null, _) => true,
        (Value::Object(want), Value::Object(have)) => want.iter().all(|(k, v)| match have.get(k) {
            Some(h) => holds(v, h),
            None => is_empty(v),
        }),
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len() && want.iter().zip(have).all(|(w, h)| holds(w, h))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (want, Value::Null) => is_empty(want),
        (want, have) => want == have,
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.values().all(is_empty),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// Server-side applies `object` (forced, the hub's manager) unless `cached` already holds it;
/// returns the stored object.
pub(super) async fn apply<K>(api: &Api<K>, object: &K, cached: Option<Arc<K>>) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
{
    let body = body(object)?;
    if let Some(live) = cached {
        let live_json = serde_json::to_value(live.as_ref()).map_err(|source| Error::Serialize {
            what: format!("cached {} {}", K::kind(&()), name_of(object)),
            source,
        })?;
        if holds(&body, &live_json) {
            tracing::trace!(kind = K::kind(&()).as_ref(), name = %name_of(object), "unchanged; not applied");
            return Ok(live.as_ref().clone());
        }
    }
    super::apply::apply_body(api, &name_of(object), &body).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn holds_compares_only_what_is_desired() {
        let desired = json!({"metadata": {"labels": {"a": "1"}, "annotations": {}},
            "spec": {"replicas": 2, "ports": [{"port": 80}], "args": []}});
        let live = json!({"metadata": {"labels": {"a": "1", "b": "2"}, "uid": "u"},
            "spec": {"replicas": 2.0, "ports": [{"port": 80, "protocol": "TCP"}]},
            "status": {"x": 1}});
        assert!(holds(&desired, &live));
        let changed = json!({"metadata": {"labels": {"a": "9"}}, "spec": {"replicas": 2, "ports": [{"port": 80}]}});
        assert!(!holds(&desired, &changed), "a changed value");
        let fewer =
            json!({"metadata": {"labels": {"a": "1"}}, "spec": {"replicas": 2, "ports": []}});
        assert!(!holds(&desired, &fewer), "a list of another length");
        let missing =
            json!({"metadata": {"labels": {"a": "1"}}, "spec": {"ports": [{"port": 80}]}});
        assert!(!holds(&desired, &missing), "a missing value");
    }

    #[test]
    fn the_body_carries_a_hash_of_what_it_sets() {
        let mut service = Service::default();
        service.metadata.name = Some("s".into());
        let a = body(&service).unwrap();
        let hash = a["metadata"]["annotations"][APPLIED_HASH_ANNOTATION].clone();
        assert!(hash.as_str().is_some_and(|h| h.len() == 24), "{a}");
        assert_eq!(body(&service).unwrap(), a, "deterministic");
        service
            .metadata
            .labels
            .get_or_insert_default()
            .insert("k".into(), "v".into());
        let b = body(&service).unwrap();
        assert_ne!(
            b["metadata"]["annotations"][APPLIED_HASH_ANNOTATION], hash,
            "another content, another hash"
        );
        // A field the build drops changes the hash, so the cached object no longer holds it.
        assert!(!holds(&a, &b));
        assert!(holds(&b, &b));
    }

    #[tokio::test]
    async fn a_reconcile_waits_for_its_writes_to_reach_the_cache_but_not_for_ever() {
        // The reconcile that a write triggers must read that write; a cache that never catches up
        // costs at most CATCH_UP, and an object that was not written costs nothing. No upper bound
        // below is a small wall-clock one (they flaked on loaded runners): "no wait" is checked by
        // polling once, and the bounds that remain are either lower bounds (tokio timers never fire
        // early) or far from what the code needs.
        use futures::FutureExt;
        let service = |version: Option<&str>| {
            let mut s = Service::default();
            s.metadata.name = Some("s".into());
            s.metadata.namespace = Some("ns".into());
            s.metadata.resource_version = version.map(str::to_owned);
            s
        };
        let (reader, mut writer) = store::<Service>();
        writer.apply_watcher_event(&watcher::Event::Apply(service(Some("5"))));
        // Already cached at that version or later, or no version: done at the first poll, without
        // waiting for any timer.
        for version in [Some("5"), Some("4"), None] {
            assert!(
                caught_up(&reader, &service(version))
                    .now_or_never()
                    .is_some(),
                "{version:?}: waited although nothing was missing"
            );
        }
        // Never cached: waits, for CATCH_UP at least (a lower bound: timers never fire early)
        // and not for ever. The hang guard is CATCH_UP x 20 (5 s): the wait itself is CATCH_UP
        // plus one 2 ms poll, so only a wait without its bound reaches it.
        let never = service(Some("9"));
        let started = tokio::time::Instant::now();
        let mut waiting = std::pin::pin!(caught_up(&reader, &never));
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "returned at once for a version the cache never saw"
        );
        tokio::time::timeout(CATCH_UP * 20, waiting)
            .await
            .expect("a cache that never catches up is waited for CATCH_UP, not for ever");
        let took = started.elapsed();
        assert!(took >= CATCH_UP, "gave up before CATCH_UP: {took:?}");
        // Cached a little later: waits until then, and no longer. Version 7 reaches the cache
        // right after the first check; the waiter sees it at its next poll (2 ms), so it ends
        // far before the CATCH_UP deadline (250 ms, x100 that poll, for a loaded runner), which
        // a waiter that misses the change reaches (at least CATCH_UP, as above).
        let later = service(Some("7"));
        let started = tokio::time::Instant::now();
        let mut waiting = std::pin::pin!(caught_up(&reader, &later));
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "returned before version 7 was cached"
        );
        writer.apply_watcher_event(&watcher::Event::Apply(service(Some("7"))));
        tokio::time::timeout(CATCH_UP * 20, waiting)
            .await
            .expect("bounded");
        let took = started.elapsed();
        assert!(
            took < CATCH_UP,
            "waited {took:?}: the catch-up was missed and the deadline ended the wait"
        );
    }
}

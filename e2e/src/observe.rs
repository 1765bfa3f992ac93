//! What tests compare before and after a restart: the resourceVersions of everything a component
//! applied, and pod UIDs (a recreated pod gets a new one); and the wait for StatefulSets to settle
//! before taking them.
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use std::collections::BTreeMap;

/// resourceVersions, by `Kind/name`, of the StatefulSets, DaemonSets, Services and Secrets in
/// `namespace` that match `label_selector`.
pub async fn applied_versions(
    client: &Client,
    namespace: &str,
    label_selector: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let lp = ListParams::default().labels(label_selector);
    let mut out = BTreeMap::new();
    versions::<StatefulSet>(client, namespace, &lp, &mut out).await?;
    versions::<DaemonSet>(client, namespace, &lp, &mut out).await?;
    versions::<Service>(client, namespace, &lp, &mut out).await?;
    versions::<Secret>(client, namespace, &lp, &mut out).await?;
    Ok(out)
}

async fn versions<K>(
    client: &Client,
    namespace: &str,
    lp: &ListParams,
    out: &mut BTreeMap<String, String>,
) -> anyhow::Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    for o in Api::<K>::namespaced(client.clone(), namespace)
        .list(lp)
        .await?
        .items
    {
        out.insert(
            format!("{}/{}", K::kind(&()), o.name_any()),
            o.resource_version().unwrap_or_default(),
        );
    }
    Ok(())
}

/// Pod name → UID in `namespace`.
pub async fn pod_uids(
    client: &Client,
    namespace: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    Ok(Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect())
}

/// Waits until every StatefulSet in `namespace` has a final status (observed its generation, all
/// replicas ready, available, current and updated on one revision), then 2 s more for trailing
/// status writes: later resourceVersion changes can only come from the component under test.
pub async fn wait_statefulsets_settled(client: &Client, namespace: &str) -> anyhow::Result<()> {
    let api = Api::<StatefulSet>::namespaced(client.clone(), namespace);
    crate::harness::wait_until(
        "StatefulSet status settled",
        std::time::Duration::from_secs(60),
        || async {
            let list = api.list(&ListParams::default()).await?;
            Ok(list.items.iter().all(|s| {
                let want = s.spec.replicas.unwrap_or(1);
                s.status.as_ref().is_some_and(|st| {
                    st.observed_generation == s.metadata.generation
                        && st.ready_replicas == Some(want)
                        && st.available_replicas == Some(want)
                        && st.current_replicas == Some(want)
                        && st.updated_replicas == Some(want)
                        && st.current_revision == st.update_revision
                })
            }))
        },
    )
    .await?;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    Ok(())
}

//! What tests compare before and after a restart: the resourceVersions of everything a component
//! applied, and pod UIDs (a recreated pod gets a new one).
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

//! The runtime's writes: namespaces, server-side apply as the agent's field manager, and pruning
//! of labelled objects the snapshot no longer has.
use std::collections::BTreeSet;
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Kind, KubeRuntimeError, ObjectKey, PodPolicy, kube_err};

/// Makes `namespace` ready for work under `policy`: creates it with the policy's Pod Security
/// labels, or, when it exists, adds the labels it lacks (server-side apply as `manager`, only
/// when it has no `enforce` label) or returns why work may not go there (its level is weaker).
/// Never deletes a namespace (it may hold user data) nor changes a label its admin set.
pub async fn ensure_namespace(
    client: &Client,
    namespace: &str,
    policy: &PodPolicy,
    manager: &str,
) -> Result<Option<String>, KubeRuntimeError> {
    let api = Api::<Namespace>::all(client.clone());
    let action = format!("get Namespace {namespace}");
    if let Some(existing) = api.get_opt(namespace).await.map_err(kube_err(action))? {
        let labels = existing.metadata.labels.unwrap_or_default();
        let add = match policy.existing_namespace(namespace, &labels) {
            Ok(add) => add,
            Err(refusal) => return Ok(Some(refusal)),
        };
        label_namespace(client, namespace, add, manager).await?;
        return Ok(None);
    }
    let labels = policy.namespace_labels();
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_owned()),
            labels: (!labels.is_empty()).then(|| labels.into_iter().collect()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {
            tracing::info!(%namespace, "namespace created");
            Ok(None)
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
        Err(source) => Err(KubeRuntimeError::Kube {
            action: format!("create Namespace {namespace}"),
            source,
        }),
    }
}

/// Adds the labels `add` (the Pod Security labels an existing namespace lacks:
/// [`PodPolicy::existing_namespace`]) by server-side apply as `manager`; nothing when empty.
pub async fn label_namespace(
    client: &Client,
    namespace: &str,
    add: Vec<(String, String)>,
    manager: &str,
) -> Result<(), KubeRuntimeError> {
    if add.is_empty() {
        return Ok(());
    }
    let labels: serde_json::Map<String, serde_json::Value> =
        add.into_iter().map(|(k, v)| (k, v.into())).collect();
    let body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": labels},
    });
    Api::<Namespace>::all(client.clone())
        .patch(
            namespace,
            &PatchParams::apply(manager),
            &Patch::Apply(&body),
        )
        .await
        .map_err(kube_err(format!("label Namespace {namespace}")))?;
    tracing::info!(%namespace, ?labels, "existing namespace labelled for Pod Security");
    Ok(())
}

/// Server-side applies the JSON `body` of `K` `name` as field manager `manager` (forced: the
/// runtime owns these).
pub(super) async fn apply<K>(
    api: &Api<K>,
    name: &str,
    body: &serde_json::Value,
    manager: &str,
) -> Result<K, KubeRuntimeError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let params = PatchParams::apply(manager).force();
    api.patch(name, &params, &Patch::Apply(body))
        .await
        .map_err(kube_err(format!("apply {kind} {name}")))
}

/// Deletes the object `key` (already gone is fine); true when this call deleted it.
pub(super) async fn delete_object(
    client: &Client,
    key: &ObjectKey,
) -> Result<bool, KubeRuntimeError> {
    use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
    use k8s_openapi::api::core::v1::{Secret, Service};
    let (kind, namespace, name) = key;
    let params = DeleteParams::background();
    let result = match kind {
        Kind::StatefulSet => Api::<StatefulSet>::namespaced(client.clone(), namespace)
            .delete(name, &params)
            .await
            .map(|_| ()),
        Kind::DaemonSet => Api::<DaemonSet>::namespaced(client.clone(), namespace)
            .delete(name, &params)
            .await
            .map(|_| ()),
        Kind::Secret => Api::<Secret>::namespaced(client.clone(), namespace)
            .delete(name, &params)
            .await
            .map(|_| ()),
        Kind::Service => Api::<Service>::namespaced(client.clone(), namespace)
            .delete(name, &params)
            .await
            .map(|_| ()),
    };
    match result {
        Ok(()) => {
            tracing::info!(kind = kind.name(), %namespace, %name, "pruned");
            Ok(true)
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(source) => Err(KubeRuntimeError::Kube {
            action: format!("delete {} {namespace}/{name}", kind.name()),
            source,
        }),
    }
}

/// Deletes objects of one kind that match `selector` (the applier's labels) and are not desired;
/// returns those it deleted. With `scope` it lists only in those namespaces (an agent whose RBAC
/// is a Role in each), otherwise in all.
pub(super) async fn prune_kind<K>(
    client: &Client,
    selector: &str,
    kind: Kind,
    desired: &BTreeSet<ObjectKey>,
    keep: &BTreeSet<(String, String)>,
    scope: Option<&BTreeSet<String>>,
) -> Result<Vec<ObjectKey>, KubeRuntimeError>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let lists: Vec<Api<K>> = match scope {
        Some(namespaces) => namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect(),
        None => vec![Api::all(client.clone())],
    };
    let mut items = Vec::new();
    for api in lists {
        let list = api
            .list_metadata(&ListParams::default().labels(selector))
            .await
            .map_err(kube_err(format!("list {}", kind.name())))?;
        items.extend(list.items);
    }
    let mut pruned = Vec::new();
    for object in items {
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        let name = object.metadata.name.clone().unwrap_or_default();
        let instance = object
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/instance"))
            .cloned()
            .unwrap_or_default();
        if desired.contains(&(kind, namespace.clone(), name.clone()))
            || keep.contains(&(namespace.clone(), instance))
        {
            continue;
        }
        let api = Api::<K>::namespaced(client.clone(), &namespace);
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {
                tracing::info!(kind = kind.name(), %namespace, %name, "pruned");
                pruned.push((kind, namespace, name));
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => {
                return Err(KubeRuntimeError::Kube {
                    action: format!("delete {} {namespace}/{name}", kind.name()),
                    source,
                });
            }
        }
    }
    Ok(pruned)
}

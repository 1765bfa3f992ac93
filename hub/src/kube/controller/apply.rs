//! Server-side apply under the hub's one field manager, owner references, and pruning of the
//! labelled objects of a Federation that the build no longer returns.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use flower_addon_crds::Federation;
use flower_addon_crds::render::MANAGED_BY;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Error;

/// Field manager of every server-side apply the hub makes (objects and Federation status).
pub const HUB_FIELD_MANAGER: &str = "flower-addon-hub";
/// Label marking objects the hub applied (value [`HUB_FIELD_MANAGER`]); pruning selects on it.
pub const APPLIED_BY_LABEL: &str = "flower-addon.io/applied-by";
/// Label with the Federation's name on everything applied for it (the renderer's `instance`).
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// Adds the hub's ownership label and the Federation's controller owner reference to `meta`.
pub(super) fn own(meta: &mut ObjectMeta, fed: &Federation) {
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(APPLIED_BY_LABEL.to_owned(), HUB_FIELD_MANAGER.to_owned());
    meta.owner_references = controller_ref(fed).map(|r| vec![r]);
}

/// The controller owner reference of `owner`, blocking its foreground deletion until the owned
/// object is gone, as controller-runtime's `SetControllerReference` does.
pub(crate) fn controller_ref<K: kube::Resource<DynamicType = ()>>(
    owner: &K,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    owner.controller_owner_ref(&()).map(|mut r| {
        r.block_owner_deletion = Some(true);
        r
    })
}

/// Server-side applies the JSON `body` of `K` `name` (forced: the hub owns these fields) and
/// returns the stored object, status included.
pub(super) async fn apply_body<K>(
    api: &Api<K>,
    name: &str,
    body: &serde_json::Value,
) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
{
    api.patch(
        name,
        &PatchParams::apply(HUB_FIELD_MANAGER).force(),
        &Patch::Apply(body),
    )
    .await
    .map_err(|source| Error::Kube {
        action: format!("apply {} {name}", K::kind(&())),
        source,
    })
}

/// Deletes this Federation's labelled objects of kind `K` that are not in `desired` (names)
/// and that it owns (an owner reference with its uid), so nothing else is ever pruned. They are
/// found in `cached` (the controller's reflector of what the hub applied), not by listing.
pub(super) async fn prune<K>(
    client: &Client,
    cached: &Store<K>,
    fed: &Federation,
    desired: &BTreeSet<String>,
) -> Result<Vec<String>, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + 'static,
{
    let namespace = fed.namespace().unwrap_or_default();
    let uid = fed.uid().unwrap_or_default();
    let name = fed.name_any();
    let kind = K::kind(&());
    let orphans: Vec<String> = cached
        .state()
        .iter()
        .filter(|o| o.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|o| {
            let labels = o.labels();
            labels
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str)
                == Some(MANAGED_BY)
                && labels.get(APPLIED_BY_LABEL).map(String::as_str) == Some(HUB_FIELD_MANAGER)
                && labels.get(INSTANCE_LABEL) == Some(&name)
        })
        .filter(|o| o.owner_references().iter().any(|r| r.uid == uid))
        .map(|o| o.name_any())
        .filter(|n| !desired.contains(n))
        .collect();
    let api = Api::<K>::namespaced(client.clone(), &namespace);
    let mut pruned = Vec::new();
    for object in orphans {
        match api.delete(&object, &DeleteParams::background()).await {
            Ok(_) => {
                tracing::info!(%kind, %namespace, name = %object, "pruned");
                pruned.push(format!("{kind} {object}"));
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => {
                return Err(Error::Kube {
                    action: format!("delete {kind} {namespace}/{object}"),
                    source,
                });
            }
        }
    }
    Ok(pruned)
}

/// Server-side applies `status` to the status subresource of `K` `namespace/name` under
/// [`HUB_FIELD_MANAGER`] (callers skip it when the status did not change).
pub(super) async fn patch_status<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    status: &impl Serialize,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    Api::<K>::namespaced(client.clone(), namespace)
        .patch_status(
            name,
            &PatchParams::apply(HUB_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| Error::Kube {
            action: format!("patch status of {} {name}", K::kind(&())),
            source,
        })?;
    Ok(())
}

/// The event recorder of the hub's controllers (reporting controller [`HUB_FIELD_MANAGER`],
/// instance the pod name when known).
pub fn recorder(client: Client) -> kube::runtime::events::Recorder {
    kube::runtime::events::Recorder::new(
        client,
        kube::runtime::events::Reporter {
            controller: HUB_FIELD_MANAGER.to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        },
    )
}

/// Publishes an event about `object` (note cut to 1,000 characters); a failure is logged at
/// debug and otherwise ignored (events are best effort).
pub async fn publish<K: Resource<DynamicType = ()>>(
    recorder: &kube::runtime::events::Recorder,
    object: &K,
    type_: kube::runtime::events::EventType,
    action: &str,
    reason: &str,
    note: String,
) {
    let event = kube::runtime::events::Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note.chars().take(1000).collect()),
        action: action.to_owned(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &object.object_ref(&())).await {
        tracing::debug!(%error, "event not published");
    }
}

//! A FlowerRun's writes: its status (server-side apply under the hub's field manager,
//! conditional on the resourceVersion it was computed from), its finalizer (JSON patches that
//! test what they change, as kube-runtime's `finalizer` does) and its deletion.
use flower_addon_crds::RUN_FINALIZER;
use flower_addon_crds::run::{FlowerRun, FlowerRunStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::super::{Error, HUB_FIELD_MANAGER, Result};

/// What a write met.
pub(super) enum Written {
    /// Stored: the object as the apiserver now holds it.
    Stored(Box<FlowerRun>),
    /// The object changed since it was read (a cache behind the apiserver, a user's edit):
    /// nothing was written.
    Stale,
}

/// Server-side applies `status` to the status subresource of `run`. With `read_at` (the
/// resourceVersion the status was computed from) the apiserver refuses it when the object
/// changed since: a reconcile on a stale cache never overwrites a newer status.
pub(super) async fn write_status(
    client: &Client,
    run: &FlowerRun,
    status: &FlowerRunStatus,
    read_at: Option<&str>,
) -> Result<Written> {
    let name = run.name_any();
    let mut body = json!({
        "apiVersion": FlowerRun::api_version(&()),
        "kind": FlowerRun::kind(&()),
        "status": status,
    });
    if let Some(version) = read_at {
        body["metadata"] = json!({"resourceVersion": version});
    }
    let written = api(client, run)
        .patch_status(
            &name,
            &PatchParams::apply(HUB_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await;
    outcome(written, false, || {
        format!("patch status of FlowerRun {name}")
    })
}

/// Adds [`RUN_FINALIZER`] to `run`'s finalizers as read.
pub(super) async fn add_finalizer(client: &Client, run: &FlowerRun) -> Result<Written> {
    let patch = if run.finalizers().is_empty() {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [RUN_FINALIZER]},
        ])
    } else {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": run.finalizers()},
            {"op": "add", "path": "/metadata/finalizers/-", "value": RUN_FINALIZER},
        ])
    };
    json_patch(client, run, patch, "add the finalizer to").await
}

/// Removes [`RUN_FINALIZER`] from `run` (nothing to do when it is not there).
pub(super) async fn remove_finalizer(client: &Client, run: &FlowerRun) -> Result<Written> {
    let Some(index) = run.finalizers().iter().position(|f| f == RUN_FINALIZER) else {
        return Ok(Written::Stored(Box::new(run.clone())));
    };
    let path = format!("/metadata/finalizers/{index}");
    let patch = json!([
        {"op": "test", "path": path, "value": RUN_FINALIZER},
        {"op": "remove", "path": path},
    ]);
    json_patch(client, run, patch, "remove the finalizer from").await
}

/// Deletes `run` (this object: its uid is a precondition); one already gone is success.
pub(super) async fn delete(client: &Client, run: &FlowerRun) -> Result<()> {
    let name = run.name_any();
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: run.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api(client, run).delete(&name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(source) => Err(Error::Kube {
            action: format!("delete FlowerRun {name}"),
            source,
        }),
    }
}

fn api(client: &Client, run: &FlowerRun) -> Api<FlowerRun> {
    Api::namespaced(client.clone(), &run.namespace().unwrap_or_default())
}

async fn json_patch(
    client: &Client,
    run: &FlowerRun,
    patch: serde_json::Value,
    what: &str,
) -> Result<Written> {
    let name = run.name_any();
    let action = || format!("{what} FlowerRun {name}");
    let patch = serde_json::from_value(patch).map_err(|source| Error::Serialize {
        what: action(),
        source,
    })?;
    let params = PatchParams {
        field_manager: Some(HUB_FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let written = api(client, run)
        .patch(&name, &params, &Patch::<()>::Json(patch))
        .await;
    outcome(written, true, action)
}

/// A write's outcome: stored, stale (409 Conflict; for a JSON patch, 422 saying its `test`
/// failed — a 422 about anything else, an invalid object, is an error), or an error.
fn outcome(
    written: Result<FlowerRun, kube::Error>,
    json_patch: bool,
    action: impl FnOnce() -> String,
) -> Result<Written> {
    match written {
        Ok(object) => Ok(Written::Stored(Box::new(object))),
        Err(kube::Error::Api(status))
            if status.code == 409
                || (json_patch && status.code == 422 && status.message.contains("test failed")) =>
        {
            Ok(Written::Stale)
        }
        Err(source) => Err(Error::Kube {
            action: action(),
            source,
        }),
    }
}

//! A mocked API server that keeps objects: GETs answer what is stored, status applies replace
//! the status (refused with 409 when they carry a resourceVersion that is not the stored one),
//! JSON patches are applied with their `test`s (a failed test is a 422), deletes of objects with
//! finalizers only set `deletionTimestamp` (the object goes when its last finalizer does), and
//! every change bumps the resourceVersion. Each request is written to a journal (`api: …`) the
//! test may share with other stand-ins, to assert what happened before what.
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response};
use kube::client::Body;
use serde_json::{Value, json};

/// `(plural, namespace, name)`.
type Key = (String, String, String);

/// The stored objects.
#[derive(Default)]
pub struct Objects {
    objects: BTreeMap<Key, Value>,
    version: u64,
}

impl Objects {
    /// Stores `object` (its kind's plural is its lower-case kind + `s`), with a new
    /// resourceVersion and, when it has none, a uid.
    pub fn put(&mut self, mut object: Value) {
        let plural = format!(
            "{}s",
            object["kind"].as_str().unwrap_or_default().to_lowercase()
        );
        let meta = &object["metadata"];
        let key = (
            plural,
            meta["namespace"].as_str().unwrap_or_default().to_owned(),
            meta["name"].as_str().unwrap_or_default().to_owned(),
        );
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(format!("uid-{}", key.2));
        }
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.objects.insert(key, object);
    }

    /// The stored object, if any.
    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        self.objects
            .get(&(plural.into(), namespace.into(), name.into()))
            .cloned()
    }

    /// Removes an object (someone else deleted it).
    pub fn remove(&mut self, plural: &str, namespace: &str, name: &str) {
        self.objects
            .remove(&(plural.into(), namespace.into(), name.into()));
    }

    fn bump(&mut self, key: &Key) {
        self.version += 1;
        if let Some(object) = self.objects.get_mut(key) {
            object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        }
    }
}

/// Shared objects and journal.
pub type Shared = Arc<Mutex<Objects>>;
/// What happened, in order, across the stand-ins of a test.
pub type Journal = Arc<Mutex<Vec<String>>>;

/// A client of an API server holding `objects`, writing each request into `journal`.
pub fn objects_client(objects: Vec<Value>, journal: Journal) -> (kube::Client, Shared) {
    let shared: Shared = Arc::default();
    for object in objects {
        shared.lock().expect("objects").put(object);
    }
    let state = shared.clone();
    let service = tower::service_fn(move |req: Request<Body>| {
        let (state, journal) = (state.clone(), journal.clone());
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let content_type = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let (status, reply) = answer(
                &mut state.lock().expect("objects"),
                &journal,
                &parts.method,
                parts.uri.path(),
                &content_type,
                body,
            );
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&reply).expect("json")))
                    .expect("response"),
            )
        }
    });
    (kube::Client::new(service, "default"), shared)
}

fn failure(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": message}),
    )
}

fn answer(
    objects: &mut Objects,
    journal: &Journal,
    method: &Method,
    path: &str,
    content_type: &str,
    body: Value,
) -> (u16, Value) {
    let note = |line: String| {
        journal
            .lock()
            .expect("journal")
            .push(format!("api: {line}"))
    };
    let segments: Vec<&str> = path.split('/').collect();
    let Some(at) = segments.iter().position(|s| *s == "namespaces") else {
        return failure(404, "NotFound", "cluster-scoped paths are not served");
    };
    let rest = &segments[at + 1..];
    let (namespace, plural) = (rest.first().copied(), rest.get(1).copied());
    let (Some(namespace), Some(plural)) = (namespace, plural) else {
        return failure(404, "NotFound", "no such path");
    };
    let Some(name) = rest.get(2).copied() else {
        // A collection: events are created (and echoed); nothing else is asked for.
        if plural == "events" {
            note(format!(
                "event {}",
                body["reason"].as_str().unwrap_or_default()
            ));
        } else {
            note(format!("{method} {plural}"));
        }
        return (201, body);
    };
    let key: Key = (plural.into(), namespace.into(), name.into());
    let subresource = rest.get(3).copied();
    if plural == "events" {
        note(format!("event {name}"));
        return (200, body);
    }
    match (method.clone(), subresource) {
        (Method::GET, None) => {
            note(format!("get {plural}/{name}"));
            match objects.objects.get(&key) {
                Some(object) => (200, object.clone()),
                None => failure(404, "NotFound", &format!("{plural} \"{name}\" not found")),
            }
        }
        (Method::PATCH, Some("status")) => {
            let pending = !body["status"]["pendingSubmission"].is_null();
            note(format!(
                "status {name}{}",
                if pending { " pendingSubmission" } else { "" }
            ));
            assert!(
                content_type.starts_with("application/apply-patch"),
                "a status write that is not a server-side apply: {content_type}"
            );
            let Some(object) = objects.objects.get_mut(&key) else {
                return failure(404, "NotFound", "not found");
            };
            if let Some(version) = body["metadata"]["resourceVersion"].as_str()
                && object["metadata"]["resourceVersion"] != version
            {
                return failure(
                    409,
                    "Conflict",
                    "the object has been modified; please apply your changes to the latest version and try again",
                );
            }
            object["status"] = body["status"].clone();
            objects.bump(&key);
            (200, objects.objects[&key].clone())
        }
        (Method::PATCH, None) if content_type.starts_with("application/json-patch") => {
            note(format!("patch {name} {body}"));
            let Some(object) = objects.objects.get(&key) else {
                return failure(404, "NotFound", "not found");
            };
            let mut patched = object.clone();
            for op in body.as_array().into_iter().flatten() {
                if let Err(why) = apply_op(&mut patched, op) {
                    return failure(422, "Invalid", &why);
                }
            }
            let emptied = patched["metadata"]["finalizers"]
                .as_array()
                .is_none_or(Vec::is_empty);
            if emptied && !patched["metadata"]["deletionTimestamp"].is_null() {
                objects.objects.remove(&key);
                return (200, patched);
            }
            objects.objects.insert(key.clone(), patched);
            objects.bump(&key);
            (200, objects.objects[&key].clone())
        }
        (Method::DELETE, None) => {
            note(format!("delete {plural}/{name}"));
            let Some(object) = objects.objects.get_mut(&key) else {
                return failure(404, "NotFound", "not found");
            };
            if let Some(uid) = body["preconditions"]["uid"].as_str()
                && object["metadata"]["uid"] != uid
            {
                return failure(409, "Conflict", "Precondition failed: UID");
            }
            if object["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty())
            {
                object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                objects.bump(&key);
                return (200, objects.objects[&key].clone());
            }
            let gone = objects.objects.remove(&key).unwrap_or_default();
            (200, gone)
        }
        (method, sub) => {
            note(format!("{method} {plural}/{name} {sub:?}"));
            failure(405, "MethodNotAllowed", "not served by this mock")
        }
    }
}

/// One JSON patch operation (`test`, `add`, `remove`) on `doc`.
fn apply_op(doc: &mut Value, op: &Value) -> Result<(), String> {
    let path = op["path"].as_str().unwrap_or_default();
    let (parent, last) = path.rsplit_once('/').unwrap_or(("", path));
    match op["op"].as_str().unwrap_or_default() {
        "test" => {
            let found = doc.pointer(path).cloned().unwrap_or(Value::Null);
            if found == op["value"] {
                Ok(())
            } else {
                Err(format!(
                    "testing value {path} failed: test failed ({found} is not {})",
                    op["value"]
                ))
            }
        }
        "add" => match doc.pointer_mut(parent) {
            Some(Value::Array(items)) if last == "-" => {
                items.push(op["value"].clone());
                Ok(())
            }
            Some(Value::Object(map)) => {
                map.insert(last.to_owned(), op["value"].clone());
                Ok(())
            }
            other => Err(format!("add {path}: no parent ({other:?})")),
        },
        "remove" => match doc.pointer_mut(parent) {
            Some(Value::Array(items)) => {
                let index: usize = last.parse().map_err(|_| format!("remove {path}"))?;
                if index >= items.len() {
                    return Err(format!("remove {path}: out of range"));
                }
                items.remove(index);
                Ok(())
            }
            Some(Value::Object(map)) => map
                .remove(last)
                .map(|_| ())
                .ok_or_else(|| format!("remove {path}: missing")),
            other => Err(format!("remove {path}: no parent ({other:?})")),
        },
        other => Err(format!("op {other} not served by this mock")),
    }
}

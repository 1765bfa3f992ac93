//! A mocked API server for reconciler tests: records every request, answers like an empty
//! cluster that accepts every write.
#![allow(dead_code)]
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response};
use kube::client::Body;
use serde_json::{Value, json};

/// One request the reconciler made.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub body: Value,
}

impl Call {
    /// `METHOD /path`.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// A write of an Event (recorded in the background, best effort: not part of what a
    /// reconcile applies, and not ordered with it).
    #[allow(dead_code)]
    pub fn is_event(&self) -> bool {
        self.path.contains("/events")
    }
}

/// Plural resource names whose bare collection path is a LIST.
const COLLECTIONS: &[&str] = &[
    "statefulsets",
    "daemonsets",
    "services",
    "secrets",
    "events",
    "placements",
    "placementdecisions",
];

/// A client whose API answers like an empty cluster that accepts every write: applies and
/// creates echo the object back, a status patch returns the object of that kind in `stored`
/// with the patched status, LISTs are empty, GETs are 404.
pub fn mock_client(stored: Vec<Value>) -> (kube::Client, Arc<Mutex<Vec<Call>>>) {
    mock_client_refusing(stored, None)
}

/// As [`mock_client`], but every write (PATCH, POST, PUT) whose path contains `refused` is
/// answered 403 Forbidden, as an apiserver would under RBAC that lacks the permission.
pub fn mock_client_refusing(
    stored: Vec<Value>,
    refused: Option<&'static str>,
) -> (kube::Client, Arc<Mutex<Vec<Call>>>) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let log = calls.clone();
    let service = tower::service_fn(move |req: Request<Body>| {
        let log = log.clone();
        let stored = stored.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let path = parts.uri.path().to_owned();
            let query = parts.uri.query().unwrap_or_default().to_owned();
            let last = path.rsplit('/').next().unwrap_or_default().to_owned();
            log.lock().expect("log").push(Call {
                method: parts.method.clone(),
                path: path.clone(),
                query,
                body: body.clone(),
            });
            let write = matches!(parts.method, Method::PATCH | Method::POST | Method::PUT);
            let (status, reply) = match parts.method {
                _ if write && refused.is_some_and(|r| path.contains(r)) => (
                    403,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": format!("forbidden: cannot write {path}")}),
                ),
                Method::GET if COLLECTIONS.contains(&last.as_str()) => (
                    200,
                    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": []}),
                ),
                Method::GET => (
                    404,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
                ),
                Method::PATCH if path.ends_with("/status") => {
                    let name = path.rsplit('/').nth(1).unwrap_or_default();
                    let mut object = stored
                        .iter()
                        .find(|o| o["kind"] == body["kind"])
                        .cloned()
                        .unwrap_or_else(|| {
                            json!({"apiVersion": body["apiVersion"], "kind": body["kind"], "metadata": {"name": name}, "spec": {}})
                        });
                    object["status"] = body["status"].clone();
                    (200, object)
                }
                _ => {
                    let mut echoed = body;
                    if let Some(meta) = echoed.get_mut("metadata").and_then(Value::as_object_mut) {
                        meta.insert("uid".into(), json!("uid-1"));
                        meta.insert("resourceVersion".into(), json!("2"));
                    }
                    (200, echoed)
                }
            };
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&reply).expect("json")))
                    .expect("response"),
            )
        }
    });
    (kube::Client::new(service, "default"), calls)
}
pub mod objects;

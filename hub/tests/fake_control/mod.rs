//! A stand-in for a unified-dialect SuperLink's Control API (`POST /v1/control/<method>`,
//! protobuf bodies, over TLS with the SuperLink's certificate): enough of `register-node`,
//! `unregister-node` and `list-nodes` for tests of the hub's key registration, and of
//! `start-run`, `list-runs`, `stop-run` and `stream-logs` for tests of its FlowerRuns, without
//! Flower. The test moves runs along itself ([`Runs`]) and reads the methods called, in order,
//! in a [`Journal`] it may share with other stand-ins.
#![allow(dead_code)]
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use flower_addon_crds::render::FlowerDialect;
use flower_addon_hub::flower::control::ControlEndpoint;
use flower_addon_hub::registration::ca::{FederationCa, HubCa};
use flower_addon_proto::flwr::{
    ListNodesResponse, ListRunsResponse, NodeInfo, RegisterNodeRequest, RegisterNodeResponse, Run,
    RunStatus, StartRunRequest, StartRunResponse, StopRunRequest, StopRunResponse,
    StreamLogsRequest, StreamLogsResponse, UnregisterNodeRequest, UnregisterNodeResponse,
};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use prost::Message;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Registered public keys (PEM) by node id.
pub type Nodes = Arc<Mutex<BTreeMap<u64, Vec<u8>>>>;

/// What happened, in order, across the stand-ins of a test (`control: start-run`, …).
pub type Journal = Arc<Mutex<Vec<String>>>;

/// The runs the stand-in holds; the test sets their status and log lines.
#[derive(Default)]
pub struct Runs {
    /// By run id.
    pub runs: BTreeMap<u64, Run>,
    /// Log lines by run id, each with its timestamp.
    pub logs: BTreeMap<u64, Vec<(String, f64)>>,
}

impl Runs {
    /// Sets run `id`'s status (`running`, `finished:completed`, …).
    pub fn set_status(&mut self, id: u64, status: &str) {
        let (status, sub) = status.split_once(':').unwrap_or((status, ""));
        if let Some(run) = self.runs.get_mut(&id) {
            run.status = Some(RunStatus {
                status: status.into(),
                sub_status: sub.into(),
                details: String::new(),
            });
        }
    }

    /// Adds a line to run `id`'s log.
    pub fn log(&mut self, id: u64, line: &str) {
        let lines = self.logs.entry(id).or_default();
        let at = 1_000.0 + lines.len() as f64;
        lines.push((line.to_owned(), at));
    }

    /// Run ids, oldest first.
    pub fn ids(&self) -> Vec<u64> {
        self.runs.keys().copied().collect()
    }
}

/// The state of a stand-in: its nodes, its runs and the journal of calls.
#[derive(Clone, Default)]
pub struct Fake {
    /// Registered public keys by node id.
    pub nodes: Nodes,
    /// Runs and their logs.
    pub runs: Arc<Mutex<Runs>>,
    /// Every method called, as `control: <method>`.
    pub journal: Journal,
    /// While set, writes (`register-node`, `unregister-node`) fail as Flower fails them on a
    /// full database: HTTP 500 "Internal server error" (the cause only in its log).
    pub full: Arc<std::sync::atomic::AtomicBool>,
    /// While set, `list-nodes` lists every node `online` (else `registered`).
    pub online: Arc<std::sync::atomic::AtomicBool>,
}

impl Fake {
    /// The methods called so far (`start-run`, …), in order.
    pub fn calls(&self) -> Vec<String> {
        self.journal
            .lock()
            .expect("journal")
            .iter()
            .filter_map(|l| l.strip_prefix("control: ").map(str::to_owned))
            .collect()
    }
}

/// A stand-in SuperLink of Federation `team/fed` on a free loopback port.
pub struct StandIn {
    /// The Federation CA its certificate is from.
    pub ca: Arc<FederationCa>,
    /// Holds its certificate and key files (and whatever else the test puts there).
    pub dir: tempfile::TempDir,
    /// Its state.
    pub fake: Fake,
    /// How the hub reaches it (unified dialect, TLS verified with the Federation's CA bundle).
    pub endpoint: ControlEndpoint,
}

/// Starts a [`StandIn`] serving `fake`, with a certificate for 127.0.0.1 from the Federation CA
/// `flower_ca` derives for `team/fed`.
pub async fn stand_in(flower_ca: &HubCa, fake: Fake) -> StandIn {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = flower_ca.federation("team", "fed").expect("Federation CA");
    let pair = ca
        .issue_superlink_cert(
            "fed",
            &["127.0.0.1".into()],
            std::time::Duration::from_secs(3600),
        )
        .expect("cert");
    let dir = tempfile::tempdir().expect("tmp");
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert, &pair.cert_pem).expect("cert file");
    std::fs::write(&key, &pair.key_pem).expect("key file");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("addr").to_string();
    serve_fake(listener, &cert, &key, fake.clone());
    let endpoint = ControlEndpoint {
        dialect: FlowerDialect::Unified,
        address,
        server_name: "127.0.0.1".into(),
        ca_pem: Some(ca.bundle_pem().to_owned()),
        tunnel: None,
    };
    StandIn {
        ca,
        dir,
        fake,
        endpoint,
    }
}

/// Serves the Control API on `listener` with the certificate and key files of a SuperLink;
/// returns the registered nodes and the server task.
pub fn serve(listener: TcpListener, cert: &Path, key: &Path) -> (Nodes, JoinHandle<()>) {
    let fake = Fake::default();
    let task = serve_fake(listener, cert, key, fake.clone());
    (fake.nodes, task)
}

/// Serves the Control API of `fake` on `listener` with the certificate and key files of a
/// SuperLink.
pub fn serve_fake(listener: TcpListener, cert: &Path, key: &Path, fake: Fake) -> JoinHandle<()> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .expect("cert file")
        .collect::<Result<_, _>>()
        .expect("certs");
    let key = PrivateKeyDer::from_pem_file(key).expect("key");
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let state = fake;
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, state) = (acceptor.clone(), state.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(req, &state).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    })
}

async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    fake: &Fake,
) -> hyper::Response<Full<Bytes>> {
    let method = req
        .uri()
        .path()
        .trim_start_matches("/v1/control/")
        .to_owned();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    fake.journal
        .lock()
        .expect("journal")
        .push(format!("control: {method}"));
    if let Some(reply) = answer_runs(&method, body.clone(), fake) {
        return reply;
    }
    let mut nodes = fake.nodes.lock().expect("nodes");
    if fake.full.load(std::sync::atomic::Ordering::SeqCst)
        && matches!(method.as_str(), "register-node" | "unregister-node")
    {
        return json(500, r#"{"detail": "Internal server error"}"#);
    }
    let online = fake.online.load(std::sync::atomic::Ordering::SeqCst);
    let reply = match method.as_str() {
        "register-node" => {
            let request = RegisterNodeRequest::decode(body).expect("RegisterNodeRequest");
            if nodes.values().any(|k| *k == request.public_key) {
                return json(
                    412,
                    r#"{"code": 23, "detail": "Public key already in use."}"#,
                );
            }
            let id = nodes.keys().last().map_or(1, |k| k + 1);
            nodes.insert(id, request.public_key);
            RegisterNodeResponse { node_id: id }.encode_to_vec()
        }
        "unregister-node" => {
            let request = UnregisterNodeRequest::decode(body).expect("UnregisterNodeRequest");
            if nodes.remove(&request.node_id).is_none() {
                return json(404, r#"{"code": 24, "detail": "Node not found."}"#);
            }
            UnregisterNodeResponse {}.encode_to_vec()
        }
        "list-nodes" => ListNodesResponse {
            nodes_info: nodes
                .iter()
                .map(|(id, key)| NodeInfo {
                    node_id: *id,
                    status: if online { "online" } else { "registered" }.into(),
                    public_key: key.clone(),
                    ..NodeInfo::default()
                })
                .collect(),
            now: String::new(),
        }
        .encode_to_vec(),
        other => return json(404, &format!(r#"{{"detail": "no method {other}"}}"#)),
    };
    hyper::Response::builder()
        .header("content-type", "application/protobuf")
        .body(Full::new(Bytes::from(reply)))
        .expect("response")
}

/// The run methods; `None` for the others.
fn answer_runs(method: &str, body: Bytes, fake: &Fake) -> Option<hyper::Response<Full<Bytes>>> {
    let mut runs = fake.runs.lock().expect("runs");
    let reply = match method {
        "start-run" => {
            let request = StartRunRequest::decode(body).expect("StartRunRequest");
            // Flower's run ids are random 64-bit numbers, not counters.
            let id = 7_000_000_001 + 7919 * runs.runs.len() as u64;
            runs.runs.insert(
                id,
                Run {
                    run_id: id,
                    fab_id: "flwrlabs/fedavg".into(),
                    fab_version: "1.0.0".into(),
                    override_config: request.override_config,
                    fab_hash: request.fab.map(|f| f.hash_str).unwrap_or_default(),
                    status: Some(RunStatus {
                        status: "pending".into(),
                        ..RunStatus::default()
                    }),
                    ..Run::default()
                },
            );
            StartRunResponse {
                run_id: Some(id),
                note: None,
            }
            .encode_to_vec()
        }
        "list-runs" => ListRunsResponse {
            run_dict: runs.runs.iter().map(|(k, v)| (*k, v.clone())).collect(),
            now: String::new(),
        }
        .encode_to_vec(),
        "stop-run" => {
            let request = StopRunRequest::decode(body).expect("StopRunRequest");
            let Some(run) = runs.runs.get(&request.run_id) else {
                return Some(json(404, r#"{"detail": "Run not found"}"#));
            };
            if run.status.as_ref().is_some_and(|s| s.status == "finished") {
                return Some(json(
                    400,
                    &format!(
                        r#"{{"detail": "Run ID {} is already finished"}}"#,
                        request.run_id
                    ),
                ));
            }
            runs.set_status(request.run_id, "finished:stopped");
            StopRunResponse { success: true }.encode_to_vec()
        }
        "stream-logs" => {
            // What there is after the timestamp, then the end of the stream (the hub reopens it
            // while the run goes on).
            let request = StreamLogsRequest::decode(body).expect("StreamLogsRequest");
            let mut frames = Vec::new();
            for (line, at) in runs.logs.get(&request.run_id).into_iter().flatten() {
                if *at > request.after_timestamp {
                    let message = StreamLogsResponse {
                        log_output: line.clone(),
                        latest_timestamp: *at,
                    }
                    .encode_to_vec();
                    frames.extend_from_slice(&(message.len() as u32).to_be_bytes());
                    frames.extend_from_slice(&message);
                }
            }
            frames
        }
        _ => return None,
    };
    Some(
        hyper::Response::builder()
            .header("content-type", "application/protobuf")
            .body(Full::new(Bytes::from(reply)))
            .expect("response"),
    )
}

fn json(status: u16, body: &str) -> hyper::Response<Full<Bytes>> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("response")
}

//! A stand-in for a unified-dialect SuperLink's Control API (`POST /v1/control/<method>`,
//! protobuf bodies, over TLS with the SuperLink's certificate): enough of `register-node`,
//! `unregister-node` and `list-nodes` for tests of the hub's key registration without Flower.
#![allow(dead_code)]
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use flower_addon_proto::flwr::{
    ListNodesResponse, NodeInfo, RegisterNodeRequest, RegisterNodeResponse, UnregisterNodeRequest,
    UnregisterNodeResponse,
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

/// Serves the Control API on `listener` with the certificate and key files of a SuperLink;
/// returns the registered nodes and the server task.
pub fn serve(listener: TcpListener, cert: &Path, key: &Path) -> (Nodes, JoinHandle<()>) {
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
    let nodes: Nodes = Arc::new(Mutex::new(BTreeMap::new()));
    let state = nodes.clone();
    let task = tokio::spawn(async move {
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
    });
    (nodes, task)
}

async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    nodes: &Nodes,
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
    let mut nodes = nodes.lock().expect("nodes");
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
                    status: "registered".into(),
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

fn json(status: u16, body: &str) -> hyper::Response<Full<Bytes>> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("response")
}

//! The Fleet front on loopback, in front of a stand-in SuperLink (an HTTPS server that records
//! what reaches it): Fleet requests and `/health` pass with their bodies on one kept-alive
//! connection, Control API requests get 403 and never reach the SuperLink, a client trusting
//! another CA is refused at the handshake, and an insecure front passes plaintext.
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flower_addon_hub::flower::front::{self, FrontConfig, FrontTls};
use flower_addon_hub::registration::ca::{CaRole, HubCa};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use prost::bytes::Bytes;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use tokio::net::{TcpListener, TcpStream};

type Seen = Arc<Mutex<Vec<String>>>;

struct Pki {
    ca: String,
    cert: String,
    key: String,
}

fn pki() -> Pki {
    let ca = HubCa::generate_for(CaRole::Flower)
        .unwrap()
        .federation("default", "f")
        .unwrap();
    let issued = ca
        .issue_superlink_cert(
            "f",
            &["127.0.0.1".into(), "localhost".into()],
            Duration::from_secs(3600),
        )
        .unwrap();
    Pki {
        ca: ca.cert_pem().to_owned(),
        cert: issued.cert_pem,
        key: issued.key_pem,
    }
}

/// A stand-in SuperLink: answers every request `<path> <body length>` and records the path.
async fn superlink(tls: Option<&Pki>) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let seen: Seen = Arc::default();
    let acceptor = tls.map(|p| {
        let chain = CertificateDer::pem_slice_iter(p.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(p.key.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    });
    let recorded = seen.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, seen) = (acceptor.clone(), recorded.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        seen.lock().unwrap().push(path.clone());
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                            "{path} {}",
                            body.len()
                        )))))
                    }
                });
                let builder = hyper::server::conn::http1::Builder::new();
                match acceptor {
                    Some(a) => {
                        let tls = a.accept(tcp).await.unwrap();
                        let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                    }
                    None => {
                        let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
                    }
                }
            });
        }
    });
    (address, seen)
}

async fn start_front(upstream: String, tls: Option<FrontTls>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(front::serve(
        listener,
        FrontConfig { upstream, tls },
        std::future::pending(),
    ));
    address
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

/// One HTTP/1.1 connection to the front (TLS trusting `ca` when given).
async fn connect(
    address: &str,
    ca: Option<&str>,
) -> std::io::Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>> {
    let tcp = TcpStream::connect(address).await?;
    let io: Box<dyn Io> = match ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots.add(c.unwrap()).unwrap();
            }
            let config = rustls::ClientConfig::builder()
                .with_root_certificates(roots)
                .with_no_client_auth();
            Box::new(
                tokio_rustls::TlsConnector::from(Arc::new(config))
                    .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
                    .await?,
            )
        }
        None => Box::new(tcp),
    };
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn post(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
    body: &'static str,
) -> (u16, String) {
    sender.ready().await.unwrap();
    let request = Request::post(path)
        .header("host", "superlink")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn fleet_requests_pass_and_control_requests_are_refused() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = pki();
    let (upstream, seen) = superlink(Some(&pki)).await;
    let tls = FrontTls::from_pem(&pki.ca, &pki.cert, &pki.key, "127.0.0.1").unwrap();
    let address = start_front(upstream, Some(tls)).await;

    let mut sender = connect(&address, Some(&pki.ca)).await.unwrap();
    assert_eq!(
        post(&mut sender, "/v1/fleet/pull-messages", "abc").await,
        (200, "/v1/fleet/pull-messages 3".into())
    );
    let (status, text) = post(&mut sender, "/v1/control/start-run", "fab").await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("Fleet API"), "{text}");
    let (status, _) = post(&mut sender, "/v1/fleet/../control/list-nodes", "").await;
    assert_eq!(status, 403);
    // The same connection still serves Fleet requests after a refusal.
    assert_eq!(
        post(&mut sender, "/v1/fleet/activate-node", "12345").await,
        (200, "/v1/fleet/activate-node 5".into())
    );
    assert_eq!(
        post(&mut sender, "/health", "").await,
        (200, "/health 0".into())
    );
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "/v1/fleet/pull-messages",
            "/v1/fleet/activate-node",
            "/health"
        ],
        "only Fleet requests and /health reach the SuperLink"
    );

    // A client that trusts another CA does not get through the handshake.
    let other = HubCa::generate_for(CaRole::Flower).unwrap();
    assert!(connect(&address, Some(other.cert_pem())).await.is_err());
}

#[tokio::test]
async fn an_insecure_front_passes_plaintext_fleet_requests_only() {
    let (upstream, seen) = superlink(None).await;
    let address = start_front(upstream, None).await;
    let mut sender = connect(&address, None).await.unwrap();
    assert_eq!(
        post(&mut sender, "/v1/fleet/push-messages", "xy").await,
        (200, "/v1/fleet/push-messages 2".into())
    );
    assert_eq!(post(&mut sender, "/v1/control/list-runs", "").await.0, 403);
    assert_eq!(*seen.lock().unwrap(), ["/v1/fleet/push-messages"]);
}

#[tokio::test]
async fn an_unreachable_superlink_is_a_bad_gateway() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = closed.local_addr().unwrap().to_string();
    drop(closed);
    let address = start_front(upstream, None).await;
    let mut sender = connect(&address, None).await.unwrap();
    assert_eq!(
        post(&mut sender, "/v1/fleet/pull-messages", "").await.0,
        502
    );
}

/// A stand-in SuperLink that refuses every `ActivateNode` with `code` (HTTP 412, as Flower
/// 1.42 does) and answers every other request 200.
async fn refusing_superlink(code: i64) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<Incoming>| async move {
                        let path = req.uri().path().to_owned();
                        let _ = req.into_body().collect().await;
                        let mut response =
                            Response::new(Full::new(Bytes::from(format!("{path} ok"))));
                        if path == "/v1/fleet/activate-node" {
                            *response.body_mut() = Full::new(Bytes::from(format!(
                                r#"{{"code": {code}, "detail": "Failed to activate SuperNode."}}"#
                            )));
                            *response.status_mut() = hyper::StatusCode::PRECONDITION_FAILED;
                        }
                        Ok::<_, Infallible>(response)
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    address
}

async fn post_as(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
    key: &str,
) -> (u16, Option<String>, String) {
    sender.ready().await.unwrap();
    let request = Request::post(path)
        .header("host", "superlink")
        .header("flwr-public-key", key)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        retry_after,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test]
async fn a_supernode_back_before_its_old_session_ended_is_told_to_retry() {
    // Invariant: Flower's activation refusal (412, code 2004) of a key whose requests the
    // SuperLink accepted a moment ago becomes 503 + Retry-After (the SuperNode retries by itself
    // instead of exiting into a crash loop); the refusal of a key never seen passes as Flower
    // gave it, and so does any other refusal; the connection serves on after each.
    let address = start_front(refusing_superlink(2004).await, None).await;
    let mut sender = connect(&address, None).await.unwrap();
    let (status, _, _) = post_as(&mut sender, "/v1/fleet/send-node-heartbeat", "known").await;
    assert_eq!(status, 200);
    let (status, retry_after, text) =
        post_as(&mut sender, "/v1/fleet/activate-node", "known").await;
    assert_eq!((status, retry_after.as_deref()), (503, Some("5")), "{text}");
    assert!(text.contains("previous session is still held"), "{text}");
    let (status, retry_after, text) =
        post_as(&mut sender, "/v1/fleet/activate-node", "stranger").await;
    assert_eq!((status, retry_after), (412, None));
    assert!(
        text.contains(r#""code": 2004"#),
        "Flower's body passes: {text}"
    );
    let (status, _, _) = post_as(&mut sender, "/v1/fleet/pull-messages", "stranger").await;
    assert_eq!(status, 200, "the connection serves on");

    // Another refusal of a known key is not reinterpreted.
    let address = start_front(refusing_superlink(2003).await, None).await;
    let mut sender = connect(&address, None).await.unwrap();
    assert_eq!(
        post_as(&mut sender, "/v1/fleet/pull-messages", "known")
            .await
            .0,
        200
    );
    let (status, retry_after, text) =
        post_as(&mut sender, "/v1/fleet/activate-node", "known").await;
    assert_eq!((status, retry_after), (412, None));
    assert!(text.contains(r#""code": 2003"#), "{text}");
}

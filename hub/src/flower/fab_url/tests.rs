//! Downloads from servers on 127.0.0.1 (plain and TLS), the limits, the error kinds and the
//! cache. Nothing here reaches another address.
use super::cache::{CACHE_ENTRIES, CacheState, Done};
use super::egress::Egress;
use super::target::{Target, TargetError};
use super::*;
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::StreamBody;
use http_body_util::combinators::BoxBody;
use hyper::body::Frame;
use proptest::prelude::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use crate::flower::runs::{self, ConfigMapSource, FabBytes};
use crate::registration::ca::HubCa;
use flower_addon_crds::run::FabSource;

/// What the test server answers on a path.
#[derive(Clone)]
enum Reply {
    /// 200 with the bytes (and their Content-Length).
    File(Vec<u8>),
    /// 200, chunked (no Content-Length), `count` chunks of `size` zero bytes.
    Chunked { size: usize, count: usize },
    /// 200 claiming this Content-Length, then never sending a byte.
    Declared(u64),
    /// This status, empty body.
    Status(u16),
    /// 302 to this Location.
    Redirect(String),
}

/// A server on 127.0.0.1 answering `routes` (404 elsewhere); stops with the test's runtime.
struct Server {
    /// `http://127.0.0.1:PORT` (or https).
    base: String,
    /// Requests answered.
    hits: Arc<AtomicUsize>,
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn port(&self) -> u16 {
        self.base
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port")
    }
}

async fn serve(routes: Vec<(&str, Reply)>) -> Server {
    serve_with(routes, None).await
}

async fn serve_with(routes: Vec<(&str, Reply)>, tls: Option<Arc<rustls::ServerConfig>>) -> Server {
    let routes: Arc<HashMap<String, Reply>> = Arc::new(
        routes
            .into_iter()
            .map(|(path, reply)| (path.to_owned(), reply))
            .collect(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (routes, hits, tls) = (routes.clone(), counted.clone(), tls.clone());
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: http::Request<Incoming>| {
                        hits.fetch_add(1, Ordering::SeqCst);
                        let reply = routes.get(request.uri().path()).cloned();
                        async move { Ok::<_, Infallible>(respond(reply)) }
                    });
                let http = hyper::server::conn::http1::Builder::new();
                let _ = match tls {
                    Some(config) => {
                        let Ok(stream) =
                            tokio_rustls::TlsAcceptor::from(config).accept(stream).await
                        else {
                            return;
                        };
                        http.serve_connection(TokioIo::new(stream), service).await
                    }
                    None => http.serve_connection(TokioIo::new(stream), service).await,
                };
            });
        }
    });
    Server {
        base: format!("{scheme}://127.0.0.1:{port}"),
        hits,
    }
}

fn respond(reply: Option<Reply>) -> http::Response<BoxBody<Bytes, Infallible>> {
    let full = |bytes: Vec<u8>| http_body_util::Full::new(Bytes::from(bytes)).boxed();
    let response = http::Response::builder();
    let response = match reply {
        None => response.status(404).body(full(Vec::new())),
        Some(Reply::File(bytes)) => response
            .header(header::CONTENT_TYPE, "application/zip")
            .body(full(bytes)),
        Some(Reply::Chunked { size, count }) => response.body(
            StreamBody::new(futures::stream::iter(
                (0..count).map(move |_| Ok(Frame::data(Bytes::from(vec![0; size])))),
            ))
            .boxed(),
        ),
        Some(Reply::Declared(length)) => response
            .header(header::CONTENT_LENGTH, length)
            .body(StreamBody::new(futures::stream::pending()).boxed()),
        Some(Reply::Status(status)) => response.status(status).body(full(Vec::new())),
        Some(Reply::Redirect(location)) => response
            .status(302)
            .header(header::LOCATION, location)
            .body(full(Vec::new())),
    };
    response.expect("response")
}

/// A server on 127.0.0.1 that accepts connections and never answers.
async fn silent() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    format!("http://127.0.0.1:{port}/app.fab")
}

/// The FAB of examples/fedavg and its SHA-256.
fn fedavg() -> (Vec<u8>, String) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/fedavg");
    let fab = fab::build_from_dir(&dir).expect("build the FAB");
    (fab.bytes, fab.hash)
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Limits whose timeouts keep a failing test short.
/// Short limits, and the test servers' loopback address allowed (the default refuses it).
fn quick() -> DownloadLimits {
    DownloadLimits {
        timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        egress: loopback(),
        ..DownloadLimits::default()
    }
}

/// Egress that allows 127.0.0.1 (where the test servers listen) and nothing else beyond the
/// default.
fn loopback() -> Egress {
    Egress::allowing(&["127.0.0.1".into()]).expect("egress")
}

/// A CA, a TLS server configuration with a certificate for 127.0.0.1 from it, and a client
/// configuration trusting it.
fn tls_pair() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    let ca = HubCa::generate().expect("CA");
    let issued = ca
        .issue_server_cert(&[], Duration::from_secs(3600))
        .expect("certificate");
    let cert = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).expect("cert PEM");
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).expect("key PEM");
    let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .expect("server config");
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der().clone()).expect("CA root");
    (
        Arc::new(server),
        client_config(roots).expect("client config"),
    )
}

#[tokio::test]
async fn a_fab_whose_hash_matches_is_downloaded() {
    // Invariant: a 200 with the FAB the spec's sha256 names yields exactly its bytes.
    let (bytes, hash) = fedavg();
    let server = serve(vec![("/app.fab", Reply::File(bytes.clone()))]).await;
    let got = download(&server.url("/app.fab"), Some(&hash), &quick())
        .await
        .expect("download");
    assert_eq!(got, bytes);
    assert_eq!(server.hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_hash_mismatch_is_permanent_and_names_both_hashes_and_the_fix() {
    // Invariant: other bytes than the spec pins fail the run, saying what was got and wanted.
    let (bytes, hash) = fedavg();
    let server = serve(vec![("/app.fab", Reply::File(bytes.clone()))]).await;
    let want = "0".repeat(64);
    let e = download(&server.url("/app.fab"), Some(&want), &quick())
        .await
        .expect_err("mismatch");
    assert!(matches!(e, UrlError::HashMismatch { .. }), "{e:?}");
    assert!(!e.is_transient());
    let message = e.to_string();
    assert!(
        message.starts_with("spec.app.fab.sha256: the file at http://127.0.0.1:"),
        "{message}"
    );
    assert!(
        message.contains(&format!(
            "({} bytes, application/zip) has SHA-256 {hash}",
            bytes.len()
        )),
        "{message}"
    );
    assert!(
        message.contains(&format!("the spec wants {want}")),
        "{message}"
    );
    assert!(
        message.contains(&format!("again with sha256 {hash}")),
        "{message}"
    );
}

#[tokio::test]
async fn a_content_length_over_10_mib_is_refused_before_the_body() {
    // Invariant: a declared size over Flower's limit is refused from the headers alone (the
    // server here never sends the body, so reading it would time out).
    let size = FAB_MAX_SIZE as u64 + 1;
    let server = serve(vec![("/big.fab", Reply::Declared(size))]).await;
    let limits = DownloadLimits {
        timeout: Duration::from_secs(2),
        egress: loopback(),
        ..DownloadLimits::default()
    };
    let e = download(&server.url("/big.fab"), None, &limits)
        .await
        .expect_err("too large");
    assert!(
        matches!(e, UrlError::TooLarge { size: s, declared: true, .. } if s == size),
        "{e:?}"
    );
    assert!(!e.is_transient());
    assert!(
        e.to_string().contains(&format!(
            "is {size} bytes (its Content-Length); a FAB may be at most 10485760 bytes"
        )),
        "{e}"
    );
}

#[tokio::test]
async fn a_chunked_body_over_10_mib_is_refused_while_streaming() {
    // Invariant: without a Content-Length the body is cut off once it passes the limit; it is
    // never read whole.
    let chunk = 64 * 1024;
    let server = serve(vec![(
        "/big.fab",
        Reply::Chunked {
            size: chunk,
            count: FAB_MAX_SIZE / chunk + 40,
        },
    )])
    .await;
    let limits = DownloadLimits {
        timeout: Duration::from_secs(5),
        egress: loopback(),
        ..DownloadLimits::default()
    };
    let e = download(&server.url("/big.fab"), None, &limits)
        .await
        .expect_err("too large");
    let UrlError::TooLarge {
        size,
        declared: false,
        max,
        ..
    } = &e
    else {
        panic!("{e:?}")
    };
    let (size, max) = (*size, *max);
    assert_eq!(max, FAB_MAX_SIZE);
    assert!(
        size > FAB_MAX_SIZE as u64 && size <= (FAB_MAX_SIZE + chunk) as u64,
        "{size}"
    );
    assert!(e_message_sent_more(size));
}

fn e_message_sent_more(size: u64) -> bool {
    let e = UrlError::TooLarge {
        url: "http://h/a.fab".into(),
        size,
        declared: false,
        max: FAB_MAX_SIZE,
    };
    e.to_string()
        .starts_with("spec.app.fab.url: http://h/a.fab sent more than 10485760 bytes; a FAB may be")
}

#[tokio::test]
async fn client_errors_are_permanent_and_server_errors_transient() {
    // Invariant: 4xx (but 408 and 429) fail the run; 5xx, 408 and 429 let it wait.
    let server = serve(vec![
        ("/503", Reply::Status(503)),
        ("/500", Reply::Status(500)),
        ("/403", Reply::Status(403)),
        ("/429", Reply::Status(429)),
        ("/204", Reply::Status(204)),
    ])
    .await;
    for (path, transient) in [
        ("/missing.fab", false),
        ("/403", false),
        ("/204", false),
        ("/503", true),
        ("/500", true),
        ("/429", true),
    ] {
        let e = download(&server.url(path), None, &quick())
            .await
            .expect_err(path);
        assert!(matches!(e, UrlError::Status { .. }), "{path}: {e:?}");
        assert_eq!(e.is_transient(), transient, "{path}: {e}");
    }
    let e = download(&server.url("/missing.fab"), None, &quick())
        .await
        .expect_err("404");
    assert_eq!(
        e.to_string(),
        format!(
            "spec.app.fab.url: GET {} answered HTTP 404 Not Found: check the URL: nothing is there",
            server.url("/missing.fab")
        )
    );
}

#[tokio::test]
async fn a_refused_connection_is_transient() {
    // Invariant: nothing listening is a server that may come up: the run waits.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    drop(listener);
    let url = format!("http://127.0.0.1:{port}/app.fab");
    let e = download(&url, None, &quick()).await.expect_err("refused");
    assert!(matches!(e, UrlError::Connect { .. }), "{e:?}");
    assert!(e.is_transient());
    assert!(
        e.to_string().starts_with(&format!(
            "spec.app.fab.url: cannot connect to 127.0.0.1:{port} for {url}"
        )),
        "{e}"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_transiently() {
    // Invariant: the total timeout bounds a download whose server accepts and stays silent.
    // (The error names the limit that ended it; how long the machine took is not the claim.)
    let url = silent().await;
    let e = download(&url, None, &quick()).await.expect_err("timeout");
    assert!(
        matches!(
            e,
            UrlError::Timeout {
                what: "downloading",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.is_transient());
    assert_eq!(
        e.to_string(),
        format!(
            "spec.app.fab.url: downloading {url} took longer than 0.5 s: check that the server \
             is up and answers"
        )
    );
}

#[tokio::test]
async fn redirects_are_followed_up_to_five() {
    // Invariant: relative and absolute redirects are followed, five at most.
    let (bytes, hash) = fedavg();
    let server = serve(vec![
        ("/r5", Reply::Redirect("r4".into())),
        ("/r4", Reply::Redirect("/dir/r3".into())),
        ("/dir/r3", Reply::Redirect("../r2?x=1".into())),
        ("/r2", Reply::Redirect("/r1#fragment".into())),
        ("/r1", Reply::Redirect("/app.fab".into())),
        ("/r6", Reply::Redirect("/r5".into())),
        ("/app.fab", Reply::File(bytes.clone())),
    ])
    .await;
    let got = download(&server.url("/r5"), Some(&hash), &quick())
        .await
        .expect("five redirects");
    assert_eq!(got, bytes);
    let e = download(&server.url("/r6"), Some(&hash), &quick())
        .await
        .expect_err("six redirects");
    assert!(
        matches!(e, UrlError::TooManyRedirects { max: 5, .. }),
        "{e:?}"
    );
    assert!(!e.is_transient());
    assert!(
        e.to_string().starts_with(&format!(
            "spec.app.fab.url: {} redirected more than 5 times",
            server.url("/r6")
        )),
        "{e}"
    );
}

#[tokio::test]
async fn loopback_metadata_and_redirects_to_them_are_refused_naming_the_rule_only() {
    // Invariant: by default the hub dials no loopback or link-local address, and a redirect from
    // an allowed server to one is refused at that hop; the message names the rule and the flag
    // but nothing the target answered; refusals are permanent; nothing reached the refused server.
    let (bytes, hash) = fedavg();
    let inner = serve(vec![("/app.fab", Reply::File(bytes.clone()))]).await;
    let default = DownloadLimits {
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        ..DownloadLimits::default()
    };
    for (url, rule) in [
        (inner.url("/app.fab"), "loopback addresses"),
        (
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            "link-local addresses (cloud metadata services)",
        ),
        (
            format!("http://localhost:{}/app.fab", inner.port()),
            "loopback addresses",
        ),
    ] {
        let e = download(&url, Some(&hash), &default).await.expect_err(&url);
        assert!(
            matches!(e, UrlError::Refused { rule: r } if r == rule),
            "{url}: {e:?}"
        );
        assert!(!e.is_transient());
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("spec.app.fab.url: refused: {rule}."))
                && text.contains("--fab-url-allow")
                && !text.contains("127.0.0.1")
                && !text.contains("169.254"),
            "{text}"
        );
    }
    assert_eq!(
        inner.hits.load(Ordering::SeqCst),
        0,
        "a refused server is never dialled"
    );
    // 127.0.0.1 allowed; it redirects to [::1] (loopback, not allowed): refused at that hop.
    let hop = serve(vec![
        (
            "/hop",
            Reply::Redirect(format!("http://[::1]:{}/app.fab", inner.port())),
        ),
        ("/app.fab", Reply::File(bytes.clone())),
    ])
    .await;
    let allowed_first = DownloadLimits {
        egress: Egress::allowing(&["127.0.0.1/32".into()]).expect("egress"),
        ..default
    };
    let e = download(&hop.url("/hop"), Some(&hash), &allowed_first)
        .await
        .expect_err("redirect to loopback");
    assert!(
        matches!(
            e,
            UrlError::Refused {
                rule: "loopback addresses"
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        hop.hits.load(Ordering::SeqCst),
        1,
        "the allowed hop was asked once"
    );
    let got = download(&hop.url("/app.fab"), Some(&hash), &allowed_first)
        .await
        .expect("allowed by the admin");
    assert_eq!(got, bytes);
}

#[tokio::test]
async fn https_is_verified_and_never_redirected_to_http() {
    // Invariant: https checks the server against the trusted roots, and a redirect from https
    // to http is refused for good, even to the right file.
    let (bytes, hash) = fedavg();
    let plain = serve(vec![("/app.fab", Reply::File(bytes.clone()))]).await;
    let (server_tls, client_tls) = tls_pair();
    let secure = serve_with(
        vec![
            ("/app.fab", Reply::File(bytes.clone())),
            ("/down", Reply::Redirect(plain.url("/app.fab"))),
        ],
        Some(server_tls),
    )
    .await;
    assert!(secure.base.starts_with("https://127.0.0.1:"));
    let got = download_with(
        &secure.url("/app.fab"),
        Some(&hash),
        &quick(),
        Some(&client_tls),
    )
    .await
    .expect("https download");
    assert_eq!(got, bytes);
    let e = download_with(
        &secure.url("/down"),
        Some(&hash),
        &quick(),
        Some(&client_tls),
    )
    .await
    .expect_err("https to http");
    assert!(matches!(e, UrlError::InsecureRedirect { .. }), "{e:?}");
    assert!(!e.is_transient());
    assert_eq!(
        plain.hits.load(Ordering::SeqCst),
        0,
        "the http URL is never fetched"
    );
    // A client that trusts another CA refuses the server's certificate.
    let (_, other_client) = tls_pair();
    let e = download_with(
        &secure.url("/app.fab"),
        Some(&hash),
        &quick(),
        Some(&other_client),
    )
    .await
    .expect_err("untrusted");
    assert!(matches!(e, UrlError::Tls { .. }), "{e:?}");
    assert!(e.is_transient());
    assert!(e.to_string().contains("invalid peer certificate"), "{e}");
}

#[tokio::test]
async fn bytes_that_are_not_a_fab_are_permanent() {
    // Invariant: the hash may match and the file still not be a FAB: that fails the run.
    let text = b"<html>not a zip</html>".to_vec();
    let server = serve(vec![("/page", Reply::File(text.clone()))]).await;
    let e = download(&server.url("/page"), Some(&sha(&text)), &quick())
        .await
        .expect_err("not a zip");
    assert!(
        matches!(
            e,
            UrlError::NotFab {
                source: FabError::NotZip { .. },
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!e.is_transient());
    assert!(
        e.to_string().starts_with(&format!(
            "spec.app.fab.url: the file at {} is not a usable FAB: the FAB is not a zip archive",
            server.url("/page")
        )),
        "{e}"
    );
}

#[tokio::test]
async fn urls_and_hashes_the_hub_cannot_use_are_refused_without_a_request() {
    // Invariant: a wrong scheme, credentials, a relative URL or a malformed sha256 fail the run
    // at once, naming the field; credentials never appear in the message.
    let hash = "a".repeat(64);
    let cases: [(&str, &str, &str); 6] = [
        (
            "ftp://127.0.0.1/app.fab",
            &hash,
            "spec.app.fab.url: ftp://127.0.0.1/app.fab is a ftp: URL",
        ),
        (
            "file:///etc/app.fab",
            &hash,
            "spec.app.fab.url: file:///etc/app.fab is a file: URL",
        ),
        (
            "127.0.0.1/app.fab",
            &hash,
            "spec.app.fab.url: \"127.0.0.1/app.fab\" is not a URL",
        ),
        (
            "http:///app.fab",
            &hash,
            "spec.app.fab.url: \"http:///app.fab\" is not a URL",
        ),
        (
            "https://user:secret@127.0.0.1/app.fab",
            &hash,
            "spec.app.fab.url: https://…@127.0.0.1/app.fab holds credentials",
        ),
        (
            "http://127.0.0.1/app.fab",
            "ABCDEF",
            "spec.app.fab.sha256: \"ABCDEF\" is not 64",
        ),
    ];
    for (url, sha256, start) in cases {
        let e = download(url, Some(sha256), &quick()).await.expect_err(url);
        assert!(!e.is_transient(), "{url}: {e:?}");
        let message = e.to_string();
        assert!(message.starts_with(start), "{url}: {message}");
        assert!(!message.contains("secret"), "{message}");
    }
    let upper = "A".repeat(64);
    let e = download("http://127.0.0.1/app.fab", Some(&upper), &quick())
        .await
        .expect_err("upper-case hex");
    assert!(matches!(e, UrlError::BadSha256 { .. }), "{e:?}");
}

#[test]
fn targets_take_urls_apart_and_resolve_redirects() {
    // Invariant: the request line, Host header and dial address come from the URL, and a
    // Location resolves against the URL that sent it (RFC 3986, dot segments left to servers).
    let t = Target::parse("HTTPS://[::1]:8443/a/b.fab?x=1#top").expect("parse");
    assert!(t.https);
    assert_eq!(
        (t.host.as_str(), t.port, t.host_header.as_str()),
        ("::1", 8443, "[::1]:8443")
    );
    assert_eq!(t.path_and_query, "/a/b.fab?x=1");
    assert_eq!(t.address(), "[::1]:8443");
    let t = Target::parse("http://example.com").expect("parse");
    assert_eq!((t.port, t.path_and_query.as_str()), (80, "/"));
    let base = Target::parse("https://h.example/d/e/f.fab?q=1").expect("parse");
    for (location, want) in [
        ("g.fab", "https://h.example/d/e/g.fab"),
        ("/g.fab", "https://h.example/g.fab"),
        ("?v=2", "https://h.example/d/e/f.fab?v=2"),
        ("//cdn.example/x.fab", "https://cdn.example/x.fab"),
        ("http://other.example/y", "http://other.example/y"),
        ("z.fab#part", "https://h.example/d/e/z.fab"),
        ("../g.fab", "https://h.example/d/g.fab"),
        ("./../../../g.fab?a=../b", "https://h.example/g.fab?a=../b"),
        ("/x/./y/../z/", "https://h.example/x/z/"),
        ("..", "https://h.example/d/"),
    ] {
        assert_eq!(base.join(location).expect(location).url, want, "{location}");
    }
    assert!(base.join("").is_err());
    assert_eq!(
        base.join("gopher://x/y"),
        Err(TargetError::Scheme("gopher".into()))
    );
}

#[test]
fn the_cache_keeps_at_most_16_entries_and_64_mib_dropping_the_oldest() {
    // Invariant: the cache is bounded whatever the runs ask for; the oldest entry goes first.
    let key = |i: usize| (format!("http://h/{i}.fab"), String::new());
    let mut state = CacheState::default();
    for i in 0..20 {
        state.insert(key(i), Done::Refused(format!("{i}")));
    }
    assert_eq!(state.done.len(), CACHE_ENTRIES);
    assert!(!state.done.contains_key(&key(3)) && state.done.contains_key(&key(4)));
    let mut state = CacheState::default();
    for i in 0..7 {
        state.insert(key(i), Done::Found(vec![0; FAB_MAX_SIZE]));
    }
    assert_eq!(
        state.done.len(),
        6,
        "six 10 MiB FABs fit in 64 MiB, not seven"
    );
    assert_eq!(state.bytes, 6 * FAB_MAX_SIZE);
    assert!(!state.done.contains_key(&key(0)));
    // The same key again replaces its entry, not adds one.
    state.insert(key(6), Done::Found(vec![0; 10]));
    assert_eq!(state.bytes, 5 * FAB_MAX_SIZE + 10);
    assert_eq!(state.order.len(), state.done.len());
}

#[tokio::test]
async fn the_cache_downloads_once_and_remembers_refusals() {
    // Invariant: a FAB is downloaded once per (url, sha256), even when asked for at the same
    // time, and a permanent refusal is not asked again (the spec cannot change).
    let (bytes, hash) = fedavg();
    let server = serve(vec![("/app.fab", Reply::File(bytes.clone()))]).await;
    let cache = FabUrlCache::with_limits(quick(), Duration::from_secs(60));
    let url = server.url("/app.fab");
    let gets: Vec<FabBytes> =
        futures::future::join_all((0..4).map(|_| cache.get(&url, &hash))).await;
    for got in gets {
        assert_eq!(got, FabBytes::Found(bytes.clone()));
    }
    assert_eq!(
        cache.clone().get(&url, &hash).await,
        FabBytes::Found(bytes.clone())
    );
    assert_eq!(server.hits.load(Ordering::SeqCst), 1);
    let missing = server.url("/gone.fab");
    for _ in 0..3 {
        let got = cache.get(&missing, &hash).await;
        assert!(
            matches!(&got, FabBytes::Unusable(m) if m.contains("answered HTTP 404")),
            "{got:?}"
        );
    }
    let wrong = "1".repeat(64);
    let got = cache.get(&url, &wrong).await;
    assert!(
        matches!(&got, FabBytes::Unusable(m) if m.starts_with("spec.app.fab.sha256:")),
        "{got:?}"
    );
    assert_eq!(
        server.hits.load(Ordering::SeqCst),
        3,
        "one GET each for 404 and mismatch"
    );
}

#[tokio::test]
async fn the_cache_waits_out_a_transient_failure_before_asking_again() {
    // Invariant: after a transient failure the URL is left alone for the retry interval, the
    // last message standing; then it is asked again.
    let server = serve(vec![("/busy.fab", Reply::Status(503))]).await;
    let retry = Duration::from_millis(300);
    let cache = FabUrlCache::with_limits(quick(), retry);
    let url = server.url("/busy.fab");
    let hash = "a".repeat(64);
    let first = cache.get(&url, &hash).await;
    let FabBytes::Missing(message) = &first else {
        panic!("{first:?}")
    };
    assert!(
        message.contains("answered HTTP 503 Service Unavailable"),
        "{message}"
    );
    assert!(
        message.ends_with("; attempt 1 of 30, retried every 0.3 s"),
        "{message}"
    );
    // Another sha256 of the same URL waits too: the back-off is the URL's.
    assert_eq!(cache.get(&url, &hash).await, first);
    assert_eq!(cache.get(&url, &"b".repeat(64)).await, first);
    assert_eq!(server.hits.load(Ordering::SeqCst), 1);
    tokio::time::sleep(retry + Duration::from_millis(50)).await;
    let again = cache.get(&url, &hash).await;
    assert!(matches!(again, FabBytes::Missing(_)), "{again:?}");
    assert_eq!(server.hits.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn fab_bytes_from_downloads_a_url_into_a_ready_app() {
    // Invariant: a run whose spec names a url gets the same checked app as from a ConfigMap.
    let (bytes, hash) = fedavg();
    let server = serve(vec![("/app.fab", Reply::File(bytes.clone()))]).await;
    let cache = FabUrlCache::with_limits(quick(), RETRY_AFTER);
    let spec = FabSource {
        url: Some(server.url("/app.fab")),
        sha256: Some(hash.clone()),
        config_map_ref: None,
    };
    let (source, found) =
        runs::fab_bytes_from("ns", &spec, None, ConfigMapSource::Cluster, &cache).await;
    assert_eq!(source, server.url("/app.fab"));
    let (state, app) = runs::check_app(&source, found, &BTreeMap::new(), None);
    assert_eq!(
        state,
        crate::core::run::AppState::Ready {
            fab_hash: hash.clone()
        }
    );
    assert_eq!(app.expect("app").fab, bytes);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    // Invariant: a relative redirect never leaves the server or the scheme it came from, and
    // always yields an origin-form request target.
    #[test]
    fn relative_redirects_stay_on_the_same_server(
        https in any::<bool>(),
        port in 1u16..,
        base_path in "(/[a-z0-9._-]{0,8}){0,4}",
        location in "[a-z0-9._-][a-z0-9._/-]{0,20}(\\?[a-z0-9=&]{0,10})?",
    ) {
        let scheme = if https { "https" } else { "http" };
        let base = Target::parse(&format!("{scheme}://files.example:{port}{base_path}"))
            .expect("base");
        for location in [location.clone(), format!("/{location}")] {
            let next = base.join(&location).expect("join");
            prop_assert_eq!(next.https, https);
            prop_assert_eq!(&next.host_header, &base.host_header);
            prop_assert_eq!(next.port, port);
            prop_assert!(next.path_and_query.starts_with('/'), "{}", next.path_and_query);
        }
    }
}

#[tokio::test]
async fn the_cache_gives_a_failing_url_up_after_thirty_attempts() {
    // Invariant: a URL that keeps failing transiently is retried a bounded number of times and
    // then refused for good, so its run fails (with the last error) instead of waiting for ever.
    let server = serve(vec![("/busy.fab", Reply::Status(503))]).await;
    let retry = Duration::from_millis(50);
    let cache = FabUrlCache::with_limits(quick(), retry);
    let url = server.url("/busy.fab");
    let hash = "a".repeat(64);
    for attempt in 1..super::cache::MAX_ATTEMPTS {
        let got = cache.get(&url, &hash).await;
        assert!(
            matches!(&got, FabBytes::Missing(m) if m.contains(&format!("attempt {attempt} of 30"))),
            "{got:?}"
        );
        tokio::time::sleep(retry + Duration::from_millis(10)).await;
    }
    let last = cache.get(&url, &hash).await;
    assert!(
        matches!(&last, FabBytes::Unusable(m) if m.contains("503") && m.ends_with("gave up after 30 attempts 0.05 s apart")),
        "{last:?}"
    );
    assert_eq!(cache.get(&url, &hash).await, last, "remembered");
    assert_eq!(server.hits.load(Ordering::SeqCst), 30);
}

#[tokio::test]
async fn a_url_whose_downloads_time_out_keeps_counting_its_attempts() {
    // Invariant: the attempt count of a URL survives an attempt that takes longer than the
    // time between attempts (a server that hangs until the download timeout: 30 s against 10 s
    // in the hub), so such a URL is given up after 30 attempts like any other, not tried for ever.
    let server = serve(vec![("/hangs.fab", Reply::Declared(1024))]).await;
    let retry = Duration::from_millis(20);
    let limits = DownloadLimits {
        timeout: Duration::from_millis(200),
        ..quick()
    };
    let cache = FabUrlCache::with_limits(limits, retry);
    let url = server.url("/hangs.fab");
    let hash = "b".repeat(64);
    for attempt in 1..=3 {
        let got = cache.get(&url, &hash).await;
        assert!(
            matches!(&got, FabBytes::Missing(m) if m.contains(&format!("attempt {attempt} of 30"))),
            "attempt {attempt}: {got:?}"
        );
        tokio::time::sleep(retry + Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_url_not_asked_for_ten_retry_intervals_starts_counting_afresh() {
    // Failures count towards giving up while the URL keeps being asked for; after ten retry
    // intervals without an attempt they are forgotten (a lower bound of time only: waiting
    // longer cannot make this pass wrongly).
    let server = serve(vec![("/busy.fab", Reply::Status(503))]).await;
    let retry = Duration::from_millis(20);
    let cache = FabUrlCache::with_limits(quick(), retry);
    let url = server.url("/busy.fab");
    let hash = "c".repeat(64);
    let first = cache.get(&url, &hash).await;
    assert!(
        matches!(&first, FabBytes::Missing(m) if m.contains("attempt 1 of 30")),
        "{first:?}"
    );
    tokio::time::sleep(retry * 10 + Duration::from_millis(50)).await;
    let again = cache.get(&url, &hash).await;
    assert!(
        matches!(&again, FabBytes::Missing(m) if m.contains("attempt 1 of 30")),
        "{again:?}"
    );
}

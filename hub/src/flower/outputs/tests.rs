use super::*;

use std::net::SocketAddr;
use std::os::unix::fs::symlink;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use pretty_assertions::assert_eq;

fn write(path: &Path, bytes: &[u8]) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, bytes).unwrap();
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn output(path: &str, bytes: &[u8]) -> RunOutput {
    RunOutput {
        path: path.into(),
        size: bytes.len() as i64,
        sha256: sha(bytes),
    }
}

/// A root with run demo/r1: two nested files, a symlink to a file inside, one to a file outside,
/// one to a directory outside, and a FIFO. `outside` holds the secret.
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let run = run_dir(&root, "demo", "r1");
    write(&run.join("model.pt"), b"weights");
    write(&run.join("metrics/round-1/acc.json"), b"{\"acc\":0.9}");
    write(&tmp.path().join("outside/secret"), b"secret");
    symlink(run.join("model.pt"), run.join("inner-link")).unwrap();
    symlink(tmp.path().join("outside/secret"), run.join("escape")).unwrap();
    symlink(tmp.path().join("outside"), run.join("escape-dir")).unwrap();
    nix::unistd::mkfifo(&run.join("fifo"), Mode::S_IRWXU).unwrap();
    (tmp, root)
}

#[test]
fn list_dir_walks_nested_regular_files_only() {
    // Only regular files are listed, sorted, '/'-separated, with streamed size and sha256;
    // symlinks (inside or out) and FIFOs are skipped, never followed.
    let (_tmp, root) = fixture();
    let listed = list_dir(&run_dir(&root, "demo", "r1"), u64::MAX).unwrap();
    assert_eq!(
        listed,
        vec![
            output("metrics/round-1/acc.json", b"{\"acc\":0.9}"),
            output("model.pt", b"weights"),
        ]
    );
}

#[test]
fn a_run_over_the_size_limit_is_refused_before_any_byte_is_hashed() {
    // Invariant: a run whose files add up to more than the limit (here an 8 TiB sparse file) is
    // refused from the files' sizes alone, at once, naming the sizes and the field; within the
    // limit it is listed as usual.
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("small.txt"), b"ok").unwrap();
    let sparse = std::fs::File::create(run.join("huge.bin")).unwrap();
    sparse.set_len(8 << 40).unwrap();
    let t = std::time::Instant::now();
    let err = list_dir(&run, 1 << 30).unwrap_err();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(30),
        "nothing was hashed"
    );
    let message = err.to_string();
    assert!(
        matches!(err, OutputsError::OverQuota { .. })
            && message.contains(&format!("take {} bytes", (8u64 << 40) + 2))
            && message.contains("spec.outputs.sizeLimit (1073741824 bytes)"),
        "{message}"
    );
    std::fs::remove_file(run.join("huge.bin")).unwrap();
    assert_eq!(
        list_dir(&run, 1 << 30).unwrap(),
        vec![output("small.txt", b"ok")]
    );
    assert!(matches!(
        list_dir(&run, 1),
        Err(OutputsError::OverQuota { .. })
    ));
}

#[test]
fn list_dir_of_a_missing_dir_is_empty() {
    // A run that wrote nothing has no directory: an empty listing, not an error.
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(
        list_dir(&tmp.path().join("nope"), u64::MAX).unwrap(),
        vec![]
    );
}

#[test]
fn list_dir_refuses_a_symlinked_run_dir() {
    // The run directory itself is never followed either.
    let (tmp, root) = fixture();
    let link = run_dir(&root, "demo", "r2");
    symlink(tmp.path().join("outside"), &link).unwrap();
    let err = list_dir(&link, u64::MAX).unwrap_err();
    assert!(matches!(err, OutputsError::Symlink { .. }), "{err}");
}

#[test]
fn list_dir_stops_past_the_file_limit() {
    // More than MAX_FILES files is an error naming the count and the limit.
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..=MAX_FILES {
        write(&tmp.path().join(format!("d{}/f{i}", i % 7)), b"");
    }
    let err = list_dir(tmp.path(), u64::MAX).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            OutputsError::TooManyFiles {
                count: 1001,
                limit: 1000,
                ..
            }
        ),
        "{text}"
    );
    assert!(
        text.contains("1001 files") && text.contains("1000"),
        "{text}"
    );
}

#[test]
fn list_dir_refuses_names_no_output_path_can_carry() {
    // A backslash would be listed but never served: refuse it at listing time.
    let tmp = tempfile::tempdir().unwrap();
    write(&tmp.path().join("sub/a\\b"), b"x");
    let err = list_dir(tmp.path(), u64::MAX).unwrap_err();
    assert!(err.to_string().contains("sub/a\\\\b"), "{err}");
}

#[test]
fn list_dir_bounds_nesting() {
    // A tree deeper than MAX_DEPTH is an error naming where, not an unbounded descent.
    let tmp = tempfile::tempdir().unwrap();
    let deep: PathBuf = (0..=MAX_DEPTH).map(|i| format!("d{i}")).collect();
    write(&tmp.path().join(&deep).join("f"), b"");
    let err = list_dir(tmp.path(), u64::MAX).unwrap_err();
    assert!(matches!(err, OutputsError::TooDeep { .. }), "{err}");
    let shallow: PathBuf = (0..MAX_DEPTH).map(|i| format!("d{i}")).collect();
    let tmp = tempfile::tempdir().unwrap();
    write(&tmp.path().join(&shallow).join("f"), b"");
    assert_eq!(list_dir(tmp.path(), u64::MAX).unwrap().len(), 1);
}

#[test]
fn output_paths_must_stay_inside() {
    // What a listing may name: relative, no dot segments, no backslash or NUL.
    assert_eq!(segments("a/b.pt").unwrap(), vec!["a", "b.pt"]);
    for bad in [
        "",
        "/etc/passwd",
        "../x",
        "a/../../x",
        "a//b",
        "./a",
        "a/",
        "a\\..\\b",
        "a\0",
    ] {
        assert!(
            matches!(segments(bad), Err(OutputsError::BadPath { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn copy_verified_copies_and_checks() {
    // Listed files land under dest with their directories, and no .part is left behind.
    let (tmp, root) = fixture();
    let src = run_dir(&root, "demo", "r1");
    let listed = list_dir(&src, u64::MAX).unwrap();
    let dest = tmp.path().join("fetched");
    copy_verified(&src, &listed, &dest).unwrap();
    assert_eq!(
        std::fs::read(dest.join("metrics/round-1/acc.json")).unwrap(),
        b"{\"acc\":0.9}"
    );
    assert_eq!(std::fs::read(dest.join("model.pt")).unwrap(), b"weights");
    assert_eq!(list_dir(&dest, u64::MAX).unwrap(), listed);
}

#[test]
fn copy_verified_refuses_a_file_that_changed() {
    // A file rewritten since its listing is an error naming it; nothing takes its name.
    let (tmp, root) = fixture();
    let src = run_dir(&root, "demo", "r1");
    let dest = tmp.path().join("fetched");
    let same_size = RunOutput {
        sha256: sha(b"WEIGHTS"),
        ..output("model.pt", b"weights")
    };
    let err = copy_verified(&src, &[same_size], &dest).unwrap_err();
    assert!(matches!(err, OutputsError::Changed { .. }), "{err}");
    assert!(err.to_string().contains("model.pt"), "{err}");
    let shorter = output("model.pt", b"weigh");
    let err = copy_verified(&src, &[shorter], &dest).unwrap_err();
    assert!(err.to_string().contains("more than the 5 bytes"), "{err}");
    assert!(!dest.join("model.pt").exists());
    assert!(!dest.join("model.pt.part").exists());
}

#[test]
fn copy_verified_refuses_escapes_and_symlinks() {
    // A listing naming a path outside either directory is refused before anything is copied;
    // a symlink in the source is never read through.
    let (tmp, root) = fixture();
    let src = run_dir(&root, "demo", "r1");
    let dest = tmp.path().join("fetched");
    let err = copy_verified(&src, &[output("../../escaped", b"secret")], &dest).unwrap_err();
    assert!(matches!(err, OutputsError::BadPath { .. }), "{err}");
    let err = copy_verified(
        &src,
        &[output("model.pt", b"weights"), output("/tmp/x", b"")],
        &dest,
    )
    .unwrap_err();
    assert!(matches!(err, OutputsError::BadPath { .. }), "{err}");
    assert!(
        !dest.exists(),
        "nothing copied before every path was checked"
    );
    for link in ["escape", "escape-dir/secret", "inner-link"] {
        let err = copy_verified(&src, &[output(link, b"secret")], &dest).unwrap_err();
        assert!(matches!(err, OutputsError::Symlink { .. }), "{link}: {err}");
    }
    let err = copy_verified(&src, &[output("removed.pt", b"")], &dest).unwrap_err();
    assert!(matches!(err, OutputsError::Missing { .. }), "{err}");
}

// === The HTTP server ===

async fn start(root: PathBuf) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, root, u64::MAX, async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: Vec<u8>,
}

/// One request with `path` sent exactly as written (no normalisation).
async fn send(addr: SocketAddr, method: &str, path: &str) -> Answer {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, "outputs")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

#[tokio::test]
async fn server_lists_and_streams_files() {
    // The listing is list_dir's; a file comes back byte for byte with its Content-Length.
    let (_tmp, root) = fixture();
    let (addr, _stop) = start(root.clone()).await;
    let listing = send(addr, "GET", "/v1/runs/demo/r1").await;
    assert_eq!(listing.status, 200);
    let listed: Vec<RunOutput> = serde_json::from_slice(&listing.body).unwrap();
    assert_eq!(
        listed,
        list_dir(&run_dir(&root, "demo", "r1"), u64::MAX).unwrap()
    );

    let file = send(
        addr,
        "GET",
        "/v1/runs/demo/r1/files/metrics/round-1/acc.json",
    )
    .await;
    assert_eq!(file.status, 200);
    assert_eq!(file.body, b"{\"acc\":0.9}");
    assert_eq!(file.headers[http::header::CONTENT_LENGTH], "11");

    // Percent-encoded names are decoded.
    write(&run_dir(&root, "demo", "r1").join("final weights.pt"), b"w");
    let spaced = send(addr, "GET", "/v1/runs/demo/r1/files/final%20weights.pt").await;
    assert_eq!((spaced.status, spaced.body.as_slice()), (200, &b"w"[..]));

    let head = send(addr, "HEAD", "/v1/runs/demo/r1/files/model.pt").await;
    assert_eq!(head.status, 200);
    assert_eq!(head.headers[http::header::CONTENT_LENGTH], "7");
    assert!(head.body.is_empty());

    // A run that wrote nothing lists nothing.
    let empty = send(addr, "GET", "/v1/runs/demo/r9").await;
    assert_eq!((empty.status, empty.body.as_slice()), (200, &b"[]"[..]));
}

#[tokio::test]
async fn server_never_leaves_the_run_dir() {
    // Traversal in any encoding is 400; symlinks (to files or directories, inside or out) and
    // FIFOs are 404; the secret outside is never served.
    let (tmp, root) = fixture();
    symlink(tmp.path().join("outside"), run_dir(&root, "demo", "r2")).unwrap();
    let (addr, _stop) = start(root).await;
    for path in [
        "/v1/runs/demo/r1/files/../../../outside/secret",
        "/v1/runs/demo/r1/files/%2e%2e/%2e%2e/%2e%2e/outside/secret",
        "/v1/runs/demo/r1/files/%2E%2E%2F%2E%2E%2F%2E%2E%2Foutside%2Fsecret",
        "/v1/runs/demo/r1/files/metrics%2fround-1%2facc.json",
        "/v1/runs/demo/r1/files/..%5c..%5coutside",
        "/v1/runs/demo/r1/files/model.pt%00",
        "/v1/runs/demo/r1/files//model.pt",
        "/v1/runs/demo/%2e%2e/files/outside/secret",
        "/v1/runs/../r1",
        "/v1/runs/Demo/r1",
    ] {
        let answer = send(addr, "GET", path).await;
        assert_eq!(answer.status, 400, "{path}");
    }
    for path in [
        "/v1/runs/demo/r1/files/escape",
        "/v1/runs/demo/r1/files/escape-dir/secret",
        "/v1/runs/demo/r1/files/inner-link",
        "/v1/runs/demo/r1/files/fifo",
        "/v1/runs/demo/r1/files/metrics",
        "/v1/runs/demo/r1/files/missing.pt",
        "/v1/runs/demo/r2/files/secret",
        "/v1/runs/demo/r1/other",
    ] {
        let answer = send(addr, "GET", path).await;
        assert_eq!(
            answer.status,
            404,
            "{path}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        assert_ne!(answer.body, b"secret", "{path}");
    }
    // A symlinked run directory lists nothing.
    let listing = send(addr, "GET", "/v1/runs/demo/r2").await;
    assert_eq!((listing.status, listing.body.as_slice()), (200, &b"[]"[..]));
}

#[tokio::test]
async fn server_is_read_only() {
    // Only GET and HEAD; anything else is 405 with Allow, and nothing is written.
    let (_tmp, root) = fixture();
    let (addr, _stop) = start(root.clone()).await;
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        let answer = send(addr, method, "/v1/runs/demo/r1/files/model.pt").await;
        assert_eq!(answer.status, 405, "{method}");
        assert_eq!(answer.headers[http::header::ALLOW], "GET, HEAD");
    }
    assert_eq!(
        std::fs::read(run_dir(&root, "demo", "r1").join("model.pt")).unwrap(),
        b"weights"
    );
}

// === The client: over a connection to the sidecar, and the API server's refusals ===

type ProxyBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

fn status_object(code: u16, reason: &str) -> hyper::Response<ProxyBody> {
    let json = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": format!("pods \"x\" is {reason}"), "reason": reason, "code": code,
    });
    let mut response = hyper::Response::new(
        http_body_util::Full::new(Bytes::from(json.to_string()))
            .map_err(|n| match n {})
            .boxed(),
    );
    *response.status_mut() = http::StatusCode::from_u16(code).unwrap();
    response
}

/// A stand-in API server refusing port-forwards: pod `ns/forbidden` answers 403, any other 404,
/// as the API server does before any upgrade.
async fn refusing_api_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| async move {
                    let path = request.uri().path().to_owned();
                    let response = if path.contains("/pods/forbidden/portforward") {
                        status_object(403, "Forbidden")
                    } else {
                        status_object(404, "NotFound")
                    };
                    Ok::<_, std::convert::Infallible>(response)
                },
            );
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service),
            );
        }
    });
    addr
}

fn kube_client(api: SocketAddr) -> kube::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = kube::Config::new(format!("http://{api}").parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

/// An HTTP/1 connection to the sidecar at `addr`, as a port-forward's stream gives one.
async fn connection(addr: SocketAddr) -> client::Sidecar {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

#[tokio::test]
async fn the_client_lists_and_downloads_over_one_connection() {
    // The requests a port-forward carries: the listing, then every file on the same
    // connection, each verified.
    let (tmp, root) = fixture();
    write(&run_dir(&root, "demo", "r1").join("final weights.pt"), b"w");
    let (sidecar, _stop) = start(root.clone()).await;
    let mut conn = connection(sidecar).await;

    let listed = client::list_over(&mut conn, "ns", "p", "demo", "r1")
        .await
        .unwrap();
    assert_eq!(
        listed,
        list_dir(&run_dir(&root, "demo", "r1"), u64::MAX).unwrap()
    );
    assert_eq!(
        client::list_over(&mut conn, "ns", "p", "demo", "r9")
            .await
            .unwrap(),
        vec![]
    );

    let dest = tmp.path().join("fetched");
    for file in &listed {
        client::download_over(&mut conn, "ns", "p", "demo", "r1", file, &dest)
            .await
            .unwrap();
    }
    assert_eq!(list_dir(&dest, u64::MAX).unwrap(), listed);

    // A file that changed since it was listed is refused and leaves nothing behind.
    let stale = RunOutput {
        sha256: sha(b"WEIGHTS"),
        ..output("model.pt", b"weights")
    };
    let elsewhere = tmp.path().join("again");
    let mut conn = connection(sidecar).await;
    let err = client::download_over(&mut conn, "ns", "p", "demo", "r1", &stale, &elsewhere)
        .await
        .unwrap_err();
    assert!(matches!(err, OutputsError::Changed { .. }), "{err}");
    assert!(!elsewhere.join("model.pt").exists() && !elsewhere.join("model.pt.part").exists());

    let gone = output("removed.pt", b"");
    let mut conn = connection(sidecar).await;
    let err = client::download_over(&mut conn, "ns", "p", "demo", "r1", &gone, &elsewhere)
        .await
        .unwrap_err();
    assert!(matches!(err, OutputsError::Missing { .. }), "{err}");
}

#[tokio::test]
async fn api_client_errors_say_what_to_do() {
    // 403 names the RBAC check; 404 from the API server says the pod is not running; a path
    // that would escape is refused before any request.
    let tmp = tempfile::tempdir().unwrap();
    let client = kube_client(refusing_api_server().await);

    let err = list_via_api(&client, "ns", "forbidden", "demo", "r1")
        .await
        .unwrap_err();
    assert!(matches!(err, OutputsError::Forbidden { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("`kubectl auth can-i get pods/portforward -n ns`"),
        "{err}"
    );
    let err = list_via_api(&client, "ns", "gone", "demo", "r1")
        .await
        .unwrap_err();
    assert!(matches!(err, OutputsError::PodNotRunning { .. }), "{err}");
    assert!(err.to_string().contains("ns/gone"), "{err}");

    let escape = output("../escaped", b"");
    let err = download_via_api(&client, "ns", "gone", "demo", "r1", &escape, tmp.path())
        .await
        .unwrap_err();
    assert!(matches!(err, OutputsError::BadPath { .. }), "{err}");
    let err = list_via_api(&client, "ns", "p", "demo", "../r1")
        .await
        .unwrap_err();
    assert!(
        matches!(err, OutputsError::InvalidName { what: "run", .. }),
        "{err}"
    );
}

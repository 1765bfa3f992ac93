//! The `outputs-server` sidecar: serves the run directories below a root read-only over plain
//! HTTP on the pod's loopback, for port-forwards through the API server.
//!
//! `GET /v1/runs/{namespace}/{run}` answers the run's listing (a JSON array of `RunOutput`,
//! empty when the run wrote nothing) and `GET /v1/runs/{namespace}/{run}/files/{path}` one
//! file's bytes. Segments are percent-decoded before they are checked; anything that could leave
//! the run's directory is `400`, a symlink or a missing file `404`.
use std::convert::Infallible;
use std::io;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::server::conn::http1 as server;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use nix::sys::stat::Mode;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::{CHUNK, OutputsError, gone_or_link, list_fd, open_beneath, open_dir_at, segment_ok};

/// Time a client has to send a request's headers (also the idle limit between requests).
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 64;

type Body = UnsyncBoxBody<Bytes, io::Error>;

/// Serves the run directories below `root` on `listener` until `shutdown` completes. It only
/// reads: nothing below `root` is created or changed.
pub async fn serve(
    listener: TcpListener,
    root: PathBuf,
    max_bytes: u64,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let root = Arc::new(root);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => return Ok(()),
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "outputs server: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let root = root.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let root = root.clone();
                async move { Ok::<_, Infallible>(answer(&request, root, max_bytes).await) }
            });
            let served = server::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(tcp), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "outputs server: connection ended");
            }
            drop(permit);
        });
    }
}

/// What a request asks for, its names checked.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// A run's listing.
    List { namespace: String, run: String },
    /// One file of a run.
    File {
        namespace: String,
        run: String,
        path: Vec<String>,
    },
}

/// Parses a request path (still percent-encoded) into a [`Route`], or the status and text to
/// answer.
fn route(path: &str) -> Result<Route, (StatusCode, String)> {
    let not_found = || {
        (
            StatusCode::NOT_FOUND,
            "not found: this server answers GET /v1/runs/{namespace}/{run} and /v1/runs/{namespace}/{run}/files/{path}\n"
                .to_owned(),
        )
    };
    let rest = path.strip_prefix("/v1/runs/").ok_or_else(not_found)?;
    let mut decoded = Vec::new();
    for raw in rest.split('/') {
        let segment = percent_decode(raw).ok_or_else(|| {
            (
                StatusCode::BAD_REQUEST,
                format!("bad request: {raw:?} is not valid percent-encoded UTF-8\n"),
            )
        })?;
        segment_ok(&segment).map_err(|why| {
            (
                StatusCode::BAD_REQUEST,
                format!("bad request: {path:?}: {why}\n"),
            )
        })?;
        decoded.push(segment);
    }
    let mut parts = decoded.into_iter();
    let (Some(namespace), Some(run)) = (parts.next(), parts.next()) else {
        return Err(not_found());
    };
    if let Err(why) = flower_addon_crds::validate::dns_label(&namespace) {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("bad request: namespace {namespace:?} {why}\n"),
        ));
    }
    if !dns_subdomain(&run) {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("bad request: run {run:?} must be a DNS subdomain\n"),
        ));
    }
    match parts.next() {
        None => Ok(Route::List { namespace, run }),
        Some(files) if files == "files" => {
            let path: Vec<String> = parts.collect();
            if path.is_empty() {
                return Err(not_found());
            }
            Ok(Route::File {
                namespace,
                run,
                path,
            })
        }
        Some(_) => Err(not_found()),
    }
}

/// Whether `name` is a DNS-1123 subdomain (dot-separated labels, at most 253 characters).
pub(super) fn dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && name
            .split('.')
            .all(|label| flower_addon_crds::validate::dns_label(label).is_ok())
}

/// Decodes `%XX` escapes; `None` for a malformed escape or bytes that are not UTF-8.
fn percent_decode(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

async fn answer(request: &Request<Incoming>, root: Arc<PathBuf>, max_bytes: u64) -> Response<Body> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "{} is not allowed: this server is read-only (GET and HEAD)\n",
                request.method()
            ),
        );
        response.headers_mut().insert(
            http::header::ALLOW,
            http::HeaderValue::from_static("GET, HEAD"),
        );
        return response;
    }
    let path = request.uri().path();
    let route = match route(path) {
        Ok(route) => route,
        Err((status, message)) => {
            tracing::debug!(path, %status, "outputs server: refused");
            return text(status, message);
        }
    };
    let result = match route {
        Route::List { namespace, run } => list(root, namespace, run, max_bytes).await,
        Route::File {
            namespace,
            run,
            path,
        } => file(root, namespace, run, path).await,
    };
    result.unwrap_or_else(|(status, message)| {
        tracing::debug!(path, %status, message, "outputs server: failed");
        text(status, message)
    })
}

type Answer = Result<Response<Body>, (StatusCode, String)>;

fn internal(what: &str, e: impl std::fmt::Display) -> (StatusCode, String) {
    (StatusCode::INTERNAL_SERVER_ERROR, format!("{what}: {e}\n"))
}

async fn list(root: Arc<PathBuf>, namespace: String, run: String, max_bytes: u64) -> Answer {
    let listed = tokio::task::spawn_blocking(move || {
        let shown = super::run_dir(&root, &namespace, &run);
        let mut held = nix::fcntl::open(root.as_path(), root_flags(), Mode::empty())
            .map_err(|e| OutputsError::io(root.as_path(), e))?;
        for name in [&namespace, &run] {
            held = match open_dir_at(held.as_fd(), name) {
                Ok(fd) => fd,
                // Nothing written yet; or not a directory, never followed: nothing to list.
                Err(e) if gone_or_link(&e) => return Ok(Vec::new()),
                Err(e) => return Err(OutputsError::io(shown, e)),
            };
        }
        list_fd(held.as_fd(), &shown, max_bytes)
    })
    .await
    .map_err(|e| internal("listing", e))?
    .map_err(|e| match e {
        // The client tells this one apart: a run over the limit stays so.
        OutputsError::OverQuota { message } => {
            (StatusCode::PAYLOAD_TOO_LARGE, format!("{message}\n"))
        }
        e => internal("listing", e),
    })?;
    let json = serde_json::to_vec(&listed).map_err(|e| internal("listing", e))?;
    let mut response = Response::new(
        Full::new(Bytes::from(json))
            .map_err(|n| match n {})
            .boxed_unsync(),
    );
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

async fn file(root: Arc<PathBuf>, namespace: String, run: String, path: Vec<String>) -> Answer {
    let joined = path.join("/");
    let opened = tokio::task::spawn_blocking(move || {
        let root_fd = nix::fcntl::open(root.as_path(), root_flags(), Mode::empty())?;
        let segments: Vec<&str> = [namespace.as_str(), run.as_str()]
            .into_iter()
            .chain(path.iter().map(String::as_str))
            .collect();
        let file = open_beneath(root_fd.as_fd(), &segments)?;
        let size = file.metadata()?.len();
        Ok::<_, io::Error>((file, size))
    })
    .await
    .map_err(|e| internal("opening", e))?;
    let (file, size) = match opened {
        Ok(opened) => opened,
        Err(e) if gone_or_link(&e) => {
            return Err((
                StatusCode::NOT_FOUND,
                format!("{joined}: no such output file\n"),
            ));
        }
        Err(e) => return Err(internal(&joined, e)),
    };
    // Never more than the size announced, should the file grow meanwhile.
    let reader = tokio::fs::File::from_std(file).take(size);
    let chunks = futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let mut buf = vec![0u8; CHUNK];
        match reader.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Frame::data(Bytes::from(buf))), Some(reader)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    let mut response = Response::new(StreamBody::new(chunks.boxed()).boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(size));
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}

/// The root is the sidecar's own mount point: it may be reached through symlinks.
fn root_flags() -> nix::fcntl::OFlag {
    use nix::fcntl::OFlag;
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC
}

fn text(status: StatusCode, message: String) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(message))
            .map_err(|n| match n {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_decode_then_check_every_segment() {
        // Names and paths are checked after percent-decoding, so no encoding slips past.
        assert_eq!(
            route("/v1/runs/demo/fedavg-1"),
            Ok(Route::List {
                namespace: "demo".into(),
                run: "fedavg-1".into()
            })
        );
        assert_eq!(
            route("/v1/runs/demo/fedavg-1/files/model/final%20weights.pt"),
            Ok(Route::File {
                namespace: "demo".into(),
                run: "fedavg-1".into(),
                path: vec!["model".into(), "final weights.pt".into()]
            })
        );
        for bad in [
            "/v1/runs/demo/fedavg-1/files/../x",
            "/v1/runs/demo/fedavg-1/files/%2e%2e/x",
            "/v1/runs/demo/fedavg-1/files/%2E%2E/%2E%2E/etc/passwd",
            "/v1/runs/demo/fedavg-1/files/a%2f..%2f..%2fx",
            "/v1/runs/demo/fedavg-1/files/a%5c..",
            "/v1/runs/demo/fedavg-1/files/a%00",
            "/v1/runs/demo/fedavg-1/files/./a",
            "/v1/runs/demo/fedavg-1/files//a",
            "/v1/runs/demo/fedavg-1/files/a/",
            "/v1/runs/demo/fedavg-1/",
            "/v1/runs/Demo/fedavg-1",
            "/v1/runs/%2e%2e/fedavg-1",
            "/v1/runs/demo/..",
            "/v1/runs/demo/a%ZZ",
            "/v1/runs/demo/a%c3",
        ] {
            assert_eq!(
                route(bad).map_err(|(s, _)| s),
                Err(StatusCode::BAD_REQUEST),
                "{bad}"
            );
        }
        for unknown in [
            "/",
            "/v1/runs/demo",
            "/v1/runs/demo/fedavg-1/other/x",
            "/v1/runs/demo/fedavg-1/files",
        ] {
            assert_eq!(
                route(unknown).map_err(|(s, _)| s),
                Err(StatusCode::NOT_FOUND),
                "{unknown}"
            );
        }
    }
}

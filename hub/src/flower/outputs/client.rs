//! Reaching a SuperLink pod's `outputs-server` sidecar, which listens on the pod's loopback
//! only: through a port-forward by the API server and the kubelet, with the caller's own
//! credentials. RBAC on `pods/portforward` in the pod's namespace (`get`, which the WebSocket
//! form asks for, and `create`) decides who may fetch outputs; no other pod can reach them over
//! the network.
use std::path::Path;

use bytes::Bytes;
use flower_addon_crds::run::RunOutput;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use tokio::io::AsyncWriteExt;

use super::server::dns_subdomain;
use super::{OUTPUTS_PORT, OutputsError, Verify, destination, listed_size, segments};

/// Bytes of a listing read at most (a thousand entries take about 200 KB).
const MAX_LISTING_BYTES: usize = 4 << 20;
/// Bytes of an error answer kept for its message.
const MAX_ERROR_BYTES: usize = 16 << 10;

/// An HTTP/1 connection to the sidecar.
pub(super) type Sidecar = SendRequest<Empty<Bytes>>;

/// Lists run `run_namespace/run`'s outputs as the sidecar of SuperLink pod `pod_namespace/pod`
/// sees them. A run that wrote nothing lists nothing.
pub async fn list_via_api(
    client: &kube::Client,
    pod_namespace: &str,
    pod: &str,
    run_namespace: &str,
    run: &str,
) -> Result<Vec<RunOutput>, OutputsError> {
    let target = Target::new(pod_namespace, pod, run_namespace, run)?;
    let what = format!("the outputs of run {run_namespace}/{run}");
    let mut sidecar = target.connect(client, &what).await?;
    list_over(&mut sidecar, pod_namespace, pod, run_namespace, run).await
}

/// Downloads one listed output of run `run_namespace/run` from the sidecar of SuperLink pod
/// `pod_namespace/pod` into `dest_dir/<path>`: streamed into `<path>.part`, checked against the
/// listed size and SHA-256, then renamed into place (parent directories are created). A path
/// that would leave `dest_dir` is refused before anything is asked for.
pub async fn download_via_api(
    client: &kube::Client,
    pod_namespace: &str,
    pod: &str,
    run_namespace: &str,
    run: &str,
    file: &RunOutput,
    dest_dir: &Path,
) -> Result<(), OutputsError> {
    let target = Target::new(pod_namespace, pod, run_namespace, run)?;
    segments(&file.path)?;
    let mut sidecar = target
        .connect(client, &format!("output {}", file.path))
        .await?;
    download_over(
        &mut sidecar,
        pod_namespace,
        pod,
        run_namespace,
        run,
        file,
        dest_dir,
    )
    .await
}

/// A run's outputs behind one pod's sidecar, all names checked before they enter a request.
struct Target<'a> {
    pod_namespace: &'a str,
    pod: &'a str,
    run_namespace: &'a str,
    run: &'a str,
}

impl<'a> Target<'a> {
    fn new(
        pod_namespace: &'a str,
        pod: &'a str,
        run_namespace: &'a str,
        run: &'a str,
    ) -> Result<Self, OutputsError> {
        let invalid = |what, name: &str, why: String| OutputsError::InvalidName {
            what,
            name: name.to_owned(),
            why,
        };
        for (what, namespace) in [
            ("pod namespace", pod_namespace),
            ("run namespace", run_namespace),
        ] {
            flower_addon_crds::validate::dns_label(namespace)
                .map_err(|why| invalid(what, namespace, why))?;
        }
        for (what, name) in [("pod", pod), ("run", run)] {
            if !dns_subdomain(name) {
                return Err(invalid(what, name, "must be a DNS subdomain".into()));
            }
        }
        Ok(Self {
            pod_namespace,
            pod,
            run_namespace,
            run,
        })
    }

    fn pod(&self) -> String {
        format!("{}/{}", self.pod_namespace, self.pod)
    }

    /// The run's listing path on the sidecar; its files are below `…/files/`.
    fn base(&self) -> String {
        format!("/v1/runs/{}/{}", self.run_namespace, self.run)
    }

    fn not_running(&self, message: String) -> OutputsError {
        OutputsError::PodNotRunning {
            namespace: self.pod_namespace.to_owned(),
            pod: self.pod.to_owned(),
            message,
        }
    }

    /// An HTTP/1 connection to the pod's sidecar through a port-forward (kept open while the
    /// connection is).
    async fn connect(&self, client: &kube::Client, what: &str) -> Result<Sidecar, OutputsError> {
        use crate::kube::portforward::{OpenError, open};
        let stream = match open(client, self.pod_namespace, self.pod, OUTPUTS_PORT).await {
            Ok(stream) => stream,
            Err(OpenError::Kube(kube::Error::Api(e))) if e.code == 403 => {
                return Err(OutputsError::Forbidden {
                    namespace: self.pod_namespace.to_owned(),
                    message: e.message,
                });
            }
            Err(OpenError::Kube(kube::Error::Api(e))) if e.code == 404 => {
                return Err(self.not_running(e.message));
            }
            Err(OpenError::Kube(source)) => {
                return Err(OutputsError::Kube {
                    what: what.to_owned(),
                    pod: self.pod(),
                    source,
                });
            }
            Err(OpenError::NoStream) => {
                return Err(self.not_running("the port-forward has no stream".into()));
            }
        };
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| self.not_running(format!("port-forward: {e}")))?;
        // The connection owns the stream, and the stream its forwarder.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }
}

/// Lists run `run_namespace/run`'s outputs on an open connection to a sidecar (`pod` names it
/// in messages).
pub(super) async fn list_over(
    sidecar: &mut Sidecar,
    pod_namespace: &str,
    pod: &str,
    run_namespace: &str,
    run: &str,
) -> Result<Vec<RunOutput>, OutputsError> {
    let target = Target::new(pod_namespace, pod, run_namespace, run)?;
    let what = format!("the outputs of run {run_namespace}/{run}");
    let response = get(sidecar, &target, &target.base(), &what, None).await?;
    let body = read_limited(response.into_body(), MAX_LISTING_BYTES)
        .await
        .map_err(|e| target.not_running(format!("reading {what}: {e}")))?;
    let listed: Vec<RunOutput> =
        serde_json::from_slice(&body).map_err(|e| OutputsError::BadListing {
            path: format!("run {run_namespace}/{run}"),
            why: format!(
                "the sidecar of pod {} answered no JSON list: {e}",
                target.pod()
            ),
        })?;
    for file in &listed {
        segments(&file.path)?;
        listed_size(file)?;
    }
    Ok(listed)
}

/// Downloads one listed output on an open connection to a sidecar (see [`download_via_api`]).
#[allow(clippy::too_many_arguments)]
pub(super) async fn download_over(
    sidecar: &mut Sidecar,
    pod_namespace: &str,
    pod: &str,
    run_namespace: &str,
    run: &str,
    file: &RunOutput,
    dest_dir: &Path,
) -> Result<(), OutputsError> {
    let target = Target::new(pod_namespace, pod, run_namespace, run)?;
    let segments = segments(&file.path)?;
    let mut verify = Verify::new(file)?;
    let encoded: Vec<String> = segments.iter().map(|s| percent_encode(s)).collect();
    let uri = format!("{}/files/{}", target.base(), encoded.join("/"));
    let what = format!("output {}", file.path);
    let response = get(sidecar, &target, &uri, &what, Some(&file.path)).await?;
    let (dest, part) = destination(dest_dir, &segments);
    if let Some(parent) = dest.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| OutputsError::io(parent, e))?;
    }
    let mut out = tokio::fs::File::create(&part)
        .await
        .map_err(|e| OutputsError::io(&part, e))?;
    let mut body = response.into_body();
    let copied = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| target.not_running(format!("reading {what}: {e}")))?;
            if let Ok(data) = frame.into_data() {
                verify.update(&data)?;
                out.write_all(&data)
                    .await
                    .map_err(|e| OutputsError::io(&part, e))?;
            }
        }
        verify.finish()?;
        out.sync_all().await.map_err(|e| OutputsError::io(&part, e))
    }
    .await;
    drop(out);
    if let Err(e) = copied {
        let _ = tokio::fs::remove_file(&part).await;
        return Err(e);
    }
    tokio::fs::rename(&part, &dest)
        .await
        .map_err(|e| OutputsError::io(&dest, e))
}

/// GETs `uri` from the sidecar; any answer but a success becomes the error that says what to do
/// about it. `file` is the output asked for, if one is.
async fn get(
    sidecar: &mut Sidecar,
    target: &Target<'_>,
    uri: &str,
    what: &str,
    file: Option<&str>,
) -> Result<http::Response<Incoming>, OutputsError> {
    let request = http::Request::get(uri)
        .header(http::header::HOST, "localhost")
        .body(Empty::new())
        .map_err(|e| OutputsError::Http {
            what: what.to_owned(),
            pod: target.pod(),
            status: 0,
            message: e.to_string(),
        })?;
    let response = sidecar
        .send_request(request)
        .await
        .map_err(|e| target.not_running(format!("{what}: {e}")))?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = read_limited(response.into_body(), MAX_ERROR_BYTES)
        .await
        .unwrap_or_default();
    let message = String::from_utf8_lossy(&body).trim().to_owned();
    Err(match (status.as_u16(), file) {
        (413, None) => OutputsError::OverQuota { message },
        (404, Some(path)) => OutputsError::Missing {
            path: path.to_owned(),
            dir: format!("the outputs sidecar of pod {}", target.pod()).into(),
        },
        (code, _) => OutputsError::Http {
            what: what.to_owned(),
            pod: target.pod(),
            status: code,
            message,
        },
    })
}

/// The body's bytes, cut off after `limit`.
async fn read_limited(mut body: Incoming, limit: usize) -> Result<Vec<u8>, hyper::Error> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            let room = limit.saturating_sub(out.len());
            out.extend_from_slice(&data[..data.len().min(room)]);
            if out.len() >= limit {
                break;
            }
        }
    }
    Ok(out)
}

/// Percent-encodes everything in a path segment but RFC 3986's unreserved characters.
fn percent_encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

//! Reaching a SuperLink pod's `outputs-server` sidecar through the API server's pod proxy
//! (`/api/v1/namespaces/{ns}/pods/{pod}:9099/proxy/…`), with the caller's own credentials: RBAC
//! `get pods/proxy` in the pod's namespace decides who may fetch outputs.
use std::path::Path;

use flower_addon_crds::run::RunOutput;
use http_body_util::BodyExt;
use kube::client::Body;
use tokio::io::AsyncWriteExt;

use super::server::dns_subdomain;
use super::{OUTPUTS_PORT, OutputsError, Verify, destination, listed_size, segments};

/// Bytes of a listing read at most (a thousand entries take about 200 KB).
const MAX_LISTING_BYTES: usize = 4 << 20;
/// Bytes of an error answer kept for its message.
const MAX_ERROR_BYTES: usize = 16 << 10;

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
    let response = target.get(client, &target.base(), &what, None).await?;
    let body = read_limited(response.into_body(), MAX_LISTING_BYTES)
        .await
        .map_err(|source| target.kube(&what, source))?;
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
    let segments = segments(&file.path)?;
    let mut verify = Verify::new(file)?;
    let encoded: Vec<String> = segments.iter().map(|s| percent_encode(s)).collect();
    let uri = format!("{}/files/{}", target.base(), encoded.join("/"));
    let what = format!("output {}", file.path);
    let response = target.get(client, &uri, &what, Some(&file.path)).await?;
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
            let frame = frame.map_err(|source| target.kube(&what, source))?;
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

/// A run's outputs behind one pod's sidecar, all names checked before they enter a URL.
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

    /// The run's listing URL path; its files are below `…/files/`.
    fn base(&self) -> String {
        format!(
            "/api/v1/namespaces/{}/pods/{}:{OUTPUTS_PORT}/proxy/v1/runs/{}/{}",
            self.pod_namespace, self.pod, self.run_namespace, self.run
        )
    }

    fn kube(&self, what: &str, source: kube::Error) -> OutputsError {
        OutputsError::Kube {
            what: what.to_owned(),
            pod: self.pod(),
            source,
        }
    }

    /// GETs `uri` through the API server; any answer but a success becomes the error that says
    /// what to do about it. `file` is the output asked for, if one is.
    async fn get(
        &self,
        client: &kube::Client,
        uri: &str,
        what: &str,
        file: Option<&str>,
    ) -> Result<http::Response<Body>, OutputsError> {
        let request = http::Request::get(uri)
            .body(Body::empty())
            .map_err(|e| self.kube(what, kube::Error::HttpError(e)))?;
        let response = client
            .send(request)
            .await
            .map_err(|source| self.kube(what, source))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = read_limited(response.into_body(), MAX_ERROR_BYTES)
            .await
            .unwrap_or_default();
        // The API server's own refusals are a `Status` object; the sidecar answers plain text.
        let api_status = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .filter(|v| v["kind"] == "Status");
        let message = match &api_status {
            Some(v) => v["message"].as_str().unwrap_or_default().to_owned(),
            None => String::from_utf8_lossy(&body).trim().to_owned(),
        };
        let from_api_server = api_status.is_some();
        Err(match (status.as_u16(), file) {
            (403, _) => OutputsError::Forbidden {
                namespace: self.pod_namespace.to_owned(),
                message,
            },
            (404, Some(path)) if !from_api_server => OutputsError::Missing {
                path: path.to_owned(),
                dir: format!("the outputs sidecar of pod {}", self.pod()).into(),
            },
            (404, _) if from_api_server => self.not_running(message),
            (502 | 503, _) => self.not_running(message),
            (code, _) => OutputsError::Http {
                what: what.to_owned(),
                pod: self.pod(),
                status: code,
                message,
            },
        })
    }

    fn not_running(&self, message: String) -> OutputsError {
        OutputsError::PodNotRunning {
            namespace: self.pod_namespace.to_owned(),
            pod: self.pod.to_owned(),
            message,
        }
    }
}

/// The body's bytes, cut off after `limit`.
async fn read_limited(mut body: Body, limit: usize) -> Result<Vec<u8>, kube::Error> {
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

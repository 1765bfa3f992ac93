//! Downloading a FlowerRun's FAB from `spec.app.fab.url`, shared by both hub modes: one GET
//! over HTTP/1.1 (https with rustls and the system's trust roots), at most [`FAB_MAX_SIZE`]
//! bytes, a few redirects, checked against `spec.app.fab.sha256` and read as a FAB
//! ([`download`]); and [`FabUrlCache`], which keeps what was downloaded (or refused for good) so
//! a run's passes do not download again, and spaces out retries of a failing URL.
//!
//! Errors tell apart what may pass by itself (the server is down, slow or failing:
//! [`UrlError::is_transient`]; the run waits) from what will not (404, too big, wrong hash, not
//! a FAB: the run fails, since its spec cannot change).
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use http::{StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use sha2::{Digest, Sha256};

use super::control::IoStream;
use super::fab::{self, FAB_MAX_SIZE, FabError};

mod cache;
pub mod egress;
mod target;

pub use cache::FabUrlCache;
pub use egress::Egress;
use target::Target;
mod error;
pub use error::UrlError;

/// How long one download may take, connecting and redirects included.
pub const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting (resolving, TCP and TLS) to one server may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most redirects followed.
pub const MAX_REDIRECTS: usize = 5;
/// How long after a transient failure a URL is left alone.
pub const RETRY_AFTER: Duration = Duration::from_secs(10);
/// Sent as `User-Agent`, so a server's logs say who downloads.
const USER_AGENT: &str = concat!("flower-addon-hub/", env!("CARGO_PKG_VERSION"));

/// What one [`download`] may cost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DownloadLimits {
    /// Largest body read ([`FAB_MAX_SIZE`], Flower's own limit).
    pub max_bytes: usize,
    /// The whole download, redirects included ([`DOWNLOAD_TIMEOUT`]).
    pub timeout: Duration,
    /// Connecting to one server, TLS included ([`CONNECT_TIMEOUT`]).
    pub connect_timeout: Duration,
    /// Most redirects followed ([`MAX_REDIRECTS`]).
    pub max_redirects: usize,
    /// Which addresses may be dialled ([`Egress`]; default: public ones only).
    pub egress: Egress,
}

impl Default for DownloadLimits {
    fn default() -> Self {
        Self {
            max_bytes: FAB_MAX_SIZE,
            timeout: DOWNLOAD_TIMEOUT,
            connect_timeout: CONNECT_TIMEOUT,
            max_redirects: MAX_REDIRECTS,
            egress: Egress::default(),
        }
    }
}

/// 5xx, 408 Request Timeout and 429 Too Many Requests say "later"; any other status will not
/// change by itself.
fn status_is_transient(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
}

fn status_message(url: &str, status: StatusCode) -> String {
    let fix = if status_is_transient(status) {
        "the server failed or is busy; it may answer later"
    } else if status == StatusCode::NOT_FOUND || status == StatusCode::GONE {
        "check the URL: nothing is there"
    } else if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        "the hub sends no credentials: use a URL anyone may read (e.g. a pre-signed link), or a \
         configMapRef"
    } else {
        "give a URL that answers 200 with the .fab file itself"
    };
    format!("spec.app.fab.url: GET {url} answered HTTP {status}: {fix}")
}

/// Downloads the FAB at `url` (http or https, following at most `limits.max_redirects`
/// redirects, never from https to http), checks its SHA-256 against `sha256` (lower-case hex)
/// when given, and that it is a FAB ([`fab::read`]). More than `limits.max_bytes` is refused
/// from the Content-Length when there is one, else as soon as the body passes it.
pub async fn download(
    url: &str,
    sha256: Option<&str>,
    limits: &DownloadLimits,
) -> Result<Vec<u8>, UrlError> {
    download_with(url, sha256, limits, None).await
}

/// [`download`], verifying https servers with `tls` instead of the system's trust roots.
async fn download_with(
    url: &str,
    sha256: Option<&str>,
    limits: &DownloadLimits,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Vec<u8>, UrlError> {
    if let Some(want) = sha256
        && !(want.len() == 64 && want.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
    {
        return Err(UrlError::BadSha256 {
            value: want.to_owned(),
        });
    }
    let target = Target::parse(url).map_err(|e| e.into_error(url))?;
    let body = tokio::time::timeout(limits.timeout, fetch(target, limits, tls))
        .await
        .map_err(|_| UrlError::Timeout {
            url: url.to_owned(),
            what: "downloading",
            after: limits.timeout,
        })??;
    if let Some(want) = sha256 {
        let got = hex::encode(Sha256::digest(&body.bytes));
        if got != want {
            return Err(UrlError::HashMismatch {
                url: body.url,
                size: body.bytes.len(),
                content_type: body.content_type,
                got,
                want: want.to_owned(),
            });
        }
    }
    fab::read(&body.bytes).map_err(|source| UrlError::NotFab {
        url: body.url.clone(),
        source,
    })?;
    Ok(body.bytes)
}

/// A downloaded body and where it came from.
struct Body {
    /// The URL that answered 200 (after redirects).
    url: String,
    bytes: Vec<u8>,
    content_type: Option<String>,
}

/// GETs `target`, following redirects, and reads the body of the 200.
async fn fetch(
    mut target: Target,
    limits: &DownloadLimits,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Body, UrlError> {
    let first = target.url.clone();
    let mut redirects = 0;
    loop {
        let exchange = get(&target, limits, tls).await?;
        let status = exchange.response.status();
        if status == StatusCode::OK {
            return read_body(target, exchange, limits.max_bytes).await;
        }
        if !matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308) {
            return Err(UrlError::Status {
                url: target.url,
                status,
            });
        }
        if redirects == limits.max_redirects {
            return Err(UrlError::TooManyRedirects {
                url: first,
                max: limits.max_redirects,
            });
        }
        redirects += 1;
        let location = exchange.response.headers().get(header::LOCATION);
        let Some(location) = location.and_then(|l| l.to_str().ok()) else {
            return Err(UrlError::BadRedirect {
                url: target.url,
                location: String::new(),
                reason: "no readable Location header".into(),
            });
        };
        let next = target.join(location).map_err(|e| UrlError::BadRedirect {
            url: target.url.clone(),
            location: location.to_owned(),
            reason: e.to_string(),
        })?;
        if target.https && !next.https {
            return Err(UrlError::InsecureRedirect {
                url: target.url,
                location: next.url,
            });
        }
        tracing::debug!(from = %target.url, to = %next.url, "FAB download redirected");
        target = next;
    }
}

/// One answered request: the response, with the task driving its connection (aborted when
/// dropped, so an abandoned body closes the connection).
struct Exchange {
    response: http::Response<Incoming>,
    _connection: AbortOnDrop,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Connects to `target`'s server and sends one GET on a connection of its own.
async fn get(
    target: &Target,
    limits: &DownloadLimits,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Exchange, UrlError> {
    let io = tokio::time::timeout(limits.connect_timeout, connect(target, &limits.egress, tls))
        .await
        .map_err(|_| UrlError::Timeout {
            url: target.url.clone(),
            what: "connecting for",
            after: limits.connect_timeout,
        })??;
    let broke = |e: hyper::Error| UrlError::Protocol {
        url: target.url.clone(),
        reason: flower_addon_runtime::tls::error_chain(&e),
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(broke)?;
    let connection = AbortOnDrop(tokio::spawn(async move {
        let _ = connection.await;
    }));
    let request = http::Request::get(target.path_and_query.as_str())
        .header(header::HOST, target.host_header.as_str())
        .header(header::USER_AGENT, USER_AGENT)
        .header(header::ACCEPT, "*/*")
        .header(header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| UrlError::BadUrl {
            url: target.url.clone(),
            reason: e.to_string(),
        })?;
    let response = sender.send_request(request).await.map_err(broke)?;
    Ok(Exchange {
        response,
        _connection: connection,
    })
}

/// Resolves `target`'s host and opens TCP (and TLS for https) to the first address that
/// answers among those `egress` allows (checked on the very address dialled, so a DNS answer
/// cannot change between the check and the connection).
async fn connect(
    target: &Target,
    egress: &Egress,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Box<dyn IoStream>, UrlError> {
    let address = target.address();
    let addresses: Vec<_> = tokio::net::lookup_host((target.host.as_str(), target.port))
        .await
        .map_err(|e| UrlError::Resolve {
            url: target.url.clone(),
            host: target.host.clone(),
            reason: e.to_string(),
        })?
        .collect();
    if addresses.is_empty() {
        return Err(UrlError::Resolve {
            url: target.url.clone(),
            host: target.host.clone(),
            reason: "no addresses".into(),
        });
    }
    let mut refused = None;
    let addresses: Vec<_> = addresses
        .into_iter()
        .filter(|socket| match egress.check(&target.host, socket.ip()) {
            Ok(()) => true,
            Err(rule) => {
                refused.get_or_insert(rule);
                false
            }
        })
        .collect();
    if addresses.is_empty()
        && let Some(rule) = refused
    {
        tracing::info!(url = %target.url, rule, "FAB download refused by the hub's egress rules");
        return Err(UrlError::Refused { rule });
    }
    let mut failures = Vec::new();
    let mut tcp = None;
    for socket in addresses {
        match tokio::net::TcpStream::connect(socket).await {
            Ok(stream) => {
                tcp = Some(stream);
                break;
            }
            Err(e) => failures.push(format!("{socket}: {e}")),
        }
    }
    let Some(tcp) = tcp else {
        return Err(UrlError::Connect {
            url: target.url.clone(),
            address,
            reason: failures.join("; "),
        });
    };
    let _ = tcp.set_nodelay(true);
    if !target.https {
        return Ok(Box::new(tcp));
    }
    let config = match tls {
        Some(config) => config.clone(),
        None => SYSTEM_TLS
            .clone()
            .map_err(|reason| UrlError::NoTrustRoots {
                url: target.url.clone(),
                reason,
            })?,
    };
    let name = ServerName::try_from(target.host.clone()).map_err(|e| UrlError::BadUrl {
        url: target.url.clone(),
        reason: format!("host {}: {e}", target.host),
    })?;
    let stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| UrlError::Tls {
            url: target.url.clone(),
            address,
            reason: flower_addon_runtime::tls::error_chain(&e),
        })?;
    Ok(Box::new(stream))
}

/// Reads the body of a 200, refusing more than `max` bytes.
async fn read_body(target: Target, exchange: Exchange, max: usize) -> Result<Body, UrlError> {
    let too_large = |size: u64, declared: bool| UrlError::TooLarge {
        url: target.url.clone(),
        size,
        declared,
        max,
    };
    let headers = exchange.response.headers();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(length) = declared
        && length > max as u64
    {
        return Err(too_large(length, true));
    }
    let capacity = declared.map_or(0, |l| l as usize);
    let mut bytes = Vec::with_capacity(capacity);
    let Exchange {
        response,
        _connection,
    } = exchange;
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| UrlError::Protocol {
            url: target.url.clone(),
            reason: flower_addon_runtime::tls::error_chain(&e),
        })?;
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > max {
                return Err(too_large((bytes.len() + data.len()) as u64, false));
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(Body {
        url: target.url,
        bytes,
        content_type,
    })
}

/// The rustls client configuration with the system's trust roots (`SSL_CERT_FILE` and
/// `SSL_CERT_DIR` honoured), read once; or why there are none.
static SYSTEM_TLS: LazyLock<Result<Arc<rustls::ClientConfig>, String>> = LazyLock::new(|| {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(if errors.is_empty() {
            "no CA certificates found in the system's store".to_owned()
        } else {
            errors.join("; ")
        });
    }
    client_config(roots)
});

/// A rustls client configuration trusting `roots`, speaking HTTP/1.1.
fn client_config(roots: rustls::RootCertStore) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests;

//! The operations endpoints both binaries serve, with controller-runtime's flag names:
//! `--metrics-bind-address` (`GET /metrics`, Prometheus text format 0.0.4) and
//! `--health-probe-bind-address` (`GET /healthz`: the process answers; `GET /readyz`: every
//! readiness check passes, listed one per line as Kubernetes' own `/readyz?verbose` does).
//!
//! Defaults are `:8080` and `:8081`, `0` disables. Processes that share a machine (a standalone
//! hub and its agents, the e2e harness) would collide on the defaults, so a *default* address that
//! is taken only logs a warning; an address given on the command line must bind.
use anyhow::Context as _;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

/// Default of `--metrics-bind-address`.
pub const DEFAULT_METRICS_ADDRESS: &str = ":8080";
/// Default of `--health-probe-bind-address`.
pub const DEFAULT_HEALTH_ADDRESS: &str = ":8081";
/// A slow client gets this long to send its request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Where an endpoint listens: `0` (off), `:PORT` (every interface) or `HOST:PORT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindAddress {
    /// The endpoint is off.
    Disabled,
    /// Listen here.
    At(SocketAddr),
}

impl std::str::FromStr for BindAddress {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s == "0" {
            return Ok(Self::Disabled);
        }
        let spelled = match s.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => s.to_owned(),
        };
        spelled.parse::<SocketAddr>().map(Self::At).map_err(|_| {
            format!(
                "{s:?} is not an address: give `:PORT` (every interface), `IP:PORT` (e.g. 127.0.0.1:8080, [::1]:8080), or `0` to turn the endpoint off"
            )
        })
    }
}

impl std::fmt::Display for BindAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Disabled => f.write_str("0"),
            Self::At(addr) => write!(f, "{addr}"),
        }
    }
}

/// The flags of both endpoints (flattened into `flower-hub serve` and `flower-agent run`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct OpsArgs {
    /// Where `/metrics` (Prometheus text format) is served: `:PORT`, `IP:PORT`, or `0` for off.
    /// [default: :8080; when that port is taken, e.g. by another flower-addon process on the
    /// same machine, a warning is logged and the process runs without it]
    #[arg(long, value_name = "ADDRESS", env = "FLOWER_METRICS_BIND_ADDRESS")]
    pub metrics_bind_address: Option<BindAddress>,
    /// Where `/healthz` and `/readyz` are served: `:PORT`, `IP:PORT`, or `0` for off.
    /// [default: :8081; a taken default port is a warning, like --metrics-bind-address]
    #[arg(long, value_name = "ADDRESS", env = "FLOWER_HEALTH_PROBE_BIND_ADDRESS")]
    pub health_probe_bind_address: Option<BindAddress>,
}

/// Named readiness checks: `/readyz` answers 200 when all pass, 503 otherwise.
#[derive(Debug, Default)]
pub struct Health {
    checks: Mutex<BTreeMap<&'static str, bool>>,
}

impl Health {
    /// Checks `names`, none passing yet.
    pub fn new(names: &[&'static str]) -> Arc<Self> {
        Arc::new(Self {
            checks: Mutex::new(names.iter().map(|n| (*n, false)).collect()),
        })
    }

    /// Records whether check `name` passes (a name not given to [`Health::new`] is added).
    pub fn set(&self, name: &'static str, passing: bool) {
        if let Ok(mut checks) = self.checks.lock() {
            checks.insert(name, passing);
        }
    }

    /// Whether every check passes.
    pub fn ready(&self) -> bool {
        self.checks
            .lock()
            .map(|c| c.values().all(|ok| *ok))
            .unwrap_or(false)
    }

    /// The checks as `/readyz` prints them: `[+]name ok` or `[-]name failed`, one per line.
    pub fn report(&self) -> String {
        let checks = self.checks.lock().map(|c| c.clone()).unwrap_or_default();
        let mut out = String::new();
        for (name, ok) in &checks {
            out.push_str(if *ok { "[+]" } else { "[-]" });
            out.push_str(name);
            out.push_str(if *ok { " ok\n" } else { " failed\n" });
        }
        out.push_str(if checks.values().all(|ok| *ok) {
            "readyz check passed\n"
        } else {
            "readyz check failed\n"
        });
        out
    }
}

/// Runs before each scrape, e.g. to set gauges from a cache (the hub's Federations).
pub type Refresh = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// What `/metrics` encodes.
pub struct Metrics {
    /// The metrics.
    pub registry: Registry,
    /// Called before each encoding.
    pub refresh: Option<Refresh>,
}

/// The addresses the endpoints ended up on (`None`: off, or a taken default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Serving {
    /// Where `/metrics` is served.
    pub metrics: Option<SocketAddr>,
    /// Where `/healthz` and `/readyz` are served.
    pub health: Option<SocketAddr>,
}

/// Binds both endpoints and serves them on spawned tasks for the life of the runtime. Fails when
/// an address given on the command line cannot be bound.
pub async fn serve(
    args: &OpsArgs,
    metrics: Metrics,
    health: Arc<Health>,
) -> anyhow::Result<Serving> {
    let metrics = Arc::new(metrics);
    let mut serving = Serving::default();
    if let Some(listener) = bind(
        "--metrics-bind-address",
        args.metrics_bind_address,
        DEFAULT_METRICS_ADDRESS,
    )
    .await?
    {
        serving.metrics = listener.local_addr().ok();
        let route = Route::Metrics(metrics);
        tokio::spawn(accept(listener, Arc::new(route)));
    }
    if let Some(listener) = bind(
        "--health-probe-bind-address",
        args.health_probe_bind_address,
        DEFAULT_HEALTH_ADDRESS,
    )
    .await?
    {
        serving.health = listener.local_addr().ok();
        tokio::spawn(accept(listener, Arc::new(Route::Health(health))));
    }
    if let Some(addr) = serving.metrics {
        tracing::info!(%addr, "serving /metrics");
    }
    if let Some(addr) = serving.health {
        tracing::info!(%addr, "serving /healthz and /readyz");
    }
    Ok(serving)
}

async fn bind(
    flag: &str,
    given: Option<BindAddress>,
    default: &str,
) -> anyhow::Result<Option<TcpListener>> {
    let (address, explicit) = match given {
        Some(a) => (a, true),
        None => (
            default
                .parse::<BindAddress>()
                .map_err(|e| anyhow::anyhow!("{flag} default: {e}"))?,
            false,
        ),
    };
    let BindAddress::At(addr) = address else {
        return Ok(None);
    };
    match TcpListener::bind(addr).await {
        Ok(listener) => Ok(Some(listener)),
        Err(error) if !explicit => {
            tracing::warn!(%addr, %error, "{flag}: the default address is not free; running without this endpoint (give {flag} another address, or 0 to turn it off)");
            Ok(None)
        }
        Err(error) => Err(error).with_context(|| {
            format!("{flag} {addr}: cannot listen (give a free port, or 0 to turn it off)")
        }),
    }
}

enum Route {
    Metrics(Arc<Metrics>),
    Health(Arc<Health>),
}

async fn accept(listener: TcpListener, route: Arc<Route>) {
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::debug!(%error, "ops endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let route = route.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let route = route.clone();
                    async move { Ok::<_, Infallible>(answer(&route, &request).await) }
                });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

async fn answer<B>(route: &Route, request: &Request<B>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match (route, request.uri().path()) {
        (Route::Metrics(metrics), "/metrics") => {
            if let Some(refresh) = &metrics.refresh {
                refresh().await;
            }
            let mut body = String::new();
            if prometheus_client::encoding::prometheus_text::encode(&mut body, &metrics.registry)
                .is_err()
            {
                return text(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode\n".into());
            }
            let mut response = Response::new(Full::new(Bytes::from(body)));
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(
                    prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                ),
            );
            response
        }
        (Route::Health(_), "/healthz" | "/livez") => text(StatusCode::OK, "ok\n".into()),
        (Route::Health(health), "/readyz") => {
            let status = if health.ready() {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            text(status, health.report())
        }
        (Route::Metrics(_), _) => text(StatusCode::NOT_FOUND, "try /metrics\n".into()),
        (Route::Health(_), _) => text(StatusCode::NOT_FOUND, "try /healthz or /readyz\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The resident set size of this process in bytes (`VmRSS` of `/proc/self/status`), for the
/// `process_resident_memory_bytes` gauge both binaries export.
pub fn resident_memory_bytes() -> Option<i64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_addresses_follow_controller_runtime() {
        // Invariant: `:PORT` means every interface, `0` turns the endpoint off, a bad value names
        // the forms that work.
        assert_eq!(
            ":8080".parse::<BindAddress>(),
            Ok(BindAddress::At("0.0.0.0:8080".parse().expect("addr")))
        );
        assert_eq!("0".parse::<BindAddress>(), Ok(BindAddress::Disabled));
        assert_eq!(
            "[::1]:9".parse::<BindAddress>(),
            Ok(BindAddress::At("[::1]:9".parse().expect("addr")))
        );
        let error = "localhost".parse::<BindAddress>().expect_err("refused");
        assert!(error.contains(":PORT") && error.contains("`0`"), "{error}");
    }

    #[test]
    fn readiness_needs_every_check() {
        // Invariant: /readyz passes only when all named checks pass, and says which fail.
        let health = Health::new(&["credentials", "runtime"]);
        assert!(!health.ready());
        health.set("credentials", true);
        assert!(!health.ready());
        assert!(health.report().contains("[-]runtime failed"));
        health.set("runtime", true);
        assert!(health.ready());
        assert!(health.report().ends_with("readyz check passed\n"));
    }
}

//! Why a FAB URL was refused or could not be read, in the words a run's status shows.
use super::*;

/// Why a FAB could not be downloaded; the message names the spec field, what was seen and what
/// to do. [`UrlError::is_transient`] tells whether trying again later may succeed.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    /// Not an absolute URL (or a redirect to one that is not).
    #[error(
        "spec.app.fab.url: {url:?} is not a URL the hub can download ({reason}): give the \
         absolute http:// or https:// URL of the .fab file"
    )]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Neither http nor https.
    #[error(
        "spec.app.fab.url: {url} is a {scheme}: URL; the hub downloads only http:// and \
         https:// URLs: serve the FAB over HTTP(S), or put it in a ConfigMap and use configMapRef"
    )]
    BadScheme {
        /// The URL.
        url: String,
        /// Its scheme.
        scheme: String,
    },
    /// `user:password@` in the URL.
    #[error(
        "spec.app.fab.url: {url} holds credentials (user@host), which the hub does not send and \
         a spec should not hold: use a URL that needs none (e.g. a pre-signed link), or a \
         configMapRef"
    )]
    Credentials {
        /// The URL, credentials left out.
        url: String,
    },
    /// `sha256` is not a lower-case hex SHA-256.
    #[error(
        "spec.app.fab.sha256: {value:?} is not 64 lower-case hexadecimal digits: give the FAB's \
         SHA-256 as `sha256sum APP.fab` prints it"
    )]
    BadSha256 {
        /// The value given.
        value: String,
    },
    /// The host name does not resolve.
    #[error(
        "spec.app.fab.url: cannot resolve {host} ({reason}) for {url}: check the host name and \
         that the hub's DNS knows it"
    )]
    Resolve {
        /// The URL fetched.
        url: String,
        /// Its host.
        host: String,
        /// The resolver's answer.
        reason: String,
    },
    /// Every address the host resolved to is one the hub may not dial ([`Egress`]). Says the
    /// rule and nothing about the target.
    #[error(
        "spec.app.fab.url: refused: {rule}. The hub downloads FABs from public addresses only \
         unless its admin allows more (`flower-hub serve --fab-url-allow CIDR|HOST`, Helm value \
         hub.fabUrlAllow); or put the FAB in a ConfigMap and use configMapRef"
    )]
    Refused {
        /// The rule that refused it.
        rule: &'static str,
    },
    /// No TCP connection (refused, unreachable).
    #[error(
        "spec.app.fab.url: cannot connect to {address} for {url} ({reason}): check that the \
         server is up and that the hub may reach it"
    )]
    Connect {
        /// The URL fetched.
        url: String,
        /// `host:port`.
        address: String,
        /// Why.
        reason: String,
    },
    /// The TLS handshake failed (an untrusted or expired certificate, a wrong name).
    #[error(
        "spec.app.fab.url: TLS with {address} for {url} failed ({reason}): the server needs a \
         certificate for that name from a CA the hub trusts (the system's, or the bundle \
         SSL_CERT_FILE names)"
    )]
    Tls {
        /// The URL fetched.
        url: String,
        /// `host:port`.
        address: String,
        /// What failed.
        reason: String,
    },
    /// The hub found no CA certificates to verify an https server with.
    #[error(
        "spec.app.fab.url: the hub has no trusted CA certificates to verify {url} ({reason}): \
         mount a CA bundle into the hub and set SSL_CERT_FILE to it, or use an http:// URL \
         (the sha256 still guards the content) or a configMapRef"
    )]
    NoTrustRoots {
        /// The URL fetched.
        url: String,
        /// What loading the system's certificates said.
        reason: String,
    },
    /// No connection, or no whole answer, in time.
    #[error(
        "spec.app.fab.url: {what} {url} took longer than {} s: check that the server is up \
         and answers",
        after.as_secs_f64()
    )]
    Timeout {
        /// The URL fetched.
        url: String,
        /// "connecting for" or "downloading".
        what: &'static str,
        /// The limit.
        after: Duration,
    },
    /// An HTTP status other than 200 or a redirect.
    #[error("{}", status_message(url, *status))]
    Status {
        /// The URL fetched.
        url: String,
        /// The status.
        status: StatusCode,
    },
    /// The connection broke or the answer was not HTTP.
    #[error(
        "spec.app.fab.url: the answer from {url} broke off ({reason}): check that the server \
         serves the file whole"
    )]
    Protocol {
        /// The URL fetched.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// Bigger than Flower accepts.
    #[error(
        "spec.app.fab.url: {url} {}; a FAB may be at most {max} bytes (Flower's limit, 10 MiB): \
         make the app smaller (`fab-exclude` in [tool.flwr.app], or the app's .gitignore) and \
         rebuild it with `flwr build`",
        if *declared { format!("is {size} bytes (its Content-Length)") }
        else { format!("sent more than {max} bytes") }
    )]
    TooLarge {
        /// The URL fetched.
        url: String,
        /// The Content-Length, or the bytes read when the limit was passed.
        size: u64,
        /// Whether `size` is the Content-Length.
        declared: bool,
        /// The limit.
        max: usize,
    },
    /// More redirects than allowed.
    #[error(
        "spec.app.fab.url: {url} redirected more than {max} times: give the URL the redirects \
         end at"
    )]
    TooManyRedirects {
        /// The URL of the spec.
        url: String,
        /// The limit.
        max: usize,
    },
    /// An https URL redirected to http.
    #[error(
        "spec.app.fab.url: {url} redirected to {location}, from https to http, which the hub \
         refuses: give an https URL that stays https"
    )]
    InsecureRedirect {
        /// The URL that redirected.
        url: String,
        /// Where to.
        location: String,
    },
    /// A redirect the hub cannot follow.
    #[error(
        "spec.app.fab.url: {url} redirected to {location:?}, which the hub cannot follow \
         ({reason}): give the URL of the file itself"
    )]
    BadRedirect {
        /// The URL that redirected.
        url: String,
        /// Its `Location`.
        location: String,
        /// Why it cannot be followed.
        reason: String,
    },
    /// The file is not the one `sha256` names.
    #[error(
        "spec.app.fab.sha256: the file at {url} ({size} bytes{}) has SHA-256 {got}, the spec \
         wants {want}: if it is the FAB you mean to run, create the FlowerRun again with \
         sha256 {got}; otherwise fix the url",
        content_type.as_deref().map(|t| format!(", {t}")).unwrap_or_default()
    )]
    HashMismatch {
        /// The URL fetched.
        url: String,
        /// Bytes downloaded.
        size: usize,
        /// The `Content-Type` answered, if any.
        content_type: Option<String>,
        /// SHA-256 of the bytes.
        got: String,
        /// `spec.app.fab.sha256`.
        want: String,
    },
    /// Downloaded whole, but not a FAB Flower can run.
    #[error("spec.app.fab.url: the file at {url} is not a usable FAB: {source}")]
    NotFab {
        /// The URL fetched.
        url: String,
        /// What [`fab::read`] found.
        source: FabError,
    },
}

// === impl UrlError ===

impl UrlError {
    /// Whether the same download may succeed later (the server is down, slow, failing or
    /// throttling, or the hub cannot verify it yet), rather than never (the spec is wrong).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Resolve { .. }
            | Self::Connect { .. }
            | Self::Tls { .. }
            | Self::NoTrustRoots { .. }
            | Self::Timeout { .. }
            | Self::Protocol { .. } => true,
            Self::Status { status, .. } => status_is_transient(*status),
            Self::BadUrl { .. }
            | Self::BadScheme { .. }
            | Self::Credentials { .. }
            | Self::BadSha256 { .. }
            | Self::TooLarge { .. }
            | Self::TooManyRedirects { .. }
            | Self::InsecureRedirect { .. }
            | Self::BadRedirect { .. }
            | Self::HashMismatch { .. }
            | Self::NotFab { .. }
            | Self::Refused { .. } => false,
        }
    }
}

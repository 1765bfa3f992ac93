//! A URL to download from, taken apart ([`Target`]), and a redirect's `Location` resolved
//! against it.
use std::fmt;

use super::UrlError;

/// A URL to GET, taken apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Target {
    /// The URL as given (without its fragment).
    pub(super) url: String,
    pub(super) https: bool,
    /// The host, IPv6 addresses without brackets (to resolve and verify).
    pub(super) host: String,
    pub(super) port: u16,
    /// The authority as written (the `Host` header).
    pub(super) host_header: String,
    /// The request target (origin form: never empty).
    pub(super) path_and_query: String,
}

/// Why a URL is not a [`Target`].
#[derive(Debug, PartialEq, Eq)]
pub(super) enum TargetError {
    /// Not an absolute URL with a host (why).
    Invalid(String),
    /// Neither http nor https (the scheme).
    Scheme(String),
    /// `user@` in the authority (the URL with it left out).
    Credentials(String),
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid(reason) => f.write_str(reason),
            Self::Scheme(scheme) => write!(f, "a {scheme}: URL; only http and https are followed"),
            Self::Credentials(_) => f.write_str("it holds credentials"),
        }
    }
}

impl TargetError {
    /// The error of a spec's `url` that is not a [`Target`].
    pub(super) fn into_error(self, url: &str) -> UrlError {
        match self {
            Self::Invalid(reason) => UrlError::BadUrl {
                url: url.to_owned(),
                reason,
            },
            Self::Scheme(scheme) => UrlError::BadScheme {
                url: url.to_owned(),
                scheme,
            },
            Self::Credentials(url) => UrlError::Credentials { url },
        }
    }
}

/// The scheme of an absolute URL (`scheme ":"`, RFC 3986), if `text` starts with one.
fn scheme_of(text: &str) -> Option<&str> {
    let (scheme, _) = text.split_once(':')?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

impl Target {
    /// Takes an absolute http or https URL apart; a fragment is dropped.
    pub(super) fn parse(text: &str) -> Result<Self, TargetError> {
        let text = text.split('#').next().unwrap_or_default().trim();
        let Some(scheme) = scheme_of(text) else {
            return Err(TargetError::Invalid(
                "no http:// or https:// in front".into(),
            ));
        };
        let (https, default_port) = match scheme.to_ascii_lowercase().as_str() {
            "http" => (false, 80),
            "https" => (true, 443),
            _ => return Err(TargetError::Scheme(scheme.to_owned())),
        };
        let uri: http::Uri = text
            .parse()
            .map_err(|e: http::uri::InvalidUri| TargetError::Invalid(e.to_string()))?;
        let Some(authority) = uri.authority() else {
            return Err(TargetError::Invalid("no host".into()));
        };
        if let Some((_, rest)) = authority.as_str().rsplit_once('@') {
            return Err(TargetError::Credentials(format!(
                "{scheme}://…@{rest}{}",
                uri.path_and_query().map_or("", |p| p.as_str())
            )));
        }
        let host = authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() {
            return Err(TargetError::Invalid("no host".into()));
        }
        let path_and_query = match uri.path_and_query().map(|p| p.as_str()) {
            None | Some("") => "/".to_owned(),
            Some(p) if p.starts_with('?') => format!("/{p}"),
            Some(p) => p.to_owned(),
        };
        Ok(Self {
            url: text.to_owned(),
            https,
            host: host.to_owned(),
            port: authority.port_u16().unwrap_or(default_port),
            host_header: authority.as_str().to_owned(),
            path_and_query,
        })
    }

    /// Where a redirect's `Location` points from here (RFC 3986 reference resolution).
    pub(super) fn join(&self, location: &str) -> Result<Self, TargetError> {
        let location = location.split('#').next().unwrap_or_default().trim();
        let scheme = if self.https { "https" } else { "http" };
        let absolute = if scheme_of(location).is_some() {
            location.to_owned()
        } else if location.starts_with("//") {
            format!("{scheme}:{location}")
        } else if location.starts_with('/') {
            format!("{scheme}://{}{location}", self.host_header)
        } else {
            let path = self.path_and_query.split('?').next().unwrap_or("/");
            if location.is_empty() {
                return Err(TargetError::Invalid("an empty Location".into()));
            } else if location.starts_with('?') {
                format!("{scheme}://{}{path}{location}", self.host_header)
            } else {
                let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
                format!("{scheme}://{}{dir}{location}", self.host_header)
            }
        };
        let mut next = Self::parse(&absolute)?;
        let (path, query) = match next.path_and_query.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (next.path_and_query.as_str(), None),
        };
        let path = remove_dot_segments(path);
        next.path_and_query = match query {
            Some(query) => format!("{path}?{query}"),
            None => path,
        };
        next.url = format!(
            "{}://{}{}",
            if next.https { "https" } else { "http" },
            next.host_header,
            next.path_and_query
        );
        Ok(next)
    }

    /// `host:port` (an IPv6 host in brackets), for messages.
    pub(super) fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// An absolute path without its `.` and `..` segments (RFC 3986 section 5.2.4), as a browser
/// or curl requests a redirect's target.
fn remove_dot_segments(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *segment {
            "." | ".." => {
                if *segment == ".." {
                    out.pop();
                }
                if last {
                    out.push("");
                }
            }
            other => out.push(other),
        }
    }
    format!("/{}", out.join("/"))
}

//! Reads a process's `/metrics` (Prometheus text format) and probes (`/healthz`, `/readyz`) the
//! way Prometheus and the kubelet do: plain HTTP GET on the address given to
//! `--metrics-bind-address` / `--health-probe-bind-address`.
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `GET path` on `addr`: the status code and the body.
pub fn get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connect to {addr}"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    tcp.read_to_string(&mut response)
        .with_context(|| format!("read GET {path} from {addr}"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .with_context(|| format!("GET {path} from {addr}: no HTTP head in {response:?}"))?;
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("GET {path} from {addr}: no status in {head:?}"))?;
    Ok((code, body.to_owned()))
}

/// One sample's labels and value.
type Sample = (BTreeMap<String, String>, f64);

/// One scrape: every sample by metric name, each with its labels.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    samples: BTreeMap<String, Vec<Sample>>,
}

impl Samples {
    /// Scrapes `GET /metrics` on `addr`.
    pub fn scrape(addr: SocketAddr) -> Result<Self> {
        let (code, body) = get(addr, "/metrics")?;
        if code != 200 {
            bail!("GET /metrics from {addr}: HTTP {code}: {body}");
        }
        Self::parse(&body)
    }

    /// Parses the Prometheus text format (no escapes in label values are expected here).
    pub fn parse(text: &str) -> Result<Self> {
        let mut samples: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for line in text.lines() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = line
                .rsplit_once(' ')
                .with_context(|| format!("sample without a value: {line:?}"))?;
            let value: f64 = value
                .parse()
                .with_context(|| format!("value of {line:?}"))?;
            let (name, labels) = match series.split_once('{') {
                None => (series.to_owned(), BTreeMap::new()),
                Some((name, rest)) => {
                    let inner = rest
                        .strip_suffix('}')
                        .with_context(|| format!("unclosed labels in {line:?}"))?;
                    let mut labels = BTreeMap::new();
                    for pair in inner.split(',').filter(|p| !p.is_empty()) {
                        let (k, v) = pair
                            .split_once('=')
                            .with_context(|| format!("label {pair:?} in {line:?}"))?;
                        labels.insert(k.to_owned(), v.trim_matches('"').to_owned());
                    }
                    (name.to_owned(), labels)
                }
            };
            samples.entry(name).or_default().push((labels, value));
        }
        Ok(Self { samples })
    }

    /// The sum of `name`'s samples whose labels include all of `labels`; `None` when no sample
    /// matches (the series does not exist).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<f64> = self
            .samples
            .get(name)?
            .iter()
            .filter(|(have, _)| {
                labels
                    .iter()
                    .all(|(k, v)| have.get(*k).is_some_and(|h| h == v))
            })
            .map(|(_, v)| *v)
            .collect();
        (!matching.is_empty()).then(|| matching.iter().sum())
    }

    /// Every sample of `name`: its labels and value (none when the series does not exist).
    pub fn series(&self, name: &str) -> Vec<(&BTreeMap<String, String>, f64)> {
        self.samples
            .get(name)
            .map(|s| s.iter().map(|(l, v)| (l, *v)).collect())
            .unwrap_or_default()
    }

    /// Like [`Samples::value`], 0 when the series does not exist (a counter never incremented).
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_matched_by_label_subsets() {
        // Invariant: a value is the sum over the series that carry the asked labels.
        let s = Samples::parse(
            "# HELP x help\nx_total{a=\"1\",b=\"2\"} 3\nx_total{a=\"1\",b=\"3\"} 4\ny 5.5\n",
        )
        .expect("parse");
        assert_eq!(s.value("x_total", &[("a", "1")]), Some(7.0));
        assert_eq!(s.value("x_total", &[("b", "3")]), Some(4.0));
        assert_eq!(s.value("x_total", &[("b", "9")]), None);
        assert_eq!(s.value("y", &[]), Some(5.5));
        assert_eq!(s.count("z", &[]), 0.0);
    }
}

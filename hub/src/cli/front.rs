//! `flower-hub fleet-front`: the Fleet front ([`crate::flower::front`]) as its own process, the
//! sidecar the Kubernetes hub puts beside a unified-dialect SuperLink.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::flower::front::{self, FrontConfig, FrontLimits, FrontTls};

/// Arguments of `flower-hub fleet-front`.
#[derive(clap::Args, Debug)]
pub struct FleetFrontArgs {
    /// Address to listen on: where SuperNodes dial.
    #[arg(long, default_value = "0.0.0.0:9092")]
    pub listen: SocketAddr,
    /// The SuperLink's own server (`host:port`; Fleet, Control and Runtime APIs). Its
    /// certificate must name the host (the hub's SuperLink certificates carry 127.0.0.1).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub upstream: String,
    /// Directory holding the SuperLink's `ca.crt`, `tls.crt` and `tls.key` (its TLS Secret):
    /// the front serves that certificate and verifies the SuperLink with that CA.
    #[arg(
        long,
        required_unless_present = "insecure",
        conflicts_with = "insecure"
    )]
    pub tls_dir: Option<PathBuf>,
    /// Plaintext on both sides (an insecure Federation).
    #[arg(long)]
    pub insecure: bool,
    /// Connections served at once; when all are taken, new ones wait in the listen backlog.
    #[arg(long, default_value_t = FrontLimits::default().max_connections)]
    pub max_connections: usize,
    /// Of --max-connections, how many only known addresses may take (an address is known for
    /// 24 h after the SuperLink answered one of its Fleet requests with a 2xx): a flood from new
    /// addresses cannot take them from working SuperNodes.
    #[arg(long, default_value_t = FrontLimits::default().reserved_connections)]
    pub reserved_connections: usize,
    /// Connections at once from one address (an IPv4 address, or an IPv6 /64) that is not known.
    #[arg(long, default_value_t = FrontLimits::default().max_connections_per_address)]
    pub max_connections_per_address: usize,
    /// Connections at once from one known address (SuperNodes behind one NAT share it).
    #[arg(long, default_value_t = FrontLimits::default().max_connections_per_known_address)]
    pub max_connections_per_known_address: usize,
    /// Largest request body passed to the SuperLink, in bytes (suffixes KiB, MiB, GiB); a larger
    /// one is answered 413 without reaching it. The default is Flower's own largest message.
    #[arg(long, default_value_t = FrontLimits::default().max_body_bytes, value_parser = parse_bytes)]
    pub max_body_bytes: u64,
    /// Time a request body has from its first byte read to its last (then 408).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub body_timeout: Duration,
    /// Longest a request body may go without a byte, and a response without the client taking
    /// a byte of it.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub stall_timeout: Duration,
    /// Longest a connection waits for the complete headers of its next request: an idle
    /// kept-alive connection is closed after it.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
}

impl FleetFrontArgs {
    /// The bounds the flags ask for.
    pub fn limits(&self) -> FrontLimits {
        FrontLimits {
            max_connections: self.max_connections,
            reserved_connections: self.reserved_connections,
            max_connections_per_address: self.max_connections_per_address,
            max_connections_per_known_address: self.max_connections_per_known_address,
            max_body_bytes: self.max_body_bytes,
            body_timeout: self.body_timeout,
            stall_timeout: self.stall_timeout,
            idle_timeout: self.idle_timeout,
            ..FrontLimits::default()
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    flower_addon_runtime::cli::parse_duration(s)
}

/// A byte count: digits, optionally followed by `KiB`, `MiB` or `GiB`.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected e.g. 67108864, 64MiB, 2GiB"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(format!("invalid size unit in {s:?}: use KiB, MiB or GiB")),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// Runs the front until SIGINT/SIGTERM.
pub fn fleet_front(args: FleetFrontArgs) -> anyhow::Result<ExitCode> {
    let tls = match &args.tls_dir {
        Some(dir) => {
            let read = |name: &str| {
                let path = dir.join(name);
                std::fs::read_to_string(&path)
                    .with_context(|| format!("--tls-dir: reading {}", path.display()))
            };
            let host = args
                .upstream
                .rsplit_once(':')
                .map_or(args.upstream.as_str(), |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']');
            Some(
                FrontTls::from_pem(&read("ca.crt")?, &read("tls.crt")?, &read("tls.key")?, host)
                    .with_context(|| format!("--tls-dir {}", dir.display()))?,
            )
        }
        None => None,
    };
    let config = FrontConfig {
        upstream: args.upstream.clone(),
        tls,
    };
    let limits = args.limits();
    limits.check().context("fleet-front limits")?;
    raise_fd_limit(limits.max_connections);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            let listener = tokio::net::TcpListener::bind(args.listen)
                .await
                .with_context(|| format!("--listen {}", args.listen))?;
            tracing::info!(
                listen = %args.listen,
                upstream = %args.upstream,
                tls = config.tls.is_some(),
                ?limits,
                "fleet front: serving the Fleet API only"
            );
            front::serve_with_limits(listener, config, limits, async {
                super::serve::shutdown_signal().await;
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        })
}

/// Raises the soft limit on open files to the hard one, as `flower-hub serve` does: each
/// connection takes two descriptors (client and SuperLink), and the caps, not a default soft
/// limit of 1,024, should decide which connections are refused.
fn raise_fd_limit(max_connections: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let soft = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(error) => {
                tracing::warn!(%error, soft, hard, "cannot raise the open-file limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(error) => {
            tracing::warn!(%error, "cannot read the open-file limit");
            return;
        }
    };
    let needed = 2 * max_connections as u64 + 64;
    if soft < needed {
        tracing::warn!(
            open_files = soft,
            needed,
            "fleet front: the open-file limit is below two per --max-connections; accepts will fail before the caps apply"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: FleetFrontArgs,
    }

    #[test]
    fn the_flag_defaults_are_the_library_defaults() {
        // `fleet-front` without limit flags runs with exactly FrontLimits::default().
        let cli = Cli::try_parse_from(["fleet-front", "--insecure"]).unwrap();
        assert_eq!(cli.args.limits(), FrontLimits::default());
    }

    #[test]
    fn limit_flags_reach_the_limits() {
        // Each flag sets its field.
        let cli = Cli::try_parse_from([
            "fleet-front",
            "--insecure",
            "--max-connections=100",
            "--reserved-connections=10",
            "--max-connections-per-address=3",
            "--max-connections-per-known-address=30",
            "--max-body-bytes=64MiB",
            "--body-timeout=5s",
            "--stall-timeout=2s",
            "--idle-timeout=1m",
        ])
        .unwrap();
        assert_eq!(
            cli.args.limits(),
            FrontLimits {
                max_connections: 100,
                reserved_connections: 10,
                max_connections_per_address: 3,
                max_connections_per_known_address: 30,
                max_body_bytes: 64 << 20,
                body_timeout: Duration::from_secs(5),
                stall_timeout: Duration::from_secs(2),
                idle_timeout: Duration::from_secs(60),
                ..FrontLimits::default()
            }
        );
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        // Plain bytes and KiB/MiB/GiB; anything else is refused with the accepted forms.
        assert_eq!(parse_bytes("2147483647"), Ok(2_147_483_647));
        assert_eq!(parse_bytes("512KiB"), Ok(512 << 10));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert!(parse_bytes("2GB").is_err());
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("99999999999GiB").is_err());
    }
}

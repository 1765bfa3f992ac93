//! `flower-hub fleet-front`: the Fleet front ([`crate::flower::front`]) as its own process, the
//! sidecar the Kubernetes hub puts beside a unified-dialect SuperLink.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::flower::front::{self, FrontConfig, FrontTls};

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
                "fleet front: serving the Fleet API only"
            );
            front::serve(listener, config, async {
                super::serve::shutdown_signal().await;
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        })
}

//! `flower-hub serve`: the long-running hub (Kubernetes mode or standalone).
use crate::channel::{ChannelConfig, ChannelServer, InMemoryWorkSource};
use crate::cli::registration::DEFAULT_PORT;
use crate::store::file::FileStore;
use crate::store::load_or_create_ca;
use anyhow::Context;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `flower-hub serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Run without Kubernetes: state (CA, tokens, clusters) in --state-dir.
    #[arg(long)]
    pub standalone: bool,
    /// State directory (standalone mode).
    #[arg(
        long,
        env = "FLOWER_HUB_STATE_DIR",
        required_if_eq("standalone", "true")
    )]
    pub state_dir: Option<PathBuf>,
    /// Address of the work channel (repeatable).
    #[arg(long, default_values_t = [SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT))])]
    pub listen: Vec<SocketAddr>,
    /// Name or IP agents dial; goes into the server certificate (repeatable; 127.0.0.1 and
    /// localhost are always included). The first one is printed in join commands.
    #[arg(long = "advertise-address")]
    pub advertise_address: Vec<String>,
    /// Accept joining clusters whose labels include `key=value` (repeatable; all must match).
    #[arg(long = "auto-accept", value_parser = flower_addon_agent::cli::join::parse_pair)]
    pub auto_accept: Vec<(String, String)>,
    /// Validity of agent client certificates (renewed by agents at 80 %).
    #[arg(long, default_value = "30d", value_parser = parse_duration)]
    pub cert_validity: Duration,
    /// A cluster without heartbeat for this long becomes unavailable.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub lease_duration: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    flower_addon_agent::cli::join::parse_duration(s)
}

/// `flower-hub serve`.
pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    if !args.standalone {
        anyhow::bail!(
            "Kubernetes mode is not available yet: use `flower-hub serve --standalone --state-dir DIR`"
        );
    }
    let dir = args
        .state_dir
        .clone()
        .context("--state-dir is required with --standalone")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(async move {
        let store = Arc::new(FileStore::open(&dir)?);
        let ca = Arc::new(load_or_create_ca(store.as_ref()).await?);
        let mut listeners = Vec::new();
        for addr in &args.listen {
            listeners.push(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("listen on {addr}"))?,
            );
        }
        let port = listeners
            .first()
            .and_then(|l| l.local_addr().ok())
            .map(|a| a.port())
            .unwrap_or(DEFAULT_PORT);
        let host = args
            .advertise_address
            .first()
            .cloned()
            .unwrap_or_else(|| "127.0.0.1".to_string());
        let hub = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        std::fs::write(dir.join("hub-address"), format!("{hub}\n"))
            .with_context(|| format!("write {}", dir.join("hub-address").display()))?;
        println!(
            "flower-hub: serving the work channel on {hub} (CA hash {})",
            ca.hash()
        );
        println!(
            "flower-hub: add a cluster with `flower-hub token create --state-dir {}`",
            dir.display()
        );

        // Notice `accept`/`revoke` run from other processes.
        {
            let store = store.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    if let Err(error) = store.poll_external_changes() {
                        tracing::warn!(%error, "cannot scan the state directory");
                    }
                }
            });
        }
        let config = ChannelConfig {
            advertise: args.advertise_address.clone(),
            cert_validity: args.cert_validity,
            lease_duration: args.lease_duration,
            auto_accept: args.auto_accept.into_iter().collect::<BTreeMap<_, _>>(),
            ..ChannelConfig::default()
        };
        let work = Arc::new(InMemoryWorkSource::new());
        let server = ChannelServer::new(store, work, ca, config);
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("interrupted: stopping");
        };
        server.serve(listeners, shutdown).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

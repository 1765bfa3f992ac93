//! `flower-agent join`.
use crate::join::{JoinOptions, join as join_hub};
use crate::tls::HubAddress;
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `flower-agent join`.
#[derive(clap::Args, Debug)]
pub struct JoinArgs {
    /// `HOST:PORT` of the hub's work channel (as printed by `flower-hub token create`).
    #[arg(long)]
    pub hub: String,
    /// Bootstrap token `<id>.<secret>` from `flower-hub token create`.
    #[arg(long, env = "FLOWER_AGENT_TOKEN")]
    pub token: String,
    /// `sha256:<hex>` of the hub CA's public key; the agent refuses a hub that does not match.
    #[arg(long)]
    pub ca_hash: String,
    /// Name to register this cluster under (DNS-1123 label).
    #[arg(long)]
    pub cluster_name: String,
    /// Label reported to the hub, `key=value` (repeatable).
    #[arg(long = "label", value_parser = parse_pair)]
    pub labels: Vec<(String, String)>,
    /// Cluster claim reported to the hub, `name=value` (repeatable).
    #[arg(long = "claim", value_parser = parse_pair)]
    pub claims: Vec<(String, String)>,
    /// Directory for the key and credentials (files 0600).
    #[arg(long)]
    pub state_dir: PathBuf,
    /// Name the hub's certificate must carry (default: the host of --hub).
    #[arg(long)]
    pub server_name: Option<String>,
    /// Stop waiting for acceptance after this long (e.g. `10m`; default: wait forever).
    #[arg(long, value_parser = humantime_duration)]
    pub timeout: Option<Duration>,
}

/// Parses `key=value`.
pub fn parse_pair(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected key=value, got {s:?}"))?;
    if k.is_empty() {
        return Err(format!("empty key in {s:?}"));
    }
    Ok((k.to_string(), v.to_string()))
}

fn humantime_duration(s: &str) -> Result<Duration, String> {
    parse_duration(s)
}

/// Parses durations like `90s`, `10m`, `24h`, `30d`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 90s, 10m, 24h, 30d"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => return Err(format!("invalid duration unit in {s:?}: use s, m, h or d")),
    };
    Ok(Duration::from_secs(secs))
}

/// `flower-agent join`.
pub fn join(args: JoinArgs) -> anyhow::Result<ExitCode> {
    let mut hub = HubAddress::new(&args.hub);
    if let Some(name) = args.server_name {
        hub.server_name = name;
    }
    let options = JoinOptions {
        hub,
        token: args.token,
        ca_hash: args.ca_hash,
        cluster_name: args.cluster_name,
        labels: args.labels.into_iter().collect::<BTreeMap<_, _>>(),
        claims: args.claims.into_iter().collect::<BTreeMap<_, _>>(),
        state_dir: args.state_dir,
        max_wait: args.timeout,
        max_backoff: Duration::from_secs(30),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(async {
        let mut progress = |line: &str| eprintln!("flower-agent: {line}");
        join_hub(&options, &mut progress).await
    })?;
    Ok(ExitCode::SUCCESS)
}

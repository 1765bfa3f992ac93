//! Registration commands: `token create|list|delete`, `accept`, `revoke`, `status`. They work on
//! the standalone state directory, also while `flower-hub serve` runs (it notices changes within
//! a second).
use crate::store::file::FileStore;
use crate::store::{CONDITION_AVAILABLE, CONDITION_HUB_ACCEPTED, ClusterStore, load_or_create_ca};
use crate::tokens;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

/// Default port of the work channel.
pub const DEFAULT_PORT: u16 = 9443;

/// `flower-hub token …`.
#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a bootstrap token and print a ready-to-paste `flower-agent join` line.
    Create(TokenCreateArgs),
    /// List bootstrap tokens (ids and expiry; secrets are not stored).
    List(StateDirArgs),
    /// Delete (revoke) a bootstrap token by id.
    Delete(TokenDeleteArgs),
}

/// The state directory of a standalone hub.
#[derive(clap::Args, Debug)]
pub struct StateDirArgs {
    /// State directory of the standalone hub (tokens, clusters, CA).
    #[arg(long, env = "FLOWER_HUB_STATE_DIR")]
    pub state_dir: PathBuf,
}

/// Output format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Human-readable lines.
    Text,
    /// One JSON object.
    Json,
}

/// Arguments of `flower-hub token create`.
#[derive(clap::Args, Debug)]
pub struct TokenCreateArgs {
    #[command(flatten)]
    state: StateDirArgs,
    /// Lifetime of the token (e.g. `30m`, `24h`, `7d`).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub ttl: Duration,
    /// `HOST:PORT` agents dial (default: the address `serve` advertises, from the state dir).
    #[arg(long)]
    pub hub: Option<String>,
    /// Free text stored with the token.
    #[arg(long, default_value = "")]
    pub description: String,
    /// Output format; JSON has keys `token`, `caHash`, `hub`, `expires`, `joinCommand`.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Arguments of `flower-hub token delete`.
#[derive(clap::Args, Debug)]
pub struct TokenDeleteArgs {
    #[command(flatten)]
    state: StateDirArgs,
    /// Token id (the part before the dot) or the whole token.
    pub id: String,
}

/// Arguments of `flower-hub accept`.
#[derive(clap::Args, Debug)]
pub struct AcceptArgs {
    /// Name of the ManagedCluster to accept.
    pub cluster: String,
    #[command(flatten)]
    state: StateDirArgs,
}

/// Arguments of `flower-hub revoke`.
#[derive(clap::Args, Debug)]
pub struct RevokeArgs {
    /// Name of the ManagedCluster to revoke (sets hubAcceptsClient=false; its stream closes).
    pub cluster: String,
    /// Delete the cluster record too, so the name can join again with a new key.
    #[arg(long)]
    pub delete: bool,
    #[command(flatten)]
    state: StateDirArgs,
}

/// Arguments of `flower-hub status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    state: StateDirArgs,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: Output,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    flower_addon_agent::cli::join::parse_duration(s)
}

fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?
        .block_on(f)
}

/// The advertised `HOST:PORT` that `serve` records in the state directory.
pub fn advertised_hub(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("hub-address"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// `flower-hub token …`.
pub fn token(cmd: TokenCommand) -> anyhow::Result<ExitCode> {
    block_on(async move {
        match cmd {
            TokenCommand::Create(args) => token_create(args).await,
            TokenCommand::List(args) => {
                let store = FileStore::open(&args.state_dir)?;
                let now = tokens::unix_now();
                println!("{:<8} {:<22} {:<8} DESCRIPTION", "ID", "EXPIRES", "STATE");
                for t in store.list_tokens().await? {
                    let state = if now >= t.expires_unix {
                        "expired"
                    } else {
                        "valid"
                    };
                    println!(
                        "{:<8} {:<22} {:<8} {}",
                        t.id,
                        rfc3339(t.expires_unix),
                        state,
                        t.description
                    );
                }
                Ok(ExitCode::SUCCESS)
            }
            TokenCommand::Delete(args) => {
                let store = FileStore::open(&args.state.state_dir)?;
                let id = args.id.split('.').next().unwrap_or_default();
                if store.delete_token(id).await? {
                    println!("token {id} deleted");
                    Ok(ExitCode::SUCCESS)
                } else {
                    eprintln!("flower-hub: no token with id {id:?} (see `flower-hub token list`)");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    })
}

async fn token_create(args: TokenCreateArgs) -> anyhow::Result<ExitCode> {
    let dir = &args.state.state_dir;
    let store = FileStore::open(dir)?;
    let ca = load_or_create_ca(&store).await?;
    let new = tokens::generate(args.ttl, &args.description);
    store.put_token(&new.record).await?;
    let hub = args
        .hub
        .or_else(|| advertised_hub(dir))
        .unwrap_or_else(|| format!("HUB_HOST:{DEFAULT_PORT}"));
    let join = format!(
        "flower-agent join --hub {hub} --token {} --ca-hash {} --cluster-name CLUSTER_NAME --state-dir /var/lib/flower-agent",
        new.token,
        ca.hash()
    );
    match args.output {
        Output::Json => {
            let value = serde_json::json!({
                "token": new.token,
                "caHash": ca.hash(),
                "hub": hub,
                "expires": rfc3339(new.record.expires_unix),
                "joinCommand": join,
            });
            println!("{}", serde_json::to_string_pretty(&value)?);
        }
        Output::Text => {
            println!("token:   {}", new.token);
            println!("caHash:  {}", ca.hash());
            println!("hub:     {hub}");
            println!("expires: {}", rfc3339(new.record.expires_unix));
            println!();
            println!("On the cluster or device to add, run (choose CLUSTER_NAME):");
            println!("  {join}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `flower-hub accept`.
pub fn accept(args: AcceptArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = FileStore::open(&args.state.state_dir)?;
        store
            .set_accepted(&args.cluster, true)
            .await
            .with_context(|| {
                format!(
                    "accept {}: see `flower-hub status` for registered clusters",
                    args.cluster
                )
            })?;
        println!("cluster {} accepted", args.cluster);
        Ok(ExitCode::SUCCESS)
    })
}

/// `flower-hub revoke`.
pub fn revoke(args: RevokeArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = FileStore::open(&args.state.state_dir)?;
        if args.delete {
            if store.delete_cluster(&args.cluster).await? {
                println!("cluster {} deleted", args.cluster);
                return Ok(ExitCode::SUCCESS);
            }
            eprintln!("flower-hub: no cluster named {:?}", args.cluster);
            return Ok(ExitCode::FAILURE);
        }
        store.set_accepted(&args.cluster, false).await?;
        println!("cluster {} revoked (hubAcceptsClient=false)", args.cluster);
        Ok(ExitCode::SUCCESS)
    })
}

/// `flower-hub status`.
pub fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let store = FileStore::open(&args.state.state_dir)?;
        let clusters = store.list_clusters().await?;
        // Federations are written by the running hub after each reconcile pass.
        let hub_status = crate::standalone::status::HubStatus::read(&args.state.state_dir).ok();
        if args.output == Output::Json {
            let rows: Vec<_> = clusters
                .iter()
                .map(|c| {
                    serde_json::json!({
                        "name": c.registration.name,
                        "hubAcceptsClient": c.hub_accepts_client,
                        "labels": c.registration.labels,
                        "claims": c.registration.claims,
                        "keyFingerprint": c.registration.key_fingerprint,
                        "status": c.status,
                    })
                })
                .collect();
            let (federations, problems) = hub_status
                .map(|s| (s.federations, s.problems))
                .unwrap_or_default();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "federations": federations,
                    "clusters": rows,
                    "problems": problems,
                }))?
            );
            return Ok(ExitCode::SUCCESS);
        }
        match &hub_status {
            Some(s) => {
                print!("{}", s.federation_table());
                for p in &s.problems {
                    println!("problem: {p}");
                }
                println!();
            }
            None => println!("(no status.json yet: is `flower-hub serve --standalone` running?)\n"),
        }
        println!(
            "{:<24} {:<9} {:<10} {:<22} LABELS",
            "CLUSTER", "ACCEPTED", "AVAILABLE", "LAST HEARTBEAT"
        );
        for c in &clusters {
            let cond = |t: &str| {
                c.status
                    .condition(t)
                    .map(|c| c.status.clone())
                    .unwrap_or_else(|| "Unknown".into())
            };
            let accepted = if c.hub_accepts_client {
                "true".to_string()
            } else {
                format!("false ({})", cond(CONDITION_HUB_ACCEPTED))
            };
            let labels: Vec<String> = c
                .registration
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            println!(
                "{:<24} {:<9} {:<10} {:<22} {}",
                c.registration.name,
                if c.hub_accepts_client {
                    "true"
                } else {
                    "false"
                },
                cond(CONDITION_AVAILABLE),
                c.status
                    .last_heartbeat_unix
                    .map(rfc3339)
                    .unwrap_or_else(|| "-".into()),
                labels.join(",")
            );
            let _ = accepted;
        }
        if clusters.is_empty() {
            println!(
                "(no clusters: create a token with `flower-hub token create` and run the printed `flower-agent join`)"
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn rfc3339(unix: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(unix)).to_string()
}

//! `flower-hub token create|list|delete`: bootstrap tokens in the hub's store, and what
//! `create` prints for the agent (the `flower-agent join` line, JSON, or the agent's bootstrap
//! Secret).
use super::{
    Bootstrap, DEFAULT_PORT, Hub, HubArgs, advertised_hub, block_on, bootstrap_secret_yaml,
    explain, kube_api, parse_duration, rfc3339, secret,
};
use crate::registration::store::{ClusterStore, StoreError, load_or_create_ca};
use crate::registration::tokens;
use anyhow::Context;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

/// `flower-hub token …`.
#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a bootstrap token and print a ready-to-paste `flower-agent join` line (or, with
    /// `-o secret`, the agent's bootstrap Secret).
    #[command(
        after_help = "Examples:\n  flower-hub token create --cluster-name spoke-1 --label env=prod -o secret > spoke-1-bootstrap.yaml\n  flower-hub token create --state-dir /var/lib/flower-hub --ttl 24h"
    )]
    Create(TokenCreateArgs),
    /// List bootstrap tokens (ids and expiry; secrets are not stored).
    #[command(after_help = "Example:\n  flower-hub token list --state-dir /var/lib/flower-hub")]
    List(HubArgs),
    /// Delete (revoke) a bootstrap token by id.
    #[command(after_help = "Example:\n  flower-hub token delete abcdef")]
    Delete(TokenDeleteArgs),
}

/// Output format of `token create`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenOutput {
    /// Human-readable lines and the `flower-agent join` command.
    Text,
    /// One JSON object.
    Json,
    /// The agent's bootstrap Secret as YAML, for `kubectl apply -f -` on the spoke cluster
    /// (needs --cluster-name).
    Secret,
}

/// Arguments of `flower-hub token create`.
#[derive(clap::Args, Debug)]
pub struct TokenCreateArgs {
    #[command(flatten)]
    hub_args: HubArgs,
    /// Lifetime of the token (e.g. `30m`, `24h`, `7d`; at most `3650d`).
    #[arg(long, default_value = "24h", value_parser = parse_ttl)]
    pub ttl: Duration,
    /// `HOST:PORT` agents dial (default: standalone, the address `serve` advertises; Kubernetes,
    /// derived from the Service flower-hub).
    #[arg(long)]
    pub hub: Option<String>,
    /// Name the hub certificate is verified by (default in Kubernetes mode:
    /// `flower-hub.<namespace>.svc`; standalone: the host of --hub).
    #[arg(long)]
    pub server_name: Option<String>,
    /// Free text stored with the token.
    #[arg(long, default_value = "")]
    pub description: String,
    /// Bind the token to this cluster name: it joins only as NAME, and it is the only kind of
    /// token that binds a ManagedCluster an admin created before the agent joined (required with
    /// `-o secret`; used in the printed join command).
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// Label the cluster gets, `key=value` (repeatable): the admin's labels, which placement
    /// and `serve --auto-accept` match. Labels an agent reports itself are recorded as claims.
    #[arg(long = "label", value_parser = flower_addon_runtime::cli::parse_pair)]
    pub labels: Vec<(String, String)>,
    /// How many clusters the token may register (unlimited when absent); re-joins of a cluster
    /// already registered with the same key do not count.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub uses: Option<u32>,
    /// Cluster claim the agent reports, `name=value` (repeatable).
    #[arg(long = "claim", value_parser = flower_addon_runtime::cli::parse_pair)]
    pub claims: Vec<(String, String)>,
    /// Name of the bootstrap Secret (`-o secret`).
    #[arg(long, default_value = secret::DEFAULT_SECRET_NAME)]
    pub secret_name: String,
    /// Namespace of the agent, where the bootstrap Secret goes (`-o secret`).
    #[arg(long, default_value = secret::DEFAULT_AGENT_NAMESPACE)]
    pub agent_namespace: String,
    /// Output format; JSON has keys `token`, `caHash`, `hub`, `expires`, `joinCommand` and
    /// `serverName` when known; `secret` prints the agent's bootstrap Secret.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: TokenOutput,
}

/// Parses `--ttl`, refusing lifetimes above [`tokens::MAX_TTL`] (clap names the flag).
fn parse_ttl(s: &str) -> Result<Duration, String> {
    let max_days = tokens::MAX_TTL.as_secs() / 86400;
    let ttl = parse_duration(s).map_err(|e| format!("{e} (at most {max_days}d)"))?;
    if ttl > tokens::MAX_TTL {
        return Err(format!(
            "a bootstrap token may live at most {max_days}d: pass a shorter --ttl (e.g. 24h) and \
             create a new token when it expires"
        ));
    }
    Ok(ttl)
}

/// Arguments of `flower-hub token delete`.
#[derive(clap::Args, Debug)]
pub struct TokenDeleteArgs {
    #[command(flatten)]
    hub_args: HubArgs,
    /// Token id (the part before the dot) or the whole token.
    pub id: String,
}

/// `flower-hub token …`.
pub fn token(cmd: TokenCommand) -> anyhow::Result<ExitCode> {
    block_on(async move {
        match cmd {
            TokenCommand::Create(args) => token_create(args).await,
            TokenCommand::List(args) => {
                let hub = Hub::open(&args).await?;
                with_store!(&hub, s => token_list(s).await.map_err(|e| explain(e, &hub)))
            }
            TokenCommand::Delete(args) => {
                let hub = Hub::open(&args.hub_args).await?;
                let id = args.id.split('.').next().unwrap_or_default();
                let deleted = with_store!(&hub, s => s.delete_token(id).await)
                    .map_err(|e| explain(e, &hub))?;
                if deleted {
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

async fn token_list<S: ClusterStore>(store: &S) -> Result<ExitCode, StoreError> {
    let now = tokens::unix_now();
    println!(
        "{:<8} {:<22} {:<8} {:<16} {:<6} {:<24} DESCRIPTION",
        "ID", "EXPIRES", "STATE", "CLUSTER", "USES", "LABELS"
    );
    for t in store.list_tokens().await? {
        // An expiry no date can show was not written by a current `token create`.
        let expires = rfc3339(t.expires_unix);
        let state = if expires.is_none() {
            "invalid"
        } else if now >= t.expires_unix {
            "expired"
        } else if !t.has_uses_left() {
            "used-up"
        } else {
            "valid"
        };
        let uses = match t.max_uses {
            Some(max) => format!("{}/{max}", t.uses),
            None => t.uses.to_string(),
        };
        let labels: Vec<String> = t.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let labels = if labels.is_empty() {
            "-".to_owned()
        } else {
            labels.join(",")
        };
        println!(
            "{:<8} {:<22} {:<8} {:<16} {:<6} {:<24} {}",
            t.id,
            expires.as_deref().unwrap_or("invalid"),
            state,
            t.cluster_name.as_deref().unwrap_or("*"),
            uses,
            labels,
            t.description
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn token_create(args: TokenCreateArgs) -> anyhow::Result<ExitCode> {
    // Everything the output needs is checked before a token exists.
    if let Some(name) = &args.cluster_name {
        crate::channel::validate_cluster_name(name)
            .map_err(|s| anyhow::anyhow!("--cluster-name: {}", s.message()))?;
    }
    if args.output == TokenOutput::Secret && args.cluster_name.is_none() {
        anyhow::bail!(
            "-o secret needs --cluster-name NAME: the bootstrap Secret says which name the agent \
             joins as"
        );
    }
    let hub = Hub::open(&args.hub_args).await?;
    let (ca, address, server_name) = match &hub {
        Hub::File { store, dir } => {
            let known = args.hub.clone().or_else(|| advertised_hub(dir));
            if known.is_none() && args.output == TokenOutput::Secret {
                anyhow::bail!(
                    "no hub address for the bootstrap Secret: pass --hub HOST:PORT (or start \
                     `flower-hub serve --standalone --advertise-address HOST` once)"
                );
            }
            let address = known.unwrap_or_else(|| format!("HUB_HOST:{DEFAULT_PORT}"));
            let ca = load_or_create_ca(store).await?;
            (ca, address, args.server_name.clone())
        }
        Hub::Kube {
            client, namespace, ..
        } => {
            let ca = crate::cli::serve::load_or_create_ca_secret(client.clone(), namespace).await?;
            let address = match &args.hub {
                Some(hub) => hub.clone(),
                None => {
                    let derived = kube_api::derive_hub_address(client, namespace).await?;
                    if !derived.resolved && args.output == TokenOutput::Secret {
                        anyhow::bail!(
                            "cannot derive the hub address for the bootstrap Secret: {}",
                            derived.hint.unwrap_or_default()
                        );
                    }
                    if let Some(hint) = &derived.hint {
                        eprintln!("flower-hub: hub address {}: {hint}", derived.address);
                    }
                    derived.address
                }
            };
            let server_name = args
                .server_name
                .clone()
                .unwrap_or_else(|| crate::kube::store::hub_service_server_name(namespace));
            (ca, address, Some(server_name))
        }
    };
    let new = tokens::generate_scoped(
        args.ttl,
        &args.description,
        tokens::TokenScope {
            cluster_name: args.cluster_name.clone(),
            labels: args.labels.iter().cloned().collect(),
            max_uses: args.uses,
        },
    );
    with_store!(&hub, s => s.put_token(&new.record).await).map_err(|e| explain(e, &hub))?;

    let bootstrap = Bootstrap {
        hub: address,
        token: new.token.clone(),
        ca_hash: ca.hash().to_string(),
        server_name,
        cluster_name: args.cluster_name.clone().unwrap_or_default(),
        labels: args.labels.iter().cloned().collect::<BTreeMap<_, _>>(),
        claims: args.claims.iter().cloned().collect::<BTreeMap<_, _>>(),
    };
    let expires = rfc3339(new.record.expires_unix)
        .context("the token's expiry is not a date: pass a shorter --ttl")?;
    match args.output {
        TokenOutput::Secret => {
            print!(
                "{}",
                bootstrap_secret_yaml(&bootstrap, &args.secret_name, &args.agent_namespace)?
            );
        }
        TokenOutput::Json => {
            let mut value = serde_json::json!({
                "token": bootstrap.token,
                "caHash": bootstrap.ca_hash,
                "hub": bootstrap.hub,
                "expires": expires,
                "joinCommand": join_command(&bootstrap),
            });
            if let Some(server_name) = &bootstrap.server_name {
                value["serverName"] = server_name.clone().into();
            }
            println!("{}", serde_json::to_string_pretty(&value)?);
        }
        TokenOutput::Text => {
            // Values aligned; "serverName:" is the longest key when present.
            let w = if bootstrap.server_name.is_some() {
                12
            } else {
                9
            };
            println!("{:<w$}{}", "token:", bootstrap.token);
            println!("{:<w$}{}", "caHash:", bootstrap.ca_hash);
            println!("{:<w$}{}", "hub:", bootstrap.hub);
            if let Some(server_name) = &bootstrap.server_name {
                println!("{:<w$}{server_name}", "serverName:");
            }
            println!("{:<w$}{expires}", "expires:");
            println!();
            if bootstrap.cluster_name.is_empty() {
                println!("On the cluster or device to add, run (choose CLUSTER_NAME):");
            } else {
                println!("On the cluster or device to add, run:");
            }
            println!("  {}", join_command(&bootstrap));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The `flower-agent join` line for `b` (`CLUSTER_NAME` when no name was given).
fn join_command(b: &Bootstrap) -> String {
    let name = if b.cluster_name.is_empty() {
        "CLUSTER_NAME"
    } else {
        &b.cluster_name
    };
    // The token goes in on standard input (`printf` is a shell builtin): an argument of
    // `flower-agent` would be visible to every user of the spoke machine in `ps`.
    let mut line = format!(
        "printf '%s\\n' '{}' | flower-agent join --token-file - --hub {} --ca-hash {} --cluster-name {name}",
        b.token, b.hub, b.ca_hash
    );
    if let Some(server_name) = &b.server_name {
        line.push_str(&format!(" --server-name {server_name}"));
    }
    for (k, v) in &b.labels {
        line.push_str(&format!(" --label {k}={v}"));
    }
    for (k, v) in &b.claims {
        line.push_str(&format!(" --claim {k}={v}"));
    }
    line.push_str(" --state-dir /var/lib/flower-agent");
    line
}

#[cfg(test)]
mod tests;

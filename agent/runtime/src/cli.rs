//! Command-line plumbing both binaries share: the global flags, logging, completions, the
//! shutdown signal, value parsers, and the `netns-bridge` helper that supervised programs run
//! under.
pub mod netns;

use std::time::Duration;

/// How log lines are written (`--log-format`, env `FLOWER_LOG_FORMAT`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the event's
    /// fields at the top level, the current span's fields under `span` (e.g. `cluster`).
    Json,
}

/// The options both binaries take before their subcommand (flattened into their `Cli`).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct GlobalArgs {
    /// Log format: text, or json (one object per line, for log collectors). Filter with
    /// RUST_LOG, e.g. RUST_LOG=info,flower_addon_hub::channel=debug.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "FLOWER_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
}

/// Prints `C`'s completion script for `shell` (the `completions` subcommand of both binaries).
pub fn print_completions<C: clap::CommandFactory>(
    shell: clap_complete::Shell,
    bin: &str,
) -> std::process::ExitCode {
    clap_complete::generate(shell, &mut C::command(), bin, &mut std::io::stdout());
    std::process::ExitCode::SUCCESS
}

/// Log to stderr, filtered by `RUST_LOG` (default `info`), as text.
pub fn init_tracing() {
    init_tracing_with("info", LogFormat::Text);
}

/// Log to stderr in `format`, filtered by `RUST_LOG` (else `default`, an `EnvFilter`
/// directive such as `info,flower_addon_hub::channel=debug`); colours only when stderr is a
/// terminal, so log files and CI output stay plain text.
pub fn init_tracing_with(default: &str, format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async {
            match term.as_mut() {
                Some(t) => { t.recv().await; }
                None => std::future::pending::<()>().await,
            }
        } => {}
    }
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

/// Parses durations like `90s`, `10m`, `24h`, `30d`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 90s, 10m, 24h, 30d"))?;
    let scale: u64 = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("invalid duration unit in {s:?}: use s, m, h or d")),
    };
    let secs = n
        .checked_mul(scale)
        .ok_or_else(|| format!("duration {s:?} is too long"))?;
    Ok(Duration::from_secs(secs))
}

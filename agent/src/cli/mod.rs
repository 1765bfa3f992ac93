//! Command-line front ends. `main.rs` only dispatches; each module owns its arguments.
pub mod join;
pub mod netns;
pub mod run;

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

//! Command-line front ends. `main.rs` only dispatches; each module owns its arguments.
pub mod join;
pub mod run;

/// Log to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_tracing() {
    init_tracing_with("info");
}

/// Log to stderr, filtered by `RUST_LOG` (else `default`, an `EnvFilter` directive); colours
/// only when stderr is a terminal, so log files and CI output stay plain text.
pub fn init_tracing_with(default: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
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

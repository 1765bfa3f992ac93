//! `flower-agent`: the flower-addon agent command line.
use clap::{Parser, Subcommand};
use flower_addon_agent::cli::{join, netns, run};
use std::process::ExitCode;

/// flower-addon agent: joins a hub, keeps the mTLS work channel open and runs the SuperNode pools
/// it is given (Kubernetes workloads or supervised processes).
#[derive(Parser, Debug)]
#[command(name = "flower-agent", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    global: flower_addon_agent::cli::GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Join a hub with a bootstrap token and wait until the hub accepts this cluster.
    #[command(
        after_help = "Examples (the token from a file, or on standard input; never --token, which `ps` shows to every user):\n  flower-agent join --token-file /run/secrets/flower-token --hub hub.example.org:7443 --ca-hash sha256:… --cluster-name edge-7 --claim site=a --state-dir /var/lib/flower-agent\n  printf '%s\\n' abcdef.0123456789abcdef | flower-agent join --token-file - --hub hub.example.org:7443 --ca-hash sha256:… --cluster-name edge-7 --state-dir /var/lib/flower-agent"
    )]
    Join(Box<join::JoinArgs>),
    /// Connect to the hub and run the work it sends (runtime kubernetes or process).
    #[command(
        after_help = "Examples:\n  flower-agent run --state-dir /var/lib/flower-agent --runtime process --flower-bin /opt/flwr/bin\n  flower-agent run --credentials-secret flower-agent-credentials --bootstrap-secret flower-agent-bootstrap"
    )]
    Run(Box<run::RunArgs>),
    /// Run a program in the network namespace `run --runtime process` gave it (a SuperNode, a
    /// SuperExec), bridging its loopback ports to Unix sockets in its Federation's directory.
    #[command(
        after_help = "Example (what the process runtime runs):\n  flower-agent netns-bridge --import 198.18.0.1:9092=pool-0.fleet.sock --export 19100=pool-0.appio.sock -- flower-supernode --superlink 198.18.0.1:9092 …"
    )]
    NetnsBridge(netns::NetnsBridgeArgs),
    /// Run one supervised program and end everything it leaves behind when it exits, is stopped
    /// or the agent dies (what `run --runtime process` starts its SuperNodes under).
    #[command(hide = true)]
    Guard(flower_addon_agent::guard::GuardArgs),
    /// Print a shell completion script.
    #[command(
        after_help = "Example:\n  flower-agent completions bash > /etc/bash_completion.d/flower-agent"
    )]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    // One rustls crypto provider for the whole process (kube, tonic and our own TLS).
    rustls::crypto::ring::default_provider()
        .install_default()
        .expect("install the rustls ring crypto provider");
    let cli = Cli::parse();
    if let Command::Guard(args) = &cli.command {
        return flower_addon_agent::guard::run(&args.name);
    }
    if matches!(cli.command, Command::Run(_))
        && let Ok(exe) = std::env::current_exe()
    {
        // Every program `run` supervises runs under `flower-agent guard`: none outlives it.
        flower_addon_agent::supervise::guard_with(exe);
    }
    flower_addon_agent::cli::init_tracing_with("info", cli.global.log_format);
    let result = match cli.command {
        Command::Join(args) => join::join(*args),
        Command::Run(args) => run::run(*args),
        Command::NetnsBridge(args) => netns::netns_bridge(args),
        Command::Guard(_) => unreachable!("handled above"),
        Command::Completions { shell } => Ok(flower_addon_agent::cli::print_completions::<Cli>(
            shell,
            "flower-agent",
        )),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("flower-agent: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

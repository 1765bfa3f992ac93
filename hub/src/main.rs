//! `flower-hub`: the flower-addon hub command line.
use clap::{Parser, Subcommand};
use flower_addon_hub::cli::{front, netns, offline, outputs, registration, serve};
use std::process::ExitCode;

/// flower-addon hub: runs Flower SuperLinks for Federations and sends each selected cluster its
/// SuperNode pools over the mTLS work channel.
#[derive(Parser, Debug)]
#[command(name = "flower-hub", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    global: flower_addon_runtime::cli::GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print every CustomResourceDefinition as a multi-document YAML stream.
    #[command(after_help = "Example:\n  flower-hub crds | kubectl apply -f -")]
    Crds,
    /// Validate Federation/Placement/ManagedCluster files offline (exit 0 when all are valid).
    #[command(after_help = "Example:\n  flower-hub validate examples/*.yaml")]
    Validate(offline::ValidateArgs),
    /// Print every object that would be applied, for the hub or for one spoke cluster.
    #[command(
        after_help = "Examples:\n  flower-hub render examples/multicluster.yaml\n  flower-hub render examples/cluster-overrides.yaml --cluster gpu-1 --label gpu=yes --node-address hub.example.org\n  flower-hub render federation.yaml placementdecisions.yaml managedclusters.yaml --cluster gpu-1"
    )]
    Render(offline::RenderArgs),
    /// Run the hub (Kubernetes mode, or `--standalone` with a state directory).
    #[command(
        after_help = "Examples:\n  flower-hub serve --listen 0.0.0.0:7443\n  flower-hub serve --standalone --state-dir /var/lib/flower-hub --advertise-address hub.example.org --flower-bin /opt/flwr/bin"
    )]
    Serve(serve::ServeArgs),
    /// Create, list or delete bootstrap tokens for `flower-agent join`.
    #[command(
        subcommand,
        after_help = "Examples:\n  flower-hub token create --cluster-name spoke-1 --label env=prod -o secret > spoke-1-bootstrap.yaml\n  flower-hub token create --state-dir /var/lib/flower-hub --ttl 24h\n  flower-hub token list"
    )]
    Token(registration::TokenCommand),
    /// Show or rotate a hub CA: the Flower CA (what SuperNodes and `flwr` trust for SuperLinks)
    /// or the work-channel CA (what agents pin).
    #[command(
        subcommand,
        after_help = "Examples:\n  flower-hub ca status\n  flower-hub ca rotate stage --state-dir /var/lib/flower-hub"
    )]
    Ca(registration::CaCommand),
    /// Accept a cluster that asked to join (sets hubAcceptsClient=true).
    #[command(after_help = "Example:\n  flower-hub accept spoke-1")]
    Accept(registration::AcceptArgs),
    /// Revoke a cluster (hubAcceptsClient=false, its stream closes), or `--delete` it.
    #[command(
        after_help = "Examples:\n  flower-hub revoke spoke-1\n  flower-hub revoke spoke-1 --delete"
    )]
    Revoke(registration::RevokeArgs),
    /// Show Federations and clusters (like `kubectl get federation`).
    #[command(after_help = "Example:\n  flower-hub status -o json")]
    Status(registration::StatusArgs),
    /// Print (or write into FLWR_HOME, or a Flower ≤ 1.25 app's pyproject.toml) the `flwr`
    /// connection entry for a Federation: its SuperLink's Control address and its CA, written to
    /// a file.
    #[command(
        after_help = "Examples:\n  flower-hub connect demo --federation-namespace demo --flwr-home ~/.flwr\n  FLWR_HOME=~/.flwr flwr run examples/fedavg demo\n  flower-hub connect demo --federation-namespace demo --app ./my-app   # Flower <= 1.25\n  flwr run ./my-app demo"
    )]
    Connect(registration::ConnectArgs),
    /// Submit, follow, stop and delete FlowerRuns: a Flower app run declaratively by the hub.
    #[command(
        after_help = "Examples:\n  flower-hub run submit examples/fedavg --federation demo --federation-namespace demo --follow\n  flower-hub run list\n  flower-hub run logs fedavg-1795000000 --federation-namespace demo --follow"
    )]
    Run(registration::RunCommand),
    /// Serve a unified-dialect SuperLink's Fleet API only (the SuperLink pod's sidecar): Fleet
    /// requests and /health pass, the Control and Runtime APIs are refused with 403.
    #[command(
        after_help = "Example:\n  flower-hub fleet-front --listen 0.0.0.0:9092 --upstream 127.0.0.1:8000 --tls-dir /etc/flower/tls"
    )]
    FleetFront(front::FleetFrontArgs),
    /// Serve FlowerRun output files read-only over plain HTTP (the SuperLink pod's sidecar, on
    /// the pod's loopback, reached through port-forwards).
    #[command(
        after_help = "Example:\n  flower-hub outputs-server --listen 127.0.0.1:9099 --dir /var/lib/flwr/outputs"
    )]
    OutputsServer(outputs::OutputsServerArgs),
    /// Run a program in the network namespace the standalone hub gave it (a SuperLink, a
    /// SuperExec), bridging its loopback ports to Unix sockets in its Federation's directory.
    #[command(
        after_help = "Example (what the standalone hub runs):\n  flower-hub netns-bridge --export 9093=control.sock --export 9092=fleet.sock -- flower-superlink --insecure --control-api-address 127.0.0.1:9093 …"
    )]
    NetnsBridge(netns::NetnsBridgeArgs),
    /// Run one supervised program and end everything it leaves behind when it exits, is stopped
    /// or the hub dies (what `serve` starts its SuperLinks and SuperNodes under).
    #[command(hide = true)]
    Guard(flower_addon_runtime::guard::GuardArgs),
    /// Print a shell completion script.
    #[command(
        after_help = "Examples:\n  flower-hub completions bash > /etc/bash_completion.d/flower-hub\n  flower-hub completions zsh > \"${fpath[1]}/_flower-hub\""
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
        return flower_addon_runtime::guard::run(&args.name);
    }
    if matches!(cli.command, Command::Serve(_))
        && let Ok(exe) = std::env::current_exe()
    {
        // Every program `serve` supervises runs under `flower-hub guard`: none outlives the hub.
        flower_addon_runtime::supervise::guard_with(exe);
    }
    // Servers keep Rust's ignored SIGPIPE: a write to a gone peer stays an error they handle.
    if !matches!(
        cli.command,
        Command::Serve(_)
            | Command::FleetFront(_)
            | Command::OutputsServer(_)
            | Command::NetnsBridge(_)
    ) {
        exit_quietly_on_broken_pipe();
    }
    // `serve` logs what it does; one-shot commands print their own one-line errors, so only
    // warnings (and not kube-client's retry noise) are logged for them.
    flower_addon_hub::cli::init_tracing_with(
        match cli.command {
            Command::Serve(_)
            | Command::FleetFront(_)
            | Command::OutputsServer(_)
            | Command::NetnsBridge(_) => "info",
            _ => "warn,kube_client=off",
        },
        cli.global.log_format,
    );
    let result = match cli.command {
        Command::Crds => offline::crds(),
        Command::Validate(args) => offline::validate(args),
        Command::Render(args) => offline::render(args),
        Command::Serve(args) => serve::serve(args),
        Command::Token(cmd) => registration::token(cmd),
        Command::Ca(cmd) => registration::ca(cmd),
        Command::Accept(args) => registration::accept(args),
        Command::Revoke(args) => registration::revoke(args),
        Command::Status(args) => registration::status(args),
        Command::Connect(args) => registration::connect(args),
        Command::Run(cmd) => registration::run(cmd),
        Command::FleetFront(args) => front::fleet_front(args),
        Command::OutputsServer(args) => outputs::outputs_server(args),
        Command::NetnsBridge(args) => netns::netns_bridge(args),
        Command::Guard(_) => unreachable!("handled above"),
        Command::Completions { shell } => Ok(flower_addon_runtime::cli::print_completions::<Cli>(
            shell,
            "flower-hub",
        )),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("flower-hub: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Restores the default SIGPIPE action, so a printing command whose reader went away
/// (`flower-hub crds | head -1`) ends the way `cat` does instead of panicking in `println!`.
/// Only for the short-lived commands: they spawn no children, and their sockets do not raise
/// SIGPIPE in practice (`send` uses MSG_NOSIGNAL; a `writev` to a reset TCP connection fails with
/// ECONNRESET first, and clients stop writing on an error). Servers keep SIGPIPE ignored.
#[cfg(unix)]
#[allow(unsafe_code)]
fn exit_quietly_on_broken_pipe() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: called from `main` before any thread or runtime starts, so no other thread can be
    // installing a handler at the same time; SIG_DFL runs no code of ours.
    if let Err(err) = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) } {
        eprintln!("flower-hub: warning: cannot restore the default SIGPIPE action: {err}");
    }
}

#[cfg(not(unix))]
fn exit_quietly_on_broken_pipe() {}

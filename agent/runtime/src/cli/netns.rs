//! `netns-bridge` (of `flower-hub` and `flower-agent`): runs a program in the network namespace
//! its supervisor gave it, bridging its loopback ports to Unix sockets ([`crate::netns`]).
use std::ffi::OsString;
use std::process::ExitCode;

use crate::netns::{self, Bridged};

/// Arguments of `flower-hub netns-bridge`.
#[derive(clap::Args, Debug)]
pub struct NetnsBridgeArgs {
    /// Serve this loopback port at this Unix socket once the port accepts connections
    /// (`PORT=SOCKET`; repeatable). The socket appearing means the program is up.
    #[arg(long = "export", value_name = "PORT=SOCKET")]
    pub exports: Vec<Bridged>,
    /// Listen on this loopback port (at HOST, an address on the loopback; default 127.0.0.1)
    /// and forward each connection to this Unix socket (`[HOST:]PORT=SOCKET`; repeatable),
    /// before the program starts.
    #[arg(long = "import", value_name = "[HOST:]PORT=SOCKET")]
    pub imports: Vec<Bridged>,
    /// The program to run, and its arguments (after `--`).
    #[arg(required = true, last = true, value_name = "PROGRAM")]
    pub command: Vec<OsString>,
}

/// Runs the bridge; exits with the program's status.
pub fn netns_bridge(args: NetnsBridgeArgs) -> anyhow::Result<ExitCode> {
    let mut command = args.command.into_iter();
    let program = command
        .next()
        .ok_or_else(|| anyhow::anyhow!("no program to run after --"))?;
    let code = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(netns::bridge(
            args.exports,
            args.imports,
            program,
            command.collect(),
        ))?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

//! The network namespace of a standalone SuperLink.
//!
//! Whoever reaches a SuperLink's Control API runs code on every SuperNode of its Federation, and
//! a ServerApp is code run next to a SuperLink: in one network namespace, a ServerApp of
//! Federation A could open `127.0.0.1:<B's Control port>` and run code on B's SuperNodes. So the
//! standalone hub runs each SuperLink (and its ServerApp SuperExec) in a network namespace of its
//! own ([`flower_addon_agent::sandbox::Sandbox::network`]), where it listens on its loopback
//! only, and bridges what must be served through Unix sockets in the Federation's directory
//! (which the other Federations' sandboxes do not show):
//!
//! - inside, `flower-hub netns-bridge` runs the SuperLink as its child and **exports** its ports:
//!   once a port accepts connections on the namespace's loopback, a Unix socket
//!   `<dir>/<name>.sock` leads to it (the socket appearing is the SuperLink being up);
//! - the hub, outside, listens where SuperNodes and `flwr` dial (the same host ports as
//!   before: the Fleet port on `--superlink-host`, Control on 127.0.0.1) and forwards each
//!   connection to the socket ([`serve_to_unix`]; the Fleet front's upstream is the socket);
//! - a SuperExec runs under a bridge that **imports** its SuperLink's port: it listens on its own
//!   namespace's loopback and forwards to the socket.
//!
//! A ServerApp then reaches its own SuperLink and nothing else on the network (it has no route
//! out); `flower-hub serve --superlink-network host` opts out, for ServerApps that need the
//! network and Federations that trust each other.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;

/// Connections one bridge forwards at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 4096;
/// How often an export checks whether its port accepts connections yet.
const POLL: Duration = Duration::from_millis(100);
/// How long the program has to exit after a passed-on SIGTERM/SIGINT before SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

/// One port of the namespace's loopback served at a Unix socket (`PORT=SOCKET`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bridged {
    /// The port on the namespace's 127.0.0.1.
    pub port: u16,
    /// The Unix socket.
    pub socket: PathBuf,
}

impl std::str::FromStr for Bridged {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (port, socket) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?}: expected PORT=SOCKET, e.g. 9093=control.sock"))?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{text:?}: {port:?} is not a port (1-65535)"))?;
        if socket.is_empty() {
            return Err(format!("{text:?}: the socket path is empty"));
        }
        Ok(Self {
            port,
            socket: PathBuf::from(socket),
        })
    }
}

impl std::fmt::Display for Bridged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.port, self.socket.display())
    }
}

/// The longest path a Unix socket address holds (`sun_path`, NUL included).
const SUN_PATH: usize = 108;

/// Refuses a socket path the kernel cannot bind or connect to, naming the fix.
pub fn check_socket_path(path: &Path) -> Result<(), String> {
    let len = path.as_os_str().len();
    if len >= SUN_PATH {
        return Err(format!(
            "{}: {len} bytes, but a Unix socket path must be shorter than {SUN_PATH}; use a shorter --state-dir (or shorter Federation names)",
            path.display()
        ));
    }
    Ok(())
}

/// Exports `bridged.port` of this namespace's loopback at `bridged.socket`: waits until the port
/// accepts a connection, then binds the socket (owner only) and forwards each connection to the
/// port. Runs until the task is dropped.
pub async fn export(bridged: Bridged) -> std::io::Result<()> {
    let target = ("127.0.0.1", bridged.port);
    let _ = std::fs::remove_file(&bridged.socket);
    while TcpStream::connect(target).await.is_err() {
        tokio::time::sleep(POLL).await;
    }
    let listener = UnixListener::bind(&bridged.socket)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bridged.socket, std::fs::Permissions::from_mode(0o600))?;
    tracing::info!(port = bridged.port, socket = %bridged.socket.display(), "netns bridge: exported");
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(std::io::Error::other)?;
        let (mut inbound, _) = listener.accept().await?;
        tokio::spawn(async move {
            if let Ok(mut outbound) = TcpStream::connect(target).await {
                let _ = outbound.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
            drop(permit);
        });
    }
}

/// Imports `bridged.socket` as `bridged.port` on this namespace's loopback (bound before the
/// call returns its future's first poll is awaited: call [`bind_import`] first).
pub async fn bind_import(bridged: &Bridged) -> std::io::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", bridged.port)).await
}

/// Serves an imported socket: each connection to `listener` is forwarded to `socket`.
pub async fn serve_to_unix(listener: TcpListener, socket: PathBuf) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(std::io::Error::other)?;
        let (mut inbound, _) = listener.accept().await?;
        let socket = socket.clone();
        tokio::spawn(async move {
            let _ = inbound.set_nodelay(true);
            if let Ok(mut outbound) = UnixStream::connect(&socket).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
            drop(permit);
        });
    }
}

/// [`serve_to_unix`] until `stop` resolves.
pub async fn serve_to_unix_until(
    listener: TcpListener,
    socket: PathBuf,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::select! {
        served = serve_to_unix(listener, socket) => served,
        () = stop => Ok(()),
    }
}

/// Whether the SuperLink behind `socket` is up: its export exists and accepts a connection.
pub async fn exported(socket: &Path) -> bool {
    UnixStream::connect(socket).await.is_ok()
}

/// `flower-hub netns-bridge`: binds the imports, starts `program` with `args` (stdio inherited),
/// exports the exports as their ports come up, and returns the program's exit status (128 +
/// signal when a signal ended it). SIGTERM and SIGINT reach the program as a member of the same
/// process group (the supervisor signals the group); the bridge waits for it.
pub async fn bridge(
    exports: Vec<Bridged>,
    imports: Vec<Bridged>,
    program: std::ffi::OsString,
    args: Vec<std::ffi::OsString>,
) -> anyhow::Result<i32> {
    use anyhow::Context;
    let mut tasks = tokio::task::JoinSet::new();
    for import in imports {
        let listener = bind_import(&import)
            .await
            .with_context(|| format!("--import {import}: cannot listen on 127.0.0.1"))?;
        tasks.spawn(serve_to_unix(listener, import.socket.clone()));
    }
    let mut command = tokio::process::Command::new(&program);
    command.args(&args).kill_on_drop(true);
    // The bridge is what the hub supervises: when it dies (the hub's own death signal, a
    // SIGKILL), the program must not run on without it.
    flower_addon_agent::supervise::die_with_parent(&mut command);
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot start {}", Path::new(&program).display()))?;
    let child_pid = child.id().map(|p| nix::unistd::Pid::from_raw(p as i32));
    let sockets: Vec<PathBuf> = exports.iter().map(|e| e.socket.clone()).collect();
    for export_of in exports {
        tasks.spawn(export(export_of));
    }
    // SIGTERM and SIGINT are passed on to the program (a signal to the bridge alone — the
    // hub's death signal — must end it too; one to the whole group reaches it twice, which
    // Flower takes as one); the bridge waits for it, at most GRACE before SIGKILL.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut deadline: Option<tokio::time::Instant> = None;
    let forward = |signal: nix::sys::signal::Signal| {
        if let Some(pid) = child_pid {
            let _ = nix::sys::signal::kill(pid, signal);
        }
    };
    let status = loop {
        let killing = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = child.wait() => break status?,
            _ = term.recv() => {
                forward(nix::sys::signal::Signal::SIGTERM);
                deadline.get_or_insert_with(|| tokio::time::Instant::now() + GRACE);
            }
            _ = int.recv() => {
                forward(nix::sys::signal::Signal::SIGINT);
                deadline.get_or_insert_with(|| tokio::time::Instant::now() + GRACE);
            }
            () = killing => {
                forward(nix::sys::signal::Signal::SIGKILL);
                deadline = None;
            }
            Some(done) = tasks.join_next() => {
                if let Ok(Err(e)) = done {
                    tracing::warn!(error = %e, "netns bridge: a bridged port stopped");
                }
            }
        }
    };
    for socket in sockets {
        let _ = std::fs::remove_file(socket);
    }
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridged_ports_parse_with_messages_that_name_the_fix() {
        let ok: Bridged = "9093=control.sock".parse().expect("parses");
        assert_eq!(ok.port, 9093);
        assert_eq!(ok.socket, PathBuf::from("control.sock"));
        assert_eq!(ok.to_string(), "9093=control.sock");
        for (bad, says) in [
            ("control.sock", "expected PORT=SOCKET"),
            ("0=x.sock", "is not a port"),
            ("70000=x.sock", "is not a port"),
            ("9093=", "socket path is empty"),
        ] {
            let err = bad.parse::<Bridged>().expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
        let long = PathBuf::from(format!("/{}", "d".repeat(120)));
        assert!(check_socket_path(&long).is_err_and(|e| e.contains("--state-dir")));
        assert!(check_socket_path(Path::new("/var/lib/x/control.sock")).is_ok());
    }

    #[tokio::test]
    async fn an_export_appears_once_its_port_listens_and_forwards_both_ways() {
        // Invariant: the socket is the readiness signal — absent until the port accepts, then
        // bytes pass both ways through it and through an import in front of it.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("control.sock");
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        let port = probe.local_addr().expect("addr").port();
        drop(probe);
        let task = tokio::spawn(export(Bridged {
            port,
            socket: socket.clone(),
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!exported(&socket).await, "exported before the port listens");
        let upstream = TcpListener::bind(("127.0.0.1", port)).await.expect("bind");
        // Echoes every connection (the export's own readiness probes connect and leave).
        let echo = tokio::spawn(async move {
            loop {
                let (mut s, _) = upstream.accept().await.expect("accept");
                tokio::spawn(async move {
                    let mut buf = [0u8; 4];
                    if s.read_exact(&mut buf).await.is_ok() {
                        let _ = s.write_all(&buf).await;
                    }
                });
            }
        });
        let mut up = false;
        for _ in 0..50 {
            if exported(&socket).await {
                up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(up, "no export after the port listened");
        let front = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let front_addr = front.local_addr().expect("addr");
        let import = tokio::spawn(serve_to_unix(front, socket.clone()));
        let mut client = TcpStream::connect(front_addr).await.expect("connect");
        client.write_all(b"ping").await.expect("write");
        let mut back = [0u8; 4];
        client.read_exact(&mut back).await.expect("read");
        assert_eq!(&back, b"ping");
        echo.abort();
        task.abort();
        import.abort();
    }
}

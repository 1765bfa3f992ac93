//! A program in a network namespace of its own, bridged to the outside through Unix sockets.
//!
//! Whoever reaches a SuperLink's Control API runs code on every SuperNode of its Federation; a
//! ServerApp is code run next to a SuperLink, a ClientApp code run next to a SuperNode. On one
//! network, a ServerApp or ClientApp of Federation A could open `127.0.0.1:<B's Control port>`
//! (and run code on B's SuperNodes) or `127.0.0.1:<B's SuperNode's ClientAppIo port>`. So the
//! standalone hub runs each SuperLink (with its ServerApp SuperExec), and the process runtime
//! each SuperNode (with its ClientApps), in a network namespace of its own
//! ([`crate::sandbox::Sandbox::network`]) whose only interface is its loopback, and bridges what
//! must pass through Unix sockets in the Federation's directory (which other Federations'
//! sandboxes do not show):
//!
//! - inside, `netns-bridge` (`flower-hub netns-bridge`, `flower-agent netns-bridge`) runs the
//!   program as its child and **exports** its ports: once a port accepts connections on the
//!   namespace's loopback, a Unix socket `<dir>/<name>.sock` leads to it (the socket appearing
//!   is the program being up);
//! - outside, the hub listens where SuperNodes and `flwr` dial (the Fleet port on
//!   `--superlink-host`, Control on 127.0.0.1) and forwards each connection to the socket
//!   ([`serve_to_unix`]);
//! - a program that must dial out — a SuperExec its SuperLink or SuperNode, a SuperNode the
//!   SuperLink's Fleet API — runs under a bridge that **imports** a socket: it listens on its
//!   own namespace's loopback (at the address the program dials, added to the loopback) and
//!   forwards to the socket, which the supervisor serves outside ([`serve_to_tcp`] for a
//!   SuperNode's Fleet connection).
//!
//! Such code then reaches its own SuperLink or SuperNode and nothing else on the network;
//! `flower-hub serve --superlink-network host` and `--supernode-network host` (and
//! `flower-agent run --supernode-network host`) opt out, for apps that need the network and
//! Federations that trust each other.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;

/// Where supervised Flower programs run, network-wise (`--superlink-network`,
/// `--supernode-network`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetworkMode {
    /// A network namespace of its own each, bridged by its supervisor.
    Isolated,
    /// The machine's network.
    Host,
}

/// Connections one bridge forwards at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 4096;
/// How often an export checks whether its port accepts connections yet.
const POLL: Duration = Duration::from_millis(100);
/// How long the program has to exit after a passed-on SIGTERM/SIGINT before SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

/// One port of the namespace's loopback served at a Unix socket (`[HOST:]PORT=SOCKET`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bridged {
    /// The address on the namespace's loopback: 127.0.0.1 unless given (an import listens where
    /// its program dials, an address the sandbox added to the loopback).
    pub host: std::net::IpAddr,
    /// The port on it.
    pub port: u16,
    /// The Unix socket.
    pub socket: PathBuf,
}

impl std::str::FromStr for Bridged {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (address, socket) = text.split_once('=').ok_or_else(|| {
            format!("{text:?}: expected [HOST:]PORT=SOCKET, e.g. 9093=control.sock")
        })?;
        let (host, port) = match address.rsplit_once(':') {
            Some((host, port)) => {
                let host = host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .map_err(|_| {
                        format!("{text:?}: {host:?} is not an IP address (e.g. 127.0.0.1)")
                    })?;
                (host, port)
            }
            None => (std::net::IpAddr::from([127, 0, 0, 1]), address),
        };
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{text:?}: {port:?} is not a port (1-65535)"))?;
        if socket.is_empty() {
            return Err(format!("{text:?}: the socket path is empty"));
        }
        Ok(Self {
            host,
            port,
            socket: PathBuf::from(socket),
        })
    }
}

impl std::fmt::Display for Bridged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.host {
            std::net::IpAddr::V4(v4) if v4 == std::net::Ipv4Addr::LOCALHOST => {}
            std::net::IpAddr::V4(v4) => write!(f, "{v4}:")?,
            std::net::IpAddr::V6(v6) => write!(f, "[{v6}]:")?,
        }
        write!(f, "{}={}", self.port, self.socket.display())
    }
}

/// The connections one bridge forwards at once ([`MAX_CONNECTIONS`]), a permit each; more wait in
/// the listen backlog.
struct Slots(Arc<Semaphore>);

impl Default for Slots {
    fn default() -> Self {
        Self(Arc::new(Semaphore::new(MAX_CONNECTIONS)))
    }
}

impl Slots {
    /// Waits for a free slot; held by the connection's task until it ends.
    async fn take(&self) -> std::io::Result<tokio::sync::OwnedSemaphorePermit> {
        self.0
            .clone()
            .acquire_owned()
            .await
            .map_err(std::io::Error::other)
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
    let target = std::net::SocketAddr::new(bridged.host, bridged.port);
    let _ = std::fs::remove_file(&bridged.socket);
    while TcpStream::connect(target).await.is_err() {
        tokio::time::sleep(POLL).await;
    }
    let listener = UnixListener::bind(&bridged.socket)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bridged.socket, std::fs::Permissions::from_mode(0o600))?;
    tracing::info!(port = bridged.port, socket = %bridged.socket.display(), "netns bridge: exported");
    let slots = Slots::default();
    loop {
        let permit = slots.take().await?;
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

/// Listens where [`Bridged::host`]:[`Bridged::port`] is dialled in this namespace, for an import
/// of `bridged.socket` ([`serve_to_unix`]).
pub async fn bind_import(bridged: &Bridged) -> std::io::Result<TcpListener> {
    TcpListener::bind((bridged.host, bridged.port)).await
}

/// Serves an imported socket: each connection to `listener` is forwarded to `socket`.
pub async fn serve_to_unix(listener: TcpListener, socket: PathBuf) -> std::io::Result<()> {
    let slots = Slots::default();
    loop {
        let permit = slots.take().await?;
        let (inbound, _) = listener.accept().await?;
        let socket = socket.clone();
        tokio::spawn(async move {
            let _ = inbound.set_nodelay(true);
            match UnixStream::connect(&socket).await {
                Ok(outbound) => splice(inbound, outbound).await,
                Err(_) => refuse(inbound),
            }
            drop(permit);
        });
    }
}

/// Passes bytes both ways between a TCP connection and the Unix socket it was forwarded to, until
/// both sides are done. When the far side closes before it sent a byte — the program behind the
/// socket is not up, or the address it dials does not answer — the TCP connection is reset, not
/// closed: the client sees what a refused connection shows it (a connection error it retries),
/// not a TLS handshake cut short, which Flower's SuperNode takes as a certificate problem and
/// exits on.
async fn splice(inbound: TcpStream, outbound: UnixStream) {
    use tokio::io::AsyncWriteExt;
    let (mut in_read, mut in_write) = inbound.into_split();
    let (mut out_read, mut out_write) = outbound.into_split();
    let mut upstream = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut in_read, &mut out_write).await;
        let _ = out_write.shutdown().await;
    });
    let back = tokio::io::copy(&mut out_read, &mut in_write).await;
    if matches!(back, Ok(0) | Err(_)) {
        upstream.abort();
        let _ = (&mut upstream).await;
        let _ = in_write.as_ref().set_zero_linger();
        // Dropped, the write half would send a FIN first.
        in_write.forget();
        return;
    }
    let _ = in_write.shutdown().await;
    let _ = upstream.await;
}

/// Resets a TCP connection the bridge cannot serve (as a refused connection looks to its client).
fn refuse(inbound: TcpStream) {
    let _ = inbound.set_zero_linger();
}

/// Serves a socket for an import from outside the namespace: each connection to `listener` (a
/// Unix socket of the supervisor's) is forwarded to `target` (`host:port`, resolved for each
/// connection), e.g. a SuperNode's to its SuperLink's Fleet API.
pub async fn serve_to_tcp(listener: UnixListener, target: String) -> std::io::Result<()> {
    let slots = Slots::default();
    loop {
        let permit = slots.take().await?;
        let (mut inbound, _) = listener.accept().await?;
        let target = target.clone();
        tokio::spawn(async move {
            match TcpStream::connect(target.as_str()).await {
                Ok(mut outbound) => {
                    let _ = outbound.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
                Err(error) => {
                    tracing::debug!(%target, %error, "netns bridge: cannot reach the target");
                }
            }
            drop(permit);
        });
    }
}

/// Binds a Unix socket at `path` that only its owner may connect to (a stale one is replaced).
pub fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    check_socket_path(path).map_err(std::io::Error::other)?;
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
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
        let listener = bind_import(&import).await.with_context(|| {
            format!(
                "--import {import}: cannot listen on {}",
                std::net::SocketAddr::new(import.host, import.port)
            )
        })?;
        tasks.spawn(serve_to_unix(listener, import.socket.clone()));
    }
    let mut command = tokio::process::Command::new(&program);
    command.args(&args).kill_on_drop(true);
    // The bridge is what the hub supervises: when it dies (the hub's own death signal, a
    // SIGKILL), the program must not run on without it.
    crate::supervise::die_with_parent(&mut command);
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
        assert_eq!(ok.host, std::net::IpAddr::from([127, 0, 0, 1]));
        for text in ["198.18.0.1:9092=fleet.sock", "[::1]:9092=fleet.sock"] {
            let with_host: Bridged = text.parse().expect(text);
            assert_eq!(with_host.port, 9092);
            assert_eq!(with_host.to_string(), text, "round trip");
        }
        for (bad, says) in [
            ("control.sock", "expected [HOST:]PORT=SOCKET"),
            ("hub.example:9092=x.sock", "is not an IP address"),
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
            host: std::net::IpAddr::from([127, 0, 0, 1]),
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

    #[tokio::test]
    async fn a_far_end_that_is_not_there_resets_the_connection() {
        // Invariant: through an import, "nothing answers behind it" looks as it does without the
        // bridge — a connection error (reset), never a clean close in the middle of a TLS
        // handshake (which Flower's SuperNode takes for a certificate problem and exits on).
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().expect("tempdir");
        let closing = dir.path().join("closing.sock");
        let behind = UnixListener::bind(&closing).expect("bind");
        let closes = tokio::spawn(async move {
            loop {
                let (stream, _) = behind.accept().await.expect("accept");
                drop(stream);
            }
        });
        for socket in [closing, dir.path().join("absent.sock")] {
            let front = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = front.local_addr().expect("addr");
            let import = tokio::spawn(serve_to_unix(front, socket.clone()));
            let mut client = TcpStream::connect(addr).await.expect("connect");
            let _ = client.write_all(b"\x16\x03\x01 a ClientHello").await;
            let mut buf = [0u8; 16];
            let read = client.read(&mut buf).await;
            assert!(
                read.as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
                "{}: {read:?}",
                socket.display()
            );
            import.abort();
        }
        closes.abort();
    }

    #[tokio::test]
    async fn a_socket_served_outside_forwards_to_its_tcp_target() {
        // Invariant: what a SuperNode in its own namespace sends through its imported Fleet
        // socket reaches the SuperLink's address outside, and the answer comes back.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().expect("tempdir");
        let upstream = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let target = upstream.local_addr().expect("addr").to_string();
        let echo = tokio::spawn(async move {
            let (mut s, _) = upstream.accept().await.expect("accept");
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.expect("read");
            s.write_all(&buf).await.expect("write");
        });
        let socket = dir.path().join("fleet.sock");
        let listener = bind_private(&socket).expect("bind the socket");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&socket)
            .expect("socket")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the socket is its owner's only");
        let serving = tokio::spawn(serve_to_tcp(listener, target));
        let mut client = UnixStream::connect(&socket).await.expect("connect");
        client.write_all(b"fl0w").await.expect("write");
        let mut back = [0u8; 4];
        client.read_exact(&mut back).await.expect("read");
        assert_eq!(&back, b"fl0w");
        echo.await.expect("echo");
        serving.abort();
    }
}

//! The Fleet front's bounds (`flower_addon_hub::flower::front::serve_with_limits`) on loopback,
//! in front of a stand-in SuperLink written here (plain HTTP/1.1 that counts what reaches it; no
//! Flower needed). Clients are raw TCP sockets, bound to 127.0.0.x source addresses to act as
//! different hosts (all of 127/8 is loopback on Linux). Each test proves one bound with exact
//! counts, so it fails without the bound:
//! - the connection over an address's cap is closed while another address gets through;
//! - a body over the limit is answered 413 and the SuperLink never sees more than the limit;
//! - a stalled or trickling body is cut off with 408 within its timeout, and nothing stays open;
//! - a client that stops reading its answer is disconnected after the stall timeout;
//! - with the shared share filled by a flood of new addresses, an address that completed a
//!   successful Fleet request still gets through on the reserve.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flower_addon_hub::flower::front::{self, FrontConfig, FrontLimits};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

/// Upper bound on any one test.
const TEST_BOUND: Duration = Duration::from_secs(30);
/// How long a client waits for an answer before calling it none.
const ANSWER_WAIT: Duration = Duration::from_secs(5);
/// The size of the stand-in SuperLink's answer to `pull-object`: more than loopback socket
/// buffers hold, so a client that does not read it blocks the front.
const LARGE_ANSWER: usize = 64 << 20;

// === the stand-in SuperLink ===

/// What reached the stand-in SuperLink.
#[derive(Debug, Default)]
struct Seen {
    /// Request heads received.
    requests: AtomicUsize,
    /// Requests whose body arrived whole.
    completed: AtomicUsize,
    /// Body bytes (chunked framing removed) received in all, counted as they arrive.
    body_bytes: AtomicU64,
    /// Connections open now.
    open: AtomicUsize,
}

struct Upstream {
    address: String,
    seen: Arc<Seen>,
    task: JoinHandle<()>,
}

impl Upstream {
    /// Waits (briefly) until the front holds no connection to the SuperLink.
    async fn wait_closed(&self) -> bool {
        let until = Instant::now() + Duration::from_secs(3);
        while self.seen.open.load(Ordering::SeqCst) > 0 {
            if Instant::now() > until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        // Dropping the accept task's JoinSet aborts every connection task too.
        self.task.abort();
    }
}

/// A stand-in SuperLink on 127.0.0.1: answers every request `200 ok` once its body arrived.
async fn upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Seen::default());
    let counted = seen.clone();
    let task = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        while let Ok((tcp, _)) = listener.accept().await {
            let seen = counted.clone();
            seen.open.fetch_add(1, Ordering::SeqCst);
            connections.spawn(async move {
                let _ = serve_upstream(tcp, &seen).await;
                seen.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Upstream {
        address,
        seen,
        task,
    }
}

async fn serve_upstream(tcp: TcpStream, seen: &Seen) -> std::io::Result<()> {
    let mut stream = BufReader::new(tcp);
    loop {
        let mut length = 0u64;
        let mut chunked = false;
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let path = line.split(' ').nth(1).unwrap_or_default().to_owned();
        loop {
            line.clear();
            stream.read_line(&mut line).await?;
            let header = line.trim_end().to_ascii_lowercase();
            if header.is_empty() {
                break;
            }
            if let Some(v) = header.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
            if header.starts_with("transfer-encoding:") && header.contains("chunked") {
                chunked = true;
            }
        }
        seen.requests.fetch_add(1, Ordering::SeqCst);
        if chunked {
            loop {
                line.clear();
                if stream.read_line(&mut line).await? == 0 {
                    return Ok(());
                }
                let size = u64::from_str_radix(line.trim(), 16).unwrap_or(0);
                if size == 0 {
                    line.clear();
                    stream.read_line(&mut line).await?;
                    break;
                }
                read_counted(&mut stream, size, seen).await?;
                line.clear();
                stream.read_line(&mut line).await?;
            }
        } else {
            read_counted(&mut stream, length, seen).await?;
        }
        seen.completed.fetch_add(1, Ordering::SeqCst);
        if path.contains("pull-object") {
            // A large answer, for a client that stops reading it.
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {LARGE_ANSWER}\r\n\r\n");
            stream.get_mut().write_all(head.as_bytes()).await?;
            let piece = vec![b'z'; 1 << 20];
            for _ in 0..LARGE_ANSWER >> 20 {
                stream.get_mut().write_all(&piece).await?;
            }
            continue;
        }
        stream
            .get_mut()
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .await?;
    }
}

/// Reads `n` body bytes, counting them as they come; an early end is an error.
async fn read_counted(
    stream: &mut BufReader<TcpStream>,
    mut n: u64,
    seen: &Seen,
) -> std::io::Result<()> {
    let mut buf = vec![0; 16 * 1024];
    while n > 0 {
        let want = buf.len().min(n as usize);
        let got = stream.read(&mut buf[..want]).await?;
        if got == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        seen.body_bytes.fetch_add(got as u64, Ordering::SeqCst);
        n -= got as u64;
    }
    Ok(())
}

// === the front ===

struct Front {
    address: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Front {
    async fn start(listen: &str, upstream: &Upstream, limits: FrontLimits) -> Self {
        let listener = TcpListener::bind(listen).await.unwrap();
        let address = listener.local_addr().unwrap();
        let config = FrontConfig {
            upstream: upstream.address.clone(),
            tls: None,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(front::serve_with_limits(listener, config, limits, async {
            let _ = stopped.await;
        }));
        Self {
            address,
            stop,
            task,
        }
    }

    /// Stops the front, which closes every connection it still holds.
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

// === clients ===

/// A TCP connection to `front` from the source address `from`.
async fn connect_from(from: IpAddr, front: SocketAddr) -> TcpStream {
    let socket = match from {
        IpAddr::V4(_) => TcpSocket::new_v4(),
        IpAddr::V6(_) => TcpSocket::new_v6(),
    }
    .unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    socket.connect(front).await.unwrap()
}

fn v4(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// Reads one response: its status and body, or `None` when the connection ends (or nothing
/// comes within [`ANSWER_WAIT`]) before a whole one.
async fn read_response(stream: &mut (impl AsyncRead + Unpin)) -> Option<(u16, String)> {
    let read = async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let status: u16 = head.get(9..12)?.parse().ok()?;
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buf.len() < end + 4 + length {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return None,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + length]).into_owned();
                return Some((status, body));
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(ANSWER_WAIT, read).await.ok().flatten()
}

/// Sends `POST path` with `body` (and `headers`, each ending in CRLF) and reads the answer.
async fn request(
    stream: &mut TcpStream,
    path: &str,
    headers: &str,
    body: &[u8],
) -> Option<(u16, String)> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: superlink\r\ncontent-length: {}\r\n{headers}\r\n",
        body.len()
    );
    // A closed connection shows in the read.
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body).await;
    read_response(stream).await
}

/// Whether the connection ends without an answer: the front refused it.
async fn refused(stream: &mut TcpStream) -> bool {
    request(stream, "/health", "", b"").await.is_none()
}

fn limits(f: impl FnOnce(&mut FrontLimits)) -> FrontLimits {
    let mut limits = FrontLimits::default();
    f(&mut limits);
    limits
}

// === tests ===

#[tokio::test]
async fn the_connection_over_an_address_cap_is_closed_while_another_address_gets_through() {
    tokio::time::timeout(TEST_BOUND, async {
        let upstream = upstream().await;
        let front = Front::start(
            "127.0.0.1:0",
            &upstream,
            limits(|l| l.max_connections_per_address = 3),
        )
        .await;
        let (a, b) = (v4(1), v4(2));

        let mut held = Vec::new();
        for _ in 0..3 {
            let mut c = connect_from(a, front.address).await;
            assert_eq!(request(&mut c, "/health", "", b"").await.unwrap().0, 200);
            held.push(c);
        }
        let mut fourth = connect_from(a, front.address).await;
        assert!(refused(&mut fourth).await, "the 4th connection from {a}");
        let mut other = connect_from(b, front.address).await;
        assert_eq!(
            request(&mut other, "/v1/fleet/pull-messages", "", b"x")
                .await
                .unwrap()
                .0,
            200,
            "another address gets through"
        );
        // The connections within the cap keep working, and a closed one frees its place.
        assert_eq!(
            request(&mut held[0], "/health", "", b"").await.unwrap().0,
            200
        );
        // (The front sees the close when it next reads that connection, so try for a while.)
        drop(held.pop());
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            let mut again = connect_from(a, front.address).await;
            if request(&mut again, "/health", "", b"").await.is_some() {
                break;
            }
            assert!(
                Instant::now() < until,
                "the closed connection's place was not freed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // 3 + 1 + 1 + 1 requests reached the SuperLink: none from the refused connection.
        assert_eq!(upstream.seen.requests.load(Ordering::SeqCst), 6);

        front.stop().await;
        assert!(
            upstream.wait_closed().await,
            "the front left connections open"
        );
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn the_address_cap_holds_for_ipv6_peers() {
    // On ::1: the cap holds for IPv6 peers too. A host without an IPv6 loopback fails this
    // test (it is not skipped: a skipped test would read as passed).
    let probe = TcpListener::bind("[::1]:0")
        .await
        .expect("this test needs the IPv6 loopback ::1");
    drop(probe);
    tokio::time::timeout(TEST_BOUND, async {
        let upstream = upstream().await;
        let front = Front::start(
            "[::1]:0",
            &upstream,
            limits(|l| l.max_connections_per_address = 2),
        )
        .await;
        let local = IpAddr::V6(Ipv6Addr::LOCALHOST);
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut c = connect_from(local, front.address).await;
            assert_eq!(request(&mut c, "/health", "", b"").await.unwrap().0, 200);
            held.push(c);
        }
        let mut third = connect_from(local, front.address).await;
        assert!(refused(&mut third).await, "the 3rd connection from ::1");
        front.stop().await;
        assert!(upstream.wait_closed().await);
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_body_over_the_limit_gets_413_and_the_superlink_never_sees_more_than_the_limit() {
    tokio::time::timeout(TEST_BOUND, async {
        const MAX: usize = 64 * 1024;
        let upstream = upstream().await;
        let front = Front::start(
            "127.0.0.1:0",
            &upstream,
            limits(|l| l.max_body_bytes = MAX as u64),
        )
        .await;
        let seen = &upstream.seen;

        // Exactly the limit passes.
        let mut c = connect_from(v4(1), front.address).await;
        let at_limit = vec![b'x'; MAX];
        assert_eq!(
            request(&mut c, "/v1/fleet/push-object", "", &at_limit).await,
            Some((200, "ok".into()))
        );
        assert_eq!(seen.body_bytes.load(Ordering::SeqCst), MAX as u64);
        drop(c);

        // A Content-Length over it is answered before the SuperLink hears of it.
        let mut c = connect_from(v4(1), front.address).await;
        let head = format!(
            "POST /v1/fleet/push-object HTTP/1.1\r\nhost: superlink\r\ncontent-length: {}\r\n\r\n",
            MAX + 1
        );
        c.write_all(head.as_bytes()).await.unwrap();
        let (status, text) = read_response(&mut c).await.expect("an answer");
        assert_eq!(status, 413, "{text}");
        assert_eq!(seen.requests.load(Ordering::SeqCst), 1);

        // A chunked body within the limit passes whole.
        let (status, _) = chunked(front.address, MAX / 0x1000)
            .await
            .expect("an answer");
        assert_eq!(status, 200);
        assert_eq!(seen.body_bytes.load(Ordering::SeqCst), 2 * MAX as u64);
        assert_eq!(seen.completed.load(Ordering::SeqCst), 2);

        // A chunked body is cut as it passes the limit: 16 times the limit is sent.
        let (status, text) = chunked(front.address, 16 * MAX / 0x1000)
            .await
            .expect("an answer");
        assert_eq!(status, 413, "{text}");
        assert!(
            upstream.wait_closed().await,
            "the upstream requests were closed (the chunked one aborted)"
        );
        let streamed = seen.body_bytes.load(Ordering::SeqCst) - 2 * MAX as u64;
        assert!(
            streamed <= MAX as u64,
            "the SuperLink saw {streamed} bytes of a chunked body over the {MAX}-byte limit"
        );
        assert_eq!(seen.requests.load(Ordering::SeqCst), 3);
        assert_eq!(
            seen.completed.load(Ordering::SeqCst),
            2,
            "only the bodies within the limit"
        );
        eprintln!(
            "chunked over the limit: the SuperLink saw {streamed} of {} bytes",
            16 * MAX
        );

        front.stop().await;
    })
    .await
    .expect("bounded");
}

/// Sends a chunked Fleet request of `chunks` 4 KiB chunks on a new connection and reads the
/// answer while it sends.
async fn chunked(front: SocketAddr, chunks: usize) -> Option<(u16, String)> {
    let c = connect_from(v4(1), front).await;
    let (mut from_front, mut to_front) = c.into_split();
    let writer = tokio::spawn(async move {
        let head = "POST /v1/fleet/push-object HTTP/1.1\r\nhost: superlink\r\ntransfer-encoding: chunked\r\n\r\n";
        to_front.write_all(head.as_bytes()).await?;
        let mut chunk = b"1000\r\n".to_vec();
        chunk.extend_from_slice(&[b'y'; 0x1000]);
        chunk.extend_from_slice(b"\r\n");
        for _ in 0..chunks {
            to_front.write_all(&chunk).await?;
        }
        to_front.write_all(b"0\r\n\r\n").await?;
        // Keep the sending half open until the answer was read.
        std::future::pending::<std::io::Result<()>>().await
    });
    let answer = read_response(&mut from_front).await;
    writer.abort();
    answer
}

#[tokio::test]
async fn a_slow_body_is_cut_off_within_its_timeout() {
    tokio::time::timeout(TEST_BOUND, async {
        let (stall, total) = (Duration::from_secs(1), Duration::from_secs(2));
        let upstream = upstream().await;
        let front = Front::start(
            "127.0.0.1:0",
            &upstream,
            limits(|l| {
                l.stall_timeout = stall;
                l.body_timeout = total;
            }),
        )
        .await;
        let head =
            "POST /v1/fleet/push-object HTTP/1.1\r\nhost: superlink\r\ncontent-length: 100\r\n\r\n";

        // One byte, then a byte every 3 s: cut `stall` after the first.
        let stalled = async {
            let mut c = connect_from(v4(1), front.address).await;
            c.write_all(head.as_bytes()).await.unwrap();
            let started = Instant::now();
            let (mut rd, mut wr) = c.split();
            let trickle = async {
                loop {
                    if wr.write_all(b"s").await.is_err() {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
            };
            let answer = tokio::select! {
                answer = read_response(&mut rd) => answer,
                _ = trickle => unreachable!("the trickle never ends"),
            };
            let after = started.elapsed();
            (answer, after, closed(&mut rd).await)
        };
        // A byte every 250 ms never stalls, but 100 bytes would take 25 s: cut at `total`.
        let trickling = async {
            let mut c = connect_from(v4(2), front.address).await;
            c.write_all(head.as_bytes()).await.unwrap();
            let started = Instant::now();
            let (mut rd, mut wr) = c.split();
            let trickle = async {
                loop {
                    if wr.write_all(b"t").await.is_err() {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            };
            let answer = tokio::select! {
                answer = read_response(&mut rd) => answer,
                _ = trickle => unreachable!("the trickle never ends"),
            };
            let after = started.elapsed();
            (answer, after, closed(&mut rd).await)
        };
        let ((a, a_after, a_closed), (b, b_after, b_closed)) = tokio::join!(stalled, trickling);
        eprintln!("stalled body cut after {a_after:?}, trickling body after {b_after:?}");
        assert_eq!(a.map(|(s, _)| s), Some(408), "the stalled body");
        assert!(a_after < stall + Duration::from_millis(900), "{a_after:?}");
        assert!(a_closed, "the stalled client's connection is closed");
        assert_eq!(b.map(|(s, _)| s), Some(408), "the trickling body");
        assert!(b_after >= total - Duration::from_millis(100), "{b_after:?}");
        assert!(b_after < total + Duration::from_millis(900), "{b_after:?}");
        assert!(b_closed, "the trickling client's connection is closed");
        // The SuperLink heard both, completed neither, and holds nothing afterwards.
        assert!(
            upstream.wait_closed().await,
            "a connection to the SuperLink stayed open"
        );
        assert_eq!(upstream.seen.requests.load(Ordering::SeqCst), 2);
        assert_eq!(upstream.seen.completed.load(Ordering::SeqCst), 0);

        front.stop().await;
    })
    .await
    .expect("bounded");
}

#[tokio::test]
async fn a_client_that_stops_reading_its_answer_is_disconnected() {
    tokio::time::timeout(TEST_BOUND, async {
        let stall = Duration::from_secs(1);
        let upstream = upstream().await;
        let front = Front::start(
            "127.0.0.1:0",
            &upstream,
            limits(|l| l.stall_timeout = stall),
        )
        .await;
        let mut c = connect_from(v4(1), front.address).await;
        c.write_all(
            b"POST /v1/fleet/pull-object HTTP/1.1\r\nhost: superlink\r\ncontent-length: 0\r\n\r\n",
        )
        .await
        .unwrap();
        // Read nothing for a while: the front's writes block, then fail after `stall`.
        while upstream.seen.completed.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = Instant::now();
        assert!(
            upstream.wait_closed().await,
            "the front still holds the SuperLink connection of a client that reads nothing"
        );
        let after = started.elapsed();
        eprintln!("a client reading nothing was disconnected after {after:?}");
        assert!(after < stall + Duration::from_secs(2), "{after:?}");
        // What the client can still read ends early: it never gets the whole answer.
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(Ok(n @ 1..)) = tokio::time::timeout(ANSWER_WAIT, c.read(&mut buf)).await {
            got += n;
        }
        assert!(got < LARGE_ANSWER, "the client read {got} bytes");

        front.stop().await;
    })
    .await
    .expect("bounded");
}

/// Whether the connection ends (EOF or reset) within a second.
async fn closed(stream: &mut (impl AsyncRead + Unpin)) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(1), stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn a_known_supernode_gets_through_a_flood_of_new_addresses() {
    tokio::time::timeout(TEST_BOUND, async {
        let upstream = upstream().await;
        // 6 in all, 2 of them reserved: new addresses share 4.
        let front = Front::start(
            "127.0.0.1:0",
            &upstream,
            limits(|l| {
                l.max_connections = 6;
                l.reserved_connections = 2;
                l.max_connections_per_address = 1;
                l.max_connections_per_known_address = 3;
            }),
        )
        .await;
        let node = v4(2);

        // The SuperNode completes a Fleet request before the flood (and closes its connection:
        // `connection: close`, so its place is free once it sees the end).
        let mut c = connect_from(node, front.address).await;
        assert_eq!(
            request(&mut c, "/v1/fleet/send-node-heartbeat", "connection: close\r\n", b"hb").await,
            Some((200, "ok".into()))
        );
        assert!(closed(&mut c).await);

        // The flood: new addresses, one connection each (/health earns no place in the reserve).
        let mut flood = Vec::new();
        let mut flood_refused = 0;
        for i in 0..8 {
            let mut c = connect_from(v4(10 + i), front.address).await;
            match request(&mut c, "/health", "", b"").await {
                Some((200, _)) => flood.push(c),
                _ => flood_refused += 1,
            }
        }
        assert_eq!((flood.len(), flood_refused), (4, 4), "the flood gets the shared 4 only");

        // The known SuperNode still gets through, twice (the reserve of 2).
        let mut n1 = connect_from(node, front.address).await;
        let mut n2 = connect_from(node, front.address).await;
        for n in [&mut n1, &mut n2] {
            assert_eq!(
                request(n, "/v1/fleet/pull-messages", "", b"pm").await,
                Some((200, "ok".into())),
                "the known address through the reserve"
            );
        }
        // All 6 are taken: a 3rd connection waits in the listen backlog until a place frees.
        let mut n3 = connect_from(node, front.address).await;
        n3.write_all(b"POST /v1/fleet/pull-messages HTTP/1.1\r\nhost: superlink\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        let mut byte = [0u8; 1];
        assert!(
            tokio::time::timeout(Duration::from_millis(500), n3.peek(&mut byte))
                .await
                .is_err(),
            "no answer while all places are taken"
        );
        drop(flood.pop());
        assert_eq!(read_response(&mut n3).await, Some((200, "ok".into())));
        // 4 + 1 + 2 + 1 requests reached the SuperLink: none from the refused flood.
        assert_eq!(upstream.seen.requests.load(Ordering::SeqCst), 8);

        front.stop().await;
        assert!(upstream.wait_closed().await, "the front left connections open");
    })
    .await
    .expect("bounded");
}

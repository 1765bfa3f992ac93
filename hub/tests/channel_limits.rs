//! Connection caps of the work channel, attacked over real TLS on loopback: a flood of connections
//! without a client certificate is capped per address and overall and cut after its lifetime, while
//! joins from other addresses and agents with certificates go on; one cluster's certificate opens
//! at most its cap of connections.
mod channel_support;

use channel_support::*;
use flower_addon_agent::channel::{RunOptions, run};
use flower_addon_agent::runtime::MemoryRuntime;
use flower_addon_hub::channel::ChannelConfig;
use flower_addon_hub::channel::conns::ConnLimits;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

const LIFETIME: Duration = Duration::from_secs(2);

fn limited() -> ChannelConfig {
    ChannelConfig {
        handshake_timeout: Duration::from_secs(30),
        connections: ConnLimits {
            max_handshakes: 64,
            first_byte_timeout: Duration::from_secs(30),
            max_anonymous: 12,
            max_anonymous_per_peer: 8,
            anonymous_lifetime: LIFETIME,
            max_per_cluster: 2,
            reserve: 4,
            light_peer: 2,
        },
        ..config()
    }
}

/// A TCP connection to `hub` from `127.0.0.<last>`.
async fn tcp_from(last: u8, hub: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, last], 0)))
        .expect("bind");
    socket.connect(hub).await.expect("connect")
}

/// A TLS connection to `hub` from `127.0.0.<last>` trusting the hub CA, with `client` as the
/// client certificate and key (PEM) when given.
async fn tls_from(
    last: u8,
    hub: &Hub,
    client: Option<(&str, &str)>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(hub.ca.cert_der().clone()).expect("root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let mut config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("cert"),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key"),
            )
            .expect("client auth"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tcp_from(last, hub.addr).await;
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").expect("name"), tcp)
        .await
}

/// Whether the hub serves HTTP/2 on `stream` within `within`: its first frames (SETTINGS)
/// arrive, which the hub sends only once the connection has its place under the caps. False
/// when the stream closes first or nothing comes.
async fn served<S: AsyncRead + Unpin>(stream: &mut S, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    matches!(
        tokio::time::timeout(within, stream.read(&mut buf)).await,
        Ok(Ok(n)) if n > 0
    )
}

/// Whether the hub closes `stream` within `within` (EOF or an error on read).
async fn closed<S: AsyncRead + Unpin>(stream: &mut S, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // Server frames (HTTP/2 settings) are not a close; keep reading.
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn a_flood_without_certificates_is_capped_while_agents_and_joins_go_on() {
    let dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), limited()).await;
    let edge_dir = tempfile::tempdir().expect("tmp");
    let creds = hub.join_accepted("edge-1", edge_dir.path()).await;

    // One address: 8 connections that never start TLS are held (until the handshake timeout),
    // the 9th is closed at once.
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(tcp_from(2, hub.addr).await);
    }
    // Closed at once; held, it would stay open until the first-byte timeout (30 s), so 10 s (for
    // a loaded runner) tells the two apart.
    let mut ninth = tcp_from(2, hub.addr).await;
    assert!(
        closed(&mut ninth, Duration::from_secs(10)).await,
        "the 9th connection from one address is closed at once"
    );
    // The hub takes connections in the order they came and closes one over the cap as it takes
    // it: the 9th closed means it has taken the 8 before, and closed none of them.
    for stream in &mut held {
        assert!(!closed(stream, Duration::from_millis(20)).await, "held");
    }

    // Joins from another address go on.
    let other_dir = tempfile::tempdir().expect("tmp");
    hub.join_accepted("edge-2", other_dir.path()).await;

    // Anonymous TLS connections: one address fills the pool but its reserve (12 - 4); the
    // reserve goes only to addresses holding at most 2 connections: a flooding address's third
    // is closed right after its handshake, while new addresses (joining agents) get the rest;
    // past the overall cap (12) nobody gets in.
    let mut anonymous = Vec::new();
    // The client's handshake ends before the hub's: each is waited for until the hub has counted
    // it in the pool, which it does before it serves HTTP/2 on it (its SETTINGS frame arrives).
    for last in [3, 3, 3, 3, 3, 3, 3, 3, 4, 4] {
        let mut stream = tls_from(last, &hub, None).await.expect("anonymous TLS");
        assert!(
            served(&mut stream, Duration::from_secs(10)).await,
            "an anonymous connection within the cap (or a light address's in the reserve) is served"
        );
        anonymous.push(stream);
    }
    let mut flooding = tls_from(4, &hub, None).await.expect("handshake");
    assert!(
        closed(&mut flooding, Duration::from_secs(1)).await,
        "an address holding more than 2 stays out of the reserve"
    );
    for last in [5, 5] {
        let mut stream = tls_from(last, &hub, None).await.expect("anonymous TLS");
        assert!(
            served(&mut stream, Duration::from_secs(10)).await,
            "a new address (a joining agent) gets a place in the reserve"
        );
        anonymous.push(stream);
    }
    let mut over = tls_from(7, &hub, None).await.expect("handshake");
    assert!(
        closed(&mut over, Duration::from_secs(1)).await,
        "anonymous over the overall cap"
    );

    // An agent with its certificate still connects its work stream.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut options = RunOptions::new(creds.clone(), Some(edge_dir.path().to_path_buf()));
    options.reconnect_min = Duration::from_millis(50);
    options.reconnect_max = Duration::from_millis(300);
    let agent = tokio::spawn(run(options, Arc::new(MemoryRuntime::new()), stop_rx));
    eventually("edge-1 connected", Duration::from_secs(10), async || {
        (hub.connected)() == 1
    })
    .await;

    // One cluster's certificate: its cap (2) with the agent's own connection counted.
    let cert = (creds.cert_pem.as_str(), creds.key_pem.as_str());
    let mut second = tls_from(6, &hub, Some(cert)).await.expect("second");
    // Counted by the hub (served) before the third one comes, as above.
    assert!(
        served(&mut second, Duration::from_secs(10)).await,
        "within the cluster's cap"
    );
    let mut third = tls_from(6, &hub, Some(cert))
        .await
        .expect("third handshake");
    assert!(
        !closed(&mut second, Duration::from_millis(300)).await,
        "within the cluster's cap"
    );
    assert!(
        closed(&mut third, Duration::from_secs(1)).await,
        "over the cluster's cap"
    );

    // Anonymous connections end after their lifetime, which frees the pool.
    for stream in &mut anonymous {
        assert!(
            closed(stream, LIFETIME + Duration::from_secs(2)).await,
            "anonymous connection kept past its lifetime"
        );
    }
    let mut later = tls_from(5, &hub, None).await.expect("handshake");
    assert!(
        !closed(&mut later, Duration::from_millis(300)).await,
        "a slot is free again"
    );

    let _ = stop_tx.send(true);
    agent.await.expect("agent").expect("run");
    // Connections that never speak HTTP/2 would hold the hub's graceful stop.
    drop((held, ninth, flooding, over, second, third, later, anonymous));
    hub.stop().await;
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_first_byte_timeout() {
    // A silent TCP connection (a flood, or a probe) holds its handshake slot only until the
    // first-byte timeout; a real TLS client, which sends its ClientHello at once, is unaffected.
    let dir = tempfile::tempdir().expect("tmp");
    let mut cfg = limited();
    cfg.connections.first_byte_timeout = Duration::from_millis(500);
    let hub = Hub::start_in(dir.path(), any_port(), cfg).await;
    let mut silent = tcp_from(2, hub.addr).await;
    let started = std::time::Instant::now();
    assert!(
        closed(&mut silent, Duration::from_secs(3)).await,
        "silent kept"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "closed too early: {:?}",
        started.elapsed()
    );
    let mut tls = tls_from(3, &hub, None).await.expect("TLS client");
    assert!(!closed(&mut tls, Duration::from_millis(700)).await);
    drop((silent, tls));
    hub.stop().await;
}

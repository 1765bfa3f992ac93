//! The Connect stream over real mTLS on loopback: identity from the certificate only, snapshots
//! and acks, revocation, limits, renewal.
mod channel_support;

use channel_support::*;
use flower_addon_agent::channel::{AgentEvent, RunOptions, run};
use flower_addon_agent::credentials::Credentials;
use flower_addon_agent::runtime::MemoryRuntime;
use flower_addon_agent::tls::{self, HubAddress};
use flower_addon_hub::channel::work::REASON_REVOKED;
use flower_addon_hub::registration::ca::{HubCa, Validity};
use flower_addon_hub::registration::store::{CONDITION_AVAILABLE, ClusterStore};
use flower_addon_proto::agent_message::Kind as AgentKind;
use flower_addon_proto::hub_message::Kind as HubKind;
use flower_addon_proto::work_client::WorkClient;
use flower_addon_proto::{
    Ack, AgentMessage, ClusterWork, Condition, FederationStatus, FederationWork, HubMessage,
    PoolStatus, PoolWork, Status,
};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

fn work_with_pool(replicas: u32) -> ClusterWork {
    ClusterWork {
        federations: vec![FederationWork {
            namespace: "default".into(),
            name: "fed".into(),
            pools: vec![PoolWork {
                name: "p0".into(),
                partition_offset: 0,
                spec_json: format!(r#"{{"name":"p0","replicas":{replicas}}}"#),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Opens a raw Connect stream with `creds`' certificate; returns the sender and the hub's stream.
async fn raw_stream(
    hub: &Hub,
    cert_pem: &str,
    key_pem: &str,
) -> Result<(mpsc::Sender<AgentMessage>, Streaming<HubMessage>), String> {
    let config =
        tls::mtls_config(hub.ca.cert_pem(), cert_pem, key_pem).map_err(|e| e.to_string())?;
    let channel = tls::connect(&HubAddress::new(&hub.hub()), config)
        .await
        .map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel(8);
    let inbound = WorkClient::new(channel)
        .max_encoding_message_size(64 * 1024 * 1024)
        .connect(ReceiverStream::new(rx))
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    Ok((tx, inbound))
}

/// Reads hub messages until the stream fails; returns the error code.
async fn stream_error(inbound: &mut Streaming<HubMessage>) -> Code {
    loop {
        match tokio::time::timeout(Duration::from_secs(5), inbound.message())
            .await
            .expect("stream ends within 5 s")
        {
            Ok(Some(_)) => continue,
            Ok(None) => return Code::Ok,
            Err(status) => return status.code(),
        }
    }
}

fn spawn_agent(
    creds: Credentials,
    runtime: Arc<MemoryRuntime>,
    state_dir: Option<std::path::PathBuf>,
) -> (
    watch::Sender<bool>,
    mpsc::UnboundedReceiver<AgentEvent>,
    tokio::task::JoinHandle<()>,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let mut options = RunOptions::new(creds, state_dir);
    options.reconnect_min = Duration::from_millis(50);
    options.reconnect_max = Duration::from_millis(300);
    options.status_interval = Duration::from_millis(200);
    options.events = Some(ev_tx);
    let task = tokio::spawn(async move {
        run(options, runtime, stop_rx).await.expect("agent run");
    });
    (stop_tx, ev_rx, task)
}

#[tokio::test]
async fn snapshot_on_connect_and_on_change_is_applied_acked_and_reported() {
    // The hub sends the full work on connect and on change; the agent applies, acks the version
    // and reports status; heartbeats make the cluster Available.
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    let v1 = hub.work.set("edge-1", work_with_pool(2));
    let runtime = Arc::new(MemoryRuntime::new());
    let (stop, _events, task) = spawn_agent(creds, runtime.clone(), Some(agent_dir.path().into()));
    let work = hub.work.clone();
    eventually("v1 acked", Duration::from_secs(5), async || {
        work.acked("edge-1") == Some(v1)
    })
    .await;
    assert_eq!(
        runtime.current().expect("applied").federations[0].pools[0].name,
        "p0"
    );
    let v2 = hub.work.set("edge-1", work_with_pool(3));
    eventually("v2 acked", Duration::from_secs(5), async || {
        work.acked("edge-1") == Some(v2)
    })
    .await;
    eventually(
        "status reports 3 ready",
        Duration::from_secs(5),
        async || {
            work.last_status("edge-1")
                .is_some_and(|s| s.observed_version == v2 && s.federations[0].pools[0].ready == 3)
        },
    )
    .await;
    let store = hub.store.clone();
    eventually("cluster available", Duration::from_secs(5), async || {
        store
            .get_cluster("edge-1")
            .await
            .ok()
            .flatten()
            .is_some_and(|c| {
                c.status
                    .condition(CONDITION_AVAILABLE)
                    .is_some_and(|a| a.status == "True")
                    && c.status.last_heartbeat_unix.is_some()
            })
    })
    .await;
    let _ = stop.send(true);
    task.await.expect("agent");
    hub.stop().await;
}

#[tokio::test]
async fn a_cluster_certificate_cannot_ack_or_report_for_another_cluster() {
    // Cluster A's stream claiming to be B gets PERMISSION_DENIED; nothing is recorded for B and
    // A's ack is not changed.
    let dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let a_dir = tempfile::tempdir().expect("tmp");
    let b_dir = tempfile::tempdir().expect("tmp");
    let a = hub.join_accepted("cluster-a", a_dir.path()).await;
    hub.join_accepted("cluster-b", b_dir.path()).await;
    let before = hub.snapshot().await;
    for kind in [
        AgentKind::Ack(Ack {
            version: 42,
            cluster_name: "cluster-b".into(),
        }),
        AgentKind::Status(Status {
            observed_version: 42,
            federations: vec![],
            cluster_name: "cluster-b".into(),
            allocatable: Default::default(),
        }),
    ] {
        let (tx, mut inbound) = raw_stream(&hub, &a.cert_pem, &a.key_pem)
            .await
            .expect("stream");
        let first = inbound.message().await.expect("msg").expect("snapshot");
        assert!(matches!(first.kind, Some(HubKind::Work(ref w)) if w.cluster_name == "cluster-a"));
        tx.send(AgentMessage { kind: Some(kind) })
            .await
            .expect("send");
        assert_eq!(stream_error(&mut inbound).await, Code::PermissionDenied);
    }
    assert_eq!(hub.work.acked("cluster-b"), None);
    assert_eq!(hub.work.last_status("cluster-b"), None);
    assert_eq!(hub.work.acked("cluster-a"), None);
    assert_eq!(hub.snapshot().await, before);
    hub.stop().await;
}

#[tokio::test]
async fn client_certificates_from_a_foreign_ca_or_expired_are_refused_at_the_handshake() {
    // Only certificates issued by this hub's CA and still valid open a stream.
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    let key = rcgen::KeyPair::from_pem(&creds.key_pem).expect("key");
    let csr = flower_addon_agent::credentials::make_csr(&key, "edge-1").expect("csr");
    let foreign = HubCa::generate().expect("foreign ca");
    let foreign_cert = foreign
        .sign_client_csr(&csr, "edge-1", Duration::from_secs(3600))
        .expect("sign");
    let now = SystemTime::now();
    let expired = hub
        .ca
        .sign_client_csr_with_validity(
            &csr,
            "edge-1",
            Validity {
                not_before: now - Duration::from_secs(7200),
                not_after: now - Duration::from_secs(3600),
            },
        )
        .expect("sign");
    let before = hub.snapshot().await;
    for (what, cert) in [
        ("foreign CA", &foreign_cert.cert_pem),
        ("expired", &expired.cert_pem),
    ] {
        let result = raw_stream(&hub, cert, &creds.key_pem).await;
        assert!(result.is_err(), "{what}: stream must be refused");
        assert_eq!((hub.connected)(), 0, "{what}");
    }
    assert_eq!(hub.work.acked("edge-1"), None);
    assert_eq!(hub.snapshot().await, before);
    hub.stop().await;
}

#[tokio::test]
async fn revocation_and_deletion_close_the_stream_at_once_and_stop_the_supernodes() {
    // hubAcceptsClient=false closes the stream with PERMISSION_DENIED and refuses reconnects;
    // deleting does the same; each time the agent stops its SuperNodes (applies an empty work),
    // and an accepted-again cluster gets its work back.
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    let v1 = hub.work.set("edge-1", work_with_pool(2));
    let runtime = Arc::new(MemoryRuntime::new());
    let (stop, mut events, task) = spawn_agent(creds.clone(), runtime.clone(), None);
    let work = hub.work.clone();
    eventually("v1 acked", Duration::from_secs(5), async || {
        work.acked("edge-1") == Some(v1)
    })
    .await;

    hub.store
        .set_accepted("edge-1", false)
        .await
        .expect("revoke");
    // Only the announced change closes the stream: the agent heartbeats every 200 ms, which
    // keeps its lease, and nothing re-checks an open stream's acceptance on a timer. A hub that
    // missed the change would keep the stream open for good, so a bound far above the
    // milliseconds the close takes (10 s, for a loaded runner) still tells the two apart.
    refused_within(&mut events, Duration::from_secs(10), "revoked").await;
    let v2 = hub.work.set("edge-1", work_with_pool(5));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        hub.work.acked("edge-1"),
        Some(v1),
        "a revoked cluster must not get new work"
    );
    let stopped = runtime.current().expect("applied");
    assert!(
        stopped.federations.is_empty(),
        "a revoked cluster's agent stops its SuperNodes: {stopped:?}"
    );
    let c = hub.connected.as_ref();
    assert_eq!(c(), 0);

    // Accept again: it reconnects and resyncs; then delete: closed again.
    hub.store
        .set_accepted("edge-1", true)
        .await
        .expect("accept");
    eventually(
        "v2 acked after re-accept",
        Duration::from_secs(5),
        async || work.acked("edge-1") == Some(v2),
    )
    .await;
    while events.try_recv().is_ok() {}
    hub.store.delete_cluster("edge-1").await.expect("delete");
    // As for the revocation: only the announced deletion closes the stream.
    refused_within(&mut events, Duration::from_secs(10), "deleted").await;
    assert!(
        hub.store
            .get_cluster("edge-1")
            .await
            .expect("get")
            .is_none(),
        "nothing re-created"
    );
    let rt = runtime.clone();
    eventually(
        "SuperNodes stopped after deletion",
        Duration::from_secs(5),
        async || rt.current().is_some_and(|w| w.federations.is_empty()),
    )
    .await;
    let _ = stop.send(true);
    task.await.expect("agent");
    hub.stop().await;
}

/// Waits for the agent's stream to end, with PERMISSION_DENIED, within `within` from now; fails
/// naming the `what` cluster's stream otherwise.
async fn refused_within(
    events: &mut mpsc::UnboundedReceiver<AgentEvent>,
    within: Duration,
    what: &str,
) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| {
                panic!("the {what} cluster's stream is still open after {within:?}")
            })
            .expect("events open");
        if let AgentEvent::Disconnected { code, .. } = event {
            assert_eq!(code, Some(Code::PermissionDenied), "{what}");
            return;
        }
    }
}

/// The `Available` condition of `name` as `(status, reason)`.
async fn available(hub: &Hub, name: &str) -> Option<(String, String)> {
    hub.store
        .get_cluster(name)
        .await
        .ok()
        .flatten()?
        .status
        .condition(CONDITION_AVAILABLE)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test]
async fn a_revoked_cluster_is_recorded_unavailable_until_it_is_accepted_again() {
    // Revocation closes the stream and records Available=False (reason ClusterRevoked) that
    // neither a late heartbeat nor the lease checker overwrites; re-accepting makes the cluster
    // Available again once its agent reconnects.
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    let runtime = Arc::new(MemoryRuntime::new());
    let (stop, _events, task) = spawn_agent(creds, runtime, None);
    let available_is = |status: &'static str, reason: &'static str| {
        let hub = &hub;
        async move || {
            available(hub, "edge-1").await == Some((status.to_string(), reason.to_string()))
        }
    };
    eventually(
        "Available=True",
        Duration::from_secs(5),
        available_is("True", "ClusterAvailable"),
    )
    .await;

    hub.store
        .set_accepted("edge-1", false)
        .await
        .expect("revoke");
    eventually(
        "Available=False after revocation",
        Duration::from_secs(3),
        available_is("False", REASON_REVOKED),
    )
    .await;
    assert_eq!((hub.connected)(), 0);
    // Longer than the lease (3 s): still False, not Unknown (lease expiry) or True.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        available(&hub, "edge-1").await,
        Some(("False".to_string(), REASON_REVOKED.to_string()))
    );

    hub.store
        .set_accepted("edge-1", true)
        .await
        .expect("accept");
    eventually(
        "Available=True after re-accept",
        Duration::from_secs(5),
        available_is("True", "ClusterAvailable"),
    )
    .await;
    let _ = stop.send(true);
    task.await.expect("agent");
    hub.stop().await;
}

/// edge-1's report of Federation default/fed with the one pool `pool`, named p0, 1/1 ready.
fn report_of_pool(pool: PoolStatus) -> Status {
    Status {
        observed_version: 1,
        cluster_name: "edge-1".into(),
        federations: vec![FederationStatus {
            supernode_restart: String::new(),
            namespace: "default".into(),
            name: "fed".into(),
            pools: vec![PoolStatus {
                name: "p0".into(),
                desired: 1,
                ready: 1,
                ..pool
            }],
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn oversized_messages_are_refused_and_recorded_nowhere() {
    // A status over the 4 MiB decode limit ends the stream with an error and is not recorded.
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    let before = hub.snapshot().await;
    let (tx, mut inbound) = raw_stream(&hub, &creds.cert_pem, &creds.key_pem)
        .await
        .expect("stream");
    let huge = report_of_pool(PoolStatus {
        conditions: vec![Condition {
            message: "x".repeat(5 * 1024 * 1024),
            ..Default::default()
        }],
        ..Default::default()
    });
    tx.send(AgentMessage {
        kind: Some(AgentKind::Status(huge)),
    })
    .await
    .expect("send");
    let code = stream_error(&mut inbound).await;
    assert!(
        matches!(
            code,
            Code::OutOfRange | Code::ResourceExhausted | Code::Internal
        ),
        "{code:?}"
    );
    assert_eq!(hub.work.last_status("edge-1"), None);
    assert_eq!(hub.snapshot().await.0.len(), before.0.len());
    assert_eq!(hub.snapshot().await.1, before.1);
    hub.stop().await;
}

#[tokio::test]
async fn a_new_stream_replaces_the_old_one() {
    // One stream per cluster: the older stream is closed (ABORTED) when the same cluster connects
    // again.
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    let (_tx1, mut first) = raw_stream(&hub, &creds.cert_pem, &creds.key_pem)
        .await
        .expect("first");
    first.message().await.expect("msg").expect("snapshot");
    let (_tx2, mut second) = raw_stream(&hub, &creds.cert_pem, &creds.key_pem)
        .await
        .expect("second");
    second.message().await.expect("msg").expect("snapshot");
    assert_eq!(stream_error(&mut first).await, Code::Aborted);
    assert_eq!((hub.connected)(), 1);
    hub.stop().await;
}

#[tokio::test]
async fn the_client_certificate_is_renewed_without_dropping_the_stream() {
    // At 80 % of its life the agent renews over the open connection: new cert on disk, same key,
    // and the stream never disconnects.
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let mut cfg = config();
    cfg.cert_validity = Duration::from_secs(5);
    let hub = Hub::start_in(dir.path(), any_port(), cfg).await;
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    let (_, first_not_after) = creds.cert_validity().expect("validity");
    let runtime = Arc::new(MemoryRuntime::new());
    let (stop, mut events, task) =
        spawn_agent(creds.clone(), runtime, Some(agent_dir.path().into()));
    let mut renewed = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while renewed.is_none() {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .expect("renewal within 10 s")
            .expect("open");
        match event {
            AgentEvent::Renewed { not_after } => renewed = Some(not_after),
            AgentEvent::Disconnected { code, message } => {
                panic!("stream dropped: {code:?} {message}")
            }
            _ => {}
        }
    }
    assert!(renewed.expect("renewed") > first_not_after);
    let on_disk = Credentials::load(agent_dir.path()).expect("load");
    assert_ne!(on_disk.cert_pem, creds.cert_pem);
    assert_eq!(on_disk.key_pem, creds.key_pem);
    let store = hub.store.clone();
    let record = store
        .get_cluster("edge-1")
        .await
        .expect("get")
        .expect("cluster");
    assert!(record.status.client_cert_not_after_unix.is_some());
    assert_eq!((hub.connected)(), 1);
    let _ = stop.send(true);
    task.await.expect("agent");
    hub.stop().await;
}

#[tokio::test]
async fn reported_allocatable_resources_are_stored_for_placement() {
    // An agent's Status carries its allocatable CPU and memory; the hub stores those two (and
    // nothing else it was sent) on the cluster, where the ResourceAllocatable* prioritizers
    // read them.
    let dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let a_dir = tempfile::tempdir().expect("tmp");
    let a = hub.join_accepted("edge-1", a_dir.path()).await;
    let (tx, mut inbound) = raw_stream(&hub, &a.cert_pem, &a.key_pem)
        .await
        .expect("stream");
    inbound.message().await.expect("msg").expect("snapshot");
    let allocatable = [("cpu", "4"), ("memory", "8Gi"), ("gpu", "1")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tx.send(AgentMessage {
        kind: Some(AgentKind::Status(Status {
            observed_version: 0,
            federations: vec![],
            cluster_name: "edge-1".into(),
            allocatable,
        })),
    })
    .await
    .expect("send");
    let store = hub.store.clone();
    let want: std::collections::BTreeMap<String, String> = [("cpu", "4"), ("memory", "8Gi")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    eventually("allocatable stored", Duration::from_secs(5), async || {
        store
            .get_cluster("edge-1")
            .await
            .ok()
            .flatten()
            .is_some_and(|c| c.status.allocatable == want)
    })
    .await;
    drop(tx);
    hub.stop().await;
}

#[tokio::test]
async fn a_report_with_a_malformed_node_key_is_refused_at_the_edge_and_recorded_nowhere() {
    // A key line with multibyte characters (it once reached the key sync, which sliced it by byte
    // index and panicked) ends the stream with INVALID_ARGUMENT naming the field; nothing of the
    // report is recorded.
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    let (tx, mut inbound) = raw_stream(&hub, &creds.cert_pem, &creds.key_pem)
        .await
        .expect("stream");
    let report = report_of_pool(PoolStatus {
        node_public_keys: vec!["ecdsa-sha2-nistp384 ééééééééééééééé".into()],
        ..Default::default()
    });
    tx.send(AgentMessage {
        kind: Some(AgentKind::Status(report)),
    })
    .await
    .expect("send");
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(30), inbound.message()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Err(status)) => break status,
            other => panic!("the stream should end with an error, got {other:?}"),
        }
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("federations[0].pools[0].node_public_keys[0]: holds 'é'"),
        "{}",
        status.message()
    );
    assert_eq!(hub.work.last_status("edge-1"), None);
    hub.stop().await;
}

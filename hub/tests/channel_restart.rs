//! Restarts over real TLS on loopback: the hub's (agents reconnect and resync, no duplicate
//! cluster) and the agent's (same identity from disk, no re-join).
mod channel_support;

use channel_support::*;
use flower_addon_agent::channel::{AgentEvent, RunOptions, run};
use flower_addon_agent::credentials::Credentials;
use flower_addon_agent::runtime::MemoryRuntime;
use flower_addon_hub::registration::store::ClusterStore;
use flower_addon_proto::ClusterWork;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

fn agent(
    creds: Credentials,
    dir: &std::path::Path,
    runtime: Arc<MemoryRuntime>,
) -> (
    watch::Sender<bool>,
    mpsc::UnboundedReceiver<AgentEvent>,
    tokio::task::JoinHandle<()>,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let mut options = RunOptions::new(creds, Some(dir.to_path_buf()));
    options.reconnect_min = Duration::from_millis(50);
    options.reconnect_max = Duration::from_millis(300);
    options.events = Some(ev_tx);
    let task = tokio::spawn(async move { run(options, runtime, stop_rx).await.expect("run") });
    (stop_tx, ev_rx, task)
}

#[tokio::test]
async fn after_a_hub_restart_agents_reconnect_and_resync_without_duplicates() {
    // A restarted hub (same state dir and port) gets every agent back, sends its current work,
    // and still has exactly one record per cluster; the agents kept their work meanwhile.
    let dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let addr = hub.addr;
    let mut agents = Vec::new();
    for name in ["edge-1", "edge-2"] {
        let agent_dir = tempfile::tempdir().expect("tmp");
        let creds = hub.join_accepted(name, agent_dir.path()).await;
        let runtime = Arc::new(MemoryRuntime::new());
        let (stop, events, task) = agent(creds, agent_dir.path(), runtime.clone());
        agents.push((name, agent_dir, runtime, stop, events, task));
    }
    let work = hub.work.clone();
    let v1: Vec<u64> = agents
        .iter()
        .map(|a| hub.work.set(a.0, ClusterWork::default()))
        .collect();
    for (a, v) in agents.iter().zip(&v1) {
        let name = a.0;
        eventually("acked before restart", Duration::from_secs(5), async || {
            work.acked(name) == Some(*v)
        })
        .await;
    }
    hub.stop().await;
    for a in &agents {
        assert_eq!(
            a.2.current().expect("kept").version,
            v1[0].max(a.2.current().expect("kept").version)
        );
    }

    let hub = Hub::start_in(dir.path(), addr, config()).await;
    let v2: Vec<u64> = agents
        .iter()
        .map(|a| hub.work.set(a.0, ClusterWork::default()))
        .collect();
    let work = hub.work.clone();
    for (a, v) in agents.iter().zip(&v2) {
        let name = a.0;
        eventually(
            "resynced after restart",
            Duration::from_secs(10),
            async || work.acked(name) == Some(*v),
        )
        .await;
        assert_eq!(a.2.current().expect("applied").version, *v);
    }
    let clusters = hub.store.list_clusters().await.expect("list");
    let names: Vec<_> = clusters
        .iter()
        .map(|c| c.registration.name.as_str())
        .collect();
    assert_eq!(names, vec!["edge-1", "edge-2"]);
    assert_eq!((hub.connected)(), 2);
    for (_, _, _, stop, mut events, task) in agents {
        let _ = stop.send(true);
        task.await.expect("agent");
        let mut disconnects = 0;
        while let Ok(e) = events.try_recv() {
            if matches!(e, AgentEvent::Disconnected { .. }) {
                disconnects += 1;
            }
        }
        assert!(disconnects >= 1, "the agent saw the hub go away");
    }
    hub.stop().await;
}

#[tokio::test]
async fn a_restarted_agent_reuses_its_identity_without_joining_again() {
    // An agent restarted from its state dir connects with the stored certificate even after its
    // bootstrap token is gone; the cluster record keeps the same key.
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    let before = hub
        .store
        .get_cluster("edge-1")
        .await
        .expect("get")
        .expect("cluster");
    let runtime = Arc::new(MemoryRuntime::new());
    let (stop, _ev, task) = agent(creds, agent_dir.path(), runtime);
    let work = hub.work.clone();
    let v1 = hub.work.set("edge-1", ClusterWork::default());
    eventually("first run acked", Duration::from_secs(5), async || {
        work.acked("edge-1") == Some(v1)
    })
    .await;
    let _ = stop.send(true);
    task.await.expect("agent");
    for token in hub.store.list_tokens().await.expect("tokens") {
        hub.store
            .delete_token(&token.id)
            .await
            .expect("delete token");
    }

    let loaded = Credentials::load(agent_dir.path()).expect("load");
    let runtime = Arc::new(MemoryRuntime::new());
    let (stop, _ev, task) = agent(loaded, agent_dir.path(), runtime.clone());
    let v2 = hub.work.set("edge-1", ClusterWork::default());
    eventually(
        "restarted agent acked",
        Duration::from_secs(5),
        async || work.acked("edge-1") == Some(v2),
    )
    .await;
    let after = hub
        .store
        .get_cluster("edge-1")
        .await
        .expect("get")
        .expect("cluster");
    assert_eq!(after.registration, before.registration);
    assert_eq!(hub.store.list_clusters().await.expect("list").len(), 1);
    let _ = stop.send(true);
    task.await.expect("agent");
    hub.stop().await;
}

#[tokio::test]
async fn a_cluster_whose_agent_died_while_no_hub_ran_becomes_unknown_after_the_grace() {
    // The store says Available=True from before the restart, but the agent is gone: the
    // restarted hub gives it one grace period (5 leases) from its start, then records
    // Available=Unknown (the unreachable taint follows from that in both modes).
    let dir = tempfile::tempdir().expect("tmp");
    let mut cfg = config();
    cfg.lease_duration = Duration::from_millis(400);
    let hub = Hub::start_in(dir.path(), any_port(), cfg.clone()).await;
    let addr = hub.addr;
    let agent_dir = tempfile::tempdir().expect("tmp");
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    let runtime = Arc::new(MemoryRuntime::new());
    let (stop, _events, task) = agent(creds, agent_dir.path(), runtime);
    let available = |hub: &Hub| {
        let store = hub.store.clone();
        async move {
            store
                .get_cluster("edge-1")
                .await
                .ok()
                .flatten()
                .and_then(|c| {
                    c.status
                        .condition(flower_addon_hub::registration::store::CONDITION_AVAILABLE)
                        .map(|a| a.status.clone())
                })
        }
    };
    eventually("available", Duration::from_secs(5), async || {
        available(&hub).await.as_deref() == Some("True")
    })
    .await;
    // Agent and hub stop together: nothing recorded the agent's death.
    let _ = stop.send(true);
    task.await.expect("agent");
    hub.stop().await;
    let hub = Hub::start_in(dir.path(), addr, cfg).await;
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        available(&hub).await.as_deref(),
        Some("True"),
        "within the grace the cluster keeps its state"
    );
    eventually(
        "unknown after the grace",
        Duration::from_secs(10),
        async || available(&hub).await.as_deref() == Some("Unknown"),
    )
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(2000),
        "not before 5 leases: {:?}",
        started.elapsed()
    );
    let record = hub
        .store
        .get_cluster("edge-1")
        .await
        .expect("store")
        .expect("cluster");
    assert_eq!(
        record.status.availability_taint().map(|(k, _)| k),
        Some(flower_addon_hub::core::placement::TAINT_UNREACHABLE)
    );
    hub.stop().await;
}

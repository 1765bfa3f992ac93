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
async fn an_agent_keeps_its_work_until_a_restarted_hub_has_decided_it() {
    // Invariant: a restarted standalone hub (a gated work source) sends a reconnecting agent
    // nothing, not an empty list that would stop its SuperNodes, until it has computed that
    // cluster's work; then it sends it at once.
    use flower_addon_hub::channel::source::InMemoryWorkSource;
    use flower_addon_hub::registration::store::file::FileStore;
    use flower_addon_proto::FederationWork;
    let dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let addr = hub.addr;
    let agent_dir = tempfile::tempdir().expect("tmp");
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    let runtime = Arc::new(MemoryRuntime::new());
    let (stop, _events, task) = agent(creds, agent_dir.path(), runtime.clone());
    let running = ClusterWork {
        federations: vec![FederationWork {
            namespace: "default".into(),
            name: "quickstart".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let v1 = hub.work.set("edge-1", running.clone());
    let work = hub.work.clone();
    eventually("v1 applied", Duration::from_secs(5), async || {
        work.acked("edge-1") == Some(v1)
    })
    .await;
    hub.stop().await;

    let store = Arc::new(FileStore::open(dir.path()).expect("store"));
    let hub = Hub::start_with_work(
        store,
        dir.path(),
        addr,
        config(),
        InMemoryWorkSource::gated(),
    )
    .await;
    eventually("reconnected", Duration::from_secs(10), async || {
        (hub.connected)() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let kept = runtime.current().expect("applied before");
    assert_eq!(
        kept.version, v1,
        "the agent was sent work before the hub decided it"
    );
    assert_eq!(kept.federations.len(), 1);

    let v2 = hub.work.set("edge-1", running);
    let work = hub.work.clone();
    eventually(
        "v2 applied once decided",
        Duration::from_secs(5),
        async || work.acked("edge-1") == Some(v2),
    )
    .await;
    assert_eq!(runtime.current().expect("applied").federations.len(), 1);
    let _ = stop.send(true);
    task.await.expect("agent");
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

/// Applies `step` of a work-channel CA rotation to the hub's store (what `flower-hub ca rotate
/// STEP --ca channel` does) and restarts the hub on it (same state dir and port).
async fn rotate_and_restart(
    hub: Hub,
    step: flower_addon_hub::registration::rotation::RotationStep,
) -> Hub {
    use flower_addon_hub::registration::ca::CaRole;
    let (dir, addr, store) = (hub.dir.clone(), hub.addr, hub.store.clone());
    let current = store.load_ca().await.expect("load").expect("a CA");
    let next = flower_addon_hub::registration::rotation::rotate(CaRole::Channel, &current, step)
        .expect("the step follows");
    store
        .replace_ca_for(CaRole::Channel, &current, &next)
        .await
        .expect("stored");
    hub.stop().await;
    Hub::start_in(&dir, addr, config()).await
}

/// Whether `cert_pem` was signed by `ca` (a client verifier trusting only it accepts it).
fn signed_by(cert_pem: &str, ca: &flower_addon_hub::registration::ca::HubCa) -> bool {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, UnixTime};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der().clone()).expect("root");
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .expect("verifier");
    let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes()).expect("pem");
    verifier
        .verify_client_cert(&cert, &[], UnixTime::now())
        .is_ok()
}

/// Staged and in force, with edge-1 renewed and edge-away not: `flower-hub ca status --ca
/// channel` counts 1 of 2 and names edge-away; `ca rotate promote --ca channel` is refused naming
/// it (promoting would lock it out), and `--force` is what it offers.
async fn promote_waits_for_the_agent_that_did_not_renew(hub: &Hub) {
    use flower_addon_hub::registration::ca::CaRole;
    let material = hub.store.load_ca().await.expect("load").expect("a CA");
    hub.store
        .mark_ca_in_force(
            CaRole::Channel,
            &flower_addon_hub::registration::rotation::in_force_fingerprint(&material),
        )
        .await
        .expect("in force");
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_flower-hub"))
            .args(args)
            .arg("--state-dir")
            .arg(&hub.dir)
            .output()
            .expect("run flower-hub");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, status, err) = cli(&["ca", "status", "--ca", "channel"]);
    assert!(ok, "{err}");
    assert!(
        status.contains("agents:     1 of 2 renewed with this CA (waiting for edge-away)"),
        "{status}"
    );
    let (ok, _, err) = cli(&["ca", "rotate", "promote", "--ca", "channel"]);
    assert!(
        !ok,
        "promote with an agent that did not renew must be refused"
    );
    for part in ["1 of 2 agents renewed", "waiting for edge-away", "--force"] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    let after = hub.store.load_ca().await.expect("load").expect("a CA");
    assert_eq!(
        flower_addon_hub::registration::rotation::in_force_fingerprint(&after),
        flower_addon_hub::registration::rotation::in_force_fingerprint(&material),
        "a refused promote changed the CA"
    );
}

#[tokio::test]
async fn a_rotated_channel_ca_reaches_connected_agents_without_cutting_them_off() {
    // A CA rotation: stage → the agent stores both CAs (renewing at the first heartbeat); promote →
    // the hub serves a certificate of the new CA, the agent (trusting both) reconnects and renews
    // from the new CA; retire → only the new CA is left and the agent keeps working. An agent that
    // was away for the whole rotation holds only the old CA and an old certificate: it can no
    // longer connect (neither side trusts the other), and its work is never sent to it.
    use flower_addon_hub::registration::rotation::RotationStep;
    let dir = tempfile::tempdir().expect("tmp");
    let mut hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let old = hub.ca.clone();
    let (a_dir, away_dir) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let creds = hub.join_accepted("edge-1", a_dir.path()).await;
    let away = hub.join_accepted("edge-away", away_dir.path()).await;
    let runtime = Arc::new(MemoryRuntime::new());
    let (stop, _events, task) = agent(creds, a_dir.path(), runtime.clone());
    let stored = || Credentials::load(a_dir.path()).expect("stored credentials");

    for step in [
        RotationStep::Stage,
        RotationStep::Promote,
        RotationStep::Retire,
    ] {
        hub = rotate_and_restart(hub, step).await;
        let ca = hub.ca.clone();
        eventually(
            &format!("{}: the agent stores the hub's bundle", step.as_str()),
            Duration::from_secs(10),
            async || stored().ca_pem == ca.bundle_pem(),
        )
        .await;
        let want_signer = if step == RotationStep::Stage {
            &old
        } else {
            &ca
        };
        eventually(
            &format!(
                "{}: the agent's certificate is the signing CA's",
                step.as_str()
            ),
            Duration::from_secs(10),
            async || signed_by(&stored().cert_pem, want_signer),
        )
        .await;
        // The hub records what each agent got; `ca status`/`ca rotate` count from it.
        let record = hub
            .store
            .get_cluster("edge-1")
            .await
            .expect("store")
            .expect("edge-1");
        assert_eq!(
            record.status.client_cert_issuer.as_deref(),
            Some(want_signer.hash()),
            "{}: the recorded issuer",
            step.as_str()
        );
        assert_eq!(
            record.status.channel_bundle,
            Some(flower_addon_hub::registration::ca::bundle_id(
                ca.bundle_pem()
            )),
            "{}: the recorded bundle",
            step.as_str()
        );
        if step == RotationStep::Stage {
            promote_waits_for_the_agent_that_did_not_renew(&hub).await;
        }
        let version = hub.work.set("edge-1", ClusterWork::default());
        let work = hub.work.clone();
        eventually(
            &format!("{}: work acked over the rotated channel", step.as_str()),
            Duration::from_secs(10),
            async || work.acked("edge-1") == Some(version),
        )
        .await;
    }
    assert_ne!(hub.ca.hash(), old.hash(), "a new CA signs");
    assert_eq!(
        flower_addon_agent::tls::bundle_hashes(&stored().ca_pem),
        [hub.ca.hash()],
        "the old CA is gone from the agent's trust"
    );

    // The agent that missed the rotation cannot connect any more.
    let away_runtime = Arc::new(MemoryRuntime::new());
    let (away_stop, mut away_events, away_task) =
        agent(away, away_dir.path(), away_runtime.clone());
    let version = hub.work.set("edge-away", ClusterWork::default());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut disconnects = 0;
    while let Ok(event) = away_events.try_recv() {
        assert!(
            !matches!(event, AgentEvent::Connected),
            "an agent of the retired CA connected"
        );
        if let AgentEvent::Disconnected { message, .. } = &event {
            disconnects += 1;
            // Told apart from an outage: the agent logs how to join again.
            let fix = flower_addon_agent::channel::locked_out(message, "edge-away")
                .unwrap_or_else(|| panic!("not recognised as a lock-out: {message}"));
            assert!(
                fix.contains("flower-hub token create --cluster-name edge-away"),
                "{fix}"
            );
        }
    }
    assert!(disconnects >= 1, "the away agent tried and was refused");
    assert_ne!(hub.work.acked("edge-away"), Some(version));
    assert!(
        away_runtime.current().is_none(),
        "work reached the away agent"
    );

    for (stop, task) in [(stop, task), (away_stop, away_task)] {
        let _ = stop.send(true);
        task.await.expect("agent");
    }
    hub.stop().await;
}

#[tokio::test]
async fn an_agent_comes_back_at_once_after_a_restart_even_when_its_delays_had_grown() {
    // The hub was down long enough for the agent's reconnect delay to grow (to 3.2 s or its
    // 4 s cap here); it came back for a short while and restarted again: the stream it closes
    // for the shutdown (UNAVAILABLE) starts the delays afresh, so the agent is back within its
    // first delays, not after the grown one (in CI the carried-over delay outlasted a lease's
    // grace).
    let dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let addr = hub.addr;
    let agent_dir = tempfile::tempdir().expect("tmp");
    let creds = hub.join_accepted("edge-1", agent_dir.path()).await;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut options = RunOptions::new(creds, Some(agent_dir.path().to_path_buf()));
    options.reconnect_min = Duration::from_millis(100);
    options.reconnect_max = Duration::from_secs(4);
    let task = tokio::spawn(async move {
        run(options, Arc::new(MemoryRuntime::new()), stop_rx)
            .await
            .expect("run")
    });
    let connected = |hub: &Hub| (hub.connected)() == 1;
    eventually("connected", Duration::from_secs(5), async || {
        connected(&hub)
    })
    .await;
    hub.stop().await;
    // Down for 4 s: delays 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, then 4 s, each with a jitter of up to
    // as much again (backon), so even four of the largest (3 s) do not cover the outage: the
    // agent comes back after its fifth delay or later, and the delay after that one is 3.2 s
    // at least.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let hub = Hub::start_in(dir.path(), addr, config()).await;
    // The delay under way when the hub is back may be up to 8 s (the 4 s cap and its jitter).
    eventually(
        "back after the outage",
        Duration::from_secs(15),
        async || connected(&hub),
    )
    .await;
    // Timed from before the stop: the agent's next delay starts when the stop closes its
    // stream, so an agent that carried over the delays grown in the outage waits at least 3.2 s
    // from here (see above). Starting afresh it waits 0.1-0.2 s (then 0.2-0.4 s should the hub
    // not listen yet) plus the stop, the start and one handshake: well under 1 s, so the bound
    // of 3 s leaves a loaded runner about x5 and still sits below the 3.2 s.
    let restarted = std::time::Instant::now();
    hub.stop().await;
    let hub = Hub::start_in(dir.path(), addr, config()).await;
    eventually(
        "back after the restart",
        Duration::from_secs(10),
        async || connected(&hub),
    )
    .await;
    assert!(
        restarted.elapsed() < Duration::from_secs(3),
        "back {:?} after the restart: the delays grown during the outage carried over",
        restarted.elapsed()
    );
    let _ = stop_tx.send(true);
    task.await.expect("agent");
    hub.stop().await;
}

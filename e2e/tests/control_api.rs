//! The hub's Rust client for Flower's Control API against real SuperLinks of every dialect
//! (1.25.0 and 1.36.0 gRPC; 1.39.0 and 1.42.0 protobuf over HTTPS), each started with the hub's
//! own argument builder: register (idempotent), list, sync, unregister,
//! list runs; a registered SuperNode shows `online`; an unregistered key is refused by the
//! SuperLink; a wrong CA is refused by the client.
use anyhow::{Context, Result, bail, ensure};
use e2e::harness::{Processes, free_port};
use e2e::superlink::TestSuperLink;
use flower_addon_hub::flower::control::{ControlClient, ControlEndpoint, Registration};
use flower_addon_hub::flower::{keys, sync_keys};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_api_classic_1_25() -> Result<()> {
    exercise("1.25.0").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_api_transitional_1_36() -> Result<()> {
    exercise("1.36.0").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_api_transitional_http_1_39() -> Result<()> {
    exercise("1.39.0").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_api_unified_1_42() -> Result<()> {
    exercise("1.42.0").await
}

async fn exercise(version: &str) -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir()?;
    let sl = TestSuperLink::start(version, dir.path()).await?;
    let client = sl.client()?;
    let key = |n: &str| -> Result<String> {
        flower_addon_agent::process_runtime::ensure_node_key(&dir.path().join(format!("{n}.key")))
            .map_err(|e| anyhow::anyhow!("{e}"))
    };
    let (k1, k2) = (key("k1")?, key("k2")?);
    key("k3")?; // never registered

    // Register: a new key gets a node id; the same key again is success, not an error.
    let Registration::Registered(id1) = client.register_node(&k1).await? else {
        bail!("a new key was not newly registered");
    };
    ensure!(
        client.register_node(&k1).await? == Registration::AlreadyRegistered,
        "registering a key twice must be idempotent"
    );
    let listed = client.list_nodes().await?;
    ensure!(listed.len() == 1, "{listed:?}");
    ensure!(
        listed[0].node_id == id1 && listed[0].status == "registered",
        "{listed:?}"
    );
    ensure!(
        listed[0].public_key_der == Some(keys::openssh_to_spki_der(&k1)?),
        "the listed key is not the PEM Flower's CLI would have sent"
    );

    // Sync to {k1, k2}: k2 registered, nothing removed.
    let want: BTreeSet<String> = [k1.clone(), k2.clone()].into();
    let s = sync_keys(&client, &want).await?;
    ensure!(
        s.newly_registered == 1 && s.unregistered == 0 && s.failed.is_empty(),
        "{s:?}"
    );
    ensure!(s.registered == want, "{s:?}");

    // A SuperNode with k2 connects and the SuperLink lists it online (the readiness signal
    // Federation status uses); one with the unregistered k3 is refused and exits.
    let mut nodes = Processes::default();
    start_supernode(&sl, &mut nodes, "k2", dir.path())?;
    start_supernode(&sl, &mut nodes, "k3", dir.path())?;
    let t = Instant::now();
    let online = wait_online(&client, &want, &k2).await?;
    println!(
        "{version}: SuperNode k2 online after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    ensure!(online.online == BTreeSet::from([k2.clone()]), "{online:?}");
    let refused = wait_refused(&mut nodes, "supernode-k3", &dir.path().join("k3.log")).await?;
    println!("{version}: unregistered SuperNode refused: {refused}");

    // Sync to {k1}: k2's node is unregistered and no longer listed.
    let want: BTreeSet<String> = [k1.clone()].into();
    let s = sync_keys(&client, &want).await?;
    ensure!(
        s.unregistered == 1 && s.newly_registered == 0 && s.failed.is_empty(),
        "{s:?}"
    );
    let k2_der = keys::openssh_to_spki_der(&k2)?;
    let listed = client.list_nodes().await?;
    ensure!(
        !listed
            .iter()
            .any(|n| n.public_key_der.as_ref() == Some(&k2_der) && n.status != "unregistered"),
        "k2 is still registered: {listed:?}"
    );
    // The SuperLink refuses the running SuperNode whose key was removed: it exits.
    let (status, after) = wait_exit(&mut nodes, "supernode-k2").await?;
    println!("{version}: SuperNode k2 exited {status} {after:.1} s after its key was unregistered");
    // Flower never takes an unregistered key back: registering k2 again answers "already in
    // use" and its node stays unregistered. So the hub must retire such a key (the agent makes a
    // new one) instead of counting it as registered (`core::nodekeys::plan`).
    ensure!(client.register_node(&k2).await? == Registration::AlreadyRegistered);
    let listed = client.list_nodes().await?;
    ensure!(
        listed
            .iter()
            .filter(|n| n.public_key_der.as_ref() == Some(&k2_der))
            .all(|n| n.status == "unregistered"),
        "k2 came back: {listed:?}"
    );
    let plan =
        flower_addon_hub::core::nodekeys::plan(&[(k2_der.clone(), k2.clone())].into(), &listed);
    ensure!(
        plan.retired == BTreeSet::from([k2.clone()]) && plan.register.is_empty(),
        "{plan:?}"
    );
    // Idempotent removal; runs listed (none yet).
    client.unregister_node(id1.wrapping_add(12345)).await?;
    ensure!(client.list_runs().await?.is_empty());

    // A client trusting another CA is refused at the TLS handshake.
    let other = flower_addon_hub::registration::ca::HubCa::generate()?;
    let wrong = ControlClient::new(ControlEndpoint {
        ca_pem: Some(other.cert_pem().to_owned()),
        ..sl.control.clone()
    })?;
    let err = wrong
        .list_nodes()
        .await
        .expect_err("a foreign CA must be refused");
    let text = err.to_string();
    ensure!(
        text.contains("cannot reach") && text.to_lowercase().contains("certificate"),
        "{text}"
    );
    Ok(())
}

/// Waits (at most 60 s) until the SuperLink has refused SuperNode `name` (an unregistered key):
/// it exits with an error, or — Flower 1.35 and 1.36, whose SuperNode stays up after the refusal
/// (an exception in its main thread, the process kept by a child) — its log shows the refusal
/// (`Failed to activate SuperNode`, code 2004). What happened, for the test output.
async fn wait_refused(nodes: &mut Processes, name: &str, log: &Path) -> Result<String> {
    let t = Instant::now();
    loop {
        if let Some(status) = nodes.get_mut(name)?.exited() {
            ensure!(
                !status.success(),
                "the unregistered SuperNode exited with {status}"
            );
            return Ok(format!(
                "exited {status} after {:.1} s",
                t.elapsed().as_secs_f64()
            ));
        }
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains("Failed to activate SuperNode") {
            return Ok(format!(
                "refused (code 2004 in its log) after {:.1} s; the process stays up",
                t.elapsed().as_secs_f64()
            ));
        }
        if t.elapsed() > Duration::from_secs(60) {
            bail!("{name} was not refused in 60 s\n{}", nodes.log_tails(None));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits (at most 60 s) for process `name` to exit: its status and the seconds it took.
async fn wait_exit(nodes: &mut Processes, name: &str) -> Result<(std::process::ExitStatus, f64)> {
    let t = Instant::now();
    loop {
        if let Some(status) = nodes.get_mut(name)?.exited() {
            return Ok((status, t.elapsed().as_secs_f64()));
        }
        if t.elapsed() > Duration::from_secs(60) {
            bail!("{name} still runs after 60 s\n{}", nodes.log_tails(None));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn wait_online(
    client: &ControlClient,
    want: &BTreeSet<String>,
    key: &str,
) -> Result<flower_addon_hub::flower::KeySync> {
    let t = Instant::now();
    loop {
        let s = sync_keys(client, want).await?;
        if s.online.contains(key) {
            return Ok(s);
        }
        if t.elapsed() > Duration::from_secs(90) {
            bail!("SuperNode not online after 90 s: {s:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn start_supernode(
    sl: &TestSuperLink,
    procs: &mut Processes,
    name: &str,
    dir: &Path,
) -> Result<()> {
    let port = free_port()?;
    let mut cmd = std::process::Command::new(sl.venv.join("bin/flower-supernode"));
    cmd.arg("--superlink")
        .arg(&sl.fleet)
        .arg("--root-certificates")
        .arg(&sl.ca_file)
        .arg("--auth-supernode-private-key")
        .arg(dir.join(format!("{name}.key")))
        .arg("--isolation")
        .arg("subprocess");
    if sl.control.dialect.supernode_host_port() {
        cmd.arg("--host=127.0.0.1").arg(format!("--port={port}"));
    } else {
        cmd.arg(format!("--clientappio-api-address=127.0.0.1:{port}"));
    }
    let home = dir.join(format!("home-{name}"));
    std::fs::create_dir_all(&home)?;
    cmd.envs(flower_addon_agent::supervise::flower_env(Some(
        &sl.venv.join("bin"),
    )))
    .env("FLWR_HOME", &home)
    .current_dir(dir);
    procs
        .start_group(
            &format!("supernode-{name}"),
            cmd,
            &dir.join(format!("{name}.log")),
        )
        .context("starting a SuperNode")
}

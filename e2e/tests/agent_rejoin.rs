//! An agent whose client certificate expired while it was not connected (the hub cannot renew
//! an expired certificate) tells how to re-join, and re-joins with its stored key when it is
//! given a fresh bootstrap token; the hub keeps the same cluster and key. Real binaries against
//! a standalone hub issuing 6-second certificates.
//!
//! Needs `target/debug/flower-hub` and `target/debug/flower-agent` (test.sh builds them first).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e::harness::{Processes, binary, free_port, wait_until_blocking};

fn bin(name: &str) -> PathBuf {
    binary(name).expect("the product binaries")
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The cluster's record in `flower-hub status -o json`.
fn cluster(state: &Path, name: &str) -> serde_json::Value {
    let out = run_ok(
        Command::new(bin("flower-hub"))
            .args(["status", "-o", "json", "--state-dir"])
            .arg(state),
    );
    let status: serde_json::Value = serde_json::from_str(&out).expect("status JSON");
    status["clusters"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name).cloned())
        .unwrap_or(serde_json::Value::Null)
}

fn heartbeat(state: &Path) -> u64 {
    cluster(state, "edge-1")["status"]["lastHeartbeatUnix"]
        .as_u64()
        .unwrap_or(0)
}

fn token(state: &Path, hub: &str) -> (String, String) {
    let out = run_ok(
        Command::new(bin("flower-hub"))
            .args([
                "token", "create", "--ttl", "10m", "-o", "json", "--hub", hub,
            ])
            // The admin's label: what --auto-accept site=edge matches.
            .args(["--label", "site=edge"])
            .arg("--state-dir")
            .arg(state),
    );
    let v: serde_json::Value = serde_json::from_str(&out).expect("token JSON");
    (
        v["token"].as_str().expect("token").to_string(),
        v["caHash"].as_str().expect("caHash").to_string(),
    )
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[test]
fn an_expired_agent_re_joins_with_its_key_given_a_fresh_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("hub");
    let agent_dir = dir.path().join("agent");
    let hub = format!("127.0.0.1:{}", free_port().expect("a free port"));
    let mut procs = Processes::default();
    let mut serve = Command::new(bin("flower-hub"));
    serve
        .args(["serve", "--standalone", "--listen", &hub])
        .args(["--cert-validity", "6s", "--auto-accept", "site=edge"])
        .arg("--state-dir")
        .arg(&state);
    procs
        .start_command("hub", serve, &dir.path().join("hub.log"))
        .expect("start flower-hub");
    wait_until_blocking("the hub to listen", Duration::from_secs(30), || {
        Ok(std::net::TcpStream::connect(&hub).is_ok())
    })
    .expect("the hub listens");

    // Join (auto-accepted), then stay away longer than the certificate lives.
    let (first, ca_hash) = token(&state, &hub);
    let join_args = |token: &str| -> Vec<String> {
        [
            "--hub",
            &hub,
            "--token",
            token,
            "--ca-hash",
            &ca_hash,
            "--cluster-name",
            "edge-1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    run_ok(
        Command::new(bin("flower-agent"))
            .arg("join")
            .args(join_args(&first))
            .args(["--timeout", "30s", "--state-dir"])
            .arg(&agent_dir),
    );
    let key = cluster(&state, "edge-1")["keyFingerprint"].clone();
    assert!(key.is_string(), "joined cluster has a key fingerprint");
    let first_cert = std::fs::read_to_string(agent_dir.join("client.crt")).unwrap();
    std::thread::sleep(Duration::from_secs(7));

    // Without a way to re-join, the agent keeps retrying and says what to do.
    let log_path = dir.path().join("agent-1.log");
    let mut stuck = Command::new(bin("flower-agent"));
    stuck
        .args(["run", "--runtime", "noop", "--state-dir"])
        .arg(&agent_dir);
    procs
        .start_command("agent-1", stuck, &log_path)
        .expect("start flower-agent");
    wait_until_blocking("the expiry message", Duration::from_secs(30), || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        Ok(log.contains("expired at")
            && log.contains("flower-hub token create --cluster-name edge-1"))
    })
    .expect("the agent says how to re-join");
    assert!(
        procs.get_mut("agent-1").unwrap().exited().is_none(),
        "an edge agent keeps retrying (its SuperNodes keep running) instead of exiting"
    );
    procs.stop("agent-1").unwrap();

    // A fresh token: `run` re-joins with the stored key and connects.
    let (second, _) = token(&state, &hub);
    let restarted = unix_now();
    let mut rejoin = Command::new(bin("flower-agent"));
    rejoin
        .args(["run", "--runtime", "noop", "--status-interval", "1s"])
        .args(join_args(&second))
        .arg("--state-dir")
        .arg(&agent_dir);
    procs
        .start_command("agent-2", rejoin, &dir.path().join("agent-2.log"))
        .expect("start flower-agent");
    wait_until_blocking(
        "a heartbeat from the re-joined agent",
        Duration::from_secs(30),
        || Ok(heartbeat(&state) >= restarted),
    )
    .expect("the re-joined agent heartbeats");
    let after = cluster(&state, "edge-1");
    assert_eq!(
        after["keyFingerprint"], key,
        "the same key: no new cluster identity"
    );
    let new_cert = std::fs::read_to_string(agent_dir.join("client.crt")).unwrap();
    assert_ne!(new_cert, first_cert, "a new certificate was stored");

    // A deleted token is refused: the agent exits naming the cause.
    let id = second.split('.').next().unwrap().to_string();
    run_ok(
        Command::new(bin("flower-hub"))
            .args(["token", "delete", &id, "--state-dir"])
            .arg(&state),
    );
    procs.stop("agent-2").unwrap();
    std::thread::sleep(Duration::from_secs(7));
    let out = Command::new(bin("flower-agent"))
        .args(["run", "--runtime", "noop"])
        .args(join_args(&second))
        .arg("--state-dir")
        .arg(&agent_dir)
        .output()
        .expect("run flower-agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("unknown or was revoked"),
        "a re-join with a deleted token must fail naming it: {stderr}"
    );
}

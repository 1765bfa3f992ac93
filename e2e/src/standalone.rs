//! The standalone hub in tests: the quickstart Federation without placement (its pools run on
//! the hub machine), `flower-hub serve --standalone` and `flower-hub status`.
use std::path::Path;
use std::process::Command;

use anyhow::{Result, ensure};

/// `flower-hub status -o json --state-dir STATE` (null when it prints nothing readable).
pub fn status(hub: &Path, state: &Path) -> serde_json::Value {
    let out = Command::new(hub)
        .args(["status", "-o", "json", "--state-dir"])
        .arg(state)
        .output();
    out.ok()
        .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// examples/quickstart/federation.yaml without placement (one replica per pool, on free ports
/// `[grpc, extra, serverAppIO]`), with pool settings that must reach the SuperNode processes.
pub fn federation_without_placement(ports: &[u16]) -> Result<String> {
    let fed =
        std::fs::read_to_string(crate::repo_root().join("examples/quickstart/federation.yaml"))?;
    let fed = fed
        .replace("  placementRef:\n    name: edge\n", "")
        .replace(
            "        clusterSelector:\n          matchLabels: {site: a}\n",
            "",
        )
        .replace(
            "        clusterSelector:\n          matchLabels: {site: b}\n",
            "",
        )
        .replace("replicas: 2", "replicas: 1")
        // Pool settings reach the SuperNode processes: env (pool over supernodes.env) and a
        // GPU per replica, as a pod would get them.
        .replace(
            "    image: flwr/supernode:1.42.0\n    pools:\n",
            "    image: flwr/supernode:1.42.0\n    env: [{name: FAE2E_MODE, value: base}, {name: FAE2E_KEEP, value: base}]\n    pools:\n",
        )
        .replace(
            "      - name: site-a\n",
            "      - name: site-a\n        env: [{name: FAE2E_MODE, value: site-a}]\n        gpu: {enabled: true, vendor: nvidia}\n",
        )
        .replace("grpc: 19092", &format!("grpc: {}", ports[0]))
        .replace("extra: 19093", &format!("extra: {}", ports[1]))
        .replace("serverAppIO: 19091", &format!("serverAppIO: {}", ports[2]));
    ensure!(!fed.contains("placementRef") && !fed.contains("clusterSelector"));
    Ok(fed)
}

/// `flower-hub serve --standalone` on a free channel port with `state` and `manifests`, Flower
/// from `venv`, and `extra` arguments.
pub fn serve_command(
    hub: &Path,
    state: &Path,
    manifests: &Path,
    venv: &Path,
    extra: &[&str],
) -> Command {
    let mut serve = Command::new(hub);
    serve
        .args([
            "serve",
            "--standalone",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
        ])
        .arg(state)
        .arg("--manifests")
        .arg(manifests)
        .arg("--flower-bin")
        .arg(venv.join("bin"))
        .args(extra)
        .env("FLWR_TELEMETRY_ENABLED", "0");
    serve
}

/// The first port of a standalone hub's own SuperNodes (`--local-port-base`), apart from the
/// other hubs of this test binary: its tests run at once, and two hubs starting SuperNodes at
/// the same moment would both find the same port free.
pub fn local_port_base() -> Result<u16> {
    static GIVEN: std::sync::Mutex<Option<crate::harness::SpacedPorts>> =
        std::sync::Mutex::new(None);
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    given
        .get_or_insert_with(|| crate::harness::SpacedPorts::new(16))
        .take_run(8)
}

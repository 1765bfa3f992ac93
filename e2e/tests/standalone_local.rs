//! A Federation without `placementRef` on the standalone hub runs its pools on the hub machine
//! (the standalone counterpart of flower-operator's "in the hub cluster"), with real Flower
//! 1.42.0, TLS and SuperNode authentication; stopping the hub leaves no Flower process behind.
//!
//! Needs `target/debug/flower-hub` (test.sh builds it first) and `e2e/flower/venv.sh`.
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use e2e::harness::{
    Processes, Wait, binary, flower_venv, free_ports, processes_mentioning, wait_until_blocking,
};

fn status(hub: &Path, state: &Path) -> serde_json::Value {
    let out = Command::new(hub)
        .args(["status", "-o", "json", "--state-dir"])
        .arg(state)
        .output()
        .expect("run flower-hub status");
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// examples/quickstart/federation.yaml without placement (one replica per pool, on free ports
/// `[grpc, extra, serverAppIO]`), with pool settings that must reach the SuperNode processes.
fn federation_without_placement(ports: &[u16]) -> Result<String> {
    let fed =
        std::fs::read_to_string(e2e::repo_root().join("examples/quickstart/federation.yaml"))?;
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

/// The sorted `FAE2E_*` and `CUDA_VISIBLE*` variables of each SuperNode process (by pool) among
/// the processes mentioning `needle`.
fn supernode_envs(needle: &str) -> Vec<(String, Vec<String>)> {
    processes_mentioning(needle)
        .into_iter()
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if !cmdline.contains("flower-supernode") || cmdline.contains("flower-superexec") {
                return None;
            }
            let pool = ["site-a", "site-b"]
                .into_iter()
                .find(|p| cmdline.contains(&format!("/{p}-0")))?;
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let vars = String::from_utf8_lossy(&environ)
                .split('\0')
                .filter(|v| v.starts_with("FAE2E_") || v.starts_with("CUDA_VISIBLE"))
                .map(str::to_owned)
                .collect::<Vec<_>>();
            Some((pool.to_owned(), vars))
        })
        .collect()
}

#[test]
fn federation_without_placement_runs_on_the_standalone_hub() {
    // Invariant: no placementRef → the pools run beside the SuperLink, connect over TLS with
    // registered keys (2/2 ready), and a stopped hub stops them all.
    let hub_bin = binary("flower-hub").expect("flower-hub");
    let venv = flower_venv("1.42.0").expect("the Flower 1.42.0 venv");
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let state = dir.path().join("state");
    let ports = free_ports(3).expect("free ports");
    let fed = federation_without_placement(&ports).expect("the quickstart Federation");
    std::fs::write(manifests.join("federation.yaml"), fed).unwrap();

    let mut procs = Processes::default();
    let mut serve = Command::new(&hub_bin);
    serve
        .args([
            "serve",
            "--standalone",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
        ])
        .arg(&state)
        .arg("--manifests")
        .arg(&manifests)
        .arg("--flower-bin")
        .arg(venv.join("bin"))
        .env("FLWR_TELEMETRY_ENABLED", "0");
    let hub_log = dir.path().join("hub.log");
    procs
        .start_group("hub", serve, &hub_log)
        .expect("start flower-hub");
    let t0 = Instant::now();
    let ready = Wait::new("the Federation ready", Duration::from_secs(180))
        .every(Duration::from_millis(500))
        .detail(|| {
            format!(
                "status: {}\nhub log: {}",
                status(&hub_bin, &state),
                std::fs::read_to_string(&hub_log).unwrap_or_default()
            )
        })
        .for_value_blocking(|| {
            let fed = status(&hub_bin, &state)["federations"][0].clone();
            Ok((fed["ready"] == true).then_some(fed))
        })
        .expect("ready");
    eprintln!("ready in {:.1}s: {ready}", t0.elapsed().as_secs_f64());
    assert_eq!(ready["supernodes"], "2/2");
    // The hub machine is the hub's own cluster, named like every other selection.
    assert_eq!(
        ready["selected"],
        serde_json::json!([flower_addon_hub::core::HUB_CLUSTER])
    );
    let needle = state.display().to_string();
    assert!(
        processes_mentioning(&needle).len() >= 3,
        "SuperLink and two SuperNodes should be running"
    );
    // Each SuperNode process got its pool's environment.
    let envs = supernode_envs(&needle);
    let of = |pool: &str| {
        let mut vars: Vec<String> = envs
            .iter()
            .filter(|(p, _)| p == pool)
            .flat_map(|(_, v)| v.clone())
            .collect();
        vars.sort();
        vars
    };
    assert_eq!(
        of("site-a"),
        [
            "CUDA_VISIBLE_DEVICES=0",
            "FAE2E_KEEP=base",
            "FAE2E_MODE=site-a"
        ],
        "SuperNode environments: {envs:?}"
    );
    assert_eq!(
        of("site-b"),
        ["FAE2E_KEEP=base", "FAE2E_MODE=base"],
        "SuperNode environments: {envs:?}"
    );
    // Where flwr reaches this SuperLink, as Kubernetes mode puts it in status.endpoints: its
    // Control port on loopback (the Fleet port serves SuperNodes only, #13).
    assert_eq!(
        ready["control"],
        format!("127.0.0.1:{}", ports[1]),
        "{ready}"
    );

    // A graceful stop of the hub (SIGTERM to it alone) stops the SuperLink and the hub's own
    // SuperNodes.
    let hub = procs.get("hub").expect("the hub process");
    hub.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    let t1 = Instant::now();
    wait_until_blocking(
        "every Flower process gone after the hub was stopped",
        Duration::from_secs(30),
        || {
            let left = processes_mentioning(&needle);
            ensure!(left.is_empty(), "still running: {left:?}");
            Ok(true)
        },
    )
    .expect("nothing left 30 s after the hub was stopped");
    eprintln!(
        "everything stopped {:.1}s after SIGTERM",
        t1.elapsed().as_secs_f64()
    );
}

//! A Federation without `placementRef` on the standalone hub runs its pools on the hub machine
//! (the standalone counterpart of flower-operator's "in the hub cluster"), with real Flower
//! 1.42.0, TLS and SuperNode authentication; stopping the hub leaves no Flower process behind.
//!
//! Needs `target/debug/flower-hub` (test.sh builds it first) and `e2e/flower/venv.sh`.
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Hub(Child);

impl Drop for Hub {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn status(hub: &Path, state: &Path) -> serde_json::Value {
    let out = Command::new(hub)
        .args(["status", "-o", "json", "--state-dir"])
        .arg(state)
        .output()
        .expect("run flower-hub status");
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// Pids of processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn federation_without_placement_runs_on_the_standalone_hub() {
    // Invariant: no placementRef → the pools run beside the SuperLink, connect over TLS with
    // registered keys (2/2 ready), and a stopped hub stops them all.
    let root = e2e::repo_root();
    let hub_bin = root.join("target/debug/flower-hub");
    assert!(
        hub_bin.exists(),
        "{} is missing: run `cargo build --bins` first (test.sh does)",
        hub_bin.display()
    );
    let venv = Command::new(root.join("e2e/flower/venv.sh"))
        .arg("1.42.0")
        .stderr(Stdio::inherit())
        .output()
        .expect("run e2e/flower/venv.sh");
    assert!(venv.status.success(), "e2e/flower/venv.sh 1.42.0 failed");
    let venv = PathBuf::from(
        String::from_utf8_lossy(&venv.stdout)
            .lines()
            .last()
            .expect("venv path")
            .trim(),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let state = dir.path().join("state");
    let (grpc, extra, sapp) = (free_port(), free_port(), free_port());
    let fed = std::fs::read_to_string(root.join("examples/quickstart/federation.yaml")).unwrap();
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
        .replace("grpc: 19092", &format!("grpc: {grpc}"))
        .replace("extra: 19093", &format!("extra: {extra}"))
        .replace("serverAppIO: 19091", &format!("serverAppIO: {sapp}"));
    assert!(!fed.contains("placementRef") && !fed.contains("clusterSelector"));
    std::fs::write(manifests.join("federation.yaml"), fed).unwrap();

    let log = std::fs::File::create(dir.path().join("hub.log")).unwrap();
    let hub = Hub(Command::new(&hub_bin)
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
        .env("FLWR_TELEMETRY_ENABLED", "0")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("start flower-hub"));
    let t0 = Instant::now();
    let ready = loop {
        let s = status(&hub_bin, &state);
        let fed = &s["federations"][0];
        if fed["ready"] == true {
            break fed.clone();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "not ready after 180 s: {s}\nhub log: {}",
            std::fs::read_to_string(dir.path().join("hub.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!("ready in {:.1}s: {ready}", t0.elapsed().as_secs_f64());
    assert_eq!(ready["supernodes"], "2/2");
    assert_eq!(ready["selected"], serde_json::json!(["(hub)"]));
    let needle = state.display().to_string();
    assert!(
        processes_mentioning(&needle).len() >= 3,
        "SuperLink and two SuperNodes should be running"
    );
    // Each SuperNode process got its pool's environment.
    let envs: Vec<(String, Vec<String>)> = processes_mentioning(&needle)
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
        .collect();
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
    // Where flwr reaches this SuperLink, as Kubernetes mode puts it in status.endpoints.
    assert_eq!(ready["control"], format!("127.0.0.1:{grpc}"), "{ready}");

    // A graceful stop of the hub stops the SuperLink and the hub's own SuperNodes.
    let pid = nix::unistd::Pid::from_raw(hub.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let t1 = Instant::now();
    loop {
        let left = processes_mentioning(&needle);
        if left.is_empty() {
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(30),
            "still running 30 s after the hub was stopped: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "everything stopped {:.1}s after SIGTERM",
        t1.elapsed().as_secs_f64()
    );
}

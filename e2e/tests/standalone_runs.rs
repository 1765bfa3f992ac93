//! `FlowerRun`s on the standalone hub with real Flower 1.42.0: a run submitted from manifests
//! (the FAB in a ConfigMap, built by the hub's own FAB builder) goes Submitted → Running →
//! Complete with its log tail and round progress; an unknown run-config key fails before any
//! Flower call; `suspend: true` mid-run ends `Stopped`; `activeDeadlineSeconds` ends
//! `DeadlineExceeded`; and a hub that died between sending a submission and recording its answer
//! adopts the run it finds instead of starting a second one.
//!
//! Needs `target/debug/flower-hub` (test.sh builds it first) and `e2e/flower/venv.sh 1.42.0`.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use base64::Engine;
use e2e::harness::{Processes, Wait, binary, flower_venv, free_ports};
use e2e::standalone::{federation_without_placement, serve_command, status};
use flower_addon_hub::flower::control::{ControlClient, ControlEndpoint};
use serde_json::Value;

struct Hub {
    bin: PathBuf,
    local_port_base: u16,
    venv: PathBuf,
    state: PathBuf,
    manifests: PathBuf,
    log: PathBuf,
    procs: Processes,
    control: Option<ControlClient>,
    /// [`flower_addon_hub::runs::SUBMISSION_PAUSE_ENV`] of the hub process, when set.
    submission_pause_ms: Option<u64>,
}

impl Hub {
    fn start(&mut self) -> Result<()> {
        let base = self.local_port_base.to_string();
        let mut serve = serve_command(
            &self.bin,
            &self.state,
            &self.manifests,
            &self.venv,
            // The FAB server of a_fab_from_a_url_runs_and_a_wrong_hash_fails listens on
            // 127.0.0.1, which the hub refuses by default.
            &["--local-port-base", &base, "--fab-url-allow", "127.0.0.1"],
        );
        if let Some(ms) = self.submission_pause_ms {
            serve.env(flower_addon_hub::runs::SUBMISSION_PAUSE_ENV, ms.to_string());
        }
        self.procs.start_group("hub", serve, &self.log)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of each of the hub's own SuperNodes' logs (for a run that failed
    /// in a round: which SuperNode did not answer, and what it was doing).
    fn supernode_logs(&self, lines: usize) -> String {
        let dir = self.state.join("local-pools/logs/default");
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        logs.sort();
        logs.iter()
            .filter(|p| p.to_string_lossy().ends_with(".supernode.log"))
            .map(|p| {
                let text = std::fs::read_to_string(p).unwrap_or_default();
                format!("--- {}:\n{}", p.display(), tail(&text, lines))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn status(&self) -> Value {
        status(&self.bin, &self.state)
    }

    /// The status of FlowerRun `name` (namespace default) in `status.json`.
    fn run(&self, name: &str) -> Option<Value> {
        self.status()["runs"]
            .as_array()?
            .iter()
            .find(|r| r["name"] == name)
            .map(|r| r["status"].clone())
    }

    /// Waits until FlowerRun `name` satisfies `done`, at most `limit`.
    fn wait_run(
        &self,
        name: &str,
        what: &str,
        limit: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        Wait::new(format!("FlowerRun {name}: {what}"), limit)
            .every(Duration::from_millis(500))
            .detail(|| {
                format!(
                    "run: {:?}\nhub log (tail):\n{}",
                    self.run(name),
                    tail(&self.log(), 40)
                )
            })
            .for_value_blocking(|| Ok(self.run(name).filter(|s| done(s))))
    }

    /// Waits until FlowerRun `name` is Complete or Failed, at most `limit`.
    fn wait_ended(&self, name: &str, limit: Duration) -> Result<Value> {
        self.wait_run(name, "Complete or Failed", limit, |s| {
            condition(s, "Complete").is_some_and(|c| c.0 == "True")
                || condition(s, "Failed").is_some_and(|c| c.0 == "True")
        })
    }

    /// Every Flower run the SuperLink lists, by id. A SuperLink that does not answer is asked
    /// again for up to 60 s (the run lists are what the callers check, not that the SuperLink
    /// answers at one instant); each retry is declared (`retried`, kind `list-runs`: counted in
    /// test.sh's summary), and after 60 s the hub log is attached to the error.
    async fn flower_runs(&self) -> Result<BTreeMap<u64, String>> {
        let control = self.control.as_ref().context("no Control client")?;
        let t = Instant::now();
        loop {
            match control.list_runs().await {
                Ok(runs) => return Ok(runs.into_iter().map(|r| (r.run_id, r.status)).collect()),
                Err(error) if t.elapsed() < Duration::from_secs(60) => {
                    e2e::harness::retried(
                        "list-runs",
                        format!(
                            "standalone_runs: ListRuns failed {:.1}s after the first try, asking again: {error}",
                            t.elapsed().as_secs_f64()
                        ),
                    );
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(error) => {
                    return Err(anyhow::Error::new(error).context(format!(
                        "ListRuns failed for 60 s; hub log:\n{}",
                        tail(&self.log(), 60)
                    )));
                }
            }
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn condition(status: &Value, type_: &str) -> Option<(String, String, String)> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
                c["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

fn is(status: &Value, type_: &str, reason: &str) -> bool {
    condition(status, type_).is_some_and(|(s, r, _)| s == "True" && r == reason)
}

/// A FlowerRun manifest of examples/fedavg (ConfigMap `fedavg-fab`) with `extra` spec lines.
fn flower_run(name: &str, config: &str, extra: &str) -> String {
    format!(
        "apiVersion: flower-addon.io/v1alpha1\nkind: FlowerRun\nmetadata:\n  name: {name}\nspec:\n  federationRef:\n    name: quickstart\n  app:\n    fab:\n      configMapRef: {{name: fedavg-fab, key: app.fab}}\n  runConfig: {config}\n{extra}"
    )
}

/// Writes ConfigMap `name` holding the FAB of the app in `app_dir` (of the repository) into the
/// hub's manifests as `file`: built by the hub's own builder (byte for byte `flwr build`), as
/// `kubectl create configmap --from-file` writes it. Returns the FAB's hash.
fn fab_config_map(hub: &Hub, name: &str, app_dir: &str, file: &str) -> Result<String> {
    let fab = flower_addon_hub::flower::fab::build_from_dir(&e2e::repo_root().join(app_dir))?;
    std::fs::write(
        hub.manifests.join(file),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\nbinaryData:\n  app.fab: {}\n",
            base64::engine::general_purpose::STANDARD.encode(&fab.bytes)
        ),
    )?;
    Ok(fab.hash)
}

/// A standalone hub running the quickstart Federation (no placement) on Flower `version`, with
/// the FAB of examples/fedavg in ConfigMap `fedavg-fab`; returns it once the Federation is
/// Ready, with a Control client, and the FAB's hash.
async fn ready_hub(dir: &std::path::Path, version: &str) -> Result<(Hub, String)> {
    ready_hub_with(dir, version, |_| Ok(())).await
}

/// [`ready_hub`], with `prepare` called on the state directory before the hub starts.
async fn ready_hub_with(
    dir: &std::path::Path,
    version: &str,
    prepare: impl FnOnce(&std::path::Path) -> Result<()>,
) -> Result<(Hub, String)> {
    ready_hub_set(dir, version, prepare, |_| {}).await
}

/// [`ready_hub_with`], with `set_up` called on the hub before it starts.
async fn ready_hub_set(
    dir: &std::path::Path,
    version: &str,
    prepare: impl FnOnce(&std::path::Path) -> Result<()>,
    set_up: impl FnOnce(&mut Hub),
) -> Result<(Hub, String)> {
    let mut hub = Hub {
        bin: binary("flower-hub")?,
        local_port_base: e2e::standalone::local_port_base()?,
        venv: flower_venv(version)?,
        state: dir.join("state"),
        manifests: dir.join("manifests"),
        log: dir.join("hub.log"),
        procs: Processes::default(),
        control: None,
        submission_pause_ms: None,
    };
    set_up(&mut hub);
    std::fs::create_dir_all(&hub.manifests)?;
    let ports = free_ports(3)?;
    std::fs::write(
        hub.manifests.join("federation.yaml"),
        federation_without_placement(&ports)?
            .replace(":1.42.0", &format!(":{version}"))
            .replace("\"1.42.0\"", &format!("\"{version}\""))
            // Runs keep their files under the state dir; the app gets `output-dir`.
            .replacen("spec:\n  mode:", "spec:\n  outputs: {}\n  mode:", 1),
    )?;
    let fab_hash = fab_config_map(&hub, "fedavg-fab", "examples/fedavg", "fab.yaml")?;
    prepare(&hub.state)?;
    hub.start()?;
    let t0 = Instant::now();
    Wait::new("the Federation ready", Duration::from_secs(180))
        .every(Duration::from_millis(500))
        .detail(|| {
            format!(
                "status: {}\nhub log: {}",
                hub.status(),
                tail(&hub.log(), 40)
            )
        })
        .for_value_blocking(|| {
            Ok((hub.status()["federations"][0]["ready"] == true).then_some(()))
        })?;
    eprintln!(
        "standalone_runs {version}: Federation ready in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    let version_of =
        flower_addon_crds::render::FlowerVersion::parse(version).context("a Flower version")?;
    let ca = std::fs::read_to_string(hub.state.join("federations/default/quickstart/tls/ca.crt"))?;
    hub.control = Some(ControlClient::new(ControlEndpoint {
        dialect: flower_addon_crds::render::FlowerDialect::of(version_of),
        address: format!("127.0.0.1:{}", ports[1]),
        server_name: "127.0.0.1".into(),
        ca_pem: Some(ca),
        tunnel: None,
    })?);
    Ok((hub, fab_hash))
}

// The life cycle on the current Flower (unified dialect: Control over HTTPS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flower_runs_on_the_standalone_hub() -> Result<()> {
    e2e::install_crypto();
    let dir = tempfile::tempdir()?;
    let t0 = Instant::now();
    let (mut hub, fab_hash) = ready_hub(dir.path(), "1.42.0").await?;
    let fab = Fab { hash: fab_hash };
    a_run_completes_with_its_log_and_progress(&hub, &fab.hash).await?;
    an_unknown_key_fails_before_any_flower_call(&hub).await?;
    the_run_command_submits_follows_and_deletes(&hub).await?;
    a_fab_from_a_url_runs_and_a_wrong_hash_fails(&mut hub).await?;
    hostile_apps_leave_the_hub_answering(&hub).await?;
    // A run stopped mid-round can leave a Flower 1.42 SuperNode waiting forever for the reply
    // to a message it pulled just before the stop (docs/operations.md, "A run is stopped
    // mid-round"): the hub restarts the SuperNodes itself, and a run needing every one of them
    // completes next, with no manual step.
    suspend_and_deadline_stop_running_runs(&hub).await?;
    after_the_stops_a_run_needing_every_supernode_completes(&hub).await?;
    a_lost_answer_is_adopted_not_resubmitted(&mut hub).await?;
    eprintln!("standalone_runs: total {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}

struct Fab {
    hash: String,
}

// The SuperLink's database volume full (a tmpfs under the Federation's state directory): the
// SuperLink stays up but fails every write with "Internal server error"; the hub reads why from
// its log and says so in `superlinkHealthy` (condition SuperLinkHealthy in Kubernetes mode),
// restarts and tears down nothing, and once the volume has room the new SuperNode registers, the
// condition clears and a run completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_database_volume_is_named_and_nothing_is_torn_down() -> Result<()> {
    e2e::install_crypto();
    let dir = tempfile::tempdir()?;
    let t0 = Instant::now();
    let fed_dir = dir.path().join("state/federations/default/quickstart");
    // Declared before the hub: dropped (unmounted) after the hub's processes are stopped.
    let volume = e2e::harness::Tmpfs::mount(&fed_dir, "24m")?;
    let (hub, fab_hash) = ready_hub_with(dir.path(), "1.42.0", |_| Ok(())).await?;
    let database = fed_dir.join("superlink.db");
    let superlink =
        || e2e::harness::processes_mentioning(&format!("--database={}", database.display()));
    let superlink_before = superlink();
    // The SuperLink process (and whatever wraps it: the sandbox) on this database.
    ensure!(
        !superlink_before.is_empty(),
        "no SuperLink process on {}",
        database.display()
    );
    let fed = |status: &Value| status["federations"][0].clone();
    let healthy = fed(&hub.status())["superlinkHealthy"].clone();
    ensure!(
        healthy["status"] == "True" && healthy["reason"] == "NoFailuresLogged",
        "a working SuperLink is healthy: {healthy:#}"
    );
    let filled = volume.fill()?;
    // A third SuperNode (pool site-b 1 → 2): its key must be registered, a database write.
    let manifest = hub.manifests.join("federation.yaml");
    let text = std::fs::read_to_string(&manifest)?;
    let at = text.rfind("replicas: 1").context("site-b's replicas")?;
    std::fs::write(
        &manifest,
        format!(
            "{}replicas: 2{}",
            &text[..at],
            &text[at + "replicas: 1".len()..]
        ),
    )?;
    let detail = || {
        format!(
            "status: {:#}\nhub log:\n{}",
            fed(&hub.status()),
            tail(&hub.log(), 30)
        )
    };
    let t_full = Instant::now();
    let seen = Wait::new(
        "superlinkHealthy False/DatabaseStorageFull",
        Duration::from_secs(90),
    )
    .every(Duration::from_millis(500))
    .detail(detail)
    .for_value_blocking(|| {
        let h = fed(&hub.status())["superlinkHealthy"].clone();
        Ok((h["status"] == "False" && h["reason"] == "DatabaseStorageFull").then_some(h))
    })?;
    let named_in = t_full.elapsed();
    let message = seen["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains("database or disk is full")
            && message.contains(&database.display().to_string())
            && message.contains("free space"),
        "the message quotes the SuperLink and names the database and the fix: {message}"
    );
    ensure!(
        hub.log().contains("the SuperLink fails"),
        "the hub logs it: {}",
        tail(&hub.log(), 30)
    );
    let during = fed(&hub.status());
    ensure!(
        superlink() == superlink_before,
        "the SuperLink was not restarted: {:?} → {:?}",
        superlink_before,
        superlink()
    );
    // Room again: the SuperLink recovers by itself; the hub registers the key and says so.
    volume.empty()?;
    let t_room = Instant::now();
    Wait::new("healthy again, 3/3 SuperNodes", Duration::from_secs(120))
        .every(Duration::from_millis(500))
        .detail(detail)
        .until_blocking(|| {
            let f = fed(&hub.status());
            Ok(f["superlinkHealthy"]["status"] == "True"
                && f["supernodes"] == "3/3"
                && f["ready"] == true)
        })?;
    let recovered_in = t_room.elapsed();
    ensure!(
        superlink() == superlink_before,
        "the SuperLink was not restarted after recovering"
    );
    // And it trains: a run completes on the three SuperNodes.
    std::fs::write(
        hub.manifests.join("run-after-full.yaml"),
        flower_run("after-full", "{num-server-rounds: 1, min-nodes: 3}", ""),
    )?;
    let done = hub.wait_ended("after-full", Duration::from_secs(240))?;
    ensure!(
        is(&done, "Complete", "Completed"),
        "the run after recovery: {done:#}"
    );
    ensure!(done["fabHash"] == fab_hash.as_str(), "{done:#}");
    eprintln!(
        "standalone_runs: database volume full ({filled} bytes of filler): SuperLinkHealthy False/DatabaseStorageFull {:.1}s after the scale-up (SuperNodes {} meanwhile); healthy and 3/3 {:.1}s after the filler went; a run completed; SuperLink pid unchanged; total {:.1}s",
        named_in.as_secs_f64(),
        during["supernodes"],
        recovered_in.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    drop(hub);
    Ok(())
}

// The classic dialect (Flower 1.25: gRPC Control, its `default` federation, gRPC log stream):
// a run completes with its log and progress, an unknown key is refused, and after runs stopped
// mid-round the hub restarts the SuperNodes and a run needing every one completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flower_runs_on_flower_1_25() -> Result<()> {
    e2e::install_crypto();
    let dir = tempfile::tempdir()?;
    let t0 = Instant::now();
    let (hub, fab_hash) = ready_hub(dir.path(), "1.25.0").await?;
    a_run_completes_with_its_log_and_progress(&hub, &fab_hash).await?;
    an_unknown_key_fails_before_any_flower_call(&hub).await?;
    suspend_and_deadline_stop_running_runs(&hub).await?;
    after_the_stops_a_run_needing_every_supernode_completes(&hub).await?;
    eprintln!(
        "standalone_runs 1.25.0: total {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn a_run_completes_with_its_log_and_progress(hub: &Hub, fab_hash: &str) -> Result<()> {
    let t = Instant::now();
    std::fs::write(
        hub.manifests.join("run-fedavg.yaml"),
        flower_run("fedavg", "{num-server-rounds: 2, min-nodes: 2}", ""),
    )?;
    let submitted = hub.wait_run("fedavg", "Submitted", Duration::from_secs(60), |s| {
        is(s, "Submitted", "Submitted")
    })?;
    let submitted_in = t.elapsed();
    let done = hub.wait_ended("fedavg", Duration::from_secs(300))?;
    ensure!(
        is(&done, "Complete", "Completed"),
        "the run did not complete: {done:#}"
    );
    ensure!(done["flowerStatus"] == "finished:completed", "{done:#}");
    ensure!(done["attempts"] == 1, "{done:#}");
    ensure!(
        done["fabHash"] == fab_hash,
        "the FAB hash Flower holds: {done:#}"
    );
    ensure!(done["runId"] == submitted["runId"], "{done:#}");
    ensure!(done["progress"]["text"] == "2/2", "progress: {done:#}");
    let tail: Vec<&str> = done["logTail"]
        .as_array()
        .context("logTail")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    ensure!(
        tail.iter().any(|l| l.contains("round 2/2"))
            && tail.iter().any(|l| l.contains("final: rounds=2")),
        "the log tail lacks the ServerApp's rounds: {tail:#?}"
    );
    let runs = hub.flower_runs().await?;
    ensure!(runs.len() == 1, "exactly one Flower run: {runs:?}");
    the_model_is_listed_and_fetched(hub, &done)?;
    eprintln!(
        "standalone_runs: fedavg submitted in {:.1}s, Complete in {:.1}s (run {}, progress {}, {} log lines)",
        submitted_in.as_secs_f64(),
        t.elapsed().as_secs_f64(),
        done["runId"],
        done["progress"]["text"],
        tail.len()
    );
    Ok(())
}

/// The ServerApp saved `model.npz` and `metrics.json` in the run's output directory: the hub
/// listed them (size, sha256) and `flower-hub run fetch` copies them out, checked; numpy reads
/// the model back.
fn the_model_is_listed_and_fetched(hub: &Hub, done: &Value) -> Result<()> {
    use sha2::Digest;
    let listed: BTreeMap<String, (u64, String)> = done["outputs"]
        .as_array()
        .with_context(|| format!("status.outputs: {done:#}"))?
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap_or_default().to_owned(),
                (
                    f["size"].as_u64().unwrap_or_default(),
                    f["sha256"].as_str().unwrap_or_default().to_owned(),
                ),
            )
        })
        .collect();
    ensure!(
        listed.keys().map(String::as_str).collect::<Vec<_>>() == ["metrics.json", "model.npz"],
        "status.outputs: {done:#}"
    );
    ensure!(done["outputsListedAt"].is_string(), "{done:#}");
    let dest = hub.state.parent().context("a parent")?.join("fetched");
    let out = std::process::Command::new(&hub.bin)
        .args(["run", "fetch", "fedavg", "--state-dir"])
        .arg(&hub.state)
        .arg("-o")
        .arg(&dest)
        .output()?;
    ensure!(
        out.status.success(),
        "run fetch: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for (path, (size, sha256)) in &listed {
        let bytes = std::fs::read(dest.join(path)).with_context(|| format!("fetched {path}"))?;
        ensure!(bytes.len() as u64 == *size, "{path}: size");
        ensure!(
            hex::encode(sha2::Sha256::digest(&bytes)) == *sha256,
            "{path}: sha256 differs from status.outputs"
        );
    }
    let check = std::process::Command::new(hub.venv.join("bin/python"))
        .args([
            "-c",
            "import sys, numpy as np; m = np.load(sys.argv[1]); print(m['weights'].shape, m['bias'].shape)",
        ])
        .arg(dest.join("model.npz"))
        .output()?;
    ensure!(
        check.status.success(),
        "numpy cannot read the fetched model: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    eprintln!(
        "standalone_runs: outputs listed and fetched, sha256 checked: {listed:?}; model {}",
        String::from_utf8_lossy(&check.stdout).trim()
    );
    Ok(())
}

async fn an_unknown_key_fails_before_any_flower_call(hub: &Hub) -> Result<()> {
    let before = hub.flower_runs().await?;
    std::fs::write(
        hub.manifests.join("run-typo.yaml"),
        flower_run("typo", "{num-roundz: 1}", ""),
    )?;
    let failed = hub.wait_run("typo", "Failed", Duration::from_secs(30), |s| {
        condition(s, "Failed").is_some_and(|c| c.0 == "True")
    })?;
    let (_, reason, message) = condition(&failed, "Failed").unwrap_or_default();
    ensure!(reason == "InvalidRunConfig", "{failed:#}");
    ensure!(
        message.contains("num-roundz") && message.contains("num-server-rounds"),
        "the message names the key and the app's keys: {message}"
    );
    ensure!(failed.get("runId").is_none_or(Value::is_null), "{failed:#}");
    std::fs::write(
        hub.manifests.join("run-ownsdir.yaml"),
        flower_run("ownsdir", "{output-dir: /tmp/mine}", ""),
    )?;
    let owns = hub.wait_run("ownsdir", "Failed", Duration::from_secs(30), |s| {
        condition(s, "Failed").is_some_and(|c| c.0 == "True")
    })?;
    let (_, owns_reason, owns_message) = condition(&owns, "Failed").unwrap_or_default();
    ensure!(
        owns_reason == "InvalidRunConfig"
            && owns_message.contains("spec.runConfig.output-dir")
            && owns_message.contains("spec.outputs"),
        "a runConfig setting the hub's output key: {owns:#}"
    );
    ensure!(
        hub.flower_runs().await? == before,
        "no Flower run was started"
    );
    eprintln!("standalone_runs: unknown key refused before any Flower call: {message}");
    Ok(())
}

/// A ServerApp is tenant code, and what it leaves behind is read by the hub: one that fails with
/// a 3 MB message full of terminal escapes, and one that leaves an 8 TiB sparse file in its output
/// directory, leave the hub answering — the first with a bounded status free of control
/// characters, the second over the outputs quota (`OutputsListed=False`, `OutputsOverQuota`,
/// nothing listed or hashed) — and a fedavg run submitted right after completes as usual.
async fn hostile_apps_leave_the_hub_answering(hub: &Hub) -> Result<()> {
    fab_config_map(hub, "probe-fab", "e2e/flower/probe", "probe-fab.yaml")?;
    let probe_run = |name: &str, config: &str| {
        flower_run(name, config, "").replace(
            "configMapRef: {name: fedavg-fab, key: app.fab}",
            "configMapRef: {name: probe-fab, key: app.fab}",
        )
    };
    let t = Instant::now();
    std::fs::write(
        hub.manifests.join("run-loud.yaml"),
        probe_run("loud", "{probe-raise-bytes: 3000000}"),
    )?;
    std::fs::write(
        hub.manifests.join("run-sparse.yaml"),
        probe_run("sparse", "{probe-sparse-bytes: 8796093022208}"),
    )?;
    let loud = hub.wait_ended("loud", Duration::from_secs(300))?;
    let (_, reason, message) = condition(&loud, "Failed").unwrap_or_default();
    ensure!(reason == "FlowerFailed", "the loud run: {loud:#}");
    let text = loud.to_string();
    ensure!(
        text.len() < 64 * 1024,
        "the loud run's status is {} bytes (bounded: < 64 KiB)",
        text.len()
    );
    let written = serde_json::to_string(&loud)?;
    ensure!(
        !written.contains("\\u001b") && !written.contains("\\u0007"),
        "terminal escapes or bells in the status: {}",
        &written[..written.len().min(2000)]
    );
    ensure!(
        message.len() <= 8 * 1024
            && loud["details"]
                .as_str()
                .is_some_and(|d| d.len() <= 8 * 1024),
        "details or message unbounded: {} / {} bytes",
        message.len(),
        loud["details"].as_str().map_or(0, str::len)
    );
    let sparse = hub.wait_run(
        "sparse",
        "OutputsListed=False (OutputsOverQuota)",
        Duration::from_secs(300),
        |s| {
            condition(s, "OutputsListed")
                .is_some_and(|c| c.0 == "False" && c.1 == "OutputsOverQuota")
        },
    )?;
    ensure!(
        is(&sparse, "Complete", "Completed"),
        "the sparse run: {sparse:#}"
    );
    ensure!(
        sparse["outputs"].as_array().is_none_or(Vec::is_empty),
        "outputs listed over the quota: {sparse:#}"
    );
    let hostile_in = t.elapsed();
    // The hub still reconciles as usual: a run after them completes.
    let t = Instant::now();
    std::fs::write(
        hub.manifests.join("run-after-hostile.yaml"),
        flower_run("after-hostile", "{num-server-rounds: 1, min-nodes: 2}", ""),
    )?;
    let after = hub.wait_ended("after-hostile", Duration::from_secs(300))?;
    ensure!(
        is(&after, "Complete", "Completed"),
        "a run after the hostile ones: {after:#}"
    );
    for name in ["loud", "sparse", "after-hostile"] {
        std::fs::remove_file(hub.manifests.join(format!("run-{name}.yaml")))?;
    }
    eprintln!(
        "standalone_runs: a 3 MB failure ({} bytes of status, details {} bytes) and an 8 TiB sparse output ({}) handled in {:.1}s; a fedavg run after them Complete in {:.1}s",
        text.len(),
        loud["details"].as_str().map_or(0, str::len),
        condition(&sparse, "OutputsListed")
            .map(|c| c.2)
            .unwrap_or_default(),
        hostile_in.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `spec.app.fab.url`: the hub downloads the FAB (from a plain HTTP server on loopback), checks
/// its SHA-256 and runs it; a wrong `sha256` fails the run (`InvalidApp`) naming both hashes,
/// and a URL nobody answers keeps the run waiting with a message naming the URL.
async fn a_fab_from_a_url_runs_and_a_wrong_hash_fails(hub: &mut Hub) -> Result<()> {
    let t = Instant::now();
    let served = hub.state.parent().context("a parent")?.join("served");
    std::fs::create_dir_all(&served)?;
    let fab =
        flower_addon_hub::flower::fab::build_from_dir(&e2e::repo_root().join("examples/fedavg"))?;
    std::fs::write(served.join("fedavg.fab"), &fab.bytes)?;
    let ports = free_ports(2)?;
    let mut server = std::process::Command::new(hub.venv.join("bin/python"));
    server
        .args(["-m", "http.server", "--bind", "127.0.0.1", "--directory"])
        .arg(&served)
        .arg(ports[0].to_string());
    let log = served.with_extension("log");
    hub.procs.start_group("fab-server", server, &log)?;
    let url = format!("http://127.0.0.1:{}/fedavg.fab", ports[0]);
    let from_url = |name: &str, url: &str, sha256: &str| {
        format!(
            "apiVersion: flower-addon.io/v1alpha1\nkind: FlowerRun\nmetadata:\n  name: {name}\nspec:\n  federationRef:\n    name: quickstart\n  app:\n    fab:\n      url: {url}\n      sha256: {sha256}\n  runConfig: {{num-server-rounds: 1, min-nodes: 2}}\n"
        )
    };
    let wrong = "0".repeat(64);
    std::fs::write(
        hub.manifests.join("run-url.yaml"),
        from_url("fromurl", &url, &fab.hash),
    )?;
    std::fs::write(
        hub.manifests.join("run-badhash.yaml"),
        from_url("badhash", &url, &wrong),
    )?;
    let silent = format!("http://127.0.0.1:{}/fedavg.fab", ports[1]);
    std::fs::write(
        hub.manifests.join("run-nobody.yaml"),
        from_url("nobody", &silent, &fab.hash),
    )?;
    // Where the admin did not allow: loopback beyond 127.0.0.1 (the same server, through
    // 127.0.0.2), the cloud metadata address, and a redirect to it are refused naming the rule.
    let refused = [
        (
            "loopback",
            format!("http://127.0.0.2:{}/fedavg.fab", ports[0]),
            "refused: loopback addresses",
        ),
        (
            "metadata",
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            "refused: link-local addresses (cloud metadata services)",
        ),
    ];
    for (name, target, _) in &refused {
        std::fs::write(
            hub.manifests.join(format!("run-{name}.yaml")),
            from_url(name, target, &fab.hash),
        )?;
    }
    for (name, _, rule) in &refused {
        let failed = hub.wait_run(name, "Failed", Duration::from_secs(60), |s| {
            condition(s, "Failed").is_some_and(|c| c.0 == "True")
        })?;
        let (_, reason, message) = condition(&failed, "Failed").unwrap_or_default();
        ensure!(
            reason == "InvalidApp" && message.contains(rule) && message.contains("--fab-url-allow"),
            "{name}: {failed:#}"
        );
        std::fs::remove_file(hub.manifests.join(format!("run-{name}.yaml")))?;
    }
    let bad = hub.wait_run("badhash", "Failed", Duration::from_secs(60), |s| {
        condition(s, "Failed").is_some_and(|c| c.0 == "True")
    })?;
    let (_, reason, message) = condition(&bad, "Failed").unwrap_or_default();
    ensure!(
        reason == "InvalidApp" && message.contains(&wrong) && message.contains(&fab.hash),
        "a wrong sha256: {bad:#}"
    );
    let waiting = hub.wait_run(
        "nobody",
        "waiting on its URL",
        Duration::from_secs(60),
        |s| condition(s, "Submitted").is_some_and(|c| c.0 == "False" && c.2.contains(&silent)),
    )?;
    let done = hub.wait_ended("fromurl", Duration::from_secs(240))?;
    ensure!(is(&done, "Complete", "Completed"), "{done:#}");
    ensure!(done["fabHash"] == fab.hash.as_str(), "{done:#}");
    for file in ["run-url.yaml", "run-badhash.yaml", "run-nobody.yaml"] {
        std::fs::remove_file(hub.manifests.join(file))?;
    }
    eprintln!(
        "standalone_runs: FAB from {url}: Complete in {:.1}s; wrong sha256 refused: {message}; no answer: {}",
        t.elapsed().as_secs_f64(),
        condition(&waiting, "Submitted").unwrap_or_default().2
    );
    Ok(())
}

async fn suspend_and_deadline_stop_running_runs(hub: &Hub) -> Result<()> {
    let long = "{num-server-rounds: 100000, min-nodes: 2}";
    std::fs::write(
        hub.manifests.join("run-stopme.yaml"),
        flower_run("stopme", long, ""),
    )?;
    std::fs::write(
        hub.manifests.join("run-deadline.yaml"),
        flower_run("deadline", long, "  activeDeadlineSeconds: 20\n"),
    )?;
    let t = Instant::now();
    hub.wait_run("stopme", "a round done", Duration::from_secs(180), |s| {
        s["progress"]["current"].as_i64().is_some_and(|c| c >= 1)
    })?;
    std::fs::write(
        hub.manifests.join("run-stopme.yaml"),
        flower_run("stopme", long, "  suspend: true\n"),
    )?;
    let t_stop = Instant::now();
    let stopped = hub.wait_run("stopme", "Failed", Duration::from_secs(90), |s| {
        condition(s, "Failed").is_some_and(|c| c.0 == "True")
    })?;
    ensure!(is(&stopped, "Failed", "Stopped"), "{stopped:#}");
    ensure!(stopped["flowerStatus"] == "finished:stopped", "{stopped:#}");
    eprintln!(
        "standalone_runs: suspend: true mid-run (round {}) -> finished:stopped, Failed/Stopped in {:.1}s",
        stopped["progress"]["current"],
        t_stop.elapsed().as_secs_f64()
    );
    let deadline = hub.wait_run("deadline", "Failed", Duration::from_secs(240), |s| {
        condition(s, "Failed").is_some_and(|c| c.0 == "True")
    })?;
    ensure!(is(&deadline, "Failed", "DeadlineExceeded"), "{deadline:#}");
    ensure!(
        deadline["flowerStatus"] == "finished:stopped",
        "{deadline:#}"
    );
    eprintln!(
        "standalone_runs: activeDeadlineSeconds 20 -> DeadlineExceeded {:.1}s after the manifest was written",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// After runs stopped mid-round, the hub restarts the Federation's SuperNodes on its own (its
/// record names the last stopped run; every cluster reports its pools back under that mark) and
/// a run that needs a reply from every SuperNode in every round completes on the first attempt.
async fn after_the_stops_a_run_needing_every_supernode_completes(hub: &Hub) -> Result<()> {
    let t = Instant::now();
    let record = hub.state.join("supernode-restarts.json");
    let after: u64 = Wait::new(
        "the hub's record of a SuperNode restart",
        Duration::from_secs(60),
    )
    .every(Duration::from_millis(200))
    .for_value_blocking(|| {
        let Ok(text) = std::fs::read_to_string(&record) else {
            return Ok(None);
        };
        let entries: Vec<(String, String, u64)> = serde_json::from_str(&text)?;
        Ok(entries
            .into_iter()
            .find(|(ns, name, _)| ns == "default" && name == "quickstart")
            .map(|(_, _, id)| id))
    })?;
    let stopped: Vec<String> = ["stopme", "deadline"]
        .iter()
        .filter_map(|name| Some(hub.run(name)?["runId"].as_str()?.to_owned()))
        .collect();
    ensure!(
        stopped.contains(&after.to_string()),
        "the restart follows one of the stopped runs {stopped:?}, not {after}"
    );
    let mark = format!("after-run-{after}");
    let back = Wait::new(
        format!("every SuperNode back under restart mark {mark}"),
        Duration::from_secs(180),
    )
    .every(Duration::from_millis(500))
    .for_value_blocking(|| {
        let fed = hub.status()["federations"][0].clone();
        let clusters = fed["clusters"].as_array().cloned().unwrap_or_default();
        let all_back = !clusters.is_empty()
            && clusters
                .iter()
                .all(|c| c["supernodeRestart"] == mark.as_str() && c["message"].is_null());
        Ok((all_back && fed["ready"] == true).then_some(fed))
    })?;
    let restarted_in = t.elapsed();
    // min-nodes is every SuperNode of the Federation, and the app fails a round that misses a
    // reply: a wedged SuperNode fails it at the round timeout.
    let every = back["desiredSupernodes"]
        .as_u64()
        .context("desired SuperNodes")?;
    std::fs::write(
        hub.manifests.join("run-after-stop.yaml"),
        flower_run(
            "after-stop",
            &format!("{{num-server-rounds: 2, min-nodes: {every}, round-timeout: 120.0}}"),
            "",
        ),
    )?;
    let done = hub.wait_run("after-stop", "Complete", Duration::from_secs(300), |s| {
        condition(s, "Complete").is_some_and(|c| c.0 == "True")
            || condition(s, "Failed").is_some_and(|c| c.0 == "True")
    })?;
    ensure!(
        is(&done, "Complete", "Completed") && done["attempts"] == 1,
        "after the hub's restart a run needing all {every} SuperNodes must complete on its first attempt:\n{done:#}\nSuperNode logs:\n{}",
        hub.supernode_logs(30)
    );
    eprintln!(
        "standalone_runs: after the stops the hub restarted the SuperNodes (after Flower run {after}): all {every} back and the Federation Ready {:.1}s after the stops were seen; a run needing every SuperNode completed {:.1}s later",
        restarted_in.as_secs_f64(),
        (t.elapsed() - restarted_in).as_secs_f64()
    );
    Ok(())
}

/// `flower-hub run submit --follow` builds the FAB, writes the run beside the other manifests,
/// prints the log and the rounds and exits 0 when it completed; a typo in `--run-config` is
/// refused before anything is written; `run list` shows the run; `run delete` removes its file.
async fn the_run_command_submits_follows_and_deletes(hub: &Hub) -> Result<()> {
    let cli = |args: &[&str]| {
        std::process::Command::new(&hub.bin)
            .args(["run"])
            .args(args)
            .arg("--state-dir")
            .arg(&hub.state)
            .output()
    };
    let app = e2e::repo_root().join("examples/fedavg");
    let app = app.to_str().context("app path")?;
    let files_before = std::fs::read_dir(&hub.manifests)?.count();
    let typo = cli(&[
        "submit",
        app,
        "--federation",
        "quickstart",
        "--run-config",
        "num-roundz=1",
    ])?;
    let err = String::from_utf8_lossy(&typo.stderr);
    ensure!(
        !typo.status.success() && err.contains("num-roundz") && err.contains("num-server-rounds"),
        "a typo must be refused naming the key and the app's keys: {err}"
    );
    ensure!(
        std::fs::read_dir(&hub.manifests)?.count() == files_before,
        "a refused submission wrote a file"
    );
    let t = Instant::now();
    let out = cli(&[
        "submit",
        app,
        "--federation",
        "quickstart",
        "--name",
        "cli",
        "--run-config",
        "num-server-rounds=2 min-nodes=2",
        "--follow",
    ])?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    ensure!(
        out.status.success(),
        "run submit --follow failed:\n{stdout}\n{stderr}\nhub log:\n{}\nSuperNode logs:\n{}",
        tail(&hub.log(), 30),
        hub.supernode_logs(40)
    );
    ensure!(
        stdout.contains("round 2/2") && stderr.contains("round 2/2") && stderr.contains("Complete"),
        "--follow printed neither the log nor the rounds:\n{stdout}\n{stderr}"
    );
    let list = cli(&["list"])?;
    let list = String::from_utf8_lossy(&list.stdout);
    ensure!(
        list.lines()
            .any(|l| l.contains("cli") && l.contains("finished:completed") && l.contains("2/2")),
        "run list:\n{list}"
    );
    let file = hub.manifests.join("flowerrun-default-cli.yaml");
    ensure!(file.is_file(), "no {}", file.display());
    let deleted = cli(&["delete", "cli"])?;
    ensure!(
        deleted.status.success() && !file.exists(),
        "run delete: {deleted:?}"
    );
    eprintln!(
        "standalone_runs: flower-hub run submit --follow completed in {:.1}s; list and delete work\n{list}",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The hub dies after sending `StartRun` and before storing the run id: simulated by killing
/// it while a run goes on and putting the stored state back to "submission pending, no run id".
/// The restarted hub finds the run by its FAB and config and adopts it.
async fn a_lost_answer_is_adopted_not_resubmitted(hub: &mut Hub) -> Result<()> {
    std::fs::write(
        hub.manifests.join("run-adopt.yaml"),
        flower_run(
            "adopt",
            "{num-server-rounds: 3, min-nodes: 2, local-steps: 21}",
            "",
        ),
    )?;
    let running = hub.wait_run("adopt", "Running", Duration::from_secs(120), |s| {
        s["runId"].is_string()
    })?;
    let run_id = running["runId"].as_str().context("runId")?.to_owned();
    let before = hub.flower_runs().await?;
    // A crash: SIGKILL to the hub alone (its SuperLink and SuperNodes end with it).
    let crashed = hub.procs.get_mut("hub")?;
    crashed.signal(nix::sys::signal::Signal::SIGKILL)?;
    let t_kill = Instant::now();
    while crashed.exited().is_none() && t_kill.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every program the hub supervised runs under its guard, which ends it and whatever it
    // started (flwr-clientapp, flwr-serverapp) when the hub dies: nothing of the hub's state
    // directory is left 5 s after the SIGKILL.
    let orphans = || e2e::harness::processes_of(&hub.state);
    loop {
        let left = orphans();
        if left.is_empty() {
            break;
        }
        ensure!(
            t_kill.elapsed() < Duration::from_secs(5),
            "5 s after the hub's SIGKILL these processes of its state directory still run: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "standalone_runs: nothing of the killed hub's state directory left {:.1}s after its SIGKILL",
        t_kill.elapsed().as_secs_f64()
    );
    hub.procs.stop("hub")?;
    let file = hub.state.join("runs/default/adopt.json");
    let mut stored: Value = serde_json::from_slice(&std::fs::read(&file)?)?;
    let status = &mut stored["status"];
    let hash = status["fabHash"].clone();
    let since = status["submittedAt"].clone();
    for field in [
        "runId",
        "flowerStatus",
        "submittedAt",
        "firstSubmittedAt",
        "startedAt",
        "fabHash",
    ] {
        status.as_object_mut().context("status")?.remove(field);
    }
    status["attempts"] = 0.into();
    status["pendingSubmission"] =
        serde_json::json!({"attempt": 1, "fabHash": hash, "since": since, "knownRunIds": []});
    std::fs::write(&file, serde_json::to_vec_pretty(&stored)?)?;
    // What the killed hub wrote last must not pass for the new hub's view.
    std::fs::remove_file(hub.state.join("status.json"))?;
    let t = Instant::now();
    hub.start()?;
    let adopted = hub.wait_run("adopt", "adopted", Duration::from_secs(120), |s| {
        s["runId"].is_string() && s.get("pendingSubmission").is_none_or(Value::is_null)
    })?;
    ensure!(
        adopted["runId"] == run_id.as_str(),
        "adopted another run: {adopted:#}"
    );
    ensure!(
        hub.log().contains("Adopted"),
        "no Adopted event in the hub log"
    );
    let after = hub.flower_runs().await?;
    ensure!(
        after.keys().collect::<Vec<_>>() == before.keys().collect::<Vec<_>>(),
        "a second Flower run was started: before {before:?}, after {after:?}"
    );
    eprintln!(
        "standalone_runs: restarted hub adopted Flower run {run_id} in {:.1}s; the SuperLink lists {} run(s), as before",
        t.elapsed().as_secs_f64(),
        after.len()
    );
    Ok(())
}

// The hub SIGKILLed around a FlowerRun's submission while it runs the Federation's SuperNodes
// itself (no placement): the kill ends them too, and the restarted hub starts new ones while the
// SuperLink, started again, still lists the killed ones' sessions online (Flower ends them after
// up to two heartbeat intervals; the new SuperNodes cannot connect before). A submission waits
// until every SuperNode listed online reached the SuperLink since it started, so a run killed
// before Flower had it completes on its first attempt (sent earlier, it failed in round 1 with
// "Node Unavailable"). Each kill ends with exactly one Flower run per attempt, all finished.
// The many-kill test is standalone_flower's scenario 10 (SuperNodes run by an agent survive a
// hub kill, so a kill costs one run there); FLOWER_ADDON_CRASH_KILLS sets the kills here
// (default 2: one while the pending submission is stored, one as `StartRun` is sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_killed_with_its_own_supernodes_submits_to_the_new_ones() -> Result<()> {
    e2e::install_crypto();
    let kills = e2e::crash::kills(2);
    let dir = tempfile::tempdir()?;
    let t0 = Instant::now();
    let (mut hub, _) = ready_hub_set(
        dir.path(),
        "1.42.0",
        |_| Ok(()),
        |hub| hub.submission_pause_ms = Some(e2e::crash::PAUSE_MS),
    )
    .await?;
    let mut tally = e2e::crash::Tally::default();
    let mut rng = rand::rng();
    for i in 0..kills {
        let name = format!("crash{i:02}-run");
        let before = hub.flower_runs().await?;
        std::fs::write(
            hub.manifests.join(format!("{name}.yaml")),
            flower_run(
                &name,
                "{num-server-rounds: 1, min-nodes: 2}",
                "  backoffLimit: 3\n",
            ),
        )?;
        let (marker, delay) = e2e::crash::aim(i, &mut rng);
        Wait::new(
            format!("{name}: \"{marker}\" in the hub log"),
            Duration::from_secs(120),
        )
        .every(Duration::from_millis(5))
        .detail(|| tail(&hub.log(), 40))
        .until_blocking(|| Ok(e2e::crash::logged(&hub.log(), marker, &name)))?;
        std::thread::sleep(delay);
        let log = hub.log.clone();
        let window = e2e::crash::kill(hub.procs.get_mut("hub")?, &hub.state, &name, || {
            std::fs::read_to_string(&log).unwrap_or_default()
        })?;
        hub.procs.stop("hub")?;
        hub.start()?;
        let done = hub.wait_ended(&name, Duration::from_secs(300))?;
        let after = hub.flower_runs().await?;
        let attempts = tally
            .check(&name, window, &done, &before, &after, &hub.log())
            .with_context(|| {
                format!(
                    "hub log:\n{}\nSuperNodes:\n{}",
                    tail(&hub.log(), 60),
                    hub.supernode_logs(20)
                )
            })?;
        // Flower never had this attempt before the kill: it went to the new SuperNodes only.
        if matches!(
            window,
            "before the submission" | "pending stored, StartRun not sent"
        ) {
            ensure!(
                attempts == 1,
                "{name} (killed: {window}) took {attempts} attempts: its first went to SuperNodes that were not serving\nhub log:\n{}",
                tail(&hub.log(), 60)
            );
        }
        if attempts > 1 {
            eprintln!("{}", e2e::crash::Tally::run_lines(&hub.log(), &name, 30));
        }
        eprintln!(
            "standalone_runs: kill {}/{kills} ({window}): {name} Complete on attempt {attempts} after {:.1}s",
            i + 1,
            t0.elapsed().as_secs_f64()
        );
    }
    eprintln!("standalone_runs: {}", tally.summary(kills, t0.elapsed()));
    Ok(())
}

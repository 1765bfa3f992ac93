//! Scenario 10: the hub SIGKILLed at many moments of a FlowerRun's submission (Flower 1.42, real
//! processes): after its pending submission is stored, while `StartRun` is in flight, after
//! Flower answered and before the answer is stored, and after. The hub pauses in the windows a
//! crash can fall into (`FLOWER_HUB_TEST_SUBMISSION_PAUSE_MS`), and each kill aims at one of
//! them in turn, at a random moment ([`e2e::crash::aim`]). Each time the restarted hub ends
//! with exactly one Flower run per attempt of that FlowerRun (none sent twice, none lost) and
//! the FlowerRun completes. The SuperNodes are edge-1's, run by its agent: a kill takes the
//! hub and its SuperLink down, not them. `FLOWER_ADDON_CRASH_KILLS` sets the number of kills
//! (default 20).
use base64::Engine;

use super::*;

/// A FlowerRun of examples/fedavg (ConfigMap `fedavg-fab`) on the quickstart Federation.
fn flower_run(name: &str) -> String {
    format!(
        "apiVersion: flower-addon.io/v1alpha1\nkind: FlowerRun\nmetadata:\n  name: {name}\nspec:\n  federationRef:\n    name: {FED}\n  app:\n    fab:\n      configMapRef: {{name: fedavg-fab, key: app.fab}}\n  runConfig: {{num-server-rounds: 1, min-nodes: 2}}\n  backoffLimit: 3\n"
    )
}

/// FlowerRun `name`'s status in the hub's status.json, once it is Complete or Failed.
fn ended(w: &World, name: &str) -> Option<Value> {
    let status = w.status().ok()?;
    let run = status["runs"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == name)?["status"]
        .clone();
    let ended = run["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
    });
    ended.then_some(run)
}

pub(super) fn s10_hub_killed_around_submissions(w: &mut World) -> Result<()> {
    let kills = e2e::crash::kills(20);
    let t0 = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let fab =
        flower_addon_hub::flower::fab::build_from_dir(&e2e::repo_root().join("examples/fedavg"))?;
    std::fs::write(
        w.manifests.join("fedavg-fab.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fedavg-fab\nbinaryData:\n  app.fab: {}\n",
            base64::engine::general_purpose::STANDARD.encode(&fab.bytes)
        ),
    )?;
    // edge-2's agent was killed in scenario 6: its pool leaves the Federation, which is Ready
    // again on edge-1's SuperNodes alone (their arguments do not change).
    let manifest = w.manifests.join("federation.yaml");
    let text = std::fs::read_to_string(&manifest)?;
    let without_b = without_pool(&text, "site-b")?;
    std::fs::write(&manifest, &without_b)?;
    w.wait_ready(3, Duration::from_secs(60))?;
    // The hub again, pausing in each window of a submission.
    w.hub_env = vec![(
        flower_addon_hub::runs::SUBMISSION_PAUSE_ENV,
        e2e::crash::PAUSE_MS.to_string(),
    )];
    w.procs.stop("hub")?;
    start_hub(w)?;
    let flower_runs = |w: &World| -> Result<BTreeMap<u64, String>> {
        let client = w.control_client()?;
        let runs = Wait::new("the SuperLink's run list", Duration::from_secs(60))
            .detail(|| w.logs())
            .for_value_blocking(|| Ok(rt.block_on(client.list_runs()).ok()))?;
        Ok(runs.into_iter().map(|r| (r.run_id, r.status)).collect())
    };
    let mut tally = e2e::crash::Tally::default();
    let mut rng = rand::rng();
    let hub_log = w.dir.join("hub.log");
    for i in 0..kills {
        let name = format!("crash{i:02}-run");
        let before = flower_runs(w)?;
        std::fs::write(w.manifests.join(format!("{name}.yaml")), flower_run(&name))?;
        let (marker, delay) = e2e::crash::aim(i, &mut rng);
        Wait::new(
            format!("{name}: \"{marker}\" in the hub log"),
            Duration::from_secs(120),
        )
        .every(Duration::from_millis(5))
        .detail(|| tail(&hub_log, 40))
        .until_blocking(|| {
            Ok(e2e::crash::logged(
                &std::fs::read_to_string(&hub_log).unwrap_or_default(),
                marker,
                &name,
            ))
        })?;
        std::thread::sleep(delay);
        let killed_log = std::fs::read_to_string(&hub_log).unwrap_or_default();
        let hub_dir = w.hub_dir.clone();
        let window = e2e::crash::kill(w.procs.get_mut("hub")?, &hub_dir, &name, || {
            std::fs::read_to_string(&hub_log).unwrap_or_default()
        })?;
        w.procs.stop("hub")?;
        start_hub(w)?;
        let done = Wait::new(
            format!("FlowerRun {name} (killed: {window}) Complete or Failed"),
            Duration::from_secs(300),
        )
        .every(Duration::from_millis(500))
        .detail(|| {
            format!(
                "killed hub's log:\n{}\n{}",
                tail_text(&killed_log, 30),
                w.logs()
            )
        })
        .for_value_blocking(|| Ok(ended(w, &name)))?;
        let after = flower_runs(w)?;
        let log = std::fs::read_to_string(&hub_log).unwrap_or_default();
        let attempts = tally
            .check(&name, window, &done, &before, &after, &log)
            .with_context(|| format!("hub log:\n{}\n{}", tail_text(&log, 60), w.logs()))?;
        if attempts > 1 {
            eprintln!("{}", e2e::crash::Tally::run_lines(&log, &name, 30));
        }
        eprintln!(
            "  kill {}/{kills} ({window}): {name} Complete on attempt {attempts} after {:.1}s",
            i + 1,
            t0.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "  standalone_flower: {}",
        tally.summary(kills, t0.elapsed())
    );
    // The hub as before, without the pause.
    std::fs::write(&manifest, text)?;
    w.hub_env.clear();
    w.procs.stop("hub")?;
    start_hub(w)
}

/// Federation manifest `text` without pool `name` (its `- name:` line and the lines indented
/// under it).
fn without_pool(text: &str, name: &str) -> Result<String> {
    let head = format!("      - name: {name}");
    let mut out = Vec::new();
    let mut skipping = false;
    let mut found = false;
    for line in text.lines() {
        if line == head {
            skipping = true;
            found = true;
            continue;
        }
        if skipping && line.starts_with("        ") {
            continue;
        }
        skipping = false;
        out.push(line);
    }
    ensure!(found, "no pool {name} in the Federation manifest:\n{text}");
    Ok(out.join("\n") + "\n")
}

/// The last `lines` lines of `text`.
fn tail_text(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

//! Registering SuperNode keys with a real SuperLink: the hub's Rust Control API client
//! (`flower_addon_hub::flower::sync_keys`, [`BATCH_CONCURRENCY`] calls at a time) against the old path, one
//! `flwr supernode register` process per key (timed on a sample and extrapolated, as running
//! 1,000 of them takes tens of minutes).
//!
//! Then a flood: one cluster reports `--flood` keys (3,000, what a review registered) for a
//! `replicas: 2` pool; the hub's bound (`core::nodekeys`: at most the pool's replicas on that
//! cluster) lets 2 through, and the sync that would have registered all of them takes what 2 do.
//!
//! `cargo run --release -p e2e --bin control_bench -- [--keys 1000] [--versions 1.42.0,1.25.0]
//! [--cli-sample 5] [--flood 3000]`. Target: 1,000 keys in ≤ 5 s.
use anyhow::{Context, Result, ensure};
use clap::Parser;
use e2e::superlink::TestSuperLink;
use flower_addon_hub::flower::sync_keys;
use std::collections::BTreeSet;
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// Keys to register.
    #[arg(long, default_value_t = 1000)]
    keys: usize,
    /// Flower versions (one SuperLink each).
    #[arg(long, value_delimiter = ',', default_value = "1.42.0,1.25.0")]
    versions: Vec<String>,
    /// Keys registered through `flwr supernode register` for the comparison (1.42.0 only).
    #[arg(long, default_value_t = 5)]
    cli_sample: usize,
    /// Keys one cluster reports for a `replicas: 2` pool in the flood (first version only; 0:
    /// no flood).
    #[arg(long, default_value_t = 3000)]
    flood: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let t = Instant::now();
    let keys: Vec<String> = (0..(args.keys + args.cli_sample).max(args.flood))
        .map(|i| {
            flower_addon_agent::process_runtime::ensure_node_key(
                &dir.path().join(format!("k{i}.key")),
            )
            .map_err(|e| anyhow::anyhow!("{e}"))
        })
        .collect::<Result<_>>()?;
    println!(
        "made {} ECDSA P-384 keys in {:.2} s",
        keys.len(),
        t.elapsed().as_secs_f64()
    );
    let (bench, sample) = keys.split_at(args.keys);
    for version in &args.versions {
        let sl_dir = dir.path().join(version);
        std::fs::create_dir_all(&sl_dir)?;
        let sl = TestSuperLink::start(version, &sl_dir).await?;
        let client = sl.client()?;
        let wanted: BTreeSet<String> = bench.iter().cloned().collect();
        let t = Instant::now();
        let first = sync_keys(&client, &wanted).await?;
        let register = t.elapsed();
        ensure!(
            first.newly_registered == args.keys && first.failed.is_empty(),
            "{} of {} registered; failures: {:?}",
            first.newly_registered,
            args.keys,
            &first.failed[..first.failed.len().min(3)]
        );
        let t = Instant::now();
        let again = sync_keys(&client, &wanted).await?;
        let noop = t.elapsed();
        ensure!(again.newly_registered == 0 && again.registered.len() == args.keys);
        let t = Instant::now();
        let gone = sync_keys(&client, &BTreeSet::new()).await?;
        let unregister = t.elapsed();
        ensure!(gone.unregistered == args.keys, "{gone:?}");
        println!(
            "flower {version}: register {} keys {:.2} s ({:.1} ms/key), re-sync with nothing to do {:.3} s, unregister all {:.2} s",
            args.keys,
            register.as_secs_f64(),
            register.as_secs_f64() * 1000.0 / args.keys as f64,
            noop.as_secs_f64(),
            unregister.as_secs_f64()
        );
        if version == &args.versions[0] && args.flood > 0 {
            flood(
                &client,
                &keys[..args.flood],
                register.as_secs_f64() / args.keys as f64,
            )
            .await?;
        }
        if version == "1.42.0" && args.cli_sample > 0 {
            let per_key = cli_register(&sl, sample, &sl_dir)?;
            println!(
                "flower {version}: old path `flwr supernode register`: {:.2} s/key sequential -> {:.0} s for {} keys",
                per_key,
                per_key * args.keys as f64,
                args.keys
            );
        }
    }
    Ok(())
}

/// One cluster's report of `reported` keys for pool `a` (`replicas: 2`) of Federation `fl/flood`
/// placed on it, through the hub's bound and sync; `per_key` is the measured registration cost.
async fn flood(
    client: &flower_addon_hub::flower::control::ControlClient,
    reported: &[String],
    per_key: f64,
) -> Result<()> {
    use flower_addon_crds::parse::{Object, parse_documents};
    use flower_addon_hub::core::nodekeys::{key_limits, wanted};
    let yaml = "apiVersion: flower-addon.io/v1alpha1\nkind: Federation\nmetadata: {name: flood, namespace: fl}\nspec:\n  mode: StatefulSet\n  isolationMode: subprocess\n  placementRef: {name: p}\n  superlink: {image: \"flwr/superlink:1.42.0\"}\n  supernodes: {image: \"flwr/supernode:1.42.0\", pools: [{name: a, replicas: 2, images: {}}]}\n";
    let Some(Object::Federation(fed)) = parse_documents("flood.yaml", yaml)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .pop()
    else {
        anyhow::bail!("the flood Federation did not parse as one");
    };
    let placed_on: BTreeSet<String> = ["c1".to_owned()].into();
    let report = flower_addon_proto::Status {
        cluster_name: "c1".into(),
        federations: vec![flower_addon_proto::FederationStatus {
            supernode_restart: String::new(),
            namespace: "fl".into(),
            name: "flood".into(),
            pools: vec![flower_addon_proto::PoolStatus {
                name: "a".into(),
                desired: u32::try_from(reported.len())?,
                node_public_keys: reported.to_vec(),
                ..Default::default()
            }],
        }],
        ..Default::default()
    };
    let t = Instant::now();
    let limits = key_limits(&fed.spec, &placed_on, &Default::default());
    let want = wanted(
        &("fl".to_owned(), "flood".to_owned()),
        &placed_on,
        &limits,
        |_| Some(report.clone()),
    );
    let bound = t.elapsed();
    ensure!(
        want.keys.len() == 2 && want.complete,
        "the bound let {} of {} keys through",
        want.keys.len(),
        reported.len()
    );
    let t = Instant::now();
    let synced = sync_keys(client, &want.keys).await?;
    let sync = t.elapsed();
    ensure!(synced.registered.len() == 2, "{synced:?}");
    println!(
        "flood: a cluster reported {} keys for a `replicas: 2` pool -> {} wanted (bound computed in {:.1} ms), registered in {:.3} s; unbounded, {} keys at the measured {:.1} ms/key would have taken {:.1} s",
        reported.len(),
        want.keys.len(),
        bound.as_secs_f64() * 1000.0,
        sync.as_secs_f64(),
        reported.len(),
        per_key * 1000.0,
        per_key * reported.len() as f64
    );
    sync_keys(client, &BTreeSet::new()).await?;
    Ok(())
}

/// Seconds per key of `flwr supernode register KEY.pub CONN` (one process per key).
fn cli_register(sl: &TestSuperLink, keys: &[String], dir: &std::path::Path) -> Result<f64> {
    let home = dir.join("flwr-home");
    std::fs::create_dir_all(&home)?;
    std::fs::write(
        home.join("config.toml"),
        format!(
            "[superlink]\ndefault = \"bench\"\n\n[superlink.bench]\naddress = \"{}\"\nroot-certificates = \"{}\"\n",
            sl.control.address,
            sl.ca_file.display()
        ),
    )?;
    let t = Instant::now();
    for (i, key) in keys.iter().enumerate() {
        let file = dir.join(format!("cli{i}.pub"));
        std::fs::write(&file, format!("{key}\n"))?;
        let out = std::process::Command::new(sl.venv.join("bin/flwr"))
            .args(["supernode", "register"])
            .arg(&file)
            .args(["bench", "--format", "json"])
            .envs(flower_addon_agent::supervise::flower_env(Some(
                &sl.venv.join("bin"),
            )))
            .env("FLWR_HOME", &home)
            .current_dir(dir)
            .output()
            .context("running flwr")?;
        let text = String::from_utf8_lossy(&out.stdout);
        ensure!(
            text.contains("\"success\": true"),
            "flwr supernode register: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(t.elapsed().as_secs_f64() / keys.len() as f64)
}

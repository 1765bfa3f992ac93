//! Registering SuperNode keys with a real SuperLink: the hub's Rust Control API client
//! (`flower_addon_hub::flower::sync_keys`, [`BATCH_CONCURRENCY`] calls at a time) against the old path, one
//! `flwr supernode register` process per key (timed on a sample and extrapolated, as running
//! 1,000 of them takes tens of minutes).
//!
//! `cargo run --release -p e2e --bin control_bench -- [--keys 1000] [--versions 1.42.0,1.25.0]
//! [--cli-sample 5]`. Target: 1,000 keys in ≤ 5 s.
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
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let t = Instant::now();
    let keys: Vec<String> = (0..args.keys + args.cli_sample)
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

//! `e2e` command: brings a real local control plane up for exploring by hand.

use anyhow::Result;
use clap::{Parser, Subcommand};

/// flower-addon e2e harness.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start etcd + hub/spoke clusters (apiserver, controller-manager, scheduler, kwok nodes),
    /// print their kubeconfigs, and keep them running until Ctrl-C.
    Up {
        /// Number of clusters: the hub plus N-1 spokes (`spoke-1`, …).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=8))]
        clusters: u16,
        /// Fake kwok nodes per cluster.
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        /// Keep the work dir (logs, kubeconfigs) after Ctrl-C.
        #[arg(long)]
        keep: bool,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    e2e::install_crypto();
    match Cli::parse().command {
        Cmd::Up {
            clusters,
            nodes,
            keep,
        } => {
            let names: Vec<String> = std::iter::once("hub".to_string())
                .chain((1..clusters).map(|i| format!("spoke-{i}")))
                .collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let opts = e2e::Options {
                nodes_per_cluster: nodes,
                keep_work_dir: keep,
                ..Default::default()
            };
            let cp = e2e::ControlPlane::start_with(&names, opts).await?;
            println!(
                "control plane up in {:.1}s (work dir {}):",
                cp.startup.as_secs_f64(),
                cp.work_dir().display()
            );
            for c in cp.clusters() {
                println!(
                    "  {:<8} {}  nodes {:?}\n           export KUBECONFIG={}",
                    c.name,
                    c.server,
                    c.nodes,
                    c.kubeconfig.display()
                );
            }
            println!("memory (RSS):\n{}", cp.rss_report());
            println!("press Ctrl-C to stop");
            tokio::signal::ctrl_c().await?;
            eprintln!("stopping…");
            drop(cp);
            Ok(())
        }
    }
}

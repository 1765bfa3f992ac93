//! `flower-hub status`: Federations and clusters as tables or JSON, from the hub apiserver or a
//! standalone hub's state directory.
use super::*;

/// `flower-hub status`.
pub fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let hub = Hub::open(&args.hub_args).await?;
        let clusters =
            with_store!(&hub, s => s.list_clusters().await).map_err(|e| explain(e, &hub))?;
        match &hub {
            Hub::File { dir, .. } => status_standalone(dir, &clusters, args.output)?,
            Hub::Kube { client, .. } => {
                let federations = kube_api::list_federations(client).await?;
                if args.output == Output::Json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&serde_json::json!({
                            "federations": federations,
                            "clusters": cluster_json(&clusters),
                            "problems": [],
                        }))?
                    );
                } else {
                    print!("{}", federation_table(&federations));
                    println!();
                    print_cluster_table(&clusters);
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn status_standalone(dir: &Path, clusters: &[ClusterRecord], output: Output) -> anyhow::Result<()> {
    // Federations are written by the running hub after each reconcile pass.
    let hub_status = crate::standalone::status::HubStatus::read(dir).ok();
    if output == Output::Json {
        let (federations, problems, runs) = hub_status
            .map(|s| (s.federations, s.problems, s.runs))
            .unwrap_or_default();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "federations": federations,
                "clusters": cluster_json(clusters),
                "runs": runs,
                "problems": problems,
            }))?
        );
        return Ok(());
    }
    match &hub_status {
        Some(s) => {
            print!("{}", s.federation_table());
            if !s.runs.is_empty() {
                println!();
                print!("{}", s.run_table());
            }
            for p in &s.problems {
                println!("problem: {p}");
            }
            println!();
        }
        None => println!("(no status.json yet: is `flower-hub serve --standalone` running?)\n"),
    }
    print_cluster_table(clusters);
    Ok(())
}

fn cluster_json(clusters: &[ClusterRecord]) -> Vec<serde_json::Value> {
    clusters
        .iter()
        .map(|c| {
            serde_json::json!({
                "name": c.registration.name,
                "hubAcceptsClient": c.hub_accepts_client,
                "labels": c.registration.labels,
                "claims": c.registration.claims,
                "keyFingerprint": c.registration.key_fingerprint,
                "status": c.status,
            })
        })
        .collect()
}

fn print_cluster_table(clusters: &[ClusterRecord]) {
    println!(
        "{:<24} {:<9} {:<10} {:<22} LABELS",
        "CLUSTER", "ACCEPTED", "AVAILABLE", "LAST SEEN"
    );
    for c in clusters {
        let available = c
            .status
            .condition(CONDITION_AVAILABLE)
            .map(|c| c.status.clone())
            .unwrap_or_else(|| "Unknown".into());
        let labels: Vec<String> = c
            .registration
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!(
            "{:<24} {:<9} {:<10} {:<22} {}",
            c.registration.name,
            c.hub_accepts_client,
            available,
            c.status
                .last_heartbeat_unix
                .and_then(rfc3339)
                .unwrap_or_else(|| "-".into()),
            labels.join(",")
        );
    }
    if clusters.is_empty() {
        println!(
            "(no clusters: create a token with `flower-hub token create` and run the printed `flower-agent join`)"
        );
    }
}

/// The Federations of a Kubernetes hub as a table like `kubectl get federations -A`.
fn federation_table(rows: &[kube_api::FederationRow]) -> String {
    if rows.is_empty() {
        return "(no Federations)\n".to_owned();
    }
    let mut cells = vec![
        [
            "NAMESPACE",
            "NAME",
            "MODE",
            "ISOLATION",
            "CLUSTERS",
            "SUPERNODES",
            "READY",
            "MESSAGE",
        ]
        .map(String::from),
    ];
    for f in rows {
        cells.push([
            f.namespace.clone(),
            f.name.clone(),
            f.mode.clone(),
            f.isolation.clone(),
            f.clusters.to_string(),
            f.supernodes.clone(),
            f.ready.clone(),
            f.message.clone().unwrap_or_default(),
        ]);
    }
    crate::standalone::status::table(&cells)
}

//! `flower-hub run list|stop|fetch|delete`: runs already submitted.
use super::*;

pub(super) async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let hub = Hub::open(&args.hub_args).await?;
    let entries: Vec<crate::standalone::runs::RunEntry> = match &hub {
        Hub::Kube { client, .. } => {
            let runs: kube::Api<FlowerRun> = match &args.federation_namespace {
                Some(ns) => kube::Api::namespaced(client.clone(), ns),
                None => kube::Api::all(client.clone()),
            };
            runs.list(&Default::default())
                .await?
                .items
                .into_iter()
                .map(|r| crate::standalone::runs::RunEntry {
                    namespace: r.metadata.namespace.clone().unwrap_or_default(),
                    name: r.metadata.name.clone().unwrap_or_default(),
                    federation: r.spec.federation_ref.name.clone(),
                    status: r.status.unwrap_or_default(),
                })
                .collect()
        }
        Hub::File { dir, .. } => crate::standalone::status::HubStatus::read(dir)
            .with_context(|| format!("reading {}/status.json", dir.display()))?
            .runs
            .into_iter()
            .filter(|r| {
                args.federation_namespace
                    .as_ref()
                    .is_none_or(|ns| *ns == r.namespace)
            })
            .collect(),
    };
    let mut entries = entries;
    entries.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    match args.output {
        ListOutput::Json => println!("{}", serde_json::to_string_pretty(&entries)?),
        ListOutput::Yaml => print!("{}", serde_saphyr::to_string(&entries)?),
        ListOutput::Table => {
            let table = crate::standalone::status::HubStatus {
                runs: entries,
                ..Default::default()
            };
            print!("{}", table.run_table());
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn stop(args: NameArgs) -> anyhow::Result<ExitCode> {
    let hub = Hub::open(&args.hub_args).await?;
    let (ns, name) = (&args.federation_namespace, &args.name);
    match &hub {
        Hub::Kube { client, .. } => {
            let runs: kube::Api<FlowerRun> = kube::Api::namespaced(client.clone(), ns);
            runs.patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"spec": {"suspend": true}})),
            )
            .await
            .with_context(|| format!("setting spec.suspend of FlowerRun {ns}/{name}"))?;
        }
        Hub::File { dir, .. } => {
            let path = standalone_file(dir, ns, name)?;
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "{} not found: only runs made by `flower-hub run submit` are edited here; \
                     set `spec.suspend: true` in the FlowerRun's own file",
                    path.display()
                )
            })?;
            let objects = flower_addon_crds::parse_documents(&path.display().to_string(), &text)?;
            let mut out = String::from(
                "# Made by `flower-hub run submit`; stopped by `flower-hub run stop`.\n",
            );
            for object in objects {
                let value = match object {
                    flower_addon_crds::Object::FlowerRun(mut run) => {
                        run.spec.suspend = Some(true);
                        with_kind(&run, flower_addon_crds::API_VERSION, "FlowerRun")?
                    }
                    flower_addon_crds::Object::ConfigMap(map) => {
                        with_kind(&map, "v1", "ConfigMap")?
                    }
                    other => anyhow::bail!(
                        "{}: unexpected {} in a file `run submit` made",
                        path.display(),
                        other.kind()
                    ),
                };
                out.push_str("---\n");
                out.push_str(&serde_saphyr::to_string(&value)?);
            }
            write_new(&path, &out)?;
        }
    }
    println!(
        "FlowerRun {ns}/{name}: spec.suspend set; the hub stops its Flower run (follow with `flower-hub run logs {name} --follow`)"
    );
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn fetch(args: FetchArgs) -> anyhow::Result<ExitCode> {
    let hub = Hub::open(&args.names.hub_args).await?;
    let (ns, name) = (&args.names.federation_namespace, &args.names.name);
    let dest = args.output.clone().unwrap_or_else(|| PathBuf::from(name));
    let status = get(&hub, ns, name).await?;
    if status.outputs_listed_at.is_none() {
        anyhow::bail!(
            "FlowerRun {ns}/{name} has no outputs listed yet: they are listed when the run has \
             finished, on a Federation with spec.outputs (see `flower-hub run list`)"
        );
    }
    if status.outputs.is_empty() {
        let why = status.details.as_deref().unwrap_or("its app wrote no file");
        println!("FlowerRun {ns}/{name} has no outputs ({why})");
        return Ok(ExitCode::SUCCESS);
    }
    std::fs::create_dir_all(&dest).with_context(|| format!("-o: making {}", dest.display()))?;
    match &hub {
        Hub::Kube { client, .. } => {
            let runs: kube::Api<FlowerRun> = kube::Api::namespaced(client.clone(), ns);
            let run = runs.get(name).await?;
            let pod = format!(
                "{}-0",
                crate::core::render::superlink_name(&run.spec.federation_ref.name)
            );
            for file in &status.outputs {
                crate::flower::outputs::download_via_api(client, ns, &pod, ns, name, file, &dest)
                    .await?;
            }
        }
        Hub::File { dir, .. } => {
            let entry = crate::standalone::status::HubStatus::read(dir)?
                .runs
                .into_iter()
                .find(|r| r.namespace == *ns && r.name == *name)
                .with_context(|| format!("no FlowerRun {ns}/{name} in the hub's status"))?;
            let root = crate::standalone::runs::outputs_root(dir, ns, &entry.federation);
            crate::flower::outputs::copy_verified(
                &root.join(ns).join(name),
                &status.outputs,
                &dest,
            )?;
        }
    }
    let bytes: i64 = status.outputs.iter().map(|f| f.size).sum();
    println!(
        "FlowerRun {ns}/{name}: {} file(s), {bytes} bytes, sha256 checked, in {}",
        status.outputs.len(),
        dest.display()
    );
    for file in &status.outputs {
        println!("  {}  {}  {}", file.sha256, file.size, file.path);
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn delete(args: NameArgs) -> anyhow::Result<ExitCode> {
    let hub = Hub::open(&args.hub_args).await?;
    let (ns, name) = (&args.federation_namespace, &args.name);
    match &hub {
        Hub::Kube { client, .. } => {
            let runs: kube::Api<FlowerRun> = kube::Api::namespaced(client.clone(), ns);
            // The ConfigMap `submit` made is owned by the run: it goes with it.
            runs.delete(name, &kube::api::DeleteParams::default())
                .await
                .with_context(|| format!("deleting FlowerRun {ns}/{name}"))?;
        }
        Hub::File { dir, .. } => {
            let path = standalone_file(dir, ns, name)?;
            std::fs::remove_file(&path).with_context(|| {
                format!(
                    "{}: only runs made by `flower-hub run submit` are removed here; remove the \
                     FlowerRun from its own file",
                    path.display()
                )
            })?;
        }
    }
    println!("FlowerRun {ns}/{name} deleted; the hub stops its Flower run if it still runs");
    Ok(ExitCode::SUCCESS)
}

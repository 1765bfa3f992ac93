//! Our CRDs on a real kube-apiserver (scenario 5a): they install and become Established, every
//! example is accepted, every invalid example is refused with exactly its CEL message, and
//! `kubectl get federation` shows our printer columns.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use e2e::{Cluster, ControlPlane};
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crds_on_real_apiserver() {
    // Invariant: what the crds crate generates is what a real apiserver accepts and enforces:
    // examples pass, each invalid example fails with its documented CEL message, columns show.
    e2e::install_crypto();
    let cp = ControlPlane::start(&["hub"])
        .await
        .expect("control plane (run e2e/k8s/build.sh if binaries are missing)");
    let hub = cp.cluster("hub").expect("hub cluster");
    let mut failed = Vec::new();

    let t = Instant::now();
    if let Err(e) = e2e::install_crds(&hub.client).await {
        // Nothing else can run without the CRDs.
        panic!("installing the CRDs failed: {e:#}");
    }
    eprintln!(
        "CRDs installed and Established in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    match examples_accepted(hub).await {
        Ok(n) => eprintln!(
            "{n} example objects accepted ({:.1}s)",
            t.elapsed().as_secs_f64()
        ),
        Err(e) => failed.push(format!("examples_accepted: {e:#}")),
    }
    let t = Instant::now();
    match invalid_examples_refused(hub).await {
        Ok(n) => eprintln!(
            "{n} invalid examples refused with their messages ({:.1}s)",
            t.elapsed().as_secs_f64()
        ),
        Err(e) => failed.push(format!("invalid_examples_refused: {e:#}")),
    }
    let t = Instant::now();
    match printer_columns(hub).await {
        Ok(()) => eprintln!("printer columns ok ({:.1}s)", t.elapsed().as_secs_f64()),
        Err(e) => failed.push(format!("printer_columns: {e:#}")),
    }
    let t = Instant::now();
    match flower_run_spec_is_immutable_but_suspend(hub).await {
        Ok(()) => eprintln!(
            "FlowerRun spec immutable but for suspend ({:.1}s)",
            t.elapsed().as_secs_f64()
        ),
        Err(e) => failed.push(format!("flower_run_spec_is_immutable_but_suspend: {e:#}")),
    }
    let t = Instant::now();
    match hub_sa_on_our_resources(hub).await {
        Ok(()) => eprintln!(
            "hub SA on our resources ok ({:.1}s)",
            t.elapsed().as_secs_f64()
        ),
        Err(e) => failed.push(format!("hub_sa_on_our_resources: {e:#}")),
    }
    assert!(failed.is_empty(), "failed:\n{}", failed.join("\n"));
}

/// The example FlowerRun (created by `examples_accepted`) takes `suspend: true`, and refuses a
/// changed `federationRef` with the CRD's transition rule's message.
async fn flower_run_spec_is_immutable_but_suspend(hub: &Cluster) -> Result<()> {
    let runs: kube::Api<flower_addon_crds::FlowerRun> =
        kube::Api::namespaced(hub.client.clone(), "default");
    runs.patch(
        "fedavg",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"suspend": true}})),
    )
    .await
    .context("suspend: true must be accepted")?;
    let refused = runs
        .patch(
            "fedavg",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"federationRef": {"name": "other"}}})),
        )
        .await;
    match refused {
        Err(kube::Error::Api(e))
            if e.message
                .contains(flower_addon_crds::rules::MSG_RUN_IMMUTABLE) =>
        {
            Ok(())
        }
        other => bail!(
            "a changed federationRef was not refused with the immutability message: {other:?}"
        ),
    }
}

/// With its own token (manifests/hub/rbac.yaml), the hub lists Federations and patches their
/// status, but cannot change a user's Federation spec or delete it.
async fn hub_sa_on_our_resources(hub: &Cluster) -> Result<()> {
    let manifests = e2e::repo_root().join("manifests/hub");
    e2e::apply_file(&hub.client, &manifests.join("namespace.yaml"), "default").await?;
    let sa = e2e::service_account_access(
        hub,
        &manifests.join("rbac.yaml"),
        "flower-addon-system",
        "flower-hub",
        600,
    )
    .await?;
    let gvk = kube::core::GroupVersionKind::gvk(
        flower_addon_crds::GROUP,
        flower_addon_crds::VERSION,
        "Federation",
    );
    let ar = kube::core::ApiResource::from_gvk_with_plural(&gvk, "federations");
    let all: Api<kube::api::DynamicObject> = Api::all_with(sa.client.clone(), &ar);
    let feds = all
        .list(&Default::default())
        .await
        .context("hub SA lists federations")?;
    let fed = feds.items.first().context("no Federation to test with")?;
    let ns = fed.metadata.namespace.clone().unwrap_or_default();
    let name = fed.name_any();
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(sa.client.clone(), &ns, &ar);
    let status = serde_json::json!({"status": {"supernodes": "0/0"}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("hub SA patches federation status")?;
    let spec = serde_json::json!({"spec": {"isolationMode": "process"}});
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&spec))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => bail!("hub SA patching a Federation spec: expected 403, got {other:?}"),
    }
    match api.delete(&name, &Default::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
        other => bail!("hub SA deleting a Federation: expected 403, got {other:?}"),
    }
}

fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml" || e == "yml"));
    files.sort();
    Ok(files)
}

/// Creates the namespaces the objects of `yaml` live in (examples name their own).
async fn ensure_namespaces(hub: &Cluster, yaml: &str) -> Result<()> {
    let nss: Api<Namespace> = Api::all(hub.client.clone());
    for obj in e2e::apply::parse_yaml(yaml)? {
        if let Some(ns) = obj.metadata.namespace.as_deref() {
            let want: Namespace = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}
            }))?;
            nss.patch(
                ns,
                &PatchParams::apply(e2e::apply::FIELD_MANAGER),
                &Patch::Apply(&want),
            )
            .await?;
        }
    }
    Ok(())
}

/// Every document of every `examples/*.yaml` is accepted by the apiserver.
async fn examples_accepted(hub: &Cluster) -> Result<usize> {
    let files = yaml_files(&e2e::repo_root().join("examples"))?;
    ensure!(!files.is_empty(), "no examples/*.yaml to check");
    let mut n = 0;
    let mut refused = Vec::new();
    for f in &files {
        let yaml = std::fs::read_to_string(f)?;
        ensure_namespaces(hub, &yaml).await?;
        match e2e::apply_yaml(&hub.client, &yaml, "default").await {
            Ok(objs) => n += objs.len(),
            Err(e) => refused.push(format!("{}: {e:#}", f.display())),
        }
    }
    if !refused.is_empty() {
        bail!("valid examples refused:\n{}", refused.join("\n"));
    }
    Ok(n)
}

/// The expected message of an invalid example: the text after the first `:` of its first
/// comment line mentioning "expect" (e.g. `# expected: spec.supernodes.pools must …`).
fn expected_message(yaml: &str) -> Option<String> {
    yaml.lines()
        .filter_map(|l| l.trim_start().strip_prefix('#'))
        .find(|c| c.to_ascii_lowercase().contains("expect"))
        .and_then(|c| c.split_once(':'))
        .map(|(_, msg)| {
            msg.trim()
                .trim_matches(|ch| ch == '"' || ch == '`')
                .to_string()
        })
        .filter(|m| !m.is_empty())
}

/// Every `examples/invalid/*.yaml` is refused (422) with its documented message.
async fn invalid_examples_refused(hub: &Cluster) -> Result<usize> {
    let files = yaml_files(&e2e::repo_root().join("examples/invalid"))?;
    ensure!(!files.is_empty(), "no examples/invalid/*.yaml to check");
    let mut wrong = Vec::new();
    for f in &files {
        let yaml = std::fs::read_to_string(f)?;
        let Some(expected) = expected_message(&yaml) else {
            wrong.push(format!(
                "{}: no `# expected: <message>` comment",
                f.display()
            ));
            continue;
        };
        ensure_namespaces(hub, &yaml).await?;
        let mut objs = e2e::apply::parse_yaml(&yaml)?;
        ensure!(objs.len() == 1, "{}: expected one object", f.display());
        let obj = objs.remove(0);
        match e2e::apply::apply_object(&hub.client, &obj, "default", false).await {
            Ok(_) => wrong.push(format!("{}: ACCEPTED, expected `{expected}`", f.display())),
            Err(e) => match e.downcast_ref::<kube::Error>() {
                Some(kube::Error::Api(s)) if s.code == 422 && s.message.contains(&expected) => {
                    eprintln!("  {} refused: {}", f.display(), s.message);
                }
                Some(kube::Error::Api(s)) => wrong.push(format!(
                    "{}: refused with {} `{}`, expected it to contain `{expected}`",
                    f.display(),
                    s.code,
                    s.message
                )),
                _ => wrong.push(format!("{}: {e:#}", f.display())),
            },
        }
    }
    if !wrong.is_empty() {
        bail!("{}", wrong.join("\n"));
    }
    Ok(files.len())
}

/// The Federation list as a server-side Table has NAME plus our columns, in order.
async fn printer_columns(hub: &Cluster) -> Result<()> {
    let req = http::Request::get(format!(
        "/apis/{}/federations",
        flower_addon_crds::API_VERSION
    ))
    .header(
        http::header::ACCEPT,
        "application/json;as=Table;v=v1;g=meta.k8s.io",
    )
    .body(Vec::new())?;
    let table: serde_json::Value = serde_json::from_str(&hub.client.request_text(req).await?)?;
    ensure!(
        table["kind"] == "Table",
        "not a Table: {}",
        serde_json::to_string(&table)?
    );
    let names: Vec<String> = table["columnDefinitions"]
        .as_array()
        .context("no columnDefinitions")?
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default().to_ascii_uppercase())
        .collect();
    let want = [
        "NAME",
        "MODE",
        "ISOLATION",
        "CLUSTERS",
        "SUPERNODES",
        "READY",
        "AGE",
    ];
    ensure!(names == want, "columns {names:?}, expected {want:?}");
    let rows = table["rows"].as_array().map(Vec::len).unwrap_or(0);
    ensure!(
        rows > 0,
        "no Federation rows (examples should have created some)"
    );
    eprintln!("  columns {names:?}, {rows} row(s)");
    Ok(())
}

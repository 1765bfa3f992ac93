//! `flower-hub run` against the real-node federation, as the README shows it, black box: the
//! binary with a kubeconfig of user `bob`, who holds nothing in the hub cluster but the chart's
//! FlowerRun role (`flower-addon-flowerrun-editor`) in namespace `fl`.
use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use e2e::harness::wait_for;
use e2e::{Cluster, apply_yaml};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

/// A user's kubeconfig for the CLI (the admin's, acting as the user), kept while it is used.
pub struct CliUser {
    _dir: tempfile::TempDir,
    /// The kubeconfig file.
    pub kubeconfig: PathBuf,
    /// The same user as a client of the test.
    pub client: kube::Client,
}

impl CliUser {
    /// `flower-hub ARGS…` as this user (never a standalone hub's state directory).
    pub fn flower_hub(&self, args: &[&str]) -> Result<Output> {
        Ok(std::process::Command::new(e2e::binary("flower-hub")?)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("FLOWER_HUB_STATE_DIR")
            .current_dir(e2e::repo_root())
            .output()?)
    }

    /// [`CliUser::flower_hub`] that must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> Result<String> {
        let out = self.flower_hub(args)?;
        ensure!(
            out.status.success(),
            "flower-hub {}: {}\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// bob: the chart's FlowerRun editor role in `fl`, bound by a RoleBinding, and nothing else.
pub async fn flowerrun_editor(hub: &Cluster) -> Result<CliUser> {
    apply_yaml(
        &hub.client,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bob-runs, namespace: fl}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: flower-addon-flowerrun-editor}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}]
"#,
        "fl",
    )
    .await?;
    impersonating(hub, "bob").await
}

/// The hub admin's kubeconfig acting as `user` (`as:`), for the CLI and for the test.
pub async fn impersonating(hub: &Cluster, user: &str) -> Result<CliUser> {
    let mut kubeconfig = kube::config::Kubeconfig::read_from(&hub.kubeconfig)?;
    for auth_info in &mut kubeconfig.auth_infos {
        if let Some(auth) = auth_info.auth_info.as_mut() {
            auth.impersonate = Some(user.to_owned());
        }
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join(format!("{user}.kubeconfig"));
    std::fs::write(&path, serde_json::to_string(&kubeconfig)?)?;
    let client = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?,
    )?;
    Ok(CliUser {
        _dir: dir,
        kubeconfig: path,
        client,
    })
}

/// bob submits examples/fedavg to `auth` with `run submit --follow` (it prints the rounds and
/// exits 0 when the run completed), finds it Complete in `run list -o json`, reads its log with
/// `run logs`, is refused `run fetch` naming the permission it lacks (`pods/portforward`), cannot
/// read the ConfigMap `submit` made, and `run delete` removes the run and, through its owner
/// reference, that ConfigMap. What it measured, for the summary line.
pub async fn a_flowerrun_editor_trains_with_the_cli(
    hub: &Cluster,
    bob: &CliUser,
) -> Result<String> {
    const NAME: &str = "cli-run";
    let t = Instant::now();
    let submitted = bob.ok(&[
        "run",
        "submit",
        "examples/fedavg",
        "--federation",
        "auth",
        "--federation-namespace",
        "fl",
        "--name",
        NAME,
        "--run-config",
        "num-server-rounds=2",
        "--run-config",
        "min-nodes=6",
        "--follow",
    ])?;
    let followed = t.elapsed();
    ensure!(
        submitted.contains(&format!("FlowerRun fl/{NAME} submitted"))
            && submitted.contains("final: rounds=2"),
        "run submit --follow printed:\n{submitted}"
    );
    let listed: serde_json::Value = serde_json::from_str(&bob.ok(&[
        "run",
        "list",
        "--federation-namespace",
        "fl",
        "-o",
        "json",
    ])?)
    .context("run list -o json is not JSON")?;
    let entry = listed
        .as_array()
        .and_then(|runs| runs.iter().find(|r| r["name"] == NAME))
        .with_context(|| format!("run list -o json lacks {NAME}: {listed:#}"))?;
    let complete = entry["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Complete" && c["status"] == "True" && c["reason"] == "Completed");
    ensure!(
        entry["namespace"] == "fl" && entry["federation"] == "auth" && complete,
        "run list -o json: {entry:#}"
    );
    let logs = bob.ok(&["run", "logs", NAME, "--federation-namespace", "fl"])?;
    ensure!(
        logs.contains("round 2/2") && logs.contains("final: rounds=2"),
        "run logs {NAME}:\n{logs}"
    );
    let out_dir = tempfile::tempdir()?;
    let out_path = out_dir.path().join("out");
    let fetch = bob.flower_hub(&[
        "run",
        "fetch",
        NAME,
        "--federation-namespace",
        "fl",
        "-o",
        out_path.to_str().context("a UTF-8 temporary path")?,
    ])?;
    let refusal = String::from_utf8_lossy(&fetch.stderr).into_owned();
    ensure!(
        !fetch.status.success() && refusal.contains("pods/portforward"),
        "run fetch by a FlowerRun editor without pods/portforward: {}\n{refusal}",
        fetch.status
    );
    let config_map = format!("{NAME}-fab");
    let read = Api::<ConfigMap>::namespaced(bob.client.clone(), "fl")
        .get(&config_map)
        .await;
    ensure!(
        matches!(&read, Err(kube::Error::Api(e)) if e.code == 403),
        "bob (create on configmaps only) read ConfigMap fl/{config_map}: {read:?}"
    );
    let maps = Api::<ConfigMap>::namespaced(hub.client.clone(), "fl");
    let owners = maps
        .get(&config_map)
        .await?
        .metadata
        .owner_references
        .unwrap_or_default();
    ensure!(
        owners
            .iter()
            .any(|o| o.kind == "FlowerRun" && o.name == NAME),
        "ConfigMap fl/{config_map} is not owned by its FlowerRun: {owners:?}"
    );
    bob.ok(&["run", "delete", NAME, "--federation-namespace", "fl"])?;
    let runs = Api::<flower_addon_crds::run::FlowerRun>::namespaced(hub.client.clone(), "fl");
    let t_delete = Instant::now();
    wait_for(
        &format!("FlowerRun fl/{NAME} and its ConfigMap gone after `run delete`"),
        Duration::from_secs(120),
        || {
            let (runs, maps, config_map) = (runs.clone(), maps.clone(), config_map.clone());
            async move {
                Ok((runs.get_opt(NAME).await?.is_none()
                    && maps.get_opt(&config_map).await?.is_none())
                .then_some(()))
            }
        },
    )
    .await?;
    Ok(format!(
        "`run submit --follow` completed in {:.1}s; `run list -o json` Complete, `run logs` with the rounds; `run fetch` refused ({}); the FAB ConfigMap unreadable to bob; `run delete` removed the run and its ConfigMap in {:.1}s",
        followed.as_secs_f64(),
        refusal
            .lines()
            .find(|l| l.contains("pods/portforward"))
            .unwrap_or("")
            .trim(),
        t_delete.elapsed().as_secs_f64()
    ))
}

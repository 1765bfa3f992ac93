//! The `helm` binary the chart tests use (built by `e2e/helm/build.sh`, path in
//! `FLOWER_ADDON_HELM` or asked of the script) and the chart itself (`manifests/chart/flower-addon`).
use anyhow::{Context, Result, ensure};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `helm`, from `FLOWER_ADDON_HELM`, else what `e2e/helm/build.sh` builds (or has cached: it
/// prints the path); a clear error naming the build script when neither works.
pub fn binary() -> Result<PathBuf> {
    let path = crate::harness::built_by("FLOWER_ADDON_HELM", "e2e/helm/build.sh")?;
    ensure!(
        path.is_file(),
        "helm {} does not exist: run e2e/helm/build.sh",
        path.display()
    );
    Ok(path)
}

/// The chart directory.
pub fn chart() -> PathBuf {
    crate::repo_root().join("manifests/chart/flower-addon")
}

/// Runs `helm args…` (against `kubeconfig` when given, with Helm's own state in a temporary
/// directory); its stdout, or an error with its output.
pub fn run(kubeconfig: Option<&Path>, args: &[&str]) -> Result<String> {
    let home = std::env::temp_dir().join("flower-addon-helm");
    let mut cmd = Command::new(binary()?);
    cmd.args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    if let Some(kubeconfig) = kubeconfig {
        cmd.arg("--kubeconfig").arg(kubeconfig);
    }
    let out = cmd.output().context("run helm")?;
    ensure!(
        out.status.success(),
        "helm {}: {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// `helm upgrade RELEASE` of the chart in `namespace` of the cluster of `kubeconfig`, keeping the
/// release's values and moving it to image tag `tag` (a rolling upgrade to another image).
pub fn upgrade_image_tag(
    kubeconfig: &Path,
    release: &str,
    namespace: &str,
    tag: &str,
) -> Result<String> {
    let chart = chart();
    let set_tag = format!("image.tag={tag}");
    run(
        Some(kubeconfig),
        &[
            "upgrade",
            release,
            chart.to_str().context("chart path")?,
            "--namespace",
            namespace,
            "--reuse-values",
            "--set",
            &set_tag,
        ],
    )
}

/// `helm install` of the chart's agent side as release `flower-addon-agent` into
/// `flower-addon-agent` of the cluster of `kubeconfig`, with the bootstrap Secret made from
/// `bootstrap` (`token`, `hub`, `caHash`, `clusterName`, … as in `agent.bootstrap`).
pub fn install_agent(kubeconfig: &Path, bootstrap: &[(&str, &str)]) -> Result<String> {
    let chart = chart();
    let sets: Vec<String> = [
        "hub.enabled=false".to_owned(),
        "agent.enabled=true".to_owned(),
        "agent.bootstrap.create=true".to_owned(),
    ]
    .into_iter()
    .chain(
        bootstrap
            .iter()
            .map(|(k, v)| format!("agent.bootstrap.{k}={v}")),
    )
    .collect();
    let mut args = vec![
        "install",
        "flower-addon-agent",
        chart.to_str().context("chart path")?,
        "--namespace",
        crate::addon::AGENT_NS,
        "--create-namespace",
        "--skip-crds",
    ];
    for set in &sets {
        args.extend(["--set", set.as_str()]);
    }
    run(Some(kubeconfig), &args)
}

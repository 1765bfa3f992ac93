//! Locating the control-plane binaries built by `e2e/k8s/build.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Environment variable naming the directory holding the control-plane binaries.
pub const BIN_DIR_ENV: &str = "FLOWER_ADDON_K8S_BIN";
/// Environment variable naming the kwok stage config (default: `<bin>/../kwok-stages/all.yaml`).
pub const KWOK_STAGES_ENV: &str = "FLOWER_ADDON_KWOK_STAGES";

/// Paths of every binary the harness starts.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// Directory holding them.
    pub dir: PathBuf,
    /// `etcd`.
    pub etcd: PathBuf,
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `kube-controller-manager`.
    pub kube_controller_manager: PathBuf,
    /// `kube-scheduler`.
    pub kube_scheduler: PathBuf,
    /// `kwok`.
    pub kwok: PathBuf,
    /// kwok Stage configs (`--config`), including the pod-delete stage.
    pub kwok_stages: PathBuf,
}

fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s/build.sh")
}

fn how_to_build() -> String {
    format!(
        "build the test control plane first: run `{}` (cold build 20-35 min, then cached), \
         or point {BIN_DIR_ENV} at a directory holding etcd, kube-apiserver, \
         kube-controller-manager, kube-scheduler and kwok",
        build_script().display()
    )
}

impl Binaries {
    /// Finds the binaries via `$FLOWER_ADDON_K8S_BIN` or `e2e/k8s/build.sh --print-bin-dir`.
    /// Fails (never skips) with instructions when anything is missing.
    pub fn locate() -> Result<Self> {
        let from_env = std::env::var_os(BIN_DIR_ENV).map(PathBuf::from);
        let dir = match &from_env {
            Some(dir) => dir.clone(),
            None => {
                let out = Command::new(build_script())
                    .arg("--print-bin-dir")
                    .output()
                    .with_context(|| {
                        format!("running {} --print-bin-dir", build_script().display())
                    })?;
                if !out.status.success() {
                    bail!(
                        "{} --print-bin-dir failed: {}",
                        build_script().display(),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            }
        };
        if from_env.is_none() {
            let stamp = dir
                .parent()
                .map(|p| p.join(".build-complete"))
                .unwrap_or_default();
            if !stamp.is_file() {
                bail!(
                    "the control-plane build is not complete ({} missing); {}",
                    stamp.display(),
                    how_to_build()
                );
            }
        }
        let find = |name: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                bail!("missing {}; {}", p.display(), how_to_build())
            }
        };
        let kwok_stages = match std::env::var_os(KWOK_STAGES_ENV) {
            Some(p) => PathBuf::from(p),
            None => dir
                .parent()
                .map(|p| p.join("kwok-stages/all.yaml"))
                .unwrap_or_default(),
        };
        if !kwok_stages.is_file() {
            bail!(
                "missing kwok stage configs {}; {}",
                kwok_stages.display(),
                how_to_build()
            );
        }
        Ok(Self {
            etcd: find("etcd")?,
            kube_apiserver: find("kube-apiserver")?,
            kube_controller_manager: find("kube-controller-manager")?,
            kube_scheduler: find("kube-scheduler")?,
            kwok: find("kwok")?,
            kwok_stages,
            dir,
        })
    }
}

//! `flwr` on the host, as a user runs it: a venv's `flwr` with `FLWR_HOME` holding the
//! connection `flower-hub connect` wrote, `flwr run … --format json`, then `flwr ls --run-id`
//! until the run finishes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde_json::Value;

use crate::harness::Wait;

/// The environment every Flower-side process of the tests gets (no telemetry, no update check).
pub fn flower_env(cmd: &mut Command) {
    cmd.env("FLWR_TELEMETRY_ENABLED", "0")
        .env("FLWR_DISABLE_UPDATE_CHECK", "1")
        .env("RUST_LOG", "info");
}

/// The JSON object in a `flwr … --format json` output (flwr may print lines before it).
pub fn json_of(stdout: &[u8]) -> Result<Value> {
    let text = String::from_utf8_lossy(stdout);
    let start = text
        .find('{')
        .ok_or_else(|| anyhow!("no JSON in: {text}"))?;
    serde_json::from_str(&text[start..]).with_context(|| format!("bad JSON: {text}"))
}

/// `flwr` of a venv, run in `cwd` with `FLWR_HOME=home`.
#[derive(Clone, Debug)]
pub struct HostFlwr {
    /// The venv (`e2e/flower/venv.sh`).
    pub venv: PathBuf,
    /// `FLWR_HOME` (its `config.toml` holds the SuperLink connections).
    pub home: PathBuf,
    /// Working directory.
    pub cwd: PathBuf,
    /// Flower ≤ 1.25: connections live in the app's `pyproject.toml`, so `flwr ls` and
    /// `flwr log` take the app directory before the federation.
    pub app_connections: bool,
}

impl HostFlwr {
    /// Runs `flwr args…` to completion.
    pub fn command(&self, args: &[&str]) -> Result<Output> {
        let path = format!(
            "{}:{}",
            self.venv.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new(self.venv.join("bin/flwr"));
        cmd.args(args)
            .current_dir(&self.cwd)
            .env("FLWR_HOME", &self.home)
            .env("PATH", path)
            .stdin(Stdio::null());
        flower_env(&mut cmd);
        Ok(cmd.output()?)
    }

    /// `flwr run app federation` (2 rounds, `min_nodes`), judged by `flwr ls` reaching
    /// `finished:completed`; `detail` is added to a timeout's error. Returns the run id.
    pub fn run_to_completion(
        &self,
        app: &Path,
        federation: &str,
        min_nodes: u64,
        detail: impl Fn() -> String,
    ) -> Result<String> {
        let config = format!("num-server-rounds=2 min-nodes={min_nodes}");
        self.run_with_config(app, federation, &config, detail)
    }

    /// `flwr run app federation --run-config config`, judged by `flwr ls` reaching
    /// `finished:completed`; `detail` is added to a timeout's error. Returns the run id.
    pub fn run_with_config(
        &self,
        app: &Path,
        federation: &str,
        config: &str,
        detail: impl Fn() -> String,
    ) -> Result<String> {
        let app_s = app.display().to_string();
        // A SuperLink that was just (re)started may not listen yet: retry only that error.
        let args = [
            "run",
            &app_s,
            federation,
            "--run-config",
            config,
            "--format",
            "json",
        ];
        let v = Wait::new("flwr run to reach the SuperLink", Duration::from_secs(60))
            .detail(&detail)
            .for_value_blocking(|| {
                let out = self.command(&args)?;
                let v = json_of(&out.stdout).with_context(|| {
                    format!("flwr run: {}", String::from_utf8_lossy(&out.stderr))
                })?;
                let unavailable = v["error-message"]
                    .as_str()
                    .is_some_and(|m| m.contains("Connection to the SuperLink is unavailable"));
                if unavailable {
                    std::thread::sleep(Duration::from_secs(1));
                    return Ok(None);
                }
                Ok(Some(v))
            })?;
        ensure!(v["success"] == true, "flwr run failed: {v}");
        let run_id = match &v["run-id"] {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => bail!("no run-id in {other}"),
        };
        let status = Wait::new(format!("run {run_id} to finish"), Duration::from_secs(180))
            .detail(&detail)
            .for_value_blocking(|| {
                let mut args = vec!["ls", federation, "--run-id", &run_id, "--format", "json"];
                if self.app_connections {
                    args.insert(1, &app_s);
                }
                let out = self.command(&args)?;
                let v = json_of(&out.stdout)?;
                let run = &v["runs"][0];
                let st = run["status"].as_str().unwrap_or_default().to_owned();
                std::thread::sleep(Duration::from_secs(1));
                Ok(st
                    .starts_with("finished:")
                    .then(|| (st, run["status-details"].clone())))
            })?;
        if status.0 != "finished:completed" {
            let mut args = vec!["log", &run_id, federation, "--show"];
            if self.app_connections {
                args.insert(2, &app_s);
            }
            let log = self.command(&args)?;
            bail!(
                "run {run_id} ended {} ({}):\n{}",
                status.0,
                status.1,
                String::from_utf8_lossy(&log.stdout)
            );
        }
        Ok(run_id)
    }
}

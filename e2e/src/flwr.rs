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
        let outcome = self.follow(&app_s, federation, &run_id, &RunLimits::default());
        match outcome {
            Ok(Followed::Completed) => Ok(run_id),
            Ok(Followed::Ended { status, details }) => {
                let log = self.log(&app_s, federation, &run_id);
                bail!("run {run_id} ended {status} ({details}):\n{log}")
            }
            Ok(Followed::Stalled {
                status,
                rounds,
                quiet,
            }) => {
                // A run that stopped progressing is stopped, so that a retry starts on SuperNodes
                // that no longer serve it.
                let stopped = self.stop(&app_s, federation, &run_id);
                let log = self.log(&app_s, federation, &run_id);
                bail!(
                    "run {run_id} made no progress for {:.0}s (status {status}, {rounds} round(s) done; stopped: {stopped}){}\n{log}",
                    quiet.as_secs_f64(),
                    detail_of(&detail)
                )
            }
            Err(e) => Err(e.context(detail_of(&detail))),
        }
    }

    /// Follows run `run_id` until it finishes or stops progressing: its status (`flwr ls`, every
    /// [`RunLimits::status_every`]) and the rounds the example ServerApp reports (`flwr log`, every
    /// [`RunLimits::log_every`] while it runs). Progress is a new status or a new round; the run
    /// is judged stalled after [`RunLimits::stall`] without any, or after [`RunLimits::cap`] in all.
    /// Each line of progress is printed with its time, so a slow run shows where its time went.
    pub fn follow(
        &self,
        app: &str,
        federation: &str,
        run_id: &str,
        limits: &RunLimits,
    ) -> Result<Followed> {
        let start = std::time::Instant::now();
        let mut last_progress = start;
        let mut last_log = start;
        let (mut status, mut rounds) = (String::new(), 0usize);
        let mut failures = 0;
        loop {
            std::thread::sleep(limits.status_every);
            let mut args = vec!["ls", federation, "--run-id", run_id, "--format", "json"];
            if self.app_connections {
                args.insert(1, app);
            }
            let listed = self
                .command(&args)
                .and_then(|out| json_of(&out.stdout))
                .and_then(|v| {
                    let run = &v["runs"][0];
                    let st = run["status"].as_str().unwrap_or_default().to_owned();
                    ensure!(!st.is_empty(), "no status for run {run_id} in {v}");
                    Ok((
                        st,
                        run["status-details"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    ))
                });
            match listed {
                Ok((st, details)) => {
                    failures = 0;
                    if st != status {
                        eprintln!(
                            "flwr: run {run_id} {st} at {:.1}s",
                            start.elapsed().as_secs_f64()
                        );
                        status = st.clone();
                        last_progress = std::time::Instant::now();
                    }
                    if st == "finished:completed" {
                        return Ok(Followed::Completed);
                    }
                    if st.starts_with("finished:") {
                        return Ok(Followed::Ended {
                            status: st,
                            details,
                        });
                    }
                }
                // A SuperLink being replaced answers nothing for a while: not progress, not
                // failure, unless it lasts.
                Err(e) => {
                    failures += 1;
                    if failures >= 20 {
                        return Err(
                            e.context(format!("flwr ls of run {run_id} failed 20 times in a row"))
                        );
                    }
                }
            }
            if status == "running" && last_log.elapsed() >= limits.log_every {
                last_log = std::time::Instant::now();
                let done = rounds_done(&self.log(app, federation, run_id));
                if done > rounds {
                    eprintln!(
                        "flwr: run {run_id} round {done} done at {:.1}s",
                        start.elapsed().as_secs_f64()
                    );
                    rounds = done;
                    last_progress = std::time::Instant::now();
                }
            }
            let quiet = last_progress.elapsed();
            if quiet >= limits.stall || start.elapsed() >= limits.cap {
                return Ok(Followed::Stalled {
                    status,
                    rounds,
                    quiet,
                });
            }
        }
    }

    /// The ServerApp log of run `run_id` so far (`flwr log --show`), or why it could not be read.
    pub fn log(&self, app: &str, federation: &str, run_id: &str) -> String {
        let mut args = vec!["log", run_id, federation, "--show"];
        if self.app_connections {
            args.insert(2, app);
        }
        match self.command(&args) {
            Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
            Err(e) => format!("(flwr log failed: {e:#})"),
        }
    }

    /// `flwr stop run_id`: what it said, for the error message.
    pub fn stop(&self, app: &str, federation: &str, run_id: &str) -> String {
        let mut args = vec!["stop", run_id, federation];
        if self.app_connections {
            args.insert(2, app);
        }
        match self.command(&args) {
            Ok(out) if out.status.success() => "yes".into(),
            Ok(out) => format!(
                "no ({})",
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .lines()
                    .last()
                    .unwrap_or_default()
            ),
            Err(e) => format!("no ({e:#})"),
        }
    }
}

/// How long [`HostFlwr::follow`] waits.
#[derive(Clone, Debug)]
pub struct RunLimits {
    /// Longest time without a new status or round before the run counts as stalled. A round of
    /// the example app on a loaded 2-core machine took up to ~75 s; a stuck one never ends.
    pub stall: Duration,
    /// Longest time in all.
    pub cap: Duration,
    /// How often the status is read (each `flwr` call costs ~1.3 s of CPU).
    pub status_every: Duration,
    /// How often the log is read for rounds while the run runs.
    pub log_every: Duration,
}

impl Default for RunLimits {
    fn default() -> Self {
        Self {
            stall: Duration::from_secs(180),
            cap: Duration::from_secs(900),
            status_every: Duration::from_secs(3),
            log_every: Duration::from_secs(15),
        }
    }
}

/// How a followed run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Followed {
    /// `finished:completed`.
    Completed,
    /// Another `finished:…` status, with Flower's details.
    Ended { status: String, details: String },
    /// No progress for [`RunLimits::stall`] (or [`RunLimits::cap`] in all).
    Stalled {
        status: String,
        rounds: usize,
        quiet: Duration,
    },
}

/// The highest round the example ServerApp says it finished (`round N/M: …` lines).
pub fn rounds_done(log: &str) -> usize {
    log.lines()
        .filter_map(|l| {
            let rest = &l[l.find("round ")? + "round ".len()..];
            let (n, tail) = rest.split_once('/')?;
            tail.contains(": replies=")
                .then(|| n.trim().parse::<usize>().ok())?
        })
        .max()
        .unwrap_or(0)
}

fn detail_of(detail: &impl Fn() -> String) -> String {
    let d = detail();
    if d.is_empty() { d } else { format!("\n{d}") }
}

#[cfg(test)]
mod tests {
    use super::rounds_done;

    #[test]
    fn rounds_are_read_from_the_example_server_apps_lines() {
        let log = "INFO : Starting\nround 1/3: replies=2 nodes=2 loss=0.51\nsome round 9 text\nround 2/3: replies=2 nodes=2 loss=0.2\n";
        assert_eq!(rounds_done(log), 2);
        assert_eq!(rounds_done(""), 0);
        assert_eq!(rounds_done("round x/3: replies=1"), 0);
    }
}

//! `--log-format json`: the real `flower-hub serve` writes one JSON object per log line, with the
//! fields log collectors index (timestamp, level, target, message, the event's own fields).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn serve_logs_one_json_object_per_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_flower-hub"))
        .args([
            "--log-format",
            "json",
            "serve",
            "--standalone",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--state-dir")
        .arg(dir.path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start flower-hub");
    let stderr = child.stderr.take().expect("stderr");
    let start = Instant::now();
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines() {
        let line = line.expect("stderr line");
        let listening = line.contains("work channel listening");
        lines.push(line);
        if listening || start.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        lines.iter().any(|l| l.contains("work channel listening")),
        "no start-up line: {lines:?}"
    );
    for line in &lines {
        let object: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(object.get(key).is_some(), "{key} missing: {line}");
        }
    }
    let listening: serde_json::Value = serde_json::from_str(
        lines
            .iter()
            .find(|l| l.contains("work channel listening"))
            .expect("line"),
    )
    .expect("json");
    assert_eq!(listening["level"], "INFO");
    assert!(
        listening["ca_hash"]
            .as_str()
            .is_some_and(|h| h.starts_with("sha256:")),
        "event fields are top-level keys: {listening}"
    );
}

//! The real `flower-hub` binary on a standalone state directory: `token create --ttl` limits,
//! `token list` on stored values it cannot show, and printing into a pipe that closed early.

use std::path::Path;
use std::process::{Command, Output, Stdio};

fn hub(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flower-hub"))
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .env("RUST_LOG", "off")
        .output()
        .expect("flower-hub runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn stored_tokens(state: &Path) -> usize {
    std::fs::read_dir(state.join("tokens")).map_or(0, |d| d.count())
}

// A TTL beyond the maximum (or beyond what a duration can hold) is refused before a token is
// stored, with an error naming --ttl and the maximum; nothing panics.
#[test]
fn token_create_refuses_a_ttl_beyond_the_maximum() {
    let state = tempfile::tempdir().expect("tempdir");
    for ttl in ["3651d", "1000000000d", "999999999999999d"] {
        let out = hub(state.path(), &["token", "create", "--ttl", ttl]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--ttl {ttl}: {stderr}");
        assert!(!stderr.contains("panicked"), "--ttl {ttl}: {stderr}");
        assert!(stderr.contains("--ttl"), "--ttl {ttl}: {stderr}");
        assert!(stderr.contains("3650d"), "--ttl {ttl}: {stderr}");
        assert_eq!(stored_tokens(state.path()), 0, "--ttl {ttl} stored a token");
    }
    let out = hub(state.path(), &["token", "create", "--ttl", "3650d"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(stored_tokens(state.path()), 1);
}

// A stored expiry that no date can show (written by an older hub or by hand) is listed as
// invalid; the other tokens are still listed and `token list` exits 0.
#[test]
fn token_list_shows_an_out_of_range_expiry_as_invalid() {
    let state = tempfile::tempdir().expect("tempdir");
    let out = hub(state.path(), &["token", "create", "--ttl", "1h"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let record = serde_json::json!({
        "id": "zzzzzz",
        "secretSha256": "00",
        "createdUnix": 0,
        "expiresUnix": u64::MAX,
    });
    std::fs::write(
        state.path().join("tokens/zzzzzz.json"),
        serde_json::to_vec(&record).expect("json"),
    )
    .expect("write token");

    let out = hub(state.path(), &["token", "list"]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    let bad = lines.iter().find(|l| l.starts_with("zzzzzz")).expect("row");
    let columns: Vec<&str> = bad.split_whitespace().collect();
    assert_eq!(&columns[1..3], ["invalid", "invalid"], "{bad}");
    assert!(
        lines.iter().any(|l| l.contains(" valid ")),
        "the good token is still listed: {stdout}"
    );
}

// A printing command whose reader went away (`flower-hub … | head -1`) ends quietly instead of
// panicking on the broken pipe.
#[test]
fn printing_into_a_closed_pipe_does_not_panic() {
    let state = tempfile::tempdir().expect("tempdir");
    let state_dir = state.path().to_str().expect("utf-8 path");
    for args in [
        vec!["ca", "status", "--state-dir", state_dir],
        vec!["crds"],
        vec!["--help"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flower-hub"))
            .args(&args)
            .env("RUST_LOG", "off")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start flower-hub");
        // Closing the only reader before the first line is written makes every write fail.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("flower-hub ends");
        let stderr = text(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_ne!(out.status.code(), Some(101), "{args:?}: {stderr}");
    }
}

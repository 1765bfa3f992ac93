//! Atomic file writes, the one way the agent and the hub write state: a temporary file beside
//! the target (created new, with the final mode), fsynced, then renamed over the target, so a
//! crash leaves the old content or the new, never half of one.
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Mode of private files (keys, tokens, certificates with keys).
pub const PRIVATE: u32 = 0o600;
/// Mode of public files (CA bundles, status).
pub const PUBLIC: u32 = 0o644;

/// Writes `body` to `path` atomically with `mode`; creates the parent directory (0700 is left
/// to the caller).
pub fn write_atomic(path: &Path, body: &[u8], mode: u32) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    let tmp = temp_path(path);
    let written = write_new(&tmp, body, mode).and_then(|()| fs::rename(&tmp, path));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// [`write_atomic`] unless `path` already holds exactly `body` (no rename, no mtime change).
/// Returns whether it wrote.
pub fn write_if_changed(path: &Path, body: &[u8], mode: u32) -> std::io::Result<bool> {
    if fs::read(path).ok().as_deref() == Some(body) {
        return Ok(false);
    }
    write_atomic(path, body, mode).map(|()| true)
}

/// Writes `body` to `path` only if `path` does not exist, atomically (written beside it, then
/// hard-linked into place: the link fails when a file exists, so a racing writer never replaces
/// what someone may already trust). Returns whether this call created it.
pub fn create_new(path: &Path, body: &[u8], mode: u32) -> std::io::Result<bool> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    let tmp = temp_path(path);
    let linked = write_new(&tmp, body, mode).and_then(|()| fs::hard_link(&tmp, path));
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates `path` (which must not exist) with `mode`, writes `body` and syncs it to disk.
fn write_new(path: &Path, body: &[u8], mode: u32) -> std::io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    file.write_all(body)?;
    file.sync_all()
}

fn temp_path(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn writes_are_atomic_with_the_mode_and_leave_no_temp_file() {
        // A private file is 0600 from its first byte; rewriting the same body changes nothing.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/key");
        write_atomic(&path, b"one", PRIVATE).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"one");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(!write_if_changed(&path, b"one", PRIVATE).unwrap());
        assert!(write_if_changed(&path, b"two", PRIVATE).unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["key"]);
        // create_new never replaces.
        assert!(!create_new(&path, b"three", PRIVATE).unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert!(create_new(&dir.path().join("new"), b"n", PUBLIC).unwrap());
    }
}

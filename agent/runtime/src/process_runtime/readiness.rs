//! Whether a pool is ready: a SuperNode is when its log shows it connected since its last start
//! (read incrementally), and the pool's `Ready` condition counts those.
//!
//! The log of a long-running SuperNode grows for as long as it runs; reading all of it on every
//! status tick costs an allocation of the whole file per replica every few seconds (and leaves
//! the allocator holding that much). A [`LogScan`] reads only what was appended since its last
//! look, in small chunks, and keeps two facts: how far it has read and whether
//! [`CONNECTED_LINE`] appeared after the last [`START_MARKER`].

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::{CONNECTED_LINE, Replica, START_MARKER};
use flower_addon_proto::Condition;

/// Bytes read at a time.
const CHUNK: usize = 16 * 1024;

/// How much of one log has been read, and what it said.
#[derive(Debug, Default)]
pub(super) struct LogScan {
    /// `(device, inode)` of the file read so far: another file at the path is read afresh.
    file: Option<(u64, u64)>,
    /// Bytes of the file already read.
    offset: u64,
    /// The last bytes read (shorter than the longest pattern), where a pattern cut by a chunk
    /// boundary starts.
    carry: Vec<u8>,
    /// [`CONNECTED_LINE`] appeared after the last [`START_MARKER`] read.
    connected: bool,
}

impl LogScan {
    /// Reads what was appended to `path` since the last call; true when the text after the last
    /// [`START_MARKER`] contains [`CONNECTED_LINE`]. An unreadable file reads as not connected.
    pub(super) fn connected(&mut self, path: &Path) -> bool {
        match self.advance(path) {
            Ok(()) => self.connected,
            Err(_) => {
                *self = Self::default();
                false
            }
        }
    }

    fn advance(&mut self, path: &Path) -> std::io::Result<()> {
        let mut file = std::fs::File::open(path)?;
        let meta = file.metadata()?;
        let id = Some((meta.dev(), meta.ino()));
        // Replaced or truncated: what was read no longer describes the file.
        if self.file != id || meta.len() < self.offset {
            *self = Self {
                file: id,
                ..Self::default()
            };
        }
        file.seek(SeekFrom::Start(self.offset))?;
        let mut chunk = vec![0u8; CHUNK];
        loop {
            let n = file.read(&mut chunk)?;
            if n == 0 {
                return Ok(());
            }
            self.offset += n as u64;
            self.feed(&chunk[..n]);
        }
    }

    /// Takes the next bytes of the log.
    fn feed(&mut self, bytes: &[u8]) {
        let keep = START_MARKER.len().max(CONNECTED_LINE.len()) - 1;
        let carried = self.carry.len();
        let mut window = std::mem::take(&mut self.carry);
        window.extend_from_slice(bytes);
        // Events in file order; one ending inside the carry was seen by the previous call.
        let mut events: Vec<(usize, bool)> = find_all(&window, START_MARKER.as_bytes())
            .map(|end| (end, false))
            .chain(find_all(&window, CONNECTED_LINE.as_bytes()).map(|end| (end, true)))
            .filter(|(end, _)| *end > carried)
            .collect();
        events.sort_unstable();
        if let Some((_, connected)) = events.last() {
            self.connected = *connected;
        }
        let tail = window.len().saturating_sub(keep);
        window.drain(..tail);
        self.carry = window;
    }
}

/// End offsets of every occurrence of `needle` in `haystack`.
fn find_all<'a>(haystack: &'a [u8], needle: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
    haystack
        .windows(needle.len())
        .enumerate()
        .filter(move |(_, w)| *w == needle)
        .map(move |(i, _)| i + needle.len())
}

/// The pool's `Ready` condition from its replicas (a not-ready one's last exit as the reason).
pub(super) fn ready_condition(
    ready: u32,
    desired: u32,
    replicas: &[&Replica],
    unenforced: &[&str],
) -> Condition {
    // Resource limits the pool asks for are not dropped silently: every message says so.
    let note = if unenforced.is_empty() {
        String::new()
    } else {
        format!(
            "; {} not enforced by the process runtime",
            unenforced.join(" and ")
        )
    };
    if ready >= desired {
        return Condition {
            r#type: "Ready".into(),
            status: "True".into(),
            reason: "SuperNodesConnected".into(),
            message: format!("{ready}/{desired} SuperNodes connected{note}"),
        };
    }
    let detail = replicas
        .iter()
        .filter(|r| !replica_ready(r))
        .filter_map(|r| {
            r.supernode
                .state()
                .last_exit
                .map(|e| format!("last exit: {e}"))
        })
        .next()
        .unwrap_or_else(|| "waiting for the SuperLink connection".into());
    Condition {
        r#type: "Ready".into(),
        status: "False".into(),
        reason: "SuperNodesNotConnected".into(),
        message: format!("{ready}/{desired} SuperNodes connected; {detail}{note}"),
    }
}

pub(super) fn replica_ready(replica: &Replica) -> bool {
    if replica.supernode.state().pid.is_none() {
        return false;
    }
    // Only what was appended since the last look is read: a SuperNode's log grows as it runs.
    let mut scan = replica.log_scan.lock().unwrap_or_else(|poisoned| {
        let mut scan = poisoned.into_inner();
        *scan = LogScan::default();
        scan
    });
    scan.connected(&replica.log_file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// What the whole-file rule says: the text after the last marker holds the connected line.
    fn whole_file_rule(text: &str) -> bool {
        text.rsplit(START_MARKER)
            .next()
            .unwrap_or("")
            .contains(CONNECTED_LINE)
    }

    fn append(path: &Path, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn incremental_reading_agrees_with_reading_the_whole_file() {
        // Invariant: appending a log piece by piece (cut anywhere, even inside a pattern) gives
        // the same readiness as reading the whole log at once, after every piece.
        let marker = format!("{START_MARKER}\n");
        let log = |padding: usize| {
            format!(
                "{marker}INFO starting\nINFO {CONNECTED_LINE}123\n{marker}WARN lost\n{}\nINFO {CONNECTED_LINE}456\nINFO round 1\n{marker}",
                "x".repeat(padding)
            )
        };
        // Small steps on a short log, large ones across several chunks.
        for (step, log) in [1, 3, 7, 13]
            .map(|step| (step, log(10)))
            .into_iter()
            .chain([64, 1000, CHUNK + 5].map(|step| (step, log(3 * CHUNK + 7))))
        {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("s.log");
            let mut scan = LogScan::default();
            let mut written = String::new();
            for piece in log.as_bytes().chunks(step) {
                let piece = std::str::from_utf8(piece).unwrap();
                append(&path, piece);
                written.push_str(piece);
                assert_eq!(
                    scan.connected(&path),
                    whole_file_rule(&written),
                    "step {step}, after {} bytes",
                    written.len()
                );
            }
        }
    }

    #[test]
    fn a_replaced_or_truncated_log_is_read_afresh() {
        // Invariant: a log rotated away or truncated is not judged by what the old one said.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.log");
        let mut scan = LogScan::default();
        append(&path, &format!("{START_MARKER}\n{CONNECTED_LINE}1\n"));
        assert!(scan.connected(&path));
        std::fs::write(&path, format!("{START_MARKER}\n")).unwrap();
        assert!(!scan.connected(&path));
        std::fs::remove_file(&path).unwrap();
        assert!(!scan.connected(&path));
        append(&path, &format!("{START_MARKER}\nINFO {CONNECTED_LINE}2\n"));
        assert!(scan.connected(&path));
    }
}

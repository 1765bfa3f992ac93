//! Why a SuperLink fails the hub's calls. Flower answers an unexpected failure (its SQLite
//! database full, a disk error) with a bare "Internal server error" and writes the cause to its
//! own log only (`[<path>][UnexpectedError:<type>] <message>`); its SuperNodes then fail their
//! heartbeats and drop offline without a word either. So when the hub's Control calls fail that
//! way, or SuperNodes the SuperLink holds drop offline, the hub reads what the SuperLink logged
//! since it last looked ([`SuperLinkLog`]: the process's log file in standalone mode, the
//! container's log in Kubernetes mode) and names the cause and its fix ([`SuperLinkFault`]),
//! in the Federation's status both modes write alike.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

/// The most of a SuperLink's log read at a time (its last bytes).
pub const LOG_WINDOW: u64 = 64 * 1024;

/// Reads what a SuperLink logged since the last read.
pub trait SuperLinkLog: Send + Sync {
    /// The log written since the previous call, at most [`LOG_WINDOW`] bytes of its end (the
    /// first call: the last few minutes, or the last [`LOG_WINDOW`] bytes).
    fn recent(&self) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send + '_>>;
}

/// A SuperLink's log and where its database lives, for the message of a [`SuperLinkFault`].
#[derive(Clone)]
pub struct LogSource {
    /// Where the log is read, e.g. `container superlink of pod team/fed-superlink-0`.
    pub describe: String,
    /// Where the SuperLink's database is and how to give it room (ends a storage message).
    pub storage: String,
    /// Reads it.
    pub reader: Arc<dyn SuperLinkLog>,
}

impl std::fmt::Debug for LogSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe)
    }
}

impl PartialEq for LogSource {
    fn eq(&self, other: &Self) -> bool {
        self.describe == other.describe && self.storage == other.storage
    }
}

impl Eq for LogSource {}

/// What kind of failure a SuperLink logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Its database cannot be written: the volume is full (or the disk failed).
    Storage,
    /// Anything else it did not expect.
    Unexpected,
}

/// The last unexpected failure a SuperLink logged, as the Federation's status shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperLinkFault {
    /// What kind.
    pub kind: FaultKind,
    /// The log line (without colour codes), shortened to [`MAX_LINE`] characters.
    pub line: String,
}

/// Longest log line quoted in a status message.
pub const MAX_LINE: usize = 300;

/// Messages of SQLite and the OS that mean the database's volume cannot take a write.
const STORAGE_MARKERS: &[&str] = &[
    "database or disk is full",
    "No space left on device",
    "disk I/O error",
    "Disk quota exceeded",
    "attempt to write a readonly database",
];

impl SuperLinkFault {
    /// The condition reason: `DatabaseStorageFull` or `UnexpectedError`.
    pub fn reason(&self) -> &'static str {
        match self.kind {
            FaultKind::Storage => "DatabaseStorageFull",
            FaultKind::Unexpected => "UnexpectedError",
        }
    }

    /// The condition message: what the SuperLink logged and what to do; `storage` is
    /// [`LogSource::storage`].
    pub fn message(&self, storage: &str) -> String {
        match self.kind {
            FaultKind::Storage => format!(
                "the SuperLink cannot write its database (it logged: {}); SuperNodes cannot \
                 register or heartbeat and runs cannot start until it can. {storage}; the \
                 SuperLink recovers by itself once the volume has room (nothing is restarted \
                 or re-placed meanwhile)",
                self.line
            ),
            FaultKind::Unexpected => format!(
                "the SuperLink fails calls with an unexpected error (it logged: {}); its log has \
                 the traceback. The hub retries; if it persists, restart the SuperLink or report \
                 it to Flower",
                self.line
            ),
        }
    }
}

/// The last unexpected failure in `log` (Flower's `[…][UnexpectedError:…]` lines, and
/// Python's `sqlite3.OperationalError`/`OSError` lines of a traceback), if any.
pub fn last_fault(log: &str) -> Option<SuperLinkFault> {
    log.lines().rev().find_map(|raw| {
        let line = strip_ansi(raw);
        let unexpected = line.contains("UnexpectedError:")
            || line.contains("Exception calling application")
            || line.contains("sqlite3.OperationalError")
            || line.contains("OSError: [Errno 28]");
        if !unexpected {
            return None;
        }
        let kind = if STORAGE_MARKERS.iter().any(|m| line.contains(m)) {
            FaultKind::Storage
        } else {
            FaultKind::Unexpected
        };
        let trimmed = line.trim();
        let mut text: String = trimmed.chars().take(MAX_LINE).collect();
        if trimmed.chars().count() > MAX_LINE {
            text.push('…');
        }
        Some(SuperLinkFault { kind, line: text })
    })
}

/// `line` without terminal colour codes (`ESC [ … m`), which Flower's log lines carry.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A log file a process appends to (standalone SuperLinks): each read returns what was
/// appended since the last one (the whole window again after the file shrank: rotated).
pub struct FileLog {
    path: PathBuf,
    offset: Mutex<Option<u64>>,
}

impl FileLog {
    /// The log at `path`, read from its last [`LOG_WINDOW`] bytes on the first call.
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            offset: Mutex::new(None),
        }
    }

    fn read(&self) -> Result<String, String> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file =
            std::fs::File::open(&self.path).map_err(|e| format!("{}: {e}", self.path.display()))?;
        let len = file
            .metadata()
            .map_err(|e| format!("{}: {e}", self.path.display()))?
            .len();
        let mut offset = self.offset.lock().unwrap_or_else(|p| p.into_inner());
        let from = match *offset {
            Some(o) if o <= len => o.max(len.saturating_sub(LOG_WINDOW)),
            _ => len.saturating_sub(LOG_WINDOW),
        };
        file.seek(SeekFrom::Start(from))
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        let mut bytes = Vec::new();
        file.take(len - from)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        *offset = Some(from + bytes.len() as u64);
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

impl SuperLinkLog for FileLog {
    fn recent(&self) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send + '_>> {
        Box::pin(async move { self.read() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Flower 1.42's SuperLink logged when a SuperNode registered on a full volume
    /// (measured on a 16 MiB tmpfs).
    const FULL: &str = "\u{1b}[92mINFO \u{1b}[0m:      Starting Flower SuperExec\n\
        \u{1b}[91mERROR \u{1b}[0m:     [/v1/fleet/register-node][UnexpectedError:OperationalError] (sqlite3.OperationalError) database or disk is full\n\
        (Background on this error at: https://sqlalche.me/e/21/e3q8)\n\
        2026-11-29T14:45:53.488Z INFO [uvicorn.access] 127.0.0.1:41158 - \"POST /v1/fleet/register-node HTTP/1.1\" 500\n";

    #[test]
    fn a_full_database_is_named_with_the_line_flower_logged() {
        let fault = last_fault(FULL).expect("a fault");
        assert_eq!(fault.kind, FaultKind::Storage);
        assert_eq!(fault.reason(), "DatabaseStorageFull");
        assert_eq!(
            fault.line,
            "ERROR :     [/v1/fleet/register-node][UnexpectedError:OperationalError] (sqlite3.OperationalError) database or disk is full"
        );
        let message = fault.message("expand claim superlink-state-fed-superlink-0");
        assert!(message.contains("database or disk is full"), "{message}");
        assert!(
            message.contains("expand claim superlink-state-fed-superlink-0"),
            "{message}"
        );
    }

    #[test]
    fn other_unexpected_errors_are_named_as_such_and_ordinary_lines_are_not_faults() {
        let log = "ERROR : [/v1/control/start-run][UnexpectedError:KeyError] 'fab'\nINFO : fine\n";
        let fault = last_fault(log).expect("a fault");
        assert_eq!(fault.kind, FaultKind::Unexpected);
        assert!(fault.message("unused").contains("'fab'"));
        assert_eq!(
            last_fault("INFO : Starting Flower SuperLink\nWARNING : insecure\n"),
            None
        );
        assert_eq!(last_fault(""), None);
        // The last fault wins; a long line is shortened.
        let long = format!(
            "x [UnexpectedError:OperationalError] disk I/O error\ny [UnexpectedError:E] {}",
            "z".repeat(1000)
        );
        let fault = last_fault(&long).expect("a fault");
        assert_eq!(fault.kind, FaultKind::Unexpected);
        assert_eq!(fault.line.chars().count(), MAX_LINE + 1);
    }

    #[test]
    fn a_file_log_returns_what_was_appended_since_the_last_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("superlink.log");
        std::fs::write(&path, "old line\n").expect("write");
        let log = FileLog::new(path.clone());
        assert_eq!(log.read().expect("read"), "old line\n");
        assert_eq!(log.read().expect("read"), "");
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        f.write_all(FULL.as_bytes()).expect("append");
        let recent = log.read().expect("read");
        assert_eq!(recent, FULL);
        assert!(last_fault(&recent).is_some());
        // Rotated (shorter than what was read): read again from its start.
        std::fs::write(&path, "fresh\n").expect("write");
        assert_eq!(log.read().expect("read"), "fresh\n");
        // Gone: an error naming the file.
        std::fs::remove_file(&path).expect("remove");
        assert!(log.read().unwrap_err().contains("superlink.log"));
    }
}

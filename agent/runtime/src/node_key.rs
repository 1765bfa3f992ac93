//! SuperNode authentication keys, made where the SuperNode runs and never sent anywhere: one
//! OpenSSH EC P-384 private key per SuperNode (Flower refuses RSA and PKCS#8; see e2e/flower/NOTES.md), of
//! which only the public line (`ecdsa-sha2-nistp384 …`) goes to the hub, which registers it with
//! the SuperLink. The process runtime keeps each key in a file, the Kubernetes runtime in a
//! Secret per pool; both make and read keys here.
use std::path::Path;

use ssh_key::{Algorithm, EcdsaCurve, LineEnding, PrivateKey, rand_core::OsRng};

/// Why a node key cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum NodeKeyError {
    /// The key generator failed.
    #[error("cannot create a node key: {0}")]
    Generate(ssh_key::Error),
    /// A key could not be encoded in OpenSSH format.
    #[error("cannot encode a node key: {0}")]
    Encode(ssh_key::Error),
    /// Stored text is not an OpenSSH private key.
    #[error("{what}: not an OpenSSH private key: {source}")]
    Parse {
        /// Where the text came from (a file, a Secret's data key).
        what: String,
        /// The parser's error.
        source: ssh_key::Error,
    },
    /// A key file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A node key: the OpenSSH private key text and its one-line public key.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeKey {
    /// `-----BEGIN OPENSSH PRIVATE KEY-----…` (LF line endings).
    pub private_openssh: String,
    /// `ecdsa-sha2-nistp384 AAAA…` (no comment, no newline).
    pub public_openssh: String,
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeKey")
            .field("public_openssh", &self.public_openssh)
            .finish_non_exhaustive()
    }
}

/// Makes a new OpenSSH EC P-384 key pair.
pub fn generate_node_key() -> Result<NodeKey, NodeKeyError> {
    let key = PrivateKey::random(
        &mut OsRng,
        Algorithm::Ecdsa {
            curve: EcdsaCurve::NistP384,
        },
    )
    .map_err(NodeKeyError::Generate)?;
    let private_openssh = key
        .to_openssh(LineEnding::LF)
        .map_err(NodeKeyError::Encode)?
        .to_string();
    Ok(NodeKey {
        public_openssh: public_line(&key)?,
        private_openssh,
    })
}

/// The public key line of the OpenSSH private key `text`; `what` names where it came from in
/// the error.
pub fn public_key_of(text: &str, what: &str) -> Result<String, NodeKeyError> {
    let key = PrivateKey::from_openssh(text).map_err(|source| NodeKeyError::Parse {
        what: what.to_owned(),
        source,
    })?;
    public_line(&key)
}

fn public_line(key: &PrivateKey) -> Result<String, NodeKeyError> {
    key.public_key().to_openssh().map_err(NodeKeyError::Encode)
}

/// `<algorithm> <base64>` of an OpenSSH public key line: two lines name the same key when these
/// agree (a comment or surrounding whitespace does not count).
pub fn key_body(line: &str) -> &str {
    let line = line.trim();
    let mut ends = line.match_indices(char::is_whitespace).map(|(i, _)| i);
    match (ends.next(), ends.next()) {
        (Some(_), Some(second)) => &line[..second],
        _ => line,
    }
}

/// Removes the key at `path` (and its `.pub`) when its public key is in `retired` (keys the
/// SuperLink refuses for ever: unregistered once, and Flower never takes a key back), so
/// [`ensure_node_key`] makes a new one. A key that cannot be read is left for
/// `ensure_node_key` to report.
pub fn retire_node_key(path: &Path, retired: &[String]) {
    if retired.is_empty() {
        return;
    }
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let Ok(public) = public_key_of(&text, &path.display().to_string()) else {
        return;
    };
    if retired.iter().any(|r| key_body(r) == key_body(&public)) {
        tracing::info!(key = %path.display(), "the SuperLink will not take this SuperNode's key back (unregistered before): making a new one");
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(path.with_extension("key.pub"));
    }
}

/// What the agent says when SuperNode key `path` was deleted while its public half stayed: the
/// process runtime's counterpart of the Kubernetes runtime's `NodeKeysRecreated` event.
pub fn lost_key_message(path: &Path) -> String {
    format!(
        "the SuperNode key {} was deleted: made a new one. This SuperNode waits until the hub has \
         registered the new key with the SuperLink, which forgets the old one (its runs lose it). \
         The key is the SuperNode's identity: leave the agent's state directory to the agent.",
        path.display()
    )
}

/// Creates the key file `path` (0600, atomically) unless it exists, writes its public key to
/// `<path>.pub` and returns the public key line. An existing key is read, never replaced.
pub fn ensure_node_key(path: &Path) -> Result<String, NodeKeyError> {
    let io = |source| NodeKeyError::Io {
        path: path.display().to_string(),
        source,
    };
    let pub_path = path.with_extension("key.pub");
    let public = if path.exists() {
        let text = std::fs::read_to_string(path).map_err(io)?;
        public_key_of(&text, &path.display().to_string())?
    } else {
        if pub_path.exists() {
            // Its public half outlived it: the key was deleted, not never made.
            tracing::warn!(key = %path.display(), "{}", lost_key_message(path));
        }
        let key = generate_node_key()?;
        crate::files::write_atomic(path, key.private_openssh.as_bytes(), crate::files::PRIVATE)
            .map_err(io)?;
        key.public_openssh
    };
    crate::files::write_if_changed(
        &pub_path,
        format!("{public}\n").as_bytes(),
        crate::files::PUBLIC,
    )
    .map_err(|source| NodeKeyError::Io {
        path: pub_path.display().to_string(),
        source,
    })?;
    Ok(public)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_reads_back_to_the_same_public_key() {
        // The Kubernetes runtime reports the public key of what it stored, so both must agree.
        let key = generate_node_key().unwrap();
        assert!(
            key.public_openssh.starts_with("ecdsa-sha2-nistp384 "),
            "{key:?}"
        );
        assert!(
            key.private_openssh
                .starts_with("-----BEGIN OPENSSH PRIVATE KEY-----")
        );
        assert_eq!(
            public_key_of(&key.private_openssh, "x").unwrap(),
            key.public_openssh
        );
        assert_ne!(generate_node_key().unwrap(), key);
    }

    /// Runs `f` with the log going to a buffer; returns its result and what it logged.
    fn logged<T>(f: impl FnOnce() -> T) -> (T, String) {
        #[derive(Clone, Default)]
        struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let out = tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8_lossy(&buffer.0.lock().unwrap()).into_owned();
        (out, text)
    }

    #[test]
    fn a_deleted_key_whose_public_half_stayed_is_made_anew_and_said() {
        // The process runtime's side of a lost key: a key file deleted behind the agent's back
        // (its .pub stayed) is made anew and the agent says so; a kept key and a key retired on
        // purpose (both halves removed) are not reported as lost.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/pool-0.key");
        let (first, log) = logged(|| ensure_node_key(&path).unwrap());
        assert!(!log.contains("was deleted"), "{log}");
        let (kept, log) = logged(|| ensure_node_key(&path).unwrap());
        assert_eq!(kept, first);
        assert!(!log.contains("was deleted"), "{log}");
        std::fs::remove_file(&path).unwrap();
        let (second, log) = logged(|| ensure_node_key(&path).unwrap());
        assert_ne!(key_body(&second), key_body(&first));
        assert!(log.contains(&lost_key_message(&path)), "{log}");
        retire_node_key(&path, std::slice::from_ref(&second));
        let (_, log) = logged(|| ensure_node_key(&path).unwrap());
        assert!(!log.contains("was deleted"), "{log}");
    }

    #[test]
    fn a_retired_key_file_is_replaced_and_others_are_kept() {
        // The process runtime's side of retired keys: the listed key (with a comment, as the
        // hub may send it) makes way for a new one; an unrelated retired key changes nothing.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/pool-0.key");
        let first = ensure_node_key(&path).unwrap();
        let other = generate_node_key().unwrap().public_openssh;
        retire_node_key(&path, std::slice::from_ref(&other));
        assert_eq!(ensure_node_key(&path).unwrap(), first);
        retire_node_key(&path, &[format!("{first} pool-0\n")]);
        assert!(!path.exists());
        let second = ensure_node_key(&path).unwrap();
        assert_ne!(key_body(&second), key_body(&first));
        assert_eq!(
            std::fs::read_to_string(path.with_extension("key.pub")).unwrap(),
            format!("{second}\n")
        );
    }

    #[test]
    fn a_corrupt_key_is_named_in_the_error() {
        // A damaged stored key is refused (never silently replaced), saying where it is.
        let err = public_key_of("garbage", "Secret ns/s data key p-0").unwrap_err();
        assert!(
            err.to_string().contains("Secret ns/s data key p-0"),
            "{err}"
        );
        assert!(!format!("{:?}", generate_node_key().unwrap()).contains("PRIVATE"));
    }
}

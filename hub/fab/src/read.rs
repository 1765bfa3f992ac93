//! Checking a FAB the hub is given, before it reaches a SuperLink: what Flower's SuperLink
//! checks at `StartRun` (size, `get_fab_config`: pyproject.toml and `validate_config`) and what
//! its installer checks when the run starts (`install_from_fab`: safe paths, `.info/CONTENT`
//! hashes), plus what Flower leaves unchecked but would break on (sizes in the manifest,
//! unlisted entries).

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

use super::build::{MANIFEST, PYPROJECT};
use super::pathspec::py_isspace;
use super::pyproject::App;
use super::zip::{self, ZipError};
use super::{FAB_MAX_SIZE, Fab, FabError, is_plain_relative};

/// How much a FAB may unpack to. `flwr build` stores entries, so a FAB unpacks to less than its
/// size; a hand-zipped, deflated FAB is allowed ten times that.
const MAX_UNPACKED: u64 = 10 * FAB_MAX_SIZE as u64;

/// Reads and checks a FAB: at most [`FAB_MAX_SIZE`], a zip of safe relative paths, a valid
/// pyproject.toml, and a `.info/CONTENT` manifest that lists every entry with its sha256 and size
/// in bits (FABs of Flower ≤ 1.25 do not list pyproject.toml; that is accepted).
pub fn read(bytes: &[u8]) -> Result<Fab, FabError> {
    if bytes.len() > FAB_MAX_SIZE {
        return Err(FabError::TooLarge { size: bytes.len() });
    }
    let entries = zip::read(bytes, MAX_UNPACKED).map_err(|e| match e {
        ZipError::Archive(reason) => FabError::NotZip { reason },
        ZipError::Entry { name, reason } => FabError::Entry { name, reason },
    })?;
    let mut files: BTreeMap<&str, &[u8]> = BTreeMap::new();
    for entry in &entries {
        let name = entry.name.as_str();
        let path = name.strip_suffix('/').unwrap_or(name);
        if !is_plain_relative(path) {
            return Err(FabError::BadPath {
                path: name.to_owned(),
                reason: "in the FAB is not a plain relative path (absolute, `..`, `.`, empty parts or backslashes), which Flower refuses to install: rebuild the FAB with `flwr build`",
            });
        }
        if name.ends_with('/') {
            continue;
        }
        if files.insert(name, &entry.data).is_some() {
            return Err(FabError::DuplicateEntry {
                path: name.to_owned(),
            });
        }
    }
    let pyproject = files
        .get(PYPROJECT)
        .ok_or(FabError::PyprojectMissing { place: "FAB" })?;
    let app = App::parse(pyproject, false)?;
    check_manifest(&files)?;
    Ok(Fab {
        bytes: bytes.to_vec(),
        hash: hex::encode(Sha256::digest(bytes)),
        fab_id: app.fab_id(),
        version: app.version.clone(),
        config: app.config,
    })
}

/// `.info/CONTENT`: one `path,sha256,bits` line per file, each matching its entry, and every
/// entry listed (but other `.info/` files, which Flower deletes before installing, and
/// pyproject.toml, which Flower ≤ 1.25 did not list).
fn check_manifest(files: &BTreeMap<&str, &[u8]>) -> Result<(), FabError> {
    let manifest = files.get(MANIFEST).ok_or(FabError::NoManifest)?;
    let text = std::str::from_utf8(manifest).map_err(|_| FabError::Manifest {
        reason: "is not UTF-8 text".to_owned(),
    })?;
    // Flower reads it as text (universal newlines) and strips it.
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    let text = text.trim_matches(py_isspace);
    if text.is_empty() {
        return Err(FabError::Manifest {
            reason: "is empty".to_owned(),
        });
    }
    let mut listed = BTreeSet::new();
    for line in text.split('\n') {
        let fields: Vec<&str> = line.split(',').collect();
        let [path, sha256, bits] = fields.as_slice() else {
            return Err(FabError::Manifest {
                reason: format!("has a line that is not `path,sha256,bits`: `{line}`"),
            });
        };
        if !listed.insert(*path) {
            return Err(FabError::Manifest {
                reason: format!("lists `{path}` twice"),
            });
        }
        let Some(data) = files.get(path) else {
            return Err(FabError::ManifestMismatch {
                path: (*path).to_owned(),
                reason: "listed but not in the archive".to_owned(),
            });
        };
        let actual = hex::encode(Sha256::digest(data));
        if *sha256 != actual {
            return Err(FabError::ManifestMismatch {
                path: (*path).to_owned(),
                reason: format!("sha256 {actual}, listed {sha256}"),
            });
        }
        let size_bits = data.len() as u64 * 8;
        if bits.parse::<u64>().ok() != Some(size_bits) {
            return Err(FabError::ManifestMismatch {
                path: (*path).to_owned(),
                reason: format!("{size_bits} bits, listed {bits}"),
            });
        }
    }
    for path in files.keys() {
        if !listed.contains(path) && *path != PYPROJECT && !path.starts_with(".info/") {
            return Err(FabError::Unlisted {
                path: (*path).to_owned(),
            });
        }
    }
    Ok(())
}

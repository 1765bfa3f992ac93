//! Run outputs: the files a FlowerRun's ServerApp writes under `<root>/<namespace>/<run>/`.
//!
//! After a run the hub lists them into the FlowerRun's status ([`list_dir`]) and
//! `flower-hub run fetch` copies them out: from the hub's state directory in standalone mode
//! ([`copy_verified`]), or in Kubernetes from the SuperLink pod's read-only `outputs-server`
//! sidecar ([`serve`]), which listens on the pod's loopback only and is reached through a
//! port-forward with the caller's own credentials ([`list_via_api`], [`download_via_api`]).
//!
//! The directory is written by the ServerApp, user code, so nothing in it is trusted: files are
//! opened one path component at a time with `O_NOFOLLOW` (a symlink never leads out of the run's
//! directory, not even one swapped in while a request is served), only regular files are listed
//! or served, and every copy is checked against the listed size and SHA-256 before it takes its
//! name.
mod client;
mod server;

pub use client::{download_via_api, list_via_api};
pub use server::serve;

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use flower_addon_crds::run::RunOutput;
use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag};
use sha2::{Digest, Sha256};
mod copy;
pub use copy::copy_verified;
use copy::{Verify, destination};

/// The SuperLink pod's outputs sidecar port and mount, as the pod is rendered.
pub use crate::core::render::{OUTPUTS_MOUNT_DIR, OUTPUTS_PORT};
/// Files one run may output; a listing with more is an error.
pub const MAX_FILES: usize = 1000;
/// Directory nesting below a run's directory that a listing follows.
const MAX_DEPTH: usize = 32;
/// Read and write size when hashing and copying.
const CHUNK: usize = 64 * 1024;

/// Why outputs could not be listed, served or copied.
#[derive(Debug, thiserror::Error)]
pub enum OutputsError {
    /// The run's files add up to more than the Federation's `spec.outputs.sizeLimit`: neither
    /// listed nor fetched (no file is read past the limit).
    #[error("{message}")]
    OverQuota {
        /// What is over and what to do.
        message: String,
    },
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A symlink where a file or directory was expected; outputs never follow one.
    #[error(
        "{} is a symbolic link, and outputs never follow symbolic links: write the file itself there",
        path.display()
    )]
    Symlink {
        /// The link.
        path: PathBuf,
    },
    /// A run's directory holds more files than [`MAX_FILES`].
    #[error(
        "{} holds {count} files, more than the {limit} a run may output: have the ServerApp write fewer files (an archive of them, say)",
        dir.display()
    )]
    TooManyFiles {
        /// The run's directory.
        dir: PathBuf,
        /// How many regular files it holds.
        count: usize,
        /// [`MAX_FILES`].
        limit: usize,
    },
    /// Directories nested deeper than a listing follows.
    #[error(
        "{} is nested more than {MAX_DEPTH} directories deep: have the ServerApp write a flatter tree",
        path.display()
    )]
    TooDeep {
        /// The directory past the limit.
        path: PathBuf,
    },
    /// A file name an output path cannot carry.
    #[error(
        "output {path:?} {why}: have the ServerApp name its files in UTF-8 without backslashes"
    )]
    BadName {
        /// The path relative to the run's directory (lossy when not UTF-8).
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An output path (from a listing or a request) that could leave its directory.
    #[error(
        "output path {path:?} refused: {why} (an output path is relative and '/'-separated, without empty, '.' or '..' segments, backslashes or NUL)"
    )]
    BadPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A listed file that no longer exists.
    #[error(
        "output {path} is listed but no longer exists in {}: it was removed after the run's listing was taken",
        dir.display()
    )]
    Missing {
        /// Its path relative to the run's directory.
        path: String,
        /// Where it was looked for (a directory, or a pod's sidecar).
        dir: PathBuf,
    },
    /// A file whose bytes differ from its listing (partial copies are removed).
    #[error(
        "output {path} changed since it was listed: {why}; fetch it again once the run's status lists the current files"
    )]
    Changed {
        /// Its path relative to the run's directory.
        path: String,
        /// What differs.
        why: String,
    },
    /// A listing entry that is not a plausible file description.
    #[error("the listing of output {path:?} is invalid: {why}")]
    BadListing {
        /// The entry's path.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// A namespace, pod or run name that is not a Kubernetes name.
    #[error("{what} {name:?} is not a valid name: {why}")]
    InvalidName {
        /// Which name (`pod namespace`, `pod`, `run namespace`, `run`).
        what: &'static str,
        /// The name.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// The API server refused the port-forward: the caller lacks RBAC for it.
    #[error(
        "the API server refused a port-forward to the SuperLink pod's outputs sidecar: you may not port-forward in namespace {namespace} (`get` and `create` on `pods/portforward`; check with `kubectl auth can-i get pods/portforward -n {namespace}`; ask for a Role that grants it: the built-in edit and admin roles do, view does not): {message}"
    )]
    Forbidden {
        /// The SuperLink pod's namespace.
        namespace: String,
        /// What the API server said.
        message: String,
    },
    /// The SuperLink pod (or its sidecar) is not there to answer.
    #[error(
        "the SuperLink pod {namespace}/{pod} is not running, or its outputs sidecar is not up: outputs are fetched from it while the Federation's SuperLink runs (check `kubectl get pod -n {namespace} {pod}`): {message}"
    )]
    PodNotRunning {
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
        /// What the API server said.
        message: String,
    },
    /// Any other failed answer of the sidecar.
    #[error(
        "fetching {what} from the outputs sidecar of pod {pod} failed with HTTP {status}: {message}"
    )]
    Http {
        /// The listing or the file asked for.
        what: String,
        /// `namespace/pod`.
        pod: String,
        /// The HTTP status code.
        status: u16,
        /// The answer's body, shortened.
        message: String,
    },
    /// The API server could not be reached.
    #[error("fetching {what} through the API server from pod {pod}: {source}")]
    Kube {
        /// The listing or the file asked for.
        what: String,
        /// `namespace/pod`.
        pod: String,
        /// The client's error.
        source: kube::Error,
    },
}

impl OutputsError {
    fn io(path: impl Into<PathBuf>, source: impl Into<io::Error>) -> Self {
        let path = path.into();
        let source = source.into();
        if refused_link(&source) && is_symlink(&path) {
            return Self::Symlink { path };
        }
        Self::Io { path, source }
    }

    /// The error for opening output `path` below `dir` failing with `source`: a symlink on the
    /// way is named as such, a missing file is [`OutputsError::Missing`].
    fn opening(dir: &Path, path: &str, source: io::Error) -> Self {
        let mut at = dir.to_path_buf();
        for segment in path.split('/') {
            at.push(segment);
            if is_symlink(&at) {
                return Self::Symlink { path: at };
            }
        }
        if source.kind() == io::ErrorKind::NotFound {
            return Self::Missing {
                path: path.to_owned(),
                dir: dir.to_path_buf(),
            };
        }
        Self::Io { path: at, source }
    }
}

/// Whether `path` is a symlink (for messages only: what is opened is checked on the open fd).
fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// The directory a run's ServerApp writes to: `<root>/<namespace>/<run>`.
pub fn run_dir(root: &Path, namespace: &str, run: &str) -> PathBuf {
    root.join(namespace).join(run)
}

/// Lists the regular files below `dir` (recursively, without following symlinks and skipping
/// devices, FIFOs and sockets), sorted by path, with sizes and SHA-256s. A missing `dir` lists
/// nothing; more than [`MAX_FILES`] files, or a name that is not UTF-8 or holds a backslash, is
/// an error. `dir` itself must not be a symlink (its parents may be).
///
/// `max_bytes` (the Federation's `spec.outputs.sizeLimit`) bounds what is read: the files' sizes
/// are added up first, and a run over it is refused ([`OutputsError::OverQuota`]) before any
/// byte is hashed; each file is then hashed up to the size it had, so a file that grows
/// meanwhile is not read further.
pub fn list_dir(dir: &Path, max_bytes: u64) -> Result<Vec<RunOutput>, OutputsError> {
    let fd = match nix::fcntl::open(dir, dir_flags(), Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(Vec::new()),
        Err(e) => return Err(OutputsError::io(dir, e)),
    };
    list_fd(fd.as_fd(), dir, max_bytes)
}

/// [`list_dir`] of the directory open as `dir`, named `shown` in errors.
fn list_fd(
    dir: BorrowedFd<'_>,
    shown: &Path,
    max_bytes: u64,
) -> Result<Vec<RunOutput>, OutputsError> {
    let mut paths = Vec::new();
    walk(dir, "", 0, shown, &mut paths)?;
    if paths.len() > MAX_FILES {
        return Err(OutputsError::TooManyFiles {
            dir: shown.to_path_buf(),
            count: paths.len(),
            limit: MAX_FILES,
        });
    }
    paths.sort();
    // Sizes first (one file open at a time), so nothing is hashed of a run over the limit.
    let mut opened = Vec::with_capacity(paths.len());
    let mut total = 0u64;
    for path in paths {
        let segments: Vec<&str> = path.split('/').collect();
        let at = shown.join(&path);
        let size = open_beneath(dir, &segments)
            .and_then(|f| f.metadata())
            .map_err(|e| OutputsError::io(&at, e))?
            .len();
        total = total.saturating_add(size);
        opened.push((path, size));
    }
    if total > max_bytes {
        return Err(OutputsError::OverQuota {
            message: format!(
                "the run's {} output file(s) in {} take {total} bytes, more than the Federation's spec.outputs.sizeLimit ({max_bytes} bytes): they are not listed or fetched; write less, or raise the limit",
                opened.len(),
                shown.display()
            ),
        });
    }
    opened
        .into_iter()
        .map(|(path, size)| {
            let segments: Vec<&str> = path.split('/').collect();
            let at = shown.join(&path);
            let file = open_beneath(dir, &segments).map_err(|e| OutputsError::io(&at, e))?;
            let (hashed, sha256) =
                hash(&mut file.take(size)).map_err(|e| OutputsError::io(&at, e))?;
            let size = i64::try_from(hashed).map_err(|_| OutputsError::BadListing {
                path: path.clone(),
                why: format!("{hashed} bytes is too large to list"),
            })?;
            Ok(RunOutput { path, size, sha256 })
        })
        .collect()
}

/// Collects the relative paths of the regular files below `dir` into `out`.
fn walk(
    dir: BorrowedFd<'_>,
    prefix: &str,
    depth: usize,
    shown: &Path,
    out: &mut Vec<String>,
) -> Result<(), OutputsError> {
    let here = shown.join(prefix);
    // Read the names first: the iterator borrows the directory the entries are opened from.
    let entries: Vec<(CString, Option<Type>)> = {
        let dup = dir
            .try_clone_to_owned()
            .map_err(|e| OutputsError::io(&here, e))?;
        let mut listing = Dir::from_fd(dup).map_err(|e| OutputsError::io(&here, e))?;
        listing
            .iter()
            .map(|entry| entry.map(|e| (e.file_name().to_owned(), e.file_type())))
            .collect::<Result<_, _>>()
            .map_err(|e| OutputsError::io(&here, e))?
    };
    for (name, kind) in entries {
        if matches!(name.as_bytes(), b"." | b"..") {
            continue;
        }
        let rel = |name: &str| {
            if prefix.is_empty() {
                name.to_owned()
            } else {
                format!("{prefix}/{name}")
            }
        };
        let kind = match kind {
            Some(kind) => kind,
            None => {
                match nix::sys::stat::fstatat(dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(stat) => kind_of(stat.st_mode),
                    // Removed since the directory was read.
                    Err(Errno::ENOENT) => continue,
                    Err(e) => {
                        return Err(OutputsError::io(
                            shown.join(rel(&name.to_string_lossy())),
                            e,
                        ));
                    }
                }
            }
        };
        if !matches!(kind, Type::File | Type::Directory) {
            // Symlinks, devices, FIFOs and sockets are no outputs.
            continue;
        }
        let Ok(text) = name.to_str() else {
            return Err(OutputsError::BadName {
                path: rel(&name.to_string_lossy()),
                why: "is not UTF-8",
            });
        };
        let path = rel(text);
        if text.contains('\\') {
            return Err(OutputsError::BadName {
                path,
                why: "holds a backslash",
            });
        }
        if kind == Type::File {
            out.push(path);
            continue;
        }
        if depth + 1 > MAX_DEPTH {
            return Err(OutputsError::TooDeep {
                path: shown.join(&path),
            });
        }
        let sub = match open_dir_at(dir, text) {
            Ok(sub) => sub,
            // Removed, or swapped for a symlink, since the directory was read.
            Err(e) if gone_or_link(&e) => continue,
            Err(e) => return Err(OutputsError::io(shown.join(&path), e)),
        };
        walk(sub.as_fd(), &path, depth + 1, shown, out)?;
    }
    Ok(())
}

fn kind_of(mode: nix::libc::mode_t) -> Type {
    match SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => Type::File,
        SFlag::S_IFDIR => Type::Directory,
        SFlag::S_IFLNK => Type::Symlink,
        SFlag::S_IFIFO => Type::Fifo,
        SFlag::S_IFCHR => Type::CharacterDevice,
        SFlag::S_IFBLK => Type::BlockDevice,
        _ => Type::Socket,
    }
}

/// Whether an open failed because the entry is gone or is not a plain directory or file (a
/// symlink met with `O_NOFOLLOW`).
fn gone_or_link(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || refused_link(e)
}

/// Whether an open with `O_NOFOLLOW` failed as it does on a symlink: ELOOP, or ENOTDIR with
/// `O_DIRECTORY` (which a file where a directory was expected also gives).
fn refused_link(e: &io::Error) -> bool {
    let code = e.raw_os_error();
    code == Some(Errno::ELOOP as i32) || code == Some(Errno::ENOTDIR as i32)
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

fn open_dir_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    Ok(nix::fcntl::openat(dir, name, dir_flags(), Mode::empty())?)
}

/// Opens the regular file `segments` below `dir`, one component at a time, following no symlink
/// on the way. A symlink, a directory or a special file at the end is `NotFound`.
fn open_beneath(dir: BorrowedFd<'_>, segments: &[&str]) -> io::Result<File> {
    let not_a_file = || io::Error::new(io::ErrorKind::NotFound, "not a regular file");
    let Some((name, parents)) = segments.split_last() else {
        return Err(not_a_file());
    };
    let mut held: Option<OwnedFd> = None;
    for parent in parents {
        let at = held.as_ref().map_or(dir, |fd| fd.as_fd());
        held = Some(open_dir_at(at, parent)?);
    }
    let at = held.as_ref().map_or(dir, |fd| fd.as_fd());
    // Check the type before opening: opening a FIFO or a device can block or act on it.
    let stat = nix::sys::stat::fstatat(at, *name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    if !matches!(kind_of(stat.st_mode), Type::File) {
        return Err(not_a_file());
    }
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_CLOEXEC
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY;
    let file = File::from(nix::fcntl::openat(at, *name, flags, Mode::empty())?);
    // And after: it may have been swapped in between.
    if !file.metadata()?.is_file() {
        return Err(not_a_file());
    }
    Ok(file)
}

/// Size and lower-case hex SHA-256 of what `reader` yields, read in chunks.
fn hash(reader: &mut impl Read) -> io::Result<(u64, String)> {
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex::encode(hasher.finalize())))
}

/// The segments of an output path, refused unless it stays inside its directory: relative,
/// '/'-separated, no empty, `.` or `..` segment, no backslash or NUL.
fn segments(path: &str) -> Result<Vec<&str>, OutputsError> {
    let bad = |why| OutputsError::BadPath {
        path: path.to_owned(),
        why,
    };
    if path.is_empty() {
        return Err(bad("it is empty"));
    }
    if path.starts_with('/') {
        return Err(bad("it is absolute"));
    }
    path.split('/')
        .map(|segment| segment_ok(segment).map(|()| segment).map_err(bad))
        .collect()
}

/// Why one path segment is refused, if it is.
fn segment_ok(segment: &str) -> Result<(), &'static str> {
    match segment {
        "" => Err("it has an empty segment"),
        "." | ".." => Err("it has a '.' or '..' segment"),
        s if s.contains('\\') => Err("it holds a backslash"),
        s if s.contains('\0') => Err("it holds a NUL"),
        s if s.contains('/') => Err("a segment holds an encoded '/'"),
        _ => Ok(()),
    }
}

/// The size a listing entry promises, and a check of its digest's form.
fn listed_size(file: &RunOutput) -> Result<u64, OutputsError> {
    let bad = |why: String| OutputsError::BadListing {
        path: file.path.clone(),
        why,
    };
    let size =
        u64::try_from(file.size).map_err(|_| bad(format!("size {} is negative", file.size)))?;
    let hex_ok = file.sha256.len() == 64
        && file
            .sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex_ok {
        return Err(bad(format!(
            "sha256 {:?} is not 64 lower-case hex digits",
            file.sha256
        )));
    }
    Ok(size)
}

#[cfg(test)]
mod tests;

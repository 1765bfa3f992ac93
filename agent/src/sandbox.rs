//! A directory hidden from a child process: the child runs in a mount namespace of its own where
//! the directory is an empty tmpfs, except one subdirectory of it, mounted back.
//!
//! The standalone hub runs each SuperLink this way: whoever reaches a SuperLink's Control API runs
//! a ServerApp next to it, and that code must not read the hub's state directory (the CA keys,
//! tokens, other Federations) — only the SuperLink's own directory (its TLS key and database). As
//! root the namespace is a plain mount namespace; otherwise an unprivileged user namespace maps the
//! user to itself. Where neither is possible (a container without `CAP_SYS_ADMIN` and with user
//! namespaces blocked) the child does not start, and the error says how to opt out.
//!
//! With [`Sandbox::network`] the child also gets a network namespace of its own whose only
//! interface is its loopback: what it serves there nobody else reaches, and it reaches nobody —
//! the standalone hub runs each SuperLink so (with its ServerApps), and bridges the ports it
//! must serve through Unix sockets in its directory (`flower-hub netns-bridge`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What to hide from a child, and what to keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sandbox {
    /// The directory the child sees empty.
    pub hide: PathBuf,
    /// A directory inside `hide` the child still sees (read-write).
    pub keep: PathBuf,
    /// Also a network namespace of its own, with only its loopback (up).
    pub network: bool,
}

/// Everything the child needs, made before `fork` (nothing is allocated after it).
pub(crate) struct Prepared {
    hide: CString,
    keep: CString,
    /// `keep`'s ancestors below `hide`, then `keep`: made inside the tmpfs.
    dirs: Vec<CString>,
    uid_map: CString,
    gid_map: CString,
    network: bool,
}

impl Sandbox {
    /// Checks the paths; the result is moved into the child's `pre_exec`.
    pub(crate) fn prepare(&self) -> std::io::Result<Prepared> {
        let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
        let (hide, keep) = (absolute(&self.hide)?, absolute(&self.keep)?);
        let below = keep.strip_prefix(&hide).map_err(|_| {
            invalid(format!(
                "sandbox: {} is not inside {}",
                keep.display(),
                hide.display()
            ))
        })?;
        let mut dirs = Vec::new();
        let mut at = hide.clone();
        for part in below.components() {
            at.push(part);
            dirs.push(cstring(&at)?);
        }
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        let text = |s: String| CString::new(s).map_err(|e| invalid(e.to_string()));
        Ok(Prepared {
            hide: cstring(&hide)?,
            keep: cstring(&keep)?,
            dirs,
            uid_map: text(format!("{uid} {uid} 1\n"))?,
            gid_map: text(format!("{gid} {gid} 1\n"))?,
            network: self.network,
        })
    }
}

fn absolute(path: &Path) -> std::io::Result<PathBuf> {
    std::fs::canonicalize(path)
}

fn cstring(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))
}

impl Prepared {
    /// Enters the sandbox. Runs in the child between `fork` and `exec`: only system calls, no
    /// allocation, no lock.
    #[allow(unsafe_code)]
    pub(crate) fn enter(&self) -> std::io::Result<()> {
        use nix::libc;
        let check = |r: libc::c_int| {
            if r == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        // SAFETY: plain system calls on NUL-terminated strings prepared before fork; the child is
        // single-threaded here and nothing is allocated.
        unsafe {
            let net = if self.network { libc::CLONE_NEWNET } else { 0 };
            if libc::unshare(libc::CLONE_NEWNS | net) != 0 {
                // Not root: a user namespace of our own gives the mount (and network) rights.
                check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | net))?;
                write_proc(c"/proc/self/setgroups", c"deny")?;
                write_proc(c"/proc/self/uid_map", &self.uid_map)?;
                write_proc(c"/proc/self/gid_map", &self.gid_map)?;
            }
            if self.network {
                loopback_up()?;
            }
            // Nothing mounted here reaches the host's namespace.
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            // The working directory keeps `keep` reachable under the tmpfs, for the bind below.
            check(libc::chdir(self.keep.as_ptr()))?;
            check(libc::mount(
                c"tmpfs".as_ptr(),
                self.hide.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=0700".as_ptr().cast(),
            ))?;
            for dir in &self.dirs {
                if libc::mkdir(dir.as_ptr(), 0o700) != 0
                    && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            check(libc::mount(
                c".".as_ptr(),
                self.keep.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ))?;
            check(libc::chdir(self.keep.as_ptr()))?;
        }
        Ok(())
    }
}

/// Brings interface `lo` of the current network namespace up (a new namespace has it down).
#[allow(unsafe_code)]
unsafe fn loopback_up() -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: see `Prepared::enter`; `ifreq` is plain data, zeroed, its name a NUL-terminated
    // copy of "lo".
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        request.ifr_name[0] = b'l' as libc::c_char;
        request.ifr_name[1] = b'o' as libc::c_char;
        let mut result = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request);
        if result == 0 {
            request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            result = libc::ioctl(fd, libc::SIOCSIFFLAGS, &request);
        }
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        if result != 0 {
            return Err(error);
        }
    }
    Ok(())
}

/// Writes `text` to a `/proc/self` file (open, write, close).
#[allow(unsafe_code)]
unsafe fn write_proc(path: &std::ffi::CStr, text: &std::ffi::CStr) -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: see `Prepared::enter`.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let bytes = text.to_bytes();
        let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        libc::close(fd);
        if written != bytes.len() as isize {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

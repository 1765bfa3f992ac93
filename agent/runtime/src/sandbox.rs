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
//! the standalone hub runs each SuperLink so (with its ServerApps), the process runtime each
//! SuperNode (with its ClientApps), and they bridge what must pass through Unix sockets in the
//! Federation's directory ([`crate::netns`]). A SuperNode dialling its SuperLink at an address
//! of the outside network finds that address on its loopback ([`Network::addresses`]) and, for
//! a host name, in an `/etc/hosts` of its own ([`Network::hosts`]), where its bridge listens.
//!
//! With [`Sandbox::confine`], a supervisor running as root also takes its privileges away: the
//! child runs as an unprivileged uid of its directory's own ([`confined_uid`]; gid the same, no
//! supplementary groups), with no capability (bounding set emptied), `no_new_privs`, its
//! directory owned by that uid, and — under a guard ([`crate::guard`]) — in a PID namespace of its
//! own with its own `/proc`, so it sees and signals nothing else. What such a uid could not reach
//! on the host (a Flower installation under `/root`, a state directory inside a private
//! temporary directory) is shown read-only (its own directory read-write) through a tmpfs over
//! the first directory on the way it may not traverse; the rest of that directory stays hidden.

use std::collections::BTreeSet;
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What to hide from a child, and what to keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sandbox {
    /// The directory the child sees empty.
    pub hide: PathBuf,
    /// A directory inside `hide` the child still sees (read-write).
    pub keep: PathBuf,
    /// Also a network namespace of its own, with only its loopback (up).
    pub network: Option<Network>,
    /// As root, run the child unprivileged ([`confined_uid`]), in a PID namespace of its own under
    /// a guard. Not root, nothing changes: the user namespace above already holds no privilege
    /// over the host.
    pub confine: bool,
}

/// The network namespace of a sandbox: its loopback, with more addresses on it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Network {
    /// IPv4 addresses added to the loopback (each a /32), so that a program dialling one of
    /// them reaches what listens there inside (the bridge of [`crate::netns`]), not the network.
    pub addresses: Vec<std::net::Ipv4Addr>,
    /// A file shown as `/etc/hosts` inside, so that a host name the program dials resolves to
    /// one of [`Self::addresses`].
    pub hosts: Option<PathBuf>,
}

/// The first uid (and gid) the confined children run as: [`confined_uid`] is in
/// `FIRST_CONFINED_UID..FIRST_CONFINED_UID + CONFINED_UIDS`, above the ranges distributions give
/// users (below 60000) and container runtimes' usual sub-uid ranges (100000–165535).
pub const FIRST_CONFINED_UID: u32 = 1_000_000;
/// How many uids [`confined_uid`] spreads directories over.
pub const CONFINED_UIDS: u32 = 1_000_000;

/// The uid a confined child of directory `keep` runs as: one per directory (a Federation's), the
/// same on every start, so the files it made stay its own and children of other Federations
/// (other uids) can neither signal nor read them.
pub fn confined_uid(keep: &Path) -> u32 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(keep.as_os_str().as_bytes());
    let n = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    FIRST_CONFINED_UID + n % CONFINED_UIDS
}

/// Gives `path` (and what is in it) to the confined uid of directory `keep` when a confined child
/// owns `keep` ([`Sandbox::confine`]): for what the supervisor makes there after the child
/// started (a run's outputs directory). Otherwise nothing changes.
pub fn hand_over(path: &Path, keep: &Path) -> std::io::Result<()> {
    let keep = absolute(keep)?;
    let uid = confined_uid(&keep);
    if nix::unistd::geteuid().is_root() && std::fs::metadata(&keep)?.uid() == uid {
        give(path, uid)?;
    }
    Ok(())
}

/// One directory shown again inside a tmpfs over one of its ancestors.
struct Bind {
    path: CString,
    read_only: bool,
    /// Opened in the child's mount namespace before the tmpfs covers it (a bind mount's source
    /// must be in the caller's namespace).
    fd: nix::libc::c_int,
}

/// Everything the child needs, made before `fork` (nothing is allocated after it).
pub(crate) struct Prepared {
    /// tmpfs mounts, none inside another.
    hide: Vec<CString>,
    /// Directories made inside them, parents first.
    dirs: Vec<CString>,
    binds: Vec<Bind>,
    keep: CString,
    uid_map: CString,
    gid_map: CString,
    network: bool,
    /// [`Network::addresses`], in network byte order.
    addresses: Vec<u32>,
    /// [`Network::hosts`].
    hosts: Option<CString>,
    /// Confined: the uid (and gid) to run as.
    run_as: Option<u32>,
    /// Whether [`Prepared::enter`] takes the privileges itself (no guard to do it in a PID
    /// namespace: [`Prepared::leave_privileges_to_the_guard`]).
    drop_here: bool,
}

impl Sandbox {
    /// Checks the paths, and confined as root gives `keep` to its uid; `reach`: what the child
    /// runs (programs, interpreters, installations: [`reach_for`]), shown read-only where the
    /// uid could not get there. The result is moved into the child's `pre_exec`.
    pub(crate) fn prepare(&self, reach: &[PathBuf]) -> std::io::Result<Prepared> {
        let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
        let (hide, keep) = (absolute(&self.hide)?, absolute(&self.keep)?);
        if !keep.starts_with(&hide) {
            return Err(invalid(format!(
                "sandbox: {} is not inside {}",
                keep.display(),
                hide.display()
            )));
        }
        let root = nix::unistd::geteuid().is_root();
        let run_as = (self.confine && root).then(|| confined_uid(&keep));
        let mut hidden = BTreeSet::from([hide.clone()]);
        let mut shown = vec![(keep.clone(), false)];
        if let Some(uid) = run_as {
            give(&keep, uid)?;
            if let Some(blocked) = blocked_ancestor(&keep, uid) {
                hidden.insert(blocked);
            }
            for path in reach {
                let Ok(path) = absolute(path) else { continue };
                if !std::fs::metadata(&path).is_ok_and(|m| passable(&m, uid)) {
                    return Err(invalid(format!(
                        "sandbox: {} (what the program runs from) is closed to the unprivileged uid {uid} the sandbox runs it as: open it to others (chmod o+rx), or install Flower elsewhere",
                        path.display()
                    )));
                }
                if let Some(blocked) = blocked_ancestor(&path, uid) {
                    hidden.insert(blocked);
                    shown.push((path, true));
                }
            }
        }
        // Only the outermost of nested hidden directories gets a tmpfs.
        let outermost: Vec<PathBuf> = hidden
            .iter()
            .filter(|h| !hidden.iter().any(|o| o != *h && h.starts_with(o)))
            .cloned()
            .collect();
        let mut dirs = BTreeSet::new();
        let mut binds = Vec::new();
        for (path, read_only) in shown {
            let Some(under) = outermost.iter().find(|h| path.starts_with(h)) else {
                continue;
            };
            let mut at = under.clone();
            for part in path
                .strip_prefix(under)
                .unwrap_or(Path::new(""))
                .components()
            {
                at.push(part);
                dirs.insert(at.clone());
            }
            binds.push(Bind {
                path: cstring(&path)?,
                read_only,
                fd: -1,
            });
        }
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        let text = |s: String| CString::new(s).map_err(|e| invalid(e.to_string()));
        Ok(Prepared {
            hide: outermost
                .iter()
                .map(|p| cstring(p))
                .collect::<Result<_, _>>()?,
            dirs: dirs.iter().map(|p| cstring(p)).collect::<Result<_, _>>()?,
            binds,
            keep: cstring(&keep)?,
            uid_map: text(format!("{uid} {uid} 1\n"))?,
            gid_map: text(format!("{gid} {gid} 1\n"))?,
            network: self.network.is_some(),
            addresses: self
                .network
                .iter()
                .flat_map(|n| &n.addresses)
                .map(|a| u32::from_ne_bytes(a.octets()))
                .collect(),
            hosts: self
                .network
                .as_ref()
                .and_then(|n| n.hosts.as_deref())
                .map(|h| absolute(h).and_then(|h| cstring(&h)))
                .transpose()?,
            run_as,
            drop_here: true,
        })
    }
}

/// What a program needs to read to run: its directory, and for a script its interpreter's — a
/// virtual environment's `bin/python` brings the environment and, through its `pyvenv.cfg`, the
/// Python installation it was made from. Each as the prefix above a `bin` directory.
pub fn reach_for(program: &Path) -> Vec<PathBuf> {
    let mut found = BTreeSet::new();
    let mut add = |path: &Path| {
        for path in [Some(path.to_path_buf()), std::fs::canonicalize(path).ok()]
            .into_iter()
            .flatten()
        {
            if let Some(dir) = path.parent() {
                let prefix = match dir.file_name() {
                    Some(name) if name == "bin" => dir.parent().unwrap_or(dir),
                    _ => dir,
                };
                found.insert(prefix.to_path_buf());
            }
        }
    };
    add(program);
    if let Some(interpreter) = shebang(program) {
        add(&interpreter);
        // A virtual environment names the installation it runs on.
        let venv = interpreter.parent().and_then(Path::parent);
        if let Some(home) = venv.and_then(|v| venv_home(&v.join("pyvenv.cfg"))) {
            add(&home.join("python"));
        }
    }
    found.into_iter().collect()
}

/// The interpreter of a `#!` script.
fn shebang(program: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|b| *b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?.trim();
    let path = text.split_whitespace().next()?;
    path.starts_with('/').then(|| PathBuf::from(path))
}

/// `home` of a `pyvenv.cfg` (the installation's `bin` directory).
fn venv_home(cfg: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(cfg).ok()?;
    text.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "home").then(|| PathBuf::from(value.trim()))
    })
}

/// The first directory on the way to `path` (itself excluded) that `uid` (with gid `uid` and no
/// other group) may not pass through.
fn blocked_ancestor(path: &Path, uid: u32) -> Option<PathBuf> {
    let mut at = PathBuf::from("/");
    for part in path.components().skip(1) {
        if !passable(&std::fs::metadata(&at).ok()?, uid) {
            return Some(at);
        }
        at.push(part);
    }
    None
}

/// Whether `uid` (with gid `uid` and no other group) may pass through a directory.
fn passable(meta: &std::fs::Metadata, uid: u32) -> bool {
    let bit = if meta.uid() == uid {
        0o100
    } else if meta.gid() == uid {
        0o010
    } else {
        0o001
    };
    meta.mode() & bit != 0
}

/// Makes `dir` and everything in it `uid`'s (gid the same), symbolic links themselves and not
/// what they point to.
fn give(dir: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(uid))?;
    if std::fs::symlink_metadata(dir)?.is_dir() {
        for entry in std::fs::read_dir(dir)? {
            give(&entry?.path(), uid)?;
        }
    }
    Ok(())
}

fn absolute(path: &Path) -> std::io::Result<PathBuf> {
    std::fs::canonicalize(path)
}

fn cstring(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))
}

impl Prepared {
    /// The uid a confined child runs as, once [`Self::enter`] or its guard has taken the
    /// privileges.
    pub(crate) fn run_as(&self) -> Option<u32> {
        self.run_as
    }

    /// The guard starting the program takes the privileges, in a PID namespace of its own
    /// ([`crate::guard`]), instead of [`Self::enter`].
    pub(crate) fn leave_privileges_to_the_guard(&mut self) {
        self.drop_here = false;
    }

    /// Enters the sandbox. Runs in the child between `fork` and `exec`: only system calls, no
    /// allocation, no lock.
    #[allow(unsafe_code)]
    pub(crate) fn enter(&mut self) -> std::io::Result<()> {
        use nix::libc;
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
                for (index, address) in self.addresses.iter().enumerate() {
                    add_loopback_address(index, *address)?;
                }
            }
            private_mounts()?;
            for bind in &mut self.binds {
                bind.fd = libc::open(
                    bind.path.as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                );
                if bind.fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // Confined, the uid passes through the tmpfs to what is shown in it.
            let (tmpfs_mode, dir_mode) = if self.run_as.is_some() {
                (c"mode=0711", 0o711)
            } else {
                (c"mode=0700", 0o700)
            };
            for hide in &self.hide {
                check(libc::mount(
                    c"tmpfs".as_ptr(),
                    hide.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    tmpfs_mode.as_ptr().cast(),
                ))?;
            }
            for dir in &self.dirs {
                if libc::mkdir(dir.as_ptr(), dir_mode) != 0
                    && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for bind in &self.binds {
                // The directory as opened above, now under the tmpfs: bound to its own path.
                check(libc::fchdir(bind.fd))?;
                check(libc::mount(
                    c".".as_ptr(),
                    bind.path.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
                libc::close(bind.fd);
                if bind.read_only {
                    check(libc::mount(
                        std::ptr::null(),
                        bind.path.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID,
                        std::ptr::null(),
                    ))?;
                }
            }
            if let Some(hosts) = &self.hosts {
                check(libc::mount(
                    hosts.as_ptr(),
                    c"/etc/hosts".as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
            }
            check(libc::chdir(self.keep.as_ptr()))?;
            if let (Some(uid), true) = (self.run_as, self.drop_here) {
                drop_privileges(uid)?;
                // A change of uid clears the parent-death signal the supervisor asked for.
                check(libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGTERM as libc::c_ulong,
                    0,
                    0,
                    0,
                ))?;
            }
        }
        Ok(())
    }
}

fn check(r: nix::libc::c_int) -> std::io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Makes every mount of the current (new) mount namespace private: nothing mounted here reaches
/// the host's namespace.
#[allow(unsafe_code)]
fn private_mounts() -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: a plain system call on constant strings.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    })
}

/// Gives up root for good, in the child between `fork` and `exec`: `no_new_privs`, every
/// capability out of the bounding set, no supplementary group, then gid and uid `uid` (which
/// empties the permitted and effective sets).
#[allow(unsafe_code)]
pub(crate) fn drop_privileges(uid: u32) -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: plain system calls on values; nothing is allocated.
    unsafe {
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        for cap in 0..64 {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                // EINVAL past the kernel's last capability.
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                    break;
                }
                return Err(std::io::Error::last_os_error());
            }
        }
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setresgid(uid, uid, uid))?;
        check(libc::setresuid(uid, uid, uid))?;
    }
    Ok(())
}

/// In the first process of a new PID namespace, between `fork` and `exec`: a mount namespace of
/// its own with a `/proc` of that PID namespace, so the program lists only its own processes.
#[allow(unsafe_code)]
pub(crate) fn own_proc() -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: see `Prepared::enter`.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        private_mounts()?;
        check(libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        ))?;
    }
    Ok(())
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

/// Adds IPv4 `address` (network byte order) to interface `lo` as a /32, labelled `lo:<index + 1>`
/// (the kernel's alias labels: the ioctls need no netlink).
#[allow(unsafe_code)]
unsafe fn add_loopback_address(index: usize, address: u32) -> std::io::Result<()> {
    use nix::libc;
    if index >= 9 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "sandbox: at most 9 addresses on the loopback",
        ));
    }
    // SAFETY: see `Prepared::enter`; `ifreq` is plain data, zeroed, its name a NUL-terminated
    // "lo:N", its address union written as the `sockaddr_in` the ioctls read.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        for (at, byte) in [b'l', b'o', b':', b'1' + index as u8]
            .into_iter()
            .enumerate()
        {
            request.ifr_name[at] = byte as libc::c_char;
        }
        let set = |request: &mut libc::ifreq, value: u32| {
            let sin = (&raw mut request.ifr_ifru).cast::<libc::sockaddr_in>();
            (*sin).sin_family = libc::AF_INET as libc::sa_family_t;
            (*sin).sin_addr.s_addr = value;
        };
        set(&mut request, address);
        let mut result = libc::ioctl(fd, libc::SIOCSIFADDR, &request);
        if result == 0 {
            set(&mut request, u32::MAX);
            result = libc::ioctl(fd, libc::SIOCSIFNETMASK, &request);
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
unsafe fn write_proc(path: &CStr, text: &CStr) -> std::io::Result<()> {
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

#[cfg(test)]
mod tests;

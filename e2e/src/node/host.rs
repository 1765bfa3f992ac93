//! What real nodes change on the host itself (directories at fixed paths, the `/run/netns` mount,
//! kernel settings kubelet writes), recorded once before the first node of any run on this
//! machine starts and put back when the last run's nodes are gone.
//!
//! Several test processes may run real nodes at once (`test.sh` runs `real_node` beside the other
//! tests): a run that ended must not put back what another run's kubelets still use, nor record as
//! "before" what another run changed. So the record is host-wide, in [`STATE`], and every live
//! [`super::NodeNetwork`] holds a shared `flock(2)` on [`USERS`]; a network that is dropped puts
//! the host back only when it can take that lock exclusively (no other run holds it). Both steps
//! happen under the [`MUTEX`] lock, so a run starting cannot slip between them. A killed run's
//! locks go with it; its record stays and is what the next run puts back.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// Where the record and the locks are (`/run`: a tmpfs, emptied when the kernel settings are).
const DIR: &str = "/run";
/// Serialises taking and releasing [`USERS`] with reading and writing [`STATE`].
const MUTEX: &str = "flower-e2e-host.lock";
/// Shared-locked by every live node network of any process on this machine.
const USERS: &str = "flower-e2e-host.users";
/// The host as it was before the first of the current runs started its nodes.
const STATE: &str = "flower-e2e-host.json";

/// Fixed host paths the node components create whatever their configuration (deepest first).
pub(super) const HOST_DIRS: &[&str] = &[
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/lib/cni/results",
    "/var/lib/cni",
    "/run/containerd/s",
    "/run/containerd",
    "/run/netns",
];

/// Kernel settings kubelet sets on start (`setupKernelTunables`).
const KUBELET_SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// The host before any node started.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Before {
    /// Host directories of [`HOST_DIRS`] that did not exist: removed at the end when empty.
    new_dirs: Vec<String>,
    /// Whether /run/netns was a mount point (`ip netns add` makes it one).
    netns_was_mounted: bool,
    /// [`KUBELET_SYSCTLS`] and their values.
    sysctls: Vec<(String, String)>,
}

impl Before {
    fn now() -> Self {
        Self {
            new_dirs: HOST_DIRS
                .iter()
                .filter(|d| !Path::new(d).exists())
                .map(|d| (*d).to_string())
                .collect(),
            netns_was_mounted: super::is_mount_point("/run/netns"),
            sysctls: KUBELET_SYSCTLS
                .iter()
                .filter_map(|s| {
                    std::fs::read_to_string(Path::new("/proc/sys").join(s))
                        .ok()
                        .map(|v| (s.to_string(), v.trim().to_string()))
                })
                .collect(),
        }
    }

    /// Puts the host back (only what is not in use: directories when empty, the netns mount
    /// when no netns is left).
    fn restore(&self) {
        // kubelet's device-plugin socket is at a fixed path; ours if the directory is.
        if self
            .new_dirs
            .iter()
            .any(|d| d == "/var/lib/kubelet/device-plugins")
        {
            let _ = std::fs::remove_file("/var/lib/kubelet/device-plugins/kubelet.sock");
        }
        let netns_empty = std::fs::read_dir("/run/netns").is_ok_and(|mut d| d.next().is_none());
        if !self.netns_was_mounted && netns_empty && super::is_mount_point("/run/netns") {
            super::run_quiet("umount", &["/run/netns"]);
        }
        for d in &self.new_dirs {
            let _ = std::fs::remove_dir(d);
        }
        for (key, value) in &self.sysctls {
            let path = Path::new("/proc/sys").join(key);
            if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() != value) {
                let _ = std::fs::write(&path, value);
            }
        }
    }
}

fn lock(path: &Path, how: FlockArg) -> Result<Flock<File>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    Flock::lock(file, how)
        .map_err(|(_, e)| e)
        .with_context(|| format!("locking {} ({how:?})", path.display()))
}

/// This process's use of the host: taken before a run's first node starts, released (and the
/// host put back if no other run uses it) when dropped.
#[derive(Debug)]
pub(super) struct HostUse {
    dir: PathBuf,
    users: Option<Flock<File>>,
    /// Puts the host back ([`Before::restore`]; a recorder in the tests).
    restore: fn(&Before),
}

impl HostUse {
    pub(super) fn take() -> Result<Self> {
        Self::take_in(Path::new(DIR), Before::now, Before::restore)
    }

    fn take_in(dir: &Path, now: fn() -> Before, restore: fn(&Before)) -> Result<Self> {
        let _mutex = lock(&dir.join(MUTEX), FlockArg::LockExclusive)?;
        let users = lock(&dir.join(USERS), FlockArg::LockShared)?;
        // A record left by a run that was killed (or is still running) is the state before it.
        let state = dir.join(STATE);
        let recorded = std::fs::read(&state)
            .ok()
            .and_then(|b| serde_json::from_slice::<Before>(&b).ok());
        if recorded.is_none() {
            std::fs::write(&state, serde_json::to_vec(&now())?)
                .with_context(|| format!("writing {}", state.display()))?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            users: Some(users),
            restore,
        })
    }
}

impl Drop for HostUse {
    fn drop(&mut self) {
        let Ok(_mutex) = lock(&self.dir.join(MUTEX), FlockArg::LockExclusive) else {
            return;
        };
        drop(self.users.take());
        // Another run still holds its shared lock: the host is still in use.
        if lock(&self.dir.join(USERS), FlockArg::LockExclusiveNonblock).is_err() {
            return;
        }
        let state = self.dir.join(STATE);
        if let Some(before) = std::fs::read(&state)
            .ok()
            .and_then(|b| serde_json::from_slice::<Before>(&b).ok())
        {
            (self.restore)(&before);
        }
        let _ = std::fs::remove_file(&state);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// What the recorder saw put back, in order.
    static RESTORED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    static NEXT: Mutex<u32> = Mutex::new(0);

    /// A "host" whose state is a counter: each look at it sees a new value.
    fn now() -> Before {
        let mut n = NEXT.lock().unwrap();
        *n += 1;
        Before {
            new_dirs: vec![format!("dir-{n}")],
            netns_was_mounted: false,
            sysctls: Vec::new(),
        }
    }

    fn record(before: &Before) {
        RESTORED.lock().unwrap().push(before.new_dirs[0].clone());
    }

    /// Two runs that overlap (each a use of its own, as two processes would hold them): the host
    /// is recorded once, before the first, and put back once, after the last, to that record;
    /// then a new run records it afresh.
    #[test]
    fn overlapping_runs_put_the_host_back_once_after_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let first = HostUse::take_in(dir.path(), now, record).unwrap();
        let second = HostUse::take_in(dir.path(), now, record).unwrap();
        drop(first);
        assert!(
            RESTORED.lock().unwrap().is_empty(),
            "the second run still uses the host"
        );
        let third = HostUse::take_in(dir.path(), now, record).unwrap();
        drop(second);
        drop(third);
        assert_eq!(*RESTORED.lock().unwrap(), ["dir-1"]);
        assert!(!dir.path().join(STATE).exists());
        drop(HostUse::take_in(dir.path(), now, record).unwrap());
        assert_eq!(*RESTORED.lock().unwrap(), ["dir-1", "dir-2"]);
    }
}

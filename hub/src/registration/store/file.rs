//! Standalone store: plain files in a state directory.
//!
//! Layout (every file written to a temporary name, fsynced, then renamed, so a crash leaves either
//! the old or the new content; secrets are mode 0600):
//! ```text
//! DIR/ca.json                          CA certificate + key (0600), created once
//! DIR/ca.crt                           CA certificate alone (0644), for convenience
//! DIR/tokens/<id>.json                 hashed bootstrap tokens
//! DIR/clusters/<name>/registration.json  what the agent declared (written by the hub)
//! DIR/clusters/<name>/accepted         present = hubAcceptsClient (written by `accept`/`revoke`)
//! DIR/clusters/<name>/status.json      what the hub observed (written by the hub)
//! DIR/clusters/.generation             bumped by every process after a cluster change
//! ```
//! Each file has a single writer role, so the hub and the CLI never overwrite each other's
//! fields. The serving hub calls [`FileStore::poll_external_changes`] periodically to notice
//! changes made by the CLI (it only reads `.generation` unless something changed).
use super::{ClusterRecord, ClusterRegistration, ClusterStatus, ClusterStore, StoreError};
use crate::registration::ca::{CaMaterial, CaRole};

/// `(material, certificate)` file names of the CA of `role` in the state directory.
fn ca_files(role: CaRole) -> (&'static str, &'static str) {
    match role {
        CaRole::Channel => ("ca.json", "ca.crt"),
        CaRole::Flower => ("flower-ca.json", "flower-ca.crt"),
    }
}
use crate::registration::tokens::TokenRecord;
use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tokio::sync::broadcast;

/// Per cluster: (accepted, key fingerprint), as last seen.
type SeenClusters = HashMap<String, (bool, String)>;

/// A [`ClusterStore`] in a state directory.
#[derive(Debug)]
pub struct FileStore {
    dir: PathBuf,
    events: broadcast::Sender<String>,
    /// Last seen `.generation` and (accepted, key fingerprint) per cluster, for change detection.
    seen: Mutex<(String, SeenClusters)>,
    /// Serializes token read-modify-writes ([`ClusterStore::use_token`]) in this process.
    tokens: Mutex<()>,
}

// === impl FileStore ===

impl FileStore {
    /// Opens (creating if needed) the state directory `dir` with mode 0700.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        for sub in [dir.clone(), dir.join("tokens"), dir.join("clusters")] {
            fs::create_dir_all(&sub).map_err(|e| io_err(&sub, e))?;
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| io_err(&dir, e))?;
        let (events, _) = broadcast::channel(4096);
        let store = Self {
            dir,
            events,
            seen: Mutex::new((String::new(), HashMap::new())),
            tokens: Mutex::new(()),
        };
        store.rescan()?;
        Ok(store)
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Notices changes made by other processes (`flower-hub accept`, `revoke`): if the
    /// generation file changed, rescans the clusters and announces those whose acceptance or key
    /// changed, or that disappeared. Cheap when nothing changed (one small file read).
    pub fn poll_external_changes(&self) -> Result<(), StoreError> {
        let generation = self.read_generation();
        let unchanged = self.seen.lock().map(|s| s.0 == generation).unwrap_or(false);
        if unchanged {
            return Ok(());
        }
        self.rescan()
    }

    fn rescan(&self) -> Result<(), StoreError> {
        let generation = self.read_generation();
        let mut now = HashMap::new();
        for name in self.cluster_names()? {
            let reg = match self.read_registration(&name) {
                Ok(reg) => reg,
                // As in list_clusters: one unreadable record must not keep the hub from starting
                // or from serving the other clusters.
                Err(error @ StoreError::Corrupt { .. }) => {
                    self.quarantine(&name, &error);
                    continue;
                }
                Err(error) => return Err(error),
            };
            if let Some(reg) = reg {
                now.insert(
                    name.clone(),
                    (self.accepted_path(&name).exists(), reg.key_fingerprint),
                );
            }
        }
        let mut seen = self.seen.lock().map_err(|_| poisoned())?;
        for (name, state) in &seen.1 {
            if now.get(name) != Some(state) {
                let _ = self.events.send(name.clone());
            }
        }
        for name in now.keys() {
            if !seen.1.contains_key(name) {
                let _ = self.events.send(name.clone());
            }
        }
        *seen = (generation, now);
        Ok(())
    }

    fn changed(&self, name: &str) -> Result<(), StoreError> {
        let path = self.dir.join("clusters").join(".generation");
        let next = format!(
            "{}-{}",
            crate::registration::tokens::unix_now(),
            rand::random::<u64>()
        );
        write_atomic(&path, next.as_bytes(), 0o600)?;
        // Keep our own view in sync so the poller does not re-announce our own write.
        let reg = self.read_registration(name)?;
        let accepted = self.accepted_path(name).exists();
        if let Ok(mut seen) = self.seen.lock() {
            seen.0 = next;
            match reg {
                Some(reg) => {
                    seen.1
                        .insert(name.to_string(), (accepted, reg.key_fingerprint));
                }
                None => {
                    seen.1.remove(name);
                }
            }
        }
        let _ = self.events.send(name.to_string());
        Ok(())
    }

    fn read_generation(&self) -> String {
        fs::read_to_string(self.dir.join("clusters").join(".generation")).unwrap_or_default()
    }

    fn cluster_dir(&self, name: &str) -> PathBuf {
        self.dir.join("clusters").join(name)
    }

    fn accepted_path(&self, name: &str) -> PathBuf {
        self.cluster_dir(name).join("accepted")
    }

    fn cluster_names(&self) -> Result<Vec<String>, StoreError> {
        let dir = self.dir.join("clusters");
        let mut names = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| io_err(&dir, e))? {
            let entry = entry.map_err(|e| io_err(&dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') && entry.path().is_dir() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Moves the directory of cluster `name` to `clusters/.corrupt-<name>-<unix>` (hidden from
    /// listings) and logs where it went and why.
    fn quarantine(&self, name: &str, error: &StoreError) {
        let from = self.cluster_dir(name);
        let to = self.dir.join("clusters").join(format!(
            ".corrupt-{name}-{}",
            crate::registration::tokens::unix_now()
        ));
        match fs::rename(&from, &to) {
            Ok(()) => tracing::error!(
                cluster = %name,
                %error,
                moved_to = %to.display(),
                "corrupt cluster record quarantined; the other clusters keep running, and this cluster's agent must join again (inspect or delete the moved directory)"
            ),
            Err(e) => {
                tracing::error!(cluster = %name, %error, "corrupt cluster record could not be moved aside: {e}")
            }
        }
    }

    fn read_registration(&self, name: &str) -> Result<Option<ClusterRegistration>, StoreError> {
        read_json(&self.cluster_dir(name).join("registration.json"))
    }
}

impl ClusterStore for FileStore {
    fn ca_location(&self, role: CaRole) -> String {
        self.dir.join(ca_files(role).0).display().to_string()
    }

    async fn load_ca_for(&self, role: CaRole) -> Result<Option<CaMaterial>, StoreError> {
        read_json(&self.dir.join(ca_files(role).0))
    }

    async fn create_ca_for(&self, role: CaRole, ca: &CaMaterial) -> Result<CaMaterial, StoreError> {
        let (material, cert) = ca_files(role);
        let path = self.dir.join(material);
        let body = serde_json::to_vec_pretty(ca).map_err(|e| corrupt(&path, e))?;
        // Never replaces an existing CA: a racing process keeps the one someone may trust.
        flower_addon_runtime::files::create_new(&path, &body, 0o600)
            .map_err(|e| io_err(&path, e))?;
        let stored: CaMaterial = read_json(&path)?.ok_or_else(|| StoreError::Corrupt {
            path: path.display().to_string(),
            detail: "vanished after creation".into(),
        })?;
        write_atomic(&self.dir.join(cert), stored.cert_pem.as_bytes(), 0o644)?;
        Ok(stored)
    }

    async fn replace_ca_for(
        &self,
        role: CaRole,
        current: &CaMaterial,
        new: &CaMaterial,
    ) -> Result<(), StoreError> {
        let (material, cert) = ca_files(role);
        let path = self.dir.join(material);
        let stored: Option<CaMaterial> = read_json(&path)?;
        if stored.as_ref() != Some(current) {
            return Err(StoreError::Io {
                path: path.display().to_string(),
                source: std::io::Error::other("the CA changed meanwhile; run the command again"),
            });
        }
        let body = serde_json::to_vec_pretty(new).map_err(|e| corrupt(&path, e))?;
        write_atomic(&path, &body, 0o600)?;
        // The public file is what to trust: the whole bundle.
        let bundle = crate::registration::ca::HubCa::from_material(new.clone())?;
        write_atomic(&self.dir.join(cert), bundle.bundle_pem().as_bytes(), 0o644)
    }

    async fn ca_in_force(&self, role: CaRole) -> Result<Option<String>, StoreError> {
        let path = self.dir.join(format!("{}.in-force", ca_files(role).0));
        match fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text.trim().to_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path, e)),
        }
    }

    async fn mark_ca_in_force(&self, role: CaRole, fingerprint: &str) -> Result<(), StoreError> {
        let path = self.dir.join(format!("{}.in-force", ca_files(role).0));
        write_atomic(&path, fingerprint.as_bytes(), 0o600)
    }

    async fn put_token(&self, token: &TokenRecord) -> Result<(), StoreError> {
        let path = self.dir.join("tokens").join(format!("{}.json", token.id));
        let body = serde_json::to_vec_pretty(token).map_err(|e| corrupt(&path, e))?;
        write_atomic(&path, &body, 0o600)
    }

    async fn get_token(&self, id: &str) -> Result<Option<TokenRecord>, StoreError> {
        if !is_safe_name(id) {
            return Ok(None);
        }
        read_json(&self.dir.join("tokens").join(format!("{id}.json")))
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        let dir = self.dir.join("tokens");
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| io_err(&dir, e))? {
            let path = entry.map_err(|e| io_err(&dir, e))?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            // One damaged file (a full disk during a write) must not hide every other token.
            match read_json::<TokenRecord>(&path) {
                Ok(Some(t)) => out.push(t),
                Ok(None) => {}
                Err(error) => unreadable_token(&path.display().to_string(), &error),
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn delete_token(&self, id: &str) -> Result<bool, StoreError> {
        if !is_safe_name(id) {
            return Ok(false);
        }
        let path = self.dir.join("tokens").join(format!("{id}.json"));
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err(&path, e)),
        }
    }

    async fn use_token(&self, id: &str) -> Result<bool, StoreError> {
        if !is_safe_name(id) {
            return Ok(false);
        }
        let _guard = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        let path = self.dir.join("tokens").join(format!("{id}.json"));
        let Some(mut token) = read_json::<TokenRecord>(&path)? else {
            return Ok(false);
        };
        if !token.has_uses_left() {
            return Ok(false);
        }
        token.uses = token.uses.saturating_add(1);
        let body = serde_json::to_vec_pretty(&token).map_err(|e| corrupt(&path, e))?;
        write_atomic(&path, &body, 0o600)?;
        Ok(true)
    }

    async fn create_cluster(
        &self,
        registration: &ClusterRegistration,
        hub_accepts_client: bool,
    ) -> Result<(), StoreError> {
        let name = &registration.name;
        if !is_safe_name(name) {
            return Err(StoreError::NotFound {
                kind: "cluster",
                name: name.clone(),
            });
        }
        let dir = self.cluster_dir(name);
        // mkdir is the atomic "create if absent". A directory left without registration.json by
        // a crash between mkdir and the write is reclaimed.
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if self.read_registration(name)?.is_some() {
                    return Err(StoreError::AlreadyExists(name.clone()));
                }
            }
            Err(e) => return Err(io_err(&dir, e)),
        }
        if hub_accepts_client {
            write_atomic(&self.accepted_path(name), b"", 0o600)?;
        }
        let path = dir.join("registration.json");
        let body = serde_json::to_vec_pretty(registration).map_err(|e| corrupt(&path, e))?;
        write_atomic(&path, &body, 0o600)?;
        self.changed(name)
    }

    async fn update_registration(
        &self,
        registration: &ClusterRegistration,
    ) -> Result<(), StoreError> {
        let name = &registration.name;
        if !is_safe_name(name) || self.read_registration(name)?.is_none() {
            return Err(StoreError::NotFound {
                kind: "cluster",
                name: name.clone(),
            });
        }
        let path = self.cluster_dir(name).join("registration.json");
        let body = serde_json::to_vec_pretty(registration).map_err(|e| corrupt(&path, e))?;
        write_atomic(&path, &body, 0o600)?;
        self.changed(name)
    }

    async fn set_accepted(&self, name: &str, accepted: bool) -> Result<(), StoreError> {
        if !is_safe_name(name) || self.read_registration(name)?.is_none() {
            return Err(StoreError::NotFound {
                kind: "cluster",
                name: name.to_string(),
            });
        }
        let path = self.accepted_path(name);
        if accepted {
            write_atomic(&path, b"", 0o600)?;
        } else {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path, e)),
            }
        }
        self.changed(name)
    }

    async fn put_status(&self, name: &str, status: &ClusterStatus) -> Result<(), StoreError> {
        if !is_safe_name(name) || self.read_registration(name)?.is_none() {
            return Err(StoreError::NotFound {
                kind: "cluster",
                name: name.to_string(),
            });
        }
        let path = self.cluster_dir(name).join("status.json");
        let body = serde_json::to_vec_pretty(status).map_err(|e| corrupt(&path, e))?;
        write_atomic(&path, &body, 0o600)
    }

    async fn get_cluster(&self, name: &str) -> Result<Option<ClusterRecord>, StoreError> {
        if !is_safe_name(name) {
            return Ok(None);
        }
        let Some(registration) = self.read_registration(name)? else {
            return Ok(None);
        };
        // The status is what the hub observed, rebuilt from the agent's next report: an
        // unreadable one (a truncated write, a full disk) is started afresh, never a reason to
        // drop the cluster with its acceptance and labels.
        let status_path = self.cluster_dir(name).join("status.json");
        let status: ClusterStatus = match read_json(&status_path) {
            Ok(status) => status.unwrap_or_default(),
            Err(error @ StoreError::Corrupt { .. }) => {
                tracing::warn!(cluster = %name, %error, "unreadable cluster status ignored; it is rebuilt from the agent's next report");
                ClusterStatus::default()
            }
            Err(error) => return Err(error),
        };
        Ok(Some(ClusterRecord {
            registration,
            hub_accepts_client: self.accepted_path(name).exists(),
            lease_duration: None,
            status,
        }))
    }

    async fn list_clusters(&self) -> Result<Vec<ClusterRecord>, StoreError> {
        let mut out = Vec::new();
        for name in self.cluster_names()? {
            match self.get_cluster(&name).await {
                Ok(Some(rec)) => out.push(rec),
                Ok(None) => {}
                // One unreadable cluster must not stop the hub from serving the others: it is
                // moved aside (kept for inspection) and reported; its agent joins again.
                Err(error @ StoreError::Corrupt { .. }) => self.quarantine(&name, &error),
                Err(error) => return Err(error),
            }
        }
        Ok(out)
    }

    async fn delete_cluster(&self, name: &str) -> Result<bool, StoreError> {
        if !is_safe_name(name) {
            return Ok(false);
        }
        let dir = self.cluster_dir(name);
        if !dir.exists() {
            return Ok(false);
        }
        // Rename first so readers see the cluster vanish at once, then remove at leisure.
        let trash = self
            .dir
            .join("clusters")
            .join(format!(".deleted-{name}-{}", rand::random::<u32>()));
        fs::rename(&dir, &trash).map_err(|e| io_err(&dir, e))?;
        fs::remove_dir_all(&trash).map_err(|e| io_err(&trash, e))?;
        self.changed(name)?;
        Ok(true)
    }

    fn changes(&self) -> broadcast::Receiver<String> {
        self.events.subscribe()
    }
}

/// Names used as file names must not escape their directory.
fn is_safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, StoreError> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| corrupt(path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path, e)),
    }
}

/// Writes `body` to `path` atomically: temp file with `mode`, fsync, rename over `path`.
pub(crate) fn write_atomic(path: &Path, body: &[u8], mode: u32) -> Result<(), StoreError> {
    flower_addon_runtime::files::write_atomic(path, body, mode).map_err(|e| io_err(path, e))
}

fn io_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Logs a bootstrap token that cannot be read (left out of listings) with the fix; both stores.
pub(crate) fn unreadable_token(location: &str, error: &StoreError) {
    tracing::error!(
        token = %location,
        %error,
        "unreadable bootstrap token left out: it cannot be used to join; delete it (`flower-hub token delete ID`, or remove it by hand) and create a new one"
    );
}

fn corrupt(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

fn poisoned() -> StoreError {
    StoreError::Io {
        path: "<in-memory view>".into(),
        source: std::io::Error::other("lock poisoned"),
    }
}

#[cfg(test)]
mod tests;

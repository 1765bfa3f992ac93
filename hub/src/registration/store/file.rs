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
        flower_addon_agent::files::create_new(&path, &body, 0o600).map_err(|e| io_err(&path, e))?;
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
    flower_addon_agent::files::write_atomic(path, body, mode).map_err(|e| io_err(path, e))
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
mod tests {
    use super::*;

    fn registration(name: &str, fp: &str) -> ClusterRegistration {
        ClusterRegistration {
            name: name.into(),
            labels: Default::default(),
            claims: Default::default(),
            key_fingerprint: fp.into(),
            previous_key_fingerprint: None,
            agent_version: String::new(),
            token_id: String::new(),
            created_unix: 1,
        }
    }

    #[tokio::test]
    async fn a_lost_flower_ca_is_made_anew_and_said() {
        // A first start makes the Flower CA quietly; once the hub has run (its CAs marked in
        // force), a Flower CA that is gone is made anew with a warning that names the file and
        // what users must do; a present one is loaded as it is.
        use crate::registration::ca::CaRole;
        use crate::registration::store::{load_or_create_ca, load_or_create_ca_noting_loss};
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileStore::open(dir.path()).expect("open");
        let channel = load_or_create_ca(&store).await.expect("channel CA");
        let first = load_or_create_ca_noting_loss(&store, CaRole::Flower)
            .await
            .expect("Flower CA");
        assert_eq!(first.replaced_lost, None, "a first start");
        crate::cli::serve::mark_cas_in_force(&store, &channel, &first.ca)
            .await
            .expect("mark");
        std::fs::remove_file(dir.path().join("flower-ca.json")).expect("remove");
        let again = load_or_create_ca_noting_loss(&store, CaRole::Flower)
            .await
            .expect("Flower CA");
        let message = again.replaced_lost.expect("the loss is said");
        assert!(
            message.contains("flower-ca.json")
                && message.contains("flower-hub connect")
                && message.contains("restore"),
            "{message}"
        );
        assert_ne!(again.ca.cert_pem(), first.ca.cert_pem());
        let loaded = load_or_create_ca_noting_loss(&store, CaRole::Flower)
            .await
            .expect("Flower CA");
        assert_eq!(loaded.replaced_lost, None);
        assert_eq!(loaded.ca.cert_pem(), again.ca.cert_pem());
    }

    #[tokio::test]
    async fn create_is_exclusive_and_accept_round_trips() {
        // A cluster name can be created once; acceptance and deletion are visible to a second
        // store instance on the same directory (as the CLI and the serving hub are).
        let dir = tempfile::tempdir().expect("tempdir");
        let a = FileStore::open(dir.path()).expect("open");
        let b = FileStore::open(dir.path()).expect("open");
        a.create_cluster(&registration("c1", "fp"), false)
            .await
            .expect("create");
        assert!(matches!(
            b.create_cluster(&registration("c1", "other"), false).await,
            Err(StoreError::AlreadyExists(_))
        ));
        let mut events = a.changes();
        b.set_accepted("c1", true).await.expect("accept");
        a.poll_external_changes().expect("poll");
        assert_eq!(events.recv().await.expect("event"), "c1");
        assert!(
            a.get_cluster("c1")
                .await
                .expect("get")
                .expect("some")
                .hub_accepts_client
        );
        assert!(b.delete_cluster("c1").await.expect("delete"));
        assert!(a.get_cluster("c1").await.expect("get").is_none());
    }

    #[tokio::test]
    async fn a_damaged_token_file_is_left_out_and_the_others_are_listed() {
        // One token file cut short (a full disk) used to fail every `token list`.
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileStore::open(dir.path()).expect("open");
        for id in ["aaaaaa", "bbbbbb"] {
            store
                .put_token(&TokenRecord {
                    id: id.into(),
                    secret_sha256: "00".repeat(32),
                    created_unix: 1,
                    expires_unix: u64::MAX / 2,
                    description: String::new(),
                    cluster_name: None,
                    labels: Default::default(),
                    max_uses: None,
                    uses: 0,
                })
                .await
                .expect("put");
        }
        fs::write(dir.path().join("tokens/aaaaaa.json"), b"{\"id\": \"aaa").expect("cut");
        let ids: Vec<String> = store
            .list_tokens()
            .await
            .expect("listed")
            .into_iter()
            .map(|t| t.id)
            .collect();
        assert_eq!(ids, ["bbbbbb"]);
        // Deleting it by id (the fix the log names) works.
        assert!(store.delete_token("aaaaaa").await.expect("delete"));
    }

    #[tokio::test]
    async fn a_corrupt_cluster_record_is_quarantined_and_the_others_are_listed() {
        // A damaged file under clusters/ used to make every listing fail (and so stop the
        // standalone controller); now that cluster is moved aside with its bytes kept.
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileStore::open(dir.path()).expect("open");
        for name in ["c1", "c2"] {
            store
                .create_cluster(&registration(name, "fp"), true)
                .await
                .expect("create");
        }
        let broken = dir.path().join("clusters/c1/registration.json");
        fs::write(&broken, b"{ not json").expect("corrupt");
        let listed = store.list_clusters().await.expect("list");
        let names: Vec<&str> = listed
            .iter()
            .map(|r| r.registration.name.as_str())
            .collect();
        assert_eq!(names, ["c2"]);
        let moved: Vec<_> = fs::read_dir(dir.path().join("clusters"))
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".corrupt-c1-"))
            .collect();
        assert_eq!(moved.len(), 1, "{moved:?}");
        let kept = dir
            .path()
            .join("clusters")
            .join(&moved[0])
            .join("registration.json");
        assert_eq!(fs::read(kept).expect("kept"), b"{ not json");
        assert!(store.get_cluster("c1").await.expect("get").is_none());
    }

    #[tokio::test]
    async fn a_corrupt_cluster_record_at_start_is_quarantined_and_the_store_opens() {
        // Opening the store reads every registration: one damaged file used to stop the hub
        // from starting at all.
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileStore::open(dir.path()).expect("open");
        for name in ["c1", "c2"] {
            store
                .create_cluster(&registration(name, "fp"), true)
                .await
                .expect("create");
        }
        drop(store);
        fs::write(dir.path().join("clusters/c2/registration.json"), b"").expect("truncate");
        let store = FileStore::open(dir.path()).expect("the store opens with one bad record");
        let listed = store.list_clusters().await.expect("list");
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].registration.name, "c1");
        let moved = fs::read_dir(dir.path().join("clusters"))
            .expect("dir")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with(".corrupt-c2-"))
            })
            .count();
        assert_eq!(moved, 1);
    }

    #[tokio::test]
    async fn a_deleted_ca_is_not_replaced_while_clusters_hold_its_certificates() {
        // A new work-channel CA would lock out every agent: the hub refuses to make one, names
        // the file and the fix, and writes nothing; the restored file serves again.
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileStore::open(dir.path()).expect("open");
        let ca = crate::registration::store::load_or_create_ca(&store)
            .await
            .expect("ca");
        store
            .create_cluster(&registration("c1", "fp"), true)
            .await
            .expect("create");
        let backup = fs::read(dir.path().join("ca.json")).expect("ca.json");
        fs::remove_file(dir.path().join("ca.json")).expect("delete ca.json");
        // Before any certificate was issued, a missing CA is a first start.
        let first = crate::registration::store::load_or_create_ca(&store)
            .await
            .expect("no certificate issued yet: a CA is made");
        assert_ne!(first.hash(), ca.hash());
        fs::write(dir.path().join("ca.json"), &backup).expect("restore");
        let status = ClusterStatus {
            client_cert_issuer: Some(ca.hash().to_owned()),
            ..ClusterStatus::default()
        };
        store.put_status("c1", &status).await.expect("status");
        fs::remove_file(dir.path().join("ca.json")).expect("delete ca.json");
        let Err(error) = crate::registration::store::load_or_create_ca(&store).await else {
            panic!("a new CA was made under a joined cluster");
        };
        let message = error.to_string();
        for part in [
            dir.path().join("ca.json").display().to_string(),
            "1 joined cluster(s)".into(),
            "c1".into(),
            ca.hash().to_owned(),
            "Restore".into(),
            "flower-hub revoke NAME --delete".into(),
        ] {
            assert!(message.contains(&part), "{part:?} in {message}");
        }
        assert!(!dir.path().join("ca.json").exists(), "nothing written");
        fs::write(dir.path().join("ca.json"), &backup).expect("restore");
        let restored = crate::registration::store::load_or_create_ca(&store)
            .await
            .expect("the restored CA");
        assert_eq!(restored.hash(), ca.hash());
    }

    #[tokio::test]
    async fn a_truncated_status_keeps_the_cluster_its_acceptance_and_labels() {
        // status.json is derived (rebuilt from the next report): a torn write of it must not
        // quarantine the cluster, which would drop its acceptance and its admin's labels.
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileStore::open(dir.path()).expect("open");
        let mut reg = registration("c1", "fp");
        reg.labels.insert("site".into(), "a".into());
        store.create_cluster(&reg, true).await.expect("create");
        fs::write(dir.path().join("clusters/c1/status.json"), b"{\"condi").expect("truncate");
        let listed = store.list_clusters().await.expect("list");
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(listed[0].hub_accepts_client);
        assert_eq!(
            listed[0]
                .registration
                .labels
                .get("site")
                .map(String::as_str),
            Some("a")
        );
        assert_eq!(listed[0].status, ClusterStatus::default());
        store
            .put_status("c1", &ClusterStatus::default())
            .await
            .expect("the status is written afresh");
        let quarantined = fs::read_dir(dir.path().join("clusters"))
            .expect("dir")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with(".corrupt-"))
            })
            .count();
        assert_eq!(quarantined, 0);
    }

    #[tokio::test]
    async fn secrets_are_private_files() {
        // The CA key and token hashes are written with mode 0600 and the CA is created once.
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileStore::open(dir.path()).expect("open");
        let ca = crate::registration::store::load_or_create_ca(&store)
            .await
            .expect("ca");
        let again = crate::registration::store::load_or_create_ca(&store)
            .await
            .expect("ca");
        assert_eq!(ca.hash(), again.hash());
        let mode = fs::metadata(dir.path().join("ca.json"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}

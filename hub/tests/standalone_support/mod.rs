//! What the standalone-hub tests share: a state, manifests and bin directory with a stand-in
//! `flower-superlink`, the hub's configuration on them, and accepted clusters in a file store.
#![allow(dead_code)]
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use flower_addon_hub::core::sans::SuperLinkNames;
use flower_addon_hub::registration::store::file::FileStore;
use flower_addon_hub::registration::store::{ClusterRegistration, ClusterStore};
use flower_addon_hub::standalone::StandaloneConfig;

/// A stand-in `flower-superlink`: it listens where SuperNodes would reach it (the unified
/// `--host`/`--port`, else `--fleet-api-address`), as the hub checks before it sends the
/// Federation's work, and does nothing else. While a file `hold` sits next to it, it waits
/// before it listens (a SuperLink that is slow to start). Each start appends its arguments to
/// `starts` there.
const STAND_IN_SUPERLINK: &str = r#"#!/usr/bin/env python3
import os, socket, sys, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "starts"), "a") as starts:
    starts.write(" ".join(sys.argv[1:]) + "\n")
while os.path.exists(os.path.join(here, "hold")):
    time.sleep(0.05)
host, port = "127.0.0.1", None
for arg in sys.argv[1:]:
    name, _, value = arg.partition("=")
    if name == "--host":
        host = value
    elif name == "--port":
        port = int(value)
    elif name == "--fleet-api-address" and port is None:
        host, _, p = value.rpartition(":")
        port = int(p)
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port))
s.listen()
time.sleep(600)
"#;

/// A temporary `state/`, `manifests/` and `bin/`; `bin/flower-superlink` only listens (these
/// tests are about the hub's decisions, not Flower).
pub struct Dirs {
    pub _dir: tempfile::TempDir,
    pub state: PathBuf,
    pub manifests: PathBuf,
    pub bin: PathBuf,
}

impl Dirs {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        let (state, manifests, bin) = (
            dir.path().join("state"),
            dir.path().join("manifests"),
            dir.path().join("bin"),
        );
        for d in [&state, &manifests, &bin] {
            std::fs::create_dir_all(d).expect("dir");
        }
        // As a Flower installation is, `bin/` is open to the unprivileged uids a hub run as root
        // runs its SuperLinks as (one per Federation); every stand-in appends to `starts`.
        let starts = bin.join("starts");
        std::fs::write(&starts, "").expect("starts");
        for (path, mode) in [
            (dir.path(), 0o755),
            (bin.as_path(), 0o755),
            (&starts, 0o666),
        ] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        }
        let superlink = bin.join("flower-superlink");
        std::fs::write(&superlink, STAND_IN_SUPERLINK).expect("script");
        std::fs::set_permissions(&superlink, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        Self {
            _dir: dir,
            state,
            manifests,
            bin,
        }
    }

    /// The hub on these directories, on loopback, its admin allowing `allowed` certificate names.
    pub fn config(&self, allowed: &[&str]) -> StandaloneConfig {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        StandaloneConfig {
            state_dir: self.state.clone(),
            manifests_dir: self.manifests.clone(),
            flower_bin: Some(self.bin.clone()),
            superlink_host: "127.0.0.1".into(),
            advertise: vec!["127.0.0.1".into()],
            superlink_cert_validity:
                flower_addon_hub::core::renewal::DEFAULT_SUPERLINK_CERT_VALIDITY,
            local_port_base: 19500,
            sandbox: true,
            superlink_network: Some(flower_addon_hub::standalone::NetnsBridge {
                program: flower_hub_binary(),
            }),
            supernode_network: Some(flower_addon_hub::standalone::NetnsBridge {
                program: flower_hub_binary(),
            }),
            superlink_names: SuperLinkNames::new(["127.0.0.1"], &allowed).expect("names"),
            pod_policy: flower_addon_crds::policy::PodPolicy::new(
                flower_addon_crds::policy::Admin::Hub,
            ),
            fab_egress: flower_addon_hub::flower::fab_url::Egress::default(),
        }
    }
}

/// Registers `clusters` (name → labels) as accepted in `store`.
pub async fn register(store: &FileStore, clusters: &BTreeMap<String, BTreeMap<String, String>>) {
    for (name, l) in clusters {
        let registration = ClusterRegistration {
            name: name.clone(),
            labels: l.clone(),
            claims: BTreeMap::new(),
            key_fingerprint: format!("sha256:{name}"),
            previous_key_fingerprint: None,
            agent_version: "test".into(),
            token_id: "t".into(),
            created_unix: 1,
        };
        store
            .create_cluster(&registration, true)
            .await
            .expect("cluster");
    }
}

/// The `flower-hub` binary (which runs `netns-bridge`): Cargo's for the hub's own tests, else
/// the one beside the test binary (`target/<profile>/flower-hub`, as `cargo build --bins` puts
/// it for e2e).
pub fn flower_hub_binary() -> PathBuf {
    option_env!("CARGO_BIN_EXE_flower-hub")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|exe| Some(exe.parent()?.parent()?.join("flower-hub")))
                .unwrap_or_else(|| PathBuf::from("flower-hub"))
        })
}

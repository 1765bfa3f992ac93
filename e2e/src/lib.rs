//! flower-addon end-to-end harness: a real control plane (one etcd shared by one kube-apiserver
//! per cluster, each with kube-controller-manager, kube-scheduler and kwok fake nodes) started from
//! the binaries `e2e/k8s/build.sh` builds, plus helpers to apply manifests and act as
//! least-privilege ServiceAccounts. [`harness`] is what every test uses around the product: free
//! ports, waits, the built binaries, child processes and the lock that serialises control-plane
//! boots. [`bench`] is what the bench binaries (`e2e/src/bin/*_bench.rs`) measure alike: the
//! hub's own apiserver requests and CPU time.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let cp = e2e::ControlPlane::start(&["hub", "spoke-1", "spoke-2"]).await?;
//! let hub = cp.cluster("hub")?;
//! println!("export KUBECONFIG={}", hub.kubeconfig.display());
//! # Ok(()) }
//! ```
#![deny(unsafe_code)]

pub mod access;
pub mod addon;
pub mod apply;
pub mod bench;
pub mod bins;
pub mod cluster;
pub mod crash;
pub mod deployment;
pub mod dns;
pub mod flwr;
pub mod harness;
pub mod helm;
pub mod kubeconfig;
pub mod node;
pub mod observe;
pub mod ocm;
pub mod pod_addon;
pub mod pods;
pub mod process;
pub mod scrape;
pub mod standalone;
pub mod superlink;
pub mod supernodes;

pub use access::{Access, SaAccess, can_i, service_account_access, service_account_token};
pub use apply::{
    ApplyOptions, apply_file, apply_file_with, apply_yaml, apply_yaml_with, first_node_port,
    install_crds, install_hub_manifests,
};
pub use bins::Binaries;
pub use cluster::{Cluster, ControlPlane, Options};
pub use deployment::ContainerCommand;
pub use harness::{Wait, binary, free_port, free_ports, wait_for, wait_until};
pub use node::{NodeBinaries, NodeNetwork, Partition, RealNode};
pub use observe::{applied_versions, pod_uids, wait_statefulsets_settled};

/// Installs rustls' ring crypto provider for the process (idempotent).
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Root of the repository (for `examples/`, `manifests/`).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default()
}

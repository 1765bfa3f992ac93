//! What the standalone-hub tests share: accepted clusters in a file store.
use std::collections::BTreeMap;

use flower_addon_hub::registration::store::file::FileStore;
use flower_addon_hub::registration::store::{ClusterRegistration, ClusterStore};

/// Registers `clusters` (name → labels) as accepted in `store`.
pub async fn register(store: &FileStore, clusters: &BTreeMap<String, BTreeMap<String, String>>) {
    for (name, l) in clusters {
        let registration = ClusterRegistration {
            name: name.clone(),
            labels: l.clone(),
            claims: BTreeMap::new(),
            key_fingerprint: format!("sha256:{name}"),
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

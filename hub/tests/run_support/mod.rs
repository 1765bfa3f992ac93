//! What the FlowerRun tests share: a Federation `team/fed` with its `Ready` condition, and the
//! example app's FAB in a ConfigMap.
#![allow(dead_code)]
use base64::Engine;
use flower_addon_crds::Federation;
use serde_json::{Value, json};

/// The Federation's manifest (without status).
pub const FEDERATION: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {name: fed, namespace: team}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  insecure: false
  superlink: {image: "flwr/superlink:1.42.0"}
  supernodes:
    image: "flwr/supernode:1.42.0"
    pools: [{name: a, replicas: 2}]
"#;

/// The Federation (uid `fed-uid`) whose `Ready` condition is `ready` (with `message`).
pub fn federation(ready: bool, message: &str) -> Federation {
    let mut fed: Federation = serde_saphyr::from_str(FEDERATION).expect("federation");
    fed.metadata.uid = Some("fed-uid".into());
    fed.status = Some(
        serde_json::from_value(json!({"conditions": [{
            "type": "Ready",
            "status": if ready { "True" } else { "False" },
            "reason": if ready { "AllReady" } else { "NotReady" },
            "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }]}))
        .expect("status"),
    );
    fed
}

/// The FAB of examples/fedavg, built by the hub's builder: its bytes and hash.
pub fn fab() -> (Vec<u8>, String) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/fedavg");
    let fab = flower_addon_hub::flower::fab::build_from_dir(&dir).expect("build the FAB");
    (fab.bytes, fab.hash)
}

/// ConfigMap `team/fedavg-fab` holding `fab` under `app.fab`.
pub fn config_map(fab: &[u8]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "fedavg-fab", "namespace": "team"},
        "binaryData": {"app.fab": base64::engine::general_purpose::STANDARD.encode(fab)},
    })
}

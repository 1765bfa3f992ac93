use super::*;

#[test]
fn node_keys_are_openssh_p384_private_and_stable() {
    // A replica keeps its identity across restarts, and the key file is private (0600).
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys/pool-0.key");
    let first = ensure_node_key(&path).unwrap();
    assert!(first.starts_with("ecdsa-sha2-nistp384 "), "{first}");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(ensure_node_key(&path).unwrap(), first);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----"));
}

#[test]
fn a_missing_flower_install_is_a_clear_error() {
    // The runtime refuses to start without flower-supernode instead of failing per replica.
    let dir = tempfile::tempdir().unwrap();
    let err = ProcessRuntime::new(ProcessRuntimeConfig {
        state_dir: dir.path().into(),
        flower_bin: Some(dir.path().join("nope")),
        port_base: 19000,
        node_name: "n".into(),
        hide: None,
        bridge: None,
    })
    .err()
    .unwrap();
    assert!(err.to_string().contains("--flower-bin"), "{err}");
}

#[tokio::test]
async fn work_names_that_are_not_dns_labels_never_become_paths() {
    // A Federation named like a path ("..", "a/b") is refused before anything is written,
    // so work cannot reach outside the agent's state directory.
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = bin.join(render::SUPERNODE_PROGRAM);
    std::fs::write(&fake, "#!/bin/sh\nsleep 60\n").unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.path().join("state");
    let runtime = ProcessRuntime::new(ProcessRuntimeConfig {
        state_dir: state.clone(),
        flower_bin: Some(bin),
        port_base: 19000,
        node_name: "n".into(),
        hide: Some(state.clone()),
        bridge: None,
    })
    .unwrap();
    for (namespace, name, pool) in [
        ("..", "escape", "a"),
        ("default", "../../escape", "a"),
        ("default", "fed", "../escape"),
    ] {
        let work = ClusterWork {
            cluster_name: "c".into(),
            federations: vec![flower_addon_proto::FederationWork {
                namespace: namespace.into(),
                name: name.into(),
                flower_version: "1.42.0".into(),
                federation_spec_json: "{}".into(),
                pools: vec![flower_addon_proto::PoolWork {
                    name: pool.into(),
                    spec_json: "{}".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let err = runtime.apply(&work).await.unwrap_err();
        assert!(err.to_string().contains("must be DNS labels"), "{err}");
    }
    assert!(!dir.path().join("escape").exists());
    assert!(!state.join("escape").exists());
    assert!(!state.join("federations").exists(), "nothing written");
}

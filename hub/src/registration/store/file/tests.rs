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

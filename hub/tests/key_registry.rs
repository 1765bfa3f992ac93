//! The hub's SuperNode key registry against a stand-in Control API: a SuperLink that lost its
//! registrations (restarted on an emptyDir database) is not listed again before `RELIST`
//! unless its workload changed; once told (`relist_soon`, what the Kubernetes hub does on a
//! SuperLink StatefulSet event), the next sync registers every key again. A SuperLink that fails
//! writes with a bare "Internal server error" has its log read and the cause named (a full
//! database volume, with where it is); once it works again the problem is gone.
mod fake_control;

use std::collections::BTreeSet;
use std::time::Duration;

use flower_addon_crds::render::FlowerDialect;
use flower_addon_hub::flower::control::ControlEndpoint;
use flower_addon_hub::flower::registry::{KeyTarget, NodeKeyRegistry};
use flower_addon_hub::registration::ca::{CaRole, FederationCa, HubCa};

const KEY: &str = "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBJ7NryvMMKWyOHkfa/yQMy1fXLDk2ZksQLI534CBZwGEKN0FcG1/iEiL2wcX8Rhx2qa2XiRAu8z9peBedvXBheoWLSJ04EfLTvEssJ2FcpYK6e5ZTs6jdMIs7t3wpC5vKw== node0";

/// A stand-in SuperLink Control API on loopback, with a certificate from a new Flower CA: the CA,
/// the directory holding the certificate files, the keys it holds and its address.
async fn stand_in_superlink() -> (
    std::sync::Arc<FederationCa>,
    tempfile::TempDir,
    fake_control::Nodes,
    String,
) {
    let (ca, dir, fake, address) = stand_in_fake().await;
    (ca, dir, fake.nodes, address)
}

/// What team/fed's SuperLink at `address` (its CA `ca`) should hold: [`KEY`]; its log `log`.
fn target(
    ca: &FederationCa,
    address: &str,
    log: Option<flower_addon_hub::flower::diagnose::LogSource>,
) -> KeyTarget {
    KeyTarget {
        federation: ("team".to_owned(), "fed".to_owned()),
        endpoint: ControlEndpoint {
            dialect: FlowerDialect::Unified,
            address: address.to_owned(),
            server_name: "127.0.0.1".into(),
            ca_pem: Some(ca.cert_pem().to_owned()),
            tunnel: None,
        },
        wanted: BTreeSet::from([KEY.to_owned()]),
        complete: true,
        log,
    }
}

/// [`stand_in_superlink`] with the whole stand-in state.
async fn stand_in_fake() -> (
    std::sync::Arc<FederationCa>,
    tempfile::TempDir,
    fake_control::Fake,
    String,
) {
    let flower_ca = HubCa::generate_for(CaRole::Flower).expect("ca");
    let stand_in = fake_control::stand_in(&flower_ca, fake_control::Fake::default()).await;
    let fake_control::StandIn {
        ca,
        dir,
        fake,
        endpoint,
    } = stand_in;
    (ca, dir, fake, endpoint.address)
}

#[tokio::test]
async fn a_superlink_failing_writes_on_a_full_database_is_named_from_its_log() {
    use flower_addon_hub::flower::diagnose::{FaultKind, FileLog, LogSource};
    use std::sync::atomic::Ordering;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (ca, dir, fake, address) = stand_in_fake().await;
    let fed = ("team".to_owned(), "fed".to_owned());
    let log_path = dir.path().join("superlink.log");
    std::fs::write(&log_path, "INFO :      Starting Flower SuperLink\n").expect("log");
    let target = target(
        &ca,
        &address,
        Some(LogSource {
            describe: format!("log file {}", log_path.display()),
            storage: "Its database is /state/superlink.db: free space there".into(),
            reader: std::sync::Arc::new(FileLog::new(log_path.clone())),
        }),
    );
    let registry = NodeKeyRegistry::new();

    // Working: registered and online, nothing read from the log, no problem.
    fake.online.store(true, Ordering::SeqCst);
    registry.sync(vec![target.clone()]).await;
    let keys = registry.get(&fed).expect("synced");
    assert_eq!(keys.registered.len(), 1);
    assert_eq!(keys.problem, None);

    // The volume fills up: the SuperLink logs why and answers 500 to the next registration (a
    // second key). The hub reads the log once and names it.
    fake.full.store(true, Ordering::SeqCst);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log_path)
        .and_then(|mut f| {
            use std::io::Write;
            f.write_all(b"\x1b[91mERROR \x1b[0m:     [/v1/control/register-node][UnexpectedError:OperationalError] (sqlite3.OperationalError) database or disk is full\n")
        })
        .expect("append");
    let second = flower_addon_agent::node_key::generate_node_key()
        .expect("key")
        .public_openssh;
    let mut both = target.clone();
    both.wanted.insert(second.clone());
    registry.relist_soon(&fed);
    registry.sync(vec![both.clone()]).await;
    let keys = registry.get(&fed).expect("synced");
    let problem = keys.problem.expect("the full database named");
    assert_eq!(problem.fault.kind, FaultKind::Storage);
    assert_eq!(problem.fault.reason(), "DatabaseStorageFull");
    assert!(
        problem.message.contains("database or disk is full")
            && problem
                .message
                .contains("/state/superlink.db: free space there"),
        "{}",
        problem.message
    );
    assert!(keys.error.is_some_and(|e| e.contains("HTTP 500")));
    assert_eq!(keys.registered.len(), 1, "the first key stays registered");

    // Room again: the registration goes through, every key is online, the problem is gone.
    fake.full.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    registry.sync(vec![both]).await;
    let keys = registry.get(&fed).expect("synced");
    assert_eq!(keys.registered.len(), 2, "{keys:?}");
    assert_eq!(keys.problem, None, "healthy again");
}

#[tokio::test]
async fn a_500_without_a_logged_cause_names_nothing() {
    // Negative: the hub names a cause only from what the SuperLink logged; a log without a
    // failure line (or none at all) leaves the problem unset.
    use flower_addon_hub::flower::diagnose::{FileLog, LogSource};
    use std::sync::atomic::Ordering;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (ca, dir, fake, address) = stand_in_fake().await;
    let fed = ("team".to_owned(), "fed".to_owned());
    fake.full.store(true, Ordering::SeqCst);
    for log in [Some("INFO : all fine\n"), None] {
        let log_path = dir.path().join("quiet.log");
        let _ = std::fs::remove_file(&log_path);
        if let Some(text) = log {
            std::fs::write(&log_path, text).expect("log");
        }
        let registry = NodeKeyRegistry::new();
        let target = target(
            &ca,
            &address,
            Some(LogSource {
                describe: "quiet".into(),
                storage: String::new(),
                reader: std::sync::Arc::new(FileLog::new(log_path)),
            }),
        );
        registry.sync(vec![target]).await;
        let keys = registry.get(&fed).expect("synced");
        assert!(keys.error.is_some_and(|e| e.contains("HTTP 500")));
        assert_eq!(keys.problem, None, "log {log:?}");
    }
}

#[tokio::test]
async fn a_superlink_that_lost_its_keys_gets_them_back_at_the_next_sync_once_marked() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (ca, _dir, held, address) = stand_in_superlink().await;
    let fed = ("team".to_owned(), "fed".to_owned());
    let target = target(&ca, &address, None);
    let registry = NodeKeyRegistry::new();
    let held_count = || held.lock().expect("held").len();

    registry.sync(vec![target.clone()]).await;
    assert_eq!(held_count(), 1, "the key registered");
    assert_eq!(registry.registered(&fed), vec![KEY.to_owned()]);

    // The SuperLink restarts with an empty database.
    held.lock().expect("held").clear();
    registry.sync(vec![target.clone()]).await;
    assert_eq!(
        held_count(),
        0,
        "nothing changed that the hub knows of: not listed again before RELIST"
    );

    registry.relist_soon(&fed);
    registry.sync(vec![target.clone()]).await;
    assert_eq!(
        held_count(),
        1,
        "marked: listed at once and the key registered again"
    );
    registry.sync(vec![target]).await;
    assert_eq!(held_count(), 1);
}

/// Whatever strings an agent reports as keys (multibyte characters, control characters, cut
/// base64, huge lines), the key sync ends: the well-formed key is registered, every other string
/// is reported as failed (by a char-safe short form) and none is registered.
#[test]
fn arbitrary_key_strings_go_through_the_key_sync_without_panicking() {
    use proptest::prelude::*;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (ca, _dir, held, address) = runtime.block_on(stand_in_superlink());
    let client = flower_addon_hub::flower::control::ControlClient::new(ControlEndpoint {
        dialect: FlowerDialect::Unified,
        address,
        server_name: "127.0.0.1".into(),
        ca_pem: Some(ca.cert_pem().to_owned()),
        tunnel: None,
    })
    .expect("client");
    let line = prop_oneof![
        any::<String>(),
        "ecdsa-sha2-nistp384 [A-Za-z0-9+/=é日\u{0}]{0,40}( [^ ]{0,8})?",
        "[\u{80}-\u{10ffff}]{1,16} [\u{80}-\u{10ffff}]{1,16}",
    ];
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&prop::collection::vec(line, 1..6), |lines| {
            held.lock().expect("held").clear();
            let mut wanted: BTreeSet<String> = lines.into_iter().collect();
            wanted.insert(KEY.to_owned());
            let sync = runtime
                .block_on(flower_addon_hub::flower::sync_keys(&client, &wanted))
                .expect("the listing works");
            prop_assert!(sync.registered.contains(KEY));
            prop_assert_eq!(
                held.lock().expect("held").len(),
                1,
                "only the well-formed key"
            );
            let bad = wanted.iter().filter(|l| l.as_str() != KEY).count();
            prop_assert_eq!(sync.failed.len(), bad, "every other string is reported");
            Ok(())
        })
        .expect("property");
}

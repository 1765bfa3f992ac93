//! Join over real TLS on loopback: tokens, CA pinning, CSR handling, name binding, rate limits.
mod channel_support;

use channel_support::*;
use flower_addon_agent::credentials::{load_or_generate_key, make_csr};
use flower_addon_agent::join::{JoinError, join};
use flower_addon_agent::tls::{self, HubAddress};
use flower_addon_hub::registration::ca::csr_key_fingerprint;
use flower_addon_hub::registration::store::{ClusterRegistration, ClusterStore};
use flower_addon_hub::registration::tokens::{self, TokenRecord, TokenScope};
use flower_addon_proto::registration_client::RegistrationClient;
use flower_addon_proto::{JoinRequest, JoinStatus};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::Code;

fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A token bound to cluster `name`.
async fn bound_token(hub: &Hub, name: &str) -> String {
    hub.scoped_token(TokenScope {
        cluster_name: Some(name.into()),
        ..TokenScope::default()
    })
    .await
}

async fn raw_join(
    hub: &Hub,
    request: JoinRequest,
) -> Result<flower_addon_proto::JoinResponse, tonic::Status> {
    let config = tls::pinned_config(hub.ca.hash(), Arc::new(Mutex::new(None))).expect("tls");
    let channel = tls::connect(&HubAddress::new(&hub.hub()), config)
        .await
        .expect("connect");
    RegistrationClient::new(channel)
        .join(request)
        .await
        .map(|r| r.into_inner())
}

#[tokio::test]
async fn join_waits_for_acceptance_then_gets_an_authorized_client_certificate() {
    // A join stays pending (progress line, nothing issued) until `accept`; then the cert is
    // CN=cluster, CA=false, clientAuth; joining again with the same key is idempotent.
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let token = hub.token().await;
    let options = hub.join_options(&token, "edge-1", agent_dir.path());
    let mut lines = Vec::new();
    let err = join(&options, &mut |l| lines.push(l.to_string()))
        .await
        .expect_err("pending");
    assert!(matches!(err, JoinError::Timeout(..)), "{err}");
    assert!(
        lines
            .iter()
            .any(|l| l
                == "waiting for the hub to accept cluster edge-1: run flower-hub accept edge-1"),
        "{lines:?}"
    );
    let record = hub
        .store
        .get_cluster("edge-1")
        .await
        .expect("get")
        .expect("recorded");
    assert!(!record.hub_accepts_client);
    assert!(record.status.client_cert_not_after_unix.is_none());

    hub.store
        .set_accepted("edge-1", true)
        .await
        .expect("accept");
    let creds = join(&options, &mut |_| {}).await.expect("join");
    let (_, pem) = x509_parser::pem::parse_x509_pem(creds.cert_pem.as_bytes()).expect("pem");
    let cert = pem.parse_x509().expect("x509");
    let cn: Vec<_> = cert
        .subject()
        .iter_common_name()
        .map(|c| c.as_str().expect("cn").to_string())
        .collect();
    assert_eq!(cn, vec!["edge-1".to_string()]);
    let bc = cert.basic_constraints().expect("bc").expect("present");
    assert!(!bc.value.ca);
    let eku = cert.extended_key_usage().expect("eku").expect("present");
    assert!(eku.value.client_auth && !eku.value.server_auth);

    // Same name, same key (same state dir), another valid token: idempotent, one cluster.
    let token2 = hub.token().await;
    let again = join(
        &hub.join_options(&token2, "edge-1", agent_dir.path()),
        &mut |_| {},
    )
    .await
    .expect("rejoin");
    assert_eq!(again.key_pem, creds.key_pem);
    let clusters = hub.store.list_clusters().await.expect("list");
    assert_eq!(clusters.len(), 1);
    assert_eq!(
        clusters[0].registration.key_fingerprint,
        record.registration.key_fingerprint
    );
    hub.stop().await;
}

#[tokio::test]
async fn wrong_expired_and_revoked_tokens_are_refused_and_change_nothing() {
    // Every bad token is refused UNAUTHENTICATED and leaves no cluster behind.
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let good = hub.token().await;
    let (id, _) = tokens::parse(&good).expect("parse");
    let wrong_secret = format!("{id}.aaaaaaaaaaaaaaaa");

    let expired = tokens::generate(Duration::from_secs(3600), "expired");
    hub.store
        .put_token(&TokenRecord {
            expires_unix: tokens::unix_now() - 1,
            ..expired.record.clone()
        })
        .await
        .expect("put");
    let revoked = hub.token().await;
    let (revoked_id, _) = tokens::parse(&revoked).expect("parse");
    hub.store.delete_token(revoked_id).await.expect("delete");

    let before = hub.snapshot().await;
    for (token, needle) in [
        (wrong_secret.as_str(), "unknown or was revoked"),
        (expired.token.as_str(), "expired"),
        (revoked.as_str(), "unknown or was revoked"),
    ] {
        let err = join_err(&hub.join_options(token, "intruder", agent_dir.path())).await;
        match err {
            JoinError::Refused { code, message } => {
                assert_eq!(code, Code::Unauthenticated, "{token}: {message}");
                assert!(message.contains(needle), "{token}: {message}");
            }
            other => panic!("{token}: expected a refusal, got {other}"),
        }
    }
    assert_eq!(hub.snapshot().await, before);
    hub.stop().await;
}

#[tokio::test]
async fn ca_hash_mismatch_is_refused_before_anything_is_sent() {
    // An agent pinned to another CA refuses the hub; the hub records nothing.
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let token = hub.token().await;
    let before = hub.snapshot().await;
    let mut options = hub.join_options(&token, "edge-1", agent_dir.path());
    options.ca_hash = format!("sha256:{}", "0".repeat(64));
    let err = join_err(&options).await;
    match &err {
        JoinError::CaMismatch(detail) => assert!(detail.contains(hub.ca.hash()), "{detail}"),
        other => panic!("expected CaMismatch, got {other}"),
    }
    assert!(!agent_dir.path().join("agent.json").exists());
    assert_eq!(hub.snapshot().await, before);
    hub.stop().await;
}

#[tokio::test]
async fn csr_asking_for_ca_and_another_name_gets_a_plain_client_cert_for_the_authorized_name() {
    // The hub copies nothing from the CSR but the key: CA=true, CN=admin, SANs and serverAuth
    // requested in the CSR are all ignored.
    let dir = tempfile::tempdir().expect("tmp");
    let mut cfg = config();
    cfg.auto_accept.insert("env".into(), "test".into());
    let hub = Hub::start_in(dir.path(), any_port(), cfg).await;
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params =
        rcgen::CertificateParams::new(vec!["evil.example".to_string()]).expect("params");
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "admin");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let csr_pem = params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    let token = hub
        .scoped_token(TokenScope {
            labels: labels(&[("env", "test")]),
            ..TokenScope::default()
        })
        .await;
    let response = raw_join(
        &hub,
        JoinRequest {
            token,
            cluster_name: "edge-2".into(),
            csr_pem,
            ..Default::default()
        },
    )
    .await
    .expect("join");
    assert_eq!(response.status, JoinStatus::Accepted as i32);
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(response.client_cert_pem.as_bytes()).expect("pem");
    let cert = pem.parse_x509().expect("x509");
    let cn: Vec<_> = cert
        .subject()
        .iter_common_name()
        .map(|c| c.as_str().expect("cn").to_string())
        .collect();
    assert_eq!(cn, vec!["edge-2".to_string()]);
    assert!(
        !cert
            .basic_constraints()
            .expect("bc")
            .expect("present")
            .value
            .ca
    );
    let eku = cert.extended_key_usage().expect("eku").expect("present");
    assert!(eku.value.client_auth && !eku.value.server_auth);
    assert!(cert.subject_alternative_name().expect("san").is_none());
    assert!(
        cert.validity().time_to_expiration().expect("valid")
            <= Duration::from_secs(30 * 86400 + 60)
    );
    hub.stop().await;
}

#[tokio::test]
async fn a_second_key_claiming_a_taken_name_is_refused_with_instructions() {
    // A name is bound to the first key: another key gets ALREADY_EXISTS naming the delete command,
    // and the registration keeps the first key.
    let dir = tempfile::tempdir().expect("tmp");
    let first = tempfile::tempdir().expect("tmp");
    let second = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    hub.join_accepted("edge-1", first.path()).await;
    let before = hub.snapshot().await;
    let token = hub.token().await;
    let before_tokens = hub.snapshot().await;
    let err = join_err(&hub.join_options(&token, "edge-1", second.path())).await;
    match err {
        JoinError::Refused { code, message } => {
            assert_eq!(code, Code::AlreadyExists);
            assert!(
                message.contains("flower-hub revoke edge-1 --delete"),
                "{message}"
            );
        }
        other => panic!("expected ALREADY_EXISTS, got {other}"),
    }
    assert_eq!(hub.snapshot().await, before_tokens);
    assert_eq!(hub.snapshot().await.0, before.0);
    hub.stop().await;
}

#[tokio::test]
async fn joins_are_rate_limited_per_token_and_bad_input_is_rejected() {
    // Past the burst a token gets RESOURCE_EXHAUSTED; malformed names and CSRs get
    // INVALID_ARGUMENT; none of it creates a cluster.
    let dir = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let mut cfg = config();
    cfg.join_burst = 2;
    cfg.join_per_second = 0.0;
    let hub = Hub::start_in(dir.path(), any_port(), cfg).await;
    let token = hub.token().await;
    let key = load_or_generate_key(agent_dir.path()).expect("key");
    let csr_pem = make_csr(&key, "x").expect("csr");
    let before = hub.snapshot().await;
    let bad_name = raw_join(
        &hub,
        JoinRequest {
            token: token.clone(),
            cluster_name: "Bad_Name".into(),
            csr_pem: csr_pem.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        bad_name.expect_err("bad name").code(),
        Code::InvalidArgument
    );
    let bad_csr = raw_join(
        &hub,
        JoinRequest {
            token: token.clone(),
            cluster_name: "ok".into(),
            csr_pem: "garbage".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(bad_csr.expect_err("bad csr").code(), Code::InvalidArgument);
    let huge = raw_join(
        &hub,
        JoinRequest {
            token: token.clone(),
            cluster_name: "ok".into(),
            csr_pem: "x".repeat(5 * 1024 * 1024),
            ..Default::default()
        },
    )
    .await;
    assert_ne!(huge.expect_err("oversized").code(), Code::Ok);
    let limited = raw_join(
        &hub,
        JoinRequest {
            token,
            cluster_name: "ok".into(),
            csr_pem,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        limited.expect_err("limited").code(),
        Code::ResourceExhausted
    );
    assert_eq!(hub.snapshot().await, before);
    hub.stop().await;
}

/// What an admin writes before the agent joins: a ManagedCluster with no key yet.
fn pre_created(name: &str) -> ClusterRegistration {
    ClusterRegistration {
        name: name.into(),
        labels: Default::default(),
        claims: Default::default(),
        key_fingerprint: String::new(),
        previous_key_fingerprint: None,
        agent_version: String::new(),
        token_id: String::new(),
        created_unix: 1_700_000_000,
    }
}

/// `sha256:…` of the key the agent in `dir` joins with.
fn agent_key_fingerprint(dir: &std::path::Path) -> String {
    let key = load_or_generate_key(dir).expect("key");
    csr_key_fingerprint(&make_csr(&key, "x").expect("csr")).expect("fingerprint")
}

#[tokio::test]
async fn a_pre_accepted_cluster_is_bound_to_the_first_joining_key_and_refuses_any_other() {
    // An admin may create (and accept) a cluster before its agent joins, as in OCM: only a token
    // bound to that name binds it (before this rule any valid token could take it over); the first
    // join with one binds the name to its key and gets a certificate at once, the admin's labels
    // stay and the agent's own go to claims, and a second key for the name is ALREADY_EXISTS
    // afterwards.
    let dir = tempfile::tempdir().expect("tmp");
    let first = tempfile::tempdir().expect("tmp");
    let second = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let mut admins = pre_created("edge-1");
    admins.labels = labels(&[("env", "prod")]);
    hub.store
        .create_cluster(&admins, true)
        .await
        .expect("pre-create");

    let before = hub.snapshot().await;
    let unbound = hub.token().await;
    let mut options = hub.join_options(&unbound, "edge-1", first.path());
    options.labels.insert("env".into(), "dev".into());
    match join_err(&options).await {
        JoinError::Refused { code, message } => {
            assert_eq!(code, Code::PermissionDenied, "{message}");
            assert!(
                message.contains("token create --cluster-name edge-1"),
                "{message}"
            );
        }
        other => panic!("expected PERMISSION_DENIED, got {other}"),
    }
    let registrations = |records: Vec<flower_addon_hub::registration::store::ClusterRecord>| {
        records
            .into_iter()
            .map(|r| r.registration)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        registrations(hub.snapshot().await.0),
        registrations(before.0),
        "nothing bound"
    );

    let token = bound_token(&hub, "edge-1").await;
    options.token = token.clone();
    let creds = join(&options, &mut |_| {})
        .await
        .expect("joins without accept");
    assert!(!creds.cert_pem.is_empty());
    let record = hub
        .store
        .get_cluster("edge-1")
        .await
        .expect("get")
        .expect("kept");
    assert!(record.hub_accepts_client, "the admin's acceptance stands");
    assert_eq!(
        record.registration.key_fingerprint,
        agent_key_fingerprint(first.path())
    );
    assert_eq!(record.registration.labels, labels(&[("env", "prod")]));
    assert_eq!(record.registration.claims, labels(&[("env", "dev")]));
    assert_eq!(record.registration.created_unix, 1_700_000_000);
    let (token_id, _) = tokens::parse(&token).expect("parse");
    assert_eq!(record.registration.token_id, token_id);

    let before = hub.snapshot().await;
    let token2 = bound_token(&hub, "edge-1").await;
    let before_tokens = hub.snapshot().await;
    let err = join_err(&hub.join_options(&token2, "edge-1", second.path())).await;
    match err {
        JoinError::Refused { code, message } => {
            assert_eq!(code, Code::AlreadyExists, "{message}");
            assert!(message.contains("edge-1"), "{message}");
        }
        other => panic!("expected ALREADY_EXISTS, got {other}"),
    }
    assert_eq!(hub.snapshot().await, before_tokens);
    assert_eq!(
        hub.snapshot().await.0,
        before.0,
        "the first key stays bound"
    );
    hub.stop().await;
}

#[tokio::test]
async fn a_pre_created_unaccepted_cluster_binds_the_key_but_waits_for_acceptance() {
    // hubAcceptsClient=false written by the admin is not overridden, not even by auto-accept
    // labels: the join records the key and stays pending until `accept`; only that key then
    // gets the certificate.
    let dir = tempfile::tempdir().expect("tmp");
    let first = tempfile::tempdir().expect("tmp");
    let second = tempfile::tempdir().expect("tmp");
    let mut cfg = config();
    cfg.auto_accept.insert("env".into(), "prod".into());
    let hub = Hub::start_in(dir.path(), any_port(), cfg).await;
    hub.store
        .create_cluster(&pre_created("edge-1"), false)
        .await
        .expect("pre-create");
    let token = hub
        .scoped_token(TokenScope {
            cluster_name: Some("edge-1".into()),
            labels: labels(&[("env", "prod")]),
            ..TokenScope::default()
        })
        .await;
    let options = hub.join_options(&token, "edge-1", first.path());
    let err = join_err(&options).await;
    assert!(matches!(err, JoinError::Timeout(..)), "{err}");
    let record = hub
        .store
        .get_cluster("edge-1")
        .await
        .expect("get")
        .expect("kept");
    assert!(!record.hub_accepts_client);
    assert_eq!(
        record.registration.key_fingerprint,
        agent_key_fingerprint(first.path())
    );

    // Another key now finds the name taken, even before acceptance.
    let err = join_err(&hub.join_options(&token, "edge-1", second.path())).await;
    assert!(
        matches!(
            err,
            JoinError::Refused {
                code: Code::AlreadyExists,
                ..
            }
        ),
        "{err}"
    );

    hub.store
        .set_accepted("edge-1", true)
        .await
        .expect("accept");
    join(&options, &mut |_| {})
        .await
        .expect("join after accept");
    hub.stop().await;
}

#[tokio::test]
async fn labels_are_the_admins_and_an_agent_cannot_relabel_itself_by_joining_again() {
    // A cluster's labels (placement, auto-accept) come from its token or the admin; labels the
    // agent asserts are recorded as claims, on the first join and on every re-join (site=d ->
    // site=a by re-joining used to move the cluster), and they never auto-accept.
    let dir = tempfile::tempdir().expect("tmp");
    let agent = tempfile::tempdir().expect("tmp");
    let other = tempfile::tempdir().expect("tmp");
    let mut cfg = config();
    cfg.auto_accept.insert("site".into(), "a".into());
    let hub = Hub::start_in(dir.path(), any_port(), cfg).await;

    // An unlabelled token: the agent says site=a, which would auto-accept if it were believed.
    let token = hub.token().await;
    let mut options = hub.join_options(&token, "rogue", other.path());
    options.labels.insert("site".into(), "a".into());
    let err = join_err(&options).await;
    assert!(
        matches!(err, JoinError::Timeout(..)),
        "pending, not accepted: {err}"
    );
    let rogue = hub
        .store
        .get_cluster("rogue")
        .await
        .expect("get")
        .expect("recorded");
    assert!(!rogue.hub_accepts_client);
    assert!(
        rogue.registration.labels.is_empty(),
        "{:?}",
        rogue.registration
    );
    assert_eq!(rogue.registration.claims, labels(&[("site", "a")]));

    // A token the admin labelled site=d: the cluster is site=d (and not auto-accepted).
    let token = hub
        .scoped_token(TokenScope {
            labels: labels(&[("site", "d")]),
            ..TokenScope::default()
        })
        .await;
    let mut options = hub.join_options(&token, "edge-d", agent.path());
    options.labels.insert("site".into(), "d".into());
    let _ = join_err(&options).await;
    hub.store
        .set_accepted("edge-d", true)
        .await
        .expect("accept");
    join(&options, &mut |_| {}).await.expect("accepted");
    // Re-joining with site=a changes claims only.
    options.labels.insert("site".into(), "a".into());
    join(&options, &mut |_| {}).await.expect("re-join");
    let record = hub
        .store
        .get_cluster("edge-d")
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(record.registration.labels, labels(&[("site", "d")]));
    assert_eq!(record.registration.claims, labels(&[("site", "a")]));

    // A token the admin labelled site=a auto-accepts.
    let token = hub
        .scoped_token(TokenScope {
            labels: labels(&[("site", "a")]),
            ..TokenScope::default()
        })
        .await;
    let third = tempfile::tempdir().expect("tmp");
    join(
        &hub.join_options(&token, "edge-a", third.path()),
        &mut |_| {},
    )
    .await
    .expect("auto-accepted by the admin's label");
    hub.stop().await;
}

#[tokio::test]
async fn a_token_bound_to_a_name_or_a_use_count_registers_nothing_else() {
    // `token create --cluster-name N` joins only as N; `--uses 1` registers one cluster (its own
    // re-joins do not count); refusals are PERMISSION_DENIED naming the fix and record nothing.
    let dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(dir.path(), any_port(), config()).await;
    let a = tempfile::tempdir().expect("tmp");
    let b = tempfile::tempdir().expect("tmp");

    let bound = bound_token(&hub, "edge-1").await;
    let before = hub.snapshot().await;
    match join_err(&hub.join_options(&bound, "edge-2", a.path())).await {
        JoinError::Refused { code, message } => {
            assert_eq!(code, Code::PermissionDenied, "{message}");
            assert!(message.contains("bound to cluster \"edge-1\""), "{message}");
        }
        other => panic!("expected PERMISSION_DENIED, got {other}"),
    }
    assert_eq!(hub.snapshot().await.0, before.0, "no cluster recorded");

    let once = hub
        .scoped_token(TokenScope {
            max_uses: Some(1),
            ..TokenScope::default()
        })
        .await;
    let first = hub.join_options(&once, "one", a.path());
    let _ = join_err(&first).await;
    hub.store.set_accepted("one", true).await.expect("accept");
    join(&first, &mut |_| {}).await.expect("first use");
    join(&first, &mut |_| {})
        .await
        .expect("a re-join is not a use");
    let before = hub.snapshot().await;
    match join_err(&hub.join_options(&once, "two", b.path())).await {
        JoinError::Refused { code, message } => {
            assert_eq!(code, Code::PermissionDenied, "{message}");
            assert!(message.contains("--uses"), "{message}");
        }
        other => panic!("expected PERMISSION_DENIED, got {other}"),
    }
    assert_eq!(hub.snapshot().await.0, before.0, "no second cluster");
    let (id, _) = tokens::parse(&once).expect("parse");
    let record = hub.store.get_token(id).await.expect("get").expect("kept");
    assert_eq!((record.uses, record.max_uses), (1, Some(1)));
    assert!(!record.has_uses_left());
    hub.stop().await;
}

#[tokio::test]
async fn a_server_holding_a_superlink_certificate_cannot_pass_as_the_hub() {
    // SuperLink certificates come from the Flower CA, never from the CA agents pin. A fake hub
    // built on what a SuperLink holds (a certificate of the Flower CA) is refused by an agent
    // pinned to the real hub's CA before the token is sent.
    let real = tempfile::tempdir().expect("tmp");
    let fake = tempfile::tempdir().expect("tmp");
    let agent_dir = tempfile::tempdir().expect("tmp");
    let hub = Hub::start_in(real.path(), any_port(), config()).await;
    let flower_ca =
        flower_addon_hub::registration::store::load_or_create_flower_ca(hub.store.as_ref())
            .await
            .expect("flower ca");
    assert_ne!(flower_ca.hash(), hub.ca.hash(), "one CA for both roles");
    // SuperLink certificates come from the Federation's CA, derived from the Flower CA.
    let superlink = flower_ca
        .federation("default", "fed")
        .expect("Federation CA")
        .issue_superlink_cert("fed", &["127.0.0.1".to_owned()], Duration::from_secs(3600))
        .expect("superlink cert");
    let (_, pem) = x509_parser::pem::parse_x509_pem(superlink.cert_pem.as_bytes()).expect("pem");
    let issuer = pem.parse_x509().expect("x509").issuer().to_string();
    assert!(issuer.contains("default/fed SuperLink CA"), "{issuer}");

    // The fake hub signs with the Flower CA (what a SuperLink's certificate chains to).
    let fake_store =
        flower_addon_hub::registration::store::file::FileStore::open(fake.path()).expect("store");
    fake_store
        .create_ca(flower_ca.material())
        .await
        .expect("fake hub's CA");
    let fake_hub = Hub::start_in(fake.path(), any_port(), config()).await;
    assert_eq!(fake_hub.ca.hash(), flower_ca.hash());
    let token = fake_hub.token().await;
    let mut options = fake_hub.join_options(&token, "edge-1", agent_dir.path());
    options.ca_hash = hub.ca.hash().to_owned();
    match join_err(&options).await {
        JoinError::CaMismatch(detail) => assert!(detail.contains(flower_ca.hash()), "{detail}"),
        other => panic!("expected CaMismatch, got {other}"),
    }
    assert!(
        fake_hub
            .store
            .list_clusters()
            .await
            .expect("list")
            .is_empty(),
        "the fake hub got a join request"
    );
    fake_hub.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn pending_clusters_are_capped_and_an_oversized_agent_version_is_refused() {
    // With room for 2 clusters waiting for acceptance, a third new name is refused with
    // RESOURCE_EXHAUSTED naming the fix, and registers nothing; once one is accepted there is
    // room again. A 65-character agent_version is INVALID_ARGUMENT.
    let dir = tempfile::tempdir().expect("tmp");
    let mut cfg = config();
    cfg.max_pending_clusters = 2;
    let hub = Hub::start_in(dir.path(), any_port(), cfg).await;
    let token = hub.token().await;
    let request = |name: &str, version: &str| {
        let agent_dir = tempfile::tempdir().expect("tmp");
        let key = load_or_generate_key(agent_dir.path()).expect("key");
        JoinRequest {
            token: token.clone(),
            cluster_name: name.into(),
            csr_pem: make_csr(&key, name).expect("csr"),
            agent_version: version.into(),
            ..Default::default()
        }
    };
    for name in ["p-1", "p-2"] {
        let response = raw_join(&hub, request(name, "0.1.0")).await.expect(name);
        assert_eq!(response.status, JoinStatus::Pending as i32);
    }
    let before = hub.snapshot().await;
    let refused = raw_join(&hub, request("p-3", "0.1.0"))
        .await
        .expect_err("a third pending cluster");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("flower-hub accept"),
        "{}",
        refused.message()
    );
    assert_eq!(hub.snapshot().await, before, "nothing registered");
    hub.store.set_accepted("p-1", true).await.expect("accept");
    let response = raw_join(&hub, request("p-3", "0.1.0")).await.expect("room");
    assert_eq!(response.status, JoinStatus::Pending as i32);

    let long = raw_join(&hub, request("p-4", &"1".repeat(65)))
        .await
        .expect_err("oversized agent_version");
    assert_eq!(long.code(), Code::InvalidArgument);
    assert!(
        long.message().contains("agent_version"),
        "{}",
        long.message()
    );
    hub.stop().await;
}

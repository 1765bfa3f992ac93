use super::watch::ChangeFilter;
use super::*;
use crate::registration::store::CONDITION_AVAILABLE;

fn registration() -> ClusterRegistration {
    ClusterRegistration {
        name: "spoke-1".into(),
        labels: BTreeMap::from([("env".into(), "prod".into())]),
        claims: BTreeMap::from([("region".into(), "eu".into())]),
        key_fingerprint: "sha256:ab".into(),
        previous_key_fingerprint: None,
        agent_version: "0.1.0".into(),
        token_id: "abcdef".into(),
        created_unix: 1_700_000_000,
    }
}

#[test]
fn registration_round_trips_through_a_managed_cluster() {
    // Invariant: what create_cluster/put_status write reads back as the same record.
    let reg = registration();
    let mut mc = ManagedCluster::new("spoke-1", ManagedClusterSpec::default());
    mc.metadata.annotations = Some(registration_annotations(&reg));
    // The labels are the admin's, on the object; the agent's declarations go to the status.
    mc.metadata.labels = Some(reg.labels.clone());
    let mut status = ManagedClusterStatus {
        labels: BTreeMap::from([("site".into(), "asserted".into())]),
        ..ManagedClusterStatus::default()
    };
    set_declared(&mut status, &reg);
    assert!(
        status.labels.is_empty(),
        "old agent-asserted labels are cleared"
    );
    status.last_heartbeat = Some(time_of(1_700_000_100));
    status.conditions.push(Condition {
        type_: "Joined".into(),
        status: "True".into(),
        reason: "ClientCertificateIssued".into(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: time_of(1_700_000_050),
    });
    mc.status = Some(status);
    let record = record_of(&mc);
    assert_eq!(record.registration, reg);
    assert!(!record.hub_accepts_client);
    // The cluster's own lease (OCM's default 60 s unless the admin or the hub set another).
    assert_eq!(
        record.lease_duration,
        Some(std::time::Duration::from_secs(60))
    );
    mc.spec.lease_duration_seconds = 7;
    assert_eq!(
        record_of(&mc).lease_duration,
        Some(std::time::Duration::from_secs(7))
    );
    assert_eq!(record.status.last_heartbeat_unix, Some(1_700_000_100));
    assert_eq!(
        record
            .status
            .condition("Joined")
            .map(|c| c.last_transition_unix),
        Some(1_700_000_050)
    );
}

#[test]
fn unavailable_clusters_carry_the_unreachable_taint_until_available() {
    // Invariant: Available!=True ⇒ exactly one NoSelect unreachable taint added when the
    // condition changed; Available=True ⇒ none; other taints are never touched.
    let mut spec = ManagedClusterSpec {
        taints: vec![Taint {
            key: "admin".into(),
            value: None,
            effect: TaintEffect::PreferNoSelect,
            time_added: None,
        }],
        ..Default::default()
    };
    let mut status = ClusterStatus::default();
    assert!(!sync_availability_taints(&mut spec, &status));
    status.set_condition(
        CONDITION_AVAILABLE,
        "Unknown",
        "ClusterLeaseExpired",
        "",
        500,
    );
    assert!(sync_availability_taints(&mut spec, &status));
    assert!(!sync_availability_taints(&mut spec, &status));
    let taint = spec.taints.iter().find(|t| t.key == TAINT_UNREACHABLE);
    assert_eq!(taint.and_then(|t| t.time_added.clone()), Some(time_of(500)));
    status.set_condition(CONDITION_AVAILABLE, "True", "ClusterLeaseRenewed", "", 600);
    assert!(sync_availability_taints(&mut spec, &status));
    assert_eq!(spec.taints.len(), 1);
    assert_eq!(spec.taints[0].key, "admin");
    // Revoked (False): unavailable, not unreachable; back to Unknown swaps them.
    status.set_condition(CONDITION_AVAILABLE, "False", "ClusterRevoked", "", 700);
    assert!(sync_availability_taints(&mut spec, &status));
    let keys: Vec<&str> = spec.taints.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys, ["admin", TAINT_UNAVAILABLE]);
    assert_eq!(spec.taints[1].time_added, Some(time_of(700)));
    status.set_condition(
        CONDITION_AVAILABLE,
        "Unknown",
        "ClusterLeaseExpired",
        "",
        800,
    );
    assert!(sync_availability_taints(&mut spec, &status));
    let keys: Vec<&str> = spec.taints.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys, ["admin", TAINT_UNREACHABLE]);
}

#[test]
fn token_secrets_hold_only_the_hash_and_announce_expiry() {
    // Invariant: a token Secret carries the record (hash, not the secret) and an RFC 3339
    // expiry annotation, and reads back unchanged.
    let token = crate::registration::tokens::generate(std::time::Duration::from_secs(3600), "test");
    let secret = token_secret("ns", &token.record).expect("secret");
    let raw =
        String::from_utf8_lossy(&secret.data.as_ref().expect("data")["token.json"].0).into_owned();
    let (_, plain) = token.token.split_once('.').expect("id.secret");
    assert!(!raw.contains(plain));
    assert!(secret.annotations()[ANN_TOKEN_EXPIRES].ends_with('Z'));
    assert_eq!(token_of(&secret).expect("record"), token.record);
}

#[test]
fn changes_are_announced_for_acceptance_key_and_existence_not_for_status_writes() {
    // Revocation (hubAcceptsClient=false, another key, a delete) must reach the channel at once;
    // the hub's own status writes must not make it re-read every cluster (10,000 at a restart).
    use kube::runtime::watcher::Event;
    let mc = |name: &str, accepted: bool, key: &str, heartbeat: Option<u64>| {
        let mut mc = ManagedCluster::new(
            name,
            ManagedClusterSpec {
                hub_accepts_client: accepted,
                ..Default::default()
            },
        );
        mc.metadata.annotations = Some(
            [(ANN_KEY_FINGERPRINT.to_owned(), key.to_owned())]
                .into_iter()
                .collect(),
        );
        mc.status = Some(ManagedClusterStatus {
            last_heartbeat: heartbeat.map(time_of),
            ..Default::default()
        });
        mc
    };
    let mut f = ChangeFilter::default();
    assert!(f.on_event(&Event::Init).is_empty());
    assert_eq!(
        f.on_event(&Event::InitApply(mc("a", true, "k1", None))),
        ["a"]
    );
    assert_eq!(
        f.on_event(&Event::InitApply(mc("b", true, "k1", None))),
        ["b"]
    );
    assert!(f.on_event(&Event::InitDone).is_empty());
    // A heartbeat written: nothing.
    assert!(
        f.on_event(&Event::Apply(mc("a", true, "k1", Some(5))))
            .is_empty()
    );
    // Revoked, re-keyed, deleted: announced.
    assert_eq!(
        f.on_event(&Event::Apply(mc("a", false, "k1", Some(5)))),
        ["a"]
    );
    assert_eq!(
        f.on_event(&Event::Apply(mc("a", false, "k2", Some(5)))),
        ["a"]
    );
    assert_eq!(
        f.on_event(&Event::Delete(mc("a", false, "k2", Some(5)))),
        ["a"]
    );
    // A new cluster: announced.
    assert_eq!(f.on_event(&Event::Apply(mc("c", false, "k3", None))), ["c"]);
    // The watch restarts and b was deleted meanwhile: announced at the end of the new list.
    assert!(f.on_event(&Event::Init).is_empty());
    assert!(
        f.on_event(&Event::InitApply(mc("c", false, "k3", Some(9))))
            .is_empty()
    );
    assert_eq!(f.on_event(&Event::InitDone), ["b"]);
}

#[test]
fn the_issued_certificate_round_trips_through_annotations() {
    // Invariant: what the hub records at a join or renewal (end of validity, signing CA, bundle
    // sent) reads back the same, and an unchanged status changes nothing.
    let mut mc = ManagedCluster::new("spoke-1", ManagedClusterSpec::default());
    let status = ClusterStatus {
        client_cert_not_after_unix: Some(1_800_000_000),
        client_cert_issuer: Some("sha256:aa".into()),
        channel_bundle: Some("sha256:aa,sha256:bb".into()),
        ..ClusterStatus::default()
    };
    assert!(sync_spec_with_status(&mut mc, &status));
    assert!(!sync_spec_with_status(&mut mc, &status));
    let read = record_of(&mc).status;
    assert_eq!(read.client_cert_not_after_unix, Some(1_800_000_000));
    assert_eq!(read.client_cert_issuer.as_deref(), Some("sha256:aa"));
    assert_eq!(read.channel_bundle.as_deref(), Some("sha256:aa,sha256:bb"));
    // A status from before these were recorded reads back as unknown.
    assert!(sync_spec_with_status(&mut mc, &ClusterStatus::default()));
    assert_eq!(record_of(&mc).status.client_cert_issuer, None);
}

#[test]
fn a_ca_record_round_trips_through_its_secret_in_every_rotation_phase() {
    // Invariant: the replaced CA's key survives a hub restart until `retire` (the Flower CA's
    // per-Federation CAs are derived from it, so SuperNodes keep trusting both meanwhile).
    use crate::registration::ca::{CaRole, HubCa};
    use crate::registration::rotation::{RotationStep, rotate};
    let idle = HubCa::generate_for(CaRole::Flower)
        .unwrap()
        .material()
        .clone();
    let staged = rotate(CaRole::Flower, &idle, RotationStep::Stage).unwrap();
    let promoted = rotate(CaRole::Flower, &staged, RotationStep::Promote).unwrap();
    let retired = rotate(CaRole::Flower, &promoted, RotationStep::Retire).unwrap();
    assert_eq!(
        promoted.previous_key_pem.as_deref(),
        Some(idle.key_pem.as_str())
    );
    for material in [idle, staged, promoted, retired] {
        let secret = Secret {
            data: Some(mapping::ca_data(&material)),
            ..Secret::default()
        };
        let back = mapping::ca_of(&secret).unwrap();
        assert!(back == material, "a CA record changed through its Secret");
        let fed = |m: &CaMaterial| {
            HubCa::from_material(m.clone())
                .unwrap()
                .federation("team", "fed")
                .unwrap()
                .bundle_pem()
                .to_owned()
        };
        assert_eq!(fed(&back), fed(&material));
    }
}

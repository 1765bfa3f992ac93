use super::*;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
use rcgen::{CertificateParams, DistinguishedName, KeyPair};
use rustls::pki_types::pem::PemObject;

/// A CSR as OCM's klusterlet of `requester` makes it for cluster `cluster`, asking for
/// `common_name`.
fn csr(cluster: &str, requester: &str, common_name: &str) -> (CertificateSigningRequest, KeyPair) {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    let pem = params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    let mut csr = CertificateSigningRequest {
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(pem.into_bytes()),
            signer_name: flower_addon_proto::OCM_ADDON_SIGNER.to_owned(),
            username: Some(format!(
                "system:open-cluster-management:{requester}:agent-id"
            )),
            groups: Some(vec![
                format!("system:open-cluster-management:{requester}"),
                "system:open-cluster-management:managed-clusters".to_owned(),
                "system:authenticated".to_owned(),
            ]),
            ..Default::default()
        },
        ..Default::default()
    };
    csr.metadata.name = Some(format!("addon-{cluster}-flower-addon-x1"));
    csr.metadata.labels = Some(BTreeMap::from([
        (CLUSTER_LABEL.to_owned(), cluster.to_owned()),
        (
            ADDON_LABEL.to_owned(),
            flower_addon_proto::OCM_ADDON_NAME.to_owned(),
        ),
    ]));
    (csr, key)
}

#[test]
fn a_clusters_own_klusterlet_gets_its_clusters_identity() {
    let (request, _) = csr("edge-1", "edge-1", flower_addon_proto::OCM_ADDON_AGENT_CN);
    assert_eq!(requested_cluster(&request), Ok("edge-1".to_owned()));
}

#[test]
fn another_clusters_klusterlet_is_refused() {
    // edge-1's klusterlet asks for edge-2's identity: the labels say edge-2, the requester's
    // apiserver-set group says edge-1.
    let (request, _) = csr("edge-2", "edge-1", flower_addon_proto::OCM_ADDON_AGENT_CN);
    let why = requested_cluster(&request).unwrap_err();
    assert!(
        matches!(&why, Refusal::NotItsKlusterlet { cluster, .. } if cluster == "edge-2"),
        "{why:?}"
    );
    assert!(
        why.to_string()
            .contains("not the klusterlet of cluster \"edge-2\""),
        "{why}"
    );
    // A prefix is not a cluster (OCM's own approver checks the user name by prefix, so
    // `edge-1` would pass for the klusterlet of `edge-10`).
    let (request, _) = csr("edge-1", "edge-10", flower_addon_proto::OCM_ADDON_AGENT_CN);
    assert!(requested_cluster(&request).is_err());
}

#[test]
fn labels_subject_and_names_are_checked_with_the_fix() {
    let (mut request, _) = csr("edge-1", "edge-1", flower_addon_proto::OCM_ADDON_AGENT_CN);
    request
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(ADDON_LABEL.to_owned(), "other".to_owned());
    assert!(
        requested_cluster(&request)
            .unwrap_err()
            .to_string()
            .contains(ADDON_LABEL)
    );
    let (mut request, _) = csr("edge-1", "edge-1", flower_addon_proto::OCM_ADDON_AGENT_CN);
    request
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(CLUSTER_LABEL);
    assert!(
        requested_cluster(&request)
            .unwrap_err()
            .to_string()
            .contains(CLUSTER_LABEL)
    );
    // The template's subject was changed: the klusterlet would refuse what the hub issues.
    let (request, _) = csr(
        "edge-1",
        "edge-1",
        "system:open-cluster-management:cluster:edge-1:addon:flower-addon:agent:x",
    );
    let why = requested_cluster(&request).unwrap_err();
    assert_eq!(why, Refusal::Subject);
    assert!(why.to_string().contains("customSigner.subject"), "{why}");
    // OCM allows names the addon's clusters cannot have.
    let (request, _) = csr("Edge_1", "Edge_1", flower_addon_proto::OCM_ADDON_AGENT_CN);
    assert!(
        requested_cluster(&request)
            .unwrap_err()
            .to_string()
            .contains("cannot be a flower-addon cluster")
    );
    let (mut request, _) = csr("edge-1", "edge-1", flower_addon_proto::OCM_ADDON_AGENT_CN);
    request.spec.request = k8s_openapi::ByteString(b"garbage".to_vec());
    assert!(
        requested_cluster(&request)
            .unwrap_err()
            .to_string()
            .contains("spec.request")
    );
}

#[test]
fn ocm_must_accept_the_cluster_and_enable_the_addon() {
    let ok = OcmCluster {
        exists: true,
        accepted: true,
        addon_enabled: true,
    };
    assert_eq!(admit("edge-1", &ok), Ok(()));
    for (ocm, says) in [
        (
            OcmCluster {
                exists: false,
                ..ok.clone()
            },
            "join the cluster to OCM",
        ),
        (
            OcmCluster {
                accepted: false,
                ..ok.clone()
            },
            "clusteradm accept",
        ),
        (
            OcmCluster {
                addon_enabled: false,
                ..ok.clone()
            },
            "clusteradm addon enable",
        ),
    ] {
        let why = admit("edge-1", &ocm).unwrap_err().to_string();
        assert!(why.contains(says), "{why}");
    }
}

#[test]
fn finished_csrs_are_left_alone() {
    let (mut request, _) = csr("edge-1", "edge-1", flower_addon_proto::OCM_ADDON_AGENT_CN);
    assert_eq!(next(&request), Next::Judge { approved: false });
    let condition = |t: &str| CertificateSigningRequestCondition {
        type_: t.to_owned(),
        status: "True".to_owned(),
        ..Default::default()
    };
    request.status = Some(CertificateSigningRequestStatus {
        conditions: Some(vec![condition("Approved")]),
        certificate: None,
    });
    assert_eq!(next(&request), Next::Judge { approved: true });
    for t in ["Denied", "Failed"] {
        request.status.as_mut().unwrap().conditions = Some(vec![condition(t)]);
        assert_eq!(next(&request), Next::Done, "{t}");
    }
    request.status = Some(CertificateSigningRequestStatus {
        conditions: Some(vec![condition("Approved")]),
        certificate: Some(k8s_openapi::ByteString(b"-----BEGIN".to_vec())),
    });
    assert_eq!(next(&request), Next::Done);
}

#[test]
fn the_issued_certificate_carries_the_klusterlets_subject_and_the_cluster() {
    let ca = HubCa::generate().expect("ca");
    let (request, _) = csr("edge-1", "edge-1", flower_addon_proto::OCM_ADDON_AGENT_CN);
    let pem = String::from_utf8(request.spec.request.0.clone()).unwrap();
    let issued = ca
        .sign_ocm_addon_csr(&pem, "edge-1", Duration::from_secs(3600))
        .expect("issued");
    let der =
        rustls::pki_types::CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).expect("der");
    // OCM's klusterlet keeps a certificate only if its subject is the registration's subject.
    let (_, parsed) = x509_parser::parse_x509_certificate(der.as_ref()).expect("parse");
    let names: Vec<String> = parsed
        .subject()
        .iter_attributes()
        .map(|a| a.as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(names, [flower_addon_proto::OCM_ADDON_AGENT_CN]);
    // The hub reads the cluster from the SAN, and the key binds it.
    let identity = crate::channel::tls::peer_identity(&der).expect("identity");
    assert_eq!(identity.cluster_name, "edge-1");
    assert_eq!(identity.key_fingerprint, issued.key_fingerprint);
    assert!(
        ca.sign_ocm_addon_csr(&pem, "", Duration::from_secs(60))
            .is_err()
    );
}

#[tokio::test]
async fn registration_binds_the_new_key_keeps_the_previous_and_leaves_acceptance_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let store = crate::registration::store::file::FileStore::open(dir.path()).expect("store");
    register(&store, "edge-1", "sha256:k1")
        .await
        .expect("registered");
    let record = store.get_cluster("edge-1").await.unwrap().expect("cluster");
    assert!(record.hub_accepts_client);
    assert_eq!(
        record
            .registration
            .labels
            .get(REGISTERED_BY_LABEL)
            .map(String::as_str),
        Some(REGISTERED_BY_OCM)
    );
    assert_eq!(record.registration.key_fingerprint, "sha256:k1");
    // The klusterlet renews with a new key: the old one stays trusted as the previous.
    register(&store, "edge-1", "sha256:k2")
        .await
        .expect("re-keyed");
    let record = store.get_cluster("edge-1").await.unwrap().expect("cluster");
    assert_eq!(record.registration.key_fingerprint, "sha256:k2");
    assert_eq!(
        record.registration.previous_key_fingerprint.as_deref(),
        Some("sha256:k1")
    );
    assert!(record.registration.binds("sha256:k1") && !record.registration.binds("sha256:k0"));
    // Revoked by the hub's admin: a renewal does not accept it again.
    store.set_accepted("edge-1", false).await.expect("revoked");
    register(&store, "edge-1", "sha256:k3")
        .await
        .expect("re-keyed");
    let record = store.get_cluster("edge-1").await.unwrap().expect("cluster");
    assert!(!record.hub_accepts_client);
    assert_eq!(
        record.registration.previous_key_fingerprint.as_deref(),
        Some("sha256:k2")
    );
}

#[tokio::test]
async fn a_cluster_joined_with_a_token_is_not_taken_over() {
    let dir = tempfile::tempdir().expect("dir");
    let store = crate::registration::store::file::FileStore::open(dir.path()).expect("store");
    let joined = ClusterRegistration {
        name: "edge-1".into(),
        labels: BTreeMap::new(),
        claims: BTreeMap::new(),
        key_fingerprint: "sha256:joined".into(),
        previous_key_fingerprint: None,
        agent_version: String::new(),
        token_id: "abcdef".into(),
        created_unix: 0,
    };
    store.create_cluster(&joined, true).await.expect("joined");
    let why = register(&store, "edge-1", "sha256:ocm").await.unwrap_err();
    assert!(
        why.contains("bootstrap token") && why.contains("delete that ManagedCluster"),
        "{why}"
    );
    let record = store.get_cluster("edge-1").await.unwrap().expect("cluster");
    assert_eq!(record.registration.key_fingerprint, "sha256:joined");
}

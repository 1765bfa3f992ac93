//! The hub's pod policy refuses the same Federation the same way in both hub modes and in
//! `flower-hub validate`: a SuperLink `podTemplate` and a hub-local pool asking for host access,
//! root and another ServiceAccount give the same `(field, message)` problems, each naming the
//! `flower-hub serve --allow` flag; with the admin's allowances none of them is left.
use std::collections::BTreeSet;
use std::process::Command;

use flower_addon_crds::Federation;
use flower_addon_crds::policy::{Admin, Allowance, PodPolicy};
use flower_addon_hub::standalone::manifests::Manifests;

const FEDERATION: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {name: breakout, namespace: team}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  superlink:
    image: "flwr/superlink:1.42.0"
    podTemplate:
      spec:
        hostPID: true
        volumes: [{name: root, hostPath: {path: /}}]
  supernodes:
    image: "flwr/supernode:1.42.0"
    pools:
      - name: a
        replicas: 1
        images: {}
        podTemplate:
          spec:
            hostNetwork: true
            serviceAccountName: hub-admin
            securityContext: {runAsUser: 0}
"#;

/// The problems of the Kubernetes mode (what its Federation controller and work source refuse).
fn kube_problems(fed: &Federation, policy: &PodPolicy) -> BTreeSet<String> {
    flower_addon_hub::core::problems::problems(fed, policy)
        .into_iter()
        .map(|(path, message)| format!("{path}: {message}"))
        .collect()
}

/// The problems the standalone hub lists for the manifests file (`FILE: path: message`), the
/// file's name taken off.
fn standalone_problems(policy: &PodPolicy) -> BTreeSet<String> {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("fed.yaml");
    std::fs::write(&file, FEDERATION).expect("write");
    let mut manifests = Manifests::new(dir.path().to_path_buf(), policy.clone());
    manifests.refresh();
    let prefix = format!("{}: ", file.display());
    manifests
        .problems()
        .iter()
        .map(|p| p.strip_prefix(&prefix).unwrap_or(p).to_owned())
        .collect()
}

#[test]
fn both_modes_and_validate_refuse_the_same_pods_naming_the_same_flags() {
    // Invariant: same input, same refusal in both modes (and `validate`), every host-access,
    // root and ServiceAccount ask named with its field and flag; allowed, nothing is refused.
    let fed: Federation = serde_saphyr::from_str(FEDERATION).expect("Federation");
    let policy = PodPolicy::new(Admin::Hub);
    let kube = kube_problems(&fed, &policy);
    let standalone = standalone_problems(&policy);
    assert_eq!(kube, standalone, "the modes differ");
    for part in [
        "spec.superlink: hostPID is not allowed in the hub cluster",
        "`flower-hub serve --allow host-pid`",
        "spec.superlink: volume root (hostPath /) is not allowed",
        "spec.supernodes.pools[0]: hostNetwork is not allowed in the hub cluster",
        "spec.supernodes.pools[0]: pod securityContext.runAsUser 0 is not allowed",
        "`flower-hub serve --allow run-as-root`",
        "spec.supernodes.pools[0]: serviceAccountName hub-admin is not allowed",
        "`flower-hub serve --allow-service-account hub-admin`",
    ] {
        assert!(
            kube.iter().any(|p| p.contains(part)),
            "{part:?} not in {kube:#?}"
        );
    }
    // `flower-hub validate` prints the same lines.
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("fed.yaml");
    std::fs::write(&file, FEDERATION).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_flower-hub"))
        .arg("validate")
        .arg(&file)
        .output()
        .expect("validate");
    assert!(!out.status.success());
    let prefix = format!("{}: ", file.display());
    let validate: BTreeSet<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(|l| l.strip_prefix(&prefix).unwrap_or(l).to_owned())
        .collect();
    assert_eq!(validate, kube, "validate differs");

    // The admin opens each door by name: nothing left in either mode.
    let mut open = PodPolicy::new(Admin::Hub);
    open.allowed = [
        Allowance::HostPid,
        Allowance::HostPath,
        Allowance::HostNetwork,
        Allowance::RunAsRoot,
    ]
    .into();
    open.service_accounts = ["hub-admin".to_owned()].into();
    assert!(kube_problems(&fed, &open).is_empty());
    assert!(standalone_problems(&open).is_empty());
}

use super::*;
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource, HostPathVolumeSource,
    NFSVolumeSource, SecretKeySelector, SecretVolumeSource, Sysctl, Volume,
};

fn spec() -> PodSpec {
    PodSpec {
        containers: vec![Container {
            name: "supernode".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn none() -> BTreeSet<String> {
    BTreeSet::new()
}

#[test]
fn secrets_other_volume_types_and_escapes_from_confinement_are_refused_naming_the_flag() {
    // Invariant: Secrets not made for the Federation, volume types that reach storage or the node,
    // unconfined profiles, unsafe sysctls, root and a ServiceAccount token are each refused with
    // the flag that allows them; allowed, they pass.
    let own: BTreeSet<String> = ["fed-superlink-ca".to_owned()].into();
    let policy = PodPolicy::spoke_default();
    let mut ok = spec();
    ok.volumes = Some(vec![
        Volume {
            name: "ca".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some("fed-superlink-ca".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "cfg".into(),
            config_map: Some(ConfigMapVolumeSource::default()),
            ..Default::default()
        },
    ]);
    ok.security_context = Some(PodSecurityContext {
        sysctls: Some(vec![Sysctl {
            name: "net.ipv4.tcp_keepalive_time".into(),
            value: "60".into(),
        }]),
        ..Default::default()
    });
    assert!(policy.pod_violations(&ok, &own).is_empty());
    let mut bad = ok.clone();
    bad.volumes.get_or_insert_default().extend([
        Volume {
            name: "tokens".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some("agent-credentials".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "share".into(),
            nfs: Some(NFSVolumeSource {
                server: "nfs".into(),
                path: "/".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]);
    bad.security_context = Some(PodSecurityContext {
        run_as_user: Some(0),
        run_as_non_root: Some(false),
        seccomp_profile: Some(SeccompProfile {
            type_: "Unconfined".into(),
            ..Default::default()
        }),
        sysctls: Some(vec![Sysctl {
            name: "kernel.msgmax".into(),
            value: "1".into(),
        }]),
        ..Default::default()
    });
    bad.automount_service_account_token = Some(true);
    bad.containers[0].env = Some(vec![EnvVar {
        name: "STOLEN".into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: "hub-token".into(),
                key: "token".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    let v = policy.pod_violations(&bad, &own);
    assert_eq!(v.len(), 8, "{v:#?}");
    for flag in [
        "--allow secrets",
        "--allow other-volumes",
        "--allow unconfined",
        "--allow run-as-root",
        "--allow service-account-token",
    ] {
        assert!(v.iter().any(|m| m.contains(flag)), "{flag} in {v:#?}");
    }
    let mut allowing = PodPolicy::spoke_default();
    allowing.allowed = [
        Allowance::Secrets,
        Allowance::OtherVolumes,
        Allowance::Unconfined,
        Allowance::RunAsRoot,
        Allowance::ServiceAccountToken,
    ]
    .into();
    assert!(allowing.pod_violations(&bad, &own).is_empty());
}

fn host_access_pod() -> PodSpec {
    let mut bad = spec();
    bad.host_network = Some(true);
    bad.host_pid = Some(true);
    bad.host_ipc = Some(true);
    bad.service_account_name = Some("cluster-admin-sa".into());
    bad.volumes = Some(vec![Volume {
        name: "root".into(),
        host_path: Some(HostPathVolumeSource {
            path: "/".into(),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    bad.containers[0].security_context = Some(SecurityContext {
        privileged: Some(true),
        ..Default::default()
    });
    bad.containers[0].ports = Some(vec![ContainerPort {
        container_port: 80,
        host_port: Some(80),
        ..Default::default()
    }]);
    bad
}

#[test]
fn the_default_refuses_host_access_privilege_and_foreign_accounts_naming_the_flag() {
    // Invariant: host namespaces, host paths, privileged containers, host ports and another
    // ServiceAccount are refused by default, each naming its flag; what is allowed passes.
    let policy = PodPolicy::spoke_default();
    assert!(policy.pod_violations(&spec(), &none()).is_empty());
    let bad = host_access_pod();
    let v = policy.pod_violations(&bad, &none());
    assert_eq!(v.len(), 7, "{v:#?}");
    for flag in [
        "`flower-agent run --allow host-network`",
        "--allow host-pid",
        "--allow host-ipc",
        "--allow host-path",
        "--allow privileged",
        "--allow host-port",
        "--allow-service-account cluster-admin-sa",
    ] {
        assert!(v.iter().any(|m| m.contains(flag)), "{flag} in {v:#?}");
    }
    let mut allowing = PodPolicy::spoke_default();
    allowing.allowed = [Allowance::HostPath, Allowance::Privileged].into();
    allowing.service_accounts = ["cluster-admin-sa".to_string()].into();
    assert_eq!(allowing.pod_violations(&bad, &none()).len(), 4);
    assert!(
        PodPolicy::unrestricted()
            .pod_violations(&bad, &none())
            .is_empty()
    );
}

#[test]
fn the_hub_names_its_own_flag() {
    // Invariant: a refusal on the hub names `flower-hub serve --allow` and the hub's Helm value,
    // never the agent's.
    let v = PodPolicy::new(Admin::Hub).pod_violations(&host_access_pod(), &none());
    assert_eq!(v.len(), 7);
    assert!(v.iter().all(|m| m.contains("`flower-hub serve --allow")
        && m.contains("hub.podPolicy")
        && m.contains("the hub cluster")
        && !m.contains("flower-agent")));
}

#[test]
fn added_capabilities_are_privilege() {
    // Invariant: a container that adds capabilities needs `--allow privileged`.
    let mut pod = spec();
    pod.containers[0].security_context = Some(SecurityContext {
        capabilities: Some(Capabilities {
            add: Some(vec!["SYS_ADMIN".into()]),
            drop: None,
        }),
        ..Default::default()
    });
    let v = PodPolicy::spoke_default().pod_violations(&pod, &none());
    assert!(
        v.len() == 1 && v[0].contains("capabilities added") && v[0].contains("--allow privileged"),
        "{v:?}"
    );
}

#[test]
fn harden_fills_only_what_the_template_left_unset() {
    // Invariant: a rendered pod runs non-root as Flower's uid with RuntimeDefault seccomp, every
    // unprivileged container drops all capabilities and cannot escalate; values the template set
    // stay (and are judged by the policy), privileged containers are left alone.
    let mut pod = spec();
    pod.containers.push(Container {
        name: "amd".into(),
        security_context: Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    });
    harden(&mut pod);
    let sc = pod.security_context.clone().unwrap();
    assert_eq!(sc.run_as_user, Some(FLOWER_UID));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    let c = pod.containers[0].security_context.clone().unwrap();
    assert_eq!(c.allow_privilege_escalation, Some(false));
    assert_eq!(c.capabilities.unwrap().drop, Some(vec!["ALL".to_owned()]));
    let amd = pod.containers[1].security_context.clone().unwrap();
    assert_eq!(
        (amd.allow_privilege_escalation, amd.capabilities),
        (None, None)
    );
    // A hardened pod passes the default policy (but for the privileged container).
    assert_eq!(
        PodPolicy::spoke_default()
            .pod_violations(&pod, &none())
            .len(),
        1
    );
    // The template's own user stays; root is not made non-root but refused by the policy.
    let mut root = spec();
    root.security_context = Some(PodSecurityContext {
        run_as_user: Some(0),
        ..Default::default()
    });
    harden(&mut root);
    let sc = root.security_context.clone().unwrap();
    assert_eq!((sc.run_as_user, sc.run_as_non_root), (Some(0), None));
    assert!(
        PodPolicy::spoke_default().pod_violations(&root, &none())[0]
            .contains("--allow run-as-root")
    );
    // Hardening twice changes nothing (a reconcile renders the same object).
    let once = pod.clone();
    harden(&mut pod);
    assert_eq!(pod, once);
}

#[test]
fn allowances_and_levels_parse_from_their_flags() {
    // Invariant: every allowance round-trips through its flag; unknown names list the known.
    for a in Allowance::ALL {
        assert_eq!(a.flag().parse::<Allowance>(), Ok(a));
    }
    let err = "host".parse::<Allowance>().unwrap_err();
    assert!(
        err.contains("host-path") && err.contains("weaker-namespaces"),
        "{err}"
    );
    for name in PodSecurityLevel::NAMES {
        assert!(name.parse::<PodSecurityLevel>().is_ok());
    }
    assert!("strict".parse::<PodSecurityLevel>().is_err());
}

#[test]
fn namespaces_get_the_pod_security_labels_of_the_level() {
    // Invariant: all three Pod Security modes are labelled with the policy's level.
    let labels = PodPolicy::spoke_default().namespace_labels();
    assert!(labels.contains(&(
        "pod-security.kubernetes.io/enforce".into(),
        "baseline".into()
    )));
    assert_eq!(labels.len(), 3);
    assert!(PodPolicy::unrestricted().namespace_labels().is_empty());
}

fn ns_labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn an_unlabelled_existing_namespace_gets_the_labels_it_lacks() {
    // Invariant: an unlabelled namespace gets the missing labels; one at least as strict is left.
    let policy = PodPolicy::spoke_default();
    let add = policy
        .existing_namespace(
            "default",
            &ns_labels(&[("pod-security.kubernetes.io/warn", "restricted")]),
        )
        .unwrap();
    assert_eq!(
        add,
        [
            (
                "pod-security.kubernetes.io/enforce".to_owned(),
                "baseline".to_owned()
            ),
            (
                "pod-security.kubernetes.io/audit".to_owned(),
                "baseline".to_owned()
            ),
        ]
    );
    for level in ["baseline", "restricted"] {
        let labels = ns_labels(&[("pod-security.kubernetes.io/enforce", level)]);
        assert!(
            policy
                .existing_namespace("team", &labels)
                .unwrap()
                .is_empty()
        );
    }
    let mut none = PodPolicy::spoke_default();
    none.namespace_level = PodSecurityLevel::None;
    assert!(
        none.existing_namespace("team", &ns_labels(&[]))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_weaker_existing_namespace_is_refused_unless_allowed() {
    // Invariant: a namespace labelled weaker than the policy is refused, naming the fix and the
    // flag, until the admin allows weaker namespaces.
    for (mut policy, flag) in [
        (
            PodPolicy::spoke_default(),
            "flower-agent run --allow weaker-namespaces",
        ),
        (
            PodPolicy {
                namespace_level: PodSecurityLevel::Baseline,
                ..PodPolicy::new(Admin::Hub)
            },
            "flower-hub serve --allow weaker-namespaces",
        ),
    ] {
        for value in ["privileged", "bogus"] {
            let labels = ns_labels(&[("pod-security.kubernetes.io/enforce", value)]);
            let why = policy.existing_namespace("team", &labels).unwrap_err();
            for part in [
                "namespace team",
                &format!("pod-security.kubernetes.io/enforce={value}"),
                "kubectl label namespace team pod-security.kubernetes.io/enforce=baseline --overwrite",
                flag,
            ] {
                assert!(why.contains(part), "{part:?} not in {why}");
            }
        }
        policy.allowed.insert(Allowance::WeakerNamespaces);
        let labels = ns_labels(&[("pod-security.kubernetes.io/enforce", "privileged")]);
        assert!(
            policy
                .existing_namespace("team", &labels)
                .unwrap()
                .is_empty()
        );
    }
}

#[test]
fn work_goes_only_to_managed_non_system_namespaces() {
    // Invariant: a spoke takes no work in Kubernetes' own namespaces, and with --namespaces only
    // in those; the hub's policy leaves namespaces to its RBAC.
    let mut policy = PodPolicy::spoke_default();
    assert!(policy.namespace_refusal("team-a").is_none());
    let why = policy.namespace_refusal("kube-system").unwrap();
    assert!(why.contains("Kubernetes' own"), "{why}");
    policy.namespaces = Some(["team-a".to_owned(), "team-b".to_owned()].into());
    assert!(policy.namespace_refusal("team-a").is_none());
    let why = policy.namespace_refusal("team-c").unwrap();
    for part in [
        "namespace team-c",
        "--namespaces team-a,team-b",
        "agent.namespaces",
    ] {
        assert!(why.contains(part), "{part:?} not in {why}");
    }
    assert!(
        PodPolicy::new(Admin::Hub)
            .namespace_refusal("kube-system")
            .is_none()
    );
}

#[test]
fn allowances_beyond_the_namespace_level_are_refused_at_start() {
    // Invariant: an admin who allows what the API server's Pod Security admission would refuse
    // in the namespaces the policy labels is told at once, naming both flags and the fix; the
    // other combinations are fine.
    let mut policy = PodPolicy::spoke_default();
    assert_eq!(policy.level_conflict("flower-agent run"), None);
    policy.allowed = [
        Allowance::Privileged,
        Allowance::HostPath,
        Allowance::Secrets,
    ]
    .into();
    let why = policy
        .level_conflict("flower-agent run")
        .expect("a conflict");
    assert!(
        why.starts_with(
            "`flower-agent run --allow host-path,privileged` with --namespace-pod-security baseline"
        ),
        "{why}"
    );
    assert!(why.contains("--namespace-pod-security privileged"), "{why}");
    policy.namespace_level = PodSecurityLevel::Privileged;
    assert_eq!(policy.level_conflict("flower-agent run"), None);
    policy.namespace_level = PodSecurityLevel::None;
    assert_eq!(policy.level_conflict("flower-agent run"), None);
    let mut hub = PodPolicy::new(Admin::Hub);
    hub.allowed = [Allowance::RunAsRoot, Allowance::ServiceAccountToken].into();
    assert_eq!(
        hub.level_conflict("flower-hub serve"),
        None,
        "baseline admits root"
    );
    hub.namespace_level = PodSecurityLevel::Restricted;
    let why = hub
        .level_conflict("flower-hub serve")
        .expect("restricted refuses root");
    assert!(
        why.contains("`flower-hub serve --allow run-as-root`"),
        "{why}"
    );
}

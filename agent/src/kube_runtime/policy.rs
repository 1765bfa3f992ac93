//! The spoke admin's pod policy: what the pods of the work the hub sends may do in this cluster.
//!
//! A Federation author writes the pod templates its pools run with, and a Placement may send them
//! to any cluster of the sets bound to the author's namespace; the spoke's admin decides here
//! what such pods may do. By default ([`PodPolicy::spoke_default`]) no host path volume, no host
//! network, PID or IPC namespace, no privileged container, no host port and no service account
//! other than the namespace's `default`; namespaces the agent creates get the Pod Security
//! `baseline` labels, so the apiserver enforces the same. A Federation whose pods break the
//! policy is refused as a whole (nothing of it is applied; what already runs is kept) with the
//! violations and the flag that allows each. The hub's embedded runtime for its own cluster runs
//! with [`PodPolicy::unrestricted`]: there the author's own namespace and RBAC apply, as with
//! flower-operator.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PodSpec;

use super::Rendered;
use crate::render::Workload;

/// Something a pod may be allowed to do (`flower-agent run --allow …`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Allowance {
    /// `hostPath` volumes (e.g. AMD GPU pools with `mountAll`).
    HostPath,
    /// `hostNetwork: true`.
    HostNetwork,
    /// `hostPID: true`.
    HostPid,
    /// `hostIPC: true`.
    HostIpc,
    /// `securityContext.privileged: true` on a container (e.g. AMD GPU pools).
    Privileged,
    /// `hostPort` on a container port.
    HostPort,
    /// Volume types beyond configMap, emptyDir, persistentVolumeClaim, ephemeral, downwardAPI
    /// and projected ones of those (NFS, iSCSI, CSI, …).
    OtherVolumes,
    /// Secrets other than those the agent made for the Federation (its CA bundle and its
    /// pools' node keys), as volumes or environment.
    Secrets,
    /// `seccompProfile`/`appArmorProfile` `Unconfined`, `procMount: Unmasked`, sysctls outside
    /// Kubernetes' safe set.
    Unconfined,
    /// `runAsUser: 0`.
    RunAsRoot,
    /// Work in a namespace that existed before the agent and whose Pod Security `enforce` label
    /// is weaker than `--namespace-pod-security` (an unlabelled one is labelled instead).
    WeakerNamespaces,
}

impl Allowance {
    fn flag(self) -> &'static str {
        match self {
            Self::HostPath => "host-path",
            Self::HostNetwork => "host-network",
            Self::HostPid => "host-pid",
            Self::HostIpc => "host-ipc",
            Self::Privileged => "privileged",
            Self::HostPort => "host-port",
            Self::OtherVolumes => "other-volumes",
            Self::Secrets => "secrets",
            Self::Unconfined => "unconfined",
            Self::RunAsRoot => "run-as-root",
            Self::WeakerNamespaces => "weaker-namespaces",
        }
    }
}

/// Pod Security Standards level put on the namespaces the agent creates
/// (`pod-security.kubernetes.io/enforce`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodSecurityLevel {
    /// No label: the cluster's default applies.
    None,
    /// `privileged` (anything goes).
    Privileged,
    /// `baseline` (the default): no host namespaces, host paths, privileged containers.
    Baseline,
    /// `restricted`: baseline plus non-root, no privilege escalation, dropped capabilities.
    Restricted,
}

impl PodSecurityLevel {
    /// The level a `pod-security.kubernetes.io/enforce` label value names (`None` for a value
    /// Kubernetes does not know).
    fn of_label(value: &str) -> Option<Self> {
        match value {
            "privileged" => Some(Self::Privileged),
            "baseline" => Some(Self::Baseline),
            "restricted" => Some(Self::Restricted),
            _ => None,
        }
    }

    /// How strict the level is (privileged 0 … restricted 2).
    fn strictness(self) -> u8 {
        match self {
            Self::None | Self::Privileged => 0,
            Self::Baseline => 1,
            Self::Restricted => 2,
        }
    }

    fn label_value(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::Privileged => Some("privileged"),
            Self::Baseline => Some("baseline"),
            Self::Restricted => Some("restricted"),
        }
    }
}

/// The Pod Security label the agent checks and sets on namespaces it deploys into.
const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// Namespaces of Kubernetes itself: labelling them could stop the cluster's own pods.
const SYSTEM_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// What the pods of received work may do, and how namespaces the agent creates are labelled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPolicy {
    /// What is allowed beyond the default.
    pub allowed: BTreeSet<Allowance>,
    /// Service accounts pods may name besides `default`.
    pub service_accounts: BTreeSet<String>,
    /// Level for namespaces the agent creates.
    pub namespace_level: PodSecurityLevel,
    /// Whether objects of the same name that this runtime did not create are refused (true on
    /// spokes) instead of taken over.
    pub refuse_foreign_objects: bool,
    /// The only namespaces work may go to (`--namespaces`; the agent's RBAC is then scoped to
    /// them); `None`: any namespace but Kubernetes' own.
    pub namespaces: Option<BTreeSet<String>>,
    /// Whether nothing is checked (the hub's own cluster).
    unrestricted: bool,
}

impl PodPolicy {
    /// A spoke's default: nothing beyond `baseline`, only the `default` service account,
    /// namespaces labelled `baseline`, foreign objects refused.
    pub fn spoke_default() -> Self {
        Self {
            allowed: BTreeSet::new(),
            service_accounts: BTreeSet::new(),
            namespace_level: PodSecurityLevel::Baseline,
            refuse_foreign_objects: true,
            namespaces: None,
            unrestricted: false,
        }
    }

    /// No check, no namespace labels, objects of the same name taken over (the hub's embedded
    /// runtime for its own cluster, as flower-operator).
    pub fn unrestricted() -> Self {
        Self {
            allowed: BTreeSet::new(),
            service_accounts: BTreeSet::new(),
            namespace_level: PodSecurityLevel::None,
            refuse_foreign_objects: false,
            namespaces: None,
            unrestricted: true,
        }
    }

    /// Labels for a namespace the agent creates.
    pub fn namespace_labels(&self) -> Vec<(String, String)> {
        self.namespace_level
            .label_value()
            .map(|level| {
                ["enforce", "audit", "warn"]
                    .iter()
                    .map(|mode| {
                        (
                            format!("pod-security.kubernetes.io/{mode}"),
                            level.to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Why work may not go to `namespace` on this cluster (`None`: it may): Kubernetes' own
    /// namespaces never take work on a spoke, and with `--namespaces` only those listed do.
    pub fn namespace_refusal(&self, namespace: &str) -> Option<String> {
        if self.unrestricted {
            return None;
        }
        if SYSTEM_NAMESPACES.contains(&namespace) {
            return Some(format!(
                "namespace {namespace} is Kubernetes' own and takes no work from the hub; put the Federation in a namespace of its own"
            ));
        }
        match &self.namespaces {
            Some(allowed) if !allowed.contains(namespace) => Some(format!(
                "namespace {namespace} is not one this agent manages (`flower-agent run --namespaces {}`); the spoke admin adds it there (Helm value `agent.namespaces`), which also grants the agent's Role in it",
                allowed.iter().cloned().collect::<Vec<_>>().join(",")
            )),
            _ => None,
        }
    }

    /// What to do with a namespace that exists, given its labels: `Ok(labels to add)` (the Pod
    /// Security labels it lacks when it has no `enforce` label; nothing when its level is at
    /// least the agent's), or why work may not go there (its `enforce` level is weaker, and
    /// `--allow weaker-namespaces` was not given).
    pub fn existing_namespace(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<(String, String)>, String> {
        let Some(want) = self.namespace_level.label_value() else {
            return Ok(Vec::new());
        };
        let Some(value) = labels.get(ENFORCE_LABEL) else {
            // Unlabelled: the cluster's default applies there today; label it like one the agent
            // creates, keeping any audit/warn label its admin set.
            return Ok(self
                .namespace_labels()
                .into_iter()
                .filter(|(k, _)| !labels.contains_key(k))
                .collect());
        };
        let weaker = PodSecurityLevel::of_label(value)
            .is_none_or(|have| have.strictness() < self.namespace_level.strictness());
        if weaker && !self.allowed.contains(&Allowance::WeakerNamespaces) {
            return Err(format!(
                "namespace {namespace} exists with Pod Security {ENFORCE_LABEL}={value}, weaker than this cluster's {want}; its admin labels it (`kubectl label namespace {namespace} {ENFORCE_LABEL}={want} --overwrite`) or allows it with `flower-agent run --allow {}`",
                Allowance::WeakerNamespaces.flag()
            ));
        }
        Ok(Vec::new())
    }

    /// Every violation in the workloads of `rendered`, each naming the pool, the field and the
    /// `flower-agent run` flag that allows it; empty when the policy holds.
    pub fn violations(&self, rendered: &Rendered) -> Vec<String> {
        if self.unrestricted {
            return Vec::new();
        }
        let mut out = Vec::new();
        // The Secrets the agent itself makes for this Federation: its CA bundle, and each
        // pool's node keys (`<workload>-node-keys`).
        let own_secrets: BTreeSet<String> = rendered
            .secret
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .chain(rendered.workloads.iter().filter_map(|(_, w)| {
                let name = match w {
                    Workload::StatefulSet(s) => s.metadata.name.as_deref(),
                    Workload::DaemonSet(d) => d.metadata.name.as_deref(),
                }?;
                Some(format!("{name}-node-keys"))
            }))
            .collect();
        for (pool, workload) in &rendered.workloads {
            let spec = match workload {
                Workload::StatefulSet(s) => s.spec.template.spec.as_ref(),
                Workload::DaemonSet(d) => d.spec.template.spec.as_ref(),
            };
            if let Some(spec) = spec {
                for v in self
                    .pod_violations(spec)
                    .into_iter()
                    .chain(self.more_pod_violations(spec, &own_secrets))
                {
                    out.push(format!("pool {}: {v}", pool.name));
                }
            }
        }
        out
    }

    fn pod_violations(&self, spec: &PodSpec) -> Vec<String> {
        let mut out = Vec::new();
        let mut deny = |allowance: Allowance, what: String| {
            if !self.allowed.contains(&allowance) {
                out.push(format!(
                    "{what} is not allowed on this cluster (its admin allows it with `flower-agent run --allow {}`)",
                    allowance.flag()
                ));
            }
        };
        if spec.host_network == Some(true) {
            deny(Allowance::HostNetwork, "hostNetwork".into());
        }
        if spec.host_pid == Some(true) {
            deny(Allowance::HostPid, "hostPID".into());
        }
        if spec.host_ipc == Some(true) {
            deny(Allowance::HostIpc, "hostIPC".into());
        }
        for volume in spec.volumes.iter().flatten() {
            if let Some(host) = &volume.host_path {
                deny(
                    Allowance::HostPath,
                    format!("volume {} (hostPath {})", volume.name, host.path),
                );
            }
        }
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter());
        for c in containers {
            if c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
            {
                deny(
                    Allowance::Privileged,
                    format!("container {}: privileged", c.name),
                );
            }
            for port in c.ports.iter().flatten() {
                if let Some(host_port) = port.host_port.filter(|p| *p != 0) {
                    deny(
                        Allowance::HostPort,
                        format!("container {}: hostPort {host_port}", c.name),
                    );
                }
            }
        }
        let account = spec
            .service_account_name
            .as_deref()
            .or(spec.service_account.as_deref())
            .unwrap_or("default");
        if account != "default" && !self.service_accounts.contains(account) {
            out.push(format!(
                "serviceAccountName {account} is not allowed on this cluster (its admin allows it with `flower-agent run --allow-service-account {account}`)"
            ));
        }
        out
    }
}

/// Sysctls the Pod Security `baseline` level allows (Kubernetes' safe set).
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ping_group_range",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_syncookies",
];

impl PodPolicy {
    /// Volume types, Secrets and pod- and container-level security settings (what a pod can
    /// use to read the spoke's Secrets or leave its confinement), each naming the flag.
    fn more_pod_violations(&self, spec: &PodSpec, own_secrets: &BTreeSet<String>) -> Vec<String> {
        let mut found: Vec<(Allowance, String)> = Vec::new();
        let secret = |found: &mut Vec<(Allowance, String)>, name: &str, used_by: String| {
            if !own_secrets.contains(name) {
                found.push((
                    Allowance::Secrets,
                    format!(
                        "{used_by}: Secret {name} (not one the agent made for this Federation)"
                    ),
                ));
            }
        };
        for volume in spec.volumes.iter().flatten() {
            let used_by = format!("volume {}", volume.name);
            if let Some(s) = &volume.secret {
                secret(
                    &mut found,
                    s.secret_name.as_deref().unwrap_or_default(),
                    used_by.clone(),
                );
            }
            if let Some(projected) = &volume.projected {
                for source in projected.sources.iter().flatten() {
                    if let Some(s) = &source.secret {
                        secret(&mut found, &s.name, used_by.clone());
                    }
                }
            }
            let plain = volume.config_map.is_some()
                || volume.empty_dir.is_some()
                || volume.persistent_volume_claim.is_some()
                || volume.ephemeral.is_some()
                || volume.downward_api.is_some()
                || volume.secret.is_some()
                || volume.projected.is_some()
                || volume.host_path.is_some();
            if !plain {
                found.push((
                    Allowance::OtherVolumes,
                    format!("{used_by} (a type other than configMap, emptyDir, persistentVolumeClaim, ephemeral, downwardAPI, projected)"),
                ));
            }
        }
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter());
        let mut unconfined = Vec::new();
        let mut root = Vec::new();
        if let Some(pod) = &spec.security_context {
            if pod
                .seccomp_profile
                .as_ref()
                .is_some_and(|p| p.type_ == "Unconfined")
            {
                unconfined.push("pod securityContext.seccompProfile Unconfined".to_owned());
            }
            if pod
                .app_armor_profile
                .as_ref()
                .is_some_and(|p| p.type_ == "Unconfined")
            {
                unconfined.push("pod securityContext.appArmorProfile Unconfined".to_owned());
            }
            for sysctl in pod.sysctls.iter().flatten() {
                if !SAFE_SYSCTLS.contains(&sysctl.name.as_str()) {
                    unconfined.push(format!("pod securityContext.sysctls {}", sysctl.name));
                }
            }
            if pod.run_as_user == Some(0) {
                root.push("pod securityContext.runAsUser 0".to_owned());
            }
        }
        for c in containers {
            for from in c.env_from.iter().flatten() {
                if let Some(s) = &from.secret_ref {
                    secret(&mut found, &s.name, format!("container {} envFrom", c.name));
                }
            }
            for env in c.env.iter().flatten() {
                if let Some(s) = env
                    .value_from
                    .as_ref()
                    .and_then(|v| v.secret_key_ref.as_ref())
                {
                    secret(
                        &mut found,
                        &s.name,
                        format!("container {} env {}", c.name, env.name),
                    );
                }
            }
            let Some(sc) = &c.security_context else {
                continue;
            };
            if sc
                .seccomp_profile
                .as_ref()
                .is_some_and(|p| p.type_ == "Unconfined")
            {
                unconfined.push(format!("container {}: seccompProfile Unconfined", c.name));
            }
            if sc
                .app_armor_profile
                .as_ref()
                .is_some_and(|p| p.type_ == "Unconfined")
            {
                unconfined.push(format!("container {}: appArmorProfile Unconfined", c.name));
            }
            if sc.proc_mount.as_deref() == Some("Unmasked") {
                unconfined.push(format!("container {}: procMount Unmasked", c.name));
            }
            if sc.run_as_user == Some(0) {
                root.push(format!("container {}: runAsUser 0", c.name));
            }
        }
        found.extend(unconfined.into_iter().map(|w| (Allowance::Unconfined, w)));
        found.extend(root.into_iter().map(|w| (Allowance::RunAsRoot, w)));
        found
            .into_iter()
            .filter(|(allowance, _)| !self.allowed.contains(allowance))
            .map(|(allowance, what)| {
                format!(
                    "{what} is not allowed on this cluster (its admin allows it with `flower-agent run --allow {}`)",
                    allowance.flag()
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerPort, HostPathVolumeSource, SecurityContext, Volume,
    };

    #[test]
    fn secrets_other_volume_types_and_escapes_from_confinement_are_refused_naming_the_flag() {
        use k8s_openapi::api::core::v1::{
            ConfigMapVolumeSource, EnvVar, EnvVarSource, NFSVolumeSource, PodSecurityContext,
            SeccompProfile, SecretKeySelector, SecretVolumeSource, Sysctl,
        };
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
        assert!(policy.more_pod_violations(&ok, &own).is_empty());
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
        let v = policy.more_pod_violations(&bad, &own);
        assert_eq!(v.len(), 6, "{v:#?}");
        for flag in [
            "--allow secrets",
            "--allow other-volumes",
            "--allow unconfined",
            "--allow run-as-root",
        ] {
            assert!(v.iter().any(|m| m.contains(flag)), "{flag} in {v:#?}");
        }
        let mut allowing = PodPolicy::spoke_default();
        allowing.allowed = [
            Allowance::Secrets,
            Allowance::OtherVolumes,
            Allowance::Unconfined,
            Allowance::RunAsRoot,
        ]
        .into();
        assert!(allowing.more_pod_violations(&bad, &own).is_empty());
    }

    fn spec() -> PodSpec {
        PodSpec {
            containers: vec![Container {
                name: "supernode".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_default_refuses_host_access_privilege_and_foreign_accounts_naming_the_flag() {
        let policy = PodPolicy::spoke_default();
        assert!(policy.pod_violations(&spec()).is_empty());
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
        let v = policy.pod_violations(&bad);
        assert_eq!(v.len(), 7, "{v:#?}");
        for flag in [
            "--allow host-network",
            "--allow host-pid",
            "--allow host-ipc",
            "--allow host-path",
            "--allow privileged",
            "--allow host-port",
            "--allow-service-account cluster-admin-sa",
        ] {
            assert!(v.iter().any(|m| m.contains(flag)), "{flag} in {v:#?}");
        }
        // What the admin allows passes; the rest is still refused.
        let mut allowing = PodPolicy::spoke_default();
        allowing.allowed = [Allowance::HostPath, Allowance::Privileged].into();
        allowing.service_accounts = ["cluster-admin-sa".to_string()].into();
        let v = allowing.pod_violations(&bad);
        assert_eq!(v.len(), 4, "{v:#?}");
        assert!(
            PodPolicy::unrestricted()
                .violations(&Rendered {
                    secret: None,
                    workloads: Vec::new(),
                    services: Vec::new()
                })
                .is_empty()
        );
    }

    #[test]
    fn namespaces_get_the_pod_security_labels_of_the_level() {
        let labels = PodPolicy::spoke_default().namespace_labels();
        assert!(labels.contains(&(
            "pod-security.kubernetes.io/enforce".into(),
            "baseline".into()
        )));
        assert_eq!(labels.len(), 3);
        assert!(PodPolicy::unrestricted().namespace_labels().is_empty());
    }

    fn ns_labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn an_unlabelled_existing_namespace_gets_the_labels_it_lacks() {
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
        // At least as strict: left as its admin set it.
        for level in ["baseline", "restricted"] {
            let labels = ns_labels(&[("pod-security.kubernetes.io/enforce", level)]);
            assert!(
                policy
                    .existing_namespace("team", &labels)
                    .unwrap()
                    .is_empty()
            );
        }
        // `--namespace-pod-security none`: never labelled, never refused.
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
        let mut policy = PodPolicy::spoke_default();
        for value in ["privileged", "bogus"] {
            let labels = ns_labels(&[("pod-security.kubernetes.io/enforce", value)]);
            let why = policy.existing_namespace("team", &labels).unwrap_err();
            for part in [
                "namespace team",
                &format!("pod-security.kubernetes.io/enforce={value}"),
                "kubectl label namespace team pod-security.kubernetes.io/enforce=baseline --overwrite",
                "--allow weaker-namespaces",
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

    #[test]
    fn work_goes_only_to_managed_non_system_namespaces() {
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
        // The hub's own cluster: the author's namespace and RBAC apply.
        assert!(
            PodPolicy::unrestricted()
                .namespace_refusal("kube-system")
                .is_none()
        );
    }
}

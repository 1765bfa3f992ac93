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
    fn label_value(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::Privileged => Some("privileged"),
            Self::Baseline => Some("baseline"),
            Self::Restricted => Some("restricted"),
        }
    }
}

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

    /// Every violation in the workloads of `rendered`, each naming the pool, the field and the
    /// `flower-agent run` flag that allows it; empty when the policy holds.
    pub fn violations(&self, rendered: &Rendered) -> Vec<String> {
        if self.unrestricted {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (pool, workload) in &rendered.workloads {
            let spec = match workload {
                Workload::StatefulSet(s) => s.spec.template.spec.as_ref(),
                Workload::DaemonSet(d) => d.spec.template.spec.as_ref(),
            };
            if let Some(spec) = spec {
                for v in self.pod_violations(spec) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerPort, HostPathVolumeSource, SecurityContext, Volume,
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
}

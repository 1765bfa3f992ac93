//! One pod policy for every pod the project creates: the SuperNode pools a spoke runs, and in the
//! hub cluster the SuperLink pods and the pools of Federations without a Placement.
//!
//! A Federation author writes pod templates (`spec.superlink.podTemplate`, each pool's
//! `podTemplate`, volumes); the pods are created by the hub's or the agent's ServiceAccount, not
//! the author's. So what such a pod may do is the cluster admin's to decide, here, and not the
//! author's. By default ([`PodPolicy::new`]) nothing beyond `baseline`, non-root, no
//! ServiceAccount but the namespace's `default` and no ServiceAccount token; every pod is
//! hardened towards `restricted` ([`harden`]). The admin opens each door by name
//! (`flower-agent run --allow …` on a spoke, `flower-hub serve --allow …` on the hub); a
//! refusal names the field and that flag ([`Admin`]).
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, PodSpec, SeccompProfile, SecurityContext,
};
mod checks;
use checks::*;

/// Something a pod may be allowed to do (`--allow NAME`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
    /// Secrets other than those the project made for the Federation, as volumes or environment.
    Secrets,
    /// `seccompProfile`/`appArmorProfile` `Unconfined`, `procMount: Unmasked`, sysctls outside
    /// Kubernetes' safe set.
    Unconfined,
    /// `runAsUser: 0` or `runAsNonRoot: false`.
    RunAsRoot,
    /// `automountServiceAccountToken: true`: the pod gets its ServiceAccount's API token.
    ServiceAccountToken,
    /// Work in a namespace that existed before and whose Pod Security `enforce` label is weaker
    /// than the policy's level (an unlabelled one is labelled instead).
    WeakerNamespaces,
}

impl Allowance {
    /// Every allowance, in the order `--help` lists them.
    pub const ALL: [Self; 12] = [
        Self::HostPath,
        Self::HostNetwork,
        Self::HostPid,
        Self::HostIpc,
        Self::Privileged,
        Self::HostPort,
        Self::OtherVolumes,
        Self::Secrets,
        Self::Unconfined,
        Self::RunAsRoot,
        Self::ServiceAccountToken,
        Self::WeakerNamespaces,
    ];

    /// Its name on the command line and in Helm values.
    pub fn flag(self) -> &'static str {
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
            Self::ServiceAccountToken => "service-account-token",
            Self::WeakerNamespaces => "weaker-namespaces",
        }
    }
}

impl fmt::Display for Allowance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.flag())
    }
}

impl FromStr for Allowance {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|a| a.flag() == s)
            .ok_or_else(|| {
                format!(
                    "unknown allowance {s:?}; one of: {}",
                    Self::ALL.map(Self::flag).join(", ")
                )
            })
    }
}

/// Pod Security Standards level put on the namespaces pods go to
/// (`pod-security.kubernetes.io/enforce`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// Every level, as named on the command line.
    pub const NAMES: [&'static str; 4] = ["none", "privileged", "baseline", "restricted"];

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

    /// The label value (`None` for [`Self::None`]).
    pub fn label_value(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::Privileged => Some("privileged"),
            Self::Baseline => Some("baseline"),
            Self::Restricted => Some("restricted"),
        }
    }
}

impl FromStr for PodSecurityLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            s => Self::of_label(s).ok_or_else(|| {
                format!(
                    "unknown Pod Security level {s:?}; one of: {}",
                    Self::NAMES.join(", ")
                )
            }),
        }
    }
}

/// The Pod Security label checked and set on namespaces pods go to.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// Namespaces of Kubernetes itself: labelling them could stop the cluster's own pods.
const SYSTEM_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// The uid of Flower's images (`app`, 49999, in `flwr/base`): pods run as it unless their
/// template names another (the images name the user, so `runAsNonRoot` alone cannot be
/// verified by the kubelet).
pub const FLOWER_UID: i64 = 49_999;

/// Whose admin sets the policy, for the flag a refusal names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admin {
    /// A spoke's agent (`flower-agent run`, Helm value `agent.podPolicy`).
    Spoke,
    /// The hub (`flower-hub serve`, Helm value `hub.podPolicy`): SuperLink pods and the pools of
    /// Federations without a Placement.
    Hub,
}

impl Admin {
    fn where_(self) -> &'static str {
        match self {
            Self::Spoke => "this cluster",
            Self::Hub => "the hub cluster",
        }
    }

    /// How the admin allows `what` (`--allow X`).
    fn allows(self, flag: &str) -> String {
        match self {
            Self::Spoke => format!(
                "its admin allows it with `flower-agent run {flag}` (Helm value agent.podPolicy)"
            ),
            Self::Hub => format!(
                "the hub's admin allows it with `flower-hub serve {flag}` (Helm value hub.podPolicy)"
            ),
        }
    }
}

/// What the pods the project creates may do, and how namespaces they go to are labelled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPolicy {
    /// Whose admin set it.
    pub admin: Admin,
    /// What is allowed beyond the default.
    pub allowed: BTreeSet<Allowance>,
    /// Service accounts pods may name besides `default`.
    pub service_accounts: BTreeSet<String>,
    /// Level for namespaces pods go to.
    pub namespace_level: PodSecurityLevel,
    /// Whether objects of the same name that this runtime did not create are refused (true on
    /// spokes) instead of taken over.
    pub refuse_foreign_objects: bool,
    /// The only namespaces work may go to (`--namespaces`); `None`: any namespace but
    /// Kubernetes' own.
    pub namespaces: Option<BTreeSet<String>>,
    /// Whether nothing is checked.
    unrestricted: bool,
}

impl PodPolicy {
    /// The default of `admin` allowing `allowed` and the ServiceAccounts `service_accounts`
    /// (what `--allow` and `--allow-service-account` give); an error names a ServiceAccount that
    /// is not one.
    pub fn allowing(
        admin: Admin,
        allowed: &[Allowance],
        service_accounts: &[String],
    ) -> Result<Self, String> {
        for name in service_accounts {
            crate::dns_label(name).map_err(|why| {
                format!("--allow-service-account {name:?}: {why} (a ServiceAccount name)")
            })?;
        }
        Ok(Self {
            allowed: allowed.iter().copied().collect(),
            service_accounts: service_accounts.iter().cloned().collect(),
            ..Self::new(admin)
        })
    }

    /// The default of `admin`: nothing beyond `baseline`, non-root, only the `default` service
    /// account and no token, and the namespaces pods go to labelled `baseline` (on the hub: the
    /// Federations' own namespaces, where it writes SuperLinks and hub-local pools); on spokes,
    /// foreign objects refused.
    pub fn new(admin: Admin) -> Self {
        Self {
            admin,
            allowed: BTreeSet::new(),
            service_accounts: BTreeSet::new(),
            namespace_level: PodSecurityLevel::Baseline,
            refuse_foreign_objects: admin == Admin::Spoke,
            namespaces: None,
            unrestricted: false,
        }
    }

    /// A spoke's default ([`Self::new`] for [`Admin::Spoke`]).
    pub fn spoke_default() -> Self {
        Self::new(Admin::Spoke)
    }

    /// No check, no namespace labels, objects of the same name taken over (tests, and tools that
    /// render without judging).
    pub fn unrestricted() -> Self {
        Self {
            namespace_level: PodSecurityLevel::None,
            refuse_foreign_objects: false,
            unrestricted: true,
            ..Self::new(Admin::Hub)
        }
    }

    /// Why the allowances and the namespace level contradict each other (`None`: they do not):
    /// the API server's Pod Security admission refuses, in a namespace labelled `baseline`, pods
    /// with host namespaces, host paths or ports, privileged containers or unconfined profiles,
    /// and in one labelled `restricted` also root and other volume types, whatever `--allow`
    /// says. `command`: the flags' command (`flower-agent run`, `flower-hub serve`).
    pub fn level_conflict(&self, command: &str) -> Option<String> {
        if self.unrestricted {
            return None;
        }
        let mut refused = vec![
            Allowance::HostPath,
            Allowance::HostNetwork,
            Allowance::HostPid,
            Allowance::HostIpc,
            Allowance::Privileged,
            Allowance::HostPort,
            Allowance::Unconfined,
        ];
        match self.namespace_level {
            PodSecurityLevel::None | PodSecurityLevel::Privileged => return None,
            PodSecurityLevel::Baseline => {}
            PodSecurityLevel::Restricted => {
                refused.extend([Allowance::RunAsRoot, Allowance::OtherVolumes]);
            }
        }
        let level = self.namespace_level.label_value().unwrap_or_default();
        let both: Vec<&str> = refused
            .into_iter()
            .filter(|a| self.allowed.contains(a))
            .map(Allowance::flag)
            .collect();
        (!both.is_empty()).then(|| {
            format!(
                "`{command} --allow {}` with --namespace-pod-security {level}: the API server refuses such pods in namespaces labelled {level}; also pass --namespace-pod-security privileged (or none, to leave the namespaces' labels to their admins)",
                both.join(",")
            )
        })
    }

    /// Labels for a namespace created for work.
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

    /// Why work may not go to `namespace` (`None`: it may): Kubernetes' own namespaces never
    /// take work on a spoke, and with `--namespaces` only those listed do.
    pub fn namespace_refusal(&self, namespace: &str) -> Option<String> {
        if self.unrestricted || self.admin == Admin::Hub {
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
    /// least the policy's), or why work may not go there (its `enforce` level is weaker, and
    /// `--allow weaker-namespaces` was not given).
    pub fn existing_namespace(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<Vec<(String, String)>, String> {
        let Some(want) = self.namespace_level.label_value() else {
            return Ok(Vec::new());
        };
        let Some(value) = labels.get(ENFORCE_LABEL) else {
            // Unlabelled: the cluster's default applies there today; label it as a namespace
            // made for work, keeping any audit/warn label its admin set.
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
                "namespace {namespace} exists with Pod Security {ENFORCE_LABEL}={value}, weaker than {}'s {want}; its admin labels it (`kubectl label namespace {namespace} {ENFORCE_LABEL}={want} --overwrite`) or {}",
                self.admin.where_(),
                self.admin
                    .allows(&format!("--allow {}", Allowance::WeakerNamespaces.flag()))
            ));
        }
        Ok(Vec::new())
    }

    /// Every violation of one pod, each naming the field and the flag that allows it; empty when
    /// the policy holds. `own_secrets`: the Secrets the project made for this Federation (its
    /// CA bundle, TLS and node keys), which its pods may mount.
    pub fn pod_violations(&self, spec: &PodSpec, own_secrets: &BTreeSet<String>) -> Vec<String> {
        if self.unrestricted {
            return Vec::new();
        }
        let mut found = host_access(spec);
        found.extend(volumes_and_secrets(spec, own_secrets));
        found.extend(confinement(spec));
        let mut out: Vec<String> = found
            .into_iter()
            .filter(|(allowance, _)| !self.allowed.contains(allowance))
            .map(|(allowance, what)| {
                format!(
                    "{what} is not allowed in {} ({})",
                    self.admin.where_(),
                    self.admin.allows(&format!("--allow {}", allowance.flag()))
                )
            })
            .collect();
        let account = spec
            .service_account_name
            .as_deref()
            .or(spec.service_account.as_deref())
            .unwrap_or("default");
        if account != "default" && !self.service_accounts.contains(account) {
            out.push(format!(
                "serviceAccountName {account} is not allowed in {} ({})",
                self.admin.where_(),
                self.admin
                    .allows(&format!("--allow-service-account {account}"))
            ));
        }
        out
    }
}

/// Hardens a rendered pod towards Pod Security `restricted`, filling only what its template left
/// unset: the pod runs as non-root ([`FLOWER_UID`] unless the template names a user) under the
/// runtime's default seccomp profile; each container that is not privileged may not escalate its
/// privileges and drops every capability. A template that sets a field keeps its value (the
/// policy judges it: [`PodPolicy::pod_violations`]).
pub fn harden(spec: &mut PodSpec) {
    let pod = spec
        .security_context
        .get_or_insert_with(PodSecurityContext::default);
    if pod.run_as_user.is_none() {
        pod.run_as_user = Some(FLOWER_UID);
    }
    if pod.run_as_non_root.is_none() && pod.run_as_user != Some(0) {
        pod.run_as_non_root = Some(true);
    }
    if pod.seccomp_profile.is_none() {
        pod.seccomp_profile = Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            ..SeccompProfile::default()
        });
    }
    for c in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
    {
        let sc = c
            .security_context
            .get_or_insert_with(SecurityContext::default);
        if sc.privileged == Some(true) {
            continue;
        }
        if sc.allow_privilege_escalation.is_none() {
            sc.allow_privilege_escalation = Some(false);
        }
        if sc.capabilities.is_none() {
            sc.capabilities = Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                add: None,
            });
        }
    }
}

#[cfg(test)]
mod tests;

//! What a pod spec asks for that the policy judges: host access, volumes and Secrets, and
//! confinement (user, capabilities, seccomp, sysctls).
use super::*;

/// Host namespaces, host paths, privileged containers and host ports.
pub(super) fn host_access(spec: &PodSpec) -> Vec<(Allowance, String)> {
    let mut found = Vec::new();
    if spec.host_network == Some(true) {
        found.push((Allowance::HostNetwork, "hostNetwork".to_owned()));
    }
    if spec.host_pid == Some(true) {
        found.push((Allowance::HostPid, "hostPID".to_owned()));
    }
    if spec.host_ipc == Some(true) {
        found.push((Allowance::HostIpc, "hostIPC".to_owned()));
    }
    for volume in spec.volumes.iter().flatten() {
        if let Some(host) = &volume.host_path {
            found.push((
                Allowance::HostPath,
                format!("volume {} (hostPath {})", volume.name, host.path),
            ));
        }
    }
    for c in containers(spec) {
        if c.security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false)
        {
            found.push((
                Allowance::Privileged,
                format!("container {}: privileged", c.name),
            ));
        }
        if c.security_context
            .as_ref()
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|caps| caps.add.as_ref())
            .is_some_and(|add| !add.is_empty())
        {
            found.push((
                Allowance::Privileged,
                format!("container {}: capabilities added", c.name),
            ));
        }
        for port in c.ports.iter().flatten() {
            if let Some(host_port) = port.host_port.filter(|p| *p != 0) {
                found.push((
                    Allowance::HostPort,
                    format!("container {}: hostPort {host_port}", c.name),
                ));
            }
        }
    }
    found
}

/// Volume types and Secrets (what a pod can use to read the cluster's Secrets or storage).
pub(super) fn volumes_and_secrets(
    spec: &PodSpec,
    own_secrets: &BTreeSet<String>,
) -> Vec<(Allowance, String)> {
    let mut found: Vec<(Allowance, String)> = Vec::new();
    let secret = |found: &mut Vec<(Allowance, String)>, name: &str, used_by: String| {
        if !own_secrets.contains(name) {
            found.push((
                Allowance::Secrets,
                format!("{used_by}: Secret {name} (not one made for this Federation)"),
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
                if source.service_account_token.is_some() {
                    found.push((
                        Allowance::ServiceAccountToken,
                        format!("{used_by}: a projected serviceAccountToken"),
                    ));
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
    for c in containers(spec) {
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
    }
    if spec.automount_service_account_token == Some(true) {
        found.push((
            Allowance::ServiceAccountToken,
            "automountServiceAccountToken true".to_owned(),
        ));
    }
    found
}

/// Sysctls the Pod Security `baseline` level allows (Kubernetes' safe set).
pub(super) const SAFE_SYSCTLS: &[&str] = &[
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

/// Pod- and container-level settings that leave the confinement: unconfined profiles, unsafe
/// sysctls, an unmasked /proc, root.
pub(super) fn confinement(spec: &PodSpec) -> Vec<(Allowance, String)> {
    let mut found = Vec::new();
    let unconfined = |p: Option<&str>| p == Some("Unconfined");
    if let Some(pod) = &spec.security_context {
        if unconfined(pod.seccomp_profile.as_ref().map(|p| p.type_.as_str())) {
            found.push((
                Allowance::Unconfined,
                "pod securityContext.seccompProfile Unconfined".to_owned(),
            ));
        }
        if unconfined(pod.app_armor_profile.as_ref().map(|p| p.type_.as_str())) {
            found.push((
                Allowance::Unconfined,
                "pod securityContext.appArmorProfile Unconfined".to_owned(),
            ));
        }
        for sysctl in pod.sysctls.iter().flatten() {
            if !SAFE_SYSCTLS.contains(&sysctl.name.as_str()) {
                found.push((
                    Allowance::Unconfined,
                    format!("pod securityContext.sysctls {}", sysctl.name),
                ));
            }
        }
        if pod.run_as_user == Some(0) {
            found.push((
                Allowance::RunAsRoot,
                "pod securityContext.runAsUser 0".to_owned(),
            ));
        }
        if pod.run_as_non_root == Some(false) {
            found.push((
                Allowance::RunAsRoot,
                "pod securityContext.runAsNonRoot false".to_owned(),
            ));
        }
    }
    for c in containers(spec) {
        let Some(sc) = &c.security_context else {
            continue;
        };
        if unconfined(sc.seccomp_profile.as_ref().map(|p| p.type_.as_str())) {
            found.push((
                Allowance::Unconfined,
                format!("container {}: seccompProfile Unconfined", c.name),
            ));
        }
        if unconfined(sc.app_armor_profile.as_ref().map(|p| p.type_.as_str())) {
            found.push((
                Allowance::Unconfined,
                format!("container {}: appArmorProfile Unconfined", c.name),
            ));
        }
        if sc.proc_mount.as_deref() == Some("Unmasked") {
            found.push((
                Allowance::Unconfined,
                format!("container {}: procMount Unmasked", c.name),
            ));
        }
        if sc.run_as_user == Some(0) {
            found.push((
                Allowance::RunAsRoot,
                format!("container {}: runAsUser 0", c.name),
            ));
        }
        if sc.run_as_non_root == Some(false) {
            found.push((
                Allowance::RunAsRoot,
                format!("container {}: runAsNonRoot false", c.name),
            ));
        }
    }
    found
}

pub(super) fn containers(
    spec: &PodSpec,
) -> impl Iterator<Item = &k8s_openapi::api::core::v1::Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
}

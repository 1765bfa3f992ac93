//! Deterministic merges of user-supplied pod pieces into ours.
//!
//! flower-operator merged env through a Go map, so the order changed on every reconcile and pods
//! restarted. Every merge here keeps a stable order: the base list's order, overridden entries in
//! place, new entries appended in the order written.

use k8s_openapi::api::core::v1::{
    EnvVar, LocalObjectReference, PodSpec, PodTemplateSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

/// `base` with every variable of `overrides` replacing the one of the same name in place, and
/// new names appended in `overrides`' order. A name repeated within one list keeps its first
/// position and its last value.
pub fn merge_env(base: &[EnvVar], overrides: &[EnvVar]) -> Vec<EnvVar> {
    let mut out: Vec<EnvVar> = Vec::with_capacity(base.len() + overrides.len());
    for var in base.iter().chain(overrides) {
        match out.iter_mut().find(|v| v.name == var.name) {
            Some(slot) => *slot = var.clone(),
            None => out.push(var.clone()),
        }
    }
    out
}

/// Appends the volumes of `extra` whose names are not in `into` yet (first one wins).
pub fn append_volumes(into: &mut Vec<Volume>, extra: &[Volume]) {
    for volume in extra {
        if !into.iter().any(|v| v.name == volume.name) {
            into.push(volume.clone());
        }
    }
}

/// Appends the mounts of `extra` whose mount paths are not in `into` yet (first one wins;
/// Kubernetes rejects two mounts on one path).
pub fn append_mounts(into: &mut Vec<VolumeMount>, extra: &[VolumeMount]) {
    for mount in extra {
        if !into.iter().any(|m| m.mount_path == mount.mount_path) {
            into.push(mount.clone());
        }
    }
}

/// `Some(list)` unless the list is empty, so empty lists are omitted from rendered objects.
pub fn non_empty<T>(list: Vec<T>) -> Option<Vec<T>> {
    if list.is_empty() { None } else { Some(list) }
}

/// Merges a user `podTemplate` into our pod: scheduling and pod-level fields set by the user
/// override ours (nodeSelector, affinity, tolerations, serviceAccountName, priorityClassName,
/// runtimeClassName, securityContext, dnsPolicy, dnsConfig, hostNetwork, hostPID, hostIPC);
/// volumes and imagePullSecrets are appended without duplicate names. The template's labels and
/// annotations go under ours (ours win). Containers stay ours.
pub fn merge_pod_template(meta: &mut ObjectMeta, pod: &mut PodSpec, template: &PodTemplateSpec) {
    if let Some(user_meta) = &template.metadata {
        meta.labels = merge_maps_under(user_meta.labels.as_ref(), meta.labels.take());
        meta.annotations =
            merge_maps_under(user_meta.annotations.as_ref(), meta.annotations.take());
    }
    let Some(user) = &template.spec else {
        return;
    };
    macro_rules! override_if_set {
        ($($field:ident),*) => {
            $(if user.$field.is_some() {
                pod.$field = user.$field.clone();
            })*
        };
    }
    override_if_set!(
        node_selector,
        affinity,
        service_account_name,
        automount_service_account_token,
        priority_class_name,
        runtime_class_name,
        security_context,
        dns_policy,
        dns_config,
        host_network,
        host_pid,
        host_ipc
    );
    if user.tolerations.as_ref().is_some_and(|t| !t.is_empty()) {
        pod.tolerations = user.tolerations.clone();
    }
    if let Some(volumes) = &user.volumes {
        let mut merged = pod.volumes.take().unwrap_or_default();
        append_volumes(&mut merged, volumes);
        pod.volumes = non_empty(merged);
    }
    if let Some(secrets) = &user.image_pull_secrets {
        let mut merged: Vec<LocalObjectReference> =
            pod.image_pull_secrets.take().unwrap_or_default();
        for secret in secrets {
            if !merged.iter().any(|s| s.name == secret.name) {
                merged.push(secret.clone());
            }
        }
        pod.image_pull_secrets = non_empty(merged);
    }
}

/// `ours` over `user`: user entries first, ours replace them; `None` when both are empty.
pub fn merge_maps_under(
    user: Option<&BTreeMap<String, String>>,
    ours: Option<BTreeMap<String, String>>,
) -> Option<BTreeMap<String, String>> {
    let mut out = user.cloned().unwrap_or_default();
    out.extend(ours.unwrap_or_default());
    if out.is_empty() { None } else { Some(out) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            ..EnvVar::default()
        }
    }

    #[test]
    fn a_pod_template_may_ask_for_the_api_token_we_leave_out() {
        let mut pod = PodSpec {
            automount_service_account_token: Some(false),
            ..PodSpec::default()
        };
        let mut meta = ObjectMeta::default();
        merge_pod_template(&mut meta, &mut pod, &PodTemplateSpec::default());
        assert_eq!(pod.automount_service_account_token, Some(false));
        let template = PodTemplateSpec {
            spec: Some(PodSpec {
                automount_service_account_token: Some(true),
                ..PodSpec::default()
            }),
            ..PodTemplateSpec::default()
        };
        merge_pod_template(&mut meta, &mut pod, &template);
        assert_eq!(pod.automount_service_account_token, Some(true));
    }

    #[test]
    fn env_merge_is_ordered_and_overrides_in_place() {
        // flower-operator's map-based merge reordered env on every reconcile (pods restarted).
        let base = [env("A", "1"), env("B", "2"), env("C", "3")];
        let pool = [env("Z", "9"), env("B", "pool"), env("Y", "8")];
        let merged = merge_env(&base, &pool);
        let names: Vec<_> = merged
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_deref().unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                ("A", "1"),
                ("B", "pool"),
                ("C", "3"),
                ("Z", "9"),
                ("Y", "8")
            ]
        );
        for _ in 0..50 {
            assert_eq!(merge_env(&base, &pool), merged);
        }
    }
}

//! The environment of a SuperNode run as a process (edge devices, the local demo): the same
//! pool settings a pod gets, as far as a process can have them.
//!
//! - `spec.supernodes.env` overridden by the pool's `env` by name (the pod rule, [`merge_env`]);
//!   a `valueFrom` (Secret, ConfigMap, field) has no source outside Kubernetes and is refused
//!   with the variable's name;
//! - GPUs: `gpu.enabled` gives replica `i` its own `count` devices by index
//!   (`CUDA_VISIBLE_DEVICES=i·count … i·count+count-1` for NVIDIA, `ROCR_VISIBLE_DEVICES` for
//!   AMD), the process counterpart of the device plugin handing each pod its GPUs; `mountAll`
//!   shows every GPU (`NVIDIA_VISIBLE_DEVICES=all` / `ROCR_VISIBLE_DEVICES=all`, as in the pod);
//! - resources are not enforced by a process runtime: [`unenforced_resources`] names them so the
//!   status says so instead of dropping them silently.

use std::collections::BTreeMap;

use crate::{FederationSpec, GpuVendor, SuperNodePoolSpec};

use super::merge::merge_env;

/// Why a pool's environment cannot be given to a process.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessEnvError {
    /// A variable takes its value from a Kubernetes source.
    #[error(
        "pool {pool:?}: env {name}: valueFrom (Secret, ConfigMap or field) has no source in the process runtime; give it a value, or run this pool on a Kubernetes cluster"
    )]
    ValueFrom {
        /// Pool name.
        pool: String,
        /// Variable name.
        name: String,
    },
    /// A GPU resource name the process runtime cannot map to a device variable.
    #[error(
        "pool {pool:?}: gpu.resourceName {resource:?} without gpu.vendor: the process runtime selects GPUs by vendor (CUDA_VISIBLE_DEVICES for nvidia, ROCR_VISIBLE_DEVICES for amd); set gpu.vendor"
    )]
    UnknownGpuVendor {
        /// Pool name.
        pool: String,
        /// The resource name.
        resource: String,
    },
}

/// The environment of replica `index` of `pool`, in name order.
pub fn process_env(
    spec: &FederationSpec,
    pool: &SuperNodePoolSpec,
    index: u32,
) -> Result<BTreeMap<String, String>, ProcessEnvError> {
    let mut env = BTreeMap::new();
    for var in merge_env(&spec.supernodes.env, &pool.env) {
        if var.value_from.is_some() {
            return Err(ProcessEnvError::ValueFrom {
                pool: pool.name.clone(),
                name: var.name,
            });
        }
        env.insert(var.name, var.value.unwrap_or_default());
    }
    let Some(gpu) = pool.gpu.as_ref() else {
        return Ok(env);
    };
    let vendor = match (
        gpu.vendor,
        gpu.resource_name.as_deref().filter(|r| !r.is_empty()),
    ) {
        (Some(vendor), _) => vendor,
        (None, None) | (None, Some("nvidia.com/gpu")) => GpuVendor::Nvidia,
        (None, Some("amd.com/gpu")) => GpuVendor::Amd,
        (None, Some(other)) if gpu.enabled && !gpu.mount_all => {
            return Err(ProcessEnvError::UnknownGpuVendor {
                pool: pool.name.clone(),
                resource: other.to_owned(),
            });
        }
        (None, Some(_)) => GpuVendor::Nvidia,
    };
    if gpu.mount_all {
        let name = match vendor {
            GpuVendor::Nvidia => "NVIDIA_VISIBLE_DEVICES",
            GpuVendor::Amd => "ROCR_VISIBLE_DEVICES",
        };
        env.insert(name.to_owned(), "all".to_owned());
    } else if gpu.enabled {
        let count = u32::try_from(gpu.count.max(1)).unwrap_or(1);
        let first = index.saturating_mul(count);
        let devices: Vec<String> = (first..first.saturating_add(count))
            .map(|d| d.to_string())
            .collect();
        let name = match vendor {
            GpuVendor::Nvidia => "CUDA_VISIBLE_DEVICES",
            GpuVendor::Amd => "ROCR_VISIBLE_DEVICES",
        };
        env.insert(name.to_owned(), devices.join(","));
    }
    Ok(env)
}

/// The pool's resource fields that a process runtime cannot enforce (empty when none is set).
pub fn unenforced_resources(pool: &SuperNodePoolSpec) -> Vec<&'static str> {
    let set = |r: &Option<k8s_openapi::api::core::v1::ResourceRequirements>| {
        r.as_ref().is_some_and(|r| {
            r.limits.as_ref().is_some_and(|m| !m.is_empty())
                || r.requests.as_ref().is_some_and(|m| !m.is_empty())
        })
    };
    let mut out = Vec::new();
    if set(&pool.supernode_resources) {
        out.push("supernodeResources");
    }
    if set(&pool.superexec_resources) {
        out.push("superexecResources");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pools: &str) -> FederationSpec {
        serde_saphyr::from_str(&format!(
            r#"
mode: StatefulSet
isolationMode: subprocess
superlink: {{image: "flwr/superlink:1.42.0"}}
supernodes:
  image: "flwr/supernode:1.42.0"
  env: [{{name: A, value: base}}, {{name: B, value: base}}]
  pools: {pools}
"#
        ))
        .expect("test spec")
    }

    #[test]
    fn pool_env_overrides_the_default_by_name() {
        // The pod rule: supernodes.env, then the pool's env replacing same-named variables.
        let s =
            spec("[{name: p, replicas: 1, env: [{name: B, value: pool}, {name: C, value: c}]}]");
        let env = process_env(&s, &s.supernodes.pools[0], 0).unwrap();
        assert_eq!(
            env,
            BTreeMap::from([
                ("A".into(), "base".into()),
                ("B".into(), "pool".into()),
                ("C".into(), "c".into())
            ])
        );
    }

    #[test]
    fn value_from_is_refused_with_the_variable_name() {
        // A Secret reference cannot be resolved on a device: refused, not dropped.
        let s = spec(
            "[{name: p, replicas: 1, env: [{name: TOKEN, valueFrom: {secretKeyRef: {name: s, key: k}}}]}]",
        );
        let err = process_env(&s, &s.supernodes.pools[0], 0).unwrap_err();
        assert!(err.to_string().contains("env TOKEN: valueFrom"), "{err}");
    }

    #[test]
    fn each_replica_gets_its_own_gpus() {
        // count 2: replica 0 → 0,1; replica 1 → 2,3 (NVIDIA); AMD uses ROCR_VISIBLE_DEVICES.
        let s = spec("[{name: p, replicas: 2, gpu: {enabled: true, count: 2}}]");
        let pool = &s.supernodes.pools[0];
        assert_eq!(
            process_env(&s, pool, 0).unwrap()["CUDA_VISIBLE_DEVICES"],
            "0,1"
        );
        assert_eq!(
            process_env(&s, pool, 1).unwrap()["CUDA_VISIBLE_DEVICES"],
            "2,3"
        );
        let s = spec("[{name: p, replicas: 2, gpu: {enabled: true, vendor: amd}}]");
        assert_eq!(
            process_env(&s, &s.supernodes.pools[0], 1).unwrap()["ROCR_VISIBLE_DEVICES"],
            "1"
        );
        let s = spec("[{name: p, replicas: 1, gpu: {mountAll: true, vendor: nvidia}}]");
        assert_eq!(
            process_env(&s, &s.supernodes.pools[0], 0).unwrap()["NVIDIA_VISIBLE_DEVICES"],
            "all"
        );
        let s =
            spec("[{name: p, replicas: 1, gpu: {enabled: true, resourceName: example.com/tpu}}]");
        assert!(process_env(&s, &s.supernodes.pools[0], 0).is_err());
    }

    #[test]
    fn resources_are_named_when_set() {
        // Resources cannot be enforced by a process runtime; they are reported, never ignored.
        let s = spec("[{name: p, replicas: 1, supernodeResources: {limits: {cpu: \"1\"}}}]");
        assert_eq!(
            unenforced_resources(&s.supernodes.pools[0]),
            ["supernodeResources"]
        );
        let s = spec("[{name: p, replicas: 1}]");
        assert!(unenforced_resources(&s.supernodes.pools[0]).is_empty());
    }
}

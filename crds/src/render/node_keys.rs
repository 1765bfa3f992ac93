//! SuperNode authentication in pool workloads: each SuperNode reads its own private key from a
//! Secret of the pool that holds one OpenSSH key per pod (StatefulSet pools, data key = pod name)
//! or per node (DaemonSet pools, data key = node name). The whole Secret is mounted and the
//! SuperNode is pointed at its own file with a downward-API variable that Kubernetes expands in
//! the arguments, so the pod template stays the same for every pod.
//!
//! Secret files are root-owned; Flower's images run as uid 49999. The volume is mounted with mode
//! 0440 and the pod gets `fsGroup` 49999 unless its podTemplate sets one (the kubelet then makes
//! the files group-owned by the fsGroup, which every container has as a supplementary group), so
//! the key is readable by the SuperNode and not by other users.

use k8s_openapi::api::core::v1::{
    PodSecurityContext, PodSpec, SecretVolumeSource, Volume, VolumeMount,
};

use super::Workload;
use super::merge::{append_mounts, append_volumes, merge_env};
use super::placeholders::NODE_NAME_ENV;

/// Directory where a pool's node-key Secret is mounted in the SuperNode container.
pub const NODE_KEY_MOUNT_DIR: &str = "/var/run/flower-addon/node-key";
/// Variable holding the pod's name (downward API `metadata.name`) in StatefulSet pools.
pub const POD_NAME_ENV: &str = "FLWR_POD_NAME";
/// `fsGroup` given to pods whose podTemplate sets none: the group of Flower's image user `app`.
pub const NODE_KEY_FS_GROUP: i64 = super::FLOWER_IMAGE_GROUP;
/// Mode of the key files (owner and group read; the group is the pod's fsGroup).
pub const NODE_KEY_FILE_MODE: i32 = 0o440;
/// Flag of `flower-supernode` naming its private key file.
pub const NODE_KEY_FLAG: &str = "--auth-supernode-private-key";
const NODE_KEY_VOLUME: &str = "supernode-node-key";
/// Name of the SuperNode container in pool workloads.
const SUPERNODE_CONTAINER: &str = "supernode";

/// Name of the Secret with the node keys of a pool, `<fed>-supernode-<pool>-node-keys`.
pub fn node_key_secret_name(federation: &str, pool: &str) -> String {
    format!("{}-node-keys", super::pool_workload_name(federation, pool))
}

/// Points `workload`'s SuperNode at its own key in Secret `secret_name`: the Secret mounted
/// read-only at [`NODE_KEY_MOUNT_DIR`] (mode 0440), the pod or node name from the downward API,
/// [`NODE_KEY_FLAG`]` <dir>/$(<name variable>)` after every other argument, and `fsGroup`
/// [`NODE_KEY_FS_GROUP`] unless the pod sets an fsGroup already.
pub fn mount_node_keys(workload: &mut Workload, secret_name: &str) {
    let (pod, name_env, field_path) = match workload {
        Workload::StatefulSet(s) => (
            s.spec.template.spec.get_or_insert_with(PodSpec::default),
            POD_NAME_ENV,
            "metadata.name",
        ),
        Workload::DaemonSet(d) => (
            d.spec.template.spec.get_or_insert_with(PodSpec::default),
            NODE_NAME_ENV,
            "spec.nodeName",
        ),
    };
    let mut volumes = pod.volumes.take().unwrap_or_default();
    append_volumes(
        &mut volumes,
        &[Volume {
            name: NODE_KEY_VOLUME.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret_name.to_owned()),
                default_mode: Some(NODE_KEY_FILE_MODE),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        }],
    );
    pod.volumes = Some(volumes);
    let security = pod
        .security_context
        .get_or_insert_with(PodSecurityContext::default);
    if security.fs_group.is_none() {
        security.fs_group = Some(NODE_KEY_FS_GROUP);
    }
    let Some(container) = pod
        .containers
        .iter_mut()
        .find(|c| c.name == SUPERNODE_CONTAINER)
    else {
        return;
    };
    let name_var = super::pool::field_env(name_env, field_path);
    container.env = Some(merge_env(
        &container.env.take().unwrap_or_default(),
        &[name_var],
    ));
    let mut mounts = container.volume_mounts.take().unwrap_or_default();
    append_mounts(
        &mut mounts,
        &[VolumeMount {
            name: NODE_KEY_VOLUME.to_owned(),
            mount_path: NODE_KEY_MOUNT_DIR.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        }],
    );
    container.volume_mounts = Some(mounts);
    container.args.get_or_insert_with(Vec::new).push(format!(
        "{NODE_KEY_FLAG}={NODE_KEY_MOUNT_DIR}/$({name_env})"
    ));
}

//! Pool workloads (Kubernetes) and SuperNode argv (processes) from one set of rules.

use std::collections::BTreeMap;

use crate::{DeploymentMode, GpuConfig, GpuVendor, NodeConfigValue, PersistentVolumeClaimTemplate};
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, StatefulSet, StatefulSetOrdinals, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HostPathVolumeSource, KeyToPath,
    ObjectFieldSelector, PersistentVolumeClaim, PodSpec, PodTemplateSpec, ResourceRequirements,
    SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::dialect::{
    FlowerDialect, FlowerVersion, classic_ports, superexec_connect_args, unified_ports,
};
use super::merge::{append_mounts, append_volumes, merge_env, merge_pod_template, non_empty};
use super::node_config::encode_node_config;
use super::placeholders::{
    Expansion, NODE_NAME_ENV, POD_INDEX_ENV, Placeholders, Target, mentions,
};
use super::{
    CA_KEY, CA_MOUNT_DIR, ProcessReplica, RenderError, SuperNodePoolInput, Workload,
    component_labels, is_process, isolation_arg, object_labels, pool_workload_name,
};

const CA_VOLUME: &str = "superlink-ca";

/// Which placeholders of the pool's nodeConfig need pod-side values.
struct Uses {
    index: bool,
    partition: bool,
    node: bool,
}

fn uses(input: &SuperNodePoolInput<'_>) -> Result<Uses, RenderError> {
    let strings = || {
        input.pool.node_config.values().filter_map(|v| match v {
            NodeConfigValue::String(s) => Some(s.as_str()),
            _ => None,
        })
    };
    let uses = Uses {
        index: strings().any(|s| mentions(s, "index")),
        partition: strings().any(|s| mentions(s, "partition")),
        node: strings().any(|s| mentions(s, "node")),
    };
    if uses.index && uses.partition {
        return Err(RenderError::IndexWithPartition {
            pool: input.pool.name.clone(),
        });
    }
    Ok(uses)
}

/// Replicas of a StatefulSet pool, `None` for DaemonSet pools.
fn replicas(input: &SuperNodePoolInput<'_>) -> Result<Option<i32>, RenderError> {
    match input.spec.mode {
        DeploymentMode::DaemonSet => Ok(None),
        DeploymentMode::StatefulSet => match input.pool.replicas {
            Some(r) if r >= 1 => Ok(Some(r)),
            _ => Err(RenderError::MissingReplicas {
                pool: input.pool.name.clone(),
            }),
        },
    }
}

/// The placeholders known for the whole pool (shared by both targets).
fn pool_placeholders(
    input: &SuperNodePoolInput<'_>,
    target: Target,
    replicas: Option<i32>,
) -> Placeholders {
    let cluster = input.cluster;
    let mut p = Placeholders::new(target)
        .set("pool", Expansion::Text(input.pool.name.clone()))
        .set("cluster", Expansion::Text(cluster.name.clone()))
        .set("clusterIndex", Expansion::Text(cluster.index.to_string()))
        .set("clusters", Expansion::Text(cluster.clusters.to_string()));
    const NO_INDEX: &str = "DaemonSet pools have no replica index or count";
    p = match replicas {
        Some(r) => p.set("replicas", Expansion::Text(r.to_string())).set(
            "partitions",
            Expansion::Text(cluster.partitions.to_string()),
        ),
        None => p
            .set("replicas", Expansion::Unavailable(NO_INDEX))
            .set("index", Expansion::Unavailable(NO_INDEX))
            .set("partition", Expansion::Unavailable(NO_INDEX))
            .set("partitions", Expansion::Unavailable(NO_INDEX)),
    };
    p
}

fn node_config_arg(
    input: &SuperNodePoolInput<'_>,
    placeholders: &Placeholders,
) -> Result<Option<String>, RenderError> {
    let encoded = encode_node_config(&input.pool.node_config, placeholders).map_err(|source| {
        RenderError::NodeConfig {
            pool: input.pool.name.clone(),
            source,
        }
    })?;
    Ok(encoded.map(|config| format!("--node-config={config}")))
}

/// `--superlink`, `--isolation`, TLS, runtime address, extraArgs, `--node-config`, in this order.
fn supernode_args(
    input: &SuperNodePoolInput<'_>,
    tls: Option<String>,
    runtime: Vec<String>,
    node_config: Option<String>,
) -> Vec<String> {
    let mut args = vec![
        format!("--superlink={}", input.fleet_address),
        isolation_arg(input.spec).to_owned(),
    ];
    if input.spec.insecure {
        args.push("--insecure".to_owned());
    } else if let Some(ca) = tls {
        args.push(format!("--root-certificates={ca}"));
    }
    args.extend(runtime);
    args.extend(input.pool.extra_args.iter().cloned());
    args.extend(node_config);
    args
}

/// The SuperNode's ClientAppIO / Runtime API binding on `127.0.0.1:port`, per dialect.
fn runtime_binding(dialect: FlowerDialect, port: impl std::fmt::Display) -> Vec<String> {
    if dialect.supernode_host_port() {
        vec!["--host=127.0.0.1".to_owned(), format!("--port={port}")]
    } else {
        vec![format!("--clientappio-api-address=127.0.0.1:{port}")]
    }
}

/// ClientApp SuperExec arguments. The hop to the SuperNode is always plaintext on localhost (it
/// has no TLS option in the classic dialect), hence `--insecure` in every dialect.
fn clientapp_superexec_args(version: FlowerVersion, port: impl std::fmt::Display) -> Vec<String> {
    let mut args = superexec_connect_args(version, "clientapp", &format!("127.0.0.1:{port}"));
    args.push("--insecure".to_owned());
    args
}

fn runtime_port(dialect: FlowerDialect) -> i32 {
    if dialect.supernode_host_port() {
        unified_ports::SUPERNODE_RUNTIME
    } else {
        classic_ports::CLIENTAPPIO
    }
}

// === process runtime ===

/// Arguments of `flower-supernode` for one replica run as a process, every placeholder expanded
/// natively (no Kubernetes, no shell). The runtime API always binds `127.0.0.1:runtime_port` so
/// several replicas can share a host.
pub fn supernode_argv(
    input: &SuperNodePoolInput<'_>,
    replica: &ProcessReplica<'_>,
) -> Result<Vec<String>, RenderError> {
    uses(input)?;
    let replicas = replicas(input)?;
    let mut placeholders = pool_placeholders(input, Target::Process, replicas)
        .set("node", Expansion::Text(replica.node_name.to_owned()));
    if replicas.is_some() {
        let partition = input.cluster.partition_offset + u64::from(replica.index);
        placeholders = placeholders
            .set("index", Expansion::Text(replica.index.to_string()))
            .set("partition", Expansion::Text(partition.to_string()));
    }
    let node_config = node_config_arg(input, &placeholders)?;
    let tls = replica.root_certificates.map(|p| p.display().to_string());
    Ok(supernode_args(
        input,
        tls,
        runtime_binding(input.dialect, replica.runtime_port),
        node_config,
    ))
}

/// Arguments of `flower-superexec` serving ClientApps for one process replica (process
/// isolation only; it dials the replica's runtime API).
pub fn superexec_clientapp_argv(version: FlowerVersion, runtime_port: u16) -> Vec<String> {
    clientapp_superexec_args(version, runtime_port)
}

// === Kubernetes ===

pub(super) fn render(input: &SuperNodePoolInput<'_>) -> Result<Workload, RenderError> {
    let uses = uses(input)?;
    let replicas = replicas(input)?;
    let mut placeholders = pool_placeholders(input, Target::Kubernetes, replicas)
        .set("node", Expansion::KubernetesEnv(NODE_NAME_ENV));
    if replicas.is_some() {
        placeholders = placeholders
            .set("index", Expansion::KubernetesEnv(POD_INDEX_ENV))
            .set("partition", Expansion::KubernetesEnv(POD_INDEX_ENV));
    }
    let node_config = node_config_arg(input, &placeholders)?;
    let process = is_process(input.spec);
    let pool = input.pool;
    let spec = input.spec;
    let superexec_image = superexec_image(input, process)?;

    // Env: spec.supernodes.env, overridden by the pool's; then downward-API and GPU variables.
    let mut env = merge_env(&spec.supernodes.env, &pool.env);
    let mut ours = Vec::new();
    if replicas.is_some() && (uses.index || uses.partition) {
        ours.push(field_env(
            POD_INDEX_ENV,
            "metadata.labels['apps.kubernetes.io/pod-index']",
        ));
    }
    if uses.node {
        ours.push(field_env(NODE_NAME_ENV, "spec.nodeName"));
    }
    let gpu = pool.gpu.as_ref();
    let gpu_env = mount_all_env(gpu);
    let supernode_env = merge_env(&merge_env(&env, &ours), &gpu_env);
    env = merge_env(&env, &gpu_env);

    let tls = (!spec.insecure).then(|| format!("{CA_MOUNT_DIR}/{CA_KEY}"));
    let args = supernode_args(
        input,
        tls,
        if process {
            runtime_binding(input.dialect, runtime_port(input.dialect))
        } else {
            Vec::new()
        },
        node_config,
    );
    let parts = PodParts::of(input);
    let mut containers = vec![supernode_container(input, args, supernode_env, &parts)];
    if let Some(image) = superexec_image {
        containers.push(superexec_clientapp_container(input, image, env, &parts));
    }
    let mut pod = PodSpec {
        containers,
        volumes: non_empty(parts.volumes),
        // Code a ServerApp sends runs here: no API token unless the pod template asks for one.
        automount_service_account_token: Some(false),
        runtime_class_name: (mount_all_vendor(gpu) == Some(GpuVendor::Nvidia))
            .then(|| "nvidia".to_owned()),
        ..PodSpec::default()
    };
    let component = format!("pool-{}", pool.name);
    let meta_labels = object_labels(input.federation, "supernode", &component, Some(&pool.name));
    let mut pod_meta = ObjectMeta {
        labels: Some(meta_labels),
        ..ObjectMeta::default()
    };
    if let Some(template) = &pool.pod_template {
        merge_pod_template(&mut pod_meta, &mut pod, template);
    }
    // Towards Pod Security `restricted`: non-root, RuntimeDefault seccomp, no capabilities.
    crate::policy::harden(&mut pod);
    let template = PodTemplateSpec {
        metadata: Some(pod_meta),
        spec: Some(pod),
    };
    Ok(workload(input, replicas, uses.partition, template))
}

/// The pool's `superexec-clientapp` image in process isolation (required there); `None` in
/// subprocess isolation.
fn superexec_image(
    input: &SuperNodePoolInput<'_>,
    process: bool,
) -> Result<Option<String>, RenderError> {
    if !process {
        return Ok(None);
    }
    match input
        .pool
        .images
        .superexec_client_app
        .as_deref()
        .filter(|s| !s.is_empty())
    {
        Some(image) => Ok(Some(image.to_owned())),
        None => Err(RenderError::MissingSuperExecImage {
            pool: input.pool.name.clone(),
        }),
    }
}

/// A pool pod's volumes and what its containers mount of them, and its GPU request.
struct PodParts {
    /// The pool's, then ours (CA bundle, AMD devices); the podTemplate's are merged later.
    volumes: Vec<Volume>,
    /// The CA bundle's mount (unless `insecure`).
    our_mounts: Vec<VolumeMount>,
    /// AMD's device mounts (whole-node AMD GPUs only).
    device_mounts: Vec<VolumeMount>,
    gpu_resources: Option<(String, Quantity)>,
    /// Whole-node AMD GPUs: the containers run privileged.
    privileged: Option<SecurityContext>,
}

impl PodParts {
    fn of(input: &SuperNodePoolInput<'_>) -> Self {
        let gpu = input.pool.gpu.as_ref();
        let amd = mount_all_vendor(gpu) == Some(GpuVendor::Amd);
        let mut volumes = Vec::new();
        append_volumes(&mut volumes, &input.pool.volumes);
        let mut our_mounts = Vec::new();
        if !input.spec.insecure {
            append_volumes(&mut volumes, &[ca_volume(input.ca_secret_name)]);
            our_mounts.push(VolumeMount {
                name: CA_VOLUME.to_owned(),
                mount_path: CA_MOUNT_DIR.to_owned(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
        }
        if amd {
            append_volumes(&mut volumes, &amd_volumes());
        }
        Self {
            volumes,
            our_mounts,
            device_mounts: if amd { amd_mounts() } else { Vec::new() },
            gpu_resources: gpu_request(gpu),
            privileged: amd.then(|| SecurityContext {
                privileged: Some(true),
                ..SecurityContext::default()
            }),
        }
    }
}

/// The `supernode` container (it holds the GPUs in subprocess isolation).
fn supernode_container(
    input: &SuperNodePoolInput<'_>,
    args: Vec<String>,
    env: Vec<EnvVar>,
    parts: &PodParts,
) -> Container {
    let pool = input.pool;
    let mut mounts = pool.volume_mounts.clone();
    append_mounts(&mut mounts, &parts.our_mounts);
    append_mounts(&mut mounts, &parts.device_mounts);
    let mut resources = pool.supernode_resources.clone();
    if !is_process(input.spec) {
        add_gpu(&mut resources, &parts.gpu_resources);
    }
    let port_name = if input.dialect.supernode_host_port() {
        "runtime"
    } else {
        "clientappio"
    };
    Container {
        name: "supernode".to_owned(),
        image: Some(
            pool.images
                .supernode
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| input.spec.supernodes.image.clone()),
        ),
        args: Some(args),
        ports: Some(vec![ContainerPort {
            name: Some(port_name.to_owned()),
            container_port: runtime_port(input.dialect),
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        env: non_empty(env),
        resources: resources.filter(not_empty_resources),
        volume_mounts: non_empty(mounts),
        security_context: parts.privileged.clone(),
        ..Container::default()
    }
}

/// The `superexec-clientapp` container of process isolation (it runs the ClientApps and holds
/// the GPUs).
fn superexec_clientapp_container(
    input: &SuperNodePoolInput<'_>,
    image: String,
    env: Vec<EnvVar>,
    parts: &PodParts,
) -> Container {
    let pool = input.pool;
    let mut mounts = if pool.superexec_volume_mounts.is_empty() {
        pool.volume_mounts.clone()
    } else {
        pool.superexec_volume_mounts.clone()
    };
    append_mounts(&mut mounts, &parts.device_mounts);
    let mut resources = pool.superexec_resources.clone();
    add_gpu(&mut resources, &parts.gpu_resources);
    Container {
        name: "superexec-clientapp".to_owned(),
        image: Some(image),
        args: Some(clientapp_superexec_args(
            input.version,
            runtime_port(input.dialect),
        )),
        env: non_empty(env),
        resources: resources.filter(not_empty_resources),
        volume_mounts: non_empty(mounts),
        security_context: parts.privileged.clone(),
        ..Container::default()
    }
}

/// The pool's StatefulSet (`replicas`; ordinals from the cluster's partition offset when the
/// node config uses `{partition}`) or DaemonSet (no `replicas`: one per node).
fn workload(
    input: &SuperNodePoolInput<'_>,
    replicas: Option<i32>,
    uses_partition: bool,
    template: PodTemplateSpec,
) -> Workload {
    let pool = input.pool;
    let name = pool_workload_name(input.federation, &pool.name);
    let component = format!("pool-{}", pool.name);
    let labels = component_labels(input.federation, "supernode", &component, Some(&pool.name));
    let meta_labels = object_labels(input.federation, "supernode", &component, Some(&pool.name));
    let metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(input.namespace.to_owned()),
        labels: Some(meta_labels),
        ..ObjectMeta::default()
    };
    let selector = LabelSelector {
        match_labels: Some(labels),
        ..LabelSelector::default()
    };
    match replicas {
        Some(replicas) => Workload::StatefulSet(StatefulSet {
            metadata,
            spec: StatefulSetSpec {
                replicas: Some(replicas),
                selector,
                service_name: Some(name),
                template,
                ordinals: uses_partition.then(|| StatefulSetOrdinals {
                    start: Some(i32::try_from(input.cluster.partition_offset).unwrap_or(i32::MAX)),
                }),
                volume_claim_templates: non_empty(
                    pool.volume_claim_templates.iter().map(claim).collect(),
                ),
                ..StatefulSetSpec::default()
            },
            status: None,
        }),
        None => Workload::DaemonSet(DaemonSet {
            metadata,
            spec: DaemonSetSpec {
                selector,
                template,
                ..DaemonSetSpec::default()
            },
            status: None,
        }),
    }
}

/// A PersistentVolumeClaim for a StatefulSet's `volumeClaimTemplates`.
pub fn claim(template: &PersistentVolumeClaimTemplate) -> PersistentVolumeClaim {
    let meta = &template.metadata;
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(meta.name.clone()),
            labels: (!meta.labels.is_empty()).then(|| meta.labels.clone()),
            annotations: (!meta.annotations.is_empty()).then(|| meta.annotations.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(template.spec.clone()),
        status: None,
    }
}

pub(super) fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_owned(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn ca_volume(secret: &str) -> Volume {
    Volume {
        name: CA_VOLUME.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_owned()),
            items: Some(vec![KeyToPath {
                key: CA_KEY.to_owned(),
                path: CA_KEY.to_owned(),
                ..KeyToPath::default()
            }]),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn mount_all_vendor(gpu: Option<&GpuConfig>) -> Option<GpuVendor> {
    gpu.filter(|g| g.mount_all).and_then(|g| g.vendor)
}

fn mount_all_env(gpu: Option<&GpuConfig>) -> Vec<EnvVar> {
    let (name, value) = match mount_all_vendor(gpu) {
        Some(GpuVendor::Nvidia) => ("NVIDIA_VISIBLE_DEVICES", "all"),
        Some(GpuVendor::Amd) => ("ROCR_VISIBLE_DEVICES", "all"),
        None => return Vec::new(),
    };
    vec![EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        ..EnvVar::default()
    }]
}

fn amd_volumes() -> Vec<Volume> {
    [
        ("dev-kfd", "/dev/kfd", "CharDevice"),
        ("dev-dri", "/dev/dri", "Directory"),
    ]
    .into_iter()
    .map(|(name, path, kind)| Volume {
        name: name.to_owned(),
        host_path: Some(HostPathVolumeSource {
            path: path.to_owned(),
            type_: Some(kind.to_owned()),
        }),
        ..Volume::default()
    })
    .collect()
}

fn amd_mounts() -> Vec<VolumeMount> {
    [("dev-kfd", "/dev/kfd"), ("dev-dri", "/dev/dri")]
        .into_iter()
        .map(|(name, path)| VolumeMount {
            name: name.to_owned(),
            mount_path: path.to_owned(),
            ..VolumeMount::default()
        })
        .collect()
}

/// The extended resource and count a pool requests (`enabled` and not `mountAll`).
fn gpu_request(gpu: Option<&GpuConfig>) -> Option<(String, Quantity)> {
    let gpu = gpu.filter(|g| g.enabled && !g.mount_all)?;
    let name = gpu
        .resource_name
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| match gpu.vendor {
            Some(GpuVendor::Amd) => "amd.com/gpu".to_owned(),
            Some(GpuVendor::Nvidia) | None => "nvidia.com/gpu".to_owned(),
        });
    Some((name, Quantity(gpu.count.max(1).to_string())))
}

fn add_gpu(resources: &mut Option<ResourceRequirements>, gpu: &Option<(String, Quantity)>) {
    let Some((name, count)) = gpu else {
        return;
    };
    let r = resources.get_or_insert_with(ResourceRequirements::default);
    for list in [&mut r.limits, &mut r.requests] {
        list.get_or_insert_with(BTreeMap::new)
            .insert(name.clone(), count.clone());
    }
}

fn not_empty_resources(r: &ResourceRequirements) -> bool {
    r != &ResourceRequirements::default()
}

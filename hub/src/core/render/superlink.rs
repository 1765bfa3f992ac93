//! The SuperLink StatefulSet `<fed>-superlink`.

use flower_addon_crds::render::dialect::{classic_ports, unified_ports};
use flower_addon_crds::render::merge::{
    append_mounts, append_volumes, merge_pod_template, non_empty,
};
use flower_addon_crds::render::{
    FLOWER_IMAGE_GROUP, FlowerDialect, FlowerVersion, component_labels, object_labels,
};
use flower_addon_crds::{Federation, IsolationMode};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec,
    SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::core::superlink::{
    SuperLinkLayout, SuperLinkPorts, serverapp_superexec_argv, superlink_argv,
};

use super::{HubRenderError, name, namespace, superlink_name, superlink_tls_secret_name};

/// Port of the SuperLink pod's `outputs-server` sidecar.
pub const OUTPUTS_PORT: u16 = 9099;
/// Where the Federation's outputs volume is mounted on the SuperLink pod (the ServerApp's
/// container and the sidecar).
pub const OUTPUTS_MOUNT_DIR: &str = "/var/lib/flwr/outputs";

/// Volume holding the SuperLink database. An `emptyDir` (survives container restarts) unless
/// `spec.superlink.volumeClaimTemplates` has a claim with this name (survives pod deletion).
pub const STATE_VOLUME: &str = "superlink-state";
/// Where [`STATE_VOLUME`] is mounted; the database is `superlink.db` in it.
pub const STATE_MOUNT_DIR: &str = "/var/lib/flwr/state";
/// Where the SuperLink TLS Secret (`ca.crt`, `tls.crt`, `tls.key`) is mounted.
pub const TLS_MOUNT_DIR: &str = "/etc/flwr/tls";
const TLS_VOLUME: &str = "superlink-tls";
/// Volume holding the runs' outputs (`spec.outputs`): a claim named this in the StatefulSet's
/// claims (`volumeClaimTemplate`), the existing claim `claimName`, or an `emptyDir`.
pub const OUTPUTS_VOLUME: &str = "outputs";
/// The SuperLink's own container (its log is read when it fails: [`crate::flower::diagnose`]).
pub const SUPERLINK_CONTAINER: &str = "superlink";
/// The outputs sidecar's container name: serves the outputs read-only on the pod's loopback to
/// the hub and to `flower-hub run fetch`, through port-forwards.
pub const OUTPUTS_CONTAINER: &str = "outputs";
/// The Fleet front sidecar's container name (a `podTemplate` container of this name is merged
/// into it, e.g. to pull our image from a mirror).
pub const FRONT_CONTAINER: &str = "fleet-front";

/// The StatefulSet claim `outputs` of `spec.outputs.volumeClaimTemplate`.
fn outputs_claim(fed: &Federation) -> Option<PersistentVolumeClaim> {
    let template = fed.spec.outputs.as_ref()?.volume_claim_template.as_ref()?;
    Some(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(OUTPUTS_VOLUME.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(template.spec.clone()),
        status: None,
    })
}

fn port(name: &str, number: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: number,
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    }
}

/// Where the SuperLink container finds its files and listens: Flower's default ports, Fleet on
/// every address and Control on the pod's loopback unless `exposeControl`, the TLS Secret and the state volume mounts ([`crate::core::superlink`] builds the
/// arguments for the container and the standalone process alike). SuperNode authentication is
/// on when the Federation wants it ([`flower_addon_crds::FederationSpec::supernode_auth`]), as in
/// standalone mode: wherever its pools run, their runtime makes the key pairs and the hub
/// registers the public keys.
pub fn container_layout(fed: &Federation, dialect: FlowerDialect) -> SuperLinkLayout {
    // Control on the pod's loopback unless `exposeControl`: no other pod (another tenant's
    // ServerApp) reaches it; the hub and `flower-hub connect` come through port-forwards.
    let control_host = if crate::core::superlink::separate_control(fed) {
        "127.0.0.1"
    } else {
        "0.0.0.0"
    };
    SuperLinkLayout {
        bind_host: "0.0.0.0".to_owned(),
        control_host: control_host.to_owned(),
        ports: SuperLinkPorts::container(fed, dialect),
        tls_files: [
            format!("{TLS_MOUNT_DIR}/ca.crt"),
            format!("{TLS_MOUNT_DIR}/tls.crt"),
            format!("{TLS_MOUNT_DIR}/tls.key"),
        ],
        database: format!("{STATE_MOUNT_DIR}/superlink.db"),
        supernode_auth: fed.spec.supernode_auth(),
    }
}

/// Renders the SuperLink StatefulSet: one replica, container `superlink` with the image's
/// entrypoint, the dialect's ports, the database volume, TLS mounts when `insecure` is false, the
/// `fleet-front` sidecar (our image, [`crate::flower::front`]) where SuperNodes must not reach
/// the unified dialect's Control API, and the `superexec-serverapp` sidecar in process isolation.
pub fn render_superlink(
    fed: &Federation,
    version: FlowerVersion,
    dialect: FlowerDialect,
) -> Result<StatefulSet, HubRenderError> {
    let spec = &fed.spec;
    let superlink = &spec.superlink;
    let process = spec.isolation_mode == IsolationMode::Process;
    let layout = container_layout(fed, dialect);
    let fed_name = name(fed);
    let object_name = superlink_name(fed_name);
    let labels = component_labels(fed_name, "superlink", "superlink", None);
    let meta_labels = object_labels(fed_name, "superlink", "superlink", None);
    let state_is_claim = superlink
        .volume_claim_templates
        .iter()
        .any(|c| c.metadata.name == STATE_VOLUME);
    let (volumes, outputs_mount) = pod_volumes(fed, state_is_claim);

    let mut mounts = vec![VolumeMount {
        name: STATE_VOLUME.to_owned(),
        mount_path: STATE_MOUNT_DIR.to_owned(),
        ..VolumeMount::default()
    }];
    if !spec.insecure {
        mounts.push(tls_mount());
    }
    // In process isolation the ServerApp runs in the SuperExec sidecar and writes there; the
    // SuperLink container gets the mount too (the subprocess ServerApp of the other mode).
    mounts.extend(outputs_mount.clone());
    append_mounts(&mut mounts, &superlink.volume_mounts);

    let mut containers = vec![Container {
        name: SUPERLINK_CONTAINER.to_owned(),
        image: Some(superlink.image.clone()),
        args: Some(superlink_argv(fed, version, dialect, &layout)),
        ports: Some(superlink_ports(dialect, process)),
        env: non_empty(superlink.env.clone()),
        resources: superlink.resources.clone(),
        volume_mounts: Some(mounts),
        ..Container::default()
    }];
    if layout.ports.front {
        containers.push(front_container(fed, &layout));
    }
    if process {
        containers.push(superexec_container(
            fed,
            version,
            dialect,
            &layout,
            outputs_mount.as_ref(),
        )?);
    }
    if let Some(mount) = &outputs_mount {
        containers.push(outputs_container(fed, mount));
    }

    let mut pod = PodSpec {
        containers,
        volumes: non_empty(volumes),
        // Whoever reaches Control runs code here: no API token unless the pod template asks
        // for one (the pod holds only its own TLS Secret).
        automount_service_account_token: Some(false),
        ..PodSpec::default()
    };
    let mut pod_meta = ObjectMeta {
        labels: Some(meta_labels.clone()),
        ..ObjectMeta::default()
    };
    if let Some(template) = &superlink.pod_template {
        merge_pod_template(&mut pod_meta, &mut pod, template);
    }
    let outputs_claimed = spec
        .outputs
        .as_ref()
        .is_some_and(|o| o.claim_name.is_some() || o.volume_claim_template.is_some());
    if state_is_claim || outputs_claimed {
        // A claimed volume is root-owned; Flower's images run as `app`. With an fsGroup the
        // kubelet makes the volume group-writable for it (the podTemplate's own fsGroup wins).
        let security = pod
            .security_context
            .get_or_insert_with(PodSecurityContext::default);
        security.fs_group.get_or_insert(FLOWER_IMAGE_GROUP);
    }
    // Towards Pod Security `restricted`: non-root, RuntimeDefault seccomp, no capabilities.
    flower_addon_crds::policy::harden(&mut pod);
    Ok(StatefulSet {
        metadata: ObjectMeta {
            name: Some(object_name.clone()),
            namespace: Some(namespace(fed).to_owned()),
            labels: Some(meta_labels),
            ..ObjectMeta::default()
        },
        spec: StatefulSetSpec {
            replicas: Some(1),
            selector: LabelSelector {
                match_labels: Some(labels),
                ..LabelSelector::default()
            },
            service_name: Some(object_name),
            template: PodTemplateSpec {
                metadata: Some(pod_meta),
                spec: Some(pod),
            },
            volume_claim_templates: non_empty(
                superlink
                    .volume_claim_templates
                    .iter()
                    .map(flower_addon_crds::render::claim)
                    .chain(outputs_claim(fed))
                    .collect(),
            ),
            ..StatefulSetSpec::default()
        },
        status: None,
    })
}

/// The `superlink` container's ports in `dialect`.
fn superlink_ports(dialect: FlowerDialect, process: bool) -> Vec<ContainerPort> {
    match dialect {
        FlowerDialect::Classic | FlowerDialect::Transitional | FlowerDialect::TransitionalHttp => {
            let mut ports = vec![
                port("fleet", classic_ports::FLEET),
                port("control", classic_ports::CONTROL),
            ];
            if process && dialect != FlowerDialect::TransitionalHttp {
                ports.push(port("serverappio", classic_ports::SERVERAPPIO));
            }
            ports
        }
        FlowerDialect::Unified => vec![port("api", unified_ports::SUPERLINK)],
    }
}

/// The mount of the SuperLink's TLS Secret ([`TLS_VOLUME`]).
fn tls_mount() -> VolumeMount {
    VolumeMount {
        name: TLS_VOLUME.to_owned(),
        mount_path: TLS_MOUNT_DIR.to_owned(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

/// The pod's volumes: ours (state unless claimed, TLS, outputs unless claimed by a template),
/// then the spec's; first name wins. With the outputs volume's mount when there is one.
fn pod_volumes(fed: &Federation, state_is_claim: bool) -> (Vec<Volume>, Option<VolumeMount>) {
    let spec = &fed.spec;
    let mut volumes = Vec::new();
    if !state_is_claim {
        volumes.push(Volume {
            name: STATE_VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
    }
    if !spec.insecure {
        volumes.push(Volume {
            name: TLS_VOLUME.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(superlink_tls_secret_name(fed)),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    let outputs_mount = spec.outputs.as_ref().map(|outputs| {
        if outputs.volume_claim_template.is_none() {
            volumes.push(Volume {
                name: OUTPUTS_VOLUME.to_owned(),
                persistent_volume_claim: outputs.claim_name.as_ref().map(|claim| {
                    PersistentVolumeClaimVolumeSource {
                        claim_name: claim.clone(),
                        read_only: None,
                    }
                }),
                // An emptyDir is held to the size limit by the kubelet; a claim by its size.
                empty_dir: outputs.claim_name.is_none().then(|| EmptyDirVolumeSource {
                    size_limit: Some(outputs.size_limit.clone().unwrap_or_else(|| {
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                            flower_addon_crds::DEFAULT_OUTPUTS_SIZE_LIMIT.to_owned(),
                        )
                    })),
                    ..EmptyDirVolumeSource::default()
                }),
                ..Volume::default()
            });
        }
        VolumeMount {
            name: OUTPUTS_VOLUME.to_owned(),
            mount_path: OUTPUTS_MOUNT_DIR.to_owned(),
            ..VolumeMount::default()
        }
    });
    append_volumes(&mut volumes, &spec.superlink.volumes);
    (volumes, outputs_mount)
}

/// The `fleet-front` sidecar: the Fleet port SuperNodes reach, passing only Fleet calls on to
/// the SuperLink's API port.
fn front_container(fed: &Federation, layout: &SuperLinkLayout) -> Container {
    let mut args = vec![
        "fleet-front".to_owned(),
        format!("--listen=0.0.0.0:{}", layout.ports.fleet),
        format!("--upstream=127.0.0.1:{}", layout.ports.control),
    ];
    let mut mounts = Vec::new();
    if fed.spec.insecure {
        args.push("--insecure".to_owned());
    } else {
        args.push(format!("--tls-dir={TLS_MOUNT_DIR}"));
        mounts.push(tls_mount());
    }
    Container {
        name: FRONT_CONTAINER.to_owned(),
        image: Some(flower_addon_crds::render::ADDON_IMAGE.to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        args: Some(args),
        ports: Some(vec![port("fleet", i32::from(layout.ports.fleet))]),
        volume_mounts: non_empty(mounts),
        ..Container::default()
    }
}

/// The `superexec-serverapp` sidecar of process isolation (it runs the ServerApps).
fn superexec_container(
    fed: &Federation,
    version: FlowerVersion,
    dialect: FlowerDialect,
    layout: &SuperLinkLayout,
    outputs_mount: Option<&VolumeMount>,
) -> Result<Container, HubRenderError> {
    let superlink = &fed.spec.superlink;
    let image = superlink
        .superexec_image
        .clone()
        .filter(|s| !s.is_empty())
        .ok_or(HubRenderError::MissingSuperExecImage)?;
    let mut mounts: Vec<VolumeMount> = outputs_mount.cloned().into_iter().collect();
    // From 1.37 the sidecar dials the SuperLink's TLS server and trusts its CA.
    if !fed.spec.insecure && dialect.control_over_http() {
        mounts.push(tls_mount());
    }
    let user_mounts = if superlink.superexec_volume_mounts.is_empty() {
        &superlink.volume_mounts
    } else {
        &superlink.superexec_volume_mounts
    };
    append_mounts(&mut mounts, user_mounts);
    Ok(Container {
        name: "superexec-serverapp".to_owned(),
        image: Some(image),
        args: Some(serverapp_superexec_argv(fed, version, dialect, layout)),
        env: non_empty(superlink.env.clone()),
        resources: superlink.superexec_resources.clone(),
        volume_mounts: non_empty(mounts),
        ..Container::default()
    })
}

/// The outputs sidecar: serves the outputs volume (read-only) on the pod's loopback, where the
/// hub reaches it through a port-forward.
fn outputs_container(fed: &Federation, mount: &VolumeMount) -> Container {
    Container {
        name: OUTPUTS_CONTAINER.to_owned(),
        image: Some(flower_addon_crds::render::ADDON_IMAGE.to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        args: Some(vec![
            "outputs-server".to_owned(),
            format!("--listen=127.0.0.1:{OUTPUTS_PORT}"),
            format!("--dir={OUTPUTS_MOUNT_DIR}"),
            format!(
                "--max-bytes={}",
                fed.spec
                    .outputs
                    .as_ref()
                    .and_then(|o| o.size_limit_bytes())
                    .unwrap_or(u64::MAX)
            ),
        ]),
        volume_mounts: Some(vec![VolumeMount {
            read_only: Some(true),
            ..mount.clone()
        }]),
        ..Container::default()
    }
}

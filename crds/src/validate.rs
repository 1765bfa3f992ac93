//! Pure validation of Federations and Placements: the CEL rules (same messages, see
//! [`crate::rules`]) and everything the CRD schema enforces, with concrete field paths.

use std::collections::BTreeSet;

use crate::federation::{
    DeploymentMode, Federation, IsolationMode, MAX_NODE_CONFIG_ENTRIES, MAX_NODE_CONFIG_LENGTH,
    MAX_POOLS, MAX_REPLICAS, NodeConfigValue, ServiceType, SuperNodePoolSpec,
};
use crate::placement::{BUILT_IN_PRIORITIZERS, Placement, ScoreCoordinateType, TolerationOperator};
use crate::rules::*;

/// One validation problem: the field it is about and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldError {
    /// Field path such as `spec.supernodes.pools[1].replicas`.
    pub path: String,
    /// What is wrong; for CEL rules the exact CEL message.
    pub message: String,
}

impl FieldError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Validates a Federation: every CEL rule of the CRD and every schema constraint, plus what
/// only this function can check (nodeConfig keys). Empty when valid; in field order otherwise.
pub fn validate_federation(fed: &Federation) -> Vec<FieldError> {
    let spec = &fed.spec;
    let mut errors = Vec::new();
    check_object_names(&mut errors, &fed.metadata);
    if let Some(version) = &spec.version
        && version.is_empty()
    {
        errors.push(FieldError::new(
            "spec.version",
            "must not be empty when set",
        ));
    }
    validate_references(&mut errors, spec);
    validate_superlink(&mut errors, spec);
    validate_supernodes(&mut errors, spec);
    validate_cluster_overrides(&mut errors, spec);
    errors
}

/// `spec.placementRef`, `spec.tls` and `spec.outputs`.
fn validate_references(errors: &mut Vec<FieldError>, spec: &crate::FederationSpec) {
    if let Some(placement) = &spec.placement_ref {
        check_dns_subdomain(errors, "spec.placementRef.name", &placement.name);
    }
    if let Some(tls) = &spec.tls {
        if let Some(secret) = &tls.secret_name {
            check_dns_subdomain(errors, "spec.tls.secretName", secret);
        }
        if tls.extra_sans.len() > 32 {
            errors.push(FieldError::new(
                "spec.tls.extraSANs",
                "must have at most 32 items",
            ));
        }
        for (i, san) in tls.extra_sans.iter().enumerate() {
            if san.is_empty() || san.chars().any(|c| c.is_whitespace() || c == '/') {
                errors.push(FieldError::new(
                    format!("spec.tls.extraSANs[{i}]"),
                    "must be a DNS name or an IP address",
                ));
            }
        }
    }

    if let Some(outputs) = &spec.outputs {
        if let Some(claim) = &outputs.claim_name {
            check_dns_subdomain(errors, "spec.outputs.claimName", claim);
        }
        if outputs.claim_name.is_some() && outputs.volume_claim_template.is_some() {
            errors.push(FieldError::new("spec.outputs", MSG_OUTPUTS_ONE_VOLUME));
        }
        if outputs.size_limit.is_some() && outputs.size_limit_bytes().is_none() {
            errors.push(FieldError::new(
                "spec.outputs.sizeLimit",
                "must be a quantity of at least one byte (e.g. 1Gi, 500Mi)",
            ));
        }
        if let Some(key) = &outputs.run_config_key {
            let mut chars = key.chars();
            let valid = key.len() <= 128
                && chars
                    .next()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
            if !valid {
                errors.push(FieldError::new(
                    "spec.outputs.runConfigKey",
                    "must be a run-config key: letters, digits, '_', '.' and '-', not starting \
                     with '.' or '-', at most 128 characters (e.g. output-dir)",
                ));
            }
        }
    }
}

/// `spec.superlink`.
fn validate_superlink(errors: &mut Vec<FieldError>, spec: &crate::FederationSpec) {
    let sl = &spec.superlink;
    if sl.image.is_empty() {
        errors.push(FieldError::new("spec.superlink.image", "must not be empty"));
    }
    let sl_superexec = sl.superexec_image.as_deref().unwrap_or("");
    match spec.isolation_mode {
        IsolationMode::Process if sl_superexec.is_empty() => errors.push(FieldError::new(
            "spec.superlink.superexecImage",
            MSG_SUPERLINK_SUPEREXEC_REQUIRED,
        )),
        IsolationMode::Subprocess if !sl_superexec.is_empty() => errors.push(FieldError::new(
            "spec.superlink.superexecImage",
            MSG_SUPERLINK_SUPEREXEC_FORBIDDEN,
        )),
        _ => {}
    }
    validate_superlink_service(errors, &sl.service);
    if let Some(addr) = &sl.external_address
        && let Err(why) = check_host_port(addr)
    {
        errors.push(FieldError::new("spec.superlink.externalAddress", why));
    }
    if sl.volume_claim_templates.len() > 16 {
        errors.push(FieldError::new(
            "spec.superlink.volumeClaimTemplates",
            "must have at most 16 items",
        ));
    }
    check_claim_templates(errors, "spec.superlink", &sl.volume_claim_templates);
}

/// `spec.superlink.service`: ports, node ports (in range, each its own, Control only when
/// exposed) and load-balancer source ranges.
fn validate_superlink_service(errors: &mut Vec<FieldError>, service: &crate::SuperLinkServiceSpec) {
    let ports = &service.ports;
    for (name, port) in [
        ("grpc", ports.grpc),
        ("serverAppIO", ports.server_app_io),
        ("extra", ports.extra),
    ] {
        if !(1..=65535).contains(&port) {
            errors.push(FieldError::new(
                format!("spec.superlink.service.ports.{name}"),
                "must be between 1 and 65535",
            ));
        }
    }
    let node_ports = &service.node_ports;
    let pinned = [
        ("grpc", node_ports.grpc),
        ("serverAppIO", node_ports.server_app_io),
        ("extra", node_ports.extra),
    ];
    let mut seen_node_ports = std::collections::BTreeMap::new();
    for (name, port) in pinned {
        let Some(port) = port else { continue };
        let path = format!("spec.superlink.service.nodePorts.{name}");
        if service.type_ == ServiceType::ClusterIP {
            errors.push(FieldError::new(
                path,
                "node ports need spec.superlink.service.type NodePort or LoadBalancer; set the type or remove nodePorts",
            ));
        } else if !(1..=65535).contains(&port) {
            errors.push(FieldError::new(path, "must be between 1 and 65535"));
        } else if let Some(other) = seen_node_ports.insert(port, name) {
            errors.push(FieldError::new(
                path,
                format!("node port {port} is also nodePorts.{other}; each port needs its own"),
            ));
        }
    }
    if node_ports.extra.is_some()
        && service.type_ != ServiceType::ClusterIP
        && !service.expose_control
    {
        errors.push(FieldError::new(
            "spec.superlink.service.nodePorts.extra",
            "the Control API is not exposed (it would let whoever reaches the port run code on every SuperNode); remove nodePorts.extra, or set spec.superlink.service.exposeControl: true",
        ));
    }
    let ranges = &service.load_balancer_source_ranges;
    if !ranges.is_empty() && service.type_ != ServiceType::LoadBalancer {
        errors.push(FieldError::new(
            "spec.superlink.service.loadBalancerSourceRanges",
            "only a LoadBalancer Service has source ranges; set spec.superlink.service.type LoadBalancer or remove them",
        ));
    }
    if ranges.len() > 64 {
        errors.push(FieldError::new(
            "spec.superlink.service.loadBalancerSourceRanges",
            "must have at most 64 items",
        ));
    }
    for (i, range) in ranges.iter().enumerate() {
        if !is_cidr(range) {
            errors.push(FieldError::new(
                format!("spec.superlink.service.loadBalancerSourceRanges[{i}]"),
                format!("{range:?} is not a CIDR such as 203.0.113.0/24 or 2001:db8::/32"),
            ));
        }
    }
}

/// `spec.supernodes`: the image, and each pool (unique names, valid in this mode).
fn validate_supernodes(errors: &mut Vec<FieldError>, spec: &crate::FederationSpec) {
    let sn = &spec.supernodes;
    if sn.image.is_empty() {
        errors.push(FieldError::new(
            "spec.supernodes.image",
            "must not be empty",
        ));
    }
    if sn.pools.is_empty() {
        errors.push(FieldError::new("spec.supernodes.pools", MSG_NO_POOLS));
    }
    if sn.pools.len() > MAX_POOLS {
        errors.push(FieldError::new(
            "spec.supernodes.pools",
            format!("must have at most {MAX_POOLS} items"),
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, pool) in sn.pools.iter().enumerate() {
        let at = format!("spec.supernodes.pools[{i}]");
        if !seen.insert(pool.name.as_str()) {
            errors.push(FieldError::new(
                format!("{at}.name"),
                MSG_DUPLICATE_POOL_NAME,
            ));
        }
        validate_pool(errors, &at, spec.mode, spec.isolation_mode, pool);
        if pool.cluster_selector.is_some() && spec.placement_ref.is_none() {
            errors.push(FieldError::new(
                format!("{at}.clusterSelector"),
                "needs spec.placementRef: the selector picks among the Placement's clusters (pools without placementRef run in the hub cluster only); set placementRef or remove clusterSelector",
            ));
        }
    }
}

/// `spec.clusterOverrides`: they select spoke clusters, name existing pools, and hold what a
/// pool may hold in this mode.
fn validate_cluster_overrides(errors: &mut Vec<FieldError>, spec: &crate::FederationSpec) {
    if spec.cluster_overrides.is_empty() {
        return;
    }
    if spec.placement_ref.is_none() {
        errors.push(FieldError::new(
            "spec.clusterOverrides",
            "needs spec.placementRef: overrides select the Placement's clusters by their labels (pools without placementRef run in the hub cluster only); set placementRef or move the values into the pools",
        ));
    }
    if spec.cluster_overrides.len() > 16 {
        errors.push(FieldError::new(
            "spec.clusterOverrides",
            "must have at most 16 items",
        ));
    }
    for (i, o) in spec.cluster_overrides.iter().enumerate() {
        let at = format!("spec.clusterOverrides[{i}]");
        for (j, name) in o.pools.iter().enumerate() {
            if !spec.supernodes.pools.iter().any(|p| &p.name == name) {
                errors.push(FieldError::new(
                    format!("{at}.pools[{j}]"),
                    format!("no pool named {name:?} in spec.supernodes.pools"),
                ));
            }
        }
        if o.image.as_deref().is_some_and(str::is_empty) {
            errors.push(FieldError::new(
                format!("{at}.image"),
                "must not be empty when set",
            ));
        }
        match (spec.mode, o.replicas) {
            (DeploymentMode::DaemonSet, Some(_)) => errors.push(FieldError::new(
                format!("{at}.replicas"),
                MSG_DAEMONSET_REPLICAS,
            )),
            (DeploymentMode::StatefulSet, Some(r)) => check_replicas(errors, &at, r),
            _ => {}
        }
        for (j, var) in o.env.iter().enumerate() {
            if var.name.is_empty() {
                errors.push(FieldError::new(
                    format!("{at}.env[{j}].name"),
                    "must not be empty",
                ));
            }
        }
        check_node_config(errors, &at, spec.mode, &o.node_config);
    }
}

/// The schema's bounds on a `replicas` field at `at` (a pool or a cluster override).
fn check_replicas(errors: &mut Vec<FieldError>, at: &str, replicas: i32) {
    if replicas < 1 {
        errors.push(FieldError::new(
            format!("{at}.replicas"),
            "must be greater than or equal to 1",
        ));
    } else if replicas > MAX_REPLICAS {
        errors.push(FieldError::new(
            format!("{at}.replicas"),
            format!(
                "must be less than or equal to {MAX_REPLICAS} (SuperNodes of this pool on one \
                 cluster): split the load over more clusters or pools"
            ),
        ));
    }
}

fn validate_pool(
    errors: &mut Vec<FieldError>,
    at: &str,
    mode: DeploymentMode,
    isolation: IsolationMode,
    pool: &SuperNodePoolSpec,
) {
    if let Err(why) = check_dns_label(&pool.name) {
        errors.push(FieldError::new(format!("{at}.name"), why));
    }
    if let Some(replicas) = pool.replicas {
        check_replicas(errors, at, replicas);
    }
    match mode {
        DeploymentMode::DaemonSet if pool.replicas.is_some() => {
            errors.push(FieldError::new(
                format!("{at}.replicas"),
                MSG_DAEMONSET_REPLICAS,
            ));
        }
        DeploymentMode::StatefulSet if pool.replicas.is_none_or(|r| r < 1) => {
            errors.push(FieldError::new(
                format!("{at}.replicas"),
                MSG_STATEFULSET_REPLICAS,
            ));
        }
        _ => {}
    }
    let clientapp = pool.images.superexec_client_app.as_deref().unwrap_or("");
    match isolation {
        IsolationMode::Process if clientapp.is_empty() => errors.push(FieldError::new(
            format!("{at}.images.superexecClientApp"),
            MSG_POOL_SUPEREXEC_REQUIRED,
        )),
        IsolationMode::Subprocess if !clientapp.is_empty() => errors.push(FieldError::new(
            format!("{at}.images.superexecClientApp"),
            MSG_POOL_SUPEREXEC_FORBIDDEN,
        )),
        _ => {}
    }
    if let Some(gpu) = &pool.gpu {
        if gpu.count < 1 {
            errors.push(FieldError::new(
                format!("{at}.gpu.count"),
                "must be greater than or equal to 1",
            ));
        }
        if gpu.mount_all && gpu.vendor.is_none() {
            errors.push(FieldError::new(
                format!("{at}.gpu.vendor"),
                MSG_MOUNTALL_VENDOR,
            ));
        }
    }
    if pool.volume_claim_templates.len() > 16 {
        errors.push(FieldError::new(
            format!("{at}.volumeClaimTemplates"),
            "must have at most 16 items",
        ));
    }
    check_claim_templates(errors, at, &pool.volume_claim_templates);

    check_node_config(errors, at, mode, &pool.node_config);
}

/// The nodeConfig rules, for a pool or a cluster override at `at`.
fn check_node_config(
    errors: &mut Vec<FieldError>,
    at: &str,
    mode: DeploymentMode,
    node_config: &std::collections::BTreeMap<String, NodeConfigValue>,
) {
    if node_config.len() > MAX_NODE_CONFIG_ENTRIES {
        errors.push(FieldError::new(
            format!("{at}.nodeConfig"),
            format!("must have at most {MAX_NODE_CONFIG_ENTRIES} entries"),
        ));
    }
    for (key, value) in node_config {
        let path = format!("{at}.nodeConfig.{key}");
        if let Err(why) = check_node_config_key(key) {
            errors.push(FieldError::new(path.clone(), why));
        }
        match value {
            NodeConfigValue::Bool(b) => errors.push(FieldError::new(
                path,
                format!("must be a string or an integer; write the boolean as \"{b}\""),
            )),
            NodeConfigValue::Int(_) => {}
            NodeConfigValue::String(s) => {
                if s.chars().count() > MAX_NODE_CONFIG_LENGTH {
                    errors.push(FieldError::new(
                        path.clone(),
                        format!("may not be longer than {MAX_NODE_CONFIG_LENGTH}"),
                    ));
                }
                if mode == DeploymentMode::DaemonSet
                    && (s.contains("{index}") || s.contains("{replicas}"))
                {
                    errors.push(FieldError::new(path.clone(), MSG_DAEMONSET_PLACEHOLDER));
                }
                if s.contains('\'') && s.contains('"') {
                    errors.push(FieldError::new(path.clone(), MSG_NODE_CONFIG_QUOTES));
                }
                if s.chars().any(|c| c.is_ascii_control()) {
                    errors.push(FieldError::new(path, MSG_NODE_CONFIG_CONTROL));
                }
            }
        }
    }
}

fn check_claim_templates(
    errors: &mut Vec<FieldError>,
    at: &str,
    templates: &[crate::federation::PersistentVolumeClaimTemplate],
) {
    for (i, t) in templates.iter().enumerate() {
        if let Err(why) = check_dns_label(&t.metadata.name) {
            errors.push(FieldError::new(
                format!("{at}.volumeClaimTemplates[{i}].metadata.name"),
                why,
            ));
        }
    }
}

/// A nodeConfig key must survive `key=value` splitting and TOML parsing as a bare (possibly
/// dotted) key: segments of ASCII letters, digits, `_` and `-`, joined by single dots.
fn check_node_config_key(key: &str) -> Result<(), String> {
    let ok = !key.is_empty()
        && key.len() <= 253
        && key.split('.').all(|seg| {
            !seg.is_empty()
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        });
    if ok {
        Ok(())
    } else {
        Err("key must be letters, digits, '_' and '-' (dots separate nested keys), at most 253 characters".into())
    }
}

/// Whether `text` is an IPv4 or IPv6 CIDR (`address/prefix`, prefix within the family's width).
fn is_cidr(text: &str) -> bool {
    let Some((address, prefix)) = text.split_once('/') else {
        return false;
    };
    let Ok(prefix) = prefix.parse::<u8>() else {
        return false;
    };
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => prefix <= 32,
        Ok(std::net::IpAddr::V6(_)) => prefix <= 128,
        Err(_) => false,
    }
}

/// RFC 1123 label: what the CRD schema's pattern and `maxLength: 63` enforce.
/// `metadata.name` and `metadata.namespace` are DNS labels: they become object names, label
/// values and, in standalone mode and on agents, directory names, so `../..` or `a/b` must never
/// get past validation (the apiserver checks them for stored objects; files are not stored).
fn check_object_names(
    errors: &mut Vec<FieldError>,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) {
    match meta.name.as_deref() {
        None => errors.push(FieldError::new("metadata.name", "must be set")),
        Some(name) => {
            if let Err(why) = check_dns_label(name) {
                errors.push(FieldError::new("metadata.name", why));
            }
        }
    }
    if let Some(namespace) = meta.namespace.as_deref()
        && let Err(why) = check_dns_label(namespace)
    {
        errors.push(FieldError::new("metadata.namespace", why));
    }
}

/// Whether `name` is a DNS-1123 label (lowercase letters, digits and '-', at most 63, not
/// starting or ending with '-'); the error says what is wrong. Shared with the agent, which
/// checks the names in the work it receives before they become paths or object names.
pub fn dns_label(name: &str) -> Result<(), String> {
    check_dns_label(name)
}

fn check_dns_label(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > 63 {
        return Err("may not be longer than 63".into());
    }
    let bytes = name.as_bytes();
    let inner_ok = bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    let ends_ok =
        bytes.first().is_some_and(|b| *b != b'-') && bytes.last().is_some_and(|b| *b != b'-');
    if inner_ok && ends_ok {
        Ok(())
    } else {
        Err(r#"must match "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" (a DNS label)"#.into())
    }
}

fn check_dns_subdomain(errors: &mut Vec<FieldError>, path: &str, name: &str) {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| check_dns_label(label).is_ok());
    if !ok {
        errors.push(FieldError::new(
            path,
            "must be a DNS subdomain (lowercase letters, digits, '-' and '.'), at most 253 characters",
        ));
    }
}

/// `host[:port]` with an IPv6 host in brackets; no scheme, path or whitespace.
fn check_host_port(addr: &str) -> Result<(), String> {
    const WHAT: &str = "must be host[:port] (IPv6 in brackets), without scheme or path";
    if addr.is_empty() || addr.len() > 261 || addr.contains("://") || addr.contains('/') {
        return Err(WHAT.into());
    }
    if addr.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(WHAT.into());
    }
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(|| WHAT.to_string())?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(WHAT.into());
        }
        match after {
            "" => (host, None),
            p => (
                host,
                Some(p.strip_prefix(':').ok_or_else(|| WHAT.to_string())?),
            ),
        }
    } else {
        match addr.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (addr, None),
        }
    };
    if host.is_empty() {
        return Err(WHAT.into());
    }
    if let Some(port) = port {
        match port.parse::<u32>() {
            Ok(p) if (1..=65535).contains(&p) => {}
            _ => return Err("port must be between 1 and 65535".into()),
        }
    }
    Ok(())
}

mod clusterset;
mod placement;
mod run;
pub use clusterset::{validate_cluster_set, validate_cluster_set_binding};
pub use placement::validate_placement;
pub use run::validate_flower_run;

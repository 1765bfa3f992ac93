//! Validation of FlowerRuns (the CRD's rules and schema, for the standalone hub and
//! `flower-hub validate`). The CRD's immutability rule compares with the stored object and is
//! checked where an old spec is known, not here.
use super::*;
use crate::run::{FlowerRun, MAX_RUN_CONFIG_ENTRIES, RunConfigValue};

/// Validates a FlowerRun: names, exactly one FAB source (a URL with its SHA-256), scalar
/// run-config values, the schema's bounds.
pub fn validate_flower_run(run: &FlowerRun) -> Vec<FieldError> {
    let spec = &run.spec;
    let mut errors = Vec::new();
    check_object_names(&mut errors, &run.metadata);
    check_dns_subdomain(
        &mut errors,
        "spec.federationRef.name",
        &spec.federation_ref.name,
    );
    let fab = &spec.app.fab;
    if fab.config_map_ref.is_some() == fab.url.is_some() {
        errors.push(FieldError::new("spec.app.fab", MSG_RUN_FAB_ONE_SOURCE));
    }
    if fab.url.is_some() && fab.sha256.is_none() {
        errors.push(FieldError::new(
            "spec.app.fab.sha256",
            MSG_RUN_FAB_URL_SHA256,
        ));
    }
    if fab.url.is_none() && fab.sha256.is_some() {
        errors.push(FieldError::new(
            "spec.app.fab.sha256",
            MSG_RUN_FAB_SHA256_URL,
        ));
    }
    if let Some(reference) = &fab.config_map_ref {
        check_dns_subdomain(
            &mut errors,
            "spec.app.fab.configMapRef.name",
            &reference.name,
        );
        if !config_map_key_ok(&reference.key) {
            errors.push(FieldError::new(
                "spec.app.fab.configMapRef.key",
                "must be a ConfigMap key: letters, digits, '-', '_' and '.', at most 253",
            ));
        }
    }
    if let Some(url) = &fab.url {
        let scheme_ok = url.starts_with("https://") || url.starts_with("http://");
        if !scheme_ok || url.len() > 2048 || url.chars().any(char::is_whitespace) {
            errors.push(FieldError::new(
                "spec.app.fab.url",
                "must be an http:// or https:// URL without spaces, at most 2048 characters",
            ));
        }
    }
    if let Some(sha) = &fab.sha256
        && (sha.len() != 64
            || !sha
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    {
        errors.push(FieldError::new(
            "spec.app.fab.sha256",
            "must be 64 lower-case hex digits (`sha256sum FILE.fab`)",
        ));
    }
    if spec.run_config.len() > MAX_RUN_CONFIG_ENTRIES {
        errors.push(FieldError::new(
            "spec.runConfig",
            format!("must have at most {MAX_RUN_CONFIG_ENTRIES} entries"),
        ));
    }
    for (key, value) in &spec.run_config {
        if key.is_empty()
            || key
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '=')
        {
            errors.push(FieldError::new(
                format!("spec.runConfig.{key}"),
                "keys are the app's [tool.flwr.app.config] keys: not empty, no spaces or '='",
            ));
        }
        if let RunConfigValue::Other(v) = value {
            errors.push(FieldError::new(
                format!("spec.runConfig.{key}"),
                format!(
                    "must be a string, an integer, a float or a boolean (Flower's run-config \
                     types), not {}",
                    json_kind(v)
                ),
            ));
        }
        if let RunConfigValue::Float(x) = value
            && !x.is_finite()
        {
            errors.push(FieldError::new(
                format!("spec.runConfig.{key}"),
                "must be a finite number",
            ));
        }
    }
    if let Some(seconds) = spec.active_deadline_seconds
        && seconds < 1
    {
        errors.push(FieldError::new(
            "spec.activeDeadlineSeconds",
            "must be at least 1 (leave it unset for no deadline)",
        ));
    }
    if let Some(limit) = spec.backoff_limit
        && !(0..=10).contains(&limit)
    {
        errors.push(FieldError::new(
            "spec.backoffLimit",
            "must be between 0 and 10",
        ));
    }
    if let Some(ttl) = spec.ttl_seconds_after_finished
        && ttl < 0
    {
        errors.push(FieldError::new(
            "spec.ttlSecondsAfterFinished",
            "must not be negative",
        ));
    }
    errors
}

fn config_map_key_ok(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a map",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
    }
}

//! CRD generation: kube's derived CRDs, made structural and given the Federation CEL rules.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{Value, json};

use crate::cluster::ManagedCluster;
use crate::clusterset::{ManagedClusterSet, ManagedClusterSetBinding};
use crate::federation::Federation;
use crate::placement::{Placement, PlacementDecision};
use crate::rules::{CelRule, FEDERATION_SPEC_RULES, FLOWER_RUN_RULES};
use crate::run::FlowerRun;

/// Every flower-addon CRD, in a fixed order: Federation, Placement, PlacementDecision,
/// ManagedCluster, ManagedClusterSet, ManagedClusterSetBinding, FlowerRun.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut binding = finish(ManagedClusterSetBinding::crd(), &[]);
    add_root_rule(&mut binding, BINDING_NAME_RULE, BINDING_NAME_MESSAGE);
    [
        finish(Federation::crd(), FEDERATION_SPEC_RULES),
        finish(Placement::crd(), &[]),
        finish(PlacementDecision::crd(), &[]),
        finish(ManagedCluster::crd(), &[]),
        finish(ManagedClusterSet::crd(), &[]),
        binding,
        finish(FlowerRun::crd(), FLOWER_RUN_RULES),
    ]
    .into_iter()
    .collect()
}

/// File name of a CRD in `manifests/crds/` (`<plural>.<group>.yaml`).
pub fn crd_file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

/// One CRD as YAML (a single document, no leading `---`).
pub fn crd_yaml(crd: &CustomResourceDefinition) -> String {
    // A CRD is plain data (strings, numbers, maps); serialisation cannot fail, but an error is
    // still reported in the output instead of panicking.
    match serde_saphyr::to_string(crd) {
        Ok(s) => s,
        Err(e) => format!("# failed to serialise CRD: {e}\n"),
    }
}

/// All CRDs as one multi-document YAML stream; byte-identical on every call.
pub fn crds_yaml() -> String {
    crds()
        .iter()
        .map(|crd| format!("---\n{}", crd_yaml(crd)))
        .collect()
}

fn finish(crd: CustomResourceDefinition, rules: &[CelRule]) -> CustomResourceDefinition {
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    if let Some(versions) = value
        .pointer_mut("/spec/versions")
        .and_then(Value::as_array_mut)
    {
        for version in versions {
            if let Some(schema) = version.pointer_mut("/schema/openAPIV3Schema") {
                make_structural(schema);
                add_rules(schema, rules);
            }
        }
    }
    serde_json::from_value(value).unwrap_or(crd)
}

/// A ManagedClusterSetBinding is named after its set (OCM's rule; `validate_cluster_set_binding`
/// says the same).
const BINDING_NAME_RULE: &str = "self.metadata.name == self.spec.clusterSet";
const BINDING_NAME_MESSAGE: &str =
    "metadata.name must equal spec.clusterSet: a binding is named after its ManagedClusterSet";

/// Adds a CEL rule at the root of every version's schema (where `self.metadata.name` is visible).
fn add_root_rule(crd: &mut CustomResourceDefinition, rule: &str, message: &str) {
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            let mut rules = schema.x_kubernetes_validations.take().unwrap_or_default();
            rules.push(
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule {
                    rule: rule.to_owned(),
                    message: Some(message.to_owned()),
                    ..Default::default()
                },
            );
            schema.x_kubernetes_validations = Some(rules);
        }
    }
}

/// Puts every rule of `rules` into `x-kubernetes-validations` at its location.
fn add_rules(schema: &mut Value, rules: &[CelRule]) {
    for rule in rules {
        let Some(node) = schema
            .pointer_mut(rule.location)
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        let mut entry = json!({ "rule": rule.rule, "message": rule.message });
        if !rule.field_path.is_empty() {
            entry["fieldPath"] = json!(rule.field_path);
        }
        let list = node
            .entry("x-kubernetes-validations")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(items) = list {
            items.push(entry);
        }
    }
}

/// `deny_unknown_fields` makes schemars emit `additionalProperties: false`, which a structural
/// schema forbids next to `properties` (the apiserver's pruning already drops unknown fields).
fn make_structural(node: &mut Value) {
    match node {
        Value::Object(map) => {
            if map.get("additionalProperties") == Some(&Value::Bool(false)) {
                map.remove("additionalProperties");
            }
            for (_, child) in map.iter_mut() {
                make_structural(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(make_structural),
        _ => {}
    }
}

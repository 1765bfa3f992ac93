//! Hand-written schema fragments for fields whose derived schema would not be structural or
//! would make the CRD needlessly large.

use schemars::{Schema, SchemaGenerator, json_schema};

/// A free-form object: `type: object` with `x-kubernetes-preserve-unknown-fields: true`.
///
/// Used for `podTemplate` and PVC specs: their full schemas would multiply the CRD size, and the
/// apiserver validates them again when the rendered workload is applied.
pub(crate) fn preserve_unknown_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A `nodeConfig` value: a string or an integer (`x-kubernetes-int-or-string`).
///
/// A structural schema cannot express "string, integer or boolean", and a free-form
/// (`x-kubernetes-preserve-unknown-fields`) value would be invisible to CEL, so booleans are
/// written as the strings `"true"`/`"false"` (rendered bare, i.e. as TOML booleans). `maxLength`
/// bounds the CEL cost of the rules that inspect the values.
pub(crate) fn node_config_value_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "maxLength": crate::limits::MAX_NODE_CONFIG_LENGTH,
    })
}

/// A list of free-form objects (used for `volumes`): the full Volume schema would make the
/// Federation CRD larger than `kubectl apply`'s 256 KiB annotation limit; the rendered
/// workloads are validated by the apiserver anyway, and the Rust type stays `Vec<Volume>`.
pub(crate) fn preserve_unknown_object_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 64,
        "items": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
        },
    })
}

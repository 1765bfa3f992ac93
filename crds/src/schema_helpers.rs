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

/// A `nodeConfig` value: any scalar. A structural schema cannot say "string or integer or
/// boolean", so the value is free-form in the CRD and typed by `NodeConfigValue` and the CEL
/// rule that rejects non-scalars.
pub(crate) fn node_config_value_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

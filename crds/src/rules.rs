//! The CEL rules of the Federation spec, in one table used by CRD generation (as
//! `x-kubernetes-validations` on `spec`) and by the tests that check `validate_federation`
//! against the CEL expressions themselves.

/// `spec.supernodes.pools` is empty.
pub const MSG_NO_POOLS: &str = "spec.supernodes.pools must contain at least one pool";
/// A pool sets `replicas` in DaemonSet mode.
pub const MSG_DAEMONSET_REPLICAS: &str =
    "replicas must not be set for pools when mode is DaemonSet";
/// A pool lacks `replicas` ≥ 1 in StatefulSet mode.
pub const MSG_STATEFULSET_REPLICAS: &str =
    "replicas must be set (>=1) for every pool when mode is StatefulSet";
/// Process isolation without `superlink.superexecImage`.
pub const MSG_SUPERLINK_SUPEREXEC_REQUIRED: &str =
    "spec.superlink.superexecImage is required when isolationMode=process";
/// Process isolation and a pool without `images.superexecClientApp`.
pub const MSG_POOL_SUPEREXEC_REQUIRED: &str =
    "spec.supernodes.pools[*].images.superexecClientApp is required when isolationMode=process";
/// Subprocess isolation with `superlink.superexecImage`.
pub const MSG_SUPERLINK_SUPEREXEC_FORBIDDEN: &str =
    "spec.superlink.superexecImage must be empty when isolationMode=subprocess";
/// Subprocess isolation and a pool with `images.superexecClientApp`.
pub const MSG_POOL_SUPEREXEC_FORBIDDEN: &str = "spec.supernodes.pools[*].images.superexecClientApp must be empty when isolationMode=subprocess";
/// `gpu.mountAll` without `gpu.vendor`.
pub const MSG_MOUNTALL_VENDOR: &str =
    "spec.supernodes.pools[*].gpu.vendor is required when gpu.mountAll=true";
/// `spec.outputs` names both an existing claim and a claim template.
pub const MSG_OUTPUTS_ONE_VOLUME: &str = "spec.outputs may set claimName or volumeClaimTemplate, not both: claimName uses an existing claim, volumeClaimTemplate makes one";
/// Two pools share a name.
pub const MSG_DUPLICATE_POOL_NAME: &str = "spec.supernodes.pools[*].name must be unique";
/// A DaemonSet pool's nodeConfig uses `{index}` or `{replicas}`.
pub const MSG_DAEMONSET_PLACEHOLDER: &str =
    "spec.supernodes.pools[*].nodeConfig must not use {index} or {replicas} when mode is DaemonSet";
/// A nodeConfig string value holds both quote characters.
pub const MSG_NODE_CONFIG_QUOTES: &str =
    "spec.supernodes.pools[*].nodeConfig values must not contain both ' and \"";
/// A nodeConfig string value holds a control character (e.g. a newline).
pub const MSG_NODE_CONFIG_CONTROL: &str =
    "spec.supernodes.pools[*].nodeConfig values must not contain control characters";

/// Schema location (JSON pointer under `openAPIV3Schema`) of the Federation spec.
pub const SPEC: &str = "/properties/spec";
/// Schema location of `spec.supernodes.pools`.
pub const POOLS: &str = "/properties/spec/properties/supernodes/properties/pools";
/// Schema location of `spec.outputs`.
pub const OUTPUTS: &str = "/properties/spec/properties/outputs";

/// One CEL rule of the Federation (`self` is the node at `location`, mostly the spec).
///
/// nodeConfig values are `x-kubernetes-int-or-string`; the rules read them through `string()`
/// (an integer never holds a placeholder, quote or control character) instead of a `type()`
/// guard, which evaluates the same in the apiserver and in kube's client-side evaluator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CelRule {
    /// The CEL expression.
    pub rule: &'static str,
    /// The message the apiserver and `validate_federation` report.
    pub message: &'static str,
    /// The field the message is about, as a pattern (`[*]` for "every pool", `{key}` for a
    /// nodeConfig key); `validate_federation` reports the concrete path.
    pub path: &'static str,
    /// The CEL `fieldPath` (relative to `location`) the apiserver reports the error at; empty
    /// for none.
    pub field_path: &'static str,
    /// JSON pointer, under `openAPIV3Schema`, of the schema node that carries the rule.
    pub location: &'static str,
}

/// Every CEL rule of the Federation. Rules 1–8 are flower-operator's (same messages);
/// the rest are what flower-operator left to reconcile time or never checked.
pub const FEDERATION_SPEC_RULES: &[CelRule] = &[
    CelRule {
        rule: "size(self.supernodes.pools) > 0",
        message: MSG_NO_POOLS,
        path: "spec.supernodes.pools",
        field_path: ".supernodes.pools",
        location: SPEC,
    },
    CelRule {
        rule: "self.mode == 'DaemonSet' ? self.supernodes.pools.all(p, !has(p.replicas)) : true",
        message: MSG_DAEMONSET_REPLICAS,
        path: "spec.supernodes.pools[*].replicas",
        field_path: ".supernodes.pools",
        location: SPEC,
    },
    CelRule {
        rule: "self.mode == 'StatefulSet' ? self.supernodes.pools.all(p, has(p.replicas) && p.replicas >= 1) : true",
        message: MSG_STATEFULSET_REPLICAS,
        path: "spec.supernodes.pools[*].replicas",
        field_path: ".supernodes.pools",
        location: SPEC,
    },
    CelRule {
        rule: "self.isolationMode != 'process' || (has(self.superlink.superexecImage) && size(self.superlink.superexecImage) > 0)",
        message: MSG_SUPERLINK_SUPEREXEC_REQUIRED,
        path: "spec.superlink.superexecImage",
        field_path: ".superlink.superexecImage",
        location: SPEC,
    },
    CelRule {
        rule: "self.isolationMode != 'process' || self.supernodes.pools.all(p, has(p.images) && has(p.images.superexecClientApp) && size(p.images.superexecClientApp) > 0)",
        message: MSG_POOL_SUPEREXEC_REQUIRED,
        path: "spec.supernodes.pools[*].images.superexecClientApp",
        field_path: ".supernodes.pools",
        location: SPEC,
    },
    CelRule {
        rule: "self.isolationMode != 'subprocess' || !has(self.superlink.superexecImage) || size(self.superlink.superexecImage) == 0",
        message: MSG_SUPERLINK_SUPEREXEC_FORBIDDEN,
        path: "spec.superlink.superexecImage",
        field_path: ".superlink.superexecImage",
        location: SPEC,
    },
    CelRule {
        rule: "self.isolationMode != 'subprocess' || self.supernodes.pools.all(p, !has(p.images) || !has(p.images.superexecClientApp) || size(p.images.superexecClientApp) == 0)",
        message: MSG_POOL_SUPEREXEC_FORBIDDEN,
        path: "spec.supernodes.pools[*].images.superexecClientApp",
        field_path: ".supernodes.pools",
        location: SPEC,
    },
    CelRule {
        rule: "self.supernodes.pools.all(p, !has(p.gpu) || !has(p.gpu.mountAll) || p.gpu.mountAll == false || (has(p.gpu.vendor) && size(p.gpu.vendor) > 0))",
        message: MSG_MOUNTALL_VENDOR,
        path: "spec.supernodes.pools[*].gpu.vendor",
        field_path: ".supernodes.pools",
        location: SPEC,
    },
    CelRule {
        // On the pools list itself: a nested iteration from the spec root is costed as unbounded
        // by kube's estimator; on the list, `maxItems: 16` bounds both loops.
        rule: "self.all(p, self.exists_one(q, q.name == p.name))",
        message: MSG_DUPLICATE_POOL_NAME,
        path: "spec.supernodes.pools[*].name",
        field_path: "",
        location: POOLS,
    },
    CelRule {
        rule: "self.mode != 'DaemonSet' || self.supernodes.pools.all(p, !has(p.nodeConfig) || p.nodeConfig.all(k, !(string(p.nodeConfig[k]).contains('{index}') || string(p.nodeConfig[k]).contains('{replicas}'))))",
        message: MSG_DAEMONSET_PLACEHOLDER,
        path: "spec.supernodes.pools[*].nodeConfig.{key}",
        field_path: ".supernodes.pools",
        location: SPEC,
    },
    CelRule {
        rule: "self.supernodes.pools.all(p, !has(p.nodeConfig) || p.nodeConfig.all(k, !(string(p.nodeConfig[k]).contains('\\'') && string(p.nodeConfig[k]).contains('\"'))))",
        message: MSG_NODE_CONFIG_QUOTES,
        path: "spec.supernodes.pools[*].nodeConfig.{key}",
        field_path: ".supernodes.pools",
        location: SPEC,
    },
    CelRule {
        rule: "self.supernodes.pools.all(p, !has(p.nodeConfig) || p.nodeConfig.all(k, !string(p.nodeConfig[k]).matches('[\\\\x00-\\\\x1f\\\\x7f]')))",
        message: MSG_NODE_CONFIG_CONTROL,
        path: "spec.supernodes.pools[*].nodeConfig.{key}",
        field_path: ".supernodes.pools",
        location: SPEC,
    },
    CelRule {
        rule: "!(has(self.claimName) && has(self.volumeClaimTemplate))",
        message: MSG_OUTPUTS_ONE_VOLUME,
        path: "spec.outputs",
        field_path: "",
        location: OUTPUTS,
    },
];

/// A FlowerRun's app names both or neither of `configMapRef` and `url`.
pub const MSG_RUN_FAB_ONE_SOURCE: &str =
    "spec.app.fab must set exactly one of configMapRef and url";
/// A FlowerRun's `fab.url` without `fab.sha256`.
pub const MSG_RUN_FAB_URL_SHA256: &str =
    "spec.app.fab.sha256 is required with url: the hub checks the download against it";
/// A FlowerRun's `fab.sha256` without `fab.url`.
pub const MSG_RUN_FAB_SHA256_URL: &str =
    "spec.app.fab.sha256 is only allowed with url (a ConfigMap's FAB is hashed by the hub)";
/// A FlowerRun's spec changed in a field other than `suspend`.
pub const MSG_RUN_IMMUTABLE: &str = "spec is immutable except spec.suspend: to run with other settings, create a new FlowerRun (or delete and re-create this one)";

/// A FlowerRun's `runConfig` changed after the hub first saw it (the hub's check, not CEL's).
pub const MSG_RUN_CONFIG_CHANGED: &str = "spec.runConfig changed after the run was created: the run is stopped; to run with other settings, create a new FlowerRun";

/// Schema location of the FlowerRun spec.
pub const RUN_SPEC: &str = "/properties/spec";
/// Schema location of the FlowerRun `spec.app.fab`.
pub const RUN_FAB: &str = "/properties/spec/properties/app/properties/fab";

/// Every CEL rule of the FlowerRun. The immutability rule is a transition rule (it sees
/// `oldSelf`), so offline validation of one object cannot check it. `runConfig` is free-form
/// (its values are any of four scalar types), which CEL cannot see: the hub holds it to its
/// first value instead (`status.runConfigHash`, [`MSG_RUN_CONFIG_CHANGED`]).
pub const FLOWER_RUN_RULES: &[CelRule] = &[
    CelRule {
        rule: "has(self.configMapRef) != has(self.url)",
        message: MSG_RUN_FAB_ONE_SOURCE,
        path: "spec.app.fab",
        field_path: "",
        location: RUN_FAB,
    },
    CelRule {
        rule: "!has(self.url) || has(self.sha256)",
        message: MSG_RUN_FAB_URL_SHA256,
        path: "spec.app.fab.sha256",
        field_path: "",
        location: RUN_FAB,
    },
    CelRule {
        rule: "!has(self.sha256) || has(self.url)",
        message: MSG_RUN_FAB_SHA256_URL,
        path: "spec.app.fab.sha256",
        field_path: "",
        location: RUN_FAB,
    },
    CelRule {
        rule: "self.federationRef == oldSelf.federationRef && self.app == oldSelf.app \
               && has(self.activeDeadlineSeconds) == has(oldSelf.activeDeadlineSeconds) \
               && (!has(self.activeDeadlineSeconds) || self.activeDeadlineSeconds == oldSelf.activeDeadlineSeconds) \
               && has(self.backoffLimit) == has(oldSelf.backoffLimit) \
               && (!has(self.backoffLimit) || self.backoffLimit == oldSelf.backoffLimit) \
               && has(self.ttlSecondsAfterFinished) == has(oldSelf.ttlSecondsAfterFinished) \
               && (!has(self.ttlSecondsAfterFinished) || self.ttlSecondsAfterFinished == oldSelf.ttlSecondsAfterFinished)",
        message: MSG_RUN_IMMUTABLE,
        path: "spec",
        field_path: "",
        location: RUN_SPEC,
    },
];

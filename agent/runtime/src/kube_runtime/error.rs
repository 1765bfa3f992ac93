//! Why the Kubernetes runtime could not apply (part of) a snapshot.

use crate::render::RenderError;
use crate::work::WorkError;

/// Why the Kubernetes runtime could not apply (part of) a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum KubeRuntimeError {
    /// The work of the Federation cannot be used ([`crate::work::decode_federation`]).
    #[error(transparent)]
    Work(#[from] WorkError),
    /// A pool cannot be rendered.
    #[error("federation {federation}: {source}")]
    Render {
        /// `<namespace>/<name>` of the Federation.
        federation: String,
        /// What is wrong.
        source: RenderError,
    },
    /// The apiserver refused a request.
    #[error("{action}: {source}")]
    Kube {
        /// What the agent was doing, e.g. `apply StatefulSet ns/name`.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// A SuperNode key stored in a pool's key Secret cannot be read, or none can be made.
    #[error("{what}: {source}")]
    NodeKey {
        /// The Secret and data key, e.g. `Secret ns/fed-supernode-a-node-keys data key "fed-supernode-a-0"`.
        what: String,
        /// What is wrong.
        source: crate::node_key::NodeKeyError,
    },
    /// A pool's key Secret kept changing under concurrent writers.
    #[error("{what}: written concurrently by someone else on every attempt; will retry")]
    Conflict {
        /// The Secret.
        what: String,
    },
    /// The pods of the Federation break this cluster's pod policy ([`super::PodPolicy`]).
    #[error("federation {federation} is refused by this cluster's pod policy: {}", violations.join("; "))]
    Policy {
        /// `<namespace>/<name>` of the Federation.
        federation: String,
        /// Each violation, naming the pool, the field and the flag that allows it.
        violations: Vec<String>,
    },
    /// An object of the name the agent would apply exists and is not the agent's.
    #[error(
        "{what} exists and was not created by this agent: it is left alone and the Federation is not applied here; rename or delete it, or remove the Federation from this cluster"
    )]
    NotOwned {
        /// The object, e.g. `StatefulSet ns/name`.
        what: String,
    },
    /// An object could not be serialized for the apply body.
    #[error("serialize {what}: {source}")]
    Serialize {
        /// The object.
        what: String,
        /// The serialization error.
        source: serde_json::Error,
    },
}

impl KubeRuntimeError {
    /// A stable, low-cardinality name of the error kind (metrics, logs).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Work(WorkError::Name { .. }) => "names",
            Self::Work(WorkError::Version { .. }) => "version",
            Self::Work(_) => "decode",
            Self::Render { .. } => "render",
            Self::Kube { .. } => "kube",
            Self::NodeKey { .. } => "node_key",
            Self::Conflict { .. } => "conflict",
            Self::Serialize { .. } => "serialize",
            Self::Policy { .. } => "policy",
            Self::NotOwned { .. } => "not_owned",
        }
    }
}

pub(super) fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeRuntimeError {
    let action = action.into();
    move |source| KubeRuntimeError::Kube { action, source }
}

//! Why a Federation reconcile failed, and what the Federation's status says of it.
use super::*;

/// Why a reconcile failed (retried by [`error_policy`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The apiserver refused a request.
    #[error("{action}: {source}")]
    Kube {
        /// What the controller was doing, e.g. `apply StatefulSet f-superlink`.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// An object could not be serialized.
    #[error("serialize {what}: {source}")]
    Serialize {
        /// The object.
        what: String,
        /// The serialization error.
        source: serde_json::Error,
    },
    /// The hub CA could not issue the SuperLink certificate.
    #[error("issue the SuperLink certificate: {0}")]
    Ca(CaError),
    /// The renderer refused a spec that validation accepted.
    #[error(transparent)]
    Render(#[from] HubRenderError),
    /// The object lacks its namespace (the CRD is namespaced; only a broken cache gives this).
    #[error("{0} has no namespace")]
    NoNamespace(String),
    /// The controller's caches did not list in time (apiserver slow, RBAC missing).
    #[error(
        "the controller's caches of StatefulSets, Services, Secrets and Placements did not list within {0:?}"
    )]
    NotCached(Duration),
}

/// `Result` of the controller.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// What the admin can do about it, for the Federation's `Degraded` condition and event.
    pub fn fix(&self) -> &'static str {
        match self {
            Self::Kube { source, .. } => match source {
                kube::Error::Api(status) if status.code == 403 => {
                    "the hub's ServiceAccount lacks this permission: install the chart's RBAC (or manifests/hub/rbac.yaml) for this namespace"
                }
                kube::Error::Api(status) if status.code == 422 || status.code == 400 => {
                    "the apiserver refused the object (an admission webhook, a quota or a LimitRange in this namespace): see the message"
                }
                _ => "the apiserver did not take the write; the hub retries every 15 s",
            },
            Self::Serialize { .. } | Self::Render(_) => {
                "a defect in the hub: please report it with this message and the Federation"
            }
            Self::Ca(_) => {
                "the hub's Flower CA (Secret flower-hub-flower-ca in the hub's namespace) is unreadable or incomplete: restore it from a backup, then restart the hub"
            }
            Self::NoNamespace(_) => "the Federation CRD must be namespaced: apply manifests/crds",
            Self::NotCached(_) => {
                "the hub could not list StatefulSets, Services, Secrets or Placements: check its RBAC and the apiserver"
            }
        }
    }

    /// A stable, low-cardinality name of the error kind (metrics, logs).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "kube",
            Self::Serialize { .. } => "serialize",
            Self::Ca(_) => "ca",
            Self::Render(_) => "render",
            Self::NoNamespace(_) => "no_namespace",
            Self::NotCached(_) => "not_cached",
        }
    }
}

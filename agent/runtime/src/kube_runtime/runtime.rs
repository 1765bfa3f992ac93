//! [`Runtime`] for [`KubeRuntime`]: what the work channel calls.
use super::*;

impl Runtime for KubeRuntime {
    fn apply<'a>(&'a self, work: &'a ClusterWork) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.apply_work(work)
                .await
                .map_err(|e| RuntimeError::Apply(e.to_string()))
        })
    }

    fn status(&self) -> BoxFuture<'_, Vec<FederationStatus>> {
        Box::pin(self.observe())
    }

    /// `cpu` and `memory` allocatable summed over the cluster's nodes (read at most every
    /// [`ALLOCATABLE_TTL`]); empty if the nodes cannot be listed.
    fn allocatable(&self) -> BoxFuture<'_, crate::runtime::Allocatable> {
        Box::pin(async move {
            let mut cached = self.allocatable.lock().await;
            if let Some((at, value)) = cached.as_ref()
                && at.elapsed() < ALLOCATABLE_TTL
            {
                return value.clone();
            }
            let nodes = match Api::<k8s_openapi::api::core::v1::Node>::all(self.client.clone())
                .list(&Default::default())
                .await
            {
                Ok(list) => list.items,
                Err(error) => {
                    tracing::debug!(%error, "cannot list nodes for the allocatable report");
                    return crate::runtime::Allocatable::new();
                }
            };
            let sum = |key: &str| -> f64 {
                nodes
                    .iter()
                    .filter_map(|n| n.status.as_ref()?.allocatable.as_ref()?.get(key))
                    .filter_map(|q| flower_addon_crds::parse_quantity(&q.0))
                    .sum()
            };
            let mut value = crate::runtime::Allocatable::new();
            if !nodes.is_empty() {
                value.insert(
                    "cpu".to_owned(),
                    format!("{}m", (sum("cpu") * 1000.0).round()),
                );
                value.insert("memory".to_owned(), format!("{}", sum("memory").round()));
            }
            *cached = Some((std::time::Instant::now(), value.clone()));
            value
        })
    }
}

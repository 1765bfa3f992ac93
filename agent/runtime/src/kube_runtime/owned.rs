//! What this runtime owns: every object it writes is stamped ([`Applier::stamp`]), an object of
//! the same name that is not its own is refused before anything is written
//! ([`KubeRuntimeError::NotOwned`]), and only its own objects are pruned.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::Api;

use super::error::kube_err;
use super::writes::prune_kind;
use super::{Kind, KubeRuntime, KubeRuntimeError, ObjectKey, Rendered};
use crate::render::{Workload, node_key_secret_name};
use crate::work::FederationPlan;

impl KubeRuntime {
    /// Refuses the Federation when an object of a name it would write exists and is not this
    /// runtime's ([`Applier::owns`]); checked before anything is written, for the objects not
    /// applied since the last full apply (one GET each).
    pub(super) async fn check_ownership(
        &self,
        plan: &FederationPlan,
        base: &Rendered,
    ) -> Result<(), KubeRuntimeError> {
        let ns = plan.namespace.as_str();
        let mut keys: Vec<ObjectKey> = Vec::new();
        if let Some(secret) = &base.secret {
            keys.push((
                Kind::Secret,
                ns.to_owned(),
                secret.metadata.name.clone().unwrap_or_default(),
            ));
        }
        for service in &base.services {
            keys.push((
                Kind::Service,
                ns.to_owned(),
                service.metadata.name.clone().unwrap_or_default(),
            ));
        }
        for (pool, _) in &base.workloads {
            keys.push((pool.kind, ns.to_owned(), pool.workload.clone()));
            if plan.secure() {
                keys.push((
                    Kind::Secret,
                    ns.to_owned(),
                    node_key_secret_name(&plan.name, &pool.name),
                ));
            }
        }
        for key in keys {
            if self.sent().has_body(&key) {
                continue;
            }
            let what = format!("{} {}/{}", key.0.name(), key.1, key.2);
            let action = format!("get {what}");
            let client = self.client.clone();
            let meta = match key.0 {
                Kind::StatefulSet => Api::<StatefulSet>::namespaced(client, ns)
                    .get_metadata_opt(&key.2)
                    .await
                    .map(|o| o.map(|m| m.metadata)),
                Kind::DaemonSet => Api::<DaemonSet>::namespaced(client, ns)
                    .get_metadata_opt(&key.2)
                    .await
                    .map(|o| o.map(|m| m.metadata)),
                Kind::Secret => Api::<Secret>::namespaced(client, ns)
                    .get_metadata_opt(&key.2)
                    .await
                    .map(|o| o.map(|m| m.metadata)),
                Kind::Service => Api::<Service>::namespaced(client, ns)
                    .get_metadata_opt(&key.2)
                    .await
                    .map(|o| o.map(|m| m.metadata)),
            }
            .map_err(kube_err(action))?;
            if meta.is_some_and(|m| !self.applier.owns(&m)) {
                return Err(KubeRuntimeError::NotOwned { what });
            }
        }
        Ok(())
    }

    /// Marks every rendered object as this runtime's ([`Applier::stamp`]).
    pub(super) fn stamp(&self, rendered: &mut Rendered, plan: &FederationPlan) {
        let (ns, name) = (plan.namespace.as_str(), plan.name.as_str());
        if let Some(secret) = &mut rendered.secret {
            self.applier.stamp(&mut secret.metadata, ns, name);
        }
        for service in &mut rendered.services {
            self.applier.stamp(&mut service.metadata, ns, name);
        }
        for (_, workload) in &mut rendered.workloads {
            match workload {
                Workload::StatefulSet(s) => self.applier.stamp(&mut s.metadata, ns, name),
                Workload::DaemonSet(d) => self.applier.stamp(&mut d.metadata, ns, name),
            }
        }
    }

    /// Deletes every object of this runtime that is not desired (nor of a Federation in
    /// `keep`); returns what it deleted.
    pub(super) async fn prune(
        &self,
        desired: &BTreeSet<ObjectKey>,
        keep: &BTreeSet<(String, String)>,
    ) -> Result<Vec<ObjectKey>, KubeRuntimeError> {
        let (client, selector) = (&self.client, self.applier.selector());
        let selector = selector.as_str();
        let scope = self.policy.namespaces.as_ref();
        let mut pruned =
            prune_kind::<StatefulSet>(client, selector, Kind::StatefulSet, desired, keep, scope)
                .await?;
        pruned.extend(
            prune_kind::<DaemonSet>(client, selector, Kind::DaemonSet, desired, keep, scope)
                .await?,
        );
        pruned.extend(
            prune_kind::<Secret>(client, selector, Kind::Secret, desired, keep, scope).await?,
        );
        pruned.extend(
            prune_kind::<Service>(client, selector, Kind::Service, desired, keep, scope).await?,
        );
        Ok(pruned)
    }
}

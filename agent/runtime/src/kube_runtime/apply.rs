//! How one Federation is applied, step by step: the pod policy's verdict, the pools' key
//! Secrets, the rendered objects, and what the apply answered.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::events;

use super::{
    AppliedWorkload, FederationKeys, Kind, KubeRuntime, KubeRuntimeError, ObjectKey, Rendered,
    ensure_namespace, keys, node_key_secret_name, policy, status,
};
use crate::render::Workload;
use crate::runtime::BoxFuture;
use crate::work::FederationPlan;

impl KubeRuntime {
    /// The pod policy's verdict on a Federation before anything of it is written (not even its
    /// keys): its namespace (made when missing), its objects, and with
    /// `refuse_foreign_objects` that it owns what it would overwrite.
    pub(super) async fn admit(
        &self,
        plan: &FederationPlan,
        base: &Rendered,
    ) -> Result<(), KubeRuntimeError> {
        let ns = plan.namespace.as_str();
        let refused = |violations| KubeRuntimeError::Policy {
            federation: format!("{ns}/{}", plan.name),
            violations,
        };
        if let Some(why) = self.policy.namespace_refusal(ns) {
            return Err(refused(vec![why]));
        }
        let violations = policy::violations(&self.policy, base);
        if !violations.is_empty() {
            return Err(refused(violations));
        }
        if !self.sent().has_namespace(ns) {
            if let Some(why) =
                ensure_namespace(&self.client, ns, &self.policy, self.applier.manager()).await?
            {
                return Err(refused(vec![why]));
            }
            self.sent().namespace_exists(ns);
        }
        if self.policy.refuse_foreign_objects {
            self.check_ownership(plan, base).await?;
        }
        Ok(())
    }

    /// Each pool's SuperNode key Secret (made or completed), named in `desired`; the keys by
    /// pool. A recreated Secret (its keys lost) is a Warning event.
    pub(super) async fn ensure_keys(
        &self,
        plan: &FederationPlan,
        base: &Rendered,
        desired: &mut BTreeSet<ObjectKey>,
    ) -> Result<FederationKeys, KubeRuntimeError> {
        let ns = plan.namespace.as_str();
        let mut pool_keys = FederationKeys::new();
        let mut nodes = None;
        for (pool, workload) in &base.workloads {
            let names = match workload {
                Workload::StatefulSet(s) => keys::statefulset_key_names(s),
                Workload::DaemonSet(d) => {
                    if nodes.is_none() {
                        nodes = Some(self.list_nodes().await?);
                    }
                    keys::daemonset_key_names(d, nodes.as_deref().unwrap_or_default())
                }
            };
            let found = keys::ensure_pool_keys(
                &self.client,
                &self.applier,
                plan,
                (&pool.name, workload),
                &names,
            )
            .await?;
            let key = (
                Kind::Secret,
                ns.to_owned(),
                node_key_secret_name(&plan.name, &pool.name),
            );
            if let Some(lost) = &found.lost {
                self.record(
                    &key,
                    lost.uid.clone(),
                    events::Event {
                        type_: events::EventType::Warning,
                        reason: keys::NODE_KEYS_RECREATED.to_owned(),
                        note: Some(lost.note()),
                        action: "Recreate".to_owned(),
                        secondary: None,
                    },
                );
            }
            desired.insert(key);
            pool_keys.insert(pool.name.clone(), found.keys);
        }
        Ok(pool_keys)
    }

    /// Applies what was rendered: the workloads first, all at once (their pods are what takes
    /// long to start), then the Secret and Services they use, all at once: on a busy apiserver
    /// a write shared with others lands later, and a pod that starts before its Secret or
    /// Service exists waits for it. On the first error the rest is dropped (applied again next
    /// time). Each workload with what the apply stored (`None`: unchanged, not sent).
    pub(super) async fn apply_rendered<'r>(
        &self,
        plan: &FederationPlan,
        rendered: &'r Rendered,
        desired: &mut BTreeSet<ObjectKey>,
    ) -> Result<Vec<AppliedWorkload<'r>>, KubeRuntimeError> {
        let ns = plan.namespace.as_str();
        let mut supporting: Vec<BoxFuture<'_, Result<(), KubeRuntimeError>>> = Vec::new();
        if let Some(secret) = &rendered.secret {
            let name = secret.metadata.name.clone().unwrap_or_default();
            let key = (Kind::Secret, ns.to_owned(), name);
            desired.insert(key.clone());
            let api = Api::<Secret>::namespaced(self.client.clone(), ns);
            supporting.push(Box::pin(async move {
                self.send(&api, key, secret).await.map(drop)
            }));
        }
        for service in &rendered.services {
            let name = service.metadata.name.clone().unwrap_or_default();
            let key = (Kind::Service, ns.to_owned(), name);
            desired.insert(key.clone());
            let api =
                Api::<k8s_openapi::api::core::v1::Service>::namespaced(self.client.clone(), ns);
            supporting.push(Box::pin(async move {
                self.send(&api, key, service).await.map(drop)
            }));
        }
        let mut workloads = Vec::with_capacity(rendered.workloads.len());
        for (pool, workload) in &rendered.workloads {
            let key = (pool.kind, ns.to_owned(), pool.workload.clone());
            desired.insert(key.clone());
            workloads.push(async move {
                let stored = match workload {
                    Workload::StatefulSet(s) => {
                        let api = Api::<StatefulSet>::namespaced(self.client.clone(), ns);
                        self.send(&api, key.clone(), s).await?.map(|s| {
                            let counts = status::statefulset_counts(&s);
                            let generation = s.metadata.generation;
                            (s.metadata.uid, status::Applied { generation, counts })
                        })
                    }
                    Workload::DaemonSet(d) => {
                        let api = Api::<DaemonSet>::namespaced(self.client.clone(), ns);
                        self.send(&api, key.clone(), d).await?.map(|d| {
                            let counts = status::daemonset_counts(&d);
                            let generation = d.metadata.generation;
                            (d.metadata.uid, status::Applied { generation, counts })
                        })
                    }
                };
                Ok::<_, KubeRuntimeError>((pool, key, stored))
            });
        }
        let stored = futures::future::try_join_all(workloads).await?;
        futures::future::try_join_all(supporting).await?;
        Ok(stored)
    }

    /// An `Applied` event per workload the apply stored, and its counts for the status until the
    /// workload cache has it.
    pub(super) fn record_applied(&self, plan: &FederationPlan, stored: Vec<AppliedWorkload<'_>>) {
        let ns = plan.namespace.as_str();
        for (pool, key, stored) in stored {
            let Some((uid, applied)) = stored else {
                continue;
            };
            let counts = applied.counts;
            let note = match pool.kind {
                Kind::StatefulSet if pool.waiting > 0 => format!(
                    "applied for Federation {ns}/{}, pool {}: {} SuperNode(s), {} waiting for the hub to register their key",
                    plan.name,
                    pool.name,
                    counts.desired + pool.waiting,
                    pool.waiting
                ),
                Kind::StatefulSet => format!(
                    "applied for Federation {ns}/{}, pool {}: {} SuperNode(s)",
                    plan.name, pool.name, counts.desired
                ),
                _ => format!(
                    "applied for Federation {ns}/{}, pool {}: one SuperNode per node",
                    plan.name, pool.name
                ),
            };
            self.record(
                &key,
                uid,
                events::Event {
                    type_: events::EventType::Normal,
                    reason: "Applied".to_owned(),
                    note: Some(note),
                    action: "Apply".to_owned(),
                    secondary: None,
                },
            );
            // Until the workload cache has it, the status is read from the apply's answer.
            if let Some(cache) = &self.workloads {
                cache.just_applied(key, applied);
            }
        }
    }
}

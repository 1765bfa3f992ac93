//! The [`ClusterStore`] of the Kubernetes mode: clusters as ManagedClusters, tokens, keys and
//! CAs as Secrets, leases on the ManagedClusters' status.
use super::*;

impl ClusterStore for KubeStore {
    fn ca_location(&self, role: CaRole) -> String {
        format!("Secret {}/{}", self.namespace, ca_secret_name(role))
    }

    async fn load_ca_for(&self, role: CaRole) -> Result<Option<CaMaterial>, StoreError> {
        let name = ca_secret_name(role);
        self.secrets()
            .get_opt(name)
            .await
            .map_err(kube_err(format!("get Secret {name}")))?
            .as_ref()
            .map(ca_of)
            .transpose()
    }

    async fn replace_ca_for(
        &self,
        role: CaRole,
        current: &CaMaterial,
        new: &CaMaterial,
    ) -> Result<(), StoreError> {
        let name = ca_secret_name(role);
        let mut secret = self
            .secrets()
            .get(name)
            .await
            .map_err(kube_err(format!("get Secret {name}")))?;
        if ca_of(&secret)? != *current {
            return Err(StoreError::Io {
                path: format!("Secret {name}"),
                source: std::io::Error::other("the CA changed meanwhile; run the command again"),
            });
        }
        // Replaced with the resourceVersion read: a concurrent change fails instead of being lost.
        secret.data = Some(ca_data(new));
        self.secrets()
            .replace(name, &PostParams::default(), &secret)
            .await
            .map_err(kube_err(format!("replace Secret {name}")))?;
        Ok(())
    }

    async fn ca_in_force(&self, role: CaRole) -> Result<Option<String>, StoreError> {
        let name = ca_secret_name(role);
        Ok(self
            .secrets()
            .get_opt(name)
            .await
            .map_err(kube_err(format!("get Secret {name}")))?
            .and_then(|s| s.metadata.annotations?.remove(CA_IN_FORCE_ANNOTATION)))
    }

    async fn mark_ca_in_force(&self, role: CaRole, fingerprint: &str) -> Result<(), StoreError> {
        let name = ca_secret_name(role);
        let patch = serde_json::json!({
            "metadata": {"annotations": {CA_IN_FORCE_ANNOTATION: fingerprint}}
        });
        self.secrets()
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map_err(kube_err(format!("annotate Secret {name}")))?;
        Ok(())
    }

    async fn create_ca_for(&self, role: CaRole, ca: &CaMaterial) -> Result<CaMaterial, StoreError> {
        let name = ca_secret_name(role);
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            data: Some(ca_data(ca)),
            ..Default::default()
        };
        match self.secrets().create(&PostParams::default(), &secret).await {
            Ok(_) => Ok(ca.clone()),
            Err(e) if is_status(&e, 409) => {
                self.load_ca_for(role)
                    .await?
                    .ok_or_else(|| StoreError::Corrupt {
                        path: name.into(),
                        detail: "vanished after a create conflict".into(),
                    })
            }
            Err(e) if is_status(&e, 404) => Err(StoreError::Corrupt {
                path: name.into(),
                detail: format!(
                    "cannot create it: namespace {:?} does not exist (apply manifests/hub/namespace.yaml, or pass --namespace)",
                    self.namespace
                ),
            }),
            Err(e) => Err(kube_err(format!("create Secret {name}"))(e)),
        }
    }

    async fn put_token(&self, token: &TokenRecord) -> Result<(), StoreError> {
        let secret = token_secret(&self.namespace, token)?;
        let name = secret.name_any();
        self.secrets()
            .create(&PostParams::default(), &secret)
            .await
            .map_err(kube_err(format!("create Secret {name}")))?;
        Ok(())
    }

    async fn get_token(&self, id: &str) -> Result<Option<TokenRecord>, StoreError> {
        let name = token_secret_name(id);
        match self
            .secrets()
            .get_opt(&name)
            .await
            .map_err(kube_err(format!("get Secret {name}")))?
        {
            Some(secret) if secret.type_.as_deref() == Some(TOKEN_SECRET_TYPE) => {
                token_of(&secret).map(Some)
            }
            _ => Ok(None),
        }
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        let mut out = self
            .secrets()
            .list(&ListParams::default().labels(&format!("{TOKEN_LABEL}=true")))
            .await
            .map_err(kube_err("list token Secrets"))?
            .items
            .iter()
            .filter(|s| s.type_.as_deref() == Some(TOKEN_SECRET_TYPE))
            // One damaged Secret must not hide every other token.
            .filter_map(|s| match token_of(s) {
                Ok(t) => Some(t),
                Err(error) => {
                    crate::registration::store::file::unreadable_token(
                        &format!("Secret {}/{}", self.namespace, s.name_any()),
                        &error,
                    );
                    None
                }
            })
            .collect::<Vec<_>>();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn delete_token(&self, id: &str) -> Result<bool, StoreError> {
        let name = token_secret_name(id);
        match self.secrets().delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(true),
            Err(e) if is_status(&e, 404) => Ok(false),
            Err(e) => Err(kube_err(format!("delete Secret {name}"))(e)),
        }
    }

    async fn use_token(&self, id: &str) -> Result<bool, StoreError> {
        let name = token_secret_name(id);
        let api = self.secrets();
        for _ in 0..CONFLICT_RETRIES {
            let Some(mut secret) = api
                .get_opt(&name)
                .await
                .map_err(kube_err(format!("get Secret {name}")))?
                .filter(|s| s.type_.as_deref() == Some(TOKEN_SECRET_TYPE))
            else {
                return Ok(false);
            };
            let mut token = token_of(&secret)?;
            if !token.has_uses_left() {
                return Ok(false);
            }
            token.uses = token.uses.saturating_add(1);
            // The read resourceVersion stays: a concurrent use in between is a conflict.
            secret.data = token_secret(&self.namespace, &token)?.data;
            match api.replace(&name, &PostParams::default(), &secret).await {
                Ok(_) => return Ok(true),
                Err(e) if is_status(&e, 409) => continue,
                Err(e) if is_status(&e, 404) => return Ok(false),
                Err(e) => return Err(kube_err(format!("update Secret {name}"))(e)),
            }
        }
        Err(conflict(&name))
    }

    async fn create_cluster(
        &self,
        registration: &ClusterRegistration,
        hub_accepts_client: bool,
    ) -> Result<(), StoreError> {
        let name = registration.name.clone();
        let mut mc = ManagedCluster::new(
            &name,
            ManagedClusterSpec {
                hub_accepts_client,
                lease_duration_seconds: self.lease_seconds,
                ..Default::default()
            },
        );
        mc.metadata.annotations = Some(registration_annotations(registration));
        // The labels the admin gave through the token.
        mc.metadata.labels = (!registration.labels.is_empty()).then(|| registration.labels.clone());
        match self.clusters().create(&PostParams::default(), &mc).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 409) => return Err(StoreError::AlreadyExists(name)),
            Err(e) => return Err(kube_err(format!("create ManagedCluster {name}"))(e)),
        }
        self.modify_status(&name, |status| set_declared(status, registration))
            .await
    }

    async fn update_registration(
        &self,
        registration: &ClusterRegistration,
    ) -> Result<(), StoreError> {
        let annotations = registration_annotations(registration);
        self.modify(&registration.name, |mc| {
            let mut changed = false;
            let current = mc.annotations_mut();
            for (k, v) in &annotations {
                if current.get(k) != Some(v) {
                    current.insert(k.clone(), v.clone());
                    changed = true;
                }
            }
            // Labels are only added (token labels at binding, `accept --label`); removing one
            // is the admin's, on the ManagedCluster.
            let labels = mc.labels_mut();
            for (k, v) in &registration.labels {
                if labels.get(k) != Some(v) {
                    labels.insert(k.clone(), v.clone());
                    changed = true;
                }
            }
            changed
        })
        .await?;
        self.modify_status(&registration.name, |status| {
            set_declared(status, registration)
        })
        .await
    }

    async fn set_accepted(&self, name: &str, accepted: bool) -> Result<(), StoreError> {
        self.modify(name, |mc| {
            let changed = mc.spec.hub_accepts_client != accepted;
            mc.spec.hub_accepts_client = accepted;
            changed
        })
        .await
    }

    async fn put_status(&self, name: &str, status: &ClusterStatus) -> Result<(), StoreError> {
        self.modify(name, |mc| sync_spec_with_status(mc, status))
            .await?;
        self.modify_status(name, |observed| set_observed(observed, status))
            .await
    }

    async fn update_status<F>(&self, name: &str, mut update: F) -> Result<(), StoreError>
    where
        F: FnMut(&mut ClusterStatus) + Send,
    {
        // One write (two when the taints or annotations follow), from the cached object: the
        // channel writes a status for every cluster that connects, 10,000 at a hub restart. A
        // conflict (the cache was behind) reads the object afresh.
        let api = self.clusters();
        let mut cached = self.cache.get(name).map(|mc| ManagedCluster::clone(&mc));
        for _ in 0..CONFLICT_RETRIES {
            let from_cache = cached.is_some();
            let mut mc = match cached.take() {
                Some(mc) => mc,
                None => match api
                    .get_opt(name)
                    .await
                    .map_err(kube_err(format!("get ManagedCluster {name}")))?
                {
                    Some(mc) => mc,
                    None => return Ok(()),
                },
            };
            let before = record_of(&mc).status;
            let mut status = before.clone();
            update(&mut status);
            if status == before {
                if from_cache {
                    // Nothing to write, by a cache that may be behind: confirm it.
                    continue;
                }
                return Ok(());
            }
            if sync_spec_with_status(&mut mc, &status) {
                match api.replace(name, &PostParams::default(), &mc).await {
                    Ok(written) => mc = written,
                    Err(e) if is_status(&e, 409) => continue,
                    Err(e) if is_status(&e, 404) => return Ok(()),
                    Err(e) => return Err(kube_err(format!("update ManagedCluster {name}"))(e)),
                }
            }
            let observed_before = mc.status.clone();
            set_observed(mc.status.get_or_insert_with(Default::default), &status);
            if mc.status == observed_before {
                return Ok(());
            }
            match api.replace_status(name, &PostParams::default(), &mc).await {
                Ok(_) => return Ok(()),
                Err(e) if is_status(&e, 409) => continue,
                Err(e) if is_status(&e, 404) => return Ok(()),
                Err(e) => {
                    return Err(kube_err(format!("update status of ManagedCluster {name}"))(
                        e,
                    ));
                }
            }
        }
        Err(conflict(name))
    }

    async fn get_cluster(&self, name: &str) -> Result<Option<ClusterRecord>, StoreError> {
        Ok(self
            .clusters()
            .get_opt(name)
            .await
            .map_err(kube_err(format!("get ManagedCluster {name}")))?
            .as_ref()
            .map(record_of))
    }

    fn cached_cluster(&self, name: &str) -> Option<ClusterRecord> {
        self.cache.get(name).map(|mc| record_of(&mc))
    }

    fn cached_clusters(&self) -> Option<Vec<ClusterRecord>> {
        Some(self.cache.iter().map(|mc| record_of(mc.value())).collect())
    }

    async fn list_clusters(&self) -> Result<Vec<ClusterRecord>, StoreError> {
        let mut out: Vec<ClusterRecord> = self
            .clusters()
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list ManagedClusters"))?
            .items
            .iter()
            .map(record_of)
            .collect();
        out.sort_by(|a, b| a.registration.name.cmp(&b.registration.name));
        Ok(out)
    }

    async fn delete_cluster(&self, name: &str) -> Result<bool, StoreError> {
        match self.clusters().delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(true),
            Err(e) if is_status(&e, 404) => Ok(false),
            Err(e) => Err(kube_err(format!("delete ManagedCluster {name}"))(e)),
        }
    }

    fn changes(&self) -> broadcast::Receiver<String> {
        self.changes.subscribe()
    }
}

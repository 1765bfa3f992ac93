//! The standalone hub's SuperNode side: the pools of Federations without `placementRef` run on
//! the hub machine (an embedded process runtime), and the agents' node keys are registered with
//! each Federation's SuperLink.
use super::*;

impl<S: ClusterStore> StandaloneHub<S> {
    /// Runs the pools of Federations without `placementRef` on this machine and records their
    /// status like an agent's report.
    pub(super) async fn run_local(&mut self, federations: Option<Vec<FederationWork>>) {
        use crate::channel::WorkSource;
        use flower_addon_agent::runtime::Runtime;
        let federations = federations.unwrap_or_default();
        if federations.is_empty() && self.local.is_none() {
            return;
        }
        let runtime = match &self.local {
            Some(rt) => rt.clone(),
            None => {
                let config = flower_addon_agent::process_runtime::ProcessRuntimeConfig {
                    state_dir: self.config.state_dir.join("local-pools"),
                    flower_bin: self.config.flower_bin.clone(),
                    port_base: 19500,
                    node_name: "hub".into(),
                };
                match flower_addon_agent::process_runtime::ProcessRuntime::new(config) {
                    Ok(rt) => {
                        let rt = Arc::new(rt);
                        self.local = Some(rt.clone());
                        rt
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot run pools on the hub machine");
                        return;
                    }
                }
            }
        };
        let work = ClusterWork {
            version: 0,
            cluster_name: HUB_CLUSTER.into(),
            federations,
        };
        if self.sent.get(HUB_CLUSTER) != Some(&work) {
            match runtime.apply(&work).await {
                Ok(()) => {
                    self.sent.insert(HUB_CLUSTER.into(), work);
                }
                Err(error) => tracing::warn!(%error, "cannot run the hub's own pools"),
            }
        }
        let status = flower_addon_proto::Status {
            observed_version: 0,
            federations: runtime.status().await,
            cluster_name: HUB_CLUSTER.into(),
            ..Default::default()
        };
        self.work.on_status(HUB_CLUSTER, &status);
    }

    pub(super) async fn register_node_keys(&mut self, federations: &[Federation]) {
        for fed in federations {
            if fed.spec.insecure {
                continue;
            }
            let key = fed_key(fed);
            let Ok((version, dialect)) = federation_dialect(fed) else {
                continue;
            };
            let mut keys: BTreeSet<String> = BTreeSet::new();
            for cluster in self.sent.keys().map(String::as_str).chain([HUB_CLUSTER]) {
                if let Some(status) = self.work.last_status(cluster) {
                    for f in status
                        .federations
                        .iter()
                        .filter(|f| f.namespace == key.0 && f.name == key.1)
                    {
                        for pool in &f.pools {
                            keys.extend(pool.node_public_keys.iter().cloned());
                        }
                    }
                }
            }
            let todo: Vec<String> = keys
                .into_iter()
                .filter(|k| !self.registered.contains(&(key.clone(), k.clone())))
                .collect();
            if todo.is_empty() {
                continue;
            }
            let paths = SuperLinkPaths::new(&self.config.state_dir, &key.0, &key.1);
            let addr = SuperLinkPorts::from_spec(fed, dialect);
            let connection =
                match noderegister::write_connection(&paths, version, addr.control, false) {
                    Ok(c) => c,
                    Err(error) => {
                        tracing::warn!(%error, "cannot prepare flwr");
                        continue;
                    }
                };
            let path_env = self.flower_env().get("PATH").cloned();
            let flwr = self.flower_program("flwr");
            // `flwr` takes seconds to start: register every new key of this Federation at once.
            let attempts = todo.into_iter().map(|public_key| {
                let (paths, connection, path_env, flwr) = (
                    paths.clone(),
                    connection.clone(),
                    path_env.clone(),
                    flwr.clone(),
                );
                async move {
                    let file = noderegister::key_file(&paths, &public_key)?;
                    noderegister::register_key(
                        &flwr,
                        &paths,
                        &connection,
                        &file,
                        path_env.as_deref(),
                    )
                    .await
                    .map(|()| (public_key, file))
                }
            });
            for result in futures::future::join_all(attempts).await {
                match result {
                    Ok((public_key, file)) => {
                        tracing::info!(federation = %key.1, key = %file.display(), "registered a SuperNode key with the SuperLink");
                        self.registered.insert((key.clone(), public_key));
                    }
                    Err(error) => {
                        tracing::warn!(federation = %key.1, %error, "cannot register a SuperNode key yet; will retry");
                    }
                }
            }
        }
    }
}

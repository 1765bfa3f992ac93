//! The standalone hub's SuperNode side: the pools of Federations without `placementRef` run on
//! the hub machine (an embedded process runtime), and the agents' node keys are registered with
//! each Federation's SuperLink.
use super::*;

impl<S: ClusterStore> StandaloneHub<S> {
    /// Runs the pools of Federations without `placementRef` on this machine and records their
    /// status like an agent's report.
    pub(super) async fn run_local(&mut self, federations: Option<Vec<FederationWork>>) {
        use crate::channel::source::WorkSource;
        use flower_addon_runtime::runtime::Runtime;
        let Some(federations) = crate::core::hold::hold(
            federations.unwrap_or_default(),
            self.sent.get(HUB_CLUSTER),
            &self.held,
        ) else {
            return;
        };
        if federations.is_empty() && self.local.is_none() {
            return;
        }
        let runtime = match &self.local {
            Some(rt) => rt.clone(),
            None => {
                let config = flower_addon_runtime::process_runtime::ProcessRuntimeConfig {
                    state_dir: self.config.state_dir.join("local-pools"),
                    flower_bin: self.config.flower_bin.clone(),
                    port_base: self.config.local_port_base,
                    node_name: "hub".into(),
                    hide: self.config.sandbox.then(|| self.config.state_dir.clone()),
                    bridge: self
                        .config
                        .supernode_network
                        .as_ref()
                        .map(|b| b.program.clone()),
                };
                match flower_addon_runtime::process_runtime::ProcessRuntime::new(config) {
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
            let started = std::time::Instant::now();
            let applied = runtime.apply(&work).await;
            crate::metrics::hub().reconciled(
                "local-pools",
                started.elapsed(),
                applied.as_ref().err().map(|_| "apply"),
            );
            match applied {
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

    /// Keeps each Federation's SuperLink holding exactly the keys its placed clusters report
    /// (the hub machine's own for a Federation without placement), through the Control API
    /// ([`crate::flower::registry`]); the registered keys go back to the agents with the next
    /// work, so their SuperNodes start.
    pub(super) async fn sync_node_keys(
        &mut self,
        federations: &[Federation],
        views: &[crate::core::placement::ClusterView],
    ) {
        let labels: BTreeMap<String, BTreeMap<String, String>> = views
            .iter()
            .map(|v| (v.name.clone(), v.labels.clone()))
            .collect();
        let mut targets = Vec::new();
        for fed in federations {
            let key = fed_key(fed);
            if !fed.spec.supernode_auth() || !self.superlinks.contains_key(&key) {
                continue;
            }
            let placed_on: BTreeSet<String> = match fed.spec.placement_ref {
                Some(ref placement) => self
                    .selections
                    .get(&(key.0.clone(), placement.name.clone()))
                    .cloned()
                    .unwrap_or_default(),
                None => [HUB_CLUSTER.to_owned()].into(),
            };
            let limits = crate::core::nodekeys::key_limits(&fed.spec, &placed_on, &labels);
            let wanted = crate::core::nodekeys::wanted(&key, &placed_on, &limits, |c| {
                self.work.last_status(c)
            });
            let Some(endpoint) = self.control_endpoint(fed) else {
                continue;
            };
            let paths = SuperLinkPaths::new(&self.config.state_dir, &key.0, &key.1);
            targets.push(crate::flower::registry::KeyTarget {
                endpoint,
                wanted: wanted.keys,
                complete: wanted.complete,
                log: Some(superlink_log(&paths)),
                federation: key,
            });
        }
        // Off the pass: one sync at a time, started with this pass's targets when the last one
        // is done (the next pass brings the targets up to date).
        if self.key_sync.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let keys = self.keys.clone();
        self.key_sync = Some(tokio::spawn(async move {
            keys.sync(targets).await;
        }));
    }

    /// How the hub reaches a running SuperLink's Control API: its address, the name in its
    /// certificate and the CA that signed it (none for an insecure Federation); `None` while no
    /// SuperLink runs for it or its CA cannot be read.
    pub(super) fn control_endpoint(
        &self,
        fed: &Federation,
    ) -> Option<crate::flower::control::ControlEndpoint> {
        let key = fed_key(fed);
        if !self.superlinks.contains_key(&key) {
            return None;
        }
        let (_, dialect) = federation_dialect(fed).ok()?;
        let ca_pem = if fed.spec.insecure {
            None
        } else {
            let paths = SuperLinkPaths::new(&self.config.state_dir, &key.0, &key.1);
            Some(std::fs::read_to_string(&paths.ca).ok()?)
        };
        let host = self.control_dial_host(fed);
        Some(crate::flower::control::ControlEndpoint {
            dialect,
            address: crate::core::render::with_default_port(
                &host,
                i32::from(SuperLinkPorts::from_spec(fed, dialect).control),
            ),
            server_name: host,
            ca_pem,
            tunnel: None,
        })
    }

    /// Where the hub itself dials its SuperLinks' Control API: loopback when they listen on
    /// every address, else the one address they are bound to (in their certificate's SANs).
    fn control_dial_host(&self, fed: &Federation) -> String {
        if crate::core::superlink::separate_control(fed) {
            return "127.0.0.1".to_owned();
        }
        match self.config.superlink_host.as_str() {
            "0.0.0.0" | "::" | "" => "127.0.0.1".to_owned(),
            bound => bound.to_owned(),
        }
    }
}

/// The standalone SuperLink's log file, and where its database is ([`crate::flower::diagnose`]).
fn superlink_log(paths: &SuperLinkPaths) -> crate::flower::diagnose::LogSource {
    crate::flower::diagnose::LogSource {
        describe: format!("log file {}", paths.log.display()),
        storage: format!(
            "Its database is {} (under the hub's --state-dir): free space on that filesystem, \
             or move the state directory to a larger one with the hub stopped",
            paths.database.display()
        ),
        reader: std::sync::Arc::new(crate::flower::diagnose::FileLog::new(paths.log.clone())),
    }
}

//! The standalone hub's [`RunHost`]: what [`crate::runs::reconcile`] reads and writes for one
//! run in standalone mode.
use super::*;

/// The standalone hub's side of one run's reconcile: ConfigMaps from the manifests directory,
/// outputs under the state directory, the pending submission in the run's state file.
pub(super) struct StandaloneRunHost<'a> {
    pub(super) manifests: &'a Manifests,
    pub(super) key: &'a RunKey,
    pub(super) fed_key: &'a FedKey,
    pub(super) spec: &'a FlowerRunSpec,
    pub(super) outputs: Option<&'a flower_addon_crds::OutputsSpec>,
    /// `<state>/federations/<ns>/<fed>/outputs`.
    pub(super) outputs_root: PathBuf,
    /// This pass's run list per Federation.
    pub(super) lists: &'a mut BTreeMap<FedKey, SuperLinkState>,
    pub(super) runs: &'a mut StandaloneRuns,
}

impl RunHost for StandaloneRunHost<'_> {
    type Error = std::convert::Infallible;

    async fn config_map(&mut self, name: &str) -> Result<Option<ConfigMap>, Self::Error> {
        Ok(self.manifests.config_map(&self.key.0, name).cloned())
    }

    fn config_map_source(&self) -> ConfigMapSource {
        ConfigMapSource::ManifestsDirectory
    }

    fn fab_urls(&self) -> &FabUrlCache {
        &self.runs.fab_urls
    }

    /// Under the state directory; the root exists, as the volume's mount does in Kubernetes,
    /// in the SuperLink's directory (its confined ServerApps write there); the app makes its
    /// run's directory.
    fn output_dir(&mut self) -> Option<OutputDir> {
        let outputs = self.outputs?;
        let root = &self.outputs_root;
        let made = std::fs::create_dir_all(root).and_then(|()| match root.parent() {
            Some(superlink_dir) => flower_addon_runtime::sandbox::hand_over(root, superlink_dir),
            None => Ok(()),
        });
        if let Err(e) = made {
            tracing::warn!(dir = %root.display(), error = %e, "cannot make the outputs directory");
        }
        Some(OutputDir::new(
            outputs,
            &root.to_string_lossy(),
            &self.key.0,
            &self.key.1,
        ))
    }

    async fn list_runs(&mut self, client: &ControlClient) -> SuperLinkState {
        if let Some(state) = self.lists.get(self.fed_key) {
            return state.clone();
        }
        let state = flower_runs::list(client).await;
        self.lists.insert(self.fed_key.clone(), state.clone());
        state
    }

    fn forget_list(&mut self) {
        self.lists.remove(self.fed_key);
    }

    async fn store_pending(
        &mut self,
        status: &FlowerRunStatus,
        events: Vec<RunEvent>,
    ) -> Result<PendingStored, Self::Error> {
        self.runs.store(
            self.key,
            Stored {
                spec: Some(self.spec.clone()),
                status: status.clone(),
                expired: false,
            },
        );
        crate::runs::log_events(self.key, &events);
        Ok(PendingStored::Yes)
    }

    fn with_followers<T>(&mut self, f: impl FnOnce(&mut LogFollowers<RunKey>) -> T) -> T {
        f(&mut self.runs.followers)
    }

    /// Off the hub's task, reading at most the size limit.
    async fn list_outputs(&mut self) -> Result<Vec<RunOutput>, OutputsFailure> {
        let dir = self.outputs_root.join(&self.key.0).join(&self.key.1);
        let max_bytes = self
            .outputs
            .and_then(|spec| spec.size_limit_bytes())
            .unwrap_or(u64::MAX);
        match tokio::task::spawn_blocking(move || outputs::list_dir(&dir, max_bytes)).await {
            Ok(Ok(files)) => Ok(files),
            Ok(Err(outputs::OutputsError::OverQuota { message })) => {
                Err(OutputsFailure::OverQuota(message))
            }
            Ok(Err(e)) => Err(OutputsFailure::Retry(e.to_string())),
            Err(e) => Err(OutputsFailure::Retry(e.to_string())),
        }
    }

    async fn restart_supernodes(&mut self, after_run: u64) -> Result<bool, Self::Error> {
        Ok(self.runs.restart_supernodes(self.fed_key, after_run))
    }

    fn now(&self) -> Timestamp {
        (self.runs.clock)()
    }
}

//! The Kubernetes Events the runtime records on the objects it applies and prunes.

use kube::runtime::events;

use super::{Kind, KubeRuntime, ObjectKey};

impl KubeRuntime {
    /// Records a Kubernetes Event about the object `key` in the background (best effort: one
    /// that cannot be written is logged at debug level).
    pub(super) fn record(&self, key: &ObjectKey, uid: Option<String>, event: events::Event) {
        let api_version = match key.0 {
            Kind::StatefulSet | Kind::DaemonSet => "apps/v1",
            Kind::Secret | Kind::Service => "v1",
        };
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(api_version.to_owned()),
            kind: Some(key.0.name().to_owned()),
            namespace: Some(key.1.clone()),
            name: Some(key.2.clone()),
            uid,
            ..Default::default()
        };
        let recorder = self.recorder.clone();
        tokio::spawn(async move {
            if let Err(error) = recorder.publish(&event, &reference).await {
                tracing::debug!(%error, "event not recorded");
            }
        });
    }

    pub(super) fn record_pruned(&self, key: &ObjectKey) {
        self.record(
            key,
            None,
            events::Event {
                type_: events::EventType::Normal,
                reason: "Pruned".to_owned(),
                note: Some(format!(
                    "{} {}/{} deleted: no longer in the work from the hub",
                    key.0.name(),
                    key.1,
                    key.2
                )),
                action: "Prune".to_owned(),
                secondary: None,
            },
        );
    }
}

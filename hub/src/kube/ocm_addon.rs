//! The agent as an Open Cluster Management addon (`manifests/ocm/`): a cluster OCM accepted gets
//! the agent by a `ManagedClusterAddOn` `flower-addon`, with no bootstrap token of ours.
//!
//! OCM's klusterlet asks for the agent's certificate with a CSR of signer
//! [`flower_addon_proto::OCM_ADDON_SIGNER`]; flower-hub is that signer ([`run`]):
//!
//! - it checks who asked ([`requested_cluster`]): the CSR's labels name a cluster and the addon,
//!   and the requester is that cluster's klusterlet (the apiserver-set group
//!   `system:open-cluster-management:<cluster>`), so one cluster's klusterlet cannot obtain
//!   another cluster's identity; and that OCM has the cluster accepted and the addon enabled
//!   there ([`admit`]);
//! - it registers the cluster in the addon's own `ManagedCluster` (label
//!   [`REGISTERED_BY_LABEL`]=[`REGISTERED_BY_OCM`], accepted, bound to the CSR's key; the key
//!   of the previous certificate stays trusted, as the klusterlet makes a new key at every
//!   renewal and the agent's pod sees it some time later);
//! - it approves the CSR (if OCM's addon manager has not) and issues the certificate with the
//!   work-channel CA ([`HubCa::sign_ocm_addon_csr`]); a refused CSR is denied (or, once
//!   approved, marked `Failed`) with the reason.
//!
//! OCM's addon manager can sign custom-signer CSRs itself, but it approves every one of them
//! whoever asked and signs only with RSA keys, so the hub does not hand it its CA: the
//! `signingCA` the `AddOnTemplate` API requires names a Secret that does not exist, and the
//! addon manager's attempt fails until the hub has signed.
//!
//! Trust follows OCM ([`sweep`], every [`SWEEP_INTERVAL`]): a registered cluster whose
//! `ManagedClusterAddOn` is gone, or whose OCM `ManagedCluster` is gone or no longer accepted,
//! is deleted from the addon's clusters, which closes its stream, stops its SuperNodes and
//! unregisters their keys, as deleting a cluster of ours does.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use rcgen::{CertificateSigningRequestParams, DnType};

use crate::registration::ca::HubCa;
use crate::registration::store::{ClusterRegistration, ClusterStore, StoreError};

/// OCM's label on an addon CSR naming the cluster (set by the klusterlet; anyone could set it,
/// so it is checked against the requester).
pub const CLUSTER_LABEL: &str = "open-cluster-management.io/cluster-name";
/// OCM's label on an addon CSR naming the addon.
pub const ADDON_LABEL: &str = "open-cluster-management.io/addon-name";
/// Label on the addon's `ManagedCluster`s that the hub registered for an OCM addon agent (value
/// [`REGISTERED_BY_OCM`]); only those follow OCM's clusters and addons.
pub const REGISTERED_BY_LABEL: &str = "flower-addon.io/registered-by";
/// Value of [`REGISTERED_BY_LABEL`].
pub const REGISTERED_BY_OCM: &str = "ocm-addon";
/// How often the registered clusters are checked against OCM.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Group OCM's klusterlet of cluster `<cluster>` is in on the hub (its client certificate's
/// organization, as OCM's registration issues it).
const KLUSTERLET_GROUP_PREFIX: &str = "system:open-cluster-management:";

/// OCM's `ManagedClusterAddOn` (`v1alpha1`).
pub fn addon_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "addon.open-cluster-management.io",
        "v1alpha1",
        "ManagedClusterAddOn",
    ))
}

/// Why the hub refuses an addon CSR or no longer backs an addon cluster: written into the CSR's
/// condition and the log, each naming the field and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The CSR is for another addon.
    #[error(
        "label {ADDON_LABEL} is {addon:?}; the signer {} serves the addon {:?} only",
        flower_addon_proto::OCM_ADDON_SIGNER,
        flower_addon_proto::OCM_ADDON_NAME
    )]
    OtherAddon { addon: Option<String> },
    /// The CSR names no cluster.
    #[error("label {CLUSTER_LABEL} is missing: OCM's klusterlet names its cluster there")]
    NoCluster,
    /// The requester is not that cluster's klusterlet.
    #[error(
        "requested by {requester:?}, who is not the klusterlet of cluster {cluster:?} (not in group {group:?}): a cluster's addon certificate is asked for by that cluster's own klusterlet only"
    )]
    NotItsKlusterlet {
        requester: String,
        cluster: String,
        group: String,
    },
    /// OCM allows the name, a flower-addon cluster cannot have it.
    #[error("OCM cluster {cluster:?} cannot be a flower-addon cluster: {why}")]
    ClusterName { cluster: String, why: String },
    /// `spec.request` is not a PEM certificate request.
    #[error("spec.request is not a PEM certificate request")]
    NotPem,
    /// `spec.request` does not parse as a certificate request.
    #[error("spec.request is not a valid certificate request: {0}")]
    BadRequest(String),
    /// The subject is not the one the hub issues for.
    #[error(
        "the request's subject must be CN={cn} alone (the AddOnTemplate's registration customSigner.subject: {{user: {cn}}}, as in manifests/ocm/addon-template.yaml)",
        cn = flower_addon_proto::OCM_ADDON_AGENT_CN
    )]
    Subject,
    /// OCM has no ManagedCluster of that name.
    #[error("OCM has no ManagedCluster {0:?}: join the cluster to OCM first")]
    NotInOcm(String),
    /// OCM has not accepted the cluster.
    #[error(
        "OCM's ManagedCluster {0:?} is not accepted (spec.hubAcceptsClient): `clusteradm accept --clusters {0}`"
    )]
    NotAccepted(String),
    /// The addon is not enabled on the cluster.
    #[error(
        "the addon is not enabled on {0:?}: create ManagedClusterAddOn {name} in namespace {0} (`clusteradm addon enable --names {name} --clusters {0}`)",
        name = flower_addon_proto::OCM_ADDON_NAME
    )]
    NotEnabled(String),
}

/// The cluster a CSR of the addon's signer asks a certificate for, once it is clear the cluster's
/// own klusterlet asked and asked for what the hub issues; otherwise why not.
pub fn requested_cluster(csr: &CertificateSigningRequest) -> Result<String, Refusal> {
    let labels = csr.labels();
    let addon = labels.get(ADDON_LABEL).map(String::as_str);
    if addon != Some(flower_addon_proto::OCM_ADDON_NAME) {
        return Err(Refusal::OtherAddon {
            addon: addon.map(str::to_owned),
        });
    }
    let Some(cluster) = labels.get(CLUSTER_LABEL).filter(|c| !c.is_empty()) else {
        return Err(Refusal::NoCluster);
    };
    let group = format!("{KLUSTERLET_GROUP_PREFIX}{cluster}");
    let groups = csr.spec.groups.as_deref().unwrap_or_default();
    if !groups.contains(&group) {
        return Err(Refusal::NotItsKlusterlet {
            requester: csr.spec.username.clone().unwrap_or_default(),
            cluster: cluster.clone(),
            group,
        });
    }
    if let Err(status) = crate::channel::registration::validate_cluster_name(cluster) {
        return Err(Refusal::ClusterName {
            cluster: cluster.clone(),
            why: status.message().to_owned(),
        });
    }
    let pem = String::from_utf8(csr.spec.request.0.clone()).map_err(|_| Refusal::NotPem)?;
    let request = CertificateSigningRequestParams::from_pem(&pem)
        .map_err(|e| Refusal::BadRequest(e.to_string()))?;
    let subject = &request.params.distinguished_name;
    let common_name = subject.get(&DnType::CommonName).and_then(dn_text);
    let others = subject
        .iter()
        .filter(|(ty, _)| **ty != DnType::CommonName)
        .count();
    if common_name.as_deref() != Some(flower_addon_proto::OCM_ADDON_AGENT_CN) || others > 0 {
        return Err(Refusal::Subject);
    }
    Ok(cluster.clone())
}

/// The text of a distinguished-name value (Go writes printable or UTF-8 strings).
fn dn_text(value: &rcgen::DnValue) -> Option<String> {
    match value {
        rcgen::DnValue::Utf8String(s) => Some(s.clone()),
        rcgen::DnValue::PrintableString(s) => Some(AsRef::<str>::as_ref(s).to_owned()),
        rcgen::DnValue::Ia5String(s) => Some(AsRef::<str>::as_ref(s).to_owned()),
        _ => None,
    }
}

/// What OCM holds about one cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OcmCluster {
    /// OCM's `ManagedCluster` exists.
    pub exists: bool,
    /// Its `spec.hubAcceptsClient`.
    pub accepted: bool,
    /// Its `ManagedClusterAddOn` `flower-addon` exists and is not being deleted.
    pub addon_enabled: bool,
}

/// Whether OCM lets the addon agent of `cluster` in; otherwise why not.
pub fn admit(cluster: &str, ocm: &OcmCluster) -> Result<(), Refusal> {
    if !ocm.exists {
        return Err(Refusal::NotInOcm(cluster.to_owned()));
    }
    if !ocm.accepted {
        return Err(Refusal::NotAccepted(cluster.to_owned()));
    }
    if !ocm.addon_enabled {
        return Err(Refusal::NotEnabled(cluster.to_owned()));
    }
    Ok(())
}

/// What the hub does with a CSR of the addon's signer.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Already issued, denied or failed: nothing.
    Done,
    /// Judge and sign (approving it first if `approved` is false).
    Judge { approved: bool },
}

fn next(csr: &CertificateSigningRequest) -> Next {
    let status = csr.status.as_ref();
    if status
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
    {
        return Next::Done;
    }
    let conditions = status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let has = |t: &str| {
        conditions
            .iter()
            .any(|c| c.type_ == t && c.status == "True")
    };
    if has("Denied") || has("Failed") {
        return Next::Done;
    }
    Next::Judge {
        approved: has("Approved"),
    }
}

/// Signs the addon's CSRs and keeps the registered clusters in line with OCM until `shutdown`.
/// Returns at once (logging why) when OCM's cluster or addon API is not served.
pub async fn run<S: ClusterStore>(
    client: Client,
    store: Arc<S>,
    ca: Arc<HubCa>,
    cert_validity: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    if !super::ocm::installed(&client).await || !addons_served(&client).await {
        tracing::info!(
            "Open Cluster Management's cluster and addon APIs are not served: the agent cannot be installed as an OCM addon (restart the hub after installing OCM)"
        );
        return;
    }
    tracing::info!(
        signer = flower_addon_proto::OCM_ADDON_SIGNER,
        "signing the CSRs of the OCM addon {:?}",
        flower_addon_proto::OCM_ADDON_NAME
    );
    let registrar = Registrar {
        client: client.clone(),
        store,
        ca,
        cert_validity,
    };
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let config = watcher::Config::default().fields(&format!(
        "spec.signerName={}",
        flower_addon_proto::OCM_ADDON_SIGNER
    ));
    let mut events = std::pin::pin!(watcher(csrs, config));
    let mut sweep = tokio::time::interval(SWEEP_INTERVAL);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = sweep.tick() => {
                if let Err(error) = registrar.sweep().await {
                    tracing::warn!(%error, "checking the OCM addon's clusters against OCM failed; retrying");
                }
            }
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(csr) | watcher::Event::InitApply(csr))) => {
                    registrar.handle(&csr).await;
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => {
                    tracing::warn!(%error, "watching the OCM addon's CSRs failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                None => return,
            }
        }
    }
}

/// Whether OCM's `ManagedClusterAddOn` API is served.
async fn addons_served(client: &Client) -> bool {
    client
        .list_api_group_resources("addon.open-cluster-management.io/v1alpha1")
        .await
        .is_ok_and(|l| l.resources.iter().any(|r| r.name == "managedclusteraddons"))
}

struct Registrar<S> {
    client: Client,
    store: Arc<S>,
    ca: Arc<HubCa>,
    cert_validity: Duration,
}

impl<S: ClusterStore> Registrar<S> {
    async fn handle(&self, csr: &CertificateSigningRequest) {
        let Next::Judge { approved } = next(csr) else {
            return;
        };
        let name = csr.name_any();
        let verdict = match requested_cluster(csr) {
            Ok(cluster) => match self.ocm_cluster(&cluster).await {
                Ok(ocm) => admit(&cluster, &ocm).map(|()| cluster),
                Err(error) => {
                    tracing::warn!(csr = %name, %error, "reading OCM's cluster failed; the CSR waits for the next try");
                    return;
                }
            },
            Err(why) => Err(why),
        };
        let result = match verdict {
            Ok(cluster) => self.sign(csr, &cluster, approved).await,
            Err(why) => {
                tracing::warn!(csr = %name, requester = csr.spec.username.as_deref().unwrap_or_default(), reason = %why, "refused an OCM addon CSR");
                self.refuse(csr, approved, &why.to_string()).await
            }
        };
        if let Err(error) = result {
            tracing::warn!(csr = %name, %error, "handling an OCM addon CSR failed; retried at the next change or relist");
        }
    }

    /// OCM's view of `cluster`, read fresh.
    async fn ocm_cluster(&self, cluster: &str) -> Result<OcmCluster, kube::Error> {
        let clusters: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &super::ocm::cluster_resource());
        let addons: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), cluster, &addon_resource());
        let mc = clusters.get_opt(cluster).await?;
        let addon = addons.get_opt(flower_addon_proto::OCM_ADDON_NAME).await?;
        Ok(OcmCluster {
            exists: mc.is_some(),
            accepted: mc.as_ref().is_some_and(accepted),
            addon_enabled: addon.is_some_and(|a| a.metadata.deletion_timestamp.is_none()),
        })
    }

    async fn sign(
        &self,
        csr: &CertificateSigningRequest,
        cluster: &str,
        approved: bool,
    ) -> Result<(), String> {
        let name = csr.name_any();
        let pem = String::from_utf8_lossy(&csr.spec.request.0).into_owned();
        let issued = self
            .ca
            .sign_ocm_addon_csr(&pem, cluster, self.cert_validity)
            .map_err(|e| format!("signing: {e}"))?;
        if let Err(why) = register(self.store.as_ref(), cluster, &issued.key_fingerprint).await {
            tracing::warn!(csr = %name, %cluster, reason = %why, "refused an OCM addon CSR");
            return self.refuse(csr, approved, &why).await;
        }
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        if !approved {
            let patch = conditions_patch(
                csr,
                "Approved",
                "FlowerHubApproved",
                "the klusterlet of this cluster asked, OCM accepted the cluster and the flower-addon addon is enabled there",
            );
            patch_approval(&api, &name, &patch, "approving").await?;
        }
        let certificate = k8s_openapi::ByteString(issued.cert_pem.into_bytes());
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"certificate": certificate}})),
        )
        .await
        .map_err(|e| format!("writing the certificate: {e}"))?;
        let not_after = issued
            .not_after
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let ca = self.ca.clone();
        self.store
            .update_status(cluster, |st| {
                crate::channel::registration::record_issue(st, &ca, not_after)
            })
            .await
            .map_err(|e| format!("recording the certificate: {e}"))?;
        tracing::info!(csr = %name, %cluster, key = %issued.key_fingerprint, "signed the certificate of an OCM addon agent");
        Ok(())
    }

    async fn refuse(
        &self,
        csr: &CertificateSigningRequest,
        approved: bool,
        why: &str,
    ) -> Result<(), String> {
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        let name = csr.name_any();
        if approved {
            // Approved by OCM's addon manager (it approves every custom-signer CSR): the signer
            // refuses by failing it.
            let patch = conditions_patch(csr, "Failed", "FlowerHubRefused", why);
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| format!("marking the CSR failed: {e}"))?;
        } else {
            let patch = conditions_patch(csr, "Denied", "FlowerHubRefused", why);
            patch_approval(&api, &name, &patch, "denying the CSR").await?;
        }
        Ok(())
    }

    /// Deletes the registered clusters OCM no longer backs.
    async fn sweep(&self) -> Result<(), String> {
        let registered: Vec<String> = match self.store.cached_clusters() {
            Some(all) => all,
            None => self
                .store
                .list_clusters()
                .await
                .map_err(|e| e.to_string())?,
        }
        .into_iter()
        .filter(|r| {
            r.registration
                .labels
                .get(REGISTERED_BY_LABEL)
                .map(String::as_str)
                == Some(REGISTERED_BY_OCM)
        })
        .map(|r| r.registration.name)
        .collect();
        if registered.is_empty() {
            return Ok(());
        }
        let clusters: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &super::ocm::cluster_resource());
        let accepted_clusters: BTreeSet<String> = clusters
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing OCM's ManagedClusters: {e}"))?
            .items
            .iter()
            .filter(|mc| accepted(mc))
            .map(ResourceExt::name_any)
            .collect();
        let addons: Api<DynamicObject> = Api::all_with(self.client.clone(), &addon_resource());
        let enabled: BTreeSet<String> = addons
            .list(&ListParams::default().fields(&format!(
                "metadata.name={}",
                flower_addon_proto::OCM_ADDON_NAME
            )))
            .await
            .map_err(|e| format!("listing OCM's ManagedClusterAddOns: {e}"))?
            .items
            .into_iter()
            .filter(|a| a.metadata.deletion_timestamp.is_none())
            .filter_map(|a| a.metadata.namespace)
            .collect();
        for cluster in registered {
            let ocm = OcmCluster {
                exists: accepted_clusters.contains(&cluster),
                accepted: accepted_clusters.contains(&cluster),
                addon_enabled: enabled.contains(&cluster),
            };
            if let Err(why) = admit(&cluster, &ocm) {
                match self.store.delete_cluster(&cluster).await {
                    Ok(_) => {
                        tracing::info!(%cluster, reason = %why, "OCM no longer backs this addon cluster: deleted it (its SuperNodes stop and their keys are unregistered)")
                    }
                    Err(error) => {
                        tracing::warn!(%cluster, %error, "deleting an addon cluster OCM no longer backs failed; retrying")
                    }
                }
            }
        }
        Ok(())
    }
}

/// The addon's `ManagedCluster` `cluster`, created or re-bound to `key` (the key bound before
/// stays trusted as the previous one).
pub async fn register<S: ClusterStore>(store: &S, cluster: &str, key: &str) -> Result<(), String> {
    let labels = BTreeMap::from([(REGISTERED_BY_LABEL.to_owned(), REGISTERED_BY_OCM.to_owned())]);
    let store_err = |e: StoreError| format!("registering cluster {cluster:?}: {e}");
    match store.get_cluster(cluster).await.map_err(store_err)? {
        None => {
            let registration = ClusterRegistration {
                name: cluster.to_owned(),
                labels,
                claims: BTreeMap::new(),
                key_fingerprint: key.to_owned(),
                previous_key_fingerprint: None,
                agent_version: String::new(),
                token_id: String::new(),
                created_unix: SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            };
            match store.create_cluster(&registration, true).await {
                Ok(()) => Ok(()),
                // Created meanwhile (a second CSR): bind it like an existing one.
                Err(StoreError::AlreadyExists(_)) => Box::pin(register(store, cluster, key)).await,
                Err(e) => Err(store_err(e)),
            }
        }
        Some(record) => {
            if record
                .registration
                .labels
                .get(REGISTERED_BY_LABEL)
                .map(String::as_str)
                != Some(REGISTERED_BY_OCM)
            {
                return Err(format!(
                    "cluster {cluster:?} is registered with the addon's own bootstrap token (its ManagedCluster.flower-addon.io has no label {REGISTERED_BY_LABEL}={REGISTERED_BY_OCM}): delete that ManagedCluster, or disable the OCM addon on {cluster:?}"
                ));
            }
            if record.registration.key_fingerprint == key {
                return Ok(());
            }
            let mut registration = record.registration;
            registration.previous_key_fingerprint = Some(std::mem::replace(
                &mut registration.key_fingerprint,
                key.to_owned(),
            ));
            // Acceptance is left as it is: a cluster the hub's admin revoked
            // (`flower-hub revoke`) stays revoked through the klusterlet's renewals.
            store
                .update_registration(&registration)
                .await
                .map_err(store_err)
        }
    }
}

/// Merge-patches the `approval` subresource of CSR `name` (`what` names the step in errors).
async fn patch_approval(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    patch: &serde_json::Value,
    what: &str,
) -> Result<(), String> {
    api.patch_subresource(
        "approval",
        name,
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("{what}: {e}"))
}

/// Whether OCM's `ManagedCluster` has `spec.hubAcceptsClient: true`.
fn accepted(mc: &DynamicObject) -> bool {
    mc.data["spec"]["hubAcceptsClient"].as_bool() == Some(true)
}

/// A merge patch of `status.conditions`: the CSR's own plus `type_` (True) with `reason` and
/// `message`.
fn conditions_patch(
    csr: &CertificateSigningRequest,
    type_: &str,
    reason: &str,
    message: &str,
) -> serde_json::Value {
    let mut conditions: Vec<serde_json::Value> = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    conditions.push(serde_json::json!({
        "type": type_,
        "status": "True",
        "reason": reason,
        "message": message,
    }));
    serde_json::json!({"status": {"conditions": conditions}})
}

#[cfg(test)]
mod tests;

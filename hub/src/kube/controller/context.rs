//! What every Federation reconcile shares: clients, caches, settings and the statuses
//! last written.
use super::*;

/// What every reconcile shares.
pub struct Context {
    /// Client of the hub cluster.
    pub client: Client,
    /// CA issuing SuperLink certificates.
    pub ca: Arc<HubCa>,
    /// Event recorder (reporting controller [`HUB_FIELD_MANAGER`]).
    pub recorder: Recorder,
    /// Node address, certificate validity and names ([`Settings`]).
    pub settings: Settings,
    /// What the controller reads instead of asking the apiserver.
    pub caches: Caches,
    /// The status last written per Federation (by uid), with the resourceVersion it was computed
    /// from ([`write_status`]).
    pub(super) written: std::sync::Mutex<HashMap<String, (Option<String>, FederationStatus)>>,
    /// Where each Federation's Control API is, to ask for runs in progress before a renewal.
    pub control: crate::kube::controller::runs::EndpointOf,
    /// SuperLink certificate renewals waiting for runs in progress.
    pub renewals: crate::flower::renewal::RenewalHolds,
}

/// Event reason: a SuperLink certificate due for renewal waits for the runs in progress.
pub const RENEWAL_WAITS: &str = "CertificateRenewalWaits";

/// Beyond this many remembered statuses the memory is cleared (it only saves no-op writes).
pub(super) const WRITTEN_MAX: usize = 10_000;

impl Context {
    /// A context for `client`, `ca` and `caches`.
    pub fn new(client: Client, ca: Arc<HubCa>, caches: Caches) -> Self {
        let recorder = apply::recorder(client.clone());
        let forward = crate::kube::control::port_forward(client.clone());
        let flower_ca = ca.clone();
        Self {
            client,
            ca,
            recorder,
            settings: Settings::default(),
            caches,
            written: Default::default(),
            control: Arc::new(move |fed| {
                crate::kube::control::in_cluster_endpoint(fed, &flower_ca, &forward)
            }),
            renewals: Default::default(),
        }
    }

    pub(super) async fn publish(
        &self,
        fed: &Federation,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        apply::publish(&self.recorder, fed, type_, "Reconcile", reason, note).await;
    }

    /// Whether the certificate of `fed`, due by age, waits for the runs in progress on its
    /// SuperLink (the rule of both modes: [`crate::flower::renewal`]), and when to decide again;
    /// an event says so when it starts waiting and when it stops.
    pub(super) async fn renewal_waits(
        &self,
        fed: &Federation,
        not_before: std::time::SystemTime,
        not_after: std::time::SystemTime,
    ) -> Option<Duration> {
        use crate::flower::renewal::Renewal;
        let key = (fed.namespace().unwrap_or_default(), fed.name_any());
        let decision = self
            .renewals
            .decide(
                &key,
                (self.control)(fed),
                not_before,
                not_after,
                self.settings.superlink_cert_validity,
            )
            .await;
        match decision {
            Renewal::Wait {
                runs,
                until,
                recheck,
                first,
            } => {
                if first {
                    let message = Renewal::waiting_message(&runs, until);
                    tracing::info!(namespace = %key.0, federation = %key.1, "{message}");
                    self.publish(fed, EventType::Normal, RENEWAL_WAITS, message)
                        .await;
                }
                Some(recheck)
            }
            Renewal::Now {
                waited_for: Some(runs),
            } => {
                tracing::info!(namespace = %key.0, federation = %key.1, ?runs, "SuperLink certificate renewal no longer waits (the runs ended, or its deadline came): renewing it");
                None
            }
            Renewal::Now { waited_for: None } => None,
        }
    }
}

/// How the Federation controller issues SuperLink certificates and reaches the hub's nodes.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Address of the hub cluster's nodes that spokes reach (`serve --node-address`), for the
    /// Fleet address of NodePort Federations without `externalAddress`.
    pub node_address: Option<String>,
    /// Validity of the SuperLink certificates the hub issues (renewed at 80 %).
    pub superlink_cert_validity: Duration,
    /// Names a Federation may ask for in its SuperLink certificate ([`crate::core::sans`]).
    pub superlink_names: SuperLinkNames,
    /// What the pods the hub makes in its cluster may do ([`crate::core::problems`]).
    pub pod_policy: flower_addon_crds::policy::PodPolicy,
    /// Where FlowerRuns' FAB URLs may be downloaded from.
    pub fab_egress: crate::flower::fab_url::Egress,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            node_address: None,
            superlink_cert_validity: crate::core::renewal::DEFAULT_SUPERLINK_CERT_VALIDITY,
            superlink_names: SuperLinkNames::default(),
            pod_policy: flower_addon_crds::policy::PodPolicy::new(
                flower_addon_crds::policy::Admin::Hub,
            ),
            fab_egress: crate::flower::fab_url::Egress::default(),
        }
    }
}

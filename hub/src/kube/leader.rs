//! Leader election on a `coordination.k8s.io/v1` Lease, client-go's algorithm: the holder renews
//! the Lease every retry period; another replica takes it once it has seen the same record for a
//! whole lease duration (by its own clock, so clock skew between nodes does not matter), or at
//! once when the holder released it on a graceful stop. Writes are optimistic (`replace` with the
//! resourceVersion read), so of two replicas racing for a free Lease exactly one wins.
//!
//! Only the leader runs the controllers and serves the work channel; a standby waits, serving
//! `/healthz` but failing `/readyz`, so the hub Service sends agents only to the leader. A leader
//! that cannot renew within the renew deadline stops (the kubelet restarts it as a standby), as
//! controller-runtime does.
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Timings and names of the election.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// The Lease's namespace (the hub's own).
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// Who this replica is (the pod name, else host name and a random suffix).
    pub identity: String,
    /// How long a standby waits after the holder's last renewal before taking over.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up and stops.
    pub renew_deadline: Duration,
    /// How often the leader renews and a standby tries.
    pub retry_period: Duration,
}

impl LeaderConfig {
    /// Checks client-go's rule: lease duration > renew deadline > retry period × 1.2; the error
    /// names the flags.
    pub fn validate(&self) -> Result<(), String> {
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "--leader-elect-lease-duration ({:?}) must be longer than --leader-elect-renew-deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline.as_secs_f64() <= self.retry_period.as_secs_f64() * 1.2 {
            return Err(format!(
                "--leader-elect-renew-deadline ({:?}) must be longer than 1.2 × --leader-elect-retry-period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration.as_secs() < 1 {
            return Err("--leader-elect-lease-duration must be at least 1s".into());
        }
        Ok(())
    }
}

/// Why the leader stopped leading.
#[derive(Debug, thiserror::Error)]
#[error("lost the leader Lease {namespace}/{name}: {why}")]
pub struct LeadershipLost {
    namespace: String,
    name: String,
    why: String,
}

/// The record a replica last saw and when (its own clock).
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    holder: String,
    renew_time: Option<MicroTime>,
    duration: Duration,
}

/// One replica's side of the election.
pub struct Elector {
    api: Api<Lease>,
    config: LeaderConfig,
    observed: Mutex<Option<(Observed, Instant)>>,
    /// The Lease as this replica last wrote it while holding it, and when: the next renewal
    /// replaces it at that resourceVersion without reading it first (client-go's fast path); a
    /// conflict means someone else wrote, and the slow path reads it.
    written: Mutex<Option<(Lease, Instant)>>,
}

impl Elector {
    /// An elector for `config` on `client`.
    pub fn new(client: kube::Client, config: LeaderConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: Mutex::new(None),
            written: Mutex::new(None),
        }
    }

    /// The settings.
    pub fn config(&self) -> &LeaderConfig {
        &self.config
    }

    /// Tries until this replica holds the Lease (returns `true`) or `stop` resolves (`false`).
    pub async fn acquire(&self, stop: impl std::future::Future<Output = ()>) -> bool {
        tokio::pin!(stop);
        let mut logged = false;
        loop {
            // A request to an apiserver whose storage is down hangs until its own timeout: a
            // standby stopped meanwhile (its pod deleted) exits at once, not after it.
            let tried = tokio::select! {
                () = &mut stop => return false,
                tried = self.try_acquire_or_renew() => tried,
            };
            match tried {
                Ok(true) => return true,
                Ok(false) => {
                    if !logged {
                        tracing::info!(
                            lease = %self.config.name,
                            holder = %self.holder(),
                            "another replica leads; standing by"
                        );
                        logged = true;
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot read or take the leader Lease"),
            }
            tokio::select! {
                () = &mut stop => return false,
                () = tokio::time::sleep(jittered(self.config.retry_period)) => {}
            }
        }
    }

    /// Renews the Lease every retry period; returns when a renewal did not succeed within the
    /// renew deadline, or another replica took the Lease.
    pub async fn hold(&self) -> LeadershipLost {
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            // A renewal counts only if it is answered before the deadline: an apiserver whose
            // etcd is down holds the request for up to a minute, and a leader waiting on it
            // would go on leading past its Lease (client-go bounds it the same way).
            let left = self
                .config
                .renew_deadline
                .saturating_sub(last_renewed.elapsed());
            let Ok(renewed) = tokio::time::timeout(left, self.try_acquire_or_renew()).await else {
                return self.lost(format!(
                    "not renewed within the renew deadline ({:?}): the apiserver did not answer",
                    self.config.renew_deadline
                ));
            };
            match renewed {
                Ok(true) => last_renewed = Instant::now(),
                Ok(false) => return self.lost(format!("{} holds it now", self.holder())),
                Err(error) => {
                    tracing::warn!(%error, "cannot renew the leader Lease");
                    if last_renewed.elapsed() >= self.config.renew_deadline {
                        return self.lost(format!(
                            "not renewed within the renew deadline ({:?}): {error}",
                            self.config.renew_deadline
                        ));
                    }
                }
            }
        }
    }

    /// Gives the Lease up (holder cleared), so a standby takes over at its next try instead of
    /// after a lease duration. Only when this replica still holds it.
    pub async fn release(&self) {
        if let Ok(mut written) = self.written.lock() {
            *written = None;
        }
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now());
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.config.name, "leader Lease released"),
            Err(error) => tracing::warn!(%error, "cannot release the leader Lease"),
        }
    }

    fn lost(&self, why: String) -> LeadershipLost {
        LeadershipLost {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            why,
        }
    }

    fn holder(&self) -> String {
        self.observed
            .lock()
            .ok()
            .and_then(|o| o.as_ref().map(|(r, _)| r.holder.clone()))
            .unwrap_or_default()
    }

    /// The fast path of a renewal: while this replica's last write is younger than the lease
    /// duration, replace that very Lease (its resourceVersion) with a new renew time: one
    /// request. `None` when it does not apply or did not succeed (the slow path decides).
    async fn renew_written(&self) -> Option<bool> {
        let (mut lease, at) = self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()?;
        if at.elapsed() >= self.config.lease_duration {
            return None;
        }
        lease.spec.get_or_insert_with(LeaseSpec::default).renew_time = Some(now());
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.remember(written);
                Some(true)
            }
            Err(error) => {
                tracing::debug!(%error, "leader Lease changed since this replica wrote it; reading it");
                None
            }
        }
    }

    /// Records the Lease this replica just wrote as its holder.
    fn remember(&self, written: Lease) {
        let renew_time = written.spec.as_ref().and_then(|s| s.renew_time.clone());
        if let Ok(mut observed) = self.observed.lock() {
            *observed = Some((
                Observed {
                    holder: self.config.identity.clone(),
                    renew_time,
                    duration: self.config.lease_duration,
                },
                Instant::now(),
            ));
        }
        if let Ok(mut last) = self.written.lock() {
            *last = Some((written, Instant::now()));
        }
    }

    /// One round: `Ok(true)` when this replica holds the Lease after it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        if let Some(held) = self.renew_written().await {
            return Ok(held);
        }
        let name = &self.config.name;
        let me = &self.config.identity;
        let duration = i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(written) => {
                    tracing::info!(lease = %name, identity = %me, "became the leader (new Lease)");
                    self.remember(written);
                    Ok(true)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(error) => Err(error),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let record = Observed {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            renew_time: spec.renew_time.clone(),
            duration: Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(duration)).unwrap_or(0),
            ),
        };
        let seen_since = {
            let mut observed = self
                .observed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match observed.as_ref() {
                Some((last, at)) if *last == record => *at,
                _ => {
                    let at = Instant::now();
                    *observed = Some((record.clone(), at));
                    at
                }
            }
        };
        let mine = record.holder == *me;
        let free = record.holder.is_empty() || seen_since.elapsed() >= record.duration;
        if !mine && !free {
            return Ok(false);
        }
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if !mine {
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(me.clone());
        spec.lease_duration_seconds = Some(duration);
        spec.renew_time = Some(now());
        match self.api.replace(name, &PostParams::default(), &lease).await {
            Ok(written) => {
                if !mine {
                    tracing::info!(lease = %name, identity = %me, previous = %record.holder, "became the leader");
                }
                self.remember(written);
                Ok(true)
            }
            // Someone else wrote first (renewed, or won the race for a free Lease).
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }
}

/// This replica's identity: `POD_NAME` (the Deployment sets it), else the host name with a
/// random suffix (two processes on one host differ).
pub fn identity() -> String {
    if let Ok(pod) = std::env::var("POD_NAME")
        && !pod.is_empty()
    {
        return pod;
    }
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "flower-hub".into());
    format!("{host}_{:08x}", rand::random::<u32>())
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// `period` plus up to 20 % (client-go's jitter), so standbys do not try in lockstep.
fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 + rand::random::<f64>() * 0.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(lease: u64, renew: u64, retry: u64) -> LeaderConfig {
        LeaderConfig {
            namespace: "ns".into(),
            name: "flower-hub".into(),
            identity: "a".into(),
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_secs(retry),
        }
    }

    #[tokio::test]
    async fn a_renewal_the_apiserver_does_not_answer_loses_leadership_at_the_deadline() {
        // The apiserver answers the first renewal and then holds every request (its etcd is
        // down): the leader must stop at its renew deadline, not when the request gives up.
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = answered.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let count = count.clone();
            async move {
                if count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
                    std::future::pending::<()>().await;
                }
                let lease = serde_json::json!({
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": "flower-hub", "namespace": "ns", "resourceVersion": "1"},
                    "spec": {"holderIdentity": "a", "leaseDurationSeconds": 3},
                });
                let _ = req;
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(200)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(
                            serde_json::to_vec(&lease).expect("json"),
                        ))
                        .expect("response"),
                )
            }
        });
        let client = kube::Client::new(service, "ns");
        let mut config = config(3, 2, 1);
        config.lease_duration = Duration::from_millis(2500);
        config.renew_deadline = Duration::from_millis(1500);
        config.retry_period = Duration::from_millis(500);
        let elector = Elector::new(client, config);
        let started = Instant::now();
        let lost = tokio::time::timeout(Duration::from_secs(10), elector.hold())
            .await
            .expect("hold returns while the apiserver holds the renewal");
        let took = started.elapsed();
        assert!(
            lost.why.contains("renew deadline") && lost.why.contains("did not answer"),
            "{}",
            lost.why
        );
        assert!(
            took < Duration::from_millis(2500),
            "leadership lost after {took:?}: past the lease (2.5 s)"
        );
        assert!(answered.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    }

    #[tokio::test]
    async fn a_standby_stops_while_the_apiserver_holds_its_request() {
        // Invariant: a standby asked to stop returns at once even while its try of the Lease is
        // unanswered (etcd down: the apiserver holds requests until its own timeout); without
        // that a deleted standby pod would wait out its grace period.
        let service = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
            std::future::pending::<()>().await;
            Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::empty()))
        });
        let elector = Elector::new(kube::Client::new(service, "ns"), config(10, 7, 2));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let acquiring = tokio::spawn(async move {
            elector
                .acquire(async {
                    let _ = stopped.await;
                })
                .await
        });
        tokio::task::yield_now().await;
        stop.send(()).expect("acquire is waiting");
        let acquired = tokio::time::timeout(Duration::from_secs(60), acquiring)
            .await
            .expect("acquire returned after the stop, with its request still unanswered")
            .expect("acquire task");
        assert!(!acquired, "acquire reported the Lease taken");
    }

    #[test]
    fn timings_follow_client_go_rules() {
        // Invariant: lease > renew deadline > 1.2 × retry, and the error names the flags.
        assert!(config(10, 7, 2).validate().is_ok());
        let error = config(7, 7, 2).validate().expect_err("lease = renew");
        assert!(error.contains("--leader-elect-lease-duration"), "{error}");
        let error = config(10, 2, 2).validate().expect_err("renew = retry");
        assert!(error.contains("--leader-elect-retry-period"), "{error}");
    }
}

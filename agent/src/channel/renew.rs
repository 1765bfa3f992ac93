//! The agent's client certificate: reloaded when its files change, renewed before it expires.
use super::*;

/// Hex SHA-256 of a CA bundle's PEM text (what the hub's `Ping` carries).
pub(super) fn bundle_sha256(pem: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(pem.as_bytes()))
}

/// Takes the pair OCM's klusterlet keeps in `dir` if it changed (logged; a pair that cannot be
/// read leaves the one in use).
pub(super) fn reload_pair(state: &State, dir: &std::path::Path) {
    let name = state.credentials().config.cluster_name;
    match crate::ocm_addon::read_pair(dir) {
        Ok(Some((cert_pem, key_pem))) => {
            let Ok(mut creds) = state.credentials.lock() else {
                return;
            };
            if creds.cert_pem == cert_pem && creds.key_pem == key_pem {
                return;
            }
            match crate::ocm_addon::cluster_of(&cert_pem) {
                Ok(cluster) if cluster == creds.config.cluster_name => {
                    creds.cert_pem = cert_pem;
                    creds.key_pem = key_pem;
                    drop(creds);
                    let not_after =
                        crate::credentials::cert_validity(&state.credentials().cert_pem)
                            .map(|(_, end)| end)
                            .unwrap_or(SystemTime::UNIX_EPOCH);
                    tracing::info!(cluster = %name, ?not_after, "took the certificate OCM's klusterlet renewed; used from the next connection");
                    state.emit(AgentEvent::Renewed { not_after });
                }
                Ok(other) => {
                    tracing::error!(cluster = %name, other = %other, "the certificate in {} names another cluster; keeping the one in use", dir.display())
                }
                Err(error) => {
                    tracing::warn!(cluster = %name, %error, "the certificate in {} is not usable; keeping the one in use", dir.display())
                }
            }
        }
        Ok(None) => {}
        Err(error) => {
            tracing::warn!(cluster = %name, %error, "cannot read the addon's certificate; keeping the one in use")
        }
    }
}

/// [`reload_pair`] every [`crate::ocm_addon::RELOAD_INTERVAL`].
pub(super) async fn reload_loop(state: Arc<State>, dir: PathBuf) {
    loop {
        tokio::time::sleep(crate::ocm_addon::RELOAD_INTERVAL).await;
        reload_pair(&state, &dir);
    }
}

/// Renews the client certificate at `renew_at` of its life, or when `renew_now` is notified (the
/// hub's CA bundle changed), over `channel` (the stream's own connection), retrying every minute
/// (or sooner near expiry) on failure.
pub(super) async fn renew_loop(
    state: Arc<State>,
    channel: Channel,
    renew_now: Arc<tokio::sync::Notify>,
) {
    loop {
        let creds = state.credentials();
        let name = creds.config.cluster_name.clone();
        let (not_before, not_after) = match creds.cert_validity() {
            Ok(v) => v,
            Err(error) => {
                tracing::error!(cluster = %name, %error, "cannot read the client certificate; not renewing");
                return;
            }
        };
        let life = not_after.duration_since(not_before).unwrap_or_default();
        let renew_time = not_before + life.mul_f64(state.options.renew_at.clamp(0.0, 1.0));
        // At least a second between renewals, so a clock problem cannot turn into a hot loop.
        let wait = renew_time
            .duration_since(SystemTime::now())
            .unwrap_or_default()
            .max(Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = renew_now.notified() => {}
        }
        match renew_once(&state, &creds, channel.clone()).await {
            Ok(not_after) => {
                tracing::info!(cluster = %name, ?not_after, "client certificate renewed");
                state.emit(AgentEvent::Renewed { not_after });
            }
            Err(error) => {
                let left = not_after
                    .duration_since(SystemTime::now())
                    .unwrap_or_default();
                let retry = (left / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
                tracing::warn!(cluster = %name, %error, ?retry, "certificate renewal failed; retrying");
                tokio::time::sleep(retry).await;
            }
        }
    }
}

pub(super) async fn renew_once(
    state: &State,
    creds: &Credentials,
    channel: Channel,
) -> Result<SystemTime, String> {
    let key = rcgen::KeyPair::from_pem(&creds.key_pem).map_err(|e| e.to_string())?;
    let csr_pem =
        credentials::make_csr(&key, &creds.config.cluster_name).map_err(|e| e.to_string())?;
    let mut request = tonic::Request::new(RenewRequest { csr_pem });
    request.set_timeout(Duration::from_secs(15));
    let response = RegistrationClient::new(channel)
        .renew(request)
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    let (_, not_after) =
        credentials::cert_validity(&response.client_cert_pem).map_err(|e| e.to_string())?;
    let mut renewed = state.credentials();
    // The new bundle must hold a CA trusted already (it came over a connection verified against
    // one); a CA beside it is the hub rotating its CA.
    tls::check_ca_bundle(
        &response.ca_bundle_pem,
        &tls::bundle_hashes(&renewed.ca_pem),
    )?;
    renewed.cert_pem = response.client_cert_pem;
    renewed.ca_pem = response.ca_bundle_pem;
    // Stored before it is used: a restart never comes back with an older certificate than the
    // one in use.
    if let Some(store) = &state.options.store {
        store
            .save_renewed(&renewed)
            .await
            .map_err(|e| e.to_string())?;
    }
    *state
        .credentials
        .lock()
        .map_err(|_| "poisoned lock".to_string())? = renewed;
    Ok(not_after)
}

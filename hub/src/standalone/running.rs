//! The SuperLink processes of the standalone hub: their certificates (issued, renewed), their
//! start, restart on an argument or certificate change, and stop, and the Fleet front that keeps
//! the Control API on loopback. What they run with comes from [`crate::core::superlink`].
use super::superlink::SuperLinkPaths;
use super::{StandaloneHub, fed_key};
use crate::core::superlink::{
    fleet_listen_address, serverapp_superexec_argv, superlink_argv, superlink_sans,
};
use crate::registration::store::ClusterStore;
use flower_addon_agent::supervise::{ProcessSpec, Supervised};
use flower_addon_crds::Federation;
use flower_addon_crds::render::{FlowerDialect, FlowerVersion};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A SuperLink process the hub runs, and what it was started with.
pub(super) struct RunningSuperLink {
    pub(super) argv: Vec<String>,
    /// The certificate it serves (its validity, `""` without TLS): a renewed one restarts it.
    pub(super) certificate: String,
    pub(super) superlink: Supervised,
    pub(super) superexec: Option<Supervised>,
    /// Where it takes SuperNodes' requests ([`fleet_listen_address`]), when it started, and
    /// whether it has accepted a connection there since: until then (at most
    /// [`LISTEN_HOLD`]) the work of its Federation is held back ([`super::hold`]).
    pub(super) fleet: (String, u16),
    pub(super) started: std::time::Instant,
    pub(super) listening: bool,
    /// The Fleet front task (unified dialect, Control kept on loopback) and its stop signal.
    pub(super) front: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    )>,
}

/// How long a started SuperLink's work is held back at most while it does not listen yet (a
/// SuperLink that never comes up must not freeze its clusters' work for ever).
pub(super) const LISTEN_HOLD: Duration = Duration::from_secs(30);

/// How long a probe of a loopback port may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

impl RunningSuperLink {
    /// Whether its Federation's work is held back: started, not listening yet (probed now, a
    /// loopback connect that is accepted or refused at once), for less than [`LISTEN_HOLD`].
    pub(super) async fn holding(&mut self) -> bool {
        if self.listening || self.started.elapsed() >= LISTEN_HOLD {
            return false;
        }
        let (host, port) = (self.fleet.0.as_str(), self.fleet.1);
        let accepted =
            tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect((host, port)))
                .await
                .is_ok_and(|c| c.is_ok());
        if accepted {
            self.listening = true;
            tracing::debug!(%host, port, after_ms = self.started.elapsed().as_millis() as u64, "the SuperLink listens");
        }
        !accepted
    }
}

impl<S: ClusterStore> StandaloneHub<S> {
    pub(super) fn flower_program(&self, name: &str) -> PathBuf {
        match &self.config.flower_bin {
            Some(dir) => dir.join(name),
            None => PathBuf::from(name),
        }
    }

    /// The state directory hidden from a SuperLink but for its own directory: code run through its
    /// Control API must not read the CA keys, tokens or other Federations.
    fn sandbox(&self, paths: &SuperLinkPaths) -> Option<flower_addon_agent::sandbox::Sandbox> {
        self.config
            .sandbox
            .then(|| flower_addon_agent::sandbox::Sandbox {
                hide: self.config.state_dir.clone(),
                keep: paths.dir.clone(),
            })
    }

    pub(super) fn flower_env(&self) -> BTreeMap<String, String> {
        flower_addon_agent::supervise::flower_env(self.config.flower_bin.as_deref())
    }

    /// Issues the SuperLink certificate when there is none, its names or CA changed, or it is
    /// due ([`crate::core::renewal`]); returns its validity (`not_before..not_after`, Unix
    /// seconds), which [`Self::ensure_superlink`] restarts the SuperLink on when it changes.
    pub(super) fn ensure_superlink_tls(
        &self,
        fed: &Federation,
        paths: &SuperLinkPaths,
    ) -> Result<String, String> {
        let sans = superlink_sans(fed, self.config.advertise.iter().cloned());
        let sans_file = paths.dir.join("tls/sans");
        let want = sans.join("\n");
        let current = std::fs::read_to_string(&sans_file).ok();
        // Re-issued when the SANs or the signing CA changed (a hub upgraded to separate CAs
        // re-issues certificates its channel CA signed; a promoted rotation, those the old CA
        // signed). The CA file's first certificate is the signer of the certificate in force.
        let ca_file = std::fs::read_to_string(&paths.ca).ok();
        let same_ca = ca_file
            .as_deref()
            .is_some_and(|pem| first_certificate(pem) == first_certificate(self.ca.cert_pem()));
        let validity = self.config.superlink_cert_validity;
        let in_force = std::fs::read_to_string(&paths.cert)
            .ok()
            .and_then(|pem| certificate_validity(&pem));
        if let Some((not_before, not_after)) = in_force
            && current.as_deref() == Some(want.as_str())
            && same_ca
            && paths.key.exists()
            && !crate::core::renewal::needs_renewal(
                not_before,
                not_after,
                validity,
                std::time::SystemTime::now(),
            )
        {
            // A staged or retired rotation changes what to trust, not the certificate.
            if ca_file.as_deref() != Some(self.ca.bundle_pem()) {
                write_file(&paths.ca, self.ca.bundle_pem().as_bytes())?;
            }
            return Ok(validity_marker(not_before, not_after));
        }
        let issued = self
            .ca
            .issue_superlink_cert(&fed_key(fed).1, &sans, validity)
            .map_err(|e| format!("cannot issue the SuperLink certificate: {e}"))?;
        write_private(&paths.key, issued.key_pem.as_bytes())?;
        write_file(&paths.cert, issued.cert_pem.as_bytes())?;
        write_file(&paths.ca, self.ca.bundle_pem().as_bytes())?;
        write_file(&sans_file, want.as_bytes())?;
        tracing::info!(federation = %fed_key(fed).1, sans = %sans.join(","), "issued the SuperLink certificate");
        let (not_before, not_after) = certificate_validity(&issued.cert_pem)
            .ok_or("the issued SuperLink certificate does not parse")?;
        Ok(validity_marker(not_before, not_after))
    }

    pub(super) async fn ensure_superlink(
        &mut self,
        fed: &Federation,
        version: FlowerVersion,
        dialect: FlowerDialect,
        paths: &SuperLinkPaths,
        certificate: String,
    ) -> Result<(), String> {
        let key = fed_key(fed);
        let layout = paths.layout(fed, dialect, &self.config.superlink_host);
        let argv = superlink_argv(fed, version, dialect, &layout);
        if let Some(running) = self.superlinks.get(&key)
            && running.argv == argv
            && running.certificate == certificate
        {
            return Ok(());
        }
        if let Some(old) = self.superlinks.remove(&key) {
            if old.argv == argv {
                tracing::info!(federation = %key.1, "SuperLink certificate renewed: restarting it");
            } else {
                tracing::info!(federation = %key.1, "SuperLink arguments changed: restarting it");
            }
            stop_superlink(old).await;
        }
        std::fs::create_dir_all(&paths.dir).map_err(|e| format!("{}: {e}", paths.dir.display()))?;
        let front = if layout.ports.front {
            Some(start_front(fed, &layout, paths).await?)
        } else {
            None
        };
        let superlink = Supervised::start(ProcessSpec {
            name: format!("superlink/{}/{}", key.0, key.1),
            program: self.flower_program("flower-superlink"),
            args: argv.clone(),
            env: {
                // Flower installs FABs under FLWR_HOME: one per SuperLink.
                let mut env = self.flower_env();
                env.insert(
                    "FLWR_HOME".into(),
                    paths.dir.join("superlink-home").display().to_string(),
                );
                env
            },
            cwd: Some(paths.dir.clone()),
            log_file: paths.log.clone(),
            sandbox: self.sandbox(paths),
        });
        let superexec = (fed.spec.isolation_mode == flower_addon_crds::IsolationMode::Process)
            .then(|| {
                Supervised::start(ProcessSpec {
                    name: format!("superexec-serverapp/{}/{}", key.0, key.1),
                    program: self.flower_program("flower-superexec"),
                    args: serverapp_superexec_argv(fed, version, dialect, &layout),
                    env: self.flower_env(),
                    cwd: Some(paths.dir.clone()),
                    log_file: paths.log.with_extension("superexec.log"),
                    sandbox: self.sandbox(paths),
                })
            });
        tracing::info!(namespace = %key.0, federation = %key.1, "started the SuperLink");
        self.superlinks.insert(
            key,
            RunningSuperLink {
                argv,
                certificate,
                superlink,
                superexec,
                fleet: fleet_listen_address(dialect, &layout),
                started: std::time::Instant::now(),
                listening: false,
                front,
            },
        );
        Ok(())
    }
}

pub(super) async fn stop_superlink(sl: RunningSuperLink) {
    if let Some((stop, task)) = sl.front {
        let _ = stop.send(());
        let _ = task.await;
    }
    if let Some(se) = sl.superexec {
        se.stop().await;
    }
    sl.superlink.stop().await;
}

/// Starts the Fleet front of a unified-dialect SuperLink whose Control API stays on loopback:
/// it listens where SuperNodes dial (`bind_host`, the Fleet port) with the SuperLink's
/// certificate and passes only Fleet requests to the SuperLink on `127.0.0.1`.
async fn start_front(
    fed: &Federation,
    layout: &crate::core::superlink::SuperLinkLayout,
    paths: &SuperLinkPaths,
) -> Result<
    (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ),
    String,
> {
    use crate::flower::front::{FrontConfig, FrontTls};
    let tls = if fed.spec.insecure {
        None
    } else {
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))
        };
        Some(
            FrontTls::from_pem(
                &read(&paths.ca)?,
                &read(&paths.cert)?,
                &read(&paths.key)?,
                "127.0.0.1",
            )
            .map_err(|e| e.to_string())?,
        )
    };
    let listen = (layout.bind_host.as_str(), layout.ports.fleet);
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        format!(
            "spec.superlink.service.ports.grpc: cannot listen on {}:{} for SuperNodes (the Fleet front): {e}",
            listen.0, listen.1
        )
    })?;
    let config = FrontConfig {
        upstream: format!("127.0.0.1:{}", layout.ports.control),
        tls,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(crate::flower::front::serve(listener, config, async {
        let _ = stopped.await;
    }));
    tracing::info!(federation = %fed_key(fed).1, fleet = %format!("{}:{}", listen.0, listen.1), control = %format!("127.0.0.1:{}", layout.ports.control), "Fleet front started: the Control API stays on loopback");
    Ok((stop, task))
}

/// The validity of a PEM certificate.
fn certificate_validity(pem: &str) -> Option<(std::time::SystemTime, std::time::SystemTime)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let at = |t: x509_parser::time::ASN1Time| {
        let secs = u64::try_from(t.timestamp()).ok()?;
        Some(std::time::UNIX_EPOCH + Duration::from_secs(secs))
    };
    Some((
        at(cert.validity().not_before)?,
        at(cert.validity().not_after)?,
    ))
}

/// `not_before..not_after` in Unix seconds.
fn validity_marker(not_before: std::time::SystemTime, not_after: std::time::SystemTime) -> String {
    let secs = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    format!("{}..{}", secs(not_before), secs(not_after))
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), String> {
    flower_addon_agent::files::write_atomic(path, bytes, flower_addon_agent::files::PUBLIC)
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    flower_addon_agent::files::write_atomic(path, bytes, flower_addon_agent::files::PRIVATE)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The DER of the first certificate of a PEM bundle.
fn first_certificate(pem: &str) -> Option<Vec<u8>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()?
        .ok()
        .map(|c| c.to_vec())
}

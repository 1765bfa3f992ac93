//! The SuperLink processes of the standalone hub: their certificates (issued, renewed), their
//! start, restart on an argument or certificate change, and stop, and the Fleet front that keeps
//! the Control API on loopback. What they run with comes from [`crate::core::superlink`].
use super::superlink::SuperLinkPaths;
use super::{FedKey, StandaloneHub, fed_key};
use crate::core::superlink::{
    SuperLinkLayout, serverapp_superexec_argv, superlink_argv, superlink_sans,
};
use crate::registration::ca::CaError;
use crate::registration::store::ClusterStore;
use flower_addon_crds::Federation;
use flower_addon_crds::render::{FlowerDialect, FlowerVersion};
use flower_addon_runtime::supervise::{ProcessSpec, Supervised};
use sockets::{Sockets, bridged, fleet_listening};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod sockets;

/// A SuperLink process the hub runs, and what it was started with.
pub(super) struct RunningSuperLink {
    pub(super) argv: Vec<String>,
    /// The certificate it serves (its validity, `""` without TLS): a renewed one restarts it.
    pub(super) certificate: String,
    pub(super) superlink: Supervised,
    pub(super) superexec: Option<Supervised>,
    /// Where it takes SuperNodes' requests ([`fleet_listen_address`], or its bridge's socket
    /// in a network namespace of its own), when it started, and whether it has accepted a
    /// connection there since: until then (at most [`LISTEN_HOLD`]) the work of its Federation
    /// is held back ([`super::hold`]).
    pub(super) fleet: Listening,
    pub(super) started: std::time::Instant,
    pub(super) listening: bool,
    /// What the hub serves for it on the host: the Fleet front (unified dialect, Control kept
    /// on loopback), and in a network namespace the bridges of its Fleet and Control ports;
    /// each task with its stop signal.
    pub(super) served: Vec<Served>,
}

/// Why a Federation's SuperLink could not be set up on the standalone hub: one variant per step,
/// each saying what failed and where (the Federation's status shows it).
#[derive(Debug, thiserror::Error)]
pub(super) enum SuperLinkError {
    /// The Federation's own CA, derived from the Flower CA.
    #[error("cannot derive the Federation's SuperLink CA: {0}")]
    Ca(#[source] CaError),
    /// Issuing the SuperLink's serving certificate.
    #[error("cannot issue the SuperLink certificate: {0}")]
    Issue(#[source] CaError),
    /// The certificate just issued has no validity to read.
    #[error("the issued SuperLink certificate does not parse")]
    IssuedUnreadable,
    /// A file or directory of the SuperLink's (certificate, key, CA bundle, its directory).
    #[error("{}: {source}", .path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A host port the hub serves for the SuperLink (`field` names it in the spec).
    #[error("{field}: cannot listen on {host}:{port} for {what}: {source}")]
    Listen {
        field: &'static str,
        host: String,
        port: u16,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The Fleet front's TLS from the SuperLink's PEM files.
    #[error("{0}")]
    FrontTls(#[source] crate::flower::front::FrontError),
    /// A socket path of a SuperLink in a network namespace of its own (too long for a Unix
    /// socket: the message says how long it may be).
    #[error("{0}")]
    SocketPath(String),
}

impl SuperLinkError {
    fn file(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::File {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A task the hub runs for a SuperLink, and its stop signal.
pub(super) type Served = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
);

/// Where a SuperLink is probed for being up.
#[derive(Clone, Debug)]
pub(super) enum Listening {
    /// Its Fleet port, on the hub machine's network.
    Tcp(String, u16),
    /// Its bridge's socket (which appears once the port inside accepts connections).
    Unix(PathBuf),
}

/// How long a started SuperLink's work is held back at most while it does not listen yet (a
/// SuperLink that never comes up must not freeze its clusters' work for ever).
pub(super) const LISTEN_HOLD: Duration = Duration::from_secs(30);

/// How long a probe of a loopback port may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

impl RunningSuperLink {
    /// When its SuperLink process last started (its supervisor starts it again when it exits).
    pub(super) fn started_at(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        let started = self.superlink.state().started_at?;
        k8s_openapi::jiff::Timestamp::now()
            .checked_sub(started.elapsed())
            .ok()
    }

    /// Whether its Federation's work is held back: started, not listening yet (probed now, a
    /// loopback connect that is accepted or refused at once), for less than [`LISTEN_HOLD`].
    pub(super) async fn holding(&mut self) -> bool {
        if self.listening || self.started.elapsed() >= LISTEN_HOLD {
            return false;
        }
        let accepted = match &self.fleet {
            Listening::Tcp(host, port) => tokio::time::timeout(
                PROBE_TIMEOUT,
                tokio::net::TcpStream::connect((host.as_str(), *port)),
            )
            .await
            .is_ok_and(|c| c.is_ok()),
            Listening::Unix(socket) => {
                tokio::time::timeout(PROBE_TIMEOUT, super::netns::exported(socket))
                    .await
                    .unwrap_or(false)
            }
        };
        if accepted {
            self.listening = true;
            tracing::debug!(at = ?self.fleet, after_ms = self.started.elapsed().as_millis() as u64, "the SuperLink listens");
        }
        !accepted
    }
}

impl<S: ClusterStore> StandaloneHub<S> {
    /// When each running SuperLink last started (what a run's submission waits after).
    pub(super) fn superlink_starts(&self) -> BTreeMap<FedKey, k8s_openapi::jiff::Timestamp> {
        self.superlinks
            .iter()
            .filter_map(|(k, sl)| Some((k.clone(), sl.started_at()?)))
            .collect()
    }

    pub(super) fn flower_program(&self, name: &str) -> PathBuf {
        match &self.config.flower_bin {
            Some(dir) => dir.join(name),
            None => PathBuf::from(name),
        }
    }

    /// The state directory hidden from a SuperLink but for its own directory: code run through its
    /// Control API must not read the CA keys, tokens or other Federations.
    fn sandbox(&self, paths: &SuperLinkPaths) -> Option<flower_addon_runtime::sandbox::Sandbox> {
        self.config
            .sandbox
            .then(|| flower_addon_runtime::sandbox::Sandbox {
                hide: self.config.state_dir.clone(),
                keep: paths.dir.clone(),
                network: self.isolated().map(|_| Default::default()),
                confine: true,
            })
    }

    /// The bridge that gives each SuperLink a network namespace of its own, when it does.
    fn isolated(&self) -> Option<&super::NetnsBridge> {
        self.config
            .superlink_network
            .as_ref()
            .filter(|_| self.config.sandbox)
    }

    pub(super) fn flower_env(&self) -> BTreeMap<String, String> {
        flower_addon_runtime::supervise::flower_env(self.config.flower_bin.as_deref())
    }

    /// Issues the SuperLink certificate when there is none, its names or CA changed, or it is
    /// due ([`crate::core::renewal`]; due by age, it waits for the runs in progress:
    /// [`crate::flower::renewal`]); returns its validity (`not_before..not_after`, Unix
    /// seconds), which [`Self::ensure_superlink`] restarts the SuperLink on when it changes.
    pub(super) async fn ensure_superlink_tls(
        &self,
        fed: &Federation,
        paths: &SuperLinkPaths,
    ) -> Result<String, SuperLinkError> {
        let sans = superlink_sans(fed, self.config.advertise.iter().cloned());
        let sans_file = paths.dir.join("tls/sans");
        let want = sans.join("\n");
        let current = std::fs::read_to_string(&sans_file).ok();
        // Re-issued when the SANs or the signing CA changed (a hub upgraded to separate CAs
        // re-issues certificates its channel CA signed; a promoted rotation, those the old CA
        // signed). The CA file's first certificate is the signer of the certificate in force.
        // The Federation's own CA (derived from the Flower CA): another Federation's SuperLink
        // certificate does not verify for this one's SuperNodes.
        let (namespace, name) = fed_key(fed);
        let ca = self
            .ca
            .federation(&namespace, &name)
            .map_err(SuperLinkError::Ca)?;
        let ca_file = std::fs::read_to_string(&paths.ca).ok();
        let same_ca = ca_file
            .as_deref()
            .is_some_and(|pem| first_certificate(pem) == first_certificate(ca.cert_pem()));
        let validity = self.config.superlink_cert_validity;
        // Kept only when the certificate and key still make a usable pair (both modes check
        // the same: [`crate::core::renewal::pair_is_usable`]).
        let in_force = std::fs::read_to_string(&paths.cert)
            .ok()
            .filter(|pem| {
                std::fs::read(&paths.key)
                    .is_ok_and(|key| crate::core::renewal::pair_is_usable(pem.as_bytes(), &key))
            })
            .and_then(|pem| crate::core::renewal::certificate_validity(&pem));
        if let Some((not_before, not_after)) = in_force
            && current.as_deref() == Some(want.as_str())
            && same_ca
        {
            let keep = !crate::core::renewal::needs_renewal(
                not_before,
                not_after,
                validity,
                std::time::SystemTime::now(),
            ) || self.renewal_waits(fed, not_before, not_after).await;
            if keep {
                // A staged or retired rotation changes what to trust, not the certificate.
                if ca_file.as_deref() != Some(ca.bundle_pem()) {
                    write_file(&paths.ca, ca.bundle_pem().as_bytes())?;
                }
                return Ok(validity_marker(not_before, not_after));
            }
        }
        let issued = ca
            .issue_superlink_cert(&name, &sans, validity)
            .map_err(SuperLinkError::Issue)?;
        write_private(&paths.key, issued.key_pem.as_bytes())?;
        write_file(&paths.cert, issued.cert_pem.as_bytes())?;
        write_file(&paths.ca, ca.bundle_pem().as_bytes())?;
        write_file(&sans_file, want.as_bytes())?;
        tracing::info!(federation = %name, sans = %sans.join(","), "issued the SuperLink certificate");
        let (not_before, not_after) = crate::core::renewal::certificate_validity(&issued.cert_pem)
            .ok_or(SuperLinkError::IssuedUnreadable)?;
        Ok(validity_marker(not_before, not_after))
    }

    /// Whether the certificate of `fed`, due by age, waits for the runs in progress on its
    /// SuperLink (the rule of both modes: [`crate::flower::renewal`]); says so in the log when it
    /// starts waiting and when it stops.
    async fn renewal_waits(
        &self,
        fed: &Federation,
        not_before: std::time::SystemTime,
        not_after: std::time::SystemTime,
    ) -> bool {
        use crate::flower::renewal::Renewal;
        let key = fed_key(fed);
        let decision = self
            .renewals
            .decide(
                &key,
                self.control_endpoint(fed),
                not_before,
                not_after,
                self.config.superlink_cert_validity,
            )
            .await;
        match decision {
            Renewal::Wait {
                runs, until, first, ..
            } => {
                if first {
                    tracing::info!(namespace = %key.0, federation = %key.1, "{}", Renewal::waiting_message(&runs, until));
                }
                true
            }
            Renewal::Now {
                waited_for: Some(runs),
            } => {
                tracing::info!(namespace = %key.0, federation = %key.1, ?runs, "SuperLink certificate renewal no longer waits (the runs ended, or its deadline came): renewing it");
                false
            }
            Renewal::Now { waited_for: None } => false,
        }
    }

    /// Whether the SuperLink of `key` runs with `argv` and `certificate`; if it runs with
    /// others, it is stopped (to be started again).
    async fn keep_or_stop(
        &mut self,
        key: &(String, String),
        argv: &[String],
        certificate: &str,
    ) -> bool {
        if let Some(running) = self.superlinks.get(key)
            && running.argv == argv
            && running.certificate == certificate
        {
            return true;
        }
        if let Some(old) = self.superlinks.remove(key) {
            if old.argv == argv {
                tracing::info!(federation = %key.1, "SuperLink certificate renewed: restarting it");
            } else {
                tracing::info!(federation = %key.1, "SuperLink arguments changed: restarting it");
            }
            stop_superlink(old).await;
        }
        false
    }

    pub(super) async fn ensure_superlink(
        &mut self,
        fed: &Federation,
        version: FlowerVersion,
        dialect: FlowerDialect,
        paths: &SuperLinkPaths,
        certificate: String,
    ) -> Result<(), SuperLinkError> {
        let key = fed_key(fed);
        // Where SuperNodes and `flwr` reach it on the hub machine; in a network namespace of
        // its own the SuperLink itself listens on that namespace's loopback, and the hub serves
        // these host ports, bridged in.
        let host_layout = paths.layout(fed, dialect, &self.config.superlink_host);
        let bridge = self.isolated().cloned();
        let layout = match bridge {
            Some(_) => SuperLinkLayout {
                bind_host: "127.0.0.1".to_owned(),
                control_host: "127.0.0.1".to_owned(),
                ..host_layout.clone()
            },
            None => host_layout.clone(),
        };
        let argv = superlink_argv(fed, version, dialect, &layout);
        if self.keep_or_stop(&key, &argv, &certificate).await {
            return Ok(());
        }
        std::fs::create_dir_all(&paths.dir).map_err(SuperLinkError::file(&paths.dir))?;
        let process = fed.spec.isolation_mode == flower_addon_crds::IsolationMode::Process;
        let ports = layout.ports;
        let sockets = match bridge {
            Some(_) => Some(Sockets::for_superlink(paths, ports, process, dialect)?),
            None => None,
        };
        let mut served = Vec::new();
        let started = self
            .serve_on_host(fed, &host_layout, paths, sockets.as_ref(), &mut served)
            .await;
        if let Err(e) = started {
            for (stop, task) in served {
                let _ = stop.send(());
                let _ = task.await;
            }
            return Err(e);
        }
        let (program, args) = bridged(
            self.flower_program("flower-superlink"),
            argv.clone(),
            bridge
                .as_ref()
                .zip(sockets.as_ref())
                .map(|(bridge, sockets)| (bridge, sockets.superlink_exports(ports))),
        );
        // Flower installs FABs under FLWR_HOME: one per SuperLink.
        let mut env = self.flower_env();
        let home = paths.dir.join("superlink-home");
        env.insert("FLWR_HOME".into(), home.display().to_string());
        let superlink = Supervised::start(ProcessSpec {
            name: format!("superlink/{}/{}", key.0, key.1),
            program,
            args,
            env,
            cwd: Some(paths.dir.clone()),
            log_file: paths.log.clone(),
            sandbox: self.sandbox(paths),
        });
        let superexec = process.then(|| {
            // It dials ServerAppIO (classic) or the SuperLink's one server on its own loopback:
            // the same port, imported from the SuperLink's namespace.
            let (program, args) = bridged(
                self.flower_program("flower-superexec"),
                serverapp_superexec_argv(fed, version, dialect, &layout),
                bridge
                    .as_ref()
                    .zip(sockets.as_ref())
                    .map(|(bridge, sockets)| (bridge, vec![sockets.superexec_import(ports)])),
            );
            Supervised::start(ProcessSpec {
                name: format!("superexec-serverapp/{}/{}", key.0, key.1),
                program,
                args,
                env: self.flower_env(),
                cwd: Some(paths.dir.clone()),
                log_file: paths.log.with_extension("superexec.log"),
                sandbox: self.sandbox(paths),
            })
        });
        tracing::info!(namespace = %key.0, federation = %key.1, isolated = bridge.is_some(), "started the SuperLink");
        let fleet = fleet_listening(sockets.as_ref(), dialect, &layout);
        self.superlinks.insert(
            key,
            RunningSuperLink {
                argv,
                certificate,
                superlink,
                superexec,
                fleet,
                started: std::time::Instant::now(),
                listening: false,
                served,
            },
        );
        Ok(())
    }

    /// Starts what the hub serves on the host for a SuperLink (pushing each to `served`): the
    /// Fleet front where the Control API stays on loopback (unified dialect); and for a
    /// SuperLink in a network namespace of its own (`sockets`), the Fleet and Control ports of
    /// `host_layout` bridged to its sockets.
    async fn serve_on_host(
        &self,
        fed: &Federation,
        host_layout: &SuperLinkLayout,
        paths: &SuperLinkPaths,
        sockets: Option<&Sockets>,
        served: &mut Vec<Served>,
    ) -> Result<(), SuperLinkError> {
        let ports = host_layout.ports;
        let control_upstream = match sockets {
            Some(s) => format!("unix:{}", s.control.display()),
            None => format!("127.0.0.1:{}", ports.control),
        };
        if ports.front {
            served.push(start_front(fed, host_layout, paths, control_upstream).await?);
        }
        let Some(sockets) = sockets else {
            return Ok(());
        };
        if !ports.front {
            let to = sockets
                .fleet
                .clone()
                .unwrap_or_else(|| sockets.control.clone());
            served.push(
                bridge_port(
                    (host_layout.bind_host.as_str(), ports.fleet),
                    to,
                    "spec.superlink.service.ports.grpc",
                    "SuperNodes (Fleet API)",
                )
                .await?,
            );
        }
        if ports.control != ports.fleet {
            served.push(
                bridge_port(
                    (host_layout.control_host.as_str(), ports.control),
                    sockets.control.clone(),
                    "spec.superlink.service.ports.extra",
                    "the Control API (flwr)",
                )
                .await?,
            );
        }
        Ok(())
    }
}

/// Listens on `listen` of the hub machine and forwards each connection to `socket` (a
/// SuperLink's bridge, [`super::netns`]).
async fn bridge_port(
    listen: (&str, u16),
    socket: PathBuf,
    field: &'static str,
    what: &'static str,
) -> Result<Served, SuperLinkError> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| SuperLinkError::Listen {
            field,
            host: listen.0.to_owned(),
            port: listen.1,
            what,
            source,
        })?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(super::netns::serve_to_unix_until(listener, socket, async {
        let _ = stopped.await;
    }));
    Ok((stop, task))
}

pub(super) async fn stop_superlink(sl: RunningSuperLink) {
    for (stop, task) in sl.served {
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
    layout: &SuperLinkLayout,
    paths: &SuperLinkPaths,
    upstream: String,
) -> Result<Served, SuperLinkError> {
    use crate::flower::front::{FrontConfig, FrontTls};
    let tls = if fed.spec.insecure {
        None
    } else {
        let read = |p: &Path| std::fs::read_to_string(p).map_err(SuperLinkError::file(p));
        Some(
            FrontTls::from_pem(
                &read(&paths.ca)?,
                &read(&paths.cert)?,
                &read(&paths.key)?,
                "127.0.0.1",
            )
            .map_err(SuperLinkError::FrontTls)?,
        )
    };
    let listen = (layout.bind_host.as_str(), layout.ports.fleet);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| SuperLinkError::Listen {
            field: "spec.superlink.service.ports.grpc",
            host: listen.0.to_owned(),
            port: listen.1,
            what: "SuperNodes (the Fleet front)",
            source,
        })?;
    let config = FrontConfig {
        upstream: upstream.clone(),
        tls,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(crate::flower::front::serve(listener, config, async {
        let _ = stopped.await;
    }));
    tracing::info!(federation = %fed_key(fed).1, fleet = %format!("{}:{}", listen.0, listen.1), control = %upstream, "Fleet front started: the Control API stays on loopback");
    Ok((stop, task))
}

/// `not_before..not_after` in Unix seconds.
fn validity_marker(not_before: std::time::SystemTime, not_after: std::time::SystemTime) -> String {
    let secs = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    format!("{}..{}", secs(not_before), secs(not_after))
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), SuperLinkError> {
    flower_addon_runtime::files::write_atomic(path, bytes, flower_addon_runtime::files::PUBLIC)
        .map_err(SuperLinkError::file(path))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), SuperLinkError> {
    flower_addon_runtime::files::write_atomic(path, bytes, flower_addon_runtime::files::PRIVATE)
        .map_err(SuperLinkError::file(path))
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

//! A real Flower SuperLink process for tests of the hub's Control API client: started with the
//! hub's own argument builder ([`flower_addon_hub::core::superlink::superlink_argv`]), TLS from
//! a fresh hub CA (SANs `127.0.0.1`, `localhost`) and SuperNode authentication on, on free
//! loopback ports, from the Flower venv of the version asked for.
use crate::harness::{Processes, flower_venv, free_ports};
use anyhow::{Context, Result, bail};
use flower_addon_crds::parse::{Object, parse_documents};
use flower_addon_hub::core::superlink::{SuperLinkLayout, SuperLinkPorts, superlink_argv};
use flower_addon_hub::flower::control::{ControlClient, ControlEndpoint};
use flower_addon_hub::registration::ca::HubCa;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A running SuperLink and what it takes to talk to it.
pub struct TestSuperLink {
    /// Its process (ended on drop).
    pub procs: Processes,
    /// Its Control API, verified against [`TestSuperLink::ca_pem`].
    pub control: ControlEndpoint,
    /// `127.0.0.1:<fleet port>` (SuperNodes dial it).
    pub fleet: String,
    /// The CA that signed its certificate.
    pub ca_pem: String,
    /// The CA file (for `flower-supernode --root-certificates`).
    pub ca_file: PathBuf,
    /// The Flower venv it runs from.
    pub venv: PathBuf,
    /// Its log file.
    pub log: PathBuf,
}

impl TestSuperLink {
    /// Starts a SuperLink of Flower `version` with its files under `dir` and waits until its
    /// Control API answers (a node listing), at most 60 s.
    pub async fn start(version: &str, dir: &Path) -> Result<Self> {
        let venv = tokio::task::spawn_blocking({
            let version = version.to_owned();
            move || flower_venv(&version)
        })
        .await??;
        let ports = free_ports(3)?;
        let fed = federation(version, &ports)?;
        let (flower_version, dialect) = flower_addon_hub::core::render::federation_dialect(&fed)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let ca = HubCa::generate_for(flower_addon_hub::registration::ca::CaRole::Flower)?
            .federation("default", "test")?;
        let sans = ["127.0.0.1".to_owned(), "localhost".to_owned()];
        let issued = ca.issue_superlink_cert("test", &sans, Duration::from_secs(3600))?;
        std::fs::create_dir_all(dir.join("home"))?;
        let files = ["ca.crt", "tls.crt", "tls.key"].map(|f| dir.join(f));
        std::fs::write(&files[0], ca.cert_pem())?;
        std::fs::write(&files[1], &issued.cert_pem)?;
        std::fs::write(&files[2], &issued.key_pem)?;
        // A bare SuperLink (no Fleet front: `exposeControl` above), on loopback.
        let layout = SuperLinkLayout {
            bind_host: "127.0.0.1".into(),
            control_host: "127.0.0.1".into(),
            ports: SuperLinkPorts::from_spec(&fed, dialect),
            tls_files: files.clone().map(|f| f.display().to_string()),
            database: dir.join("superlink.db").display().to_string(),
            supernode_auth: true,
        };
        let argv = superlink_argv(&fed, flower_version, dialect, &layout);
        let mut cmd = std::process::Command::new(venv.join("bin/flower-superlink"));
        cmd.args(&argv)
            .envs(flower_addon_agent::supervise::flower_env(Some(
                &venv.join("bin"),
            )))
            .env("FLWR_HOME", dir.join("home"))
            .current_dir(dir);
        let log = dir.join("superlink.log");
        let mut procs = Processes::default();
        procs.start_group("superlink", cmd, &log)?;
        let control = ControlEndpoint {
            dialect,
            address: format!("127.0.0.1:{}", layout.ports.control),
            server_name: "127.0.0.1".into(),
            ca_pem: Some(ca.cert_pem().to_owned()),
            tunnel: None,
        };
        let client = ControlClient::new(control.clone())?;
        let t = std::time::Instant::now();
        loop {
            let last = match client.list_nodes().await {
                Ok(_) => break,
                Err(e) => e.to_string(),
            };
            procs.check_alive()?;
            if t.elapsed() > Duration::from_secs(60) {
                bail!(
                    "the SuperLink's Control API did not answer in 60 s: {last}\n{}",
                    procs.log_tails(None)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(Self {
            procs,
            control,
            fleet: format!("127.0.0.1:{}", layout.ports.fleet),
            ca_pem: ca.cert_pem().to_owned(),
            ca_file: files[0].clone(),
            venv,
            log,
        })
    }

    /// A Control API client for it.
    pub fn client(&self) -> Result<ControlClient> {
        Ok(ControlClient::new(self.control.clone())?)
    }
}

/// The Federation the SuperLink is started for: `version`, TLS, subprocess isolation, ports.
fn federation(version: &str, ports: &[u16]) -> Result<flower_addon_crds::Federation> {
    let yaml = format!(
        "apiVersion: flower-addon.io/v1alpha1\nkind: Federation\nmetadata: {{name: control-test, namespace: default}}\n\
         spec:\n  mode: StatefulSet\n  insecure: false\n  isolationMode: subprocess\n  version: \"{version}\"\n  superlink:\n    image: \"flwr/superlink:{version}\"\n    service:\n      exposeControl: true\n      ports: {{grpc: {}, extra: {}, serverAppIO: {}}}\n  \
         supernodes: {{image: \"flwr/supernode:{version}\", pools: [{{name: p, replicas: 1, images: {{}}}}]}}\n",
        ports[0], ports[1], ports[2]
    );
    match parse_documents("control-test.yaml", &yaml)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("the test Federation")?
        .pop()
    {
        Some(Object::Federation(f)) => Ok(f),
        _ => bail!("the test Federation did not parse as one"),
    }
}

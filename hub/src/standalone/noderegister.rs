//! Flower SuperNode authentication, automated: the hub registers the public key of every
//! SuperNode its agents report with the Federation's SuperLink (`flwr supernode register`
//! through the Control API), so only those SuperNodes are let in.
use super::superlink::SuperLinkPaths;
use flower_addon_crds::render::FlowerVersion;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Connection name written into the `flwr` configuration the hub uses.
const CONNECTION: &str = "flower-addon-hub";

/// Why a key could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// `flwr` could not be run.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The error.
        source: std::io::Error,
    },
    /// `flwr` ran and refused.
    #[error("flwr supernode register failed: {0}")]
    Refused(String),
    /// Writing the configuration failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Writes what `flwr` needs to reach the SuperLink's Control API at `127.0.0.1:control_port`
/// (from Flower 1.26 a `config.toml` in `FLWR_HOME`; before, an app stub whose `pyproject.toml`
/// holds the federation table). Returns the connection arguments for `flwr supernode …`.
pub fn write_connection(
    paths: &SuperLinkPaths,
    version: FlowerVersion,
    control_port: u16,
    insecure: bool,
) -> Result<Vec<String>, RegisterError> {
    let tls = if insecure {
        "insecure = true".to_owned()
    } else {
        format!("root-certificates = {:?}", paths.ca.display().to_string())
    };
    let address = format!("127.0.0.1:{control_port}");
    let config_toml = version
        >= (FlowerVersion {
            major: 1,
            minor: 26,
            patch: 0,
        });
    match config_toml {
        true => {
            let text = format!(
                "[superlink]\ndefault = \"{CONNECTION}\"\n\n[superlink.{CONNECTION}]\naddress = \"{address}\"\n{tls}\n"
            );
            write(&paths.flwr_home.join("config.toml"), &text)?;
            Ok(vec![CONNECTION.to_owned()])
        }
        false => {
            let app = paths.flwr_home.join("connection-app");
            let text = format!(
                "[build-system]\nrequires = [\"hatchling\"]\nbuild-backend = \"hatchling.build\"\n\n\
                 [project]\nname = \"flower-addon-connection\"\nversion = \"0.0.0\"\n\n\
                 [tool.flwr.app]\npublisher = \"flower-addon\"\n\n\
                 [tool.flwr.app.components]\nserverapp = \"none:app\"\nclientapp = \"none:app\"\n\n\
                 [tool.flwr.federations]\ndefault = \"{CONNECTION}\"\n\n\
                 [tool.flwr.federations.{CONNECTION}]\naddress = \"{address}\"\n{tls}\n"
            );
            write(&app.join("pyproject.toml"), &text)?;
            Ok(vec![app.display().to_string(), CONNECTION.to_owned()])
        }
    }
}

/// Registers one public key file. A key the SuperLink already knows counts as registered.
pub async fn register_key(
    flwr: &Path,
    paths: &SuperLinkPaths,
    connection: &[String],
    public_key_file: &Path,
    env_path: Option<&str>,
) -> Result<(), RegisterError> {
    let mut cmd = tokio::process::Command::new(flwr);
    cmd.arg("supernode")
        .arg("register")
        .arg(public_key_file)
        .args(connection)
        .arg("--format")
        .arg("json")
        .env("FLWR_HOME", &paths.flwr_home)
        .env("FLWR_TELEMETRY_ENABLED", "0")
        .env("FLWR_DISABLE_UPDATE_CHECK", "1")
        .current_dir(&paths.flwr_home)
        .kill_on_drop(true);
    if let Some(path) = env_path {
        cmd.env("PATH", path);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .map_err(|_| RegisterError::Refused("timed out after 60 s".into()))?
        .map_err(|source| RegisterError::Spawn {
            program: flwr.display().to_string(),
            source,
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if text.contains("already in use") {
        return Ok(());
    }
    let json = text
        .find('{')
        .and_then(|start| serde_json::from_str::<serde_json::Value>(text[start..].trim()).ok());
    match json {
        Some(v) if v.get("success").and_then(|s| s.as_bool()) == Some(true) => Ok(()),
        Some(v) => Err(RegisterError::Refused(
            v.get("error-message")
                .and_then(|m| m.as_str())
                .unwrap_or(text.trim())
                .to_owned(),
        )),
        None => Err(RegisterError::Refused(
            text.trim().chars().take(500).collect(),
        )),
    }
}

/// Writes `public_key` (one OpenSSH line) to a file named after its fingerprint and returns it.
pub fn key_file(paths: &SuperLinkPaths, public_key: &str) -> Result<PathBuf, RegisterError> {
    use sha2::{Digest, Sha256};
    let digest = hex::encode(Sha256::digest(public_key.trim().as_bytes()));
    let path = paths
        .dir
        .join("node-keys")
        .join(format!("{}.pub", &digest[..16]));
    if !path.exists() {
        write(&path, &format!("{}\n", public_key.trim()))?;
    }
    Ok(path)
}

fn write(path: &Path, text: &str) -> Result<(), RegisterError> {
    let io = |source| RegisterError::Io {
        path: path.display().to_string(),
        source,
    };
    if std::fs::read_to_string(path).ok().as_deref() == Some(text) {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

//! Writing kubeconfig files and building clients from them.

use std::path::Path;

use anyhow::{Context, Result};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Writes a one-context kubeconfig authenticating with a bearer token.
pub fn write(
    path: &Path,
    cluster: &str,
    server: &str,
    ca_file: &Path,
    user: &str,
    token: &str,
) -> Result<()> {
    let text = format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: {cluster}\n  \
           cluster:\n    \
             server: {server}\n    \
             certificate-authority: {ca}\n\
         users:\n\
         - name: {user}\n  \
           user:\n    \
             token: {token}\n\
         contexts:\n\
         - name: {cluster}\n  \
           context:\n    \
             cluster: {cluster}\n    \
             user: {user}\n\
         current-context: {cluster}\n",
        ca = ca_file.display(),
    );
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    // Tokens inside: keep it private.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// A client for the current context of a kubeconfig file.
pub async fn client(path: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading {}", path.display()))?;
    Client::try_from(config).with_context(|| format!("client for {}", path.display()))
}

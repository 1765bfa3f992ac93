//! Running a Deployment's container as a local process, the way the kubelet would start it: its
//! `command` + `args`, and its `env` (plain values, and the pod's namespace and host IP through the
//! downward API). Tests start the hub and agents this way, so the install manifests are what is tested.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;

/// A container's command line and environment, resolved for a local run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerCommand {
    /// `command` followed by `args`.
    pub argv: Vec<String>,
    /// Resolved environment, in manifest order.
    pub env: Vec<(String, String)>,
}

/// `arg` with the kubelet's `$(NAME)` references to the container's environment expanded: a
/// defined name is replaced by its value, `$$` is a literal `$`, anything else stays as written.
fn expand(arg: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
            && let Some((_, value)) = env.iter().find(|(k, _)| *k == inner[..end])
        {
            out.push_str(value);
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

impl ContainerCommand {
    /// Reads container `container` of the Deployment in `manifest`, as it would run in
    /// `namespace`. Environment sources a local process cannot have (Secrets, ConfigMaps, other
    /// fields) are errors, so a manifest that needs them fails the test instead of being run
    /// differently.
    pub fn from_manifest(manifest: &Path, container: &str, namespace: &str) -> Result<Self> {
        let text = std::fs::read_to_string(manifest)
            .with_context(|| format!("read {}", manifest.display()))?;
        let deployment: Deployment = serde_saphyr::from_str(&text)
            .with_context(|| format!("{}: not a Deployment", manifest.display()))?;
        let spec = deployment
            .spec
            .template
            .spec
            .with_context(|| format!("{}: no pod template", manifest.display()))?;
        let c = spec
            .containers
            .into_iter()
            .find(|c| c.name == container)
            .with_context(|| format!("{}: no container {container:?}", manifest.display()))?;
        let mut argv = c.command.unwrap_or_default();
        argv.extend(c.args.unwrap_or_default());
        ensure!(
            !argv.is_empty(),
            "{}: container {container} has no command",
            manifest.display()
        );
        let mut env = Vec::new();
        for var in c.env.unwrap_or_default() {
            let value = match (var.value, var.value_from) {
                (Some(v), None) => v,
                (None, Some(from)) => match from.field_ref {
                    Some(f) if f.field_path == "metadata.namespace" => namespace.to_string(),
                    // One local "pod" per Deployment unless the test names it (extra env).
                    Some(f) if f.field_path == "metadata.name" => format!(
                        "{}-local",
                        deployment.metadata.name.as_deref().unwrap_or(container)
                    ),
                    // The process runs on this machine: its node is the loopback host.
                    Some(f) if f.field_path == "status.hostIP" => "127.0.0.1".to_string(),
                    _ => bail!(
                        "{}: env {} comes from a source a local run cannot provide",
                        manifest.display(),
                        var.name
                    ),
                },
                _ => String::new(),
            };
            env.push((var.name, value));
        }
        let argv = argv.iter().map(|a| expand(a, &env)).collect();
        Ok(Self { argv, env })
    }

    /// Replaces the value after `flag` (which the manifest must pass), e.g. a listen address.
    pub fn set_flag(&mut self, flag: &str, value: &str) -> Result<&mut Self> {
        let i = self
            .argv
            .iter()
            .position(|a| a == flag)
            .with_context(|| format!("the manifest does not pass {flag}: {:?}", self.argv))?;
        ensure!(i + 1 < self.argv.len(), "{flag} has no value");
        self.argv[i + 1] = value.to_string();
        Ok(self)
    }

    /// Appends arguments the test adds (e.g. shorter intervals).
    pub fn push_args(&mut self, args: &[&str]) -> &mut Self {
        self.argv.extend(args.iter().map(|s| s.to_string()));
        self
    }

    /// The value of environment variable `name`, if the manifest sets it.
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// `/usr/bin/env` arguments: the manifest's env, then `extra_env`, then the program (the
    /// manifest's `command[0]` replaced by `program`) and its arguments.
    pub fn env_argv(&self, program: &Path, extra_env: &[(&str, String)]) -> Vec<String> {
        let mut out: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.extend(extra_env.iter().map(|(k, v)| format!("{k}={v}")));
        out.push(program.display().to_string());
        out.extend(self.argv.iter().skip(1).cloned());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn arguments_expand_the_containers_variables_as_the_kubelet_does() {
        let env = vec![("POD_NAMESPACE".to_owned(), "flower-addon-ocm".to_owned())];
        assert_eq!(expand("$(POD_NAMESPACE)", &env), "flower-addon-ocm");
        assert_eq!(
            expand("ns=$(POD_NAMESPACE)/x", &env),
            "ns=flower-addon-ocm/x"
        );
        assert_eq!(expand("$$(POD_NAMESPACE)", &env), "$(POD_NAMESPACE)");
        assert_eq!(expand("$(UNSET) $ $(", &env), "$(UNSET) $ $(");
    }
}

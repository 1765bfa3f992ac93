//! `nodeConfig` placeholders and how each one is expanded.
//!
//! flower-operator's placeholders are `{index}`, `{replicas}`, `{pool}` and `{node}`; ours add
//! `{cluster}`, `{clusterIndex}`, `{clusters}`, `{partition}` and `{partitions}`. Values known when
//! rendering are substituted as text. Values only a pod knows are left to Kubernetes' own `$(VAR)`
//! expansion of container arguments, fed by downward-API environment variables, so no shell ever
//! sees a user value. Because Kubernetes expands `$(…)` and turns `$$` into `$` in arguments, every
//! literal `$` is written as `$$` in Kubernetes output: `$HOME` and `$(X)` reach Flower unchanged.

/// Environment variable holding the StatefulSet pod ordinal (downward API
/// `metadata.labels['apps.kubernetes.io/pod-index']`).
pub const POD_INDEX_ENV: &str = "FLWR_POD_INDEX";
/// Environment variable holding the node name (downward API `spec.nodeName`).
pub const NODE_NAME_ENV: &str = "FLWR_NODE_NAME";

/// Every placeholder name we expand, without braces.
pub const PLACEHOLDERS: [&str; 9] = [
    "index",
    "replicas",
    "pool",
    "node",
    "cluster",
    "clusterIndex",
    "clusters",
    "partition",
    "partitions",
];

/// Placeholders that always expand to a non-negative integer, so a value made only of one of
/// them is written bare (a TOML integer), like flower-operator's `partition-id: "{index}"`.
pub const INTEGER_PLACEHOLDERS: [&str; 6] = [
    "index",
    "replicas",
    "clusterIndex",
    "clusters",
    "partition",
    "partitions",
];

/// Where rendered text is consumed, which decides how literal `$` is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A container argument: Kubernetes expands `$(VAR)` and `$$`, so `$` is doubled.
    Kubernetes,
    /// A process argv: nothing expands anything, text is written as is.
    Process,
}

/// What one placeholder expands to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expansion {
    /// Text known at render time.
    Text(String),
    /// Kubernetes `$(VAR)` reference to a downward-API environment variable of the container.
    KubernetesEnv(&'static str),
    /// Not available for this pool; the reason is shown to the user.
    Unavailable(&'static str),
}

/// The expansions of every placeholder for one pool (and, in process mode, one replica).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placeholders {
    target: Target,
    values: [Expansion; 9],
}

impl Placeholders {
    /// Placeholders for `target`; every value starts [`Expansion::Unavailable`].
    pub fn new(target: Target) -> Self {
        Self {
            target,
            values: std::array::from_fn(|_| Expansion::Unavailable("it is not known here")),
        }
    }

    /// Sets the expansion of `name` (one of [`PLACEHOLDERS`]); unknown names are ignored.
    pub fn set(mut self, name: &str, expansion: Expansion) -> Self {
        if let Some(i) = PLACEHOLDERS.iter().position(|p| *p == name) {
            self.values[i] = expansion;
        }
        self
    }

    /// The target this set renders for.
    pub fn target(&self) -> Target {
        self.target
    }

    fn get(&self, name: &str) -> Option<&Expansion> {
        PLACEHOLDERS
            .iter()
            .position(|p| *p == name)
            .map(|i| &self.values[i])
    }

    /// Expands every known `{name}` in `template`. Unknown `{…}` text is kept literally.
    /// In Kubernetes output every literal `$` becomes `$$`.
    pub fn expand(&self, template: &str) -> Result<String, PlaceholderError> {
        let mut out = String::with_capacity(template.len() + 16);
        for piece in split(template) {
            match piece {
                Piece::Literal(text) => self.push_literal(&mut out, text),
                Piece::Placeholder(name) => match self.get(name) {
                    Some(Expansion::Text(text)) => self.push_literal(&mut out, text),
                    Some(Expansion::KubernetesEnv(var)) => {
                        out.push_str("$(");
                        out.push_str(var);
                        out.push(')');
                    }
                    Some(Expansion::Unavailable(reason)) => {
                        return Err(PlaceholderError {
                            placeholder: name.to_owned(),
                            reason,
                        });
                    }
                    None => {
                        out.push('{');
                        self.push_literal(&mut out, name);
                        out.push('}');
                    }
                },
            }
        }
        Ok(out)
    }

    fn push_literal(&self, out: &mut String, text: &str) {
        match self.target {
            Target::Process => out.push_str(text),
            Target::Kubernetes => {
                for c in text.chars() {
                    if c == '$' {
                        out.push('$');
                    }
                    out.push(c);
                }
            }
        }
    }
}

/// Whether `template` uses the placeholder `name` (without braces).
pub fn mentions(template: &str, name: &str) -> bool {
    split(template).any(|p| matches!(p, Piece::Placeholder(n) if n == name))
}

/// A known placeholder is used where its value cannot be known.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{{{placeholder}}} cannot be used here: {reason}")]
pub struct PlaceholderError {
    /// Placeholder name without braces.
    pub placeholder: String,
    /// Why it is unavailable.
    pub reason: &'static str,
}

#[derive(Debug, PartialEq, Eq)]
enum Piece<'a> {
    Literal(&'a str),
    Placeholder(&'a str),
}

/// Splits `template` into literal text and known `{placeholder}` names.
fn split(template: &str) -> impl Iterator<Item = Piece<'_>> {
    let mut rest = template;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut search_from = 0;
        while let Some(open) = rest[search_from..].find('{').map(|i| i + search_from) {
            let after = &rest[open + 1..];
            if let Some(close) = after.find('}') {
                let name = &after[..close];
                if PLACEHOLDERS.contains(&name) {
                    if open > 0 {
                        let literal = &rest[..open];
                        rest = &rest[open..];
                        return Some(Piece::Literal(literal));
                    }
                    rest = &after[close + 1..];
                    return Some(Piece::Placeholder(name));
                }
            }
            search_from = open + 1;
        }
        let literal = rest;
        rest = "";
        Some(Piece::Literal(literal))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(target: Target) -> Placeholders {
        Placeholders::new(target)
            .set("pool", Expansion::Text("gpu".into()))
            .set("replicas", Expansion::Text("4".into()))
            .set("index", Expansion::KubernetesEnv(POD_INDEX_ENV))
            .set("cluster", Expansion::Text("c$1".into()))
    }

    #[test]
    fn known_placeholders_expand_and_unknown_ones_stay() {
        // Only our nine names are placeholders; any other brace text is the user's.
        let p = sample(Target::Process);
        assert_eq!(
            p.expand("client_{pool}_{index}").unwrap(),
            "client_gpu_$(FLWR_POD_INDEX)"
        );
        assert_eq!(p.expand("{x}{pool}{").unwrap(), "{x}gpu{");
        assert_eq!(p.expand("{{pool}}").unwrap(), "{gpu}");
        assert_eq!(p.expand("").unwrap(), "");
    }

    #[test]
    fn kubernetes_output_doubles_every_literal_dollar() {
        // Kubernetes turns `$$` into `$` and expands `$(X)`: literal dollars must reach Flower intact.
        let p = sample(Target::Kubernetes);
        assert_eq!(
            p.expand("$HOME $(X) $$ {cluster}").unwrap(),
            "$$HOME $$(X) $$$$ c$$1"
        );
        assert_eq!(p.expand("{index}").unwrap(), "$(FLWR_POD_INDEX)");
    }

    #[test]
    fn unavailable_placeholders_are_errors() {
        // A placeholder without a value (e.g. {index} in a DaemonSet) must never render as text.
        let p = sample(Target::Kubernetes);
        let err = p.expand("a-{partition}").unwrap_err();
        assert_eq!(err.placeholder, "partition");
        assert!(
            err.to_string()
                .starts_with("{partition} cannot be used here")
        );
    }

    #[test]
    fn mentions_finds_only_real_placeholders() {
        // Partition and index detection drives the StatefulSet ordinals; it must not misfire.
        assert!(mentions("p{partition}", "partition"));
        assert!(!mentions("p{partitions}", "partition"));
        assert!(!mentions("{partition", "partition"));
    }
}

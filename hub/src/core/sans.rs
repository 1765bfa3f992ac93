//! Which names a Federation may have in the SuperLink certificate the hub issues.
//!
//! Every SuperLink certificate is signed by the one Flower CA that every SuperNode and `flwr`
//! of every Federation trusts. A name in it is a promise that whoever holds the key is the
//! SuperLink at that name, so a Federation author must not choose it freely: with
//! `extraSANs: [other-superlink.other-team.svc]` one team would hold a certificate that the
//! other team's SuperNodes accept from a man in the middle, and with `hub.example.org` one for
//! the hub's own address.
//!
//! A certificate always has the Federation's own in-cluster Service names and the loopback
//! names. What the Federation asks for (the host of `spec.superlink.externalAddress` and each of
//! `spec.tls.extraSANs`) must be one of the hub's names ([`SuperLinkNames`]): its
//! `--advertise-address`es and `--node-address` (the addresses spokes reach the hub at) and
//! what the admin allows with `--superlink-name` (names, `*.domain` wildcards, IP addresses and
//! CIDR ranges). A cluster-internal name (no dot, `.svc`, `.cluster.local`) is only ever the
//! Federation's own: no allowance covers another Service's name.
use std::net::IpAddr;

use flower_addon_crds::Federation;

use crate::core::render::host_of;
use crate::core::superlink::in_cluster_names;

/// The names every SuperLink certificate has, whatever the Federation asks for.
pub const LOOPBACK_NAMES: [&str; 3] = ["127.0.0.1", "::1", "localhost"];

/// One name the hub may issue for, as `--superlink-name` spells it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Allowed {
    /// This DNS name (lower case) or IP address.
    Exact(String),
    /// Any DNS name ending in `.<suffix>` (`*.example.org`: `a.example.org`, `a.b.example.org`).
    Subdomains(String),
    /// Any IP address in this range.
    Range(IpAddr, u8),
    /// Any name (`*`): Federation authors choose their SANs freely.
    Any,
}

/// The names the hub may put in a SuperLink certificate besides the Federation's own in-cluster
/// names: the hub's own addresses and what the admin allows (`--superlink-name`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SuperLinkNames {
    allowed: Vec<Allowed>,
}

/// A `--superlink-name` value that is not a name, `*.domain`, IP address, CIDR range or `*`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "--superlink-name {0:?} is not a DNS name, a *.domain wildcard, an IP address, a CIDR range (198.18.0.0/15) or *"
)]
pub struct BadSuperLinkName(pub String);

impl SuperLinkNames {
    /// The hub's own addresses (`--advertise-address`, `--node-address`; hosts, ports dropped)
    /// and the admin's allowances (`--superlink-name`).
    pub fn new<'a>(
        own: impl IntoIterator<Item = &'a str>,
        allowed: &[String],
    ) -> Result<Self, BadSuperLinkName> {
        let mut names = Self::default();
        for address in own {
            let host = host_of(address);
            if !host.is_empty() {
                names
                    .allowed
                    .push(Allowed::Exact(host.to_ascii_lowercase()));
            }
        }
        for pattern in allowed {
            names.allowed.push(parse_allowed(pattern)?);
        }
        Ok(names)
    }

    /// Whether a certificate may name `name` (not a cluster-internal name: those are checked
    /// by [`san_problems`]).
    pub fn allows(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if LOOPBACK_NAMES.contains(&name.as_str()) {
            return true;
        }
        let ip = name.parse::<IpAddr>().ok();
        self.allowed.iter().any(|allowed| match allowed {
            Allowed::Any => true,
            Allowed::Exact(exact) => match (ip, exact.parse::<IpAddr>()) {
                (Some(ip), Ok(other)) => ip == other,
                _ => *exact == name,
            },
            Allowed::Subdomains(suffix) => {
                ip.is_none()
                    && name
                        .strip_suffix(suffix.as_str())
                        .is_some_and(|head| !head.is_empty())
            }
            Allowed::Range(net, bits) => ip.is_some_and(|ip| in_range(ip, *net, *bits)),
        })
    }

    /// How the hub's names read in an error message.
    fn describe(&self) -> String {
        if self.allowed.is_empty() {
            return "none besides loopback".to_owned();
        }
        self.allowed
            .iter()
            .map(|a| match a {
                Allowed::Exact(name) => name.clone(),
                Allowed::Subdomains(suffix) => format!("*{suffix}"),
                Allowed::Range(net, bits) => format!("{net}/{bits}"),
                Allowed::Any => "*".to_owned(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn parse_allowed(pattern: &str) -> Result<Allowed, BadSuperLinkName> {
    let bad = || BadSuperLinkName(pattern.to_owned());
    let p = pattern.trim().trim_end_matches('.').to_ascii_lowercase();
    if p == "*" {
        return Ok(Allowed::Any);
    }
    if let Some((net, bits)) = p.split_once('/') {
        let net: IpAddr = net.parse().map_err(|_| bad())?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let bits: u8 = bits.parse().ok().filter(|b| *b <= max).ok_or_else(bad)?;
        return Ok(Allowed::Range(net, bits));
    }
    if p.parse::<IpAddr>().is_ok() {
        return Ok(Allowed::Exact(p));
    }
    let (wildcard, domain) = match p.strip_prefix("*.") {
        Some(domain) => (true, domain),
        None => (false, p.as_str()),
    };
    let dns = !domain.is_empty()
        && domain.len() <= 253
        && domain.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    // A wildcard over a top-level domain (`*.com`) or over cluster DNS would cover every
    // Federation's in-cluster names; those are never the admin's to hand out.
    if !dns || (wildcard && !domain.contains('.')) || cluster_internal(domain) {
        return Err(bad());
    }
    Ok(if wildcard {
        Allowed::Subdomains(format!(".{domain}"))
    } else {
        Allowed::Exact(domain.to_owned())
    })
}

fn in_range(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    let (ip, net, width) = match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => (u32::from(a) as u128, u32::from(n) as u128, 32u32),
        (IpAddr::V6(a), IpAddr::V6(n)) => (u128::from(a), u128::from(n), 128u32),
        _ => return false,
    };
    let shift = width - u32::from(bits);
    shift >= width || (ip >> shift) == (net >> shift)
}

/// A name only the cluster's DNS resolves: a single label, or under `.svc` or `.cluster.local`.
fn cluster_internal(name: &str) -> bool {
    name.parse::<IpAddr>().is_err()
        && (!name.contains('.')
            || name.ends_with(".svc")
            || name.contains(".svc.")
            || name == "cluster.local"
            || name.ends_with(".cluster.local"))
}

/// The names `fed` asks for that the hub may not issue, as `(field path, message)`: each names
/// the field and both fixes. Empty when the hub does not issue the Federation's certificate
/// (`insecure`, or `spec.tls.secretName`).
pub fn san_problems(fed: &Federation, names: &SuperLinkNames) -> Vec<(String, String)> {
    let tls = fed.spec.tls.as_ref();
    if fed.spec.insecure || tls.and_then(|t| t.secret_name.as_ref()).is_some() {
        return Vec::new();
    }
    let own = in_cluster_names(fed);
    let mut asked: Vec<(String, String)> = Vec::new();
    if let Some(address) = fed.spec.superlink.external_address.as_deref() {
        asked.push((
            "spec.superlink.externalAddress".to_owned(),
            host_of(address).to_owned(),
        ));
    }
    for (i, san) in tls
        .map(|t| t.extra_sans.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        asked.push((format!("spec.tls.extraSANs[{i}]"), san.clone()));
    }
    asked
        .into_iter()
        .filter_map(|(field, name)| {
            let lower = name.trim_end_matches('.').to_ascii_lowercase();
            if own.contains(&lower) || LOOPBACK_NAMES.contains(&lower.as_str()) {
                return None;
            }
            let message = if cluster_internal(&lower) {
                format!(
                    "{name:?} is a cluster-internal name that is not this Federation's own \
                     SuperLink Service ({}): the hub issues a certificate for another Service's \
                     name to nobody; remove it",
                    own[..4.min(own.len())].join(", ")
                )
            } else if names.allows(&lower) {
                return None;
            } else {
                format!(
                    "{name:?} is not one of the hub's names ({}): the hub signs SuperLink \
                     certificates that every Federation's SuperNodes trust, so it issues only for \
                     names its admin allows; use one of those, or ask the hub admin to allow it \
                     (`flower-hub serve --superlink-name {lower}`, Helm `hub.superlinkNames`)",
                    names.describe()
                )
            };
            Some((field, message))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(extra: &str) -> Federation {
        let yaml = format!(
            "metadata: {{name: demo, namespace: team}}\nspec: {{mode: StatefulSet, isolationMode: subprocess, insecure: false, superlink: {{image: \"flwr/superlink:1.42.0\", externalAddress: \"flower.example.org:30092\"}}, tls: {{extraSANs: [{extra}]}}, supernodes: {{image: \"flwr/supernode:1.42.0\", pools: []}}}}"
        );
        let value: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        serde_json::from_value(value).unwrap()
    }

    fn names(own: &[&str], allowed: &[&str]) -> SuperLinkNames {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        SuperLinkNames::new(own.iter().copied(), &allowed).unwrap()
    }

    #[test]
    fn patterns_match_what_they_say() {
        let n = names(
            &["hub.example.org:7443", "198.18.0.1"],
            &[
                "*.flower.example.org",
                "198.19.0.0/16",
                "fd00::/8",
                "edge-1.example.net",
            ],
        );
        for ok in [
            "hub.example.org",
            "HUB.example.org.",
            "198.18.0.1",
            "a.flower.example.org",
            "a.b.flower.example.org",
            "198.19.200.3",
            "fd00::7",
            "edge-1.example.net",
            "localhost",
            "127.0.0.1",
        ] {
            assert!(n.allows(ok), "{ok} should be allowed");
        }
        for refused in [
            "flower.example.org",
            "xflower.example.org",
            "evil.example.org",
            "198.18.0.2",
            "198.20.0.1",
            "fe80::1",
            "example.net",
        ] {
            assert!(!n.allows(refused), "{refused} should be refused");
        }
        assert!(names(&[], &["*"]).allows("anything.example"));
    }

    #[test]
    fn bad_patterns_are_refused_naming_the_value() {
        for bad in [
            "*.com",
            "*.svc",
            "*.team.svc",
            "*.cluster.local",
            "a..b",
            "198.18.0.0/33",
            "under_score.example",
            "-a.example",
        ] {
            let err = SuperLinkNames::new([], &[bad.to_owned()]).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn a_federation_gets_only_the_hubs_names_and_its_own() {
        let hub = names(&["hub.example.org"], &["*.flower.example.org"]);
        // Its own Service names and loopback are always fine.
        let own = fed("demo-superlink.team.svc, demo-superlink-control, localhost");
        let problems = san_problems(&own, &names(&[], &["flower.example.org"]));
        assert!(problems.is_empty(), "{problems:?}");
        // Another Federation's Service name: refused even when everything is allowed.
        let other = fed("other-superlink.other.svc.cluster.local");
        for hub in [&hub, &names(&[], &["*"])] {
            let problems = san_problems(&other, hub);
            let (_, message) = problems
                .iter()
                .find(|(field, _)| field == "spec.tls.extraSANs[0]")
                .expect("the other Federation's name is refused");
            assert!(message.contains("cluster-internal"), "{message}");
        }
        // A name the hub does not have: the field, the hub's names and the flag are named.
        let problems = san_problems(&fed("bank.example.com"), &hub);
        let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            ["spec.superlink.externalAddress", "spec.tls.extraSANs[0]"]
        );
        assert!(
            problems[1]
                .1
                .contains("hub.example.org, *.flower.example.org")
        );
        assert!(problems[1].1.contains("--superlink-name bank.example.com"));
        // Allowed by the admin: nothing to say.
        let hub = names(&["flower.example.org"], &["bank.example.com"]);
        assert!(san_problems(&fed("bank.example.com"), &hub).is_empty());
    }

    #[test]
    fn no_check_when_the_hub_does_not_issue() {
        let mut f = fed("bank.example.com");
        f.spec.insecure = true;
        assert!(san_problems(&f, &SuperLinkNames::default()).is_empty());
        let mut f = fed("bank.example.com");
        f.spec.tls.as_mut().unwrap().secret_name = Some("mine".into());
        assert!(san_problems(&f, &SuperLinkNames::default()).is_empty());
    }
}

//! Where the hub may download a FAB from. A FlowerRun's `spec.app.fab.url` is written by whoever
//! may create FlowerRuns, and the hub fetches it from inside the hub cluster (or the hub
//! machine): left open, that is a port scanner and a key to the cloud's metadata service. So by
//! default only public addresses are dialled; loopback, link-local (169.254.169.254 among them),
//! private, shared, special-purpose ranges and the Kubernetes API server are refused, each by
//! a named rule. The check is on the address the hub actually connects to, at every redirect,
//! so a DNS answer that changes between a check and the connection cannot slip through. The
//! hub's admin opens ranges or host names with `flower-hub serve --fab-url-allow`.
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An address range, `address/prefix`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    address: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is in the range (an IPv4 range holds IPv4-mapped IPv6 addresses too).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.address, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (address, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let address: IpAddr = address
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or CIDR range"))?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
            None => max,
        };
        Ok(Self {
            address: canonical(address),
            prefix,
        })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// An IPv4-mapped or NAT64 (64:ff9b::/96) IPv6 address as the IPv4 address it carries.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let bits = u128::from(v6);
            if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 {
                return IpAddr::V4(Ipv4Addr::from(bits as u32));
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
    }
}

/// What the hub's admin allows beyond public addresses, and what it refuses besides the
/// built-in rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Egress {
    /// Ranges allowed whatever rule they fall under.
    allowed_ranges: Vec<Cidr>,
    /// Host names (as written in URLs, lower case) allowed whatever they resolve to.
    allowed_hosts: BTreeSet<String>,
    /// More ranges refused: `(range, rule)` (the Kubernetes API server's addresses).
    refused: Vec<(Cidr, &'static str)>,
}

/// The rule that refuses the Kubernetes API server's own addresses.
pub const API_SERVER_RULE: &str = "the Kubernetes API server";

impl Egress {
    /// The default with `allow` opened: each entry an IP address, a CIDR range or a host name
    /// (`flower-hub serve --fab-url-allow`).
    pub fn allowing(allow: &[String]) -> Result<Self, String> {
        let mut egress = Self::default();
        for entry in allow.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            let looks_numeric = entry.contains('/')
                || entry.contains(':')
                || entry.bytes().all(|b| b.is_ascii_digit() || b == b'.');
            if looks_numeric {
                egress
                    .allowed_ranges
                    .push(entry.parse().map_err(|e| format!("--fab-url-allow {e}"))?);
            } else if entry
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            {
                egress.allowed_hosts.insert(entry.to_ascii_lowercase());
            } else {
                return Err(format!(
                    "--fab-url-allow {entry:?}: give an IP address, a CIDR range (10.1.0.0/16) or a host name (fabs.example.org)"
                ));
            }
        }
        Ok(egress)
    }

    /// Also refuses `address` by [`API_SERVER_RULE`] (unless allowed by name or range).
    pub fn refusing_api_server(mut self, address: IpAddr) -> Self {
        let prefix = if address.is_ipv4() { 32 } else { 128 };
        self.refused.push((
            Cidr {
                address: canonical(address),
                prefix,
            },
            API_SERVER_RULE,
        ));
        self
    }

    /// `Ok` when the hub may connect to `ip` for a URL naming `host`, else the rule that refuses
    /// it.
    pub fn check(&self, host: &str, ip: IpAddr) -> Result<(), &'static str> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if self.allowed_hosts.contains(&host) || self.allowed_ranges.iter().any(|r| r.contains(ip))
        {
            return Ok(());
        }
        if let Some((_, rule)) = self.refused.iter().find(|(r, _)| r.contains(ip)) {
            return Err(rule);
        }
        match canonical(ip) {
            IpAddr::V4(v4) => v4_rule(v4),
            IpAddr::V6(v6) => v6_rule(v6),
        }
        .map_or(Ok(()), Err)
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

/// The built-in rule an IPv4 address falls under (IANA's special-purpose registry).
fn v4_rule(ip: Ipv4Addr) -> Option<&'static str> {
    if ip.is_loopback() {
        Some("loopback addresses")
    } else if ip.is_link_local() {
        Some("link-local addresses (cloud metadata services)")
    } else if ip.is_private() {
        Some("private addresses")
    } else if in_v4(ip, [100, 64, 0, 0], 10) {
        Some("shared addresses (carrier-grade NAT)")
    } else if ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || in_v4(ip, [0, 0, 0, 0], 8)
        || in_v4(ip, [192, 0, 0, 0], 24)
        || in_v4(ip, [198, 18, 0, 0], 15)
        || in_v4(ip, [240, 0, 0, 0], 4)
    {
        Some("special-purpose addresses")
    } else {
        None
    }
}

/// The built-in rule an IPv6 address falls under.
fn v6_rule(ip: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(ip);
    let top = |prefix: u32, net: u128| bits >> (128 - prefix) == net >> (128 - prefix);
    if ip.is_loopback() {
        Some("loopback addresses")
    } else if top(10, 0xfe80 << 112) {
        Some("link-local addresses (cloud metadata services)")
    } else if top(7, 0xfc00 << 112) {
        Some("private addresses")
    } else if ip.is_unspecified() || ip.is_multicast() || top(32, 0x2001_0db8 << 96) {
        Some("special-purpose addresses")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn by_default_only_public_addresses_pass_each_refusal_naming_its_rule() {
        // Invariant: loopback, link-local (metadata), private, shared, special-purpose ranges
        // are refused in both families and through IPv4-mapped and NAT64 forms; public ones pass.
        let egress = Egress::default();
        for (address, rule) in [
            ("127.0.0.1", "loopback"),
            ("127.9.9.9", "loopback"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("169.254.169.254", "link-local"),
            ("fe80::1", "link-local"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("10.0.0.1", "private"),
            ("172.16.5.4", "private"),
            ("192.168.1.1", "private"),
            ("fd00::1", "private"),
            ("100.64.0.1", "shared"),
            ("0.0.0.0", "special"),
            ("198.18.0.10", "special"),
            ("224.0.0.1", "special"),
            ("255.255.255.255", "special"),
            ("::", "special"),
        ] {
            let refused = egress.check("h", ip(address)).unwrap_err();
            assert!(refused.contains(rule), "{address}: {refused}");
        }
        for public in ["93.184.215.14", "2606:4700::1", "::ffff:8.8.8.8"] {
            assert_eq!(egress.check("h", ip(public)), Ok(()), "{public}");
        }
    }

    #[test]
    fn the_admin_opens_ranges_and_host_names_and_the_api_server_stays_shut() {
        // Invariant: an allowed range or host name passes whatever rule it falls under; the API
        // server is refused by its own rule even when public, unless allowed by name or range.
        let egress = Egress::allowing(&["10.1.0.0/16".into(), "FABS.internal".into()])
            .unwrap()
            .refusing_api_server(ip("34.1.2.3"));
        assert_eq!(egress.check("x", ip("10.1.200.7")), Ok(()));
        assert!(egress.check("x", ip("10.2.0.1")).is_err());
        assert_eq!(egress.check("fabs.internal.", ip("127.0.0.1")), Ok(()));
        assert_eq!(egress.check("x", ip("34.1.2.3")), Err(API_SERVER_RULE));
        for bad in ["10.0.0.0/33", "fab s", "http://x"] {
            assert!(Egress::allowing(&[bad.into()]).is_err(), "{bad}");
        }
        assert_eq!(
            "127.0.0.1".parse::<Cidr>().unwrap().to_string(),
            "127.0.0.1/32"
        );
    }
}

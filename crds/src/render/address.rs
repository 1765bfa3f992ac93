//! Addresses as users write them: `host`, `host:port`, `[v6]:port` or a bare IPv6 address.

/// The host of `host[:port]`, `[v6][:port]` or a bare IPv6 address.
pub fn host_of(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(host, _)| host);
    }
    match address.matches(':').count() {
        1 => address.split_once(':').map_or(address, |(host, _)| host),
        _ => address,
    }
}

/// `host` → `host:port`, `[v6]` → `[v6]:port`, bare `v6` → `[v6]:port`; addresses with a port
/// are kept.
pub fn with_default_port(address: &str, port: i32) -> String {
    if let Some(rest) = address.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((_, after)) if after.starts_with(':') => address.to_owned(),
            _ => format!("{address}:{port}"),
        };
    }
    match address.matches(':').count() {
        0 => format!("{address}:{port}"),
        1 => address.to_owned(),
        _ => format!("[{address}]:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_address_gets_the_fleet_port_only_when_it_has_none() {
        // Spokes must dial a real port: the user's, else the Service's Fleet port.
        assert_eq!(with_default_port("hub.example", 9092), "hub.example:9092");
        assert_eq!(with_default_port("10.0.0.1:30092", 9092), "10.0.0.1:30092");
        assert_eq!(with_default_port("[::1]:30092", 9092), "[::1]:30092");
        assert_eq!(with_default_port("[::1]", 9092), "[::1]:9092");
        assert_eq!(with_default_port("fd00::1", 9092), "[fd00::1]:9092");
    }

    #[test]
    fn host_of_addresses() {
        // The certificate names hosts, never host:port.
        assert_eq!(host_of("hub.example:30092"), "hub.example");
        assert_eq!(host_of("hub.example"), "hub.example");
        assert_eq!(host_of("[fd00::1]:30092"), "fd00::1");
        assert_eq!(host_of("fd00::1"), "fd00::1");
    }
}

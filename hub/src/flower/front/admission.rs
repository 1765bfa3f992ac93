//! Which connections the front takes: per-address caps, the global cap, and its reserve for
//! known addresses (see the [module doc](super)).
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::limits::{FrontLimits, KNOWN_ADDRESSES_MAX, KNOWN_FOR};

/// What the front counts connections by: an IPv4 address, or the /64 prefix of an IPv6 address
/// (one host usually holds a whole /64, so a finer key would be no cap at all). An IPv4-mapped
/// IPv6 address (`::ffff:a.b.c.d`, how a dual-stack listener sees IPv4 clients) is its IPv4
/// address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerKey {
    /// An IPv4 address.
    V4(Ipv4Addr),
    /// The first 64 bits of an IPv6 address.
    V6Prefix(u64),
}

impl PeerKey {
    /// The key of a peer address.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::V4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::V4(v4),
                None => Self::V6Prefix((v6.to_bits() >> 64) as u64),
            },
        }
    }
}

impl std::fmt::Display for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::V4(v4) => v4.fmt(f),
            Self::V6Prefix(prefix) => {
                write!(
                    f,
                    "{}/64",
                    std::net::Ipv6Addr::from_bits(u128::from(*prefix) << 64)
                )
            }
        }
    }
}

/// Why a connection was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Its address holds its cap of connections already.
    AddressFull,
    /// Its address is not known and the share open to everyone is taken.
    SharedFull,
}

/// The connections open and the addresses known, shared by the accept loop and the connections.
#[derive(Debug)]
pub(super) struct Admission {
    max: usize,
    shared_max: usize,
    per_address: usize,
    per_known_address: usize,
    state: Mutex<State>,
    freed: Notify,
}

#[derive(Debug, Default)]
struct State {
    open: usize,
    /// Open connections taken by addresses that were not known: only these count against the
    /// shared share.
    open_unknown: usize,
    per_key: HashMap<PeerKey, usize>,
    /// When the SuperLink last answered a Fleet request of each known address with a 2xx.
    known: HashMap<PeerKey, Instant>,
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub(super) struct Slot {
    admission: Arc<Admission>,
    key: PeerKey,
    unknown: bool,
}

// === impl Admission ===

impl Admission {
    pub(super) fn new(limits: &FrontLimits) -> Self {
        Self {
            max: limits.max_connections,
            shared_max: limits
                .max_connections
                .saturating_sub(limits.reserved_connections),
            per_address: limits.max_connections_per_address,
            per_known_address: limits.max_connections_per_known_address,
            state: Mutex::default(),
            freed: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every update is a few integer and map operations that leave the state consistent, so
        // a panic elsewhere cannot have left it half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a place for a connection from `key`, or says why not.
    pub(super) fn admit(self: &Arc<Self>, key: PeerKey) -> Result<Slot, Refusal> {
        let mut state = self.state();
        let known = state.is_known(key, Instant::now());
        let cap = if known {
            self.per_known_address
        } else {
            self.per_address
        };
        let from_key = state.per_key.get(&key).copied().unwrap_or(0);
        if from_key >= cap {
            return Err(Refusal::AddressFull);
        }
        // The accept loop waits while all `max` are open, but the last place may go between.
        if state.open >= self.max || (!known && state.open_unknown >= self.shared_max) {
            return Err(Refusal::SharedFull);
        }
        state.open += 1;
        if !known {
            state.open_unknown += 1;
        }
        *state.per_key.entry(key).or_default() += 1;
        Ok(Slot {
            admission: self.clone(),
            key,
            unknown: !known,
        })
    }

    /// Whether every place is taken (no one could be admitted).
    pub(super) fn is_full(&self) -> bool {
        self.state().open >= self.max
    }

    /// Completes once a place was freed since the last call (or at once if one was freed
    /// while nobody waited).
    pub(super) async fn freed(&self) {
        self.freed.notified().await;
    }

    /// Records that the SuperLink answered a Fleet request from `key` with a 2xx.
    pub(super) fn mark_known(&self, key: PeerKey) {
        let now = Instant::now();
        let mut state = self.state();
        state.known.insert(key, now);
        if state.known.len() > KNOWN_ADDRESSES_MAX {
            state
                .known
                .retain(|_, at| now.saturating_duration_since(*at) < KNOWN_FOR);
            if state.known.len() > KNOWN_ADDRESSES_MAX
                && let Some(oldest) = state
                    .known
                    .iter()
                    .min_by_key(|(_, at)| **at)
                    .map(|(k, _)| *k)
            {
                state.known.remove(&oldest);
            }
        }
    }

    /// Open connections in all and from `key` (for tests and logs).
    #[cfg(test)]
    fn open(&self, key: PeerKey) -> (usize, usize) {
        let state = self.state();
        (state.open, state.per_key.get(&key).copied().unwrap_or(0))
    }
}

impl State {
    fn is_known(&self, key: PeerKey, now: Instant) -> bool {
        self.known
            .get(&key)
            .is_some_and(|at| now.saturating_duration_since(*at) < KNOWN_FOR)
    }
}

// === impl Slot ===

impl Slot {
    /// The address the connection came from.
    pub(super) fn key(&self) -> PeerKey {
        self.key
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut state = self.admission.state();
            state.open -= 1;
            if self.unknown {
                state.open_unknown -= 1;
            }
            if let Some(n) = state.per_key.get_mut(&self.key) {
                *n -= 1;
                if *n == 0 {
                    state.per_key.remove(&self.key);
                }
            }
        }
        self.admission.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;
    use std::time::Duration;

    fn key(ip: &str) -> PeerKey {
        PeerKey::of(ip.parse().unwrap())
    }

    fn admission(max: usize, reserved: usize, per_address: usize) -> Arc<Admission> {
        Arc::new(Admission::new(&FrontLimits {
            max_connections: max,
            reserved_connections: reserved,
            max_connections_per_address: per_address,
            max_connections_per_known_address: per_address * 2,
            ..FrontLimits::default()
        }))
    }

    #[test]
    fn ipv4_addresses_are_keyed_exactly() {
        // Two IPv4 hosts never share a cap, and one host is one key.
        assert_eq!(key("192.0.2.1"), key("192.0.2.1"));
        assert_ne!(key("192.0.2.1"), key("192.0.2.2"));
        assert_eq!(key("192.0.2.1").to_string(), "192.0.2.1");
    }

    #[test]
    fn ipv6_addresses_are_keyed_by_their_64_prefix() {
        // Every address of one /64 is one key, so a host cannot evade the cap by rotating
        // through its /64; the next /64 is another key.
        let a = key("2001:db8:1:2::1");
        assert_eq!(a, key("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        assert_eq!(a, key("2001:db8:1:2:1234:5678:9abc:def0"));
        assert_ne!(a, key("2001:db8:1:3::1"));
        assert_ne!(a, key("2001:db8:1:1:ffff:ffff:ffff:ffff"));
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        assert_eq!(key("::1").to_string(), "::/64");
    }

    #[test]
    fn ipv4_mapped_ipv6_is_its_ipv4_address() {
        // A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d: each is still its own key,
        // the same as on an IPv4 listener.
        let mapped = IpAddr::V6(Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped());
        assert_eq!(PeerKey::of(mapped), key("192.0.2.1"));
        assert_ne!(
            PeerKey::of(IpAddr::V6(Ipv4Addr::new(192, 0, 2, 2).to_ipv6_mapped())),
            key("192.0.2.1")
        );
        assert_eq!(key("::ffff:192.0.2.1"), key("192.0.2.1"));
        // Not mapped: the IPv4-compatible form and NAT64 are IPv6 prefixes.
        assert!(matches!(
            PeerKey::of(IpAddr::V6(Ipv6Addr::new(
                0x64, 0xff9b, 0, 0, 0, 0, 0xc000, 0x201
            ))),
            PeerKey::V6Prefix(_)
        ));
    }

    #[test]
    fn an_address_gets_its_cap_and_no_more() {
        // The cap counts per key; another key is not affected, and a freed place is reusable.
        let admission = admission(100, 0, 2);
        let a = key("192.0.2.1");
        let first = admission.admit(a).unwrap();
        let _second = admission.admit(key("192.0.2.1")).unwrap();
        assert_eq!(admission.admit(a).unwrap_err(), Refusal::AddressFull);
        let _other = admission.admit(key("192.0.2.2")).unwrap();
        assert_eq!(admission.open(a), (3, 2));
        drop(first);
        assert_eq!(admission.open(a), (2, 1));
        let _again = admission.admit(a).unwrap();
    }

    #[test]
    fn one_ipv6_64_shares_one_cap() {
        // Rotating through the addresses of a /64 does not multiply the cap.
        let admission = admission(100, 0, 2);
        let _a = admission.admit(key("2001:db8::1")).unwrap();
        let _b = admission.admit(key("2001:db8::2")).unwrap();
        assert_eq!(
            admission.admit(key("2001:db8::3")).unwrap_err(),
            Refusal::AddressFull
        );
        let _c = admission.admit(key("2001:db8:0:1::3")).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_reserve_is_for_known_addresses_only() {
        // Unknown addresses get max - reserved places; a known address gets the rest, and a
        // known address has the larger per-address cap.
        let admission = admission(4, 2, 1);
        let flood: Vec<_> = (1..=2)
            .map(|i| admission.admit(key(&format!("198.51.100.{i}"))).unwrap())
            .collect();
        assert_eq!(
            admission.admit(key("198.51.100.3")).unwrap_err(),
            Refusal::SharedFull
        );
        let node = key("192.0.2.7");
        assert_eq!(admission.admit(node).unwrap_err(), Refusal::SharedFull);
        admission.mark_known(node);
        let _n1 = admission.admit(node).unwrap();
        let _n2 = admission.admit(node).unwrap();
        assert!(admission.is_full());
        assert_eq!(admission.admit(node).unwrap_err(), Refusal::AddressFull);
        drop(flood);
        assert!(!admission.is_full());
        // Known for KNOWN_FOR only.
        tokio::time::advance(KNOWN_FOR + Duration::from_secs(1)).await;
        drop(_n2);
        assert_eq!(admission.admit(node).unwrap_err(), Refusal::AddressFull);
    }

    #[test]
    fn known_addresses_are_bounded() {
        // A stream of successful addresses cannot grow the memory without bound.
        let admission = admission(10, 1, 1);
        for i in 0..(KNOWN_ADDRESSES_MAX as u32 + 10) {
            admission.mark_known(PeerKey::V4(Ipv4Addr::from_bits(i)));
        }
        assert_eq!(admission.state().known.len(), KNOWN_ADDRESSES_MAX);
    }
}

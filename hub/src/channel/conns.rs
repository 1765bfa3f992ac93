//! Bounds on the work channel's connections, so a flood cannot exhaust the hub's file
//! descriptors or memory while agents keep being served.
//!
//! A new TCP connection holds a *handshake* slot until its TLS handshake ends (at most
//! `handshake_timeout`, and [`ConnLimits::first_byte_timeout`] when it sends nothing);
//! handshakes are capped overall ([`ConnLimits::max_handshakes`]). After
//! it, a connection with a client certificate signed by the hub CA counts against its cluster
//! ([`ConnLimits::max_per_cluster`]): only holders of hub-signed certificates get there, so their
//! number is bounded by the accepted clusters. One without a certificate (a joining agent, or
//! anyone) is *anonymous*: capped overall ([`ConnLimits::max_anonymous`]) and closed after
//! [`ConnLimits::anonymous_lifetime`] (a Join takes well under a second; an agent whose Join is
//! cut short retries on a new connection). Handshaking and anonymous connections together are
//! capped per peer address, an IPv6 one by its /64 ([`ConnLimits::max_anonymous_per_peer`]), so one address cannot fill
//! the pools that other joining agents need. A connection over a cap is closed at once.
//!
//! A few addresses together can still fill a pool (17 × 64 > 1,024). So the last
//! [`ConnLimits::reserve`] places of each pool (handshakes and anonymous connections) go only to
//! addresses holding at most [`ConnLimits::light_peer`] connections: a joining agent, which
//! opens one, gets through whatever a handful of flooding addresses hold.
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;

use crate::flower::front::PeerKey;

/// The caps (see the module doc). [`ConnLimits::default`] gives the documented defaults.
#[derive(Clone, Debug)]
pub struct ConnLimits {
    /// TLS handshakes in progress at once (default 4,096).
    pub max_handshakes: usize,
    /// How soon a new connection must send its first byte (the TLS ClientHello, which real
    /// clients send at once) before it is closed (default 2 s), so silent connections hold a
    /// handshake slot only that long.
    pub first_byte_timeout: Duration,
    /// Anonymous connections at once, all peers together (default 1,024).
    pub max_anonymous: usize,
    /// Handshaking and anonymous connections at once from one peer address (default 64).
    pub max_anonymous_per_peer: usize,
    /// How long an anonymous connection may stay open (default 30 s).
    pub anonymous_lifetime: Duration,
    /// Connections at once with the certificate of one cluster (default 4).
    pub max_per_cluster: usize,
    /// The places at the end of the handshake and anonymous pools kept for addresses holding
    /// at most [`Self::light_peer`] connections (default 256).
    pub reserve: usize,
    /// How many handshaking and anonymous connections an address may hold and still use the
    /// reserve (default 4, this one included).
    pub light_peer: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            max_handshakes: 4096,
            first_byte_timeout: Duration::from_secs(2),
            max_anonymous: 1024,
            max_anonymous_per_peer: 64,
            anonymous_lifetime: Duration::from_secs(30),
            max_per_cluster: 4,
            reserve: 256,
            light_peer: 4,
        }
    }
}

/// The counts behind the caps.
#[derive(Debug)]
pub(crate) struct Gate {
    limits: ConnLimits,
    handshakes: AtomicUsize,
    anonymous: AtomicUsize,
    /// Keyed by address, IPv6 by its /64 (one host usually holds a whole /64).
    per_peer: DashMap<PeerKey, usize>,
    per_cluster: DashMap<String, usize>,
}

/// A connection's place under the caps, given back when it is dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    gate: Arc<Gate>,
    holder: Holder,
}

#[derive(Debug)]
enum Holder {
    Handshake(PeerKey),
    Anonymous(PeerKey),
    Cluster(String),
}

/// Takes one from `counter` unless it is at `max`, or at `max - reserve` for a peer that is not
/// `light`.
fn take(counter: &AtomicUsize, max: usize, reserve: usize, light: bool) -> bool {
    let cap = if light {
        max
    } else {
        max.saturating_sub(reserve)
    };
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < cap).then_some(n + 1)
        })
        .is_ok()
}

impl Gate {
    /// A gate enforcing `limits`.
    pub(crate) fn new(limits: ConnLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            handshakes: AtomicUsize::new(0),
            anonymous: AtomicUsize::new(0),
            per_peer: DashMap::new(),
            per_cluster: DashMap::new(),
        })
    }

    /// The caps.
    pub(crate) fn limits(&self) -> &ConnLimits {
        &self.limits
    }

    /// A handshake slot for a new connection from `peer`, or `None` when a cap is reached.
    pub(crate) fn accept(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        let peer = PeerKey::of(peer);
        let mut count = self.per_peer.entry(peer).or_insert(0);
        if *count >= self.limits.max_anonymous_per_peer {
            return None;
        }
        let light = *count < self.limits.light_peer;
        if !take(
            &self.handshakes,
            self.limits.max_handshakes,
            self.limits.reserve,
            light,
        ) {
            return None;
        }
        *count += 1;
        Some(Slot {
            gate: self.clone(),
            holder: Holder::Handshake(peer),
        })
    }

    /// The slot of a connection whose handshake ended: its cluster's when it showed the
    /// certificate of `cluster`, else an anonymous one; `None` when that cap is reached.
    pub(crate) fn settle(self: &Arc<Self>, mut slot: Slot, cluster: Option<&str>) -> Option<Slot> {
        let Holder::Handshake(peer) = slot.holder else {
            return Some(slot);
        };
        match cluster {
            Some(name) => {
                let mut count = self.per_cluster.entry(name.to_owned()).or_insert(0);
                if *count >= self.limits.max_per_cluster {
                    return None;
                }
                *count += 1;
                drop(count);
                Some(Slot {
                    gate: self.clone(),
                    holder: Holder::Cluster(name.to_owned()),
                })
            }
            None => {
                let light = self
                    .per_peer
                    .get(&peer)
                    .is_none_or(|n| *n <= self.limits.light_peer);
                if !take(
                    &self.anonymous,
                    self.limits.max_anonymous,
                    self.limits.reserve,
                    light,
                ) {
                    return None;
                }
                self.handshakes.fetch_sub(1, Ordering::SeqCst);
                slot.holder = Holder::Anonymous(peer);
                Some(slot)
            }
        }
    }

    /// Anonymous connections open now.
    pub(crate) fn anonymous_open(&self) -> usize {
        self.anonymous.load(Ordering::SeqCst)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let gate = &self.gate;
        let peer = match &self.holder {
            Holder::Handshake(peer) => {
                gate.handshakes.fetch_sub(1, Ordering::SeqCst);
                peer
            }
            Holder::Anonymous(peer) => {
                gate.anonymous.fetch_sub(1, Ordering::SeqCst);
                peer
            }
            Holder::Cluster(name) => {
                gate.per_cluster.remove_if_mut(name, |_, n| {
                    *n = n.saturating_sub(1);
                    *n == 0
                });
                return;
            }
        };
        gate.per_peer.remove_if_mut(peer, |_, n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_hold_and_slots_are_given_back() {
        let gate = Gate::new(ConnLimits {
            max_handshakes: 4,
            max_anonymous: 2,
            max_anonymous_per_peer: 2,
            max_per_cluster: 1,
            ..ConnLimits::default()
        });
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let c: IpAddr = "127.0.0.4".parse().unwrap();
        let a1 = gate.accept(a).expect("a1");
        let a2 = gate.accept(a).expect("a2");
        assert!(gate.accept(a).is_none(), "per peer");
        let b1 = gate.accept(b).expect("b1");
        let c1 = gate.accept(c).expect("c1");
        assert!(gate.accept(c).is_none(), "handshakes overall");
        // Settled anonymous: the handshake slot is free again, the peer's still taken.
        let a1 = gate.settle(a1, None).expect("anonymous a1");
        assert!(gate.accept(a).is_none(), "still per peer");
        let _b1 = gate.settle(b1, None).expect("anonymous b1");
        assert!(gate.settle(a2, None).is_none(), "anonymous overall");
        assert_eq!(gate.anonymous_open(), 2);
        // A certificate moves the connection out of the anonymous pools, even when full.
        let cluster = gate.settle(c1, Some("spoke-1")).expect("cluster");
        let again = gate.accept(c).expect("c's peer slot given back");
        assert!(gate.settle(again, Some("spoke-1")).is_none(), "per cluster");
        drop(cluster);
        drop(a1);
        assert_eq!(gate.anonymous_open(), 1);
        let again = gate.accept(a).expect("a again");
        assert!(gate.settle(again, Some("spoke-1")).is_some());
        assert!(gate.per_cluster.is_empty(), "{:?}", gate.per_cluster);
        assert_eq!(gate.handshakes.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_joining_agent_gets_through_a_flood_from_a_few_addresses() {
        // Invariant: 17 addresses holding 64 connections each (over the anonymous cap of 1,024)
        // cannot take the reserve: a new address still gets a handshake and an anonymous place.
        let gate = Gate::new(ConnLimits::default());
        let mut flood = Vec::new();
        for a in 0..17u8 {
            let ip: IpAddr = format!("127.0.1.{a}").parse().unwrap();
            for _ in 0..64 {
                match gate.accept(ip).and_then(|s| gate.settle(s, None)) {
                    Some(slot) => flood.push(slot),
                    None => break,
                }
            }
        }
        let limits = ConnLimits::default();
        // Past the reserve's edge each flooding address has only its first `light_peer`.
        assert!(
            gate.anonymous_open() <= limits.max_anonymous - limits.reserve + 17 * limits.light_peer,
            "the flood took {} places",
            gate.anonymous_open()
        );
        let joiner: IpAddr = "127.0.2.1".parse().unwrap();
        let slot = gate
            .accept(joiner)
            .expect("a handshake place for the joining agent");
        let slot = gate
            .settle(slot, None)
            .expect("an anonymous place for the joining agent");
        // A flooding address stays out of the reserve.
        assert!(
            gate.accept("127.0.1.16".parse().unwrap())
                .and_then(|s| gate.settle(s, None))
                .is_none()
        );
        drop((slot, flood));
        assert_eq!(gate.anonymous_open(), 0);
    }

    #[test]
    fn one_ipv6_64_is_one_peer() {
        // Addresses of one /64 share the per-peer cap (a host holds the whole /64); another
        // /64, and the IPv4 address behind an IPv4-mapped one, count apart.
        let gate = Gate::new(ConnLimits {
            max_anonymous_per_peer: 2,
            ..ConnLimits::default()
        });
        let first = gate
            .accept("2001:db8:1:2::1".parse().unwrap())
            .expect("1st");
        let second = gate
            .accept("2001:db8:1:2::ffff:9".parse().unwrap())
            .expect("2nd");
        assert!(
            gate.accept("2001:db8:1:2:abcd::7".parse().unwrap())
                .is_none(),
            "same /64"
        );
        let _other = gate
            .accept("2001:db8:1:3::1".parse().unwrap())
            .expect("another /64");
        let _v4 = gate
            .accept("::ffff:127.0.0.9".parse().unwrap())
            .expect("v4");
        let _v4b = gate.accept("127.0.0.9".parse().unwrap()).expect("same v4");
        assert!(
            gate.accept("127.0.0.9".parse().unwrap()).is_none(),
            "mapped = v4"
        );
        drop((first, second));
    }
}

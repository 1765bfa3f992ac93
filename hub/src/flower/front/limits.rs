//! The bounds a Fleet front holds its clients to ([`FrontLimits`]), with defaults a real
//! SuperNode never meets.
use std::time::Duration;

/// Flower's own largest message, the default request-body limit: `GRPC_MAX_MESSAGE_LENGTH =
/// 2_147_483_647` (2 GiB - 1) in `flwr/supercore/grpc.py` of Flower 1.42 (`flwr/common/grpc.py`
/// up to 1.30; it was 536_870_912 up to 1.15, raised by adap/flower#5028 for 1.16, and some
/// docstrings still quote 512 MB), and `MAX_PROTOBUF_STREAM_MESSAGE_LENGTH` in
/// `flwr/supercore/constant.py`. The unified
/// HTTP server sets no body limit of its own: it reads the whole body into memory
/// (`await request.body()`, `flwr/supercore/protobuf/translation.py`). A SuperNode of 1.42 sends
/// model arrays as objects of at most 5 MiB each (`FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE`,
/// `flwr/common/constant.py`), so its requests stay far below this.
pub const FLOWER_MAX_MESSAGE_BYTES: u64 = 2_147_483_647;

/// How long an address stays known after the SuperLink last answered one of its Fleet requests
/// with a 2xx (a live SuperNode sends a heartbeat every 30 s).
pub const KNOWN_FOR: Duration = Duration::from_secs(24 * 3600);

/// How many known addresses the front remembers; past this the oldest is forgotten.
pub const KNOWN_ADDRESSES_MAX: usize = 65_536;

/// The bounds of one front. An address is an IPv4 address or an IPv6 /64 (see
/// [`super::PeerKey`]); it is *known* for [`KNOWN_FOR`] after the SuperLink answered one of its
/// Fleet requests (not `/health`) with a 2xx.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontLimits {
    /// Connections served at once; when all are taken, new ones wait in the listen backlog.
    pub max_connections: usize,
    /// Of `max_connections`, how many only known addresses may take: a flood from new
    /// addresses gets at most `max_connections - reserved_connections`.
    pub reserved_connections: usize,
    /// Connections at once from one address that is not known.
    pub max_connections_per_address: usize,
    /// Connections at once from one known address (many SuperNodes can share one behind NAT).
    pub max_connections_per_known_address: usize,
    /// Largest request body passed to the SuperLink; a larger one is answered `413`.
    pub max_body_bytes: u64,
    /// Time a request body has from its first read to its last byte; then `408`.
    pub body_timeout: Duration,
    /// Longest a request body may go without a byte, and a response without the client taking
    /// a byte of it.
    pub stall_timeout: Duration,
    /// Longest a connection may wait for the complete headers of its next request (also the
    /// time an idle kept-alive connection is kept).
    pub idle_timeout: Duration,
    /// Time a client has for its TLS handshake, and the front for dialling the SuperLink.
    pub handshake_timeout: Duration,
}

impl Default for FrontLimits {
    fn default() -> Self {
        Self {
            max_connections: 16_384,
            reserved_connections: 4_096,
            max_connections_per_address: 64,
            max_connections_per_known_address: 1_024,
            max_body_bytes: FLOWER_MAX_MESSAGE_BYTES,
            // A 5 MiB object at 44 kB/s; Flower's own HTTP client gives up after 30 s without
            // progress (httpx timeout in `flwr/supercore/protobuf/client.py`).
            body_timeout: Duration::from_secs(120),
            stall_timeout: Duration::from_secs(30),
            // Flower's client drops idle connections after 5 s (httpx's keep-alive expiry).
            idle_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// Limits a front cannot run with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LimitsError {
    /// The reserve leaves no connection for an address to become known through.
    #[error(
        "reserved connections ({reserved}) must be fewer than max connections ({max}): new SuperNodes need a share to connect through"
    )]
    ReserveTooLarge {
        /// The reserve asked for.
        reserved: usize,
        /// The global cap.
        max: usize,
    },
    /// A cap or timeout of zero would refuse everyone.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
}

impl FrontLimits {
    /// Checks the limits leave SuperNodes a way in.
    pub fn check(&self) -> Result<(), LimitsError> {
        for (name, value) in [
            ("max connections", self.max_connections),
            (
                "max connections per address",
                self.max_connections_per_address,
            ),
            (
                "max connections per known address",
                self.max_connections_per_known_address,
            ),
        ] {
            if value == 0 {
                return Err(LimitsError::Zero(name));
            }
        }
        for (name, value) in [
            ("body timeout", self.body_timeout),
            ("stall timeout", self.stall_timeout),
            ("idle timeout", self.idle_timeout),
            ("handshake timeout", self.handshake_timeout),
        ] {
            if value.is_zero() {
                return Err(LimitsError::Zero(name));
            }
        }
        if self.reserved_connections >= self.max_connections {
            return Err(LimitsError::ReserveTooLarge {
                reserved: self.reserved_connections,
                max: self.max_connections,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_usable() {
        // The defaults themselves pass the check the CLI applies.
        assert_eq!(FrontLimits::default().check(), Ok(()));
    }

    #[test]
    fn a_reserve_as_large_as_the_cap_is_refused() {
        // New SuperNodes must always have a share to connect through.
        let limits = FrontLimits {
            max_connections: 10,
            reserved_connections: 10,
            ..FrontLimits::default()
        };
        assert_eq!(
            limits.check(),
            Err(LimitsError::ReserveTooLarge {
                reserved: 10,
                max: 10
            })
        );
    }

    #[test]
    fn zero_caps_and_timeouts_are_refused() {
        // A zero would refuse every client (or time every body out at once).
        let limits = FrontLimits {
            max_connections_per_address: 0,
            ..FrontLimits::default()
        };
        assert!(limits.check().is_err());
        let limits = FrontLimits {
            stall_timeout: Duration::ZERO,
            ..FrontLimits::default()
        };
        assert!(limits.check().is_err());
    }
}

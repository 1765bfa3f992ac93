//! Flower argument dialects: which flags and ports a given Flower release understands.
//!
//! Flower's deployment CLI changed between the 1.25-era releases flower-operator targets and the
//! current ones (see `e2e/flower/NOTES.md`): the three fixed gRPC APIs (ServerAppIO 9091, Fleet 9092,
//! Control 9093) and the SuperNode's `--clientappio-api-address` were replaced by one server per
//! component configured with `--host`/`--port`. We render per dialect, chosen from
//! `spec.version` or, when it is unset, from the SuperLink image tag.

use std::fmt;

/// The first Flower release after the classic dialect: the first of
/// [`FlowerDialect::Transitional`] (verified by running the releases, e2e/flower/NOTES.md).
pub const FIRST_TRANSITIONAL_VERSION: FlowerVersion = FlowerVersion::new(1, 35, 0);

/// The first release of [`FlowerDialect::TransitionalHttp`]: the Control API moved to the
/// `--host`/`--port` HTTP server (its gRPC `--control-api-address` is "Deprecated").
pub const FIRST_HTTP_CONTROL_VERSION: FlowerVersion = FlowerVersion::new(1, 37, 0);

/// The first release whose `flower-superexec` takes `--runtime-api-address` (1.35 still had
/// `--appio-api-address`).
pub const FIRST_RUNTIME_API_SUPEREXEC_VERSION: FlowerVersion = FlowerVersion::new(1, 36, 0);

/// The first release whose `flower-superexec` has no `--plugin-type` (it learns the plugin from
/// the Runtime API it dials).
pub const FIRST_SUPEREXEC_WITHOUT_PLUGIN_TYPE_VERSION: FlowerVersion = FlowerVersion::new(1, 38, 0);

/// The first Flower release of the [`FlowerDialect::Unified`] dialect (verified on 1.40.0 and
/// 1.42.0, e2e/flower/NOTES.md).
pub const FIRST_UNIFIED_VERSION: FlowerVersion = FlowerVersion::new(1, 40, 0);

/// The newest Flower release line flower-addon is verified with (`e2e/flower/NOTES.md`, the
/// quickstart matrix of `test.sh`). A later release is rendered in the newest dialect, with a
/// warning ([`FlowerVersion::unverified_warning`]) instead of an error: Flower keeps its flags
/// across releases more often than not, and a user should not wait for us to try it.
pub const NEWEST_VERIFIED_VERSION: FlowerVersion = FlowerVersion::new(1, 42, 0);

/// The first release with `flower-superlink --disable-runtime-dependency-installation` (1.32;
/// 1.29–1.31 only had an opt-in flag and 1.25 never installs; NOTES.md).
pub const FIRST_DISABLE_RUNTIME_DEPS_VERSION: FlowerVersion = FlowerVersion::new(1, 32, 0);

/// Fixed container ports of the classic dialect (flower-operator's constants).
pub mod classic_ports {
    /// ServerAppIO API of the SuperLink (plaintext; the ServerApp SuperExec dials it).
    pub const SERVERAPPIO: i32 = 9091;
    /// Fleet API of the SuperLink (SuperNodes dial it).
    pub const FLEET: i32 = 9092;
    /// Control API of the SuperLink (`flwr run`).
    pub const CONTROL: i32 = 9093;
    /// ClientAppIO API of a SuperNode (its ClientApp SuperExec dials it).
    pub const CLIENTAPPIO: i32 = 9094;
}

/// Container ports of the unified dialect.
pub mod unified_ports {
    /// The SuperLink's single HTTP(S) server (Fleet, Control and Runtime APIs, `GET /health`);
    /// Flower's default `--port`.
    pub const SUPERLINK: i32 = 8000;
    /// A SuperNode's Runtime API (its ClientApp SuperExec dials it); Flower's default `--port`.
    pub const SUPERNODE_RUNTIME: i32 = 9094;
}

/// A Flower release number, `major.minor.patch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlowerVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version (0 when not given).
    pub patch: u32,
}

impl FlowerVersion {
    /// `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Reads `1.42`, `1.42.0`, `v1.42.0` or a tag that starts with one (`1.25.0-py3.11-ubuntu24.04`).
    /// Returns `None` for anything else (`latest`, `nightly`, a digest).
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.strip_prefix('v').unwrap_or(text);
        let mut parts = text.splitn(3, '.');
        let major = leading_number(parts.next()?, true)?;
        let minor = leading_number(parts.next()?, parts.clone().next().is_some())?;
        let patch = match parts.next() {
            Some(rest) => leading_number(rest, false)?,
            None => 0,
        };
        Some(Self {
            major,
            minor,
            patch,
        })
    }
}

impl FlowerVersion {
    /// The warning for a release newer than the [`NEWEST_VERIFIED_VERSION`] line (any patch of
    /// it is verified): which dialect it gets and how to silence it. `None` for verified lines.
    pub fn unverified_warning(self) -> Option<String> {
        let newest = NEWEST_VERIFIED_VERSION;
        ((self.major, self.minor) > (newest.major, newest.minor)).then(|| {
            format!(
                "spec.version: Flower {self} is newer than the newest release flower-addon is verified with ({}.{}.x); it is run with the {} dialect's flags, which may not fit it. Pin spec.version to {newest} if it does not start",
                newest.major,
                newest.minor,
                FlowerDialect::of(self).name()
            )
        })
    }
}

/// Parses the digits at the start of `part`; when `whole` is set the part must be only digits.
fn leading_number(part: &str, whole: bool) -> Option<u32> {
    let end = part
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(part.len());
    if end == 0 || (whole && end != part.len()) {
        return None;
    }
    // A suffix after the version must be separated (`1.25.0-py3.11`, `1.25.0rc1` is not allowed).
    if end != part.len() && !part[end..].starts_with(['-', '+', '_']) {
        return None;
    }
    part[..end].parse().ok()
}

impl fmt::Display for FlowerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The set of command-line flags a Flower release understands (e2e/flower/NOTES.md has each
/// one's verified command lines).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FlowerDialect {
    /// Before 1.35: three fixed gRPC APIs on the SuperLink (ServerAppIO, Fleet, Control),
    /// `--clientappio-api-address` on the SuperNode.
    Classic,
    /// 1.35 and 1.36: the SuperLink's Runtime API (ServerAppIO's successor) on the plain-HTTP
    /// `--host`/`--port` server; Fleet and Control still gRPC on `--fleet-api-address` and
    /// `--control-api-address`. The SuperNode's Runtime API is on `--host`/`--port`.
    Transitional,
    /// 1.37 to 1.39: Control and Runtime APIs on the `--host`/`--port` HTTP(S) server (the
    /// unified dialect's Control API); Fleet still gRPC on `--fleet-api-address`.
    TransitionalHttp,
    /// 1.40 and later: one `--host`/`--port` HTTP(S) server for Fleet, Control and Runtime.
    Unified,
}

impl FlowerDialect {
    /// The dialect of a Flower release (every release has one; releases after the verified
    /// ones get the newest, see [`FlowerVersion::unverified_warning`]).
    pub fn of(version: FlowerVersion) -> Self {
        if version >= FIRST_UNIFIED_VERSION {
            Self::Unified
        } else if version >= FIRST_HTTP_CONTROL_VERSION {
            Self::TransitionalHttp
        } else if version >= FIRST_TRANSITIONAL_VERSION {
            Self::Transitional
        } else {
            Self::Classic
        }
    }

    /// Chooses the dialect from `spec.version`, else from the tag of `image`
    /// (`spec.superlink.image`). An unreadable version is an error that names the field to set.
    pub fn select(
        spec_version: Option<&str>,
        image: &str,
    ) -> Result<(FlowerVersion, Self), DialectError> {
        let version = match spec_version {
            Some(text) => FlowerVersion::parse(text).ok_or_else(|| DialectError::BadVersion {
                value: text.to_owned(),
            })?,
            None => image_tag(image)
                .and_then(FlowerVersion::parse)
                .ok_or_else(|| DialectError::UnknownImageVersion {
                    image: image.to_owned(),
                })?,
        };
        Ok((version, Self::of(version)))
    }

    /// The dialect's name as written in docs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Transitional => "transitional",
            Self::TransitionalHttp => "transitional-http",
            Self::Unified => "unified",
        }
    }

    /// Whether the SuperLink serves Fleet as gRPC on a port of its own (`--fleet-api-address`),
    /// apart from the Control API: every dialect but the unified one.
    pub fn fleet_on_own_port(self) -> bool {
        self != Self::Unified
    }

    /// Whether the Control API is Flower's HTTP(S) API (`/v1/control/…`) rather than gRPC.
    pub fn control_over_http(self) -> bool {
        matches!(self, Self::TransitionalHttp | Self::Unified)
    }

    /// Whether a SuperNode binds its Runtime API with `--host`/`--port` (from 1.35) rather
    /// than `--clientappio-api-address`.
    pub fn supernode_host_port(self) -> bool {
        self != Self::Classic
    }
}

/// `flower-superexec` arguments that connect it to the Runtime (or AppIO) API at `address` for
/// `plugin` (`serverapp` or `clientapp`), by release: `--appio-api-address` before 1.36, then
/// `--runtime-api-address`; `--plugin-type` before 1.38. TLS arguments are the caller's.
pub fn superexec_connect_args(version: FlowerVersion, plugin: &str, address: &str) -> Vec<String> {
    let mut args = Vec::with_capacity(2);
    if version < FIRST_SUPEREXEC_WITHOUT_PLUGIN_TYPE_VERSION {
        args.push(format!("--plugin-type={plugin}"));
    }
    args.push(if version >= FIRST_RUNTIME_API_SUPEREXEC_VERSION {
        format!("--runtime-api-address={address}")
    } else {
        format!("--appio-api-address={address}")
    });
    args
}

/// The tag of an image reference (`flwr/superlink:1.25.0` → `1.25.0`); `None` without a tag
/// (a bare name or a digest reference).
pub fn image_tag(image: &str) -> Option<&str> {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last_segment_start = without_digest.rfind('/').map_or(0, |i| i + 1);
    let last_segment = &without_digest[last_segment_start..];
    last_segment.split_once(':').map(|(_, tag)| tag)
}

/// Why no Flower dialect could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialectError {
    /// `spec.version` is not a Flower release number.
    #[error(
        "spec.version: {value:?} is not a Flower version; set spec.version to a release such as 1.42.0"
    )]
    BadVersion {
        /// The value found.
        value: String,
    },
    /// `spec.version` is unset and the image tag is not a release number.
    #[error(
        "spec.version: not set, and the Flower version cannot be read from the tag of spec.superlink.image {image:?}; set spec.version to e.g. 1.42.0"
    )]
    UnknownImageVersion {
        /// The image reference.
        image: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32, patch: u32) -> FlowerVersion {
        FlowerVersion {
            major,
            minor,
            patch,
        }
    }

    #[test]
    fn parses_release_numbers_and_tags() {
        // Version strings users write and the tags Flower publishes map to the right release.
        assert_eq!(FlowerVersion::parse("1.25.0"), Some(v(1, 25, 0)));
        assert_eq!(FlowerVersion::parse("v1.42"), Some(v(1, 42, 0)));
        assert_eq!(
            FlowerVersion::parse("1.25.0-py3.11-ubuntu24.04"),
            Some(v(1, 25, 0))
        );
        assert_eq!(FlowerVersion::parse("1.36"), Some(v(1, 36, 0)));
        for bad in ["latest", "nightly", "", "1", "1.x", "1.25rc1", "a.b.c"] {
            assert_eq!(FlowerVersion::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn boundaries_between_dialects_match_the_verified_releases() {
        // Each release maps to the flags it was run with (NOTES.md): 1.34.x classic, 1.35-1.36
        // transitional, 1.37-1.39 transitional with HTTP Control, 1.40 on unified.
        for (version, dialect) in [
            (v(1, 25, 0), FlowerDialect::Classic),
            (v(1, 34, 9), FlowerDialect::Classic),
            (v(1, 35, 0), FlowerDialect::Transitional),
            (v(1, 36, 3), FlowerDialect::Transitional),
            (v(1, 37, 0), FlowerDialect::TransitionalHttp),
            (v(1, 39, 9), FlowerDialect::TransitionalHttp),
            (v(1, 40, 0), FlowerDialect::Unified),
            (v(1, 42, 0), FlowerDialect::Unified),
        ] {
            assert_eq!(FlowerDialect::of(version), dialect, "{version}");
            let text = version.to_string();
            let image = format!("flwr/superlink:{text}");
            assert_eq!(
                FlowerDialect::select(Some(&text), &image).unwrap(),
                (version, dialect)
            );
        }
        assert!(FlowerDialect::Transitional.fleet_on_own_port());
        assert!(!FlowerDialect::Transitional.control_over_http());
        assert!(FlowerDialect::TransitionalHttp.control_over_http());
        assert!(!FlowerDialect::Unified.fleet_on_own_port());
    }

    #[test]
    fn superexec_flags_follow_the_release() {
        // --appio-api-address up to 1.35, --runtime-api-address from 1.36; --plugin-type until
        // 1.37 (each release's own --help, NOTES.md).
        let a = "127.0.0.1:9091";
        assert_eq!(
            superexec_connect_args(v(1, 25, 0), "serverapp", a),
            [
                "--plugin-type=serverapp",
                "--appio-api-address=127.0.0.1:9091"
            ]
        );
        assert_eq!(
            superexec_connect_args(v(1, 35, 0), "clientapp", a),
            [
                "--plugin-type=clientapp",
                "--appio-api-address=127.0.0.1:9091"
            ]
        );
        assert_eq!(
            superexec_connect_args(v(1, 37, 0), "serverapp", a),
            [
                "--plugin-type=serverapp",
                "--runtime-api-address=127.0.0.1:9091"
            ]
        );
        assert_eq!(
            superexec_connect_args(v(1, 38, 0), "serverapp", a),
            ["--runtime-api-address=127.0.0.1:9091"]
        );
        assert_eq!(
            superexec_connect_args(v(1, 42, 0), "clientapp", a),
            ["--runtime-api-address=127.0.0.1:9091"]
        );
    }

    #[test]
    fn a_future_release_gets_the_newest_dialect_with_a_warning() {
        // Not an error: a release after the verified line runs with the newest flags.
        let (version, dialect) = FlowerDialect::select(Some("1.50.2"), "flwr/superlink:x").unwrap();
        assert_eq!(dialect, FlowerDialect::Unified);
        let warning = version.unverified_warning().unwrap();
        assert!(
            warning.starts_with("spec.version: Flower 1.50.2 is newer"),
            "{warning}"
        );
        assert!(warning.contains("unified"), "{warning}");
        let (version, dialect) = FlowerDialect::select(Some("2.0.0"), "flwr/superlink:x").unwrap();
        assert_eq!(dialect, FlowerDialect::Unified);
        assert!(version.unverified_warning().is_some());
        // Every patch of the verified line, and older releases, are verified.
        for verified in ["1.42.0", "1.42.7", "1.40.0", "1.25.0"] {
            assert_eq!(
                FlowerVersion::parse(verified).unwrap().unverified_warning(),
                None
            );
        }
    }

    #[test]
    fn spec_version_wins_over_the_image_tag() {
        // flower-operator ignores spec.version; we use it before the image tag.
        let (version, dialect) =
            FlowerDialect::select(Some("1.42.0"), "flwr/superlink:1.25.0").unwrap();
        assert_eq!((version, dialect), (v(1, 42, 0), FlowerDialect::Unified));
        let (version, dialect) = FlowerDialect::select(None, "flwr/superlink:1.25.0").unwrap();
        assert_eq!((version, dialect), (v(1, 25, 0), FlowerDialect::Classic));
        let (_, dialect) =
            FlowerDialect::select(None, "registry:5000/flwr/superlink:1.42.0").unwrap();
        assert_eq!(dialect, FlowerDialect::Unified);
    }

    #[test]
    fn unmappable_versions_name_the_field_and_the_fix() {
        // `latest`, digests and bare names cannot be mapped; the error tells the user what to set.
        for image in [
            "flwr/superlink:latest",
            "flwr/superlink",
            "flwr/superlink@sha256:abc",
            "registry:5000/superlink",
        ] {
            let err = FlowerDialect::select(None, image).unwrap_err().to_string();
            assert!(err.contains("spec.version"), "{err}");
            assert!(err.contains("1.42.0"), "{err}");
        }
        let err = FlowerDialect::select(Some("nightly"), "flwr/superlink:1.25.0")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("spec.version: \"nightly\""), "{err}");
    }
}

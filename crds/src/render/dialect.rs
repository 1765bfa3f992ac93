//! Flower argument dialects: which flags and ports a given Flower release understands.
//!
//! Flower's deployment CLI changed between the 1.25-era releases flower-operator targets and the
//! current ones (see `FLOWER.md`): the three fixed gRPC APIs (ServerAppIO 9091, Fleet 9092,
//! Control 9093) and the SuperNode's `--clientappio-api-address` were replaced by one server per
//! component configured with `--host`/`--port`. We render per dialect, chosen from
//! `spec.version` or, when it is unset, from the SuperLink image tag.

use std::fmt;

/// The first Flower release after the classic dialect.
///
/// Verified by running the releases (e2e/flower/NOTES.md): 1.25.0 … 1.34.x use the classic flags;
/// 1.35 … 1.39 are transitional (Runtime API on `--host/--port` but Fleet and Control still on
/// the old gRPC addresses, Control moving to HTTP in 1.37) and are refused rather than given a
/// third and fourth argument shape; 1.40.0 and later are unified.
pub const FIRST_TRANSITIONAL_VERSION: FlowerVersion = FlowerVersion {
    major: 1,
    minor: 35,
    patch: 0,
};

/// The first Flower release of the [`FlowerDialect::Unified`] dialect (verified on 1.40.0 and
/// 1.42.0, e2e/flower/NOTES.md).
pub const FIRST_UNIFIED_VERSION: FlowerVersion = FlowerVersion {
    major: 1,
    minor: 40,
    patch: 0,
};

/// The newest Flower release line flower-addon is verified with (`e2e/flower/NOTES.md`, the
/// quickstart matrix of `test.sh`). A later release is rendered in the newest dialect, with a
/// warning ([`FlowerVersion::unverified_warning`]) instead of an error: Flower keeps its flags
/// across releases more often than not, and a user should not wait for us to try it.
pub const NEWEST_VERIFIED_VERSION: FlowerVersion = FlowerVersion {
    major: 1,
    minor: 42,
    patch: 0,
};

/// The first release with `flower-superlink --disable-runtime-dependency-installation` (1.32;
/// 1.29–1.31 only had an opt-in flag and 1.25 never installs; NOTES.md).
pub const FIRST_DISABLE_RUNTIME_DEPS_VERSION: FlowerVersion = FlowerVersion {
    major: 1,
    minor: 32,
    patch: 0,
};

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

/// The set of command-line flags a Flower release understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FlowerDialect {
    /// Before 1.35: three fixed gRPC APIs on the SuperLink, `--clientappio-api-address` on the
    /// SuperNode, `flower-superexec --plugin-type … --appio-api-address …`.
    Classic,
    /// 1.40 and later: one `--host`/`--port` server per component, `flower-superexec
    /// --runtime-api-address …`, `--disable-runtime-dependency-installation` on the SuperLink.
    Unified,
}

impl FlowerDialect {
    /// The dialect of a Flower release. Transitional releases (1.35 … 1.39) have no dialect of
    /// ours and map to `None`; [`FlowerDialect::select`] turns that into an error, so versions
    /// that went through it (as the hub's work does) always have one.
    pub fn supported(version: FlowerVersion) -> Option<Self> {
        if version >= FIRST_UNIFIED_VERSION {
            Some(Self::Unified)
        } else if version >= FIRST_TRANSITIONAL_VERSION {
            None
        } else {
            Some(Self::Classic)
        }
    }

    /// The dialect of a version already accepted by [`FlowerDialect::select`]: classic before
    /// 1.35, unified from 1.40 (a transitional release, never accepted, maps to unified).
    pub fn of(version: FlowerVersion) -> Self {
        Self::supported(version).unwrap_or(Self::Unified)
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
        let dialect = Self::supported(version).ok_or(DialectError::Transitional { version })?;
        Ok((version, dialect))
    }

    /// The dialect's name as written in docs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Unified => "unified",
        }
    }
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
    /// A transitional release (1.35 … 1.39) whose flags we do not render.
    #[error(
        "spec.version: Flower {version} is a transitional release (1.35-1.39: Fleet and Control not yet on --host/--port) and is not supported; use 1.34.x or earlier, or 1.40.0 or later (e.g. 1.42.0)"
    )]
    Transitional {
        /// The version found.
        version: FlowerVersion,
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
        // 1.34.x renders classic flags, 1.35-1.39 are refused, 1.40.0 renders unified (NOTES.md).
        assert_eq!(
            FlowerDialect::supported(v(1, 25, 0)),
            Some(FlowerDialect::Classic)
        );
        assert_eq!(
            FlowerDialect::supported(v(1, 34, 9)),
            Some(FlowerDialect::Classic)
        );
        assert_eq!(FlowerDialect::supported(v(1, 35, 0)), None);
        assert_eq!(FlowerDialect::supported(v(1, 39, 9)), None);
        assert_eq!(
            FlowerDialect::supported(v(1, 40, 0)),
            Some(FlowerDialect::Unified)
        );
        assert_eq!(
            FlowerDialect::supported(v(1, 42, 0)),
            Some(FlowerDialect::Unified)
        );
        let err = FlowerDialect::select(Some("1.36.0"), "flwr/superlink:1.36.0")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("spec.version: Flower 1.36.0 is a transitional release"),
            "{err}"
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

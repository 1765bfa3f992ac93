//! Building a FAB as `flwr build` 1.42 does (`build_fab_from_files`): publish rules and the
//! app's `.gitignore` (`filter_paths_for_publish`), pyproject.toml checks, `fab-include` /
//! `fab-exclude` and Flower's built-in patterns (`get_filtered_fab_paths`), then pyproject.toml
//! rewritten, the files in sorted order and the `.info/CONTENT` manifest.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use sha2::{Digest, Sha256};

use super::pathspec::{PathSpec, PatternError, py_isspace};
use super::pyproject::{App, FAB_EXCLUDE_KEY, FAB_INCLUDE_KEY};
use super::{FAB_MAX_SIZE, Fab, FabError, is_plain_relative, toml, zip};

/// `APP_PUBLISH_INCLUDE_PATTERNS`: what an app may contain at all.
const PUBLISH_INCLUDE: &[&str] = &[
    "**/*.py",
    "**/*.toml",
    "**/*.md",
    "**/*.yaml",
    "**/*.yml",
    "**/*.json",
    "**/*.jsonl",
    "/.gitignore",
    "**/.editorconfig",
    "/LICENSE",
    "/LICENSE.md",
];
/// `APP_PUBLISH_EXCLUDE_PATTERNS`.
const PUBLISH_EXCLUDE: &[&str] = &[".flwr/**", ".venv/**", "**/__pycache__/**"];
/// `FAB_INCLUDE_PATTERNS`: the kinds of file a FAB holds, whatever `fab-include` says.
const FAB_INCLUDE: &[&str] = &[
    "**/*.py",
    "**/*.toml",
    "**/*.md",
    "**/*.yaml",
    "**/*.yml",
    "**/*.json",
    "**/*.jsonl",
    "/LICENSE",
];
/// `FAB_EXCLUDE_PATTERNS`: never in a FAB (pyproject.toml is added rewritten).
const FAB_EXCLUDE: &[&str] = &[
    ".flwr/**",
    "**/__pycache__/**",
    "pyproject.toml",
    "**/*_test.py",
    "**/test_*.py",
    "build/**",
    "eggs/**",
    ".eggs/**",
    "lib/**",
    "lib64/**",
    "parts/**",
    "*.egg",
    ".venv/**",
    "env/**",
    "venv/**",
    "ENV/**",
    "env.bak/**",
    "venv.bak/**",
];
/// `MAX_DIR_DEPTH`: directories above a file, at most.
const MAX_DIR_DEPTH: usize = 10;
/// The manifest's path in a FAB.
pub const MANIFEST: &str = ".info/CONTENT";
/// The app's description file, which a FAB holds rewritten.
pub const PYPROJECT: &str = "pyproject.toml";

/// Where a file's contents come from.
enum Content<'a> {
    /// Given in memory.
    Bytes(&'a [u8]),
    /// A file of the app directory (read only if it goes into the FAB).
    File { path: PathBuf, len: u64 },
    /// A file whose name is not UTF-8 (refused only if it would go into the FAB).
    NotUtf8,
}

// === impl Content ===

impl Content<'_> {
    fn len(&self) -> usize {
        match self {
            Content::Bytes(b) => b.len(),
            Content::File { len, .. } => usize::try_from(*len).unwrap_or(usize::MAX),
            Content::NotUtf8 => 0,
        }
    }

    fn load(&self, name: &str) -> Result<Cow<'_, [u8]>, FabError> {
        match self {
            Content::Bytes(b) => Ok(Cow::Borrowed(b)),
            Content::File { path, .. } => {
                fs::read(path)
                    .map(Cow::Owned)
                    .map_err(|source| FabError::Io {
                        path: path.clone(),
                        source,
                    })
            }
            Content::NotUtf8 => Err(FabError::BadPath {
                path: name.to_owned(),
                reason: "has a name that is not UTF-8, which a FAB cannot hold: rename it, or list it in the app's .gitignore",
            }),
        }
    }
}

/// Builds the FAB of an app given as relative POSIX paths and their contents (pyproject.toml
/// and, if any, .gitignore among them), selecting files as `flwr build` does.
pub fn build_from_files(files: &BTreeMap<String, Vec<u8>>) -> Result<Fab, FabError> {
    for path in files.keys() {
        if !is_plain_relative(path) {
            return Err(FabError::BadPath {
                path: path.clone(),
                reason: "is not a relative path inside the app: use `/`-separated parts, none empty, `.` or `..`, no leading `/`",
            });
        }
    }
    let files = files
        .iter()
        .map(|(k, v)| (k.clone(), Content::Bytes(v)))
        .collect();
    build(&files)
}

/// Builds the FAB of the app in `dir` as `flwr build --app DIR` does: every regular file below
/// it (symbolic links are skipped and never followed, like Flower's `collect_files`), then
/// [`build_from_files`]' selection; only the selected files are read.
pub fn build_from_dir(dir: &Path) -> Result<Fab, FabError> {
    if !fs::metadata(dir).is_ok_and(|m| m.is_dir()) {
        return Err(FabError::NotADirectory {
            path: dir.to_owned(),
        });
    }
    let mut files = BTreeMap::new();
    collect(dir, "", &mut files)?;
    build(&files)
}

fn collect(
    dir: &Path,
    prefix: &str,
    files: &mut BTreeMap<String, Content<'_>>,
) -> Result<(), FabError> {
    let io = |source| FabError::Io {
        path: dir.to_owned(),
        source,
    };
    for entry in fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let kind = entry.file_type().map_err(io)?;
        let (name, utf8) = match entry.file_name().into_string() {
            Ok(name) => (name, true),
            Err(raw) => (raw.to_string_lossy().into_owned(), false),
        };
        let rel = format!("{prefix}{name}");
        if kind.is_dir() {
            collect(&entry.path(), &format!("{rel}/"), files)?;
        } else if kind.is_file() {
            let content = if utf8 {
                let len = entry.metadata().map_err(io)?.len();
                Content::File {
                    path: entry.path(),
                    len,
                }
            } else {
                Content::NotUtf8
            };
            files.insert(rel, content);
        }
    }
    Ok(())
}

/// Flower's built-in patterns, compiled once.
struct BuiltIn {
    publish_include: PathSpec,
    publish_exclude: PathSpec,
    fab_include: PathSpec,
    fab_exclude: PathSpec,
}

static BUILT_IN: LazyLock<Result<BuiltIn, PatternError>> = LazyLock::new(|| {
    let spec = |patterns: &[&str]| PathSpec::from_lines(patterns.iter().copied());
    Ok(BuiltIn {
        publish_include: spec(PUBLISH_INCLUDE)?,
        publish_exclude: spec(PUBLISH_EXCLUDE)?,
        fab_include: spec(FAB_INCLUDE)?,
        fab_exclude: spec(FAB_EXCLUDE)?,
    })
});

fn built_in() -> Result<&'static BuiltIn, FabError> {
    BUILT_IN
        .as_ref()
        .map_err(|e| pattern_error("Flower's built-in", e.clone()))
}

fn pattern_error(source_name: &'static str, e: PatternError) -> FabError {
    FabError::Pattern {
        source_name,
        pattern: e.pattern,
        reason: e.reason,
    }
}

fn build(files: &BTreeMap<String, Content<'_>>) -> Result<Fab, FabError> {
    let published = publish_filter(files)?;
    if !published.contains(&PYPROJECT) {
        return Err(if files.contains_key(PYPROJECT) {
            FabError::PyprojectIgnored
        } else {
            FabError::PyprojectMissing { place: "app" }
        });
    }
    let pyproject = files[PYPROJECT].load(PYPROJECT)?;
    let app = App::parse(&pyproject, true)?;
    let mut paths = fab_filter(&published, &app)?;
    paths.sort_unstable();
    if let Some(license) = &app.license_file
        && !paths.contains(&license.as_str())
    {
        return Err(FabError::FabFormat {
            reason: format!(
                "fab-format-version = 1 needs the license file `{license}` in the FAB: add it at the app's top level"
            ),
        });
    }
    for path in &paths {
        if path.contains([',', '\n', '\r']) {
            return Err(FabError::BadPath {
                path: (*path).to_owned(),
                reason: "holds a comma or line break, which Flower's .info/CONTENT manifest cannot list: rename it, or list it in the app's .gitignore",
            });
        }
        if path.len() > usize::from(u16::MAX) {
            return Err(FabError::BadPath {
                path: (*path).to_owned(),
                reason: "is longer than 65,535 bytes, which a zip cannot hold: rename it",
            });
        }
        if path.contains('\\') {
            return Err(FabError::BadPath {
                path: (*path).to_owned(),
                reason: "holds a backslash, which zip readers take for a directory separator: rename it, or list it in the app's .gitignore",
            });
        }
    }
    if paths.len() + 2 > zip::MAX_ENTRIES {
        return Err(FabError::TooManyFiles { count: paths.len() });
    }

    let pyproject = toml::dumps(&app.without_federations()).into_bytes();
    // The size is known before reading: refuse an oversized app without loading it.
    let sizes: Vec<(&str, usize)> = std::iter::once((PYPROJECT, pyproject.len()))
        .chain(paths.iter().map(|p| (*p, files[*p].len())))
        .collect();
    let manifest_len = sizes
        .iter()
        .map(|(p, len)| p.len() + 66 + (len * 8).to_string().len())
        .sum::<usize>()
        + sizes.len()
        - 1;
    let size = zip::written_size(
        sizes
            .iter()
            .map(|(p, len)| (p.len(), *len))
            .chain([(MANIFEST.len(), manifest_len)]),
    );
    if size > FAB_MAX_SIZE {
        return Err(FabError::TooLarge { size });
    }

    let mut contents: Vec<(&str, Cow<'_, [u8]>)> = vec![(PYPROJECT, Cow::Borrowed(&pyproject))];
    for path in &paths {
        contents.push((path, files[*path].load(path)?));
    }
    let manifest = contents
        .iter()
        .map(|(p, data)| {
            format!(
                "{p},{},{}",
                hex::encode(Sha256::digest(data)),
                data.len() * 8
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut entries: Vec<(&str, &[u8])> = contents.iter().map(|(p, d)| (*p, &**d)).collect();
    entries.push((MANIFEST, manifest.as_bytes()));
    let bytes = zip::write(&entries);
    if bytes.len() > FAB_MAX_SIZE {
        return Err(FabError::TooLarge { size: bytes.len() });
    }
    Ok(Fab {
        hash: hex::encode(Sha256::digest(&bytes)),
        bytes,
        fab_id: app.fab_id(),
        version: app.version.clone(),
        config: app.config.clone(),
    })
}

/// `filter_paths_for_publish`: publish patterns, then the top-level .gitignore, then the depth
/// limit.
fn publish_filter<'a>(files: &'a BTreeMap<String, Content<'_>>) -> Result<Vec<&'a str>, FabError> {
    let BuiltIn {
        publish_include: include,
        publish_exclude: exclude,
        ..
    } = built_in()?;
    let gitignore_text = match files.get(".gitignore") {
        Some(content) => content.load(".gitignore")?.into_owned(),
        None => Vec::new(),
    };
    let gitignore = PathSpec::from_lines(gitignore_lines(&gitignore_text))
        .map_err(|e| pattern_error(".gitignore", e))?;
    let kept: Vec<&str> = files
        .keys()
        .map(String::as_str)
        .filter(|p| include.matches(p) && !exclude.matches(p) && !gitignore.matches(p))
        .collect();
    if let Some(deep) = kept
        .iter()
        .find(|p| p.split('/').count() - 1 > MAX_DIR_DEPTH)
    {
        return Err(FabError::TooDeep {
            path: (*deep).to_owned(),
        });
    }
    Ok(kept)
}

/// `load_gitignore_patterns`: the non-blank, non-comment lines, stripped (none if the file is
/// not UTF-8). Python's `splitlines` boundaries; the blank pieces between `\r\n` are dropped
/// anyway.
fn gitignore_lines(bytes: &[u8]) -> Vec<&str> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Vec::new();
    };
    text.split([
        '\n', '\r', '\u{b}', '\u{c}', '\u{1c}', '\u{1d}', '\u{1e}', '\u{85}', '\u{2028}',
        '\u{2029}',
    ])
    .map(|line| line.trim_matches(py_isspace))
    .filter(|line| !line.is_empty() && !line.starts_with('#'))
    .collect()
}

/// `get_filtered_fab_paths`: the app's `fab-include` / `fab-exclude` (each pattern must match
/// something), then Flower's built-in FAB patterns, which `fab-include` may not contradict.
fn fab_filter<'a>(paths: &[&'a str], app: &App) -> Result<Vec<&'a str>, FabError> {
    let BuiltIn {
        fab_include: builtin_include,
        fab_exclude: builtin_exclude,
        ..
    } = built_in()?;
    let user_spec = |patterns: &Option<Vec<String>>, key: &'static str| {
        let Some(patterns) = patterns else {
            return Ok(None);
        };
        for pattern in patterns {
            let one =
                PathSpec::from_lines([pattern.as_str()]).map_err(|e| pattern_error(key, e))?;
            if !paths.iter().any(|p| one.matches(p)) {
                return Err(FabError::PatternUnmatched {
                    key,
                    pattern: pattern.clone(),
                });
            }
        }
        PathSpec::from_lines(patterns.iter().map(String::as_str))
            .map(Some)
            .map_err(|e| pattern_error(key, e))
    };
    let include = user_spec(&app.include, FAB_INCLUDE_KEY)?;
    let exclude = user_spec(&app.exclude, FAB_EXCLUDE_KEY)?;
    let candidates: Vec<&str> = paths
        .iter()
        .copied()
        .filter(|p| include.as_ref().is_none_or(|s| s.matches(p)))
        .filter(|p| exclude.as_ref().is_none_or(|s| !s.matches(p)))
        .collect();
    if include.is_some() || exclude.is_some() {
        let refused: Vec<String> = candidates
            .iter()
            .filter(|p| !builtin_include.matches(p))
            .map(|p| (*p).to_owned())
            .collect();
        if !refused.is_empty() {
            return Err(FabError::BuiltInConflict { files: refused });
        }
    }
    Ok(candidates
        .into_iter()
        .filter(|p| builtin_include.matches(p) && !builtin_exclude.matches(p))
        .collect())
}

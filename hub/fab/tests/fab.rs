//! Flower App Bundles without Flower: building (file selection, rewritten pyproject.toml, the
//! manifest), reading (every check, with messages that say what to fix), run-config parsing and
//! override checks, and property tests (build → read round trips, `read` and
//! `parse_run_config` never panicking). e2e/tests/fab_flwr.rs compares the same functions with
//! the real Flower 1.42.

use std::collections::BTreeMap;
use std::io::Write as _;

use flower_addon_fab::{
    self as fab, ConfigValue, FAB_MAX_SIZE, Fab, FabError, RunConfigError, check_overrides,
    parse_run_config,
};
use proptest::prelude::*;

const PYPROJECT: &str = r#"[project]
name = "golden"
version = "0.1.0"
dependencies = ["flwr>=1.42.0"]

[tool.flwr.app]
publisher = "flower-addon"

[tool.flwr.app.components]
serverapp = "golden.server:app"
clientapp = "golden.client:app"

[tool.flwr.app.config]
num-server-rounds = 3
lr = 0.1
name = "héllo \"quoted\""
nested.deep = true

[tool.flwr.federations]
default = "local"
"#;

fn files(entries: &[(&str, &[u8])]) -> BTreeMap<String, Vec<u8>> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
        .collect()
}

fn golden() -> BTreeMap<String, Vec<u8>> {
    files(&[
        ("pyproject.toml", PYPROJECT.as_bytes()),
        (".gitignore", b"secret.py\n"),
        ("golden/__init__.py", b""),
        ("golden/server.py", b"app = None\n"),
        ("golden/client.py", b"app = None\n"),
        ("golden/test_server.py", b""),
        ("golden/été.md", "é\n".as_bytes()),
        ("secret.py", b"x"),
        ("notes.txt", b"not in a FAB"),
    ])
}

/// The golden app with `pyproject.toml` replaced.
fn with_pyproject(text: &str) -> BTreeMap<String, Vec<u8>> {
    let mut f = golden();
    f.insert("pyproject.toml".to_owned(), text.as_bytes().to_vec());
    f
}

fn entries(fab: &Fab) -> Vec<String> {
    let mut names = Vec::new();
    // The central directory's names, in order (each entry: 46-byte header, name, no extras).
    let end = fab.bytes.len() - 22;
    let count = u16::from_le_bytes([fab.bytes[end + 10], fab.bytes[end + 11]]) as usize;
    let mut pos = u32::from_le_bytes(fab.bytes[end + 16..end + 20].try_into().unwrap()) as usize;
    for _ in 0..count {
        let len = u16::from_le_bytes([fab.bytes[pos + 28], fab.bytes[pos + 29]]) as usize;
        names.push(String::from_utf8(fab.bytes[pos + 46..pos + 46 + len].to_vec()).unwrap());
        pos += 46 + len;
    }
    names
}

fn build_err(f: &BTreeMap<String, Vec<u8>>) -> String {
    fab::build_from_files(f)
        .expect_err("must be refused")
        .to_string()
}

fn read_err(bytes: &[u8]) -> String {
    fab::read(bytes).expect_err("must be refused").to_string()
}

fn assert_mentions(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "`{part}` not in: {message}");
    }
}

/// A zip written by hand (stored entries), for FABs `build` would never make.
fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in entries {
        let offset = out.len() as u32;
        let crc = crc32(data);
        let mut header = vec![];
        let utf8 = if name.is_ascii() { 0 } else { 8 };
        header.extend_from_slice(&[20, 0, 0, utf8, 0, 0, 0, 0, 0, 0]);
        header.extend_from_slice(&crc.to_le_bytes());
        header.extend_from_slice(&(data.len() as u32).to_le_bytes());
        header.extend_from_slice(&(data.len() as u32).to_le_bytes());
        header.extend_from_slice(&(name.len() as u16).to_le_bytes());
        header.extend_from_slice(&[0, 0]);
        out.extend_from_slice(b"PK\x03\x04");
        out.extend_from_slice(&header);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        central.extend_from_slice(b"PK\x01\x02\x14\x03");
        central.extend_from_slice(&header);
        central.extend_from_slice(&[0; 10]);
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let at = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(b"PK\x05\x06\0\0\0\0");
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&at.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in data {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn manifest_line(path: &str, data: &[u8]) -> String {
    use sha2::Digest as _;
    format!(
        "{path},{},{}",
        hex::encode(sha2::Sha256::digest(data)),
        data.len() * 8
    )
}

/// A minimal valid pyproject.toml for hand-made FABs.
const SMALL: &str = "[project]\nname = \"x\"\nversion = \"1\"\n[tool.flwr.app]\npublisher = \"p\"\n[tool.flwr.app.components]\nserverapp = \"a:b\"\nclientapp = \"a:c\"\n";

// === build ===

#[test]
fn golden_app_builds_to_flwr_builds_bytes() {
    // Invariant: the FAB equals `build_fab_from_files` of Flower 1.42 on the same files
    // (hash printed by the flwr 1.42 venv's Python), and reads back.
    let fab = fab::build_from_files(&golden()).expect("builds");
    assert_eq!(
        fab.hash,
        "b736698dd61b33e332086f95532695e8f72cb92757728d2ddbbf4a9588ab51d7"
    );
    assert_eq!(fab.bytes.len(), 1455);
    assert_eq!(fab.fab_id, "flower-addon/golden");
    assert_eq!(fab.version, "0.1.0");
    assert_eq!(
        fab.config["name"],
        ConfigValue::Str("héllo \"quoted\"".to_owned())
    );
    assert_eq!(fab.config["nested.deep"], ConfigValue::Bool(true));
    assert_eq!(fab::read(&fab.bytes).expect("reads back"), fab);
}

#[test]
fn fab_holds_pyproject_first_then_sorted_app_files_then_the_manifest() {
    // Invariant: gitignored, test, non-source and non-included files stay out; order is Flower's.
    let fab = fab::build_from_files(&golden()).unwrap();
    assert_eq!(
        entries(&fab),
        [
            "pyproject.toml",
            "golden/__init__.py",
            "golden/client.py",
            "golden/server.py",
            "golden/été.md",
            ".info/CONTENT"
        ]
    );
}

#[test]
fn federations_table_is_left_out_of_the_fab() {
    // Invariant: connection settings never travel in a FAB; the rest of tool.flwr does.
    let fab = fab::build_from_files(&golden()).unwrap();
    let text = String::from_utf8_lossy(&fab.bytes);
    assert!(!text.contains("federations"));
    assert!(text.contains("[tool.flwr.app.config.nested]\ndeep = true\n"));
}

#[test]
fn built_in_exclusions_apply_at_any_depth() {
    // Invariant: Flower's FAB_EXCLUDE_PATTERNS and publish rules, whatever the app says.
    let mut f = golden();
    for path in [
        "golden/__pycache__/x.py",
        ".venv/lib/x.py",
        "venv/x.py",
        "build/x.py",
        "pkg/pyproject.toml",
        "golden/x_test.py",
        ".flwr/config.toml",
        "golden/data.csv",
        "docs/LICENSE",
    ] {
        f.insert(path.to_owned(), b"x".to_vec());
    }
    f.insert("golden/conf.yaml".to_owned(), b"a: 1\n".to_vec());
    f.insert("LICENSE".to_owned(), b"Apache\n".to_vec());
    let names = entries(&fab::build_from_files(&f).unwrap());
    assert!(names.contains(&"golden/conf.yaml".to_owned()));
    assert!(names.contains(&"LICENSE".to_owned()));
    assert_eq!(names.len(), 8, "{names:?}");
}

#[test]
fn gitignore_negation_re_includes() {
    // Invariant: the app's .gitignore is read as pathspec reads it (last match wins).
    let mut f = golden();
    f.insert(
        ".gitignore".to_owned(),
        b"# c\n*.md\n!golden/\xc3\xa9t\xc3\xa9.md\r\n".to_vec(),
    );
    assert!(entries(&fab::build_from_files(&f).unwrap()).contains(&"golden/été.md".to_owned()));
    f.insert(".gitignore".to_owned(), b"*.md\n".to_vec());
    assert!(!entries(&fab::build_from_files(&f).unwrap()).contains(&"golden/été.md".to_owned()));
}

#[test]
fn fab_include_and_exclude_narrow_the_files() {
    // Invariant: user patterns select among the files, and pyproject.toml is always there.
    let text = PYPROJECT.replace(
        "publisher = \"flower-addon\"",
        "publisher = \"flower-addon\"\nfab-include = [\"golden/*.py\"]\nfab-exclude = [\"golden/client.py\"]",
    );
    let names = entries(&fab::build_from_files(&with_pyproject(&text)).unwrap());
    assert_eq!(
        names,
        [
            "pyproject.toml",
            "golden/__init__.py",
            "golden/server.py",
            ".info/CONTENT"
        ]
    );
}

#[test]
fn a_pattern_matching_nothing_is_refused_by_name() {
    // Invariant: Flower refuses unresolved fab-include/fab-exclude patterns; we say which.
    let text = PYPROJECT.replace(
        "publisher = \"flower-addon\"",
        "publisher = \"flower-addon\"\nfab-exclude = [\"nothing/**\"]",
    );
    let message = build_err(&with_pyproject(&text));
    assert_mentions(
        &message,
        &["fab-exclude", "nothing/**", "matches no file", "remove"],
    );
}

#[test]
fn fab_include_of_unsupported_files_is_refused() {
    // Invariant: fab-include cannot pull in kinds of file Flower never bundles.
    let text = PYPROJECT.replace(
        "publisher = \"flower-addon\"",
        "publisher = \"flower-addon\"\nfab-include = [\".gitignore\", \"golden/*.py\"]",
    );
    let message = build_err(&with_pyproject(&text));
    assert_mentions(
        &message,
        &[".gitignore", "fab-include", "remove the patterns"],
    );
}

#[test]
fn empty_pattern_lists_are_refused() {
    // Invariant: `fab-include = []` is an error in Flower, with the fix.
    let text = PYPROJECT.replace(
        "publisher = \"flower-addon\"",
        "publisher = \"flower-addon\"\nfab-include = []",
    );
    assert_mentions(
        &build_err(&with_pyproject(&text)),
        &["fab-include", "empty list", "remove the key"],
    );
}

#[test]
fn oversized_apps_are_refused_with_size_and_fix() {
    // Invariant: over 10 MB is refused before zipping, naming the size and the fix.
    let mut f = golden();
    f.insert(
        "golden/big.json".to_owned(),
        vec![b' '; FAB_MAX_SIZE + 1000],
    );
    let message = build_err(&f);
    assert_mentions(
        &message,
        &["10.0 MB", "at most 10 MB", "fab-include", "fab-exclude"],
    );
}

#[test]
fn too_deep_paths_are_refused() {
    // Invariant: Flower's MAX_DIR_DEPTH of 10 directories.
    let mut f = golden();
    f.insert("a/b/c/d/e/f/g/h/i/j/ok.py".to_owned(), b"".to_vec());
    assert!(fab::build_from_files(&f).is_ok());
    f.insert("a/b/c/d/e/f/g/h/i/j/k/deep.py".to_owned(), b"".to_vec());
    assert_mentions(&build_err(&f), &["deep.py", "10 directories", ".gitignore"]);
}

#[test]
fn unsafe_input_paths_are_refused() {
    // Invariant: build_from_files takes only plain relative paths.
    for path in ["../x.py", "/abs.py", "a//b.py", "./a.py", ""] {
        let mut f = golden();
        f.insert(path.to_owned(), b"".to_vec());
        assert_mentions(&build_err(&f), &["relative path"]);
    }
}

#[test]
fn paths_the_manifest_cannot_list_are_refused() {
    // Invariant: Flower's CONTENT is comma-separated lines; such a FAB would not install.
    let mut f = golden();
    f.insert("golden/a,b.py".to_owned(), b"".to_vec());
    assert_mentions(&build_err(&f), &["a,b.py", "comma", "rename"]);
}

#[test]
fn missing_or_gitignored_pyproject_is_refused() {
    // Invariant: the message tells a missing file from an ignored one.
    let mut f = golden();
    f.remove("pyproject.toml");
    assert_mentions(&build_err(&f), &["no pyproject.toml", "top level"]);
    let mut f = golden();
    f.insert(".gitignore".to_owned(), b"*.toml\n".to_vec());
    assert_mentions(&build_err(&f), &["excluded by the app's .gitignore"]);
}

#[test]
fn build_from_dir_reads_the_directory_like_collect_files() {
    // Invariant: a directory gives the same FAB as its files given in memory; symlinks are
    // skipped.
    let dir = tempfile::tempdir().unwrap();
    for (path, data) in golden() {
        let p = dir.path().join(&path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::File::create(p).unwrap().write_all(&data).unwrap();
    }
    std::os::unix::fs::symlink(
        dir.path().join("golden/server.py"),
        dir.path().join("link.py"),
    )
    .unwrap();
    let fab = fab::build_from_dir(dir.path()).unwrap();
    assert_eq!(fab, fab::build_from_files(&golden()).unwrap());
    let missing = fab::build_from_dir(&dir.path().join("nope")).unwrap_err();
    assert!(matches!(missing, FabError::NotADirectory { .. }));
}

// === pyproject.toml ===

#[test]
fn pyproject_errors_name_the_field_and_the_fix() {
    // Invariant: each thing Flower requires is named when missing, with what to write.
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "[tool.flwr.app]\npublisher = \"p\"\n",
            "",
            &["no [project] table"],
        ),
        (
            SMALL,
            "name = \"x\"\n",
            &["no `name` in [project]", "name = \"my-app\""],
        ),
        (SMALL, "version = \"1\"\n", &["no `version` in [project]"]),
        (
            "[project]\nname = \"x\"\nversion = \"1\"\n[tool.flwr]\n",
            "",
            &["no [tool.flwr.app] table", "publisher and components"],
        ),
        (
            SMALL,
            "publisher = \"p\"\n",
            &["no `publisher` in [tool.flwr.app]"],
        ),
        (
            SMALL,
            "clientapp = \"a:c\"\n",
            &["no `clientapp` in [tool.flwr.app.components]"],
        ),
        (
            SMALL,
            "[tool.flwr.app.components]\nserverapp = \"a:b\"\nclientapp = \"a:c\"\n",
            &["no [tool.flwr.app.components] table", "serverapp ="],
        ),
    ];
    for (text, remove, parts) in cases {
        let text = text.replace(remove, "");
        let bytes = zip_of(&[("pyproject.toml", text.as_bytes())]);
        assert_mentions(&read_err(&bytes), parts);
        assert_mentions(
            &build_err(&files(&[("pyproject.toml", text.as_bytes())])),
            parts,
        );
    }
}

#[test]
fn pyproject_values_of_the_wrong_kind_are_refused() {
    // Invariant: wrong types, invalid names and non-scalar config are refused with the reason.
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "version = \"1\"",
            "version = 1",
            &["project.version", "an integer", "a string"],
        ),
        (
            "name = \"x\"",
            "name = \"my_app\"",
            &["`my_app` is invalid", "letters, digits and hyphens"],
        ),
        (
            "serverapp = \"a:b\"",
            "serverapp = \"a\"",
            &["serverapp", "module:attribute"],
        ),
        (
            "clientapp = \"a:c\"\n",
            "clientapp = \"a:c\"\n[tool.flwr.app.config]\nlayers = [1, 2]\n",
            &[
                "`layers` is an array",
                "booleans, integers, floats or strings",
            ],
        ),
        (
            "publisher = \"p\"",
            "publisher = \"a/b\"",
            &["publisher `a/b`", "without `/`"],
        ),
        (
            "publisher = \"p\"",
            "publisher = \"p\"\nfab-format-version = 2",
            &["fab-format-version", "not supported"],
        ),
        (
            "publisher = \"p\"",
            "publisher = \"p\"\nfab-format-version = 1",
            &["flwr-version-target"],
        ),
        (
            "version = \"1\"",
            "version = \"1\"\ndependencies = \"flwr\"",
            &["dependencies", "list"],
        ),
        ("[project]", "[project", &["not valid TOML"]),
    ];
    for (from, to, parts) in cases {
        let text = SMALL.replace(from, to);
        assert_mentions(
            &build_err(&files(&[("pyproject.toml", text.as_bytes())])),
            parts,
        );
    }
}

#[test]
fn an_agentapp_needs_no_serverapp_or_clientapp() {
    // Invariant: Flower 1.42's agentapp bundles.
    let text = SMALL.replace(
        "serverapp = \"a:b\"\nclientapp = \"a:c\"\n",
        "agentapp = \"a:d\"\n",
    );
    assert!(fab::build_from_files(&files(&[("pyproject.toml", text.as_bytes())])).is_ok());
}

// === read ===

#[test]
fn read_refuses_what_is_not_a_fab() {
    // Invariant: garbage, oversize and missing parts are refused with the reason.
    assert_mentions(&read_err(b"hello"), &["not a zip archive", "flwr build"]);
    assert_mentions(
        &read_err(&vec![0; FAB_MAX_SIZE + 1]),
        &["10.0 MB", "at most 10 MB"],
    );
    assert_mentions(
        &read_err(&zip_of(&[("a.py", b"")])),
        &["no pyproject.toml", "FAB"],
    );
    assert_mentions(
        &read_err(&zip_of(&[("pyproject.toml", SMALL.as_bytes())])),
        &["no .info/CONTENT", "flwr build"],
    );
}

#[test]
fn read_refuses_unsafe_paths() {
    // Invariant: no entry escapes the app directory (zip-slip).
    for name in ["../evil.py", "/etc/evil.py", "a/../../evil.py", "a\\b.py"] {
        let bytes = zip_of(&[("pyproject.toml", SMALL.as_bytes()), (name, b"")]);
        assert_mentions(&read_err(&bytes), &[name, "not a plain relative path"]);
    }
}

#[test]
fn read_checks_the_manifest_against_the_entries() {
    // Invariant: sha256 and size of every listed file, and every file listed.
    let ok = |manifest: String, extra: &[(&str, &[u8])]| {
        let mut e: Vec<(&str, &[u8])> = vec![("pyproject.toml", SMALL.as_bytes()), ("a.py", b"x")];
        e.extend_from_slice(extra);
        e.push((".info/CONTENT", manifest.as_bytes()));
        zip_of(&e)
    };
    let good = format!(
        "{}\n{}",
        manifest_line("pyproject.toml", SMALL.as_bytes()),
        manifest_line("a.py", b"x")
    );
    assert!(fab::read(&ok(good.clone(), &[])).is_ok());
    // Flower ≤ 1.25: pyproject.toml unlisted, a trailing newline.
    assert!(fab::read(&ok(format!("{}\n", manifest_line("a.py", b"x")), &[])).is_ok());
    let tampered = good.replace(&manifest_line("a.py", b"x"), &manifest_line("a.py", b"y"));
    assert_mentions(
        &read_err(&ok(tampered, &[])),
        &["`a.py` does not match", "sha256", "rebuild"],
    );
    let wrong_size = good.replace(",8", ",16");
    assert_mentions(
        &read_err(&ok(wrong_size, &[])),
        &["`a.py`", "8 bits, listed 16"],
    );
    assert_mentions(
        &read_err(&ok(good.clone(), &[("b.py", b"")])),
        &["`b.py` is not listed"],
    );
    assert_mentions(
        &read_err(&ok("a.py;x".to_owned(), &[])),
        &["path,sha256,bits"],
    );
    let missing = format!("{good}\n{}", manifest_line("c.py", b""));
    assert_mentions(
        &read_err(&ok(missing, &[])),
        &["`c.py`", "not in the archive"],
    );
}

#[test]
fn read_accepts_deflated_entries() {
    // Invariant: a FAB zipped by another tool (deflate) is read like Python's zipfile reads it.
    use flate2::{Compression, write::DeflateEncoder};
    let fab = fab::build_from_files(&golden()).unwrap();
    let manifest = {
        let mut lines = vec![];
        for name in entries(&fab) {
            if name != ".info/CONTENT" {
                let data = member(&fab, &name);
                lines.push(manifest_line(&name, &data));
            }
        }
        lines.join("\n")
    };
    // Rebuild with the pyproject.toml entry deflated (method 8) by patching a stored zip.
    let pyproject = member(&fab, "pyproject.toml");
    let mut enc = DeflateEncoder::new(Vec::new(), Compression::default());
    enc.write_all(&pyproject).unwrap();
    let deflated = enc.finish().unwrap();
    let mut e: Vec<(String, Vec<u8>)> = vec![];
    for name in entries(&fab) {
        let data = if name == ".info/CONTENT" {
            manifest.clone().into_bytes()
        } else {
            member(&fab, &name)
        };
        e.push((name, data));
    }
    let refs: Vec<(&str, &[u8])> = e.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
    let mut bytes = zip_of(&refs);
    // First entry is pyproject.toml at offset 0: set method 8, its compressed size, and splice.
    let name_len = "pyproject.toml".len();
    let data_at = 30 + name_len;
    bytes.splice(data_at..data_at + pyproject.len(), deflated.iter().copied());
    bytes[8] = 8;
    bytes[18..22].copy_from_slice(&(deflated.len() as u32).to_le_bytes());
    let shift = pyproject.len() - deflated.len();
    // Central directory: fix the first entry, and every later offset.
    let end = bytes.len() - 22;
    let cd = u32::from_le_bytes(bytes[end + 16..end + 20].try_into().unwrap()) as usize - shift;
    bytes[end + 16..end + 20].copy_from_slice(&(cd as u32).to_le_bytes());
    bytes[cd + 10] = 8;
    bytes[cd + 20..cd + 24].copy_from_slice(&(deflated.len() as u32).to_le_bytes());
    let mut pos = cd;
    while pos < end {
        let off = u32::from_le_bytes(bytes[pos + 42..pos + 46].try_into().unwrap()) as usize;
        if off > 0 {
            bytes[pos + 42..pos + 46].copy_from_slice(&((off - shift) as u32).to_le_bytes());
        }
        pos += 46 + u16::from_le_bytes([bytes[pos + 28], bytes[pos + 29]]) as usize;
    }
    let read = fab::read(&bytes).expect("deflated FAB reads");
    assert_eq!(read.config, fab.config);
}

/// A stored entry's contents from a FAB we built.
fn member(fab: &Fab, name: &str) -> Vec<u8> {
    let b = &fab.bytes;
    let mut pos = 0;
    loop {
        let size = u32::from_le_bytes(b[pos + 18..pos + 22].try_into().unwrap()) as usize;
        let nlen = u16::from_le_bytes([b[pos + 26], b[pos + 27]]) as usize;
        let n = std::str::from_utf8(&b[pos + 30..pos + 30 + nlen]).unwrap();
        let data = &b[pos + 30 + nlen..pos + 30 + nlen + size];
        if n == name {
            return data.to_vec();
        }
        pos += 30 + nlen + size;
    }
}

// === run config ===

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn run_config_reads_toml_pairs_and_flattens() {
    // Invariant: Flower's parse_config_args: quoted values may hold spaces, nested keys flatten.
    let parsed = parse_run_config(&args(&[
        "num-server-rounds=5 lr=0.1 name='a b' label=\"c=d\" on=true",
        "opt.momentum=0.9 t={x=1,y='z'}",
    ]))
    .unwrap();
    let want: BTreeMap<String, ConfigValue> = [
        ("num-server-rounds", ConfigValue::Int(5)),
        ("lr", ConfigValue::Float(0.1)),
        ("name", ConfigValue::Str("a b".to_owned())),
        ("label", ConfigValue::Str("c=d".to_owned())),
        ("on", ConfigValue::Bool(true)),
        ("opt.momentum", ConfigValue::Float(0.9)),
        ("t.x", ConfigValue::Int(1)),
        ("t.y", ConfigValue::Str("z".to_owned())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(parsed, want);
}

#[test]
fn a_later_argument_replaces_a_top_level_key() {
    // Invariant: Python's dict.update per argument (the nested table is replaced, not merged).
    let parsed = parse_run_config(&args(&["a.x=1 a.y=2 b=1", "a.z=3"])).unwrap();
    let keys: Vec<&String> = parsed.keys().collect();
    assert_eq!(keys, ["a.z", "b"]);
}

#[test]
fn bad_run_config_text_says_how_to_write_it() {
    // Invariant: every refusal names the text and shows the key=value form.
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["rounds = 5"],
            &[
                "`rounds = 5`",
                "not a key=value pair",
                "no spaces around `=`",
            ],
        ),
        (&["a=1 oops"], &["`oops`", "not a key=value pair"]),
        (&["name=hello"], &["not valid TOML", "quoted strings"]),
        (&["a=1 a=2"], &["not valid TOML"]),
        (&["layers=[1,2]"], &["`layers` is an array"]),
        (&["when=1979-05-27"], &["`when` is a date/time"]),
        (&["conf.toml"], &["ends in .toml", "key=value"]),
    ];
    for (input, parts) in cases {
        let message = parse_run_config(&args(input)).unwrap_err().to_string();
        assert_mentions(&message, parts);
    }
}

fn app_config() -> BTreeMap<String, ConfigValue> {
    fab::build_from_files(&golden()).unwrap().config
}

#[test]
fn unknown_override_keys_are_refused_with_the_apps_keys() {
    // Invariant: the message names the key and lists what the app declares.
    let overrides = BTreeMap::from([("num-roundz".to_owned(), ConfigValue::Int(5))]);
    let message = check_overrides(&app_config(), &overrides)
        .unwrap_err()
        .to_string();
    assert_mentions(
        &message,
        &[
            "`num-roundz`",
            "keys: lr, name, nested.deep, num-server-rounds",
            "spelling",
        ],
    );
    let none = check_overrides(&BTreeMap::new(), &overrides)
        .unwrap_err()
        .to_string();
    assert_mentions(&none, &["declares no keys"]);
}

#[test]
fn override_types_must_match_the_defaults() {
    // Invariant: key, expected and given types are named; the fix shows the default.
    let overrides = BTreeMap::from([(
        "num-server-rounds".to_owned(),
        ConfigValue::Str("five".to_owned()),
    )]);
    let err = check_overrides(&app_config(), &overrides).unwrap_err();
    assert!(matches!(err, RunConfigError::WrongType { .. }));
    assert_mentions(
        &err.to_string(),
        &[
            "`num-server-rounds`",
            "an integer",
            "a string",
            "\"five\"",
            "num-server-rounds=3",
        ],
    );
    let float_for_int = BTreeMap::from([("num-server-rounds".to_owned(), ConfigValue::Float(3.0))]);
    assert!(check_overrides(&app_config(), &float_for_int).is_err());
}

#[test]
fn an_integer_for_a_float_key_becomes_a_float() {
    // Invariant: Kubernetes writes 3.0 as 3; the SuperLink must get a double.
    let overrides = BTreeMap::from([
        ("lr".to_owned(), ConfigValue::Int(3)),
        ("nested.deep".to_owned(), ConfigValue::Bool(false)),
    ]);
    let checked = check_overrides(&app_config(), &overrides).unwrap();
    assert_eq!(checked["lr"], ConfigValue::Float(3.0));
    assert_eq!(checked["nested.deep"], ConfigValue::Bool(false));
}

#[test]
fn config_values_are_plain_json_values() {
    // Invariant: a CRD's `3`, `3.0`, `"x"`, `true` deserialize to the matching scalar.
    let v: BTreeMap<String, ConfigValue> =
        serde_json::from_str(r#"{"a":3,"b":3.0,"c":"x","d":true}"#).unwrap();
    assert_eq!(v["a"], ConfigValue::Int(3));
    assert_eq!(v["b"], ConfigValue::Float(3.0));
    assert_eq!(v["c"], ConfigValue::Str("x".to_owned()));
    assert_eq!(v["d"], ConfigValue::Bool(true));
    assert_eq!(
        serde_json::to_string(&v).unwrap(),
        r#"{"a":3,"b":3.0,"c":"x","d":true}"#
    );
}

// === properties ===

fn scalar() -> impl Strategy<Value = ConfigValue> {
    prop_oneof![
        any::<bool>().prop_map(ConfigValue::Bool),
        any::<i64>().prop_map(ConfigValue::Int),
        any::<f64>()
            .prop_filter("NaN is not equal to itself", |f| !f.is_nan())
            .prop_map(ConfigValue::Float),
        "[^\"\\x00]{0,12}".prop_map(ConfigValue::Str),
    ]
}

/// Dotted keys none of which is a prefix table of another (`a` beside `a.b` is a TOML error).
fn config() -> impl Strategy<Value = BTreeMap<String, ConfigValue>> {
    prop::collection::btree_map("[a-z0-9_-]{1,6}(\\.[a-z0-9_-]{1,6}){0,2}", scalar(), 0..8)
        .prop_map(|map| {
            let keys: Vec<String> = map.keys().cloned().collect();
            map.into_iter()
                .filter(|(k, _)| !keys.iter().any(|o| o.starts_with(&format!("{k}."))))
                .collect()
        })
}

/// A file path from parts that hit Flower's include/exclude rules.
fn path() -> impl Strategy<Value = String> {
    let dir = prop::sample::select(vec![
        "pkg",
        "sub",
        "tests",
        "__pycache__",
        ".venv",
        "build",
        "lib",
        "data",
        "é",
        "venv",
        ".flwr",
    ]);
    let file = prop::sample::select(vec![
        "mod.py",
        "test_x.py",
        "x_test.py",
        "README.md",
        "conf.yaml",
        "d.json",
        "e.jsonl",
        "notes.txt",
        "img.png",
        "LICENSE",
        "pyproject.toml",
        ".editorconfig",
        "x.egg",
        "ü.py",
    ]);
    (prop::collection::vec(dir, 0..4), file).prop_map(|(dirs, file)| {
        let mut parts: Vec<&str> = dirs;
        parts.push(file);
        parts.join("/")
    })
}

fn pyproject_with(config: &BTreeMap<String, ConfigValue>) -> String {
    let mut text = SMALL.to_owned();
    text.push_str("[tool.flwr.app.config]\n");
    for (k, v) in config {
        text.push_str(&format!("{k} = {v}\n"));
    }
    text
}

proptest! {
    #[test]
    fn built_fabs_read_back_with_their_files_and_config(
        tree in prop::collection::btree_map(path(), prop::collection::vec(any::<u8>(), 0..40), 0..12),
        config in config(),
    ) {
        // Invariant: read(build(app)) succeeds with the same hash and config; every bundled
        // file is an input file, unchanged; building is deterministic.
        let mut files = tree;
        files.insert("pyproject.toml".to_owned(), pyproject_with(&config).into_bytes());
        let fab = fab::build_from_files(&files).expect("builds");
        prop_assert_eq!(&fab.config, &config);
        let back = fab::read(&fab.bytes).expect("reads");
        prop_assert_eq!(&back, &fab);
        for name in entries(&fab) {
            if name != "pyproject.toml" && name != ".info/CONTENT" {
                prop_assert_eq!(&member(&fab, &name), &files[&name]);
                prop_assert!(!name.ends_with(".txt") && !name.ends_with(".png"));
                prop_assert!(!name.contains("__pycache__") && !name.starts_with(".venv/"));
            }
        }
        prop_assert_eq!(fab::build_from_files(&files).unwrap().bytes, fab.bytes);
    }

    #[test]
    fn read_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = fab::read(&bytes);
        let mut zipish = b"PK\x03\x04".to_vec();
        zipish.extend_from_slice(&bytes);
        zipish.extend_from_slice(b"PK\x05\x06");
        let _ = fab::read(&zipish);
    }

    #[test]
    fn read_never_panics_on_mutated_fabs(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4), cut in any::<prop::sample::Index>()) {
        // Invariant: a damaged FAB is an error (or, if the damage is harmless, a FAB), never a
        // panic; truncation always fails.
        let fab = fab::build_from_files(&golden()).unwrap();
        let mut bytes = fab.bytes.clone();
        for (at, value) in &flips {
            let i = at.index(bytes.len());
            bytes[i] ^= value | 1;
        }
        let _ = fab::read(&bytes);
        let truncated = &fab.bytes[..cut.index(fab.bytes.len())];
        prop_assert!(fab::read(truncated).is_err());
    }

    #[test]
    fn run_config_never_panics(input in prop::collection::vec(".{0,40}", 0..4)) {
        let _ = parse_run_config(&input);
    }

    #[test]
    fn run_config_round_trips(config in config(), split in any::<prop::sample::Index>()) {
        // Invariant: values written as key=value (Display) parse back to themselves, in one
        // argument or split over two.
        let pairs: Vec<String> = config.iter().map(|(k, v)| format!("{k}={v}")).collect();
        prop_assert_eq!(&parse_run_config(&[pairs.join(" ")]).unwrap(), &config);
        let at = split.index(pairs.len() + 1);
        let two = [pairs[..at].join(" "), pairs[at..].join("  ")];
        let tops: Vec<&str> = config.keys().map(|k| k.split('.').next().unwrap_or("")).collect();
        let shared_top = tops[..at].iter().any(|t| tops[at..].contains(t));
        if !shared_top {
            prop_assert_eq!(&parse_run_config(&two).unwrap(), &config);
        }
    }

    #[test]
    fn overrides_of_the_apps_types_pass_unchanged(app in config(), pick in prop::collection::vec(any::<prop::sample::Index>(), 0..4)) {
        // Invariant: same-typed overrides of declared keys come back as given; an integer for
        // a float key comes back a float; a key outside the app is refused.
        let keys: Vec<&String> = app.keys().collect();
        if keys.is_empty() {
            return Ok(());
        }
        let chosen: BTreeMap<String, ConfigValue> = pick
            .iter()
            .map(|i| {
                let k = keys[i.index(keys.len())];
                (k.clone(), app[k].clone())
            })
            .collect();
        prop_assert_eq!(&check_overrides(&app, &chosen).unwrap(), &chosen);
        for (k, v) in &app {
            if let ConfigValue::Float(_) = v {
                let one = BTreeMap::from([(k.clone(), ConfigValue::Int(7))]);
                prop_assert_eq!(&check_overrides(&app, &one).unwrap()[k], &ConfigValue::Float(7.0));
            }
        }
        let unknown = BTreeMap::from([("not-a-key!".to_owned(), ConfigValue::Int(1))]);
        let refused = matches!(check_overrides(&app, &unknown), Err(RunConfigError::UnknownKey { .. }));
        prop_assert!(refused);
    }
}

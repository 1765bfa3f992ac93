//! Our FABs and run-config parsing against the real Flower 1.42 (the `e2e/flower/venv.sh 1.42.0`
//! venv): `flwr build` of examples/fedavg and of hand-made apps gives byte-identical FABs to
//! `flower_addon_hub::flower::fab::build_from_dir`; so does Flower's `build_fab_from_disk` on
//! a batch of generated apps (or both refuse the app); and `parse_run_config` reads what
//! Flower's `parse_config_args` reads. No cluster, no network.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};
use flower_addon_hub::flower::fab::{self, ConfigValue, RunConfigError};
use serde_json::Value;

const VERSION: &str = "1.42.0";

/// An app as relative paths and contents.
type AppFiles = Vec<(String, Vec<u8>)>;

/// The Flower 1.42.0 venv; a missing one fails the test, naming the script that makes it.
fn venv() -> PathBuf {
    venv_of(VERSION)
}

fn venv_of(version: &str) -> PathBuf {
    match e2e::harness::flower_venv(version) {
        Ok(v) => v,
        Err(e) => panic!(
            "the Flower {version} venv is missing: run `e2e/flower/venv.sh {version}` ({e:#})"
        ),
    }
}

/// Runs the venv's python on `script` with `args`, feeding `stdin`; its stdout.
fn python(venv: &Path, script: &str, args: &[&Path], stdin: &str) -> Result<String> {
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg("-c")
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    e2e::flwr::flower_env(&mut cmd);
    let mut child = cmd.spawn().context("starting the venv's python")?;
    if let Some(mut input) = child.stdin.take() {
        std::io::Write::write_all(&mut input, stdin.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

fn write_app(dir: &Path, files: &AppFiles) -> Result<()> {
    for (path, data) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().context("a parent")?)?;
        std::fs::write(&p, data).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn text_files(list: &[(&str, &str)]) -> AppFiles {
    list.iter()
        .map(|(p, t)| ((*p).to_owned(), t.as_bytes().to_vec()))
        .collect()
}

/// `flwr build --app DIR` in a fresh directory: the FAB it writes.
fn flwr_build(venv: &Path, app: &Path, scratch: &Path) -> Result<Vec<u8>> {
    let out_dir = tempfile::tempdir_in(scratch)?;
    let mut cmd = Command::new(venv.join("bin/flwr"));
    cmd.arg("build")
        .arg("--app")
        .arg(app)
        .current_dir(out_dir.path())
        .env("FLWR_HOME", out_dir.path().join(".flwr-home"))
        .stdin(Stdio::null());
    e2e::flwr::flower_env(&mut cmd);
    let out = cmd.output().context("running flwr build")?;
    ensure!(
        out.status.success(),
        "flwr build --app {} failed: {}{}",
        app.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for entry in std::fs::read_dir(out_dir.path())? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "fab") {
            return Ok(std::fs::read(path)?);
        }
    }
    bail!(
        "flwr build wrote no .fab: {}",
        String::from_utf8_lossy(&out.stdout)
    )
}

const COMPONENTS: &[(&str, &str)] = &[
    ("app_pkg/__init__.py", ""),
    ("app_pkg/server_app.py", "app = None\n"),
    ("app_pkg/client_app.py", "app = None\n"),
];

fn pyproject(name: &str, rest: &str) -> String {
    format!(
        "[project]\nname = \"{name}\"\nversion = \"1.0.0\"\n\n[tool.flwr.app]\npublisher = \"flower-addon\"\n\n[tool.flwr.app.components]\nserverapp = \"app_pkg.server_app:app\"\nclientapp = \"app_pkg.client_app:app\"\n{rest}"
    )
}

/// Hand-made apps covering what real ones hold: nested packages, a .gitignore, a README,
/// files the default patterns exclude, unicode, arrays and inline tables, CRLF line endings,
/// `fab-include` / `fab-exclude`.
fn crafted_apps() -> Vec<(&'static str, AppFiles)> {
    let nested = pyproject(
        "nested",
        "\n[tool.flwr.app.config]\nnum-server-rounds = 3\nlr = 0.01\n\n[tool.flwr.federations]\ndefault = \"local\"\n\n[tool.flwr.federations.local]\naddress = \"127.0.0.1:9093\"\ninsecure = true\n",
    );
    let mut files = text_files(COMPONENTS);
    files.extend(text_files(&[
        ("pyproject.toml", &nested),
        ("README.md", "# nested\n"),
        (
            ".gitignore",
            "# generated\nsecret/\n*.log\n/local_*.py\n!local_keep.py\n",
        ),
        ("app_pkg/sub/deep/model.py", "W = 1\n"),
        ("app_pkg/sub/__init__.py", ""),
        ("app_pkg/sub/conf.yaml", "a: 1\n"),
        ("app_pkg/sub/data.json", "{}\n"),
        ("app_pkg/test_model.py", "def test(): pass\n"),
        ("app_pkg/model_test.py", "def test(): pass\n"),
        ("app_pkg/__pycache__/x.cpython-311.pyc", "\0"),
        ("app_pkg/__pycache__/y.py", ""),
        (".venv/lib/site.py", ""),
        ("venv/x.py", ""),
        ("build/lib/x.py", ""),
        ("secret/key.py", "KEY = 1\n"),
        ("local_x.py", ""),
        ("local_keep.py", ""),
        ("notes.txt", "not bundled\n"),
        ("data.csv", "1,2\n"),
        ("LICENSE", "Apache-2.0\n"),
        ("docs/guide.md", "guide\n"),
        ("plugin/pyproject.toml", "[project]\nname = \"inner\"\n"),
        (".editorconfig", "root = true\n"),
        ("app_pkg/été.py", "x = 'é'\n"),
    ]));
    let unicode = pyproject(
        "unicode",
        r#"
[tool.flwr.app.config]
name = "naïve — 日本 \"q\" \\ tab	end"
literal = 'C:\path\x'
multi = """two
lines"""
tiny = 1e-7
huge = 1E22
hex = 0xff
under = 1_000_000
neg-zero = -0.0
"quoted key" = true
nested.deep.value = 5

[tool.flwr.app.config.sub]
x = "y"

[tool.other]
authors = [{ name = "Ünïcode", email = "u@example.org" }, { name = "B" }]
long = [{ name = "a rather long name that goes on", email = "someone.with.a.long.address@example.org", note = "x" }]
matrix = [[1, 2], [3], []]
mixed = [1, "two", 3.0, true, { k = "v" }]
when = 1979-05-27T07:32:00Z
day = 1979-05-27
at = 07:32:00.5
empty = {}
"" = "empty key"

[[tool.aot]]
a = 1

[[tool.aot]]
b = [1, 2]
"#,
    );
    let mut unicode_files = text_files(COMPONENTS);
    unicode_files.push(("pyproject.toml".to_owned(), unicode.into_bytes()));

    let crlf = pyproject(
        "crlf",
        "\n[tool.flwr.app.config]\ntext = \"\"\"a\nb\"\"\"\nrounds = 2\n",
    )
    .replace('\n', "\r\n");
    let mut crlf_files = text_files(COMPONENTS);
    crlf_files.push(("pyproject.toml".to_owned(), crlf.into_bytes()));

    let patterns = pyproject("patterns", "").replacen(
        "publisher = \"flower-addon\"\n",
        "publisher = \"flower-addon\"\nfab-include = [\"app_pkg/**\", \"README.md\"]\nfab-exclude = [\"app_pkg/extra/**\"]\n",
        1,
    );
    let mut pattern_files = text_files(COMPONENTS);
    pattern_files.extend(text_files(&[
        ("pyproject.toml", &patterns),
        ("README.md", "# patterns\n"),
        ("app_pkg/extra/skip.py", ""),
        ("app_pkg/keep.yaml", "k: v\n"),
        ("other.py", ""),
    ]));
    vec![
        ("nested", files),
        ("unicode", unicode_files),
        ("crlf", crlf_files),
        ("patterns", pattern_files),
    ]
}

#[test]
fn flwr_build_and_ours_make_identical_fabs() {
    // Invariant: for the example app and apps like real ones, our FAB is `flwr build`'s, byte
    // for byte (so the SuperLink computes the same sha256).
    let venv = venv();
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut apps = vec![(
        "examples/fedavg".to_owned(),
        e2e::repo_root().join("examples/fedavg"),
    )];
    for (name, files) in crafted_apps() {
        let dir = scratch.path().join(name);
        write_app(&dir, &files).expect("app written");
        apps.push((name.to_owned(), dir));
    }
    let mut failures = Vec::new();
    for (name, dir) in &apps {
        let theirs = match flwr_build(&venv, dir, scratch.path()) {
            Ok(b) => b,
            Err(e) => {
                failures.push(format!("{name}: {e:#}"));
                continue;
            }
        };
        let ours = match fab::build_from_dir(dir) {
            Ok(f) => f,
            Err(e) => {
                failures.push(format!("{name}: flwr built it, we refused: {e}"));
                continue;
            }
        };
        let theirs_hash = fab::read(&theirs).map(|f| f.hash);
        eprintln!(
            "{name}: flwr build {} ({} bytes), ours {} ({} bytes)",
            theirs_hash.as_deref().unwrap_or("unreadable"),
            theirs.len(),
            ours.hash,
            ours.bytes.len()
        );
        if theirs != ours.bytes {
            let at = theirs.iter().zip(&ours.bytes).position(|(a, b)| a != b);
            failures.push(format!(
                "{name}: FABs differ (first at byte {at:?}); flwr's pyproject.toml:\n{}",
                String::from_utf8_lossy(&theirs)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn fabs_of_flwr_1_25_are_read() {
    // Invariant: FABs an older `flwr build` made (1.25: no publish rules, pyproject.toml not in
    // .info/CONTENT, a trailing newline there) pass `read` with the app's id and config.
    let venv = venv_of("1.25.0");
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut apps = vec![(
        "examples/fedavg".to_owned(),
        e2e::repo_root().join("examples/fedavg"),
    )];
    let (name, files) = crafted_apps().swap_remove(0);
    let dir = scratch.path().join(name);
    write_app(&dir, &files).expect("app written");
    apps.push((name.to_owned(), dir));
    for (name, dir) in apps {
        let theirs = flwr_build(&venv, &dir, scratch.path()).expect("flwr 1.25 builds it");
        let read = fab::read(&theirs).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ours = fab::build_from_dir(&dir).expect("we build it");
        eprintln!(
            "{name}: flwr 1.25 build {} read as {}",
            read.hash, read.fab_id
        );
        assert_eq!(
            (&read.fab_id, &read.version, &read.config),
            (&ours.fab_id, &ours.version, &ours.config)
        );
    }
}

// === generated apps ===

/// SplitMix64: reproducible apps without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

const DIRS: &[&str] = &[
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
    "docs",
    "a b",
    "env",
];
const FILES: &[&str] = &[
    "mod.py",
    "test_x.py",
    "x_test.py",
    "README.md",
    "conf.yaml",
    "c.yml",
    "d.json",
    "e.jsonl",
    "notes.txt",
    "img.png",
    "LICENSE",
    "LICENSE.md",
    "pyproject.toml",
    ".editorconfig",
    "x.egg",
    "ü.py",
    "[x].py",
    "#h.md",
    ".hidden.py",
];
const GITIGNORE: &[&str] = &[
    "*.md",
    "!README.md",
    "docs/",
    "/conf.yaml",
    "**/data/**",
    "pkg/*.json",
    "# comment",
    "sub",
    "[abc]*.py",
    "*.py[cod]",
    "build",
    "\\#h.md",
    "mod.py   ",
    "!pkg/",
    "é/",
    "test_*",
    "*.jsonl",
    "LICENSE",
    "pkg/**/mod.py",
    "**/mod.py",
    "!/mod.py",
    "[!a]*.yaml",
    "*.y?ml",
    "/.editorconfig",
    "  ",
    "a b/",
    "\\[x\\].py",
    "[x].py",
    "*",
    "!*.py",
    "**/",
    "/*",
];
const PATTERNS: &[&str] = &[
    "pkg/**",
    "**/*.py",
    "*.md",
    "docs/**",
    "mod.py",
    "nothing/**",
    "LICENSE",
    "[",
    "!pkg/mod.py",
    "**/*.yaml",
];
const LITERALS: &[&str] = &[
    "1",
    "-7",
    "0x1F",
    "0o17",
    "0b101",
    "1_000",
    "3.0",
    "0.1",
    "1e-7",
    "1E22",
    "-0.0",
    "+inf",
    "-inf",
    "nan",
    "6.02e23",
    "5e-324",
    "1.7976931348623157e308",
    "0.30000000000000004",
    "true",
    "false",
    "\"é 日本 \\\" q\"",
    "'lit\\eral'",
    "\"\"\"multi\nline\"\"\"",
    "'''raw\nlines'''",
    "\"\\u0001ctl\\ttab\\u007f\"",
    "\"\"",
    "\"a\\\\b\"",
    "\"🌸\"",
    "9223372036854775807",
    "-9223372036854775808",
    "123456789012345678.0",
    "1e16",
    "1e15",
    "0.0001",
    "0.00001",
];
const EXTRAS: &[&str] = &[
    "authors = [{ name = \"A\", email = \"a@x.org\" }, { name = \"B\" }]",
    "long = [{ name = \"a rather long name that goes on and on\", email = \"someone.with.a.long.address@example.org\" }]",
    "matrix = [[1, 2], [3], []]",
    "when = 1979-05-27T07:32:00.999999999+05:30",
    "day = 1979-05-27",
    "empty = {}",
    "\"spaced key\" = 1",
    "nested = { a = { b = [1, { c = 2 }] } }",
    "strings = [\"x\", 'y', \"\"\"z\"\"\"]",
    "t.u.v = 1",
];

fn float_literal(rng: &mut Rng) -> String {
    let x = f64::from_bits(rng.next());
    ConfigValue::Float(x).to_string()
}

fn generated_app(rng: &mut Rng, i: usize) -> AppFiles {
    let mut files = text_files(COMPONENTS);
    for _ in 0..rng.below(10) {
        let depth = rng.below(4);
        let mut parts: Vec<&str> = (0..depth).map(|_| rng.pick(DIRS)).collect();
        parts.push(rng.pick(FILES));
        let data: Vec<u8> = (0..rng.below(60)).map(|_| rng.next() as u8).collect();
        files.push((parts.join("/"), data));
    }
    if rng.chance(60) {
        let lines: Vec<&str> = (0..1 + rng.below(4)).map(|_| rng.pick(GITIGNORE)).collect();
        let eol = if rng.chance(20) { "\r\n" } else { "\n" };
        files.push((".gitignore".to_owned(), lines.join(eol).into_bytes()));
    }
    let mut text = String::new();
    let _ = writeln!(
        text,
        "[project]\nname = \"gen{i}\"\nversion = \"{}\"",
        rng.pick(&["1.0.0", "0.1", "2024.10.1"])
    );
    if rng.chance(50) {
        text.push_str("description = \"Fédération 🌸 \\\"x\\\"\"\nlicense = \"Apache-2.0\"\n");
    }
    if rng.chance(40) {
        text.push_str(rng.pick(&[
            "dependencies = [\"flwr>=1.25.0\", \"numpy>=1.26\"]\n",
            "dependencies = [\"flwr[simulation]>=1.42\"]\n",
            "dependencies = [\"flwr>=1\", \"flwr<2\"]\n",
            "dependencies = []\n",
        ]));
    }
    let _ = writeln!(
        text,
        "\n[tool.flwr.app]\npublisher = \"{}\"",
        rng.pick(&["flower-addon", "org-1", "Ünïcode"])
    );
    for key in ["fab-include", "fab-exclude"] {
        if rng.chance(10) {
            let n = 1 + rng.below(2);
            let list: Vec<String> = (0..n)
                .map(|_| format!("\"{}\"", rng.pick(PATTERNS)))
                .collect();
            let _ = writeln!(text, "{key} = [{}]", list.join(", "));
        }
    }
    text.push_str("\n[tool.flwr.app.components]\nserverapp = \"app_pkg.server_app:app\"\nclientapp = \"app_pkg.client_app:app\"\n");
    text.push_str("\n[tool.flwr.app.config]\n");
    for k in 0..rng.below(7) {
        let value = if rng.chance(20) {
            float_literal(rng)
        } else if rng.chance(10) {
            (rng.next() as i64).to_string()
        } else {
            rng.pick(LITERALS).to_owned()
        };
        let _ = writeln!(text, "key-{k} = {value}");
    }
    if rng.chance(5) {
        text.push_str("bad = [1, 2]\n");
    }
    if rng.chance(30) {
        let _ = writeln!(
            text,
            "\n[tool.flwr.app.config.sub]\nx = {}",
            rng.pick(LITERALS)
        );
    }
    if rng.chance(50) {
        text.push_str("\n[tool.other]\n");
        let extras: std::collections::BTreeSet<&str> =
            (0..1 + rng.below(4)).map(|_| rng.pick(EXTRAS)).collect();
        for line in extras {
            let _ = writeln!(text, "{line}");
        }
    }
    if rng.chance(20) {
        text.push_str("\n[[tool.aot]]\na = 1\n\n[[tool.aot]]\nb = \"x\"\n");
    }
    if rng.chance(30) {
        text.push_str("\n[tool.flwr.federations]\ndefault = \"x\"\n[tool.flwr.federations.x]\naddress = \"h:1\"\n");
    }
    if rng.chance(15) {
        text = text.replace('\n', "\r\n");
    }
    files.push(("pyproject.toml".to_owned(), text.into_bytes()));
    files
}

const BUILD_MANY: &str = r#"
import sys, pathlib
from flwr.cli.build import build_fab_from_disk
root, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for d in sorted(root.iterdir()):
    try:
        (out / (d.name + ".fab")).write_bytes(build_fab_from_disk(d))
    except BaseException as e:
        (out / (d.name + ".err")).write_text(f"{type(e).__name__}: {e}")
"#;

#[test]
fn generated_apps_build_as_flower_builds_them() {
    // Invariant: on many generated apps (random trees, .gitignore lines, patterns, TOML value
    // kinds), Flower's build_fab_from_disk and our build_from_dir both succeed with identical
    // bytes, or both refuse the app.
    const APPS: usize = 200;
    let venv = venv();
    let scratch = tempfile::tempdir().expect("temp dir");
    let (apps, out) = (scratch.path().join("apps"), scratch.path().join("out"));
    std::fs::create_dir_all(&out).unwrap();
    let mut rng = Rng(0x00F1_0AE2);
    for i in 0..APPS {
        write_app(
            &apps.join(format!("app{i:03}")),
            &generated_app(&mut rng, i),
        )
        .unwrap();
    }
    python(&venv, BUILD_MANY, &[&apps, &out], "").expect("Flower built the apps");
    let (mut same, mut both_refused, mut failures) = (0, 0, Vec::new());
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..APPS {
        let name = format!("app{i:03}");
        let theirs = std::fs::read(out.join(format!("{name}.fab")));
        let ours = fab::build_from_dir(&apps.join(&name));
        match (theirs, ours) {
            (Ok(t), Ok(o)) if t == o.bytes => same += 1,
            (Ok(t), Ok(_)) => failures.push(format!(
                "{name}: bytes differ; Flower's FAB:\n{}",
                String::from_utf8_lossy(&t)
            )),
            (Ok(_), Err(e)) => failures.push(format!("{name}: Flower built it, we refused: {e}")),
            (Err(_), Ok(_)) => failures.push(format!(
                "{name}: we built it, Flower refused: {}",
                std::fs::read_to_string(out.join(format!("{name}.err"))).unwrap_or_default()
            )),
            (Err(_), Err(_)) => {
                both_refused += 1;
                let why =
                    std::fs::read_to_string(out.join(format!("{name}.err"))).unwrap_or_default();
                let short: String = why.chars().take(50).collect();
                *reasons.entry(short).or_insert(0) += 1;
            }
        }
    }
    eprintln!("{same} identical FABs, {both_refused} apps refused by both; Flower's reasons:");
    for (why, n) in &reasons {
        eprintln!("  {n:3} {why}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        same >= APPS / 2,
        "too few apps built ({same}): the generator is off"
    );
}

// === run config ===

const PARSE_MANY: &str = r#"
import json, sys
from flwr.common.config import parse_config_args
out = []
for args in json.load(sys.stdin):
    try:
        r = parse_config_args(args)
        out.append({"ok": {k: [type(v).__name__, repr(v) if isinstance(v, (float, int)) and not isinstance(v, bool) else v] for k, v in r.items()}})
    except BaseException as e:
        out.append({"err": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
"#;

/// How our reading of an input compares with Flower's.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Expect {
    /// The same values, or both refuse.
    Same,
    /// Flower ignores text outside key=value pairs, or takes integers beyond 64 bits (and
    /// fails later, sending them); we refuse.
    Stricter,
}

fn ours_as_json(map: &BTreeMap<String, ConfigValue>) -> Value {
    let mut obj = serde_json::Map::new();
    for (k, v) in map {
        let pair = match v {
            ConfigValue::Bool(b) => serde_json::json!(["bool", b]),
            ConfigValue::Int(i) => serde_json::json!(["int", i.to_string()]),
            ConfigValue::Float(_) => serde_json::json!(["float", v.to_string()]),
            ConfigValue::Str(s) => serde_json::json!(["str", s]),
        };
        obj.insert(k.clone(), pair);
    }
    Value::Object(obj)
}

#[test]
fn run_config_reads_as_flowers_parse_config_args() {
    // Invariant: what Flower accepts we read to the same typed values; what Flower refuses we
    // refuse; we are stricter only where Flower silently drops text.
    use Expect::{Same, Stricter};
    let cases: Vec<(Vec<&str>, Expect)> = vec![
        (vec!["num-server-rounds=5"], Same),
        (vec!["lr=0.1 name='a b'"], Same),
        (vec!["a=1 b=2", "c=3"], Same),
        (vec!["a.b=1 a.c=2"], Same),
        (vec!["a.b=1", "a.c=2"], Same),
        (vec!["t={x=1,y=\"z\"}"], Same),
        (vec!["x=1e16 y=-0.0 z=inf w=nan v=0.1 u=5e-324"], Same),
        (vec!["x=0xff y=0o17 z=0b11 w=1_000"], Same),
        (vec!["s=\"é 日本\" t='it'"], Same),
        (vec!["k=\"a=b\""], Same),
        (vec!["k=a=b"], Same),
        (vec!["a=[1,2]"], Same),
        (vec!["d=1979-05-27"], Same),
        (vec!["a=1 a=2"], Same),
        (vec!["name=hello"], Same),
        (vec![""], Same),
        (vec!["   "], Same),
        (vec![], Same),
        (vec!["x=true y=false"], Same),
        (vec!["x=True"], Same),
        (vec!["\"quoted.key\"=1"], Same),
        (vec!["x=\"\" y=''"], Same),
        (vec!["x=\"unterminated"], Same),
        (vec!["x='a b' y=\"c d\""], Same),
        (vec!["a==5"], Same),
        (vec!["ключ=1"], Same),
        (vec!["x=9223372036854775807 y=-9223372036854775808"], Same),
        (vec!["x=1.5e308 y=-1.7976931348623157e308"], Same),
        (vec!["x=\"tab\there\""], Same),
        (vec!["x=\"\\u00e9\\n\""], Same),
        (vec!["x='C:\\path'"], Same),
        (vec!["conf.toml"], Same),
        (vec!["a=1", "b.toml"], Same),
        (vec!["a=1\tb=2\nc=3"], Same),
        (vec!["x.y.z=1 x.w='v'"], Same),
        (vec!["x=1 x.y=2"], Same),
        (vec!["x={}"], Same),
        (vec!["x=+1 y=-0"], Same),
        (vec!["x=01"], Same),
        (vec!["x=1__0"], Same),
        (vec!["x=.5"], Same),
        (vec!["k = v"], Stricter),
        (vec!["a=1 junk"], Stricter),
        (vec!["=5"], Stricter),
        (vec!["a= 5"], Stricter),
        (vec!["x=9223372036854775808"], Stricter),
        // Flower reads an overflowing float as inf; toml_edit refuses it.
        (vec!["x=1e400"], Stricter),
    ];
    let venv = venv();
    let inputs: Vec<Vec<&str>> = cases.iter().map(|(i, _)| i.clone()).collect();
    let out = python(
        &venv,
        PARSE_MANY,
        &[],
        &serde_json::to_string(&inputs).unwrap(),
    )
    .expect("Flower parsed the inputs");
    let theirs: Vec<Value> = serde_json::from_str(&out).expect("JSON from Flower");
    let mut failures = Vec::new();
    for ((input, expect), theirs) in cases.iter().zip(&theirs) {
        let args: Vec<String> = input.iter().map(|s| (*s).to_owned()).collect();
        let ours = fab::parse_run_config(&args);
        let verdict = match (&ours, theirs.get("ok"), expect) {
            (Ok(map), Some(t), _) if ours_as_json(map) == *t => Ok(()),
            (Ok(map), Some(t), _) => Err(format!("ours {} != Flower's {t}", ours_as_json(map))),
            (Err(_), None, Same) => Ok(()),
            (Err(e), Some(t), Same) => Err(format!("we refused ({e}), Flower read {t}")),
            (
                Err(RunConfigError::NotAPair { .. } | RunConfigError::Syntax { .. }),
                Some(_),
                Stricter,
            ) => Ok(()),
            (Err(e), _, Stricter) => Err(format!("expected a stricter refusal, got {e}")),
            (Ok(map), None, _) => Err(format!(
                "we read {}, Flower refused: {}",
                ours_as_json(map),
                theirs["err"]
            )),
        };
        if let Err(why) = verdict {
            failures.push(format!("{input:?}: {why}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

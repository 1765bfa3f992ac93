//! Golden files: every example (`examples/*.yaml`) and test fixture (`hub/tests/fixtures/*.yaml`)
//! holding a Federation, rendered for the hub and for one spoke, compared byte for byte with `hub/tests/golden/`.
//! `FLOWER_ADDON_BLESS=1 cargo test -p flower-addon-hub --test render_golden` rewrites them and
//! then fails on purpose, so that a bless run can never pass (in CI or anywhere): review the diff
//! of `hub/tests/golden/` and run again without the variable.

use std::path::{Path, PathBuf};

use flower_addon_crds::{Object, parse_documents};
use flower_addon_hub::cli::offline::{SpokeArgs, render_stream};

fn inputs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [root.join("../examples"), root.join("tests/fixtures")] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            // Only files that render something: a Federation (not, e.g., a lone FlowerRun).
            let renders = std::fs::read_to_string(&path).is_ok_and(|t| {
                parse_documents("input", &t)
                    .is_ok_and(|o| o.iter().any(|o| matches!(o, Object::Federation(_))))
            });
            if path.extension().is_some_and(|e| e == "yaml" || e == "yml") && renders {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The golden text of one input: the hub side, then what cluster `spoke-b` (index 1 of 3) applies.
fn golden_text(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("input readable");
    let feds: Vec<Object> =
        parse_documents(&path.display().to_string(), &text).unwrap_or_else(|e| panic!("{e}"));
    let hub =
        render_stream(&feds, None, None).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let spoke = SpokeArgs {
        cluster: "spoke-b",
        index: 1,
        clusters: 3,
        labels: Default::default(),
    };
    // The hub's node address (`serve --node-address`) for NodePort Federations without
    // externalAddress; examples that set externalAddress ignore it.
    let spoke = render_stream(&feds, Some(&spoke), Some("198.18.0.1"))
        .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    format!("# ===== hub =====\n{hub}# ===== cluster spoke-b (index 1 of 3) =====\n{spoke}")
}

#[test]
fn rendered_examples_match_golden_files() {
    // Rendering changes only on purpose: any byte of difference in any example fails here.
    // Only `1` blesses (like `crds/tests/crd_files.rs`): `FLOWER_ADDON_BLESS=0` or an empty
    // value compares as usual.
    let bless = std::env::var("FLOWER_ADDON_BLESS").is_ok_and(|v| v == "1");
    let golden_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let inputs = inputs();
    assert!(!inputs.is_empty(), "no examples or fixtures found");
    let mut failures = Vec::new();
    let mut blessed = Vec::new();
    for input in inputs {
        let name = input
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        let golden = golden_dir.join(&name);
        let actual = golden_text(&input);
        if bless {
            std::fs::write(&golden, &actual).expect("write golden");
            blessed.push(name);
            continue;
        }
        let expected = std::fs::read_to_string(&golden).unwrap_or_default();
        if expected != actual {
            let first = expected
                .lines()
                .zip(actual.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(expected.lines().count().min(actual.lines().count()));
            failures.push(format!(
                "{name}: differs from {} at line {} (expected {:?}, got {:?})",
                golden.display(),
                first + 1,
                expected.lines().nth(first).unwrap_or("<end>"),
                actual.lines().nth(first).unwrap_or("<end>"),
            ));
        }
    }
    // A bless run writes every golden and then fails loudly: it must never count as a pass.
    assert!(
        !bless,
        "goldens re-blessed ({} files: {}); review the diff of hub/tests/golden/ and run again \
         without FLOWER_ADDON_BLESS",
        blessed.len(),
        blessed.join(", ")
    );
    assert!(
        failures.is_empty(),
        "{}\nIf the change is intended, run `FLOWER_ADDON_BLESS=1 cargo test -p flower-addon-hub --test render_golden` (it rewrites hub/tests/golden/ and fails), review the diff and run again without it.",
        failures.join("\n")
    );
}

#[test]
fn rendering_is_byte_identical_across_runs() {
    // An unchanged Federation renders byte-identical objects (no pod restarts on reconcile).
    for input in inputs() {
        let first = golden_text(&input);
        for _ in 0..5 {
            assert_eq!(golden_text(&input), first, "{}", input.display());
        }
    }
}

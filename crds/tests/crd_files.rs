//! The committed `manifests/crds/` must be exactly what the code generates.

use std::path::PathBuf;

/// Where the generated CRDs are committed: the plain manifests and the Helm chart's `crds/`.
fn crd_dirs() -> [PathBuf; 2] {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests");
    [root.join("crds"), root.join("chart/flower-addon/crds")]
}

// The committed CRD files equal the generated ones, so what is installed (by kubectl or helm) is
// what the code validates.
#[test]
fn manifests_crds_are_up_to_date() {
    for dir in crd_dirs() {
        check_crds_in(dir);
    }
}

fn check_crds_in(dir: PathBuf) {
    let bless = std::env::var("FLOWER_ADDON_BLESS").is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    let mut expected_names = Vec::new();
    for crd in flower_addon_crds::crds() {
        let name = flower_addon_crds::crd_file_name(&crd);
        let want = flower_addon_crds::crd_yaml(&crd);
        let path = dir.join(&name);
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &want).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(want.as_str()) {
            stale.push(name.clone());
        }
        expected_names.push(name);
    }
    let mut extra: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".yaml") && !expected_names.contains(n))
                .collect()
        })
        .unwrap_or_default();
    extra.sort();
    assert!(
        stale.is_empty() && extra.is_empty(),
        "{} is stale (differs: {stale:?}, not generated: {extra:?}); regenerate with \
         `FLOWER_ADDON_BLESS=1 cargo test -p flower-addon-crds --test crd_files` and commit the result",
        dir.display()
    );
}

// Generation is deterministic, so reconciling the CRDs never flaps.
#[test]
fn crds_yaml_is_deterministic() {
    assert_eq!(
        flower_addon_crds::crds_yaml(),
        flower_addon_crds::crds_yaml()
    );
}

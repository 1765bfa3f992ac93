use super::*;
use flower_addon_crds::run::ConfigMapKeyRef;
use k8s_openapi::ByteString;

fn from_config_map() -> FabSource {
    FabSource {
        config_map_ref: Some(ConfigMapKeyRef {
            name: "fab".into(),
            key: "app.fab".into(),
        }),
        ..FabSource::default()
    }
}

#[test]
fn a_missing_config_map_or_key_waits_in_both_modes_and_says_how_to_add_it() {
    // Invariant: a ConfigMap (or key) that is not there yet holds the run (Missing), in
    // both modes, with the command that adds it where that mode reads it from.
    let (source, standalone) = fab_bytes(
        "ns",
        &from_config_map(),
        None,
        ConfigMapSource::ManifestsDirectory,
    );
    assert_eq!(source, "ConfigMap ns/fab key app.fab");
    let FabBytes::Missing(message) = standalone else {
        panic!("{standalone:?}")
    };
    assert!(
        message.contains("is not in the manifests directory"),
        "{message}"
    );
    assert!(message.contains("--dry-run=client -o yaml"), "{message}");
    let (_, cluster) = fab_bytes("ns", &from_config_map(), None, ConfigMapSource::Cluster);
    let FabBytes::Missing(message) = cluster else {
        panic!("{cluster:?}")
    };
    assert!(
        message.contains("ConfigMap ns/fab does not exist"),
        "{message}"
    );
    assert!(
        message.contains("kubectl create configmap fab -n ns --from-file=app.fab=APP.fab"),
        "{message}"
    );
    let no_key = ConfigMap {
        data: Some([("other".to_owned(), "x".to_owned())].into()),
        ..ConfigMap::default()
    };
    for mode in [
        ConfigMapSource::ManifestsDirectory,
        ConfigMapSource::Cluster,
    ] {
        let (_, found) = fab_bytes("ns", &from_config_map(), Some(&no_key), mode);
        assert!(
            matches!(&found, FabBytes::Missing(m) if m.contains("has no key \"app.fab\"")),
            "{found:?}"
        );
    }
    let (state, app) = check_app(
        &source,
        FabBytes::Missing("m".into()),
        &BTreeMap::new(),
        None,
    );
    assert_eq!(
        state,
        AppState::Missing {
            message: "m".into()
        }
    );
    assert!(app.is_none());
}

#[test]
fn binary_data_wins_over_data_and_a_url_waits_for_the_download_with_one_message() {
    // Invariant: binaryData beats data, and a url is never refused by the ConfigMap reader:
    // it waits, in both modes alike, for fab_bytes_from to download it.
    let both = ConfigMap {
        binary_data: Some([("app.fab".to_owned(), ByteString(vec![1, 2]))].into()),
        data: Some([("app.fab".to_owned(), "text".to_owned())].into()),
        ..ConfigMap::default()
    };
    let (_, found) = fab_bytes(
        "ns",
        &from_config_map(),
        Some(&both),
        ConfigMapSource::Cluster,
    );
    assert_eq!(found, FabBytes::Found(vec![1, 2]));
    let text = ConfigMap {
        data: both.data.clone(),
        ..ConfigMap::default()
    };
    let (_, found) = fab_bytes(
        "ns",
        &from_config_map(),
        Some(&text),
        ConfigMapSource::Cluster,
    );
    assert_eq!(found, FabBytes::Found(b"text".to_vec()));
    let url = FabSource {
        url: Some("https://example.com/app.fab".into()),
        sha256: Some("0".repeat(64)),
        config_map_ref: None,
    };
    let messages: Vec<FabBytes> = [
        ConfigMapSource::ManifestsDirectory,
        ConfigMapSource::Cluster,
    ]
    .into_iter()
    .map(|mode| fab_bytes("ns", &url, None, mode).1)
    .collect();
    assert_eq!(messages[0], messages[1], "one message in both modes");
    assert_eq!(
        messages[0],
        FabBytes::Missing(
            "spec.app.fab.url: https://example.com/app.fab is not downloaded yet; the run \
                 starts once it is"
                .into()
        )
    );
    let (state, _) = check_app("url", messages[0].clone(), &BTreeMap::new(), None);
    assert!(matches!(state, AppState::Missing { .. }), "{state:?}");
}

#[tokio::test]
async fn fab_bytes_from_reads_config_maps_as_fab_bytes_and_needs_a_sha256_with_a_url() {
    // Invariant: only a url goes to the cache; a configMapRef is read exactly as fab_bytes
    // reads it, and a url without sha256 (which CEL forbids) fails the run, not the hub.
    let cache = FabUrlCache::new();
    let map = ConfigMap {
        binary_data: Some([("app.fab".to_owned(), ByteString(vec![7]))].into()),
        ..ConfigMap::default()
    };
    for (config_map, mode) in [
        (None, ConfigMapSource::ManifestsDirectory),
        (None, ConfigMapSource::Cluster),
        (Some(&map), ConfigMapSource::Cluster),
    ] {
        assert_eq!(
            fab_bytes_from("ns", &from_config_map(), config_map, mode, &cache).await,
            fab_bytes("ns", &from_config_map(), config_map, mode),
        );
    }
    let no_sha = FabSource {
        url: Some("http://127.0.0.1:9/app.fab".into()),
        ..FabSource::default()
    };
    let (source, found) =
        fab_bytes_from("ns", &no_sha, None, ConfigMapSource::Cluster, &cache).await;
    assert_eq!(source, "http://127.0.0.1:9/app.fab");
    assert!(
        matches!(&found, FabBytes::Unusable(m) if m.starts_with("spec.app.fab.sha256: required")),
        "{found:?}"
    );
    let (state, _) = check_app(&source, found, &BTreeMap::new(), None);
    assert!(
        matches!(state, AppState::Invalid { reason: r, .. } if r == reason::INVALID_APP),
        "{state:?}"
    );
}

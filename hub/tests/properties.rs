//! Property tests on the hub's decisions and the agent's decoding of what the hub sends: work
//! messages decode without panicking whatever their bytes, the work the hub computes round-trips
//! through the wire and decodes, partitions are numbered without gaps, and placement is
//! deterministic, stable, and selects only accepted clusters that match, at most as many as asked.

use std::collections::{BTreeMap, BTreeSet};

use flower_addon_agent::work::decode_federation;
use flower_addon_crds::Federation;
use flower_addon_crds::render::FlowerVersion;
use flower_addon_hub::core::placement::{
    ClusterView, PlacementPolicy, PredicateView, TaintEffect, TaintView, evaluate,
};
use flower_addon_hub::core::work::{WorkInputs, federation_work};
use flower_addon_proto::{ClusterWork, FederationWork, PoolWork};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use proptest::prelude::*;
use prost::Message;

const CASES_BYTES: u32 = 100_000;
const CASES_FIELDS: u32 = 40_000;
const CASES_WORK: u32 = 3_000;
const CASES_PLACEMENT: u32 = 60_000;

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES_BYTES, failure_persistence: None, ..ProptestConfig::default() })]

    /// Invariant: whatever bytes arrive as a work message, decoding it and each of its
    /// Federations ends in a value or an error, never a panic.
    #[test]
    fn any_bytes_decode_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(work) = ClusterWork::decode(bytes.as_slice()) {
            for fed in &work.federations {
                let _ = decode_federation(&work, fed);
            }
        }
    }
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9-]{0,10}",
        "\\PC{0,20}",
        Just("../../..".to_owned()),
        Just(String::new()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES_FIELDS, failure_persistence: None, ..ProptestConfig::default() })]

    /// Invariant: a Federation's work with arbitrary names, version and spec text is refused or
    /// decoded; when decoded, every name that becomes an object or a path is a DNS label.
    #[test]
    fn decoded_work_has_only_dns_label_names(
        namespace in text(),
        name in text(),
        pools in prop::collection::vec(text(), 0..3),
        version in prop_oneof![Just("1.42.0".to_owned()), Just("1.25.0".to_owned()), "\\PC{0,8}"],
        spec in prop_oneof![
            Just(r#"{"mode":"StatefulSet","isolationMode":"subprocess","superlink":{"image":"flwr/superlink:1.42.0"},"supernodes":{"image":"flwr/supernode:1.42.0","pools":[{"name":"a","replicas":1}]}}"#.to_owned()),
            "\\PC{0,40}",
        ],
    ) {
        let fed = FederationWork {
            namespace,
            name,
            flower_version: version,
            federation_spec_json: spec,
            pools: pools.into_iter().map(|name| PoolWork { name, ..PoolWork::default() }).collect(),
            ..FederationWork::default()
        };
        let work = ClusterWork { version: 1, cluster_name: "c".into(), federations: vec![fed.clone()] };
        if let Ok(plan) = decode_federation(&work, &fed) {
            for name in [&plan.namespace, &plan.name].into_iter().chain(plan.pools.iter().map(|p| &p.spec.name)) {
                prop_assert!(flower_addon_crds::dns_label(name).is_ok(), "{name:?}");
            }
        }
    }
}

/// A valid Federation with `pools` (name, replicas) and `version`.
fn federation(pools: &[(String, i32)], version: &str) -> Federation {
    let pools: Vec<String> = pools
        .iter()
        .map(|(p, r)| format!("{{name: {p}, replicas: {r}, images: {{}}, nodeConfig: {{partition-id: \"{{partition}}\", num-partitions: \"{{partitions}}\"}}}}"))
        .collect();
    serde_saphyr::from_str(&format!(
        "apiVersion: flower-addon.io/v1alpha1\nkind: Federation\nmetadata: {{name: fed, namespace: team}}\nspec:\n  mode: StatefulSet\n  isolationMode: subprocess\n  placementRef: {{name: p}}\n  superlink: {{image: \"flwr/superlink:{version}\", externalAddress: \"hub.example:30092\"}}\n  supernodes:\n    image: \"flwr/supernode:{version}\"\n    pools: [{}]\n",
        pools.join(", ")
    ))
    .expect("generated Federation parses")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES_WORK, failure_persistence: None, ..ProptestConfig::default() })]

    /// Invariant: the work the hub computes for every selected cluster survives the wire
    /// byte for byte, decodes on the agent, and numbers each SuperNode's partition exactly once
    /// across clusters (offsets 0.. without gaps or overlaps, total = replicas summed).
    #[test]
    fn computed_work_round_trips_and_numbers_partitions_once(
        pools in prop::collection::btree_map("[a-z][a-z0-9]{0,6}", 0i32..6, 1..4),
        clusters in prop::collection::btree_set("[a-z][a-z0-9-]{0,8}[a-z0-9]", 1..5),
        version in prop_oneof![Just("1.42.0"), Just("1.25.0")],
    ) {
        let pools: Vec<(String, i32)> = pools.into_iter().collect();
        let fed = federation(&pools, version);
        let selected: Vec<String> = clusters.into_iter().collect();
        let labels = BTreeMap::new();
        let works = federation_work(
            &fed,
            FlowerVersion::parse(version).expect("version"),
            &WorkInputs {
                selected: &selected,
                labels: &labels,
                fleet_address: "hub.example:30092",
                ca_pem: "",
                registered_node_keys: &[],
                retired_node_keys: &[],
            },
        )
        .expect("work");
        prop_assert_eq!(works.per_cluster.len(), selected.len());
        let total: u32 = pools.iter().map(|(_, r)| *r as u32).sum::<u32>() * selected.len() as u32;
        let mut numbered: Vec<(u32, u32)> = Vec::new();
        for (cluster, fw) in &works.per_cluster {
            let snapshot = ClusterWork { version: 7, cluster_name: cluster.clone(), federations: vec![fw.clone()] };
            let wire = snapshot.encode_to_vec();
            let back = ClusterWork::decode(wire.as_slice()).expect("decodes");
            prop_assert_eq!(&back, &snapshot);
            let plan = decode_federation(&back, &back.federations[0])
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(plan.pools.len(), pools.len());
            prop_assert_eq!(fw.partitions_total, total);
            for p in &fw.pools {
                let replicas = pools.iter().find(|(n, _)| *n == p.name).map_or(0, |(_, r)| *r as u32);
                numbered.push((p.partition_offset, replicas));
            }
        }
        numbered.sort();
        let mut next = 0;
        for (offset, replicas) in numbered {
            prop_assert_eq!(offset, next, "partitions numbered with a gap or an overlap");
            next += replicas;
        }
        prop_assert_eq!(next, total);
    }
}

const KEYS: [&str; 3] = ["site", "gpu", "tier"];
const VALUES: [&str; 3] = ["a", "b", "yes"];

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(
        prop::sample::select(&KEYS[..]).prop_map(str::to_owned),
        prop::sample::select(&VALUES[..]).prop_map(str::to_owned),
        0..3,
    )
}

fn clusters() -> impl Strategy<Value = Vec<ClusterView>> {
    prop::collection::btree_map(
        "[a-z][0-9]{0,2}",
        (labels(), any::<bool>(), prop::option::of(0u8..3)),
        0..8,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(name, (labels, accepted, taint))| ClusterView {
                name,
                labels,
                claims: BTreeMap::new(),
                accepted,
                taints: taint
                    .map(|t| TaintView {
                        key: "cluster.flower-addon.io/unreachable".into(),
                        value: String::new(),
                        effect: [
                            TaintEffect::NoSelect,
                            TaintEffect::PreferNoSelect,
                            TaintEffect::NoSelectIfNew,
                        ][usize::from(t)],
                        time_added: Some(0),
                    })
                    .into_iter()
                    .collect(),
                allocatable_cpu_millis: None,
                allocatable_memory_bytes: None,
                other_decisions: 0,
            })
            .collect()
    })
}

fn policy() -> impl Strategy<Value = PlacementPolicy> {
    (
        prop::collection::vec(labels(), 0..3),
        prop::option::of(0u32..5),
    )
        .prop_map(|(selectors, number_of_clusters)| PlacementPolicy {
            predicates: selectors
                .into_iter()
                .map(|match_labels| PredicateView {
                    label_selector: Some(LabelSelector {
                        match_labels: Some(match_labels),
                        match_expressions: None,
                    }),
                    claim_selector: Vec::new(),
                })
                .collect(),
            number_of_clusters,
            cluster_sets: vec![
                flower_addon_hub::core::clustersets::ClusterSetView::every_cluster("global"),
            ],
            ..PlacementPolicy::default()
        })
}

fn matches(policy: &PlacementPolicy, cluster: &ClusterView) -> bool {
    policy.predicates.is_empty()
        || policy.predicates.iter().any(|p| {
            p.label_selector
                .as_ref()
                .and_then(|s| s.match_labels.as_ref())
                .is_none_or(|want| want.iter().all(|(k, v)| cluster.labels.get(k) == Some(v)))
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES_PLACEMENT, failure_persistence: None, ..ProptestConfig::default() })]

    /// Invariant: placement selects only accepted clusters its predicates match and no tainted
    /// (NoSelect) one, at most `numberOfClusters`, sorted and unique; the same input gives the
    /// same selection, and evaluating again with that selection as the previous one keeps it.
    #[test]
    fn placement_selects_what_it_may_and_stays_put(clusters in clusters(), policy in policy(), previous in prop::collection::btree_set("[a-z][0-9]{0,2}", 0..4)) {
        let first = evaluate(&policy, &clusters, &previous, 1_000);
        let by_name: BTreeMap<&str, &ClusterView> = clusters.iter().map(|c| (c.name.as_str(), c)).collect();
        let unique: BTreeSet<&String> = first.selected.iter().collect();
        prop_assert_eq!(unique.len(), first.selected.len());
        prop_assert!(first.selected.windows(2).all(|w| w[0] < w[1]), "sorted");
        if let Some(n) = policy.number_of_clusters {
            prop_assert!(first.selected.len() <= n as usize);
        }
        for name in &first.selected {
            let cluster = by_name.get(name.as_str()).ok_or_else(|| TestCaseError::fail(format!("{name} is not a cluster")))?;
            prop_assert!(cluster.accepted, "{name} not accepted");
            prop_assert!(matches(&policy, cluster), "{name} does not match");
            prop_assert!(
                !cluster.taints.iter().any(|t| t.effect == TaintEffect::NoSelect),
                "{name} has an untolerated NoSelect taint"
            );
        }
        prop_assert_eq!(&evaluate(&policy, &clusters, &previous, 1_000), &first);
        let kept: BTreeSet<String> = first.selected.iter().cloned().collect();
        let again = evaluate(&policy, &clusters, &kept, 1_000);
        prop_assert_eq!(&again.selected, &first.selected, "a re-evaluation moved the selection");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20_000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Invariant: the command-line parsers admins feed (durations, `key=value` pairs, bridged
    /// ports) end in a value or an error on any text, never a panic; a parsed duration or port
    /// is the one written.
    #[test]
    fn cli_parsers_never_panic(text in "\\PC{0,24}|[0-9]{1,30}[smhd]?|[0-9]{1,6}=[a-z./]{0,8}") {
        if let Ok(d) = flower_addon_agent::cli::join::parse_duration(&text) {
            let digits: String = text.trim().chars().take_while(char::is_ascii_digit).collect();
            prop_assert!(digits.parse::<u64>().is_ok_and(|n| d.as_secs() >= n));
        }
        if let Ok((key, _)) = flower_addon_agent::cli::join::parse_pair(&text) {
            prop_assert!(!key.is_empty());
        }
        if let Ok(bridged) = text.parse::<flower_addon_hub::standalone::netns::Bridged>() {
            prop_assert!(bridged.port != 0);
            let (port, socket) = text.split_once('=').expect("PORT=SOCKET");
            prop_assert_eq!(port.parse::<u16>().ok(), Some(bridged.port));
            prop_assert_eq!(bridged.socket.to_str(), Some(socket));
        }
    }
}

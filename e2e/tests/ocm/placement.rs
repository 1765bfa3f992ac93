//! Differential test of the addon's placement against Open Cluster Management's own placement
//! controller (v1.2.0, `e2e/ocm/build.sh`), on one apiserver.
//!
//! A seeded generator makes a fleet (labels, cluster claims, taints) and many Placements
//! (predicates with label and claim selectors, `numberOfClusters`, tolerations); the same fleet
//! and Placements are written once as OCM's objects (`cluster.open-cluster-management.io`) and
//! once as the addon's (`flower-addon.io`), OCM's placement controller and ours decide, and the
//! decided cluster sets are compared. Without `numberOfClusters` the sets must be equal. With it
//! OCM's choice among the feasible clusters depends on its Balance prioritizer (how many other
//! Placements chose a cluster), so what is compared is what is fixed: the count, and that both
//! chose only feasible clusters (those the same Placement decides without `numberOfClusters`).
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use e2e::ocm::OcmHub;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

const OCM_GROUP: &str = "cluster.open-cluster-management.io";
/// One fleet per seed, each with its Placements in a namespace of its own.
const SEEDS: [u64; 3] = [0x5eed_0c11, 0x0b5e_55ed, 0xf1ee_7000];
const CLUSTERS: usize = 10;
const PLACEMENTS: usize = 40;

/// A small deterministic generator (xorshift64*), so a difference is reproducible by its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const LABELS: [(&str, &[&str]); 3] = [
    ("env", &["prod", "dev"]),
    ("region", &["eu", "us", "ap"]),
    ("gpu", &["true"]),
];
const CLAIMS: [(&str, &[&str]); 2] = [("zone", &["a", "b", "c"]), ("tier", &["gold", "silver"])];
const TAINTS: [(&str, &str, &str); 3] = [
    ("maintenance", "", "NoSelect"),
    ("gpu-only", "x", "PreferNoSelect"),
    ("drain", "soon", "NoSelectIfNew"),
];

struct Cluster {
    name: String,
    labels: BTreeMap<String, String>,
    claims: BTreeMap<String, String>,
    taints: Vec<Value>,
}

fn fleet(rng: &mut Rng) -> Vec<Cluster> {
    (0..CLUSTERS)
        .map(|i| {
            let mut labels = BTreeMap::new();
            for (key, values) in LABELS {
                if rng.chance(70) {
                    labels.insert(key.to_owned(), rng.pick(values).to_owned());
                }
            }
            let mut claims = BTreeMap::new();
            for (key, values) in CLAIMS {
                if rng.chance(70) {
                    claims.insert(key.to_owned(), rng.pick(values).to_owned());
                }
            }
            let taints = TAINTS
                .iter()
                .filter(|_| rng.chance(20))
                .map(|(key, value, effect)| {
                    json!({"key": key, "value": value, "effect": effect,
                           "timeAdded": "2026-01-01T00:00:00Z"})
                })
                .collect();
            Cluster {
                name: format!("c{i:02}"),
                labels,
                claims,
                taints,
            }
        })
        .collect()
}

/// A selector requirement on `pool` (labels or claims): In, NotIn, Exists or DoesNotExist.
fn requirement(rng: &mut Rng, pool: &[(&str, &[&str])]) -> Value {
    let (key, values) = pool[rng.below(pool.len())];
    match rng.below(4) {
        0 => json!({"key": key, "operator": "In", "values": [rng.pick(values)]}),
        1 => json!({"key": key, "operator": "NotIn", "values": [rng.pick(values)]}),
        2 => json!({"key": key, "operator": "Exists"}),
        _ => json!({"key": key, "operator": "DoesNotExist"}),
    }
}

/// The spec of a generated Placement (the same in both API groups).
fn placement(rng: &mut Rng) -> Value {
    let mut predicates = Vec::new();
    for _ in 0..rng.below(3) {
        let mut selector = serde_json::Map::new();
        if rng.chance(75) {
            let label_selector = if rng.chance(40) {
                let (key, values) = LABELS[rng.below(LABELS.len())];
                json!({"matchLabels": {key: rng.pick(values)}})
            } else {
                json!({"matchExpressions": [requirement(rng, &LABELS)]})
            };
            selector.insert("labelSelector".into(), label_selector);
        }
        if rng.chance(50) {
            selector.insert(
                "claimSelector".into(),
                json!({"matchExpressions": [requirement(rng, &CLAIMS)]}),
            );
        }
        predicates.push(json!({"requiredClusterSelector": selector}));
    }
    let mut tolerations: Vec<Value> = Vec::new();
    for (key, value, _) in TAINTS {
        if !rng.chance(25) {
            continue;
        }
        tolerations.push(if value.is_empty() || rng.chance(50) {
            json!({"key": key, "operator": "Exists"})
        } else {
            json!({"key": key, "operator": "Equal", "value": value})
        });
    }
    let mut spec = json!({"predicates": predicates, "tolerations": tolerations});
    if rng.chance(20) {
        // Only the clusters of the bound set `gpu` (label gpu=true).
        spec["clusterSets"] = json!(["gpu"]);
    }
    if rng.chance(35) {
        spec["numberOfClusters"] = json!(1 + rng.below(4));
    }
    spec
}

fn resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// What each of the `names` Placements decided in `group`, once every one has a decision page.
async fn decisions(
    client: &kube::Client,
    ns: &str,
    group: &str,
    names: &[String],
) -> Result<Option<BTreeMap<String, BTreeSet<String>>>> {
    let version = if group == OCM_GROUP {
        "v1beta1"
    } else {
        "v1alpha1"
    };
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &resource(group, version, "PlacementDecision"),
    );
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for page in api.list(&ListParams::default()).await?.items {
        let Some(placement) = page
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("cluster.open-cluster-management.io/placement"))
        else {
            continue;
        };
        let entry = out.entry(placement.clone()).or_default();
        for d in page.data["status"]["decisions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(c) = d["clusterName"].as_str() {
                entry.insert(c.to_owned());
            }
        }
    }
    Ok(names.iter().all(|n| out.contains_key(n)).then_some(out))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_placement_decides_as_ocms_placement_controller() -> Result<()> {
    let (cp, hub_sa) = e2e::addon::start_hub_with_rbac("fl-0").await?;
    let hub = cp.cluster("hub")?;
    let client = hub.client.clone();
    let dir = cp.work_dir().join("ocm");
    let _ocm = OcmHub::start_with(hub, &dir, &["placement"]).await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let ours = tokio::spawn(flower_addon_hub::kube::controller::placement::run(
        hub_sa.client.clone(),
        flower_addon_agent::ops::Health::new(&[]),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut result = Ok((0, 0));
    for (i, seed) in SEEDS.into_iter().enumerate() {
        let ns = format!("fl-{i}");
        result = match (result, bind(&client, &ns).await) {
            (Ok((cases, differ)), Ok(())) => compare(&client, &ns, seed)
                .await
                .map(|(c, d)| (cases + c, differ + d)),
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
    }
    let _ = stop.send(());
    let stopping = Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(30), ours).await;
    eprintln!(
        "ocm_placement: our placement controller stopped in {:.1}s ({})",
        stopping.elapsed().as_secs_f64(),
        if stopped.is_ok() {
            "graceful"
        } else {
            "timed out"
        }
    );
    match result {
        Ok((cases, 0)) => {
            eprintln!(
                "ocm_placement: {cases} Placements over {} fleets decided alike by OCM {} and ours",
                SEEDS.len(),
                e2e::ocm::VERSION
            );
            Ok(())
        }
        other => {
            let log = std::fs::read_to_string(dir.join("ocm-placement.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- OCM placement controller (last 30 lines)\n{}",
                lines[lines.len().saturating_sub(30)..].join("\n")
            );
            let (cases, differ) = other?;
            anyhow::bail!("{differ} of {cases} Placements decided differently (above)")
        }
    }
}

/// Namespace `ns` with the cluster sets `global` (every cluster) and `gpu` (label gpu=true)
/// bound, in both API groups.
async fn bind(client: &kube::Client, ns: &str) -> Result<()> {
    let mut yaml = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n");
    for (group, version) in [(OCM_GROUP, "v1beta2"), ("flower-addon.io", "v1alpha1")] {
        for (set, selector) in [("global", "{}"), ("gpu", "{matchLabels: {gpu: \"true\"}}")] {
            yaml.push_str(&format!(
                r#"---
apiVersion: {group}/{version}
kind: ManagedClusterSet
metadata: {{name: {set}}}
spec: {{clusterSelector: {{selectorType: LabelSelector, labelSelector: {selector}}}}}
---
apiVersion: {group}/{version}
kind: ManagedClusterSetBinding
metadata: {{name: {set}, namespace: {ns}}}
spec: {{clusterSet: {set}}}
"#
            ));
        }
    }
    e2e::apply_yaml(client, &yaml, ns)
        .await
        .with_context(|| format!("cluster sets bound in {ns}"))?;
    Ok(())
}

/// One fleet and its Placements from `seed`, in namespace `ns`: how many Placements were
/// compared and how many differed (each printed).
async fn compare(client: &kube::Client, ns: &str, seed: u64) -> Result<(usize, usize)> {
    let mut rng = Rng(seed);
    let clusters = fleet(&mut rng);
    let pp = PatchParams::apply("e2e-differential").force();
    // Written concurrently: a few hundred requests one by one took most of the test's time.
    let mut writes = Vec::new();
    for (group, version) in [(OCM_GROUP, "v1"), ("flower-addon.io", "v1alpha1")] {
        let api: Api<DynamicObject> =
            Api::all_with(client.clone(), &resource(group, version, "ManagedCluster"));
        for c in &clusters {
            let (api, pp) = (api.clone(), pp.clone());
            writes.push(async move {
                let body = json!({
                    "apiVersion": format!("{group}/{version}"),
                    "kind": "ManagedCluster",
                    "metadata": {"name": c.name, "labels": c.labels},
                    "spec": {"hubAcceptsClient": true, "taints": c.taints},
                });
                api.patch(&c.name, &pp, &Patch::Apply(&body))
                    .await
                    .with_context(|| format!("{group} ManagedCluster {}", c.name))?;
                let claims: Vec<Value> = c
                    .claims
                    .iter()
                    .map(|(name, value)| json!({"name": name, "value": value}))
                    .collect();
                api.patch_status(
                    &c.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"clusterClaims": claims}})),
                )
                .await
                .with_context(|| format!("{group} ManagedCluster {} claims", c.name))?;
                anyhow::Ok(())
            });
        }
    }
    futures::future::try_join_all(writes).await?;
    // Each generated Placement, and for one with numberOfClusters its twin without (what is
    // feasible for it).
    let mut specs: BTreeMap<String, Value> = BTreeMap::new();
    for i in 0..PLACEMENTS {
        let spec = placement(&mut rng);
        if spec.get("numberOfClusters").is_some() {
            let mut all = spec.clone();
            all.as_object_mut()
                .expect("object")
                .remove("numberOfClusters");
            specs.insert(format!("p{i:02}-feasible"), all);
        }
        specs.insert(format!("p{i:02}"), spec);
    }
    let mut writes = Vec::new();
    for (group, version) in [(OCM_GROUP, "v1beta1"), ("flower-addon.io", "v1alpha1")] {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &resource(group, version, "Placement"));
        for (name, spec) in &specs {
            let (api, pp) = (api.clone(), pp.clone());
            writes.push(async move {
                let body = json!({
                    "apiVersion": format!("{group}/{version}"),
                    "kind": "Placement",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": spec,
                });
                api.patch(name, &pp, &Patch::Apply(&body))
                    .await
                    .with_context(|| format!("{group} Placement {name}: {spec}"))?;
                anyhow::Ok(())
            });
        }
    }
    futures::future::try_join_all(writes).await?;
    let names: Vec<String> = specs.keys().cloned().collect();
    let t = Instant::now();
    // Both controllers decide asynchronously: compare once both have decided every Placement and
    // two reads a second apart agree (settled).
    let deadline = t + Duration::from_secs(90);
    let mut last = None;
    let (ocm, ours) = loop {
        let now = match (
            decisions(client, ns, OCM_GROUP, &names).await?,
            decisions(client, ns, "flower-addon.io", &names).await?,
        ) {
            (Some(ocm), Some(ours)) => Some((ocm, ours)),
            _ => None,
        };
        // Settled: the same answer twice, 2 s apart (both controllers also create empty pages
        // before they decide).
        if let Some(settled) = now.as_ref().filter(|n| last.as_ref() == Some(*n)) {
            break settled.clone();
        }
        ensure!(
            Instant::now() < deadline,
            "both placement controllers had not decided every Placement (and settled) in 90 s"
        );
        last = now;
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let mut differences = Vec::new();
    let mut exact = 0;
    let mut counted = 0;
    for (name, spec) in &specs {
        if name.ends_with("-feasible") {
            continue;
        }
        let (o, u) = (&ocm[name], &ours[name]);
        match spec.get("numberOfClusters").and_then(Value::as_u64) {
            None => {
                exact += 1;
                if o != u {
                    differences.push(format!("{name} {spec}: OCM {o:?}, ours {u:?}"));
                }
            }
            Some(n) => {
                counted += 1;
                let feasible_o = &ocm[&format!("{name}-feasible")];
                let feasible_u = &ours[&format!("{name}-feasible")];
                let want = (n as usize).min(feasible_o.len());
                if o.len() != want
                    || u.len() != (n as usize).min(feasible_u.len())
                    || o.len() != u.len()
                    || !o.is_subset(feasible_o)
                    || !u.is_subset(feasible_u)
                {
                    differences.push(format!(
                        "{name} {spec}: OCM {o:?} of feasible {feasible_o:?}, ours {u:?} of feasible {feasible_u:?}"
                    ));
                }
            }
        }
    }
    // Not vacuous: the Placements select different, non-empty sets.
    let chosen: BTreeSet<&BTreeSet<String>> = specs
        .keys()
        .filter(|n| !n.ends_with("-feasible"))
        .map(|n| &ours[n])
        .collect();
    let nonempty = chosen.iter().filter(|c| !c.is_empty()).count();
    ensure!(
        nonempty >= 5,
        "seed {seed:#x}: only {nonempty} distinct non-empty decisions: the generator or a controller decides (almost) nothing"
    );
    eprintln!(
        "ocm_placement: seed {seed:#x} ({ns}): {CLUSTERS} clusters, {} Placements ({exact} compared exactly, {counted} with numberOfClusters by count and feasibility; {nonempty} distinct non-empty decisions) decided by OCM {} and ours in {:.1}s: {} differ",
        exact + counted,
        e2e::ocm::VERSION,
        t.elapsed().as_secs_f64(),
        differences.len()
    );
    for c in &clusters {
        eprintln!(
            "  {} labels {:?} claims {:?} taints {}",
            c.name,
            c.labels,
            c.claims,
            serde_json::to_string(&c.taints)?
        );
    }
    for d in &differences {
        eprintln!("  DIFFERS {d}");
    }
    Ok((exact + counted, differences.len()))
}

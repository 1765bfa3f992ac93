//! What a standalone hub lets a Federation do, as in Kubernetes mode:
//!
//! - tenancy (`kube_multicluster` step 9): a Placement selects only from the ManagedClusterSets
//!   bound to its namespace. Without a binding nothing is selected, no cluster gets work and
//!   `status.json` says why; a binding to the exclusive set `red` sends work to red's member
//!   only; removing the binding withdraws it;
//! - certificate names (`kube_hub` step 5b, `controller_mock`): a SAN the hub's admin did not
//!   allow gets no certificate and `status.json` names the field and the fix; allowed, the
//!   certificate is issued for it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

mod standalone_support;
use standalone_support::{Dirs, register};

use flower_addon_hub::channel::source::{InMemoryWorkSource, WorkSource};
use flower_addon_hub::registration::store::file::FileStore;
use flower_addon_hub::standalone::StandaloneHub;

const MANIFESTS: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: ManagedClusterSet
metadata: {name: red}
spec: {clusterSelector: {selectorType: ExclusiveClusterSetLabel}}
---
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {name: fed, namespace: team}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  insecure: true
  placementRef: {name: all}
  superlink:
    image: "flwr/superlink:1.42.0"
    service: {ports: {grpc: FLEET, serverAppIO: APPIO, extra: CONTROL}}
  supernodes:
    image: "flwr/supernode:1.42.0"
    pools: [{name: a, replicas: 1}]
---
apiVersion: flower-addon.io/v1alpha1
kind: Placement
metadata: {name: all, namespace: team}
spec: {}
"#;

const BINDING: &str = r#"
apiVersion: flower-addon.io/v1alpha1
kind: ManagedClusterSetBinding
metadata: {name: red, namespace: team}
spec: {clusterSet: red}
"#;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// The Federation's entry of `status.json`, once it exists.
fn federation_status(state: &std::path::Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(state.join("status.json")).ok()?;
    let status: serde_json::Value = serde_json::from_str(&text).ok()?;
    status["federations"]
        .as_array()?
        .iter()
        .find(|f| f["name"] == "fed")
        .cloned()
}

/// Waits up to 20 s for `check` over (status entry, federations in red-1's work, in blue-1's).
async fn wait(
    what: &str,
    state: &std::path::Path,
    work: &InMemoryWorkSource,
    check: impl Fn(&serde_json::Value, usize, usize) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (red, blue) = (
            work.snapshot("red-1").federations.len(),
            work.snapshot("blue-1").federations.len(),
        );
        let status = federation_status(state);
        if status.as_ref().is_some_and(|s| check(s, red, blue)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 20 s; status {status:?}, work red-1 {red}, blue-1 {blue}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A standalone hub running on `manifests_text` (ports filled in) with two accepted clusters,
/// `red-1` in set red and `blue-1` in set blue, its admin allowing `allowed` certificate names.
struct Hub {
    dirs: Dirs,
    /// The manifests as written, ports filled in.
    text: String,
    work: Arc<InMemoryWorkSource>,
    stop: tokio::sync::oneshot::Sender<()>,
    running: tokio::task::JoinHandle<()>,
}

impl Hub {
    async fn start(manifests_text: &str, allowed: &[&str]) -> Self {
        Self::start_in(
            Dirs::new(),
            manifests_text,
            allowed,
            InMemoryWorkSource::new(),
        )
        .await
    }

    async fn start_in(
        dirs: Dirs,
        manifests_text: &str,
        allowed: &[&str],
        work: InMemoryWorkSource,
    ) -> Self {
        let text = manifests_text
            .replace("FLEET", &free_port().to_string())
            .replace("APPIO", &free_port().to_string())
            .replace("CONTROL", &free_port().to_string());
        std::fs::write(dirs.manifests.join("fed.yaml"), &text).expect("manifests");

        let store = Arc::new(FileStore::open(&dirs.state).expect("store"));
        let ca = Arc::new(
            flower_addon_hub::registration::store::load_or_create_flower_ca(store.as_ref())
                .await
                .expect("ca"),
        );
        let clusters: BTreeMap<String, BTreeMap<String, String>> =
            [("red-1", "red"), ("blue-1", "blue")]
                .into_iter()
                .map(|(name, set)| {
                    let label = (
                        flower_addon_crds::CLUSTERSET_LABEL.to_string(),
                        set.to_string(),
                    );
                    (name.to_string(), BTreeMap::from([label]))
                })
                .collect();
        register(store.as_ref(), &clusters).await;
        let work = Arc::new(work);
        let hub = StandaloneHub::new(store.clone(), work.clone(), ca, dirs.config(allowed));
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(hub.run(async {
            let _ = stop_rx.await;
        }));
        Self {
            dirs,
            text,
            work,
            stop,
            running,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.running.await.expect("controller stops");
    }
}

#[tokio::test]
async fn a_placement_selects_only_from_the_sets_bound_to_its_namespace() {
    let hub = Hub::start(MANIFESTS, &[]).await;
    let (state, manifests, work) = (&hub.dirs.state, &hub.dirs.manifests, &hub.work);

    // No binding: nothing selected, no work, and the reason with the fix in status.json.
    wait("no binding", state, work, |s, red, blue| {
        let placement = s["placement"].as_str().unwrap_or_default();
        s["selected"].as_array().is_some_and(Vec::is_empty)
            && placement.contains("NoManagedClusterSetBindings")
            && placement.contains("namespace team")
            && red == 0
            && blue == 0
    })
    .await;

    // Bound to red: red's member gets the work, blue's does not.
    std::fs::write(manifests.join("binding.yaml"), BINDING).expect("binding");
    wait("bound to red", state, work, |s, red, blue| {
        s["selected"] == serde_json::json!(["red-1"])
            && s.get("placement").is_none()
            && red == 1
            && blue == 0
    })
    .await;

    // Unbound again: the work is withdrawn.
    std::fs::remove_file(manifests.join("binding.yaml")).expect("unbind");
    wait("unbound", state, work, |s, red, blue| {
        s["selected"].as_array().is_some_and(Vec::is_empty)
            && s["placement"]
                .as_str()
                .is_some_and(|p| p.contains("NoManagedClusterSetBindings"))
            && red == 0
            && blue == 0
    })
    .await;
    hub.stop().await;
}

#[tokio::test]
async fn a_certificate_name_the_hub_does_not_have_is_refused() {
    let text = MANIFESTS.replace(
        "insecure: true",
        "insecure: false\n  tls: {extraSANs: [flower.example.org]}",
    );
    let cert = |state: &std::path::Path| state.join("federations/team/fed/tls/tls.crt");
    let hub = Hub::start(&text, &[]).await;
    wait("refused", &hub.dirs.state, &hub.work, |s, _, _| {
        s["message"].as_str().is_some_and(|m| {
            m.contains("spec.tls.extraSANs[0]: \"flower.example.org\" is not one of the hub's names (127.0.0.1)")
                && m.contains("--superlink-name flower.example.org")
        })
    })
    .await;
    assert!(!cert(&hub.dirs.state).exists(), "a certificate was issued");
    hub.stop().await;

    let hub = Hub::start(&text, &["*.example.org"]).await;
    wait("allowed", &hub.dirs.state, &hub.work, |_, _, _| {
        cert(&hub.dirs.state).exists()
    })
    .await;
    let sans = std::fs::read_to_string(hub.dirs.state.join("federations/team/fed/tls/sans"))
        .expect("sans");
    assert!(sans.lines().any(|l| l == "flower.example.org"), "{sans}");
    hub.stop().await;
}

/// The replicas of red-1's pool `a` in its current work, if it has any.
fn replicas(work: &InMemoryWorkSource) -> Option<u32> {
    let snapshot = work.snapshot("red-1");
    let fed = snapshot.federations.first()?;
    let pool: serde_json::Value = serde_json::from_str(&fed.pools.first()?.spec_json).ok()?;
    pool["replicas"]
        .as_u64()
        .and_then(|r| u32::try_from(r).ok())
}

/// Waits up to 10 s for `check`, failing with `what`.
async fn until(what: &str, check: impl Fn() -> bool) -> Duration {
    let started = tokio::time::Instant::now();
    while !check() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: not within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

#[tokio::test]
async fn a_federations_work_waits_until_its_superlink_listens() {
    // Invariant: SuperNodes are not (re)started while their SuperLink cannot take them: a
    // restarted SuperNode whose SuperLink was down could not deactivate, and Flower refuses its
    // successor for about a minute. The stand-in SuperLink listens only once `bin/hold` goes.
    let dirs = Dirs::new();
    let hold = dirs.bin.join("hold");
    std::fs::write(&hold, "").expect("hold");
    let manifests = format!("{MANIFESTS}---{BINDING}");
    let hub = Hub::start_in(dirs, &manifests, &[], InMemoryWorkSource::gated()).await;
    let (state, work) = (hub.dirs.state.clone(), hub.work.clone());

    // The pass ran (red-1 selected, status written), but red-1 was never sent anything: it has
    // no work at all, not an empty list; blue-1, which runs nothing, has its (empty) work.
    wait("selected", &state, &work, |s, _, _| {
        s["selected"] == serde_json::json!(["red-1"])
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !work.decided("red-1"),
        "red-1 got work before its SuperLink listened"
    );
    assert!(
        work.decided("blue-1"),
        "blue-1's empty work was held back too"
    );
    assert_eq!(work.snapshot("blue-1").federations.len(), 0);

    std::fs::remove_file(&hold).expect("release");
    let took = until("red-1's work once the SuperLink listens", || {
        work.decided("red-1") && replicas(&work) == Some(1)
    })
    .await;
    // Released by the listening SuperLink: the hub probes it at each pass (every 200 ms while
    // work is held, every 1 s anyway), so the work goes out within a pass or two. 5 s is x5 the
    // 1 s pass, for a loaded runner; a hub that did not notice the SuperLink listening would hold
    // the work until the listen hold (30 s from the SuperLink's start) ran out.
    assert!(
        took < Duration::from_secs(5),
        "sent {took:?} after the SuperLink listened"
    );

    // A change that restarts the SuperLink (its arguments) together with the pool: while the new
    // SuperLink does not listen, red-1 keeps the Federation's work as it was sent.
    std::fs::write(&hold, "").expect("hold");
    let changed = hub
        .text
        .replace(
            "pools: [{name: a, replicas: 1}]",
            "pools: [{name: a, replicas: 2}]",
        )
        .replace(
            "    image: \"flwr/superlink:1.42.0\"",
            "    image: \"flwr/superlink:1.42.0\"\n    extraArgs: [\"--restarted\"]",
        );
    std::fs::write(hub.dirs.manifests.join("fed.yaml"), changed).expect("change");
    let starts = hub.dirs.bin.join("starts");
    until("the SuperLink restarted with its new arguments", || {
        std::fs::read_to_string(&starts).is_ok_and(|s| s.contains("--restarted"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        replicas(&work),
        Some(1),
        "the pool changed while its SuperLink was down"
    );

    std::fs::remove_file(&hold).expect("release");
    until("the changed pool once the SuperLink listens", || {
        replicas(&work) == Some(2)
    })
    .await;
    hub.stop().await;
}

#[tokio::test]
async fn an_ocm_placement_is_refused_by_a_standalone_hub_with_the_fix() {
    // Invariant: a standalone hub has no Open Cluster Management: a Federation naming an OCM
    // Placement gets a message naming the field and the fix, not a silent empty placement, and
    // the addon's own Placement of the same name is not used in its stead.
    let text = MANIFESTS.replace(
        "placementRef: {name: all}",
        "placementRef: {name: all, apiGroup: cluster.open-cluster-management.io}",
    );
    assert_ne!(
        text, MANIFESTS,
        "the manifests name placementRef differently"
    );
    let hub = Hub::start(&text, &[]).await;
    std::fs::write(hub.dirs.manifests.join("binding.yaml"), BINDING).expect("binding");
    wait("refused", &hub.dirs.state, &hub.work, |s, red, blue| {
        s["message"].as_str().is_some_and(|m| {
            m.contains("spec.placementRef.apiGroup")
                && m.contains("standalone hub")
                && m.contains("drop apiGroup")
        }) && red == 0
            && blue == 0
    })
    .await;
    hub.stop().await;
}

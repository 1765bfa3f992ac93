//! The two hub modes write the same FlowerRun status, byte for byte, for the same run, Federation,
//! app and SuperLink answers: the Kubernetes FlowerRun controller (`kube::controller::runs`, on a
//! mocked API server that keeps objects) and the standalone hub's (`standalone::runs`, on a
//! manifests directory and its state files), each against a stand-in SuperLink Control API
//! (`fake_control`) that moves the same way, with the same fixed clock. Each case walks a run
//! through its conditions and reasons and compares the statuses after every step.
//!
//! Not compared here: a run's outputs (Kubernetes lists them by exec into the SuperLink pod, which
//! the mocked API does not serve; `real_node` and `standalone_runs` check both for real).
mod fake_control;
mod mock_api;
mod run_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flower_addon_crds::Federation;
use flower_addon_crds::policy::{Admin, PodPolicy};
use flower_addon_crds::run::{FlowerRun, FlowerRunStatus};
use flower_addon_hub::flower::control::ControlEndpoint;
use flower_addon_hub::flower::fab_url::Egress;
use flower_addon_hub::kube::controller::runs::{EndpointOf, RunContext, reconcile};
use flower_addon_hub::registration::ca::{CaRole, HubCa};
use flower_addon_hub::runs::Clock;
use flower_addon_hub::standalone::manifests::Manifests;
use flower_addon_hub::standalone::runs::StandaloneRuns;
use flower_addon_hub::standalone::status::FederationSummary;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use mock_api::objects::{Journal, Shared, objects_client};
use run_support::FEDERATION;
use serde_json::{Value, json};

const NS: &str = "team";
const RUN: &str = "fedavg";

/// A fixed clock the test moves.
#[derive(Clone)]
struct TestClock(Arc<Mutex<i64>>);

impl TestClock {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(1_800_000_000)))
    }

    fn clock(&self) -> Clock {
        let at = self.0.clone();
        Arc::new(move || Timestamp::from_second(*at.lock().expect("clock")).expect("timestamp"))
    }

    fn advance(&self, seconds: i64) {
        *self.0.lock().expect("clock") += seconds;
    }
}

/// What both modes are given.
struct Case {
    run: Value,
    config_map: Option<Value>,
    /// `(ready, message)` of the Federation.
    federation: (bool, &'static str),
    egress: Egress,
}

fn summary((ready, message): (bool, &str)) -> FederationSummary {
    let mut summary = FederationSummary::default();
    summary.namespace = NS.into();
    summary.name = "fed".into();
    summary.ready = ready;
    summary.message = (!ready).then(|| message.to_owned());
    summary
}

fn flower_run(fab: Value, run_config: Value) -> Value {
    json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "FlowerRun",
        "metadata": {"name": RUN, "namespace": NS},
        "spec": {
            "federationRef": {"name": "fed"},
            "app": {"fab": fab},
            "runConfig": run_config,
            "backoffLimit": 0,
        },
    })
}

fn from_config_map() -> Value {
    json!({"configMapRef": {"name": "fedavg-fab", "key": "app.fab"}})
}

fn config_map() -> Value {
    run_support::config_map(&run_support::fab().0)
}

/// The Kubernetes mode's FlowerRun controller on a mocked API server.
struct Kube {
    ctx: Arc<RunContext>,
    objects: Shared,
    runs: Writer<FlowerRun>,
    feds: Writer<Federation>,
    fake: fake_control::Fake,
    _dir: tempfile::TempDir,
}

/// The standalone hub's FlowerRuns on a manifests directory.
struct Standalone {
    runs: StandaloneRuns,
    manifests: Manifests,
    dir: tempfile::TempDir,
    federation: FederationSummary,
    endpoint: ControlEndpoint,
    fake: fake_control::Fake,
    _stand_in: tempfile::TempDir,
}

async fn kube(case: &Case, flower_ca: &HubCa, clock: &TestClock) -> Kube {
    let fake = fake_control::Fake::default();
    let stand_in = fake_control::stand_in(flower_ca, fake.clone()).await;
    let endpoint = stand_in.endpoint.clone();
    let endpoint_of: EndpointOf = Arc::new(move |_| Some(endpoint.clone()));
    let mut objects = vec![case.run.clone()];
    objects.extend(case.config_map.clone());
    // The Federation, for the hub's record of a SuperNode restart.
    objects.push(
        serde_json::to_value(run_support::federation(
            case.federation.0,
            case.federation.1,
        ))
        .expect("Federation"),
    );
    let (client, objects) = objects_client(objects, Journal::default());
    let (fed_store, mut feds) = reflector::store::<Federation>();
    let (run_store, mut runs) = reflector::store::<FlowerRun>();
    feds.apply_watcher_event(&watcher::Event::Init);
    feds.apply_watcher_event(&watcher::Event::InitDone);
    runs.apply_watcher_event(&watcher::Event::Init);
    runs.apply_watcher_event(&watcher::Event::InitDone);
    feds.apply_watcher_event(&watcher::Event::Apply(run_support::federation(
        case.federation.0,
        case.federation.1,
    )));
    let ctx = RunContext::new(client, fed_store, run_store, endpoint_of)
        .with_list_shared_for(Duration::ZERO)
        .with_fab_egress(case.egress.clone())
        .with_clock(clock.clock());
    Kube {
        ctx: Arc::new(ctx),
        objects,
        runs,
        feds,
        fake,
        _dir: stand_in.dir,
    }
}

impl Kube {
    fn run(&self) -> FlowerRun {
        let stored = self
            .objects
            .lock()
            .expect("objects")
            .get("flowerruns", NS, RUN)
            .expect("the run exists");
        serde_json::from_value(stored).expect("FlowerRun")
    }

    async fn pass(&mut self) -> FlowerRunStatus {
        let run = self.run();
        self.runs
            .apply_watcher_event(&watcher::Event::Apply(run.clone()));
        reconcile(Arc::new(run), self.ctx.clone())
            .await
            .expect("reconcile");
        self.run().status.unwrap_or_default()
    }

    fn set_federation(&mut self, state: (bool, &str)) {
        self.feds
            .apply_watcher_event(&watcher::Event::Apply(run_support::federation(
                state.0, state.1,
            )));
    }

    fn edit_run(&mut self, edit: impl FnOnce(&mut Value)) {
        let mut objects = self.objects.lock().expect("objects");
        let mut run = objects.get("flowerruns", NS, RUN).expect("run");
        edit(&mut run);
        objects.put(run);
    }
}

async fn standalone(case: &Case, flower_ca: &HubCa, clock: &TestClock) -> Standalone {
    let fake = fake_control::Fake::default();
    let stand_in = fake_control::stand_in(flower_ca, fake.clone()).await;
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::create_dir_all(dir.path().join("manifests")).expect("manifests dir");
    let mut documents = vec![
        serde_json::to_value(serde_saphyr::from_str::<Value>(FEDERATION).expect("federation yaml"))
            .expect("json"),
        case.run.clone(),
    ];
    documents.extend(case.config_map.clone());
    write_manifests(dir.path(), &documents);
    let mut manifests = Manifests::new(dir.path().join("manifests"), PodPolicy::new(Admin::Hub));
    manifests.refresh();
    let runs = StandaloneRuns::new(&dir.path().join("state"), case.egress.clone())
        .with_clock(clock.clock());
    Standalone {
        runs,
        manifests,
        dir,
        federation: summary(case.federation),
        endpoint: stand_in.endpoint.clone(),
        fake,
        _stand_in: stand_in.dir,
    }
}

fn write_manifests(dir: &Path, documents: &[Value]) {
    let yaml: Vec<String> = documents
        .iter()
        .map(|d| serde_saphyr::to_string(d).expect("yaml"))
        .collect();
    std::fs::write(dir.join("manifests/all.yaml"), yaml.join("---\n")).expect("manifests");
}

impl Standalone {
    async fn pass(&mut self) -> FlowerRunStatus {
        let endpoint = self.endpoint.clone();
        let entries = self
            .runs
            .reconcile(
                &self.manifests,
                std::slice::from_ref(&self.federation),
                move |_| Some(endpoint.clone()),
            )
            .await;
        assert!(
            self.runs.problems().is_empty(),
            "{:?}",
            self.runs.problems()
        );
        entries
            .into_iter()
            .find(|e| e.namespace == NS && e.name == RUN)
            .map(|e| e.status)
            .unwrap_or_default()
    }

    fn set_federation(&mut self, state: (bool, &str)) {
        self.federation = summary(state);
    }

    /// Edits the run's manifest (as a user editing the file).
    fn edit_run(&mut self, documents: &mut [Value], edit: impl FnOnce(&mut Value)) {
        let run = documents
            .iter_mut()
            .find(|d| d["kind"] == "FlowerRun")
            .expect("run");
        edit(run);
        write_manifests(self.dir.path(), documents);
        // The directory is watched by modification time and size: make the change visible.
        assert!(self.manifests.refresh(), "the edited manifest was not read");
    }
}

/// Both modes, side by side, with their stand-ins moved alike.
struct Both {
    kube: Kube,
    standalone: Standalone,
    documents: Vec<Value>,
    clock: TestClock,
    step: usize,
}

impl Both {
    async fn new(case: Case) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let flower_ca = HubCa::generate_for(CaRole::Flower).expect("ca");
        let clock = TestClock::new();
        let kube = kube(&case, &flower_ca, &clock).await;
        let standalone = standalone(&case, &flower_ca, &clock).await;
        let mut documents = vec![
            serde_saphyr::from_str::<Value>(FEDERATION).expect("federation yaml"),
            case.run.clone(),
        ];
        documents.extend(case.config_map.clone());
        Self {
            kube,
            standalone,
            documents,
            clock,
            step: 0,
        }
    }

    /// One pass of each mode; their statuses must be equal byte for byte. Returns the status.
    async fn pass(&mut self, what: &str) -> FlowerRunStatus {
        self.step += 1;
        self.clock.advance(2);
        let kube = self.kube.pass().await;
        let standalone = self.standalone.pass().await;
        let (k, s) = (
            serde_json::to_string_pretty(&kube).expect("json"),
            by_design(&serde_json::to_string_pretty(&standalone).expect("json")),
        );
        assert!(
            k == s,
            "step {} ({what}): the modes' statuses differ\nKubernetes:\n{k}\nstandalone:\n{s}",
            self.step
        );
        // The log is followed by a task of its own, whose calls may come at any time.
        let calls = |fake: &fake_control::Fake| -> Vec<String> {
            fake.calls()
                .into_iter()
                .filter(|c| c != "stream-logs")
                .collect()
        };
        assert_eq!(
            calls(&self.kube.fake),
            calls(&self.standalone.fake),
            "step {} ({what}): the modes called their SuperLinks differently",
            self.step
        );
        kube
    }

    fn set_federation(&mut self, state: (bool, &'static str)) {
        self.kube.set_federation(state);
        self.standalone.set_federation(state);
    }

    fn edit_run(&mut self, edit: impl Fn(&mut Value)) {
        self.kube.edit_run(&edit);
        self.standalone.edit_run(&mut self.documents, &edit);
    }

    /// Moves the one Flower run of both stand-ins (their run ids are the same).
    fn flower(&self, status: &str, lines: &[&str]) -> u64 {
        let mut id = None;
        for fake in [&self.kube.fake, &self.standalone.fake] {
            let mut runs = fake.runs.lock().expect("runs");
            let ids = runs.ids();
            assert_eq!(ids.len(), 1, "one Flower run: {ids:?}");
            runs.set_status(ids[0], status);
            for line in lines {
                runs.log(ids[0], line);
            }
            id = Some(ids[0]);
        }
        id.expect("a run")
    }
}

/// The standalone status with the one difference by design put as the Kubernetes mode words it:
/// where a missing ConfigMap goes (the manifests directory, or the API).
fn by_design(standalone: &str) -> String {
    standalone
        .replace(
            "ConfigMap team/fedavg-fab is not in the manifests directory",
            "ConfigMap team/fedavg-fab does not exist",
        )
        .replace(
            "add it (`kubectl create configmap fedavg-fab --from-file=app.fab=APP.fab --dry-run=client -o yaml`)",
            "create it (`kubectl create configmap fedavg-fab -n team --from-file=app.fab=APP.fab`)",
        )
}

/// `(status, reason)` of condition `type_`.
fn condition(status: &FlowerRunStatus, type_: &str) -> Option<(String, String)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn reasons(status: &FlowerRunStatus) -> BTreeMap<String, String> {
    status
        .conditions
        .iter()
        .map(|c| (c.type_.clone(), format!("{}/{}", c.status, c.reason)))
        .collect()
}

#[tokio::test]
async fn a_run_waits_runs_and_completes_alike_in_both_modes() {
    // The Federation not Ready, then the app missing, then submitted, running, completed with
    // its log: every step's status equal.
    let mut both = Both::new(Case {
        run: flower_run(
            from_config_map(),
            json!({"num-server-rounds": 2, "min-nodes": 2}),
        ),
        config_map: None,
        federation: (false, "SuperLink superlink: 0/1 ready"),
        egress: Egress::default(),
    })
    .await;
    let waiting = both.pass("Federation not Ready").await;
    assert!(waiting.run_id.is_none(), "{:?}", reasons(&waiting));
    both.set_federation((true, "all ready"));
    let missing = both.pass("app missing").await;
    assert!(missing.run_id.is_none(), "{:?}", reasons(&missing));

    // The ConfigMap appears: Kubernetes through the API, standalone in the manifests directory.
    both.kube.objects.lock().expect("objects").put(config_map());
    both.documents.push(config_map());
    write_manifests(both.standalone.dir.path(), &both.documents);
    assert!(both.standalone.manifests.refresh());
    let submitted = both.pass("submitted").await;
    assert!(submitted.run_id.is_some(), "{:?}", reasons(&submitted));

    both.flower("running", &[]);
    let running = both.pass("running").await;
    assert_eq!(running.flower_status.as_deref(), Some("running"));
    both.flower(
        "finished:completed",
        &["INFO :      [ROUND 1/2]", "INFO :      [ROUND 2/2]"],
    );
    let completed = both.pass("completed").await;
    assert_eq!(
        condition(&completed, "Complete"),
        Some(("True".into(), "Completed".into())),
        "{:?}",
        reasons(&completed)
    );
    assert!(
        !completed.log_tail.is_empty(),
        "the final log was read: {completed:?}"
    );
    // Finished: no more calls, the same status.
    both.pass("finished, looked at again").await;
}

#[tokio::test]
async fn a_bad_run_config_and_a_refused_or_failing_download_fail_alike_in_both_modes() {
    // An unknown run-config key: InvalidApp, no Flower call.
    let mut both = Both::new(Case {
        run: flower_run(from_config_map(), json!({"no-such-key": 1})),
        config_map: Some(config_map()),
        federation: (true, "all ready"),
        egress: Egress::default(),
    })
    .await;
    let invalid = both.pass("unknown run-config key").await;
    assert_eq!(
        condition(&invalid, "Failed"),
        Some(("True".into(), "InvalidRunConfig".into())),
        "{:?}",
        reasons(&invalid)
    );
    assert!(both.kube.fake.calls().is_empty());

    // A FAB URL on loopback, which the hub refuses unless the admin allows it.
    let url = json!({"url": "http://127.0.0.1:9/fedavg.fab", "sha256": "0".repeat(64)});
    let mut both = Both::new(Case {
        run: flower_run(url.clone(), json!({"num-server-rounds": 2})),
        config_map: None,
        federation: (true, "all ready"),
        egress: Egress::default(),
    })
    .await;
    let refused = both.pass("FAB URL refused").await;
    assert_eq!(
        condition(&refused, "Failed"),
        Some(("True".into(), "InvalidApp".into())),
        "{:?}",
        reasons(&refused)
    );

    // Allowed, but nothing listens there: the run waits for its app and tries again.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let url =
        json!({"url": format!("http://127.0.0.1:{port}/fedavg.fab"), "sha256": "0".repeat(64)});
    let mut both = Both::new(Case {
        run: flower_run(url, json!({"num-server-rounds": 2})),
        config_map: None,
        federation: (true, "all ready"),
        egress: Egress::allowing(&["127.0.0.1/32".into()]).expect("egress"),
    })
    .await;
    let failing = both.pass("FAB download failing").await;
    assert!(
        failing.run_id.is_none() && condition(&failing, "Failed").is_none(),
        "a failing download is not a verdict: {:?}",
        reasons(&failing)
    );
    assert!(both.kube.fake.calls().is_empty());
}

#[tokio::test]
async fn a_run_suspended_while_it_runs_is_stopped_alike_in_both_modes() {
    let mut both = Both::new(Case {
        run: flower_run(from_config_map(), json!({"num-server-rounds": 2})),
        config_map: Some(config_map()),
        federation: (true, "all ready"),
        egress: Egress::default(),
    })
    .await;
    let submitted = both.pass("submitted").await;
    assert!(submitted.run_id.is_some(), "{:?}", reasons(&submitted));
    both.flower("running", &[]);
    both.pass("running").await;
    both.edit_run(|run| run["spec"]["suspend"] = json!(true));
    both.pass("suspend: StopRun sent").await;
    assert!(
        both.kube.fake.calls().iter().any(|c| c == "stop-run"),
        "{:?}",
        both.kube.fake.calls()
    );
    // The stand-ins stopped the Flower run; the next pass sees it so: a run suspended while it
    // runs ends stopped (docs/runs.md).
    let stopped = both.pass("suspended: the Flower run stopped").await;
    assert_eq!(
        condition(&stopped, "Failed"),
        Some(("True".into(), "Stopped".into())),
        "{:?}",
        reasons(&stopped)
    );
    both.pass("stopped, looked at again").await;
    // Flower's SuperNodes that worked on the stopped run's messages may take no other: both
    // hubs record one restart of the Federation's SuperNodes after that run (docs/operations.md).
    let run_id = stopped.run_id.clone().expect("run id");
    let kube_restart = both
        .kube
        .objects
        .lock()
        .expect("objects")
        .get("federations", NS, "fed")
        .and_then(|f| {
            f["status"]["supernodeRestartAfterRun"]
                .as_str()
                .map(str::to_owned)
        });
    let standalone_restart = both
        .standalone
        .runs
        .restarted_after(&(NS.to_owned(), "fed".to_owned()))
        .map(|id| id.to_string());
    assert_eq!(kube_restart.as_deref(), Some(run_id.as_str()));
    assert_eq!(standalone_restart.as_deref(), Some(run_id.as_str()));
}

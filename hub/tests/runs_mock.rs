//! The FlowerRun reconciler against a mocked API server that keeps objects (`mock_api::objects`)
//! and a stand-in SuperLink Control API (`fake_control`), both writing into one journal, so the
//! tests assert what happened before what: the status holding the pending submission is stored
//! before `StartRun` reaches the SuperLink; a deleted run is stopped before its finalizer goes;
//! a bad run config or a missing app makes no Flower call; a finished run makes no request at
//! all; and a reconcile on a stale object never submits a second time.
mod fake_control;
mod mock_api;
mod run_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flower_addon_crds::run::{FlowerRun, FlowerRunStatus};
use flower_addon_crds::{Federation, RUN_FINALIZER};
use flower_addon_hub::flower::control::ControlEndpoint;
use flower_addon_hub::kube::controller::runs::{EndpointOf, RunContext, reconcile};
use flower_addon_hub::registration::ca::{CaRole, HubCa};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use mock_api::objects::{Journal, Shared, objects_client};
use run_support::{config_map, fab, federation};
use serde_json::{Value, json};

const NS: &str = "team";
const RUN: &str = "fedavg";

fn flower_run(run_config: Value) -> Value {
    json!({
        "apiVersion": "flower-addon.io/v1alpha1",
        "kind": "FlowerRun",
        "metadata": {"name": RUN, "namespace": NS, "generation": 1},
        "spec": {
            "federationRef": {"name": "fed"},
            "app": {"fab": {"configMapRef": {"name": "fedavg-fab", "key": "app.fab"}}},
            "runConfig": run_config,
        },
    })
}

/// A hub's FlowerRun controller state against the mocked API and a stand-in SuperLink.
struct Setup {
    ctx: Arc<RunContext>,
    objects: Shared,
    journal: Journal,
    fake: fake_control::Fake,
    feds: Writer<Federation>,
    runs: Writer<FlowerRun>,
    /// Where the stand-in SuperLink is (`None`: nowhere to dial, as a Federation whose
    /// SuperLink is gone).
    endpoint: Arc<Mutex<Option<ControlEndpoint>>>,
    _dir: tempfile::TempDir,
}

impl Setup {
    /// Every reconcile asks the SuperLink (no shared run list), so each step sees its change.
    async fn new(fed: Federation, objects: Vec<Value>) -> Self {
        Self::sharing(fed, objects, Duration::ZERO).await
    }

    /// [`Setup::new`] with run lists shared for `window`.
    async fn sharing(fed: Federation, objects: Vec<Value>, window: Duration) -> Self {
        let journal = Journal::default();
        let fake = fake_control::Fake {
            journal: journal.clone(),
            ..Default::default()
        };
        let flower_ca = HubCa::generate_for(CaRole::Flower).expect("ca");
        let stand_in = fake_control::stand_in(&flower_ca, fake.clone()).await;
        let endpoint = Arc::new(Mutex::new(Some(stand_in.endpoint.clone())));
        let dir = stand_in.dir;
        let dial = endpoint.clone();
        let endpoint_of: EndpointOf = Arc::new(move |_| dial.lock().expect("endpoint").clone());
        let (client, objects) = objects_client(objects, journal.clone());
        let (fed_store, mut feds) = reflector::store::<Federation>();
        let (run_store, mut runs) = reflector::store::<FlowerRun>();
        for writer in [&mut feds as &mut dyn Listed, &mut runs] {
            writer.listed();
        }
        feds.apply_watcher_event(&watcher::Event::Apply(fed));
        let ctx = Arc::new(
            RunContext::new(client, fed_store, run_store, endpoint_of).with_list_shared_for(window),
        );
        Self {
            ctx,
            objects,
            journal,
            fake,
            feds,
            runs,
            endpoint,
            _dir: dir,
        }
    }

    /// The run as the API server holds it (`None` once deleted).
    fn run(&self) -> Option<FlowerRun> {
        let stored = self
            .objects
            .lock()
            .expect("objects")
            .get("flowerruns", NS, RUN)?;
        Some(serde_json::from_value(stored).expect("FlowerRun"))
    }

    fn status(&self) -> FlowerRunStatus {
        self.run()
            .and_then(|r| r.status)
            .expect("the run has a status")
    }

    /// One reconcile of `run` (its cache updated first, as the controller's watch does).
    async fn reconcile(&mut self, run: FlowerRun) -> Action {
        self.runs
            .apply_watcher_event(&watcher::Event::Apply(run.clone()));
        reconcile(Arc::new(run), self.ctx.clone())
            .await
            .expect("reconcile")
    }

    /// One reconcile of the run as stored.
    async fn pass(&mut self) -> Action {
        let run = self.run().expect("the run exists");
        self.reconcile(run).await
    }

    fn journal(&self) -> Vec<String> {
        self.journal.lock().expect("journal").clone()
    }

    fn position(&self, what: &str) -> usize {
        let journal = self.journal();
        journal
            .iter()
            .position(|l| l.starts_with(what))
            .unwrap_or_else(|| panic!("no {what:?} in {journal:#?}"))
    }

    /// The only Flower run the stand-in holds.
    fn flower_run_id(&self) -> u64 {
        let ids = self.fake.runs.lock().expect("runs").ids();
        assert_eq!(ids.len(), 1, "exactly one Flower run: {ids:?}");
        ids[0]
    }
}

/// Marks a store listed (its first list done), as the controller's watch does.
trait Listed {
    fn listed(&mut self);
}

impl<K> Listed for Writer<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    fn listed(&mut self) {
        self.apply_watcher_event(&watcher::Event::Init);
        self.apply_watcher_event(&watcher::Event::InitDone);
    }
}

fn condition(status: &FlowerRunStatus, type_: &str) -> Option<(String, String, String)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn is(status: &FlowerRunStatus, type_: &str, reason: &str) -> bool {
    condition(status, type_).is_some_and(|(s, r, _)| s == "True" && r == reason)
}

fn has_finalizer(run: &FlowerRun) -> bool {
    run.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == RUN_FINALIZER)
}

#[tokio::test]
async fn a_run_waits_for_its_federation_then_is_submitted_followed_and_completed() {
    let (fab, hash) = fab();
    let mut s = Setup::new(
        federation(false, "SuperLink superlink: 0/1 ready"),
        vec![
            flower_run(json!({"num-server-rounds": 2, "min-nodes": 2})),
            config_map(&fab),
        ],
    )
    .await;

    // Waiting for the Federation: a condition saying which, no Control call, no finalizer; the
    // Federation's watch wakes it (no timer).
    assert_eq!(s.pass().await, Action::await_change());
    let waiting = s.status();
    let (state, reason, message) = condition(&waiting, "Submitted").expect("Submitted");
    assert_eq!(
        (state.as_str(), reason.as_str()),
        ("False", "FederationNotReady")
    );
    assert!(
        message.contains("Federation fed is not Ready (SuperLink superlink: 0/1 ready)"),
        "{message}"
    );
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
    assert!(!has_finalizer(&s.run().expect("run")));
    let before = s.journal().len();
    s.pass().await;
    assert!(
        !s.journal()[before..]
            .iter()
            .any(|l| l.starts_with("api: status")),
        "the same wait writes nothing: {:#?}",
        &s.journal()[before..]
    );

    // Ready: finalizer, then the pending submission stored, then StartRun, then its answer.
    s.feds
        .apply_watcher_event(&watcher::Event::Apply(federation(true, "all ready")));
    assert_eq!(s.pass().await, Action::requeue(Duration::from_secs(2)));
    let finalizer = s.position("api: patch fedavg");
    let pending = s.position("api: status fedavg pendingSubmission");
    let start = s.position("control: start-run");
    assert!(
        finalizer < pending && pending < start,
        "finalizer, pending submission, StartRun in that order: {:#?}",
        s.journal()
    );
    assert!(
        s.journal()[start..]
            .iter()
            .any(|l| l == "api: status fedavg"),
        "the answer stored after StartRun: {:#?}",
        s.journal()
    );
    assert!(
        s.position("api: event Submitted") > start,
        "{:#?}",
        s.journal()
    );
    let run_id = s.flower_run_id();
    let submitted = s.status();
    assert!(has_finalizer(&s.run().expect("run")));
    assert_eq!(submitted.run_id, Some(run_id.to_string()));
    assert!(submitted.pending_submission.is_none(), "{submitted:?}");
    assert_eq!(submitted.attempts, 1);
    assert_eq!(submitted.fab_hash.as_deref(), Some(hash.as_str()));
    assert!(is(&submitted, "Submitted", "Submitted"), "{submitted:?}");
    let sent = s.fake.runs.lock().expect("runs").runs[&run_id].clone();
    assert_eq!(sent.fab_hash, hash, "the FAB of the ConfigMap was sent");
    let mut config: Vec<&String> = sent.override_config.keys().collect();
    config.sort();
    assert_eq!(config, ["min-nodes", "num-server-rounds"]);

    // Running, with its log followed into logTail and progress.
    {
        let mut runs = s.fake.runs.lock().expect("runs");
        runs.set_status(run_id, "running");
        runs.log(run_id, "INFO :      round 1/2: 2 replies from 2 nodes");
    }
    s.pass().await;
    let running = s.status();
    assert!(is(&running, "Running", "Running"), "{running:?}");
    assert_eq!(running.flower_status.as_deref(), Some("running"));
    assert!(running.started_at.is_some());
    s.fake
        .runs
        .lock()
        .expect("runs")
        .log(run_id, "INFO :      round 2/2: 2 replies from 2 nodes");
    let mut followed = running;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.pass().await;
        followed = s.status();
        if followed.log_tail.len() >= 2 {
            break;
        }
    }
    assert_eq!(
        followed.log_tail,
        [
            "INFO :      round 1/2: 2 replies from 2 nodes",
            "INFO :      round 2/2: 2 replies from 2 nodes"
        ],
        "{followed:?}"
    );
    assert_eq!(
        followed.progress.as_ref().map(|p| p.text.as_str()),
        Some("2/2")
    );

    // Finished: Complete, the rest of the log read once.
    {
        let mut runs = s.fake.runs.lock().expect("runs");
        runs.log(run_id, "INFO :      final: rounds=2");
        runs.set_status(run_id, "finished:completed");
    }
    assert_eq!(s.pass().await, Action::await_change());
    let done = s.status();
    assert!(is(&done, "Complete", "Completed"), "{done:?}");
    assert_eq!(done.flower_status.as_deref(), Some("finished:completed"));
    assert!(done.finished_at.is_some());
    assert_eq!(
        done.log_tail.last().map(String::as_str),
        Some("INFO :      final: rounds=2"),
        "{done:?}"
    );
    assert_eq!(s.flower_run_id(), run_id, "one Flower run, never a second");

    // Finished runs cost nothing: no Control call, no request to the API server, however often
    // they are reconciled (resyncs, restarts), and no log follower left behind.
    let (api_before, control_before) = (s.journal().len(), s.fake.calls().len());
    for _ in 0..3 {
        assert_eq!(s.pass().await, Action::await_change());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        s.journal()[api_before..],
        [] as [String; 0],
        "a finished run made requests"
    );
    assert_eq!(s.fake.calls().len(), control_before);
    assert_eq!(s.status(), done);
}

#[tokio::test]
async fn deleting_a_running_run_stops_it_before_its_finalizer_goes() {
    let (fab, _) = fab();
    let mut s = Setup::new(
        federation(true, "all ready"),
        vec![
            flower_run(json!({"num-server-rounds": 2})),
            config_map(&fab),
        ],
    )
    .await;
    s.pass().await;
    let run_id = s.flower_run_id();
    s.fake
        .runs
        .lock()
        .expect("runs")
        .set_status(run_id, "running");
    s.pass().await;
    assert!(is(&s.status(), "Running", "Running"));

    let api = kube::Api::<FlowerRun>::namespaced(s.ctx.client.clone(), NS);
    api.delete(RUN, &Default::default()).await.expect("delete");
    let deleting = s.run().expect("held by the finalizer");
    assert!(deleting.metadata.deletion_timestamp.is_some());

    // The SuperLink cannot be reached: the finalizer stays, the run says why.
    let reachable = s.endpoint.lock().expect("endpoint").take();
    assert_eq!(s.pass().await, Action::requeue(Duration::from_secs(5)));
    let held = s.run().expect("still held");
    assert!(has_finalizer(&held));
    let details = held.status.and_then(|st| st.details).unwrap_or_default();
    assert!(
        details.contains(&format!("waiting to stop Flower run {run_id}")),
        "{details}"
    );
    assert!(!s.fake.calls().contains(&"stop-run".to_owned()));

    // Reachable again: StopRun, then the finalizer removed (the object goes).
    *s.endpoint.lock().expect("endpoint") = reachable;
    assert_eq!(s.pass().await, Action::await_change());
    let stop = s.position("control: stop-run");
    let release = s
        .journal()
        .iter()
        .rposition(|l| l.starts_with("api: patch fedavg") && l.contains("remove"))
        .expect("the finalizer removed");
    assert!(stop < release, "{:#?}", s.journal());
    assert!(s.run().is_none(), "the run is gone once released");
    let stopped = s.fake.runs.lock().expect("runs").runs[&run_id].clone();
    assert_eq!(stopped.status.expect("status").sub_status, "stopped");
}

#[tokio::test]
async fn an_unknown_run_config_key_fails_before_any_flower_call() {
    let (fab, _) = fab();
    let mut s = Setup::new(
        federation(true, "all ready"),
        vec![flower_run(json!({"num-roundz": 1})), config_map(&fab)],
    )
    .await;
    assert_eq!(s.pass().await, Action::await_change());
    let failed = s.status();
    let (state, reason, message) = condition(&failed, "Failed").expect("Failed");
    assert_eq!(
        (state.as_str(), reason.as_str()),
        ("True", "InvalidRunConfig")
    );
    assert!(
        message.contains("num-roundz") && message.contains("num-server-rounds"),
        "the message names the key and the app's keys: {message}"
    );
    assert!(failed.run_id.is_none() && failed.pending_submission.is_none());
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
    assert!(
        !has_finalizer(&s.run().expect("run")),
        "nothing to stop, no finalizer"
    );
    let before = s.journal().len();
    s.pass().await;
    assert_eq!(s.journal().len(), before, "{:#?}", &s.journal()[before..]);
    assert!(s.fake.calls().is_empty());
}

#[tokio::test]
async fn a_run_waits_for_its_configmap_and_starts_once_it_exists() {
    // Like a Pod waiting for its ConfigMap volume: the order in which a user (or a GitOps tool)
    // creates the two objects does not matter, and a misspelt name can be fixed by creating
    // the ConfigMap (the run's spec is immutable; a Failed run could never start).
    let (fab, _) = fab();
    let mut s = Setup::new(
        federation(true, "all ready"),
        vec![flower_run(json!({"num-server-rounds": 2}))],
    )
    .await;
    assert_eq!(s.pass().await, Action::await_change());
    let waiting = s.status();
    let (state, reason, message) = condition(&waiting, "Submitted").expect("Submitted");
    assert_eq!((state.as_str(), reason.as_str()), ("False", "InvalidApp"));
    assert!(
        message.contains("ConfigMap team/fedavg-fab does not exist")
            && message.contains("kubectl create configmap fedavg-fab -n team"),
        "{message}"
    );
    assert!(condition(&waiting, "Failed").is_none(), "{waiting:?}");
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());

    // The ConfigMap without the key: still waiting, the key named.
    let mut wrong_key = config_map(&fab);
    wrong_key["binaryData"] = json!({"other.fab": "AA=="});
    s.objects.lock().expect("objects").put(wrong_key);
    s.pass().await;
    let (_, reason, message) = condition(&s.status(), "Submitted").expect("Submitted");
    assert_eq!(reason, "InvalidApp");
    assert!(message.contains("has no key \"app.fab\""), "{message}");
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());

    s.objects.lock().expect("objects").put(config_map(&fab));
    s.pass().await;
    assert!(
        is(&s.status(), "Submitted", "Submitted"),
        "{:?}",
        s.status()
    );
    s.flower_run_id();
}

#[tokio::test]
async fn a_reconcile_on_a_stale_object_never_submits_again() {
    // The controller's cache may be behind its own writes. A reconcile of an object read
    // before the submission (no run id) must not send StartRun again: its status write is
    // conditional on the resourceVersion it read, and the API server refuses it.
    let (fab, _) = fab();
    let mut s = Setup::new(
        federation(true, "all ready"),
        vec![
            flower_run(json!({"num-server-rounds": 2})),
            config_map(&fab),
        ],
    )
    .await;
    // A finalizer already on (a second attempt, or put by the user), so the first write is the
    // status one.
    {
        let mut objects = s.objects.lock().expect("objects");
        let mut run = objects.get("flowerruns", NS, RUN).expect("run");
        run["metadata"]["finalizers"] = json!([RUN_FINALIZER]);
        objects.put(run);
    }
    let stale = s.run().expect("run");
    s.pass().await;
    let run_id = s.flower_run_id();
    let submitted = s.status();

    for stale_copy in [stale.clone(), {
        // Also with the finalizer missing from the stale copy: its JSON patch test fails.
        let mut no_finalizer = stale.clone();
        no_finalizer.metadata.finalizers = None;
        no_finalizer
    }] {
        let action = s.reconcile(stale_copy).await;
        assert_eq!(
            action,
            Action::requeue(Duration::from_secs(1)),
            "looks again soon"
        );
        assert_eq!(s.flower_run_id(), run_id, "StartRun was not sent again");
        assert_eq!(s.status(), submitted, "the newer status was kept");
    }
    assert_eq!(
        s.fake.calls().iter().filter(|c| *c == "start-run").count(),
        1
    );
}

#[tokio::test]
async fn runs_reconciled_at_once_share_one_list_runs() {
    // Invariant: passes within LIST_SHARED_FOR share one ListRuns answer of their SuperLink (not
    // one per FlowerRun per pass); a submission drops it, so the next pass asks again; after the
    // window a pass asks again.
    let (fab, _) = fab();
    let mut s = Setup::sharing(
        federation(true, "all ready"),
        vec![
            flower_run(json!({"num-server-rounds": 2, "min-nodes": 2})),
            config_map(&fab),
        ],
        flower_addon_hub::kube::controller::runs::LIST_SHARED_FOR,
    )
    .await;
    let lists = |s: &Setup| s.fake.calls().iter().filter(|c| *c == "list-runs").count();
    s.pass().await;
    assert!(
        s.fake.calls().iter().any(|c| c == "start-run"),
        "{:?}",
        s.fake.calls()
    );
    let after_submit = lists(&s);
    for _ in 0..3 {
        s.pass().await;
    }
    assert_eq!(
        lists(&s),
        after_submit + 1,
        "three passes right after the submission asked once: {:?}",
        s.fake.calls()
    );
    tokio::time::sleep(flower_addon_hub::kube::controller::runs::LIST_SHARED_FOR).await;
    s.pass().await;
    assert_eq!(lists(&s), after_submit + 2, "asked again after the window");
}

#[tokio::test]
async fn a_fab_url_the_admin_did_not_allow_fails_the_run_as_the_standalone_hub_fails_it() {
    // The hub's own egress rules, in Kubernetes mode as standalone (`e2e/tests/standalone_runs.rs`
    // checks the same words): loopback and the cloud metadata address are refused naming the
    // rule and the flag that opens them, nothing is downloaded, no Flower call is made.
    for (url, rule) in [
        (
            "http://127.0.0.2:9/fedavg.fab",
            "refused: loopback addresses",
        ),
        (
            "http://169.254.169.254/latest/meta-data/",
            "refused: link-local addresses (cloud metadata services)",
        ),
    ] {
        let mut run = flower_run(json!({"num-server-rounds": 2}));
        run["spec"]["app"]["fab"] = json!({"url": url, "sha256": "0".repeat(64)});
        let mut s = Setup::new(federation(true, "all ready"), vec![run]).await;
        s.pass().await;
        let failed = s.status();
        let (state, reason, message) = condition(&failed, "Failed").expect("Failed");
        assert_eq!(
            (state.as_str(), reason.as_str()),
            ("True", "InvalidApp"),
            "{url}"
        );
        assert!(
            message.contains(rule) && message.contains("--fab-url-allow"),
            "{url}: {message}"
        );
        assert!(
            !message.contains(url),
            "the refusal names the rule, not the target: {message}"
        );
        assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
    }
}

//! When a SuperLink certificate due for renewal waits for runs (both hub modes share
//! `flower::renewal`): only for runs in progress on a SuperLink that answers, only when due by
//! age and before 95 % of its life; every other case renews at once, asking nothing it need not.
mod fake_control;

use std::time::{Duration, SystemTime};

use flower_addon_crds::render::FlowerDialect;
use flower_addon_hub::flower::control::ControlEndpoint;
use flower_addon_hub::flower::renewal::{Renewal, RenewalHolds};
use flower_addon_hub::registration::ca::{CaRole, HubCa};
use flower_addon_proto::flwr::{Run, RunStatus};

const LIFE: Duration = Duration::from_secs(1000);

/// A stand-in SuperLink holding runs `(id, status)`.
async fn superlink(runs: &[(u64, &str)]) -> fake_control::StandIn {
    let fake = fake_control::Fake::default();
    for (id, status) in runs {
        let (status, sub_status) = status.split_once(':').unwrap_or((status, ""));
        fake.runs.lock().expect("runs").runs.insert(
            *id,
            Run {
                run_id: *id,
                status: Some(RunStatus {
                    status: status.into(),
                    sub_status: sub_status.into(),
                    details: String::new(),
                }),
                ..Default::default()
            },
        );
    }
    let flower_ca = HubCa::generate_for(CaRole::Flower).expect("ca");
    fake_control::stand_in(&flower_ca, fake).await
}

/// A certificate of [`LIFE`] that is `aged` (a share of its life) old now.
fn aged(aged: f64) -> (SystemTime, SystemTime) {
    let not_before = SystemTime::now() - LIFE.mul_f64(aged);
    (not_before, not_before + LIFE)
}

fn key() -> (String, String) {
    ("team".into(), "fed".into())
}

#[tokio::test]
async fn a_due_certificate_waits_only_for_unfinished_runs() {
    let fake_control::StandIn { fake, endpoint, .. } =
        superlink(&[(3, "finished:completed"), (9, "pending"), (5, "running")]).await;
    let holds = RenewalHolds::new(Duration::ZERO);
    let (not_before, not_after) = aged(0.85);
    let decision = holds
        .decide(&key(), Some(endpoint.clone()), not_before, not_after, LIFE)
        .await;
    let Renewal::Wait {
        runs, until, first, ..
    } = decision
    else {
        panic!("runs 5 and 9 are in progress: {decision:?}");
    };
    assert_eq!(runs, [5, 9]);
    assert!(first);
    assert_eq!(until, not_before + LIFE.mul_f64(0.95));
    // Asked again: still waiting, not the first time.
    let again = holds
        .decide(&key(), Some(endpoint.clone()), not_before, not_after, LIFE)
        .await;
    assert!(
        matches!(again, Renewal::Wait { first: false, .. }),
        "{again:?}"
    );
    // Both end: renewed, saying what it waited for.
    for id in [5, 9] {
        fake.runs
            .lock()
            .expect("runs")
            .set_status(id, "finished:stopped");
    }
    let done = holds
        .decide(&key(), Some(endpoint), not_before, not_after, LIFE)
        .await;
    assert_eq!(
        done,
        Renewal::Now {
            waited_for: Some(vec![5, 9])
        }
    );
    assert_eq!(fake.calls(), ["list-runs", "list-runs", "list-runs"]);
}

#[tokio::test]
async fn a_renewal_that_may_not_wait_asks_nothing() {
    // Past 95 % of its life, or living longer than the configured validity (the policy was
    // shortened): renewed at once, the SuperLink not even asked.
    let fake_control::StandIn { fake, endpoint, .. } = superlink(&[(5, "running")]).await;
    let holds = RenewalHolds::default();
    let (not_before, not_after) = aged(0.96);
    let late = holds
        .decide(&key(), Some(endpoint.clone()), not_before, not_after, LIFE)
        .await;
    assert_eq!(late, Renewal::Now { waited_for: None });
    let (not_before, not_after) = aged(0.85);
    let shortened = holds
        .decide(&key(), Some(endpoint), not_before, not_after, LIFE / 2)
        .await;
    assert_eq!(shortened, Renewal::Now { waited_for: None });
    assert_eq!(fake.calls(), Vec::<String>::new());
}

#[tokio::test]
async fn a_superlink_that_cannot_be_asked_is_not_waited_for() {
    // No endpoint (no SuperLink to ask), or one that does not answer: renewed at once — a
    // SuperLink that is down runs nothing a restart could stop.
    let holds = RenewalHolds::default();
    let (not_before, not_after) = aged(0.85);
    let none = holds
        .decide(&key(), None, not_before, not_after, LIFE)
        .await;
    assert_eq!(none, Renewal::Now { waited_for: None });
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = closed.local_addr().expect("addr").to_string();
    drop(closed);
    let unreachable = ControlEndpoint {
        dialect: FlowerDialect::Unified,
        address,
        server_name: "127.0.0.1".into(),
        ca_pem: None,
        tunnel: None,
    };
    let down = holds
        .decide(&key(), Some(unreachable), not_before, not_after, LIFE)
        .await;
    assert_eq!(down, Renewal::Now { waited_for: None });
}

//! Two `flower-hub serve --leader-elect` replicas (the hub Deployment's command line,
//! the hub's own RBAC) against a real hub apiserver. One leads: it holds the Lease, is ready,
//! serves the work channel and reconciles; the other stands by, alive but not ready, with no
//! work channel and no reconcile. A leader stopped gracefully hands over at the standby's next
//! try; a killed one after the lease duration (target: takeover ≤ 20 s with the defaults: a
//! 15 s lease and a 2 s retry).
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use e2e::ContainerCommand;
use e2e::harness::{Wait, binary, free_port};
use e2e::scrape::{Samples, get};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use nix::sys::signal::Signal;

const NS: &str = "team";
const HUB_NS: &str = e2e::addon::HUB_NS;

/// One hub replica: its name (also its POD_NAME, the Lease identity) and ports.
struct Replica {
    name: &'static str,
    channel: SocketAddr,
    metrics: SocketAddr,
    health: SocketAddr,
}

impl Replica {
    fn new(name: &'static str) -> Result<Self> {
        let port = |p| SocketAddr::from(([127, 0, 0, 1], p));
        Ok(Self {
            name,
            channel: port(free_port()?),
            metrics: port(free_port()?),
            health: port(free_port()?),
        })
    }

    /// The Deployment's command line with this replica's ports, as `POD_NAME=name`.
    fn command(&self, kubeconfig: &Path) -> Result<Command> {
        let manifest = e2e::repo_root().join("manifests/hub/deployment.yaml");
        let mut command = ContainerCommand::from_manifest(&manifest, "hub", HUB_NS)?;
        ensure!(
            command.argv.iter().any(|a| a == "--leader-elect"),
            "manifests/hub/deployment.yaml does not run the hub with --leader-elect: {:?}",
            command.argv
        );
        command
            .set_flag("--listen", &self.channel.to_string())?
            .push_args(&[
                "--advertise-address",
                "127.0.0.1",
                "--metrics-bind-address",
                &self.metrics.to_string(),
                "--health-probe-bind-address",
                &self.health.to_string(),
            ]);
        let argv = command.env_argv(
            &binary("flower-hub")?,
            &[
                ("KUBECONFIG", kubeconfig.display().to_string()),
                ("POD_NAME", self.name.to_string()),
            ],
        );
        let mut cmd = Command::new("/usr/bin/env");
        cmd.args(argv);
        Ok(cmd)
    }

    /// `/readyz`: its status code and body.
    fn readyz(&self) -> Result<(u16, String)> {
        get(self.health, "/readyz")
    }

    fn serves_channel(&self) -> bool {
        TcpStream::connect_timeout(&self.channel, Duration::from_millis(500)).is_ok()
    }

    /// Federation reconciles this replica counted.
    fn reconciles(&self) -> Result<f64> {
        Ok(Samples::scrape(self.metrics)?.count(
            "flower_addon_hub_reconciles_total",
            &[("controller", "federation")],
        ))
    }
}

async fn holder(leases: &Api<Lease>) -> Result<(String, i32)> {
    let spec = leases.get("flower-hub").await?.spec.unwrap_or_default();
    Ok((
        spec.holder_identity.unwrap_or_default(),
        spec.lease_transitions.unwrap_or(0),
    ))
}

/// Waits until `replica` leads (ready) and returns how long that took.
async fn wait_leading(replica: &Replica, timeout: Duration) -> Result<Duration> {
    Wait::new(format!("{} to lead (/readyz 200)", replica.name), timeout)
        .detail(|| format!("{:?}", replica.readyz()))
        .until(|| async { Ok(replica.readyz().is_ok_and(|(code, _)| code == 200)) })
        .await
}

/// Checks that `replica` is a live standby: /healthz passes, /readyz fails on the leader check
/// only, no work channel, no reconcile.
fn standing_by(replica: &Replica) -> Result<()> {
    let (code, body) = get(replica.health, "/healthz")?;
    ensure!(
        code == 200,
        "{} /healthz: HTTP {code}: {body}",
        replica.name
    );
    let (code, body) = replica.readyz()?;
    ensure!(
        code == 503 && body.contains("[-]leader failed"),
        "{} /readyz as a standby: HTTP {code}: {body}",
        replica.name
    );
    ensure!(
        !replica.serves_channel(),
        "the standby {} serves the work channel on {}",
        replica.name,
        replica.channel
    );
    ensure!(
        replica.reconciles()? == 0.0,
        "the standby {} reconciled",
        replica.name
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hub_leads_and_a_standby_takes_over() -> Result<()> {
    // Invariant: of two hub replicas only the Lease holder is ready, serves agents and
    // reconciles; the standby takes over after a graceful stop at its next try and after a crash
    // within the lease duration plus a retry, and a Federation keeps being reconciled.
    let t0 = Instant::now();
    let (mut cp, hub_sa) = e2e::addon::start_hub_with_rbac(NS).await?;
    let client = cp.cluster("hub")?.client.clone();
    let leases: Api<Lease> = Api::namespaced(client.clone(), HUB_NS);
    let work_dir = cp.work_dir().to_path_buf();
    let log = |name: &str| work_dir.join(format!("{name}.log"));
    let (a, b) = (Replica::new("hub-a")?, Replica::new("hub-b")?);

    cp.processes()
        .start_command(a.name, a.command(&hub_sa.kubeconfig)?, &log(a.name))?;
    wait_leading(&a, Duration::from_secs(60)).await?;
    cp.processes()
        .start_command(b.name, b.command(&hub_sa.kubeconfig)?, &log(b.name))?;
    Wait::new("hub-b /healthz", Duration::from_secs(30))
        .until(|| async { Ok(get(b.health, "/healthz").is_ok_and(|(c, _)| c == 200)) })
        .await?;
    ensure!(a.serves_channel(), "the leader serves no work channel");
    ensure!(
        holder(&leases).await?.0 == "hub-a",
        "Lease holder {:?}",
        holder(&leases).await?
    );

    // The leader reconciles a Federation; the standby does nothing, also after a few retries.
    let federation = std::fs::read_to_string(
        e2e::repo_root().join("examples/federation-statefulset-subprocess.yaml"),
    )?;
    e2e::apply_yaml(&client, &federation, NS).await?;
    let superlinks: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    e2e::wait_until(
        "the leader applies the SuperLink",
        Duration::from_secs(30),
        || async {
            Ok(superlinks
                .get_opt("federation-sts-subprocess-superlink")
                .await?
                .is_some())
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    standing_by(&b)?;
    ensure!(a.reconciles()? > 0.0, "the leader counted no reconcile");

    // Graceful stop (what deleting the leader pod does): hub-b leads at its next try.
    let t = Instant::now();
    cp.processes().get_mut(a.name)?.signal(Signal::SIGTERM)?;
    let graceful = wait_leading(&b, Duration::from_secs(15)).await?;
    let exited = Wait::new("hub-a to exit", Duration::from_secs(20))
        .for_value_blocking(|| Ok(cp.processes().get_mut(a.name)?.exited()))?;
    ensure!(exited.success(), "hub-a exited with {exited} after SIGTERM");
    let (holder_b, transitions) = holder(&leases).await?;
    ensure!(
        holder_b == "hub-b" && transitions >= 1,
        "after the hand-over the Lease holder is {holder_b:?} ({transitions} transitions)"
    );
    ensure!(b.serves_channel(), "the new leader serves no work channel");
    Wait::new("hub-b to reconcile the Federation", Duration::from_secs(30))
        .until(|| async { Ok(b.reconciles()? > 0.0) })
        .await?;
    eprintln!(
        "leader_election: graceful hand-over hub-a -> hub-b in {:.1}s (from SIGTERM {:.1}s)",
        graceful.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );

    // Crash (SIGKILL, no release): hub-a, restarted as a standby, leads after the lease runs out.
    cp.processes().stop(a.name).ok();
    cp.processes()
        .start_command(a.name, a.command(&hub_sa.kubeconfig)?, &log(a.name))?;
    Wait::new("hub-a to stand by", Duration::from_secs(30))
        .until(|| async { Ok(standing_by(&a).is_ok()) })
        .await?;
    cp.processes().get_mut(b.name)?.signal(Signal::SIGKILL)?;
    let crash = wait_leading(&a, Duration::from_secs(30)).await?;
    ensure!(
        crash <= Duration::from_secs(20),
        "takeover after the leader was killed took {crash:?} (target 20 s: a 15 s lease, a 2 s retry)"
    );
    ensure!(
        holder(&leases).await?.0 == "hub-a",
        "Lease holder {:?}",
        holder(&leases).await?
    );
    eprintln!(
        "leader_election: hub-b killed; hub-a took over in {:.1}s (lease 15 s, retry 2 s); test took {:.1}s",
        crash.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Restarts every replica of `replicas` that has exited, as the kubelet restarts a container,
/// and counts the exits per replica in `exits` (with the exit status, for the error).
fn restart_exited(
    cp: &mut e2e::ControlPlane,
    replicas: &[&Replica],
    kubeconfig: &Path,
    exits: &mut Vec<(&'static str, String)>,
) -> Result<()> {
    for replica in replicas {
        let log = cp.work_dir().join(format!("{}.log", replica.name));
        if let Some(status) = cp.processes().get_mut(replica.name)?.exited() {
            exits.push((replica.name, status.to_string()));
            cp.processes().stop(replica.name).ok();
            cp.processes()
                .start_command(replica.name, replica.command(kubeconfig)?, &log)?;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_rides_out_an_etcd_outage() -> Result<()> {
    // Invariant: through an outage of the etcd the leader cannot renew, so it stops (once) and
    // comes back (the Deployment's one replica, restarted as the kubelet would: the same pod
    // name, so the same identity); once the apiserver serves again it leads and keeps leading —
    // it does not stop a second time while the Lease is renewed 15 more times (a leader that
    // takes the Lease while the apiserver still fails some requests must not lose it again: that
    // cost a hub pod a second restart per etcd outage on a loaded machine).
    let (mut cp, hub_sa) = e2e::addon::start_hub_with_rbac(NS).await?;
    let client = cp.cluster("hub")?.client.clone();
    let leases: Api<Lease> = Api::namespaced(client.clone(), HUB_NS);
    let a = Replica::new("hub-a")?;
    let log = cp.work_dir().join(format!("{}.log", a.name));
    cp.processes()
        .start_command(a.name, a.command(&hub_sa.kubeconfig)?, &log)?;
    wait_leading(&a, Duration::from_secs(60)).await?;

    let outage = Duration::from_secs(60);
    let downed = cp.stop_etcd()?;
    let t = Instant::now();
    let mut exits = Vec::new();
    while t.elapsed() < outage {
        restart_exited(&mut cp, &[&a], &hub_sa.kubeconfig, &mut exits)?;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let during = exits.len();
    ensure!(
        during == 1,
        "the hub stopped {during} times through a {outage:?} etcd outage (once: it cannot renew): {exits:?}"
    );
    cp.start_again(downed, Duration::from_secs(120)).await?;

    // Renewals are counted as changes of the Lease's renew time under hub-a.
    let mut seen: Option<String> = None;
    let mut renewals = 0;
    let started = Instant::now();
    while renewals < 15 {
        ensure!(
            started.elapsed() < Duration::from_secs(180),
            "the hub did not lead through 15 renewals within 180 s after the outage (exits {exits:?}, {renewals} renewals); log:\n{}",
            cp.processes().log_tails(Some(&[a.name]))
        );
        restart_exited(&mut cp, &[&a], &hub_sa.kubeconfig, &mut exits)?;
        if let Ok(Some(lease)) = leases.get_opt("flower-hub").await {
            let spec = lease.spec.unwrap_or_default();
            let renewed = spec.renew_time.map(|t| t.0.to_string());
            if spec.holder_identity.as_deref() == Some(a.name) && renewed.is_some() {
                if seen.is_some() && seen != renewed {
                    renewals += 1;
                }
                seen = renewed;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    ensure!(
        exits.len() == 1,
        "the hub stopped again after the etcd outage: {exits:?}; log:\n{}",
        cp.processes().log_tails(Some(&[a.name]))
    );
    ensure!(
        a.readyz()?.0 == 200 && a.serves_channel(),
        "the hub leads but is not ready: {:?}",
        a.readyz()
    );
    eprintln!(
        "leader_election: etcd stopped {:.0}s: the hub stopped once during it and led through 15 renewals {:.1}s after the apiserver was back",
        outage.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

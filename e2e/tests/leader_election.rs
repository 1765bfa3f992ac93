//! Two `flower-hub serve --leader-elect` replicas (the hub Deployment's command line,
//! the hub's own RBAC) against a real hub apiserver. One leads: it holds the Lease, is ready,
//! serves the work channel and reconciles; the other stands by, alive but not ready, with no
//! work channel and no reconcile. A leader stopped gracefully hands over at the standby's next
//! try; a killed one after the lease duration (target: takeover ≤ 15 s with the defaults).
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
        crash <= Duration::from_secs(15),
        "takeover after the leader was killed took {crash:?} (target 15 s)"
    );
    ensure!(
        holder(&leases).await?.0 == "hub-a",
        "Lease holder {:?}",
        holder(&leases).await?
    );
    eprintln!(
        "leader_election: hub-b killed; hub-a took over in {:.1}s (lease 10 s, retry 2 s); test took {:.1}s",
        crash.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

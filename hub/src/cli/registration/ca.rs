//! `flower-hub ca`: where a hub CA's rotation stands, and its steps
//! ([`crate::registration::rotation`]), for the Flower CA (SuperLinks, SuperNodes, `flwr`) and
//! the work-channel CA (the hub and its agents).
use std::process::ExitCode;

use crate::registration::ca::{CaRole, HubCa};
use crate::registration::rotation::{RotationPhase, RotationStep, in_force_fingerprint, rotate};
use crate::registration::store::ClusterStore;

use super::{Hub, HubArgs, block_on, explain};

/// `flower-hub ca …`.
#[derive(clap::Subcommand, Debug)]
pub enum CaCommand {
    /// Show a hub CA: the one that signs, the ones trusted beside it, and the next rotation
    /// step.
    #[command(
        after_help = "Examples:\n  flower-hub ca status --state-dir /var/lib/flower-hub\n  flower-hub ca status --ca channel"
    )]
    Status(CaArgs),
    /// Rotate a hub CA, one step at a time (each takes effect when the hub next starts): `stage`
    /// a new CA that everything trusts beside the current one, `promote` it to sign, `retire`
    /// the old one. The Flower CA's SuperNodes restart on each new bundle; the work-channel CA
    /// reaches agents by their next heartbeat, and they renew their certificates from it.
    #[command(
        after_help = "A rotation, in Kubernetes mode:\n  flower-hub ca rotate stage\n  kubectl -n flower-addon-system rollout restart deployment flower-hub\n  # wait until every Federation is Ready again (SuperNodes restarted on both CAs)\n  flower-hub ca rotate promote\n  kubectl -n flower-addon-system rollout restart deployment flower-hub\n  # wait until every Federation is Ready again (SuperLinks restarted on new certificates);\n  # give flwr users the new CA file (flower-hub connect)\n  flower-hub ca rotate retire\n  kubectl -n flower-addon-system rollout restart deployment flower-hub"
    )]
    Rotate(RotateArgs),
}

/// Which hub CA.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhichCa {
    /// The Flower CA: each Federation's SuperLink CA is derived from it (what its SuperNodes and
    /// `flwr` trust).
    Flower,
    /// The work-channel CA: the hub's server certificate and agents' client certificates (what
    /// `flower-agent join --ca-hash` pins).
    Channel,
}

/// Arguments naming a hub and one of its CAs.
#[derive(clap::Args, Debug)]
pub struct CaArgs {
    /// Which CA.
    #[arg(long = "ca", value_enum, default_value = "flower")]
    pub which: WhichCa,
    #[command(flatten)]
    pub hub_args: HubArgs,
}

/// Arguments of `flower-hub ca rotate`.
#[derive(clap::Args, Debug)]
pub struct RotateArgs {
    /// The step to take.
    #[arg(value_enum)]
    pub step: RotationStep,
    /// Take `promote` or `retire` although the hub has not started with the last step yet
    /// (agents and SuperNodes may then be locked out until they join again).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub ca_args: CaArgs,
}

/// `flower-hub ca …`.
pub fn ca(cmd: CaCommand) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let (args, step) = match &cmd {
            CaCommand::Status(args) => (args, None),
            CaCommand::Rotate(rotate) => (&rotate.ca_args, Some(rotate.step)),
        };
        let hub = Hub::open(&args.hub_args).await?;
        let role = match args.which {
            WhichCa::Flower => CaRole::Flower,
            WhichCa::Channel => CaRole::Channel,
        };
        let label = role_label(role);
        let stored =
            with_store!(&hub, s => s.load_ca_for(role).await).map_err(|e| explain(e, &hub))?;
        let Some(material) = stored else {
            anyhow::bail!(
                "this hub has no {label} yet: it is made when `flower-hub serve` first starts"
            );
        };
        let in_force =
            with_store!(&hub, s => s.ca_in_force(role).await).map_err(|e| explain(e, &hub))?;
        let is_in_force = in_force.as_deref() == Some(in_force_fingerprint(&material).as_str());
        let restart = restart_command(&hub);
        // How far the current phase reached the agents (the work-channel CA only: the Flower
        // CA reaches SuperNodes through the Federations' readiness).
        let rollout = match role {
            CaRole::Channel => {
                let clusters = with_store!(&hub, s => s.list_clusters().await)
                    .map_err(|e| explain(e, &hub))?;
                let ca = HubCa::from_material(material.clone())?;
                Some(AgentRollout::of(&clusters, &ca, unix_now()))
            }
            CaRole::Flower => None,
        };
        let force = matches!(&cmd, CaCommand::Rotate(r) if r.force);
        let material = match step {
            None => material,
            Some(step) => {
                let rotated = rotate(role, &material, step)?;
                // Starting a rotation only adds trust; the later steps change what signs and what
                // is trusted, so each waits until the hub runs with the one before (agents and
                // SuperNodes follow the hub: its restart is what rolls the bundle out).
                if step != RotationStep::Stage && !is_in_force {
                    if !force {
                        anyhow::bail!(
                            "{label}: the last step has not reached the hub yet (it has not started with it): {restart}, wait until {}, then run `flower-hub ca rotate {}` again (or add --force, which may lock agents and SuperNodes out until they join again)",
                            wait_for(role),
                            step.as_str()
                        );
                    }
                    eprintln!(
                        "warning: --force: {} although the hub has not started with the last step; agents or SuperNodes that did not get the new bundle must join again",
                        step.as_str()
                    );
                }
                // …and, for the work-channel CA, until every agent renewed with it: promoting
                // before an agent trusts the next CA, or retiring before it holds a certificate
                // of the new one, locks that agent out.
                if let Some(rollout) = rollout
                    .as_ref()
                    .filter(|r| step != RotationStep::Stage && is_in_force && !r.lagging.is_empty())
                {
                    if !force {
                        anyhow::bail!(
                            "{label}: {} of {} agents renewed since the hub started with the last step; waiting for {}: they renew at their next heartbeat once connected (`flower-hub status` shows which are offline); run `flower-hub ca rotate {}` again then (or add --force: those agents must join again with a new token)",
                            rollout.renewed,
                            rollout.renewed + rollout.lagging.len(),
                            rollout.lagging_names(),
                            step.as_str()
                        );
                    }
                    eprintln!(
                        "warning: --force: {} although {} did not renew yet; they must join again with a new token",
                        step.as_str(),
                        rollout.lagging_names()
                    );
                }
                with_store!(&hub, s => s.replace_ca_for(role, &material, &rotated).await)
                    .map_err(|e| explain(e, &hub))?;
                println!("{label}: {} done", step.as_str());
                rotated
            }
        };
        let in_force_now = step.is_none() && is_in_force;
        print_status(role, &HubCa::from_material(material)?, &hub, step.is_some());
        if step.is_none() {
            println!(
                "in force:   {}",
                if in_force_now {
                    "yes (the hub started with this)".to_owned()
                } else {
                    format!("not yet: {restart}")
                }
            );
            if let Some(rollout) = &rollout {
                let total = rollout.renewed + rollout.lagging.len();
                if rollout.lagging.is_empty() {
                    println!("agents:     {total} of {total} renewed with this CA");
                } else {
                    println!(
                        "agents:     {} of {total} renewed with this CA (waiting for {})",
                        rollout.renewed,
                        rollout.lagging_names()
                    );
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Which agents hold what the work-channel CA's current phase gives them: a certificate from its
/// signing CA and its whole bundle (both come with each join or renewal). Counted over clusters
/// the hub accepts whose certificate is still valid.
#[derive(Debug, PartialEq, Eq)]
struct AgentRollout {
    /// How many have both.
    renewed: usize,
    /// Those that do not (sorted).
    lagging: Vec<String>,
}

impl AgentRollout {
    fn of(
        clusters: &[crate::registration::store::ClusterRecord],
        ca: &HubCa,
        now_unix: u64,
    ) -> Self {
        let bundle = crate::registration::ca::bundle_id(ca.bundle_pem());
        let mut out = Self {
            renewed: 0,
            lagging: Vec::new(),
        };
        for c in clusters {
            let valid = c
                .status
                .client_cert_not_after_unix
                .is_some_and(|t| t > now_unix);
            if !c.hub_accepts_client || !valid {
                continue;
            }
            if c.status.client_cert_issuer.as_deref() == Some(ca.hash())
                && c.status.channel_bundle.as_deref() == Some(bundle.as_str())
            {
                out.renewed += 1;
            } else {
                out.lagging.push(c.registration.name.clone());
            }
        }
        out.lagging.sort();
        out
    }

    /// The lagging clusters' names, at most 10 and how many more.
    fn lagging_names(&self) -> String {
        let mut names = self
            .lagging
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if self.lagging.len() > 10 {
            names.push_str(&format!(" and {} more", self.lagging.len() - 10));
        }
        names
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn role_label(role: CaRole) -> &'static str {
    match role {
        CaRole::Flower => "Flower CA",
        CaRole::Channel => "work-channel CA",
    }
}

/// How to restart the hub so it takes a rotation step.
fn restart_command(hub: &Hub) -> String {
    match hub {
        Hub::File { .. } => "restart `flower-hub serve`".to_owned(),
        Hub::Kube { namespace, .. } => {
            format!("kubectl -n {namespace} rollout restart deployment flower-hub")
        }
    }
}

/// What to wait for after the hub restarted, before the next step.
fn wait_for(role: CaRole) -> &'static str {
    match role {
        CaRole::Flower => "every Federation is Ready again",
        CaRole::Channel => "every agent connected again",
    }
}

fn print_status(role: CaRole, ca: &HubCa, hub: &Hub, changed: bool) {
    let phase = RotationPhase::of(ca.material());
    println!("signing CA: {}", ca.hash());
    let trusted = flower_addon_runtime::tls::bundle_hashes(ca.bundle_pem());
    println!("trusted:    {}", trusted.join(", "));
    println!("rotation:   {}", phase.as_str());
    if changed {
        println!(
            "The hub uses this when it next starts: {}",
            restart_command(hub)
        );
    }
    let next = match (role, phase) {
        (_, RotationPhase::Idle) => "none (`flower-hub ca rotate stage` starts a rotation)",
        (CaRole::Flower, RotationPhase::Staged) => {
            "once every Federation is Ready again after the hub restarted (its SuperNodes \
             restart on both CAs): `flower-hub ca rotate promote`"
        }
        (CaRole::Flower, RotationPhase::Promoted) => {
            "once every Federation is Ready again after the hub restarted (SuperLinks restart on \
             certificates of the new CA) and `flwr` users have the new CA file (`flower-hub \
             connect`): `flower-hub ca rotate retire`"
        }
        (CaRole::Channel, RotationPhase::Staged) => {
            "once every agent connected again after the hub restarted (each renews and stores \
             both CAs at its first heartbeat): `flower-hub ca rotate promote --ca channel`; new \
             joins keep pinning the current hash until then"
        }
        (CaRole::Channel, RotationPhase::Promoted) => {
            "once every agent connected again after the hub restarted (each renews its \
             certificate from the new CA at its first heartbeat): `flower-hub ca rotate retire \
             --ca channel`; new joins pin the new hash (`flower-hub token create` prints it)"
        }
    };
    println!("next step:  {next}");
}

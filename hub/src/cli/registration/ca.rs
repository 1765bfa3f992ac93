//! `flower-hub ca`: where the Flower CA's rotation stands, and its steps
//! ([`crate::registration::rotation`]).
use std::process::ExitCode;

use crate::registration::ca::{CaRole, HubCa};
use crate::registration::rotation::{RotationPhase, RotationStep, rotate};
use crate::registration::store::ClusterStore;

use super::{Hub, HubArgs, block_on, explain};

/// `flower-hub ca …`.
#[derive(clap::Subcommand, Debug)]
pub enum CaCommand {
    /// Show the Flower CA: the one that signs SuperLink certificates, the ones trusted beside it,
    /// and the next rotation step.
    #[command(after_help = "Example:\n  flower-hub ca status --state-dir /var/lib/flower-hub")]
    Status(HubArgs),
    /// Rotate the Flower CA, one step at a time (each takes effect when the hub next starts):
    /// `stage` a new CA that everything trusts beside the current one, `promote` it to sign
    /// SuperLink certificates, `retire` the old one.
    #[command(
        after_help = "A rotation, in Kubernetes mode:\n  flower-hub ca rotate stage\n  kubectl -n flower-addon-system rollout restart deployment flower-hub\n  # wait until every Federation is Ready again (SuperNodes restarted on both CAs)\n  flower-hub ca rotate promote\n  kubectl -n flower-addon-system rollout restart deployment flower-hub\n  # wait until every Federation is Ready again (SuperLinks restarted on new certificates);\n  # give flwr users the new CA file (flower-hub connect)\n  flower-hub ca rotate retire\n  kubectl -n flower-addon-system rollout restart deployment flower-hub"
    )]
    Rotate(RotateArgs),
}

/// Arguments of `flower-hub ca rotate`.
#[derive(clap::Args, Debug)]
pub struct RotateArgs {
    /// The step to take.
    #[arg(value_enum)]
    pub step: RotationStep,
    #[command(flatten)]
    pub hub_args: HubArgs,
}

/// `flower-hub ca …`.
pub fn ca(cmd: CaCommand) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let (args, step) = match &cmd {
            CaCommand::Status(args) => (args, None),
            CaCommand::Rotate(rotate) => (&rotate.hub_args, Some(rotate.step)),
        };
        let hub = Hub::open(args).await?;
        let role = CaRole::Flower;
        let stored =
            with_store!(&hub, s => s.load_ca_for(role).await).map_err(|e| explain(e, &hub))?;
        let Some(material) = stored else {
            anyhow::bail!(
                "this hub has no Flower CA yet: it is made when `flower-hub serve` first starts"
            );
        };
        let material = match step {
            None => material,
            Some(step) => {
                let rotated = rotate(role, &material, step)?;
                with_store!(&hub, s => s.replace_ca_for(role, &material, &rotated).await)
                    .map_err(|e| explain(e, &hub))?;
                println!("Flower CA: {} done", step.as_str());
                rotated
            }
        };
        print_status(&HubCa::from_material(material)?, &hub, step.is_some());
        Ok(ExitCode::SUCCESS)
    })
}

fn print_status(ca: &HubCa, hub: &Hub, changed: bool) {
    let phase = RotationPhase::of(ca.material());
    println!("signing CA: {}", ca.hash());
    let trusted = flower_addon_agent::tls::bundle_hashes(ca.bundle_pem());
    println!("trusted:    {}", trusted.join(", "));
    println!("rotation:   {}", phase.as_str());
    if changed {
        let restart = match hub {
            Hub::File { .. } => "restart `flower-hub serve`".to_owned(),
            Hub::Kube { namespace, .. } => {
                format!("kubectl -n {namespace} rollout restart deployment flower-hub")
            }
        };
        println!("The hub uses this when it next starts: {restart}");
    }
    let next = match phase {
        RotationPhase::Idle => "none (`flower-hub ca rotate stage` starts a rotation)",
        RotationPhase::Staged => {
            "once every Federation is Ready again after the hub restarted (its SuperNodes \
             restart on both CAs): `flower-hub ca rotate promote`"
        }
        RotationPhase::Promoted => {
            "once every Federation is Ready again after the hub restarted (SuperLinks restart on \
             certificates of the new CA) and `flwr` users have the new CA file (`flower-hub \
             connect`): `flower-hub ca rotate retire`"
        }
    };
    println!("next step:  {next}");
}

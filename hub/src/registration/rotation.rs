//! CA rotation (replacing a CA without cutting off the agents and SuperNodes that trust it), in
//! three steps an admin takes with `flower-hub ca`, each stored in the CA record ([`CaMaterial`])
//! and in force when the hub next starts:
//!
//! 1. **stage**: a new CA is made and published beside the current one. It signs nothing yet;
//!    every trust bundle the hub hands out ([`crate::registration::ca::HubCa::bundle_pem`]:
//!    SuperNodes' `--root-certificates`, `flwr`'s CA file, agents' hub CA) holds both, and
//!    SuperNodes restart on the new bundle.
//! 2. **promote**: the new CA signs. Certificates it did not sign are re-issued (SuperLinks
//!    restart on theirs); the old CA stays trusted, so nothing that still holds an old
//!    certificate is cut off.
//! 3. **retire**: the old CA is dropped from every bundle.
//!
//! Each step needs the one before, so a rotation cannot skip the time in which both CAs are
//! trusted everywhere.
use super::ca::{CaError, CaMaterial, CaRole, HubCa};

/// One step of a rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RotationStep {
    /// Make the next CA and trust it beside the current one.
    Stage,
    /// Sign with the next CA; the current one stays trusted.
    Promote,
    /// Stop trusting the replaced CA.
    Retire,
}

impl RotationStep {
    /// The step as `flower-hub ca` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stage => "stage",
            Self::Promote => "promote",
            Self::Retire => "retire",
        }
    }
}

/// Where a CA's rotation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RotationPhase {
    /// One CA, no rotation under way.
    Idle,
    /// A next CA is trusted beside the signing one (`promote` is next).
    Staged,
    /// A new CA signs; the replaced one is still trusted (`retire` is next).
    Promoted,
}

impl RotationPhase {
    /// The phase of `material`.
    pub fn of(material: &CaMaterial) -> Self {
        match (&material.next, &material.previous_cert_pem) {
            (Some(_), _) => Self::Staged,
            (None, Some(_)) => Self::Promoted,
            (None, None) => Self::Idle,
        }
    }

    /// What it is called in `flower-hub ca status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Staged => "staged",
            Self::Promoted => "promoted",
        }
    }
}

/// A step that does not follow from where the rotation stands.
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    /// The step needs another phase; the message names the step to take.
    #[error("cannot {step} the {role} CA while it is {phase}: {fix}", step = .step.as_str(), role = role_name(*.role), phase = .phase.as_str())]
    OutOfOrder {
        /// Which CA.
        role: CaRole,
        /// The step asked for.
        step: RotationStep,
        /// Where the rotation stands.
        phase: RotationPhase,
        /// What to do instead.
        fix: &'static str,
    },
    /// The new CA could not be made.
    #[error(transparent)]
    Ca(#[from] CaError),
}

/// The name of a CA role in messages and on the command line.
pub fn role_name(role: CaRole) -> &'static str {
    match role {
        CaRole::Channel => "channel",
        CaRole::Flower => "flower",
    }
}

/// The CA record after `step` (pure but for the new key `stage` makes).
pub fn rotate(
    role: CaRole,
    material: &CaMaterial,
    step: RotationStep,
) -> Result<CaMaterial, RotationError> {
    let phase = RotationPhase::of(material);
    let out_of_order = |fix| RotationError::OutOfOrder {
        role,
        step,
        phase,
        fix,
    };
    match (step, phase) {
        (RotationStep::Stage, RotationPhase::Idle) => {
            let next = HubCa::generate_for(role)?;
            Ok(CaMaterial {
                next: Some(Box::new(next.material().clone())),
                ..material.clone()
            })
        }
        (RotationStep::Stage, RotationPhase::Staged) => Err(out_of_order(
            "a next CA is staged already; `promote` it once everything trusts it",
        )),
        (RotationStep::Stage, RotationPhase::Promoted) => Err(out_of_order(
            "`retire` the replaced CA first, once nothing uses a certificate it signed",
        )),
        (RotationStep::Promote, RotationPhase::Staged) => {
            let next = material.next.as_deref().cloned().expect("staged");
            Ok(CaMaterial {
                previous_cert_pem: Some(material.cert_pem.clone()),
                previous_key_pem: Some(material.key_pem.clone()),
                ..next
            })
        }
        (RotationStep::Promote, _) => Err(out_of_order(
            "`stage` a next CA first, and wait until everything trusts it",
        )),
        (RotationStep::Retire, RotationPhase::Promoted) => Ok(CaMaterial {
            previous_cert_pem: None,
            previous_key_pem: None,
            ..material.clone()
        }),
        (RotationStep::Retire, _) => Err(out_of_order(
            "only a CA replaced by `promote` can be retired",
        )),
    }
}

/// What identifies the CA material a running hub loaded: the SHA-256 of its stored form. The hub
/// records it when it starts ([`crate::registration::store::ClusterStore::mark_ca_in_force`]),
/// and `flower-hub ca rotate` takes the next step only once the last one is in force.
pub fn in_force_fingerprint(material: &CaMaterial) -> String {
    use sha2::Digest;
    let bytes = serde_json::to_vec(material).unwrap_or_default();
    hex::encode(sha2::Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(ca: &HubCa) -> Vec<String> {
        flower_addon_runtime::tls::bundle_hashes(ca.bundle_pem())
    }

    #[test]
    fn a_rotation_trusts_both_cas_between_stage_and_retire() {
        let role = CaRole::Flower;
        let old = HubCa::generate_for(role).unwrap();
        assert_eq!(hashes(&old), [old.hash()]);
        // Without a rotation the bundle is the CA certificate as stored, byte for byte: what
        // agents and SuperNodes held before rotations existed is unchanged.
        assert_eq!(old.bundle_pem(), old.cert_pem());

        let staged = rotate(role, old.material(), RotationStep::Stage).unwrap();
        let staged = HubCa::from_material(staged).unwrap();
        assert_eq!(staged.hash(), old.hash(), "the old CA still signs");
        let next = HubCa::from_material(*staged.material().next.clone().unwrap()).unwrap();
        assert_eq!(hashes(&staged), [old.hash(), next.hash()]);

        let promoted = rotate(role, staged.material(), RotationStep::Promote).unwrap();
        let promoted = HubCa::from_material(promoted).unwrap();
        assert_eq!(promoted.hash(), next.hash(), "the new CA signs");
        assert_eq!(hashes(&promoted), [next.hash(), old.hash()]);

        let retired = rotate(role, promoted.material(), RotationStep::Retire).unwrap();
        let retired = HubCa::from_material(retired).unwrap();
        assert_eq!(hashes(&retired), [next.hash()]);
        assert_eq!(RotationPhase::of(retired.material()), RotationPhase::Idle);
    }

    #[test]
    fn steps_out_of_order_are_refused_naming_the_next_step() {
        let role = CaRole::Channel;
        let idle = HubCa::generate_for(role).unwrap().material().clone();
        for step in [RotationStep::Promote, RotationStep::Retire] {
            let err = rotate(role, &idle, step).unwrap_err().to_string();
            assert!(err.contains("while it is idle"), "{err}");
        }
        let staged = rotate(role, &idle, RotationStep::Stage).unwrap();
        let err = rotate(role, &staged, RotationStep::Stage)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`promote` it"), "{err}");
        let err = rotate(role, &staged, RotationStep::Retire)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot retire the channel CA while it is staged"),
            "{err}"
        );
        let promoted = rotate(role, &staged, RotationStep::Promote).unwrap();
        let err = rotate(role, &promoted, RotationStep::Stage)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`retire` the replaced CA first"), "{err}");
    }
}

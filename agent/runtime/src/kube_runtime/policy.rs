//! The spoke admin's pod policy over the work the hub sends: the project's one pod policy
//! ([`flower_addon_crds::policy`]), judged on every workload of a Federation before anything of
//! it is applied. A Federation whose pods break it is refused as a whole (what already runs is
//! kept) with the violations and the flag that allows each.
use std::collections::BTreeSet;

pub use flower_addon_crds::policy::{Admin, Allowance, PodPolicy, PodSecurityLevel};

use super::Rendered;
use crate::render::Workload;

/// Every violation in the workloads of `rendered`, each naming the pool, the field and the flag
/// that allows it; empty when the policy holds.
pub fn violations(policy: &PodPolicy, rendered: &Rendered) -> Vec<String> {
    // The Secrets the agent itself makes for this Federation: its CA bundle, and each pool's
    // node keys (`<workload>-node-keys`).
    let own_secrets: BTreeSet<String> = rendered
        .secret
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .chain(rendered.workloads.iter().filter_map(|(_, w)| {
            let name = match w {
                Workload::StatefulSet(s) => s.metadata.name.as_deref(),
                Workload::DaemonSet(d) => d.metadata.name.as_deref(),
            }?;
            Some(format!("{name}-node-keys"))
        }))
        .collect();
    let mut out = Vec::new();
    for (pool, workload) in &rendered.workloads {
        let spec = match workload {
            Workload::StatefulSet(s) => s.spec.template.spec.as_ref(),
            Workload::DaemonSet(d) => d.spec.template.spec.as_ref(),
        };
        for v in spec
            .map(|spec| policy.pod_violations(spec, &own_secrets))
            .unwrap_or_default()
        {
            out.push(format!("pool {}: {v}", pool.name));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_federation_without_workloads_has_no_violation() {
        // Invariant: only workloads are judged (the CA Secret and Services are the agent's).
        let rendered = Rendered {
            secret: None,
            workloads: Vec::new(),
            services: Vec::new(),
        };
        assert!(violations(&PodPolicy::spoke_default(), &rendered).is_empty());
    }
}

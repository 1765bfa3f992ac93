//! What keeps a Federation from being applied, the same in both hub modes and in
//! `flower-hub validate`: the CRD's own rules first, then what the renderer would refuse, then
//! what the hub's pod policy refuses.
use flower_addon_crds::policy::PodPolicy;
use flower_addon_crds::{Federation, validate_federation};

use crate::core::render::{policy_problems, render_problems};

/// Problems that keep a Federation from being applied, as `(field path, message)`: the CRD's
/// rules, then the renderer's, then what the hub's pod `policy` refuses in the pods it would
/// make in the hub cluster ([`policy_problems`]).
pub fn problems(fed: &Federation, policy: &PodPolicy) -> Vec<(String, String)> {
    let errors = validate_federation(fed);
    if !errors.is_empty() {
        return errors.into_iter().map(|e| (e.path, e.message)).collect();
    }
    let mut render = render_problems(fed);
    render.extend(restart_mark_problem(fed));
    if !render.is_empty() {
        return render;
    }
    policy_problems(fed, policy)
}

/// The restart mark ([`flower_addon_crds::SUPERNODE_RESTART_ANNOTATION`]) goes into pod
/// template annotations and process environments: a short printable value.
fn restart_mark_problem(fed: &Federation) -> Option<(String, String)> {
    let mark = flower_addon_crds::supernode_restart(&fed.metadata)?;
    let fits = mark.len() <= flower_addon_crds::SUPERNODE_RESTART_MAX
        && mark.chars().all(|c| c.is_ascii_graphic() || c == ' ');
    (!fits).then(|| {
        (
            format!(
                "metadata.annotations[{}]",
                flower_addon_crds::SUPERNODE_RESTART_ANNOTATION
            ),
            format!(
                "at most {} printable ASCII characters (a timestamp, e.g. `date -u +%FT%TZ`)",
                flower_addon_crds::SUPERNODE_RESTART_MAX
            ),
        )
    })
}

/// The problems as one line, `path: message; …`.
pub fn joined(problems: &[(String, String)]) -> String {
    problems
        .iter()
        .map(|(p, m)| format!("{p}: {m}"))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use flower_addon_crds::policy::Admin;

    #[test]
    fn a_restart_mark_that_cannot_be_carried_is_a_problem_naming_the_annotation() {
        // A timestamp is fine; a long or multi-line value is refused with the field and a fix.
        let mut fed: Federation = serde_saphyr::from_str(
            r#"
apiVersion: flower-addon.io/v1alpha1
kind: Federation
metadata: {name: fed, namespace: team}
spec:
  mode: StatefulSet
  isolationMode: subprocess
  superlink: {image: "flwr/superlink:1.42.0"}
  supernodes:
    image: "flwr/supernode:1.42.0"
    pools: [{name: a, replicas: 1}]
"#,
        )
        .expect("federation");
        let policy = PodPolicy::new(Admin::Hub);
        let mark = |fed: &mut Federation, value: &str| {
            fed.metadata.annotations = Some(
                [(
                    flower_addon_crds::SUPERNODE_RESTART_ANNOTATION.to_owned(),
                    value.to_owned(),
                )]
                .into(),
            );
        };
        mark(&mut fed, "2026-12-06T06:00:00Z");
        assert_eq!(problems(&fed, &policy), []);
        for bad in ["x".repeat(64), "one\ntwo".to_owned()] {
            mark(&mut fed, &bad);
            let found = problems(&fed, &policy);
            assert_eq!(found.len(), 1, "{found:?}");
            assert_eq!(
                found[0].0,
                "metadata.annotations[flower-addon.io/supernode-restart]"
            );
            assert!(found[0].1.contains("date -u"), "{}", found[0].1);
        }
    }
}

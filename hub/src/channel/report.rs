//! What an agent may report: a [`Status`] is checked where it arrives, before any of it reaches
//! the tasks that act on it (the key sync registers its keys with a SuperLink, the status writers
//! put its counts and conditions into Federation objects). A report that breaks a rule is refused
//! with `invalid_argument` naming the field, and nothing of it is recorded.
use flower_addon_proto::Status;

/// Longest OpenSSH public key line accepted (a P-521 line with a comment is ~300 bytes).
pub const MAX_KEY_LINE: usize = 1024;
/// Longest name (namespace, Federation, pool) accepted: a Kubernetes name's limit.
pub const MAX_NAME: usize = 253;
/// Longest condition field accepted (a container's termination message is at most 4 KiB).
pub const MAX_CONDITION_TEXT: usize = 8 * 1024;
/// Longest restart mark accepted back: the user's mark, a space and `after-run-<u64>`.
pub const MAX_RESTART_MARK: usize = flower_addon_crds::SUPERNODE_RESTART_MAX + 32;

/// Checks every field of `status` that the hub acts on; the error names the field and the rule.
pub fn check_status(status: &Status) -> Result<(), String> {
    for (f, fed) in status.federations.iter().enumerate() {
        let at = format!("federations[{f}]");
        check_name(&format!("{at}.namespace"), &fed.namespace)?;
        check_name(&format!("{at}.name"), &fed.name)?;
        // Written into the Federation's status as the cluster's restart mark.
        let mark = &fed.supernode_restart;
        if mark.len() > MAX_RESTART_MARK
            || mark.chars().any(|c| !(c.is_ascii_graphic() || c == ' '))
        {
            return Err(format!(
                "{at}.supernode_restart is not a restart mark the hub sent (at most \
                 {MAX_RESTART_MARK} printable ASCII characters)"
            ));
        }
        for (p, pool) in fed.pools.iter().enumerate() {
            let at = format!("{at}.pools[{p}]");
            check_name(&format!("{at}.name"), &pool.name)?;
            for (k, key) in pool.node_public_keys.iter().enumerate() {
                check_key_line(key).map_err(|why| format!("{at}.node_public_keys[{k}]: {why}"))?;
            }
            for (c, cond) in pool.conditions.iter().enumerate() {
                for (field, text) in [
                    ("type", &cond.r#type),
                    ("status", &cond.status),
                    ("reason", &cond.reason),
                    ("message", &cond.message),
                ] {
                    if text.len() > MAX_CONDITION_TEXT {
                        return Err(format!(
                            "{at}.conditions[{c}].{field} is {} bytes; at most {MAX_CONDITION_TEXT} are accepted",
                            text.len()
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// A name the hub looks Federations and pools up by: printable ASCII, at most [`MAX_NAME`].
fn check_name(field: &str, name: &str) -> Result<(), String> {
    if name.len() > MAX_NAME {
        return Err(format!(
            "{field} is {} bytes long; at most {MAX_NAME} are accepted",
            name.len()
        ));
    }
    if let Some(c) = name.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "{field} holds {c:?}; names are printable ASCII without spaces"
        ));
    }
    Ok(())
}

/// An OpenSSH public key line of a kind Flower's SuperNode authentication takes: printable
/// ASCII, at most [`MAX_KEY_LINE`] bytes, and one that parses
/// ([`crate::flower::keys::openssh_to_spki_der`]).
pub fn check_key_line(line: &str) -> Result<(), String> {
    if line.len() > MAX_KEY_LINE {
        return Err(format!(
            "{} bytes long; an OpenSSH public key line has at most {MAX_KEY_LINE}",
            line.len()
        ));
    }
    if let Some(c) = line.chars().find(|c| !(c.is_ascii_graphic() || *c == ' ')) {
        return Err(format!(
            "holds {c:?}; an OpenSSH public key line is printable ASCII ('ecdsa-sha2-nistp384 AAAA… comment')"
        ));
    }
    crate::flower::keys::openssh_to_spki_der(line)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flower_addon_proto::{Condition, FederationStatus, PoolStatus};

    const KEY: &str = "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBJ7NryvMMKWyOHkfa/yQMy1fXLDk2ZksQLI534CBZwGEKN0FcG1/iEiL2wcX8Rhx2qa2XiRAu8z9peBedvXBheoWLSJ04EfLTvEssJ2FcpYK6e5ZTs6jdMIs7t3wpC5vKw== node0";

    fn report(keys: &[&str]) -> Status {
        Status {
            federations: vec![FederationStatus {
                supernode_restart: String::new(),
                namespace: "team".into(),
                name: "fed".into(),
                pools: vec![PoolStatus {
                    name: "a".into(),
                    desired: 1,
                    ready: 1,
                    conditions: vec![Condition {
                        r#type: "Ready".into(),
                        status: "True".into(),
                        reason: "AllReady".into(),
                        message: "1/1".into(),
                    }],
                    node_public_keys: keys.iter().map(|k| (*k).to_owned()).collect(),
                }],
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_well_formed_report_passes() {
        assert_eq!(check_status(&report(&[KEY])), Ok(()));
        assert_eq!(check_status(&report(&[])), Ok(()));
        let mut marked = report(&[]);
        marked.federations[0].supernode_restart =
            format!("{} after-run-{}", "m".repeat(63), u64::MAX);
        assert_eq!(check_status(&marked), Ok(()));
    }

    #[test]
    fn a_restart_mark_the_hub_cannot_have_sent_is_refused_naming_the_field() {
        // It goes into the Federation's status: bounded and printable, as the marks the hub sends.
        for bad in [
            "x".repeat(MAX_RESTART_MARK + 1),
            "after-run-1\n\u{1b}[2J".to_owned(),
        ] {
            let mut r = report(&[]);
            r.federations[0].supernode_restart = bad;
            let why = check_status(&r).expect_err("refused");
            assert!(why.contains("federations[0].supernode_restart"), "{why}");
        }
    }

    #[test]
    fn key_lines_that_are_not_openssh_ecdsa_keys_are_refused_naming_the_field() {
        let multibyte = format!("{KEY} ключ");
        let long = format!("ecdsa-sha2-nistp384 {}", "A".repeat(2000));
        for (line, why) in [
            ("ecdsa-sha2-nistp384 ééééééééééééééé", "holds 'é'"),
            (multibyte.as_str(), "holds 'к'"),
            ("ecdsa-sha2-nistp384\tAAAA", "holds '\\t'"),
            (long.as_str(), "bytes long"),
            (
                "ecdsa-sha2-nistp384 not-base64",
                "not an OpenSSH public key line",
            ),
            ("", "not an OpenSSH public key line"),
        ] {
            let error = check_status(&report(&[KEY, line])).expect_err(line);
            assert!(
                error.starts_with("federations[0].pools[0].node_public_keys[1]: ")
                    && error.contains(why),
                "{line:?}: {error}"
            );
        }
    }

    #[test]
    fn names_and_condition_texts_are_bounded() {
        let mut r = report(&[KEY]);
        r.federations[0].name = "fé".into();
        assert!(
            check_status(&r)
                .unwrap_err()
                .starts_with("federations[0].name holds 'é'")
        );
        let mut r = report(&[KEY]);
        r.federations[0].pools[0].name = "p".repeat(MAX_NAME + 1);
        assert!(
            check_status(&r)
                .unwrap_err()
                .contains("federations[0].pools[0].name is 254 bytes")
        );
        let mut r = report(&[KEY]);
        r.federations[0].pools[0].conditions[0].message = "m".repeat(MAX_CONDITION_TEXT + 1);
        assert!(
            check_status(&r)
                .unwrap_err()
                .contains("conditions[0].message is")
        );
    }
}

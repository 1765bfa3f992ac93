//! The hub's side of Flower itself, used by both adapters: the SuperLink's Control API
//! ([`control`]), the Fleet front that keeps the Control API off the port SuperNodes reach
//! ([`front`]), FABs ([`fab`]) and their download from a run's URL ([`fab_url`]), SuperNode key
//! formats ([`keys`]), keeping a SuperLink's registered keys equal to what the core wants
//! ([`sync_keys`]), and the files runs output with the sidecar serving them ([`outputs`]).
pub mod control;
pub mod diagnose;
/// FABs: the `flower-addon-fab` crate (`hub/fab`).
pub use flower_addon_fab as fab;
pub mod fab_url;
pub mod front;
pub mod keys;
pub mod outputs;
pub mod registry;
pub mod renewal;
pub mod runs;

use crate::core::nodekeys::{self, KeyPlan};
use control::{BATCH_CONCURRENCY, ControlClient, ControlError, Registration};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};

/// What one key sync did and found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeySync {
    /// Wanted keys (OpenSSH lines) the SuperLink now holds.
    pub registered: BTreeSet<String>,
    /// Wanted keys whose SuperNode the SuperLink lists `online` (as of the listing).
    pub online: BTreeSet<String>,
    /// How many keys this sync registered.
    pub newly_registered: usize,
    /// How many nodes this sync unregistered.
    pub unregistered: usize,
    /// Keys that could not be registered or unregistered, with why (retried next sync).
    pub failed: Vec<String>,
    /// Wanted keys the SuperLink will never register again ([`KeyPlan::retired`]).
    pub retired: BTreeSet<String>,
    /// Whether a registration or removal failed unexpectedly ([`ControlError::is_internal`]):
    /// the SuperLink logged why ([`diagnose`]).
    pub internal: bool,
}

/// Makes the SuperLink behind `client` hold exactly `wanted` (OpenSSH public key lines): lists
/// its nodes, registers the missing keys and unregisters the rest, [`BATCH_CONCURRENCY`] calls at
/// a time. Only the listing failing is an error; single refusals are reported in
/// [`KeySync::failed`].
pub async fn sync_keys(
    client: &ControlClient,
    wanted: &BTreeSet<String>,
) -> Result<KeySync, ControlError> {
    sync_keys_with(client, wanted, true).await
}

/// [`sync_keys`]; with `prune` false nothing is unregistered (only missing keys are registered):
/// for a Federation some of whose placed clusters have not reported since the hub started,
/// whose keys the hub does not know yet.
pub async fn sync_keys_with(
    client: &ControlClient,
    wanted: &BTreeSet<String>,
    prune: bool,
) -> Result<KeySync, ControlError> {
    let mut failed = Vec::new();
    let mut by_der: BTreeMap<Vec<u8>, String> = BTreeMap::new();
    for line in wanted {
        match keys::openssh_to_spki_der(line) {
            Ok(der) => {
                by_der.insert(der, line.clone());
            }
            Err(e) => failed.push(format!("{}: {e}", short(line))),
        }
    }
    let listed = client.list_nodes().await?;
    let KeyPlan {
        register,
        mut unregister,
        mut registered,
        online,
        retired,
    } = nodekeys::plan(&by_der, &listed);
    if !prune {
        unregister.clear();
    }
    let registrations: Vec<(String, Result<Registration, ControlError>)> =
        futures::stream::iter(register)
            .map(|line| async move {
                let r = client.register_node(&line).await;
                (line, r)
            })
            .buffer_unordered(BATCH_CONCURRENCY)
            .collect()
            .await;
    let mut newly_registered = 0;
    let mut internal = false;
    for (line, result) in registrations {
        match result {
            Ok(r) => {
                newly_registered += usize::from(matches!(r, Registration::Registered(_)));
                registered.insert(line);
            }
            Err(e) => {
                internal |= e.is_internal();
                failed.push(format!("{}: {e}", short(&line)));
            }
        }
    }
    let removals: Vec<(u64, Result<(), ControlError>)> = futures::stream::iter(unregister)
        .map(|id| async move { (id, client.unregister_node(id).await) })
        .buffer_unordered(BATCH_CONCURRENCY)
        .collect()
        .await;
    let mut unregistered = 0;
    for (id, result) in removals {
        match result {
            Ok(()) => unregistered += 1,
            Err(e) => {
                internal |= e.is_internal();
                failed.push(format!("node {id}: {e}"));
            }
        }
    }
    Ok(KeySync {
        registered,
        online,
        newly_registered,
        unregistered,
        failed,
        retired,
        internal,
    })
}

/// A key shortened for messages: its type and the last 12 characters of its data (characters,
/// not bytes: a reported line may hold anything).
pub fn short(line: &str) -> String {
    let mut parts = line.split_whitespace();
    let kind: String = parts.next().unwrap_or_default().chars().take(32).collect();
    let data = parts.next().unwrap_or_default();
    let tail: String = {
        let mut tail: Vec<char> = data.chars().rev().take(12).collect();
        tail.reverse();
        tail.into_iter().collect()
    };
    format!("{kind} …{tail}")
}

#[cfg(test)]
mod tests {
    use super::short;

    #[test]
    fn short_cuts_by_characters_whatever_the_line_holds() {
        assert_eq!(
            short("ecdsa-sha2-nistp384 AAAAabcdefghijkl node0"),
            "ecdsa-sha2-nistp384 …abcdefghijkl"
        );
        // Multibyte characters where a byte index would fall inside one.
        assert_eq!(short("k ééééééééééééé"), "k …éééééééééééé");
        assert_eq!(short("k 日本語のキー"), "k …日本語のキー");
        assert_eq!(short(""), " …");
        assert_eq!(short("only-a-type"), "only-a-type …");
    }
}

//! What a join does, decided without I/O from the bootstrap token, the stored record of the
//! name and what the agent asks for ([`decide`]): register a new cluster, bind a cluster an
//! admin created before its agent joined, refresh the registration of the same agent, or refuse.
//! The work channel's `Join` checks the request and the token first and carries the decision
//! out afterwards (counts the token's use, writes the store, issues the client certificate).

use std::collections::BTreeMap;

use super::store::{ClusterRecord, ClusterRegistration};
use super::tokens::{TokenError, TokenRecord};

/// What a joining agent asks to be registered as (checked before: name, key, sizes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Joining {
    /// The cluster name it joins as.
    pub name: String,
    /// `sha256:<hex>` of the key of its certificate request.
    pub key_fingerprint: String,
    /// What it asserts about itself: the labels it reported, then its claims (which win over a
    /// label of the same name). Recorded as claims only: labels are the admin's.
    pub claims: BTreeMap<String, String>,
    /// Its version.
    pub agent_version: String,
    /// Id of the bootstrap token it presented.
    pub token_id: String,
}

impl Joining {
    /// The registration this join makes, with the admin's `labels`, first joined at
    /// `created_unix`.
    fn registration(
        &self,
        created_unix: u64,
        labels: BTreeMap<String, String>,
    ) -> ClusterRegistration {
        ClusterRegistration {
            name: self.name.clone(),
            labels,
            claims: self.claims.clone(),
            key_fingerprint: self.key_fingerprint.clone(),
            previous_key_fingerprint: None,
            agent_version: self.agent_version.clone(),
            token_id: self.token_id.clone(),
            created_unix,
        }
    }
}

/// What a join that is not refused does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinDecision {
    /// A new cluster: the token's use is counted, then `registration` (the token's labels) is
    /// created, accepted at once when `auto_accepted`; otherwise it waits for an admin, and
    /// only while fewer clusters than the hub's limit already wait.
    Register {
        /// The record to create.
        registration: ClusterRegistration,
        /// Whether the token's labels match every `serve --auto-accept` label.
        auto_accepted: bool,
    },
    /// A cluster an admin created before its agent joined (no key yet), joined with a token
    /// bound to its name: the token's use is counted, then the record gets `registration` (the
    /// joining key; the token's labels under the admin's). Its acceptance stays the admin's.
    BindPreCreated {
        /// The registration to write over the pre-created one.
        registration: ClusterRegistration,
        /// Whether the admin accepted it (`hubAcceptsClient`).
        accepted: bool,
    },
    /// The same agent again (same key): its claims and version are refreshed, written only when
    /// they changed (`update`); its labels stay the admin's, so re-joining cannot move a cluster
    /// into another placement. The token's use is not counted.
    Rejoin {
        /// The refreshed registration, when it differs from the stored one.
        update: Option<ClusterRegistration>,
        /// Whether the cluster is accepted.
        accepted: bool,
    },
}

/// Why a join is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinRefusal {
    /// The token does not allow this join: it registered as many clusters as it may, or the
    /// name is a pre-created cluster the token is not bound to.
    Token(TokenError),
    /// The name is registered with another key.
    NameTaken,
}

/// What the join of `joining` with the (verified) `token` does, given the stored record of its
/// name (`existing`), the hub's `serve --auto-accept` labels (`auto_accept`; empty: never) and
/// the time (`now_unix`, the first join of a new cluster).
pub fn decide(
    token: &TokenRecord,
    existing: Option<&ClusterRecord>,
    joining: &Joining,
    auto_accept: &BTreeMap<String, String>,
    now_unix: u64,
) -> Result<JoinDecision, JoinRefusal> {
    match existing {
        None => {
            let auto_accepted = !auto_accept.is_empty()
                && auto_accept
                    .iter()
                    .all(|(k, v)| token.labels.get(k) == Some(v));
            if !token.has_uses_left() {
                return Err(JoinRefusal::Token(TokenError::UsedUp));
            }
            Ok(JoinDecision::Register {
                registration: joining.registration(now_unix, token.labels.clone()),
                auto_accepted,
            })
        }
        // Created by an admin before the agent joined (e.g. `kubectl apply` of a
        // ManagedCluster, possibly pre-accepted as in OCM): only a token bound to this name
        // binds it to the joining key; the admin's labels and hubAcceptsClient stand.
        Some(record) if record.registration.key_fingerprint.is_empty() => {
            if token.cluster_name.as_deref() != Some(joining.name.as_str()) {
                return Err(JoinRefusal::Token(TokenError::NotBoundToPreCreated(
                    joining.name.clone(),
                )));
            }
            let mut labels = token.labels.clone();
            labels.extend(record.registration.labels.clone());
            let created_unix = match record.registration.created_unix {
                0 => now_unix,
                t => t,
            };
            Ok(JoinDecision::BindPreCreated {
                registration: joining.registration(created_unix, labels),
                accepted: record.hub_accepts_client,
            })
        }
        Some(record) if record.registration.key_fingerprint != joining.key_fingerprint => {
            Err(JoinRefusal::NameTaken)
        }
        Some(record) => {
            let mut updated = record.registration.clone();
            updated.claims = joining.claims.clone();
            updated.agent_version = joining.agent_version.clone();
            Ok(JoinDecision::Rejoin {
                update: (updated != record.registration).then_some(updated),
                accepted: record.hub_accepts_client,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registration::store::ClusterStatus;

    const NOW: u64 = 1_700_000_000;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn token(labels: &[(&str, &str)]) -> TokenRecord {
        TokenRecord {
            id: "abcdef".into(),
            secret_sha256: String::new(),
            created_unix: NOW - 60,
            expires_unix: NOW + 3600,
            description: String::new(),
            cluster_name: None,
            labels: map(labels),
            max_uses: None,
            uses: 0,
        }
    }

    fn joining(key: &str) -> Joining {
        Joining {
            name: "spoke-1".into(),
            key_fingerprint: key.into(),
            claims: map(&[("region", "eu")]),
            agent_version: "1.2.0".into(),
            token_id: "abcdef".into(),
        }
    }

    fn record(key: &str, labels: &[(&str, &str)], accepted: bool) -> ClusterRecord {
        ClusterRecord {
            registration: ClusterRegistration {
                name: "spoke-1".into(),
                labels: map(labels),
                claims: map(&[("region", "eu")]),
                key_fingerprint: key.into(),
                previous_key_fingerprint: None,
                agent_version: "1.2.0".into(),
                token_id: "first1".into(),
                created_unix: NOW - 86_400,
            },
            hub_accepts_client: accepted,
            lease_duration: None,
            status: ClusterStatus::default(),
        }
    }

    #[test]
    fn a_new_cluster_gets_the_tokens_labels_and_is_auto_accepted_only_when_they_match() {
        // Invariant: a cluster's labels are the admin's (the token's), never what the agent
        // reports; auto-accept needs every configured label on the token, and an empty
        // configuration accepts nothing by itself.
        let t = token(&[("env", "prod"), ("team", "a")]);
        let j = joining("sha256:k1");
        let decided = decide(&t, None, &j, &BTreeMap::new(), NOW);
        let Ok(JoinDecision::Register {
            registration,
            auto_accepted,
        }) = decided
        else {
            panic!("{decided:?}");
        };
        assert!(!auto_accepted);
        assert_eq!(registration.labels, t.labels);
        assert_eq!(registration.claims, j.claims);
        assert_eq!(registration.key_fingerprint, "sha256:k1");
        assert_eq!(registration.token_id, "abcdef");
        assert_eq!(registration.created_unix, NOW);
        for (config, auto) in [
            (map(&[("env", "prod")]), true),
            (map(&[("env", "prod"), ("team", "a")]), true),
            (map(&[("env", "dev")]), false),
            (map(&[("env", "prod"), ("zone", "x")]), false),
        ] {
            let decided = decide(&t, None, &j, &config, NOW);
            assert!(
                matches!(decided, Ok(JoinDecision::Register { auto_accepted, .. }) if auto_accepted == auto),
                "{config:?}: {decided:?}"
            );
        }
    }

    #[test]
    fn a_used_up_token_registers_no_new_cluster_but_lets_the_same_agent_rejoin() {
        // Invariant: `--uses N` counts registrations; re-joins of a cluster already registered
        // with the same key do not count and are not refused.
        let mut t = token(&[]);
        t.max_uses = Some(1);
        t.uses = 1;
        let j = joining("sha256:k1");
        assert_eq!(
            decide(&t, None, &j, &BTreeMap::new(), NOW),
            Err(JoinRefusal::Token(TokenError::UsedUp))
        );
        let stored = record("sha256:k1", &[], true);
        assert_eq!(
            decide(&t, Some(&stored), &j, &BTreeMap::new(), NOW),
            Ok(JoinDecision::Rejoin {
                update: None,
                accepted: true
            })
        );
    }

    #[test]
    fn a_name_registered_with_another_key_is_refused_whatever_the_token() {
        // Invariant: a valid token cannot take over a registered cluster; only the admin frees
        // the name (`revoke --delete`).
        let mut t = token(&[]);
        t.cluster_name = Some("spoke-1".into());
        let stored = record("sha256:k1", &[], true);
        assert_eq!(
            decide(
                &t,
                Some(&stored),
                &joining("sha256:k2"),
                &BTreeMap::new(),
                NOW
            ),
            Err(JoinRefusal::NameTaken)
        );
    }

    #[test]
    fn a_pre_created_cluster_is_bound_only_by_a_token_bound_to_its_name() {
        // Invariant: a ManagedCluster an admin created (no key yet) is bound to the joining key
        // only with a token for its name; the admin's labels win over the token's, its
        // acceptance and first-join time stand (or the join's time when it had none).
        let j = joining("sha256:k1");
        let pre = record("", &[("env", "prod")], false);
        let unbound = token(&[("env", "dev"), ("team", "a")]);
        assert_eq!(
            decide(&unbound, Some(&pre), &j, &BTreeMap::new(), NOW),
            Err(JoinRefusal::Token(TokenError::NotBoundToPreCreated(
                "spoke-1".into()
            )))
        );
        let mut bound = unbound.clone();
        bound.cluster_name = Some("spoke-1".into());
        let decided = decide(&bound, Some(&pre), &j, &map(&[("team", "a")]), NOW);
        let Ok(JoinDecision::BindPreCreated {
            registration,
            accepted,
        }) = decided
        else {
            panic!("{decided:?}");
        };
        assert!(
            !accepted,
            "the admin's hubAcceptsClient stands, not auto-accept"
        );
        assert_eq!(registration.labels, map(&[("env", "prod"), ("team", "a")]));
        assert_eq!(registration.key_fingerprint, "sha256:k1");
        assert_eq!(registration.token_id, "abcdef");
        assert_eq!(registration.created_unix, NOW - 86_400);
        let mut accepted_pre = pre.clone();
        accepted_pre.hub_accepts_client = true;
        accepted_pre.registration.created_unix = 0;
        assert!(matches!(
            decide(&bound, Some(&accepted_pre), &j, &BTreeMap::new(), NOW),
            Ok(JoinDecision::BindPreCreated { registration, accepted: true })
                if registration.created_unix == NOW
        ));
    }

    #[test]
    fn a_rejoin_refreshes_claims_and_version_but_keeps_the_admins_labels() {
        // Invariant: re-joining cannot move a cluster into another placement (labels stay),
        // and writes only when the claims or the version changed.
        let stored = record("sha256:k1", &[("env", "prod")], false);
        let t = token(&[("env", "dev")]);
        let mut j = joining("sha256:k1");
        assert_eq!(
            decide(&t, Some(&stored), &j, &BTreeMap::new(), NOW),
            Ok(JoinDecision::Rejoin {
                update: None,
                accepted: false
            })
        );
        j.claims = map(&[("region", "us")]);
        j.agent_version = "1.3.0".into();
        let mut expected = stored.registration.clone();
        expected.claims = j.claims.clone();
        expected.agent_version = "1.3.0".into();
        assert_eq!(
            decide(&t, Some(&stored), &j, &BTreeMap::new(), NOW),
            Ok(JoinDecision::Rejoin {
                update: Some(expected),
                accepted: false
            })
        );
    }
}

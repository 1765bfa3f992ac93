use super::*;

#[test]
fn the_join_command_carries_the_server_name_only_when_known() {
    // Invariant: a known server name, cluster name, labels and claims all reach the agent's
    // flags; the token reaches it on standard input, never as an argument (`ps` shows those).
    let mut b = Bootstrap {
        hub: "h:1".into(),
        token: "abcdef.x".into(),
        ca_hash: "sha256:00".into(),
        ..Default::default()
    };
    assert_eq!(
        join_command(&b),
        "printf '%s\\n' 'abcdef.x' | flower-agent join --token-file - --hub h:1 --ca-hash \
         sha256:00 --cluster-name CLUSTER_NAME --state-dir /var/lib/flower-agent"
    );
    b.server_name = Some("flower-hub.ns.svc".into());
    b.cluster_name = "spoke-1".into();
    b.labels.insert("env".into(), "prod".into());
    b.claims.insert("region".into(), "eu".into());
    assert_eq!(
        join_command(&b),
        "printf '%s\\n' 'abcdef.x' | flower-agent join --token-file - --hub h:1 --ca-hash \
         sha256:00 --cluster-name spoke-1 --server-name flower-hub.ns.svc --label env=prod \
         --claim region=eu --state-dir /var/lib/flower-agent"
    );
}

#[test]
fn ttl_is_refused_above_the_maximum_and_on_overflow() {
    // Invariant: `--ttl` accepts up to 3650d and refuses longer or overflowing values with a
    // message naming the maximum, so no stored expiry is past what the hub can show.
    assert_eq!(parse_ttl("3650d"), Ok(tokens::MAX_TTL));
    assert_eq!(parse_ttl("24h"), Ok(Duration::from_secs(86400)));
    for too_long in [
        "3651d",
        "1000000000d",
        "999999999999999d",
        "18446744073709551615m",
    ] {
        let err = parse_ttl(too_long).expect_err(too_long);
        assert!(err.contains("at most 3650d"), "{too_long}: {err}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 20_000, failure_persistence: None, ..Default::default() })]

    /// Invariant: whatever an admin types as `--ttl`, the parser answers a lifetime within
    /// the token maximum or an error naming the fix, never a panic (the lifetime that overflowed
    /// once is among what it gets: long digit strings and every unit).
    #[test]
    fn any_ttl_text_is_a_bounded_lifetime_or_an_error(text in "[0-9]{0,25}[smhdx ]{0,2}|\\PC{0,12}") {
        match parse_ttl(&text) {
            Ok(ttl) => proptest::prop_assert!(ttl <= crate::registration::tokens::MAX_TTL),
            Err(message) => proptest::prop_assert!(message.contains("at most") || message.contains("--ttl"), "{message}"),
        }
    }
}

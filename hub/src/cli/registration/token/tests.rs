use super::*;

#[test]
fn the_join_command_carries_the_server_name_only_when_known() {
    // Invariant: the standalone join line is unchanged; a known server name, cluster name,
    // labels and claims all reach the agent's flags.
    let mut b = Bootstrap {
        hub: "h:1".into(),
        token: "abcdef.x".into(),
        ca_hash: "sha256:00".into(),
        ..Default::default()
    };
    assert_eq!(
        join_command(&b),
        "flower-agent join --hub h:1 --token abcdef.x --ca-hash sha256:00 --cluster-name \
         CLUSTER_NAME --state-dir /var/lib/flower-agent"
    );
    b.server_name = Some("flower-hub.ns.svc".into());
    b.cluster_name = "spoke-1".into();
    b.labels.insert("env".into(), "prod".into());
    b.claims.insert("region".into(), "eu".into());
    assert_eq!(
        join_command(&b),
        "flower-agent join --hub h:1 --token abcdef.x --ca-hash sha256:00 --cluster-name \
         spoke-1 --server-name flower-hub.ns.svc --label env=prod --claim region=eu \
         --state-dir /var/lib/flower-agent"
    );
}

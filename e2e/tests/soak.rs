//! The flapping soak's short variant (the suite's; the 10-minute, 1,000-agent soak is
//! `target/release/channel_bench --store kube --flap 600`): 100 simulated agents on a real
//! kube-apiserver each drop and re-open their work stream at random for a minute while the
//! Federation's replicas and the Placement's `numberOfClusters` change; then every agent must
//! hold exactly the core's current work, the hub every stream, its RSS and descriptors flat over
//! the last half, and apiserver writes ≤ 20/s. `channel_bench` prints the figures and fails,
//! naming each broken invariant, when one does not hold.

use std::process::Command;

#[test]
fn a_hundred_flapping_agents_end_with_exactly_their_work() {
    let bench = env!("CARGO_BIN_EXE_channel_bench");
    let status = Command::new(bench)
        .args([
            "--store",
            "kube",
            "--flap",
            "60",
            "--agents",
            "100",
            "--flap-hold-max",
            "20",
            "--flap-change-every",
            "5",
            "--batch",
            "100",
        ])
        .status()
        .expect("start channel_bench");
    assert!(
        status.success(),
        "channel_bench --flap 60 --agents 100 failed ({status}): its output above names the broken invariant"
    );
}

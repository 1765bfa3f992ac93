use super::*;

#[test]
fn new_lines_follow_a_sliding_tail() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(new_lines(&[], &s(&["a", "b"])), s(&["a", "b"]));
    assert_eq!(new_lines(&s(&["a", "b"]), &s(&["a", "b", "c"])), s(&["c"]));
    assert_eq!(
        new_lines(&s(&["a", "b", "c"]), &s(&["b", "c", "d"])),
        s(&["d"])
    );
    assert_eq!(
        new_lines(&s(&["a", "b"]), &s(&["a", "b"])),
        Vec::<String>::new()
    );
    assert_eq!(new_lines(&s(&["x"]), &s(&["y"])), s(&["y"]));
}

#[test]
fn run_names_are_dns_labels() {
    assert_eq!(dns_part("FedAvg_App"), "fedavg-app");
    assert_eq!(dns_part("--"), "run");
}

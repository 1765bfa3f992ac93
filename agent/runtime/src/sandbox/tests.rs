use super::*;

#[test]
fn a_uid_per_directory_in_its_range_and_the_same_every_time() {
    let a = confined_uid(Path::new("/state/federations/team/a"));
    let b = confined_uid(Path::new("/state/federations/team/b"));
    assert_ne!(a, b);
    assert_eq!(a, confined_uid(Path::new("/state/federations/team/a")));
    for uid in [a, b] {
        assert!((FIRST_CONFINED_UID..FIRST_CONFINED_UID + CONFINED_UIDS).contains(&uid));
    }
}

#[test]
fn a_script_reaches_its_environment_and_the_installation_it_was_made_from() {
    let dir = tempfile::tempdir().unwrap();
    let python = dir.path().join("python/3.11/bin");
    let venv = dir.path().join("venv");
    std::fs::create_dir_all(&python).unwrap();
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::fs::write(python.join("python3.11"), "").unwrap();
    std::os::unix::fs::symlink(python.join("python3.11"), venv.join("bin/python")).unwrap();
    std::fs::write(
        venv.join("pyvenv.cfg"),
        format!("home = {}\nversion = 3.11\n", python.display()),
    )
    .unwrap();
    let script = venv.join("bin/flower-supernode");
    std::fs::write(
        &script,
        format!("#!{}/bin/python\nimport flwr\n", venv.display()),
    )
    .unwrap();
    let reach = reach_for(&script);
    assert!(reach.contains(&venv), "{reach:?}");
    assert!(reach.contains(&dir.path().join("python/3.11")), "{reach:?}");
}

#[test]
fn the_first_directory_a_uid_cannot_pass_is_found() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let closed = dir.path().join("closed");
    let inner = closed.join("open/venv");
    std::fs::create_dir_all(&inner).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let uid = FIRST_CONFINED_UID;
    let blocked = blocked_ancestor(&inner, uid);
    // Unless the temporary directory's own ancestors block already.
    let expected = blocked_ancestor(dir.path(), uid).unwrap_or(closed.clone());
    assert_eq!(blocked, Some(expected));
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o711)).unwrap();
    assert_eq!(
        blocked_ancestor(&inner, uid),
        blocked_ancestor(dir.path(), uid)
    );
}

use super::*;

fn parse(argv: &[&str]) -> Args {
    Args::try_parse_from(std::iter::once("dipamd").chain(argv.iter().copied()))
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

#[test]
fn a_repeated_flag_takes_its_last_value() {
    // The systemd unit's flags first, then the operator's DIPAMD_OPTS.
    let a = parse(&[
        "--socket",
        "/run/dipam/dipam.sock",
        "--state-dir",
        "/var/lib/dipam",
        "--log-format",
        "text",
        "--gc-allow-empty",
        "--socket",
        "/srv/dipam.sock",
        "--state-dir",
        "/srv/dipam",
        "--log-format",
        "json",
        "--gc-allow-empty",
    ]);
    assert_eq!(a.socket, PathBuf::from("/srv/dipam.sock"));
    assert_eq!(a.state_dir, PathBuf::from("/srv/dipam"));
    assert_eq!(a.log_format, LogFormat::Json);
    assert!(a.gc_allow_empty);
}

#[test]
fn repeatable_flags_still_add_up() {
    let a = parse(&[
        "--allow-uid",
        "1000",
        "--allow-uid",
        "1001",
        "--agent-roles",
        "router",
        "--agent-roles",
        "health,ingress",
    ]);
    assert_eq!(a.allow_uids, [1000, 1001]);
    assert_eq!(a.agent_roles, ["router", "health", "ingress"]);
}

#[test]
fn conflicting_flags_are_still_refused() {
    let e = Args::try_parse_from([
        "dipamd",
        "--conflist",
        "/etc/cni/net.d/a.conflist",
        "--conf-dir",
        "/etc/cni/net.d",
        "--network",
        "n",
    ])
    .unwrap_err();
    assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict, "{e}");
}

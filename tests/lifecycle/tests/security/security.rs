//! F20: only root (or an allowed uid) may use dipamd. With --socket-group the socket is 0660
//! for that group, yet a non-root member is still refused by the SO_PEERCRED check: its
//! connection is closed at accept, before any HTTP/2 (a flood of such connections must not
//! cost dipamd anything, hostile.rs), with a log line; --allow-uid admits it.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use dipam_lifecycle::{
    Attachment, Dipamd, bins,
    nobody::{self, NOBODY},
    require_root,
};

fn open_dir(d: &Dipamd) {
    // The guard's temp dir is 0700; let nobody reach the socket so the socket's own mode and
    // the peer check are what is tested.
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn non_root_peers_are_refused_unless_allowed() {
    require_root!();
    let d = Dipamd::start_with(&["--socket-group", NOBODY]);
    open_dir(&d);
    let meta = std::fs::metadata(d.socket()).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), 65534);

    let sock = d.socket().display().to_string();
    let ctl = bins::bin("dipamctl").display().to_string();
    let out = nobody::run(&[&ctl, "--socket", &sock, "status"], &[], "");
    assert!(!out.status.success());
    assert!(
        d.log().contains("connection dropped at accept"),
        "{}",
        d.log()
    );

    // The plugin as a non-root caller fails, and nothing is allocated.
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"sec","type":"ptp","ipam":{{"type":"dipam","socketPath":"{sock}","delegate":{{"type":"host-local","dataDir":"/nonexistent","ranges":[[{{"subnet":"10.77.0.0/24"}}]]}}}}}}"#
    );
    let att = Attachment::new("c1", "/var/run/netns/none");
    let dipam = bins::bin("dipam").display().to_string();
    let out = nobody::run(
        &[&dipam],
        &[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", &att.container_id),
            ("CNI_NETNS", &att.netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/usr/lib/cni"),
        ],
        &conf,
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Told why (dipamd's answer at accept), not 11 "transport error" (hostile.rs has the rest).
    assert_eq!(v["code"], 155, "{v}");
    eprintln!("a refused peer's plugin answer: {v}");
    assert!(d.ledger().is_empty());

    // Allowed explicitly: served (its own attachments; status is for --admin-uid, non_root.rs).
    let allowed = Dipamd::start_with(&nobody::ALLOWED);
    open_dir(&allowed);
    let sock = allowed.socket().display().to_string();
    let out = nobody::run(&[&ctl, "--socket", &sock, "attachments"], &[], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

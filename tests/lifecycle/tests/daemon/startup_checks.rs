//! Paths that would fail an operator later are said at start: a ledger on tmpfs, a socket in a
//! world-writable directory. dipamd starts with a WARN in its log and is not ready, with the
//! reason, in `dipamctl status` and in gRPC health, until the flag that accepts the risk is
//! given (shim-server/src/l7_daemon/startup_checks.rs). dipamd runs under the shipped unit's capability
//! set, as an operator's would.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{os::unix::fs::PermissionsExt, path::Path, process::Command};

use dipam_lifecycle::{Dipamd, require_root, shapes::shipped_unit_setpriv};
use serde_json::Value;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

fn status(d: &Dipamd) -> Value {
    serde_json::from_slice(&d.ctl(&["status", "--json"]).stdout).unwrap()
}

fn health(socket: &Path) -> i32 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ch = dipam_proto::connect(socket).await.unwrap();
        HealthClient::new(ch)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .status
    })
}

/// Not ready for exactly one reason containing `words`, warned about in the log; then, with
/// `flag`, ready, the log still naming the risk.
#[track_caller]
fn not_ready_until_accepted(d: &mut Dipamd, extra: &[&str], words: &[&str], flag: &str) {
    let s = status(d);
    assert_eq!(s["ready"], false, "{s}");
    let reasons: Vec<&str> = s["notReady"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(reasons.len(), 1, "{s}");
    for w in words.iter().chain([&flag]) {
        assert!(reasons[0].contains(w), "{w:?} in {reasons:?}");
    }
    assert_eq!(health(&d.socket()), ServingStatus::NotServing as i32);
    let log = d.log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(words[0])),
        "a WARN line: {log}"
    );

    let mut flags = extra.to_vec();
    flags.push(flag);
    d.set_flags(&flags);
    d.restart();
    let s = status(d);
    assert_eq!(s["ready"], true, "{flag} accepts it: {s}");
    assert_eq!(health(&d.socket()), ServingStatus::Serving as i32);
}

#[test]
fn a_ledger_on_tmpfs_is_not_ready_until_accepted() {
    require_root!();
    let mut d = Dipamd::unstarted(&[]);
    let state = d.dir.path().join("tmpfs-state");
    std::fs::create_dir(&state).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs"])
        .arg(&state)
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs");
    // Unmounted however the test ends.
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(state.clone());
    let state_s = state.display().to_string();
    // A flag given twice takes its last value: this --state-dir beats the harness's.
    let extra = ["--state-dir", state_s.as_str()];
    d.set_flags(&extra);
    d.run_under(&shipped_unit_setpriv());
    d.start_again();
    not_ready_until_accepted(
        &mut d,
        &extra,
        &["is on tmpfs", "a reboot empties the ledger"],
        "--allow-volatile-state",
    );
    d.terminate();
}

#[test]
fn a_socket_in_a_world_writable_directory_is_not_ready_until_accepted() {
    require_root!();
    let mut d = Dipamd::unstarted(&[]);
    // The socket's directory, as /tmp is: anyone may write, sticky.
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    d.run_under(&shipped_unit_setpriv());
    d.start_again();
    not_ready_until_accepted(
        &mut d,
        &[],
        &["which any user may write", "mode 1777", "code 11"],
        "--allow-shared-socket-dir",
    );
    // Back to a directory only root writes: ready without the flag.
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    d.set_flags(&[]);
    d.restart();
    assert_eq!(status(&d)["ready"], true);
}

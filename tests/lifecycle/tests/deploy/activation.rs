//! Socket activation: dipamd serves on a socket passed by systemd (LISTEN_FDS), here through
//! systemd-socket-activate, the same protocol dipamd.socket uses; the first client waits in
//! the backlog while dipamd starts, and dipamd never unlinks a socket it did not create.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};

use dipam_lifecycle::{bins, require, require_root};

#[test]
fn dipamd_serves_a_socket_passed_by_systemd() {
    require_root!();
    let activate = require!(require::tool(
        "systemd-socket-activate",
        "tests/deps.sh installs systemd"
    ));
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("dipam.sock");
    let log = std::fs::File::create(dir.path().join("dipamd.log")).unwrap();
    let mut holder = Command::new(activate)
        .arg("-l")
        .arg(&sock)
        .arg(bins::bin("dipamd"))
        .arg("--socket")
        .arg(&sock)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--cni-path", "/usr/lib/cni"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    // systemd-socket-activate binds at once; dipamd starts on the first connection.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !sock.exists() {
        assert!(std::time::Instant::now() < deadline, "no socket");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = Command::new(bins::bin("dipamctl"))
        .arg("--socket")
        .arg(&sock)
        .args(["status", "--ready"])
        .output()
        .unwrap();
    let log = || std::fs::read_to_string(dir.path().join("dipamd.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        log()
    );
    assert!(log().contains("socket activation"), "{}", log());
    let _ = holder.kill();
    let _ = holder.wait();
    let _ = Command::new("pkill")
        .arg("-f")
        .arg(format!("dipamd --socket {}", sock.display()))
        .status();
}

//! dipamd's process lifecycle: down, restarted, killed, refused; the plugin's behaviour
//! around it; and that nothing is leaked on the way.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::process::Stdio;

use dipam_lifecycle::{Lab, daemon::socket_gone, require_root, runtime::result_ips};

/// With dipamd down, ADD fails with code 11 (try again later), the details name the socket
/// and the fix, and the delegate holds nothing.
#[test]
fn daemon_down_add_is_11_and_nothing_leaks() {
    require_root!();
    // dipamd stays down: each call fails once the plugin's wait for it ends.
    let mut lab = Lab::new("ptp-dipam-host-local.conflist").with_plugin_timeout(2);
    lab.dipamd.kill9();
    let (ns, att) = lab.pod();
    let e = lab.rt.add(lab.list(), &att).unwrap_err();
    assert_eq!(e.code, 11, "{e}");
    assert!(
        e.details
            .contains(&lab.dipamd.socket().display().to_string()),
        "{e}"
    );
    assert!(e.details.contains("dipamd"), "{e}");
    assert!(lab.delegate_store().is_empty());
    // ptp left no interface behind either.
    let links = ns.exec(&["ip", "-o", "link"]);
    assert!(!String::from_utf8_lossy(&links.stdout).contains("eth0"));

    // Direct IPAM calls: CHECK 11, STATUS 50.
    let result = serde_json::json!({"cniVersion":"1.0.0","ips":[{"address":"10.77.0.2/24"}]});
    let e = lab
        .rt
        .ipam(lab.list(), 0, "CHECK", &att, Some(&result))
        .unwrap_err();
    assert_eq!(e.code, 11, "{e}");
    let lab = lab.with_version("1.1.0");
    let e = lab
        .rt
        .ipam(lab.list(), 0, "STATUS", &att, None)
        .unwrap_err();
    assert_eq!(e.code, 50, "{e}");
}

/// A pod added before dipamd restarts is released by a DEL after the restart: the ledger is on
/// disk. Both a clean stop (SIGTERM) and a SIGKILL.
#[test]
fn restart_between_add_and_del_still_releases() {
    require_root!();
    let mut lab = Lab::new("ptp-dipam-host-local.conflist");
    let (_a, pod_a) = lab.pod();
    let (_b, pod_b) = lab.pod();
    lab.rt
        .add(lab.list(), &pod_a)
        .unwrap_or_else(|e| panic!("{e}"));
    lab.rt
        .add(lab.list(), &pod_b)
        .unwrap_or_else(|e| panic!("{e}"));

    assert!(lab.dipamd.terminate().success());
    lab.dipamd.start_again();
    lab.assert_agree();
    lab.rt
        .check(lab.list(), &pod_a)
        .unwrap_or_else(|e| panic!("CHECK after restart: {e}"));
    lab.rt
        .del(lab.list(), &pod_a)
        .unwrap_or_else(|e| panic!("{e}"));
    lab.assert_agree();

    lab.dipamd.restart(); // SIGKILL, then start
    lab.assert_agree();
    lab.rt
        .del(lab.list(), &pod_b)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(lab.delegate_store().is_empty());
    lab.assert_agree();
}

/// The same against the real azure-vnet-ipam, which needs dipamd to remember the subnet
/// across the restart to release at all.
#[test]
fn restart_between_add_and_del_azure() {
    require_root!();
    let mut lab = Lab::new("ptp-dipam-azure.conflist");
    let (_ns, att) = lab.pod();
    let r = lab
        .rt
        .add(lab.list(), &att)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        lab.delegate_store(),
        vec![(att.container_id.clone(), result_ips(&r)[0].clone())]
    );
    lab.dipamd.restart();
    lab.rt
        .del(lab.list(), &att)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(lab.delegate_store().is_empty());
    lab.assert_agree();
}

/// SIGTERM shuts down gracefully and unlinks the socket; a stale socket left by SIGKILL is
/// replaced at the next start; the socket is root-only.
#[test]
fn socket_hygiene() {
    require_root!();
    use std::os::unix::fs::PermissionsExt;
    let mut lab = Lab::new("ptp-dipam-host-local.conflist");
    let sock = lab.dipamd.socket();
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(lab.dipamd.terminate().success());
    assert!(socket_gone(&sock), "socket left behind after SIGTERM");
    lab.dipamd.start_again();
    lab.dipamd.kill9();
    assert!(
        sock.exists(),
        "SIGKILL cannot unlink; the next start must cope"
    );
    lab.dipamd.start_again();
    dipam_lifecycle::cmd::ok_named("dipamctl status", &lab.dipamd.ctl(&["status"]));
}

/// Only one dipamd per state directory: a second one exits with a message naming the
/// directory, and the first keeps serving.
#[test]
fn second_daemon_on_the_same_state_dir_is_refused() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let second = lab
        .dipamd
        .command()
        .stdout(Stdio::null())
        .output()
        .expect("run a second dipamd");
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains(&lab.dipamd.state_dir().display().to_string())
            && stderr.contains("another dipamd"),
        "{stderr}"
    );
    assert!(lab.dipamd.ctl(&["status"]).status.success());
}

/// dipamctl shows the ledger as a table and as JSON, and status says ready.
#[test]
fn dipamctl_shows_the_ledger() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let (_ns, att) = lab.pod();
    let r = lab.rt.add(lab.list(), &att).unwrap();
    let ip = result_ips(&r).remove(0);
    let table = lab.dipamd.ctl(&["attachments"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("NETWORK") && text.contains(&ip) && text.contains("committed"),
        "{text}"
    );
    let status = lab.dipamd.ctl(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["ready"], true);
    assert_eq!(v["attachments"], 1);
    assert_eq!(v["delegates"][0]["type"], "host-local");
    let net = lab.network();
    let filtered = lab
        .dipamd
        .ctl(&["attachments", "--json", "--network", "no-such-net"]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&filtered.stdout).unwrap(),
        serde_json::json!([])
    );
    let mine = lab
        .dipamd
        .ctl(&["attachments", "--json", "--network", &net, "--owner", "pod"]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&mine.stdout)
            .unwrap()
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    lab.rt.del(lab.list(), &att).unwrap();
}

/// dipamctl against a dead socket says what to check, and exits non-zero.
#[test]
fn dipamctl_without_daemon_explains() {
    require_root!();
    let mut lab = Lab::new("ptp-dipam-host-local.conflist");
    lab.dipamd.kill9();
    let out = lab.dipamd.ctl(&["status"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is dipamd running"), "{err}");
}

/// F1: dipamd is SIGKILLed while the delegate is running an ADD (after the intent was
/// recorded, before the result is committed), and restarted at once, while the orphaned
/// delegate is still running. The new dipamd waits for it to finish before replaying, so its
/// reservation is released instead of appearing after the replay, held by nobody.
#[test]
fn killed_mid_add_is_released_at_the_next_start() {
    require_root!();
    use std::os::unix::fs::PermissionsExt;
    let mut lab = Lab::new("ptp-dipam-host-local.conflist").with_plugin_timeout(2);
    let wrappers = tempfile::tempdir().unwrap();
    let slow = wrappers.path().join("slow-host-local");
    // Slow only for ADD, so the VERSION probe is quick and the kill lands during the ADD.
    std::fs::write(
        &slow,
        "#!/bin/sh\n[ \"$CNI_COMMAND\" = ADD ] && sleep 1\nexec /usr/lib/cni/host-local \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    lab.fx.list["plugins"][0]["ipam"]["delegate"]["type"] = "slow-host-local".into();
    let rt =
        dipam_lifecycle::Runtime::new(format!("{}:{}", wrappers.path().display(), lab.rt.cni_path));

    let (_ns, att) = lab.pod();
    let list = lab.list().clone();
    let add = std::thread::spawn({
        let att = att.clone();
        move || rt.ipam(&list, 0, "ADD", &att, None)
    });
    // The intent is durable within milliseconds; the delegate sleeps for a second.
    std::thread::sleep(std::time::Duration::from_millis(400));
    lab.dipamd.kill9();
    let e = add.join().unwrap().unwrap_err();
    assert_eq!(e.code, 11, "the runtime sees a retryable failure: {e}");
    lab.dipamd.start_again();
    // Had dipamd not waited, the orphan would reserve its address about now.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(lab.delegate_store().is_empty(), "{}", lab.dipamd.log());
    lab.assert_agree();
    assert!(
        lab.dipamd
            .log()
            .contains("replayed an interrupted operation")
    );
}

/// F3: a DEL while dipamd is down is not lost. The plugin spools it durably and reports
/// success (the runtime may never retry); dipamd replays it before serving the next ADD.
#[test]
fn del_while_daemon_down_is_spooled_and_replayed() {
    require_root!();
    for conflist in ["ptp-dipam-host-local.conflist", "ptp-dipam-azure.conflist"] {
        let mut lab = Lab::new(conflist);
        let (_a, a) = lab.pod();
        let (_b, b) = lab.pod();
        let ra = lab.rt.ipam(lab.list(), 0, "ADD", &a, None).unwrap();
        lab.rt.ipam(lab.list(), 0, "ADD", &b, None).unwrap();
        lab.dipamd.kill9();
        lab.rt
            .ipam(lab.list(), 0, "DEL", &a, Some(&ra))
            .unwrap_or_else(|e| panic!("{conflist}: DEL with dipamd down must succeed: {e}"));
        assert_eq!(lab.spooled(), 1);
        assert_eq!(lab.delegate_store().len(), 2, "nothing released yet");
        lab.dipamd.start_again();
        assert_eq!(lab.spooled(), 0, "{}", lab.dipamd.log());
        assert_eq!(
            lab.delegate_store().len(),
            1,
            "{conflist}: the spooled DEL was not replayed"
        );
        lab.assert_agree();
        assert!(lab.dipamd.log().contains("spooled DEL replayed"));
    }
}

/// F4: operations on one attachment arriving out of order. A DEL issued before the current
/// ADD (replayed late) does not release it; an ADD issued before an already-processed DEL
/// does not bring it back.
#[test]
fn stale_operations_cannot_undo_newer_ones() {
    require_root!();
    let mut lab = Lab::new("ptp-dipam-host-local.conflist");
    let (_ns, pod) = lab.pod();
    let r = lab.rt.ipam(lab.list(), 0, "ADD", &pod, None).unwrap();
    // A DEL that was spooled long ago (issued before this ADD), replayed at the next start.
    lab.dipamd.kill9();
    let spool = lab.dipamd.state_dir().join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let conf = dipam_lifecycle::Runtime::plugin_config(lab.list(), 0, Some(&r));
    // Stamped on the boot clock (what dipamd orders by) at the boot's first nanosecond.
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let stale = serde_json::json!({
        "format": 1, "requestId": "stale", "issuedAtMs": 1, "command": "DEL",
        "issuedAt": {"bootId": boot_id.trim(), "ns": 1},
        "containerId": pod.container_id, "netns": "", "ifname": pod.ifname,
        "cniArgs": "", "cniPath": "", "mode": 1, "stdin": conf.to_string(),
    });
    std::fs::write(
        spool.join("0000000000000001-1-stale.json"),
        stale.to_string(),
    )
    .unwrap();
    lab.dipamd.start_again();
    assert_eq!(lab.spooled(), 0);
    assert_eq!(
        lab.delegate_store().len(),
        1,
        "a stale DEL released a newer attachment"
    );
    assert!(
        lab.dipamd
            .log()
            .contains("DEL issued before the ADD of the current attachment")
    );
    lab.assert_agree();
}

//! F3 in the shape nodes run it (issue: a spooled DEL must reach the dipamd that owns the
//! attachment). dipamd runs with a non-default `--state-dir` and the conflist has no
//! `spoolDir`, as none of conflist/ has: the plugin must find the spool dipamd published
//! beside its socket. A DEL that cannot be spooled where dipamd reads fails with 11 and the
//! address stays accounted for. Spool files are trusted only by the spool rule (root's
//! regular files, not writable by others, no links), and doctor reports what it refused.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{os::unix::fs::PermissionsExt, path::Path, process::Stdio};

use dipam_lifecycle::{Lab, bins, cmd, daemon::recover, require_root};
use serde_json::Value;

const CONFLIST: &str = "ptp-dipam-host-local.conflist";

fn status(lab: &Lab) -> Value {
    cmd::json(&lab.dipamd.ctl(&["status", "--json"]))
}

/// doctor's check `name`: (ok, detail and fix).
fn doctor(lab: &Lab, name: &str) -> (bool, String) {
    let c = lab.dipamd.doctor_check(name);
    (c["ok"] == true, format!("{} / {}", c["detail"], c["fix"]))
}

fn spool_dir(lab: &Lab) -> std::path::PathBuf {
    lab.dipamd.state_dir().join("spool")
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The issue's case: non-default state directory, no spoolDir, DEL while dipamd is SIGKILLed,
/// then a restart. The address is released and the ledger and host-local agree; nothing went
/// to the plugin's old default spool.
#[test]
fn del_while_dipamd_is_down_reaches_a_non_default_state_dir_without_spool_dir() {
    require_root!();
    let mut lab = Lab::new(CONFLIST);
    assert_ne!(lab.dipamd.state_dir(), Path::new("/var/lib/dipam"));
    assert!(
        !lab.list().to_string().contains("spoolDir"),
        "the conflist must not name the spool"
    );
    let old_default = Path::new("/var/lib/dipam/spool");
    let before = files(old_default);

    let (_a, a) = lab.pod();
    let (_b, b) = lab.pod();
    let ra = lab.rt.ipam(lab.list(), 0, "ADD", &a, None).unwrap();
    lab.rt.ipam(lab.list(), 0, "ADD", &b, None).unwrap();
    lab.dipamd.kill9();
    let del = lab.rt.ipam(lab.list(), 0, "DEL", &a, Some(&ra));
    assert!(del.is_ok(), "DEL with dipamd down: {del:?}");
    assert_eq!(lab.spooled(), 1, "spooled into dipamd's own spool");
    assert_eq!(
        files(old_default),
        before,
        "nothing went to the old default spool"
    );
    assert_eq!(lab.delegate_store().len(), 2, "nothing released yet");
    // The spool file is root's, 0600, in a 0700 directory.
    let spool = spool_dir(&lab);
    let name = files(&spool)
        .into_iter()
        .find(|n| n.ends_with(".json"))
        .unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&spool.join(&name)), 0o600);
    assert_eq!(mode(&spool), 0o700);

    lab.dipamd.start_again();
    assert_eq!(lab.spooled(), 0, "{}", lab.dipamd.log());
    assert_eq!(
        lab.delegate_store().len(),
        1,
        "the spooled DEL was not replayed"
    );
    lab.assert_agree();
    let s = status(&lab);
    assert_eq!(s["spool"]["dir"], spool.display().to_string(), "{s}");
    assert_eq!(s["spool"]["depth"], 0, "{s}");
    assert!(
        s["spool"]["pointer"]
            .as_str()
            .unwrap()
            .ends_with("dipamd.sock.spool"),
        "{s}"
    );
    let (ok, text) = doctor(&lab, "DEL spool published");
    assert!(ok && text.contains(&spool.display().to_string()), "{text}");
    assert!(doctor(&lab, "DEL spool is private").0);
}

/// A DEL that cannot be spooled anywhere dipamd reads fails with 11; the address stays held
/// and recorded, and the runtime's retry after dipamd is back releases it. A conflist
/// spoolDir naming another directory cannot divert a DEL: it goes to dipamd's spool, and
/// doctor, status and metrics report the mismatch.
#[test]
fn a_del_that_cannot_be_spooled_fails_with_11_and_a_stray_spool_dir_cannot_divert_one() {
    require_root!();
    // A DEL the spool cannot take waits for dipamd: 2 s here, as it stays down.
    let mut lab = Lab::new(CONFLIST).with_plugin_timeout(2);
    let (_a, a) = lab.pod();
    let ra = lab.rt.ipam(lab.list(), 0, "ADD", &a, None).unwrap();
    lab.dipamd.kill9();
    // As after a reboot, before dipamd first starts: no spool is published.
    let pointer = lab.dipamd.dir.path().join("dipamd.sock.spool");
    std::fs::remove_file(&pointer).unwrap();
    let e = lab
        .rt
        .ipam(lab.list(), 0, "DEL", &a, Some(&ra))
        .unwrap_err();
    assert_eq!(e.code, 11, "{e}");
    assert!(e.details.contains("no dipamd has published a spool"), "{e}");
    assert_eq!(lab.spooled(), 0);
    // A spool directory that fails the rule is refused by the plugin too.
    lab.dipamd.start_again();
    assert_eq!(lab.ledger().len(), 1, "the address is still accounted for");
    lab.assert_agree();
    lab.dipamd.kill9();
    let spool = spool_dir(&lab);
    std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = lab
        .rt
        .ipam(lab.list(), 0, "DEL", &a, Some(&ra))
        .unwrap_err();
    assert_eq!(e.code, 11, "{e}");
    assert!(e.details.contains("writable by group or others"), "{e}");
    lab.dipamd.start_again();
    let (ok, text) = doctor(&lab, "DEL spool meets the spool rule");
    assert!(!ok && text.contains("0777"), "{text}");
    assert!(!doctor(&lab, "DEL spool is private").0);
    std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o700)).unwrap();
    // The runtime's retry, dipamd serving: released.
    lab.rt.ipam(lab.list(), 0, "DEL", &a, Some(&ra)).unwrap();
    assert!(lab.delegate_store().is_empty());
    lab.assert_agree();

    // A conflist that still names a spoolDir, another directory than dipamd's.
    let stray = tempfile::tempdir().unwrap();
    let mut lab = lab.with_spool_dir_key(stray.path());
    let (_b, b) = lab.pod();
    let rb = lab.rt.ipam(lab.list(), 0, "ADD", &b, None).unwrap();
    let s = status(&lab);
    assert_eq!(s["spool"]["mismatched"].as_array().unwrap().len(), 1, "{s}");
    let (ok, text) = doctor(&lab, "network configs name no other spool");
    assert!(!ok && text.contains("remove spoolDir"), "{text}");
    lab.dipamd.kill9();
    lab.rt.ipam(lab.list(), 0, "DEL", &b, Some(&rb)).unwrap();
    assert!(
        files(stray.path()).is_empty(),
        "the stray spoolDir was used"
    );
    assert_eq!(lab.spooled(), 1);
    lab.dipamd.start_again();
    assert_eq!(lab.spooled(), 0);
    assert!(lab.delegate_store().is_empty());
    lab.assert_agree();
}

/// The spool trust rule (docs/cfp.md §7.8, F3b): a symlinked spool file, a spool file not owned by root and a symlink at the
/// quarantine are not replayed and nothing is followed; doctor reports the quarantine. The
/// plugin's own DEL beside them is replayed.
#[test]
fn spool_files_failing_the_rule_are_quarantined_and_nothing_is_followed() {
    require_root!();
    let mut lab = Lab::new(CONFLIST);
    let pods: Vec<_> = (0..3).map(|_| lab.pod()).collect();
    let results: Vec<Value> = pods
        .iter()
        .map(|(_, p)| lab.rt.ipam(lab.list(), 0, "ADD", p, None).unwrap())
        .collect();
    lab.dipamd.kill9();
    // Pod 0: the plugin's DEL, spooled.
    lab.rt
        .ipam(lab.list(), 0, "DEL", &pods[0].1, Some(&results[0]))
        .unwrap();
    let spool = spool_dir(&lab);
    let real = files(&spool)
        .into_iter()
        .find(|n| n.ends_with(".json"))
        .unwrap();
    let body = |i: usize| {
        std::fs::read_to_string(spool.join(&real))
            .unwrap()
            .replace(&pods[0].1.container_id, &pods[i].1.container_id)
    };
    // Pod 1: a well-formed DEL reached through a symlink.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("del.json"), body(1)).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("del.json"),
        spool.join("0000000000000002-1-link.json"),
    )
    .unwrap();
    // Pod 2: a well-formed DEL owned by nobody.
    let foreign = spool.join("0000000000000003-1-nobody.json");
    std::fs::write(&foreign, body(2)).unwrap();
    std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
    // The quarantine: a link to a directory root must never write into.
    let trap = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(trap.path(), spool.join("failed")).unwrap();

    lab.dipamd.start_again();
    let held: Vec<String> = lab.ledger().into_iter().map(|(id, _)| id).collect();
    let mut want = vec![
        pods[1].1.container_id.clone(),
        pods[2].1.container_id.clone(),
    ];
    want.sort();
    assert_eq!(held, want, "only the plugin's own DEL was replayed");
    lab.assert_agree();
    assert!(
        files(trap.path()).is_empty(),
        "the quarantine link was followed"
    );
    assert!(outside.path().join("del.json").exists());
    let failed = spool.join("failed");
    assert!(std::fs::symlink_metadata(&failed).unwrap().is_dir());
    assert_eq!(
        files(&failed),
        [
            "0000000000000002-1-link.json",
            "0000000000000003-1-nobody.json"
        ]
    );
    assert!(
        files(&spool)
            .iter()
            .any(|n| n.starts_with(".untrusted-failed-")),
        "the link at failed/ is kept aside for the operator"
    );
    let s = status(&lab);
    assert_eq!(s["spool"]["quarantined"], 2, "{s}");
    let (ok, text) = doctor(&lab, "DEL spool quarantine");
    assert!(!ok && text.contains("2 file(s)"), "{text}");
    for (i, (_, p)) in pods.iter().enumerate().skip(1) {
        lab.rt
            .ipam(lab.list(), 0, "DEL", p, Some(&results[i]))
            .unwrap();
    }
    lab.assert_agree();
    assert!(lab.delegate_store().is_empty());
}

/// "Start fresh" (docs/cfp.md F3c): a ledger replaced by an empty one (everything but the spool moved
/// aside) must not turn a spooled DEL into a silent no-op: its key is unknown to the new
/// ledger, but the delegate still holds the address, so the delegate's DEL runs. And
/// `dipamctl recover`, which the refusal of a damaged ledger points at, keeps the spool.
#[test]
fn a_fresh_or_recovered_ledger_still_releases_spooled_dels() {
    require_root!();
    let mut lab = Lab::new(CONFLIST);
    let (_a, a) = lab.pod();
    let (_b, b) = lab.pod();
    let ra = lab.rt.ipam(lab.list(), 0, "ADD", &a, None).unwrap();
    lab.rt.ipam(lab.list(), 0, "ADD", &b, None).unwrap();
    lab.dipamd.kill9();
    lab.rt.ipam(lab.list(), 0, "DEL", &a, Some(&ra)).unwrap();
    let state = lab.dipamd.state_dir();
    let aside = lab.dipamd.dir.path().join("state.aside");
    std::fs::create_dir(&aside).unwrap();
    for n in files(&state) {
        if n != "spool" {
            std::fs::rename(state.join(&n), aside.join(&n)).unwrap();
        }
    }
    lab.dipamd.start_again();
    assert!(lab.ledger().is_empty(), "a fresh ledger");
    let store: Vec<String> = lab.delegate_store().into_iter().map(|(id, _)| id).collect();
    assert_eq!(
        store,
        vec![b.container_id.clone()],
        "the spooled DEL for a key the fresh ledger lacks was dropped: {}",
        lab.dipamd.log()
    );

    // Damage the ledger, then rebuild it as the refusal says: the spool survives.
    let (_c, c) = lab.pod();
    let rc = lab.rt.ipam(lab.list(), 0, "ADD", &c, None).unwrap();
    assert!(lab.dipamd.terminate().success());
    lab.rt.ipam(lab.list(), 0, "DEL", &c, Some(&rc)).unwrap();
    assert_eq!(lab.spooled(), 1);
    lab.dipamd.garble_ledger();
    let refused = lab.dipamd.command().stdout(Stdio::null()).output().unwrap();
    assert!(!refused.status.success(), "dipamd served a corrupt ledger");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("dipamctl recover"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let conflist = lab.dipamd.dir.path().join("net.conflist");
    std::fs::write(&conflist, lab.list().to_string()).unwrap();
    let report = recover(&state, &conflist, &bins::cni_path());
    assert_eq!(report["spoolKept"], true, "{report}");
    assert_eq!(
        lab.spooled(),
        1,
        "the spool was moved aside with the ledger"
    );
    lab.dipamd.start_again();
    assert_eq!(lab.spooled(), 0, "{}", lab.dipamd.log());
    let held: Vec<String> = lab.ledger().into_iter().map(|(id, _)| id).collect();
    assert_eq!(held, vec![b.container_id.clone()]);
    lab.assert_agree();
}

/// A dipamd restarted with another `--spool-dir` (or `--state-dir`) takes over the spool its
/// predecessor on the socket published: DELs spooled there while dipamd was down are
/// released, not stranded in a directory nobody drains any more.
#[test]
fn a_spool_published_by_the_previous_dipamd_is_taken_over() {
    require_root!();
    let mut lab = Lab::new(CONFLIST);
    let (_a, a) = lab.pod();
    let ra = lab.rt.ipam(lab.list(), 0, "ADD", &a, None).unwrap();
    lab.dipamd.kill9();
    lab.rt.ipam(lab.list(), 0, "DEL", &a, Some(&ra)).unwrap();
    assert_eq!(lab.spooled(), 1);
    let moved = lab.dipamd.dir.path().join("other-spool");
    let flag = moved.display().to_string();
    lab.dipamd.set_flags(&["--spool-dir", &flag]);
    lab.dipamd.start_again();
    assert_eq!(lab.spooled(), 0, "{}", lab.dipamd.log());
    assert!(files(&moved).iter().all(|n| !n.ends_with(".json")));
    assert!(
        lab.delegate_store().is_empty(),
        "the inherited DEL was not replayed"
    );
    lab.assert_agree();
    let s = status(&lab);
    assert_eq!(s["spool"]["dir"], flag, "{s}");
    assert_eq!(
        s["spool"]["inherited"][0],
        spool_dir(&lab).display().to_string(),
        "{s}"
    );
}

/// The DaemonSet without its hostPath for the state directory: dipamd's spool is a directory
/// only its mount namespace sees (here a tmpfs over its `--state-dir`, as an emptyDir would
/// be). The pointer beside the shared socket names that path, but the plugin finds another
/// directory there: the DEL fails with 11 instead of being spooled where no dipamd reads.
#[test]
fn a_spool_the_plugin_does_not_see_gets_11_not_a_lost_del() {
    require_root!();
    let mut lab = Lab::new(CONFLIST).with_plugin_timeout(2);
    let (_a, a) = lab.pod();
    let ra = lab.rt.ipam(lab.list(), 0, "ADD", &a, None).unwrap();
    lab.dipamd.kill9();

    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let inner = lab.dipamd.command();
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs -o mode=0700 dipam-private "$0" && exec "$@""#)
        .arg(lab.dipamd.state_dir())
        .arg(inner.get_program())
        .args(inner.get_args())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut contained = Killed(cmd.spawn().unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(lab.dipamd.socket()).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the contained dipamd did not serve"
        );
        assert!(
            contained.0.try_wait().unwrap().is_none(),
            "the contained dipamd exited"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(contained);

    let e = lab
        .rt
        .ipam(lab.list(), 0, "DEL", &a, Some(&ra))
        .unwrap_err();
    assert_eq!(e.code, 11, "{e}");
    assert!(e.details.contains("another mount namespace"), "{e}");
    assert_eq!(
        lab.spooled(),
        0,
        "spooled where the contained dipamd never reads"
    );

    // The node's own dipamd again: the address is still accounted for, and the runtime's
    // retry releases it.
    lab.dipamd.start_again();
    assert_eq!(lab.ledger().len(), 1);
    lab.assert_agree();
    lab.rt.ipam(lab.list(), 0, "DEL", &a, Some(&ra)).unwrap();
    assert!(lab.delegate_store().is_empty());
    lab.assert_agree();
}

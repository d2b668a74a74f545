//! Tools for a node that is already broken: dipamd down (SIGKILLed, or stopped cleanly) with a
//! ledger holding pods and a DEL spooled meanwhile, on non-default state, socket and spool
//! paths. `doctor` reports offline from the node's files without taking the ledger's lock
//! (dipamd starts right after and replays the DEL), `support-bundle` marks what it could not
//! take as failed with the reason and finds the log (`--log-file`, or dipamd's stderr file),
//! and `status` counts doctor's failing checks as doctor does.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use dipam_lifecycle::{Lab, bins, require_root};
use serde_json::Value;

const CONFLIST: &str = "ptp-dipam-host-local.conflist";

/// A lab whose DEL spool is not under its state directory, with two pods; returns it, the
/// spool and the pods' container IDs.
fn lab_with_pods() -> (
    Lab,
    tempfile::TempDir,
    Vec<String>,
    Value,
    dipam_lifecycle::Attachment,
) {
    let spool = tempfile::tempdir().unwrap();
    let sp = spool.path().join("spool");
    let lab = Lab::with_flags(CONFLIST, &["--spool-dir", sp.to_str().unwrap()]);
    let (_a, a) = lab.pod();
    let (_b, b) = lab.pod();
    let ra = lab.rt.ipam(lab.list(), 0, "ADD", &a, None).unwrap();
    lab.rt.ipam(lab.list(), 0, "ADD", &b, None).unwrap();
    let ids = vec![a.container_id.clone(), b.container_id.clone()];
    (lab, spool, ids, ra, a)
}

/// A CNI config directory with the lab's conflist and a broken one.
fn conf_dir(lab: &Lab) -> tempfile::TempDir {
    let conf = tempfile::tempdir().unwrap();
    std::fs::write(
        conf.path().join("10-dipam.conflist"),
        serde_json::to_vec_pretty(lab.list()).unwrap(),
    )
    .unwrap();
    std::fs::write(conf.path().join("20-broken.conflist"), b"{\"name\": \"x\",").unwrap();
    conf
}

fn dipamctl(args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("120")
        .arg(bins::bin("dipamctl"))
        .args(args)
        .output()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn spool_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect()
}

/// dipamd down, the way `how` stops it: the offline doctor shows the ledger's pods, the
/// spooled DEL and the broken conflist, and dipamd then starts and replays the DEL.
fn offline_doctor_after(how: &str) {
    let (mut lab, spool, ids, ra, a) = lab_with_pods();
    let sp = spool.path().join("spool");
    match how {
        "kill9" => lab.dipamd.kill9(),
        _ => assert!(lab.dipamd.terminate().success()),
    }
    lab.rt
        .ipam(lab.list(), 0, "DEL", &a, Some(&ra))
        .expect("DEL with dipamd down is spooled");
    let spooled = spool_files(&sp);
    assert_eq!(spooled.len(), 1, "{how}: {spooled:?}");
    let conf = conf_dir(&lab);
    let state = lab.dipamd.state_dir();
    let socket = lab.dipamd.socket();
    let cni = bins::cni_path();
    let args = [
        "doctor",
        "--socket",
        s(&socket),
        "--state-dir",
        s(&state),
        "--conf-dir",
        s(conf.path()),
        "--cni-path",
        &cni,
    ];
    let out = dipamctl(&[&args[..], &["--json"]].concat());
    assert_eq!(out.status.code(), Some(1), "{how}: {out:?}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(r["offline"], true, "{r:#}");
    assert!(
        r["reason"]
            .as_str()
            .unwrap()
            .contains("cannot reach dipamd"),
        "{r:#}"
    );
    assert!(!r["notChecked"].as_array().unwrap().is_empty());
    let recorded: Vec<&str> = r["ledger"]["attachments"]
        .as_array()
        .unwrap_or_else(|| panic!("{how}: {r:#}"))
        .iter()
        .map(|a| a["containerID"].as_str().unwrap())
        .collect();
    for id in &ids {
        assert!(recorded.contains(&id.as_str()), "{how}: {id} not in {r:#}");
    }
    assert_eq!(r["spool"]["dir"], s(&sp), "{r:#}");
    let listed: Vec<&str> = r["spool"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(listed.contains(&spooled[0].as_str()), "{r:#}");
    let check = |name: &str| {
        r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {r:#}"))
            .clone()
    };
    assert_eq!(check("conflist 20-broken.conflist")["ok"], false);
    assert_eq!(check("conflist 10-dipam.conflist")["ok"], true, "{r:#}");
    assert_eq!(check("ledger is readable")["ok"], true, "{r:#}");
    assert_eq!(check("DEL spool drained")["ok"], false, "{r:#}");
    assert_eq!(
        check(&format!(
            "network {}: delegate host-local installed",
            lab.network()
        ))["ok"],
        true,
        "{r:#}"
    );
    assert_eq!(
        check(&format!(
            "network {}: delegate store agrees with the ledger",
            lab.network()
        ))["ok"],
        true,
        "{r:#}"
    );
    // The table says it is offline, and what it could not check.
    let text = dipamctl(&args);
    let t = String::from_utf8_lossy(&text.stdout);
    assert!(t.starts_with("OFFLINE: "), "{t}");
    assert!(
        t.contains("not checked offline") && t.contains(&ids[1]),
        "{t}"
    );
    // Explicit --offline while dipamd runs is the same view; and nothing was left locked:
    // dipamd starts and replays the spooled DEL.
    lab.dipamd.start_again();
    let forced = dipamctl(&[&args[..], &["--offline", "--json"]].concat());
    let f: Value = serde_json::from_slice(&forced.stdout).unwrap();
    assert_eq!(f["offline"], true);
    assert_eq!(f["reason"], "--offline given");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !spool_files(&sp).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(spool_files(&sp).is_empty(), "{}", lab.dipamd.log());
    assert_eq!(lab.ledger().len(), 1, "{}", lab.dipamd.log());
}

#[test]
fn offline_doctor_after_sigkill_reads_the_ledger_the_spool_and_the_conflists() {
    require_root!();
    offline_doctor_after("kill9");
}

#[test]
fn offline_doctor_after_a_clean_stop_reads_the_ledger_the_spool_and_the_conflists() {
    require_root!();
    offline_doctor_after("terminate");
}

fn bundle(args: &[&str], out_file: &Path) -> Value {
    let out = dipamctl(
        &[
            &[
                "support-bundle",
                "-o",
                s(out_file),
                "--json",
                "--part-timeout",
                "3",
            ][..],
            args,
        ]
        .concat(),
    );
    assert!(out.status.success(), "{out:?}");
    let x = out_file.with_extension("x");
    std::fs::create_dir_all(&x).unwrap();
    assert!(
        Command::new("tar")
            .arg("-xzf")
            .arg(out_file)
            .arg("-C")
            .arg(&x)
            .status()
            .unwrap()
            .success()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn part<'a>(m: &'a Value, name: &str) -> &'a Value {
    m["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["part"] == name)
        .unwrap_or_else(|| panic!("no part {name} in {m:#}"))
}

/// The one root directory of an extracted bundle.
fn root(x: &Path) -> PathBuf {
    std::fs::read_dir(x)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path()
}

#[test]
fn a_bundle_with_dipamd_down_fails_what_it_cannot_take_and_finds_the_log() {
    require_root!();
    let (mut lab, _spool, ids, _ra, _a) = lab_with_pods();
    let conf = conf_dir(&lab);
    let state = lab.dipamd.state_dir();
    let socket = lab.dipamd.socket();
    let work = tempfile::tempdir().unwrap();
    let common = [
        "--socket",
        s(&socket),
        "--state-dir",
        s(&state),
        "--conf-dir",
        s(conf.path()),
        "--journal-unit",
        "dipamd-offline-test-no-such-unit",
    ];

    // Stopped (SIGSTOP): it holds its socket and its ledger but answers nothing. Its log is
    // found through its stderr, a file.
    let pid = lab.dipamd.pid().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let f = work.path().join("stopped.tar.gz");
    let m = bundle(&common, &f);
    assert!(
        Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success()
    );
    for name in ["status", "doctor", "attachments", "explain"] {
        assert_eq!(part(&m, name)["ok"], false, "{name}: {m:#}");
    }
    let log = part(&m, "log");
    assert_eq!(log["ok"], true, "{m:#}");
    let source = log["source"].as_str().unwrap();
    assert!(
        source.contains("stderr") && source.contains(s(&lab.dipamd.log_path())),
        "{m:#}"
    );
    let logged = std::fs::read_to_string(root(&f.with_extension("x")).join("dipamd.log")).unwrap();
    assert!(logged.contains("serving"), "{logged}");

    // SIGKILLed: every part of dipamd's own view fails with why, the offline doctor is there.
    lab.dipamd.kill9();
    let f = work.path().join("killed.tar.gz");
    let log_file = lab.dipamd.log_path();
    let m = bundle(&[&common[..], &["--log-file", s(&log_file)]].concat(), &f);
    for name in ["status", "doctor", "attachments", "agent list", "explain"] {
        let p = part(&m, name);
        assert_eq!(p["ok"], false, "{name}: {m:#}");
        assert!(
            p["error"].as_str().unwrap().contains("cannot reach dipamd"),
            "{name}: {m:#}"
        );
    }
    let metrics = part(&m, "metrics")["error"].as_str().unwrap().to_owned();
    assert!(
        metrics.contains("command line")
            && metrics.contains("unknown")
            && metrics.contains("--metrics-url"),
        "{metrics}"
    );
    assert_eq!(part(&m, "log")["ok"], true, "{m:#}");
    assert_eq!(
        part(&m, "log")["source"],
        format!("--log-file {}", s(&log_file)).as_str()
    );
    assert_eq!(part(&m, "offline doctor")["ok"], true, "{m:#}");
    let r = root(&f.with_extension("x"));
    let off: Value =
        serde_json::from_slice(&std::fs::read(r.join("offline-doctor.json")).unwrap()).unwrap();
    assert_eq!(off["offline"], true);
    let text = off.to_string();
    for id in &ids {
        assert!(text.contains(id.as_str()), "{off:#}");
    }
    assert!(!r.join("explain.json").exists());

    // No --log-file, no process, no journal entries: the log part fails and says why.
    let f = work.path().join("nolog.tar.gz");
    let m = bundle(&common, &f);
    let log = part(&m, "log");
    assert_eq!(log["ok"], false, "{m:#}");
    assert!(
        log["error"].as_str().unwrap().contains("--log-file"),
        "{m:#}"
    );
}

#[test]
fn status_counts_the_doctor_checks_that_fail() {
    require_root!();
    let (lab, _spool, _ids, _ra, _a) = lab_with_pods();
    let socket = lab.dipamd.socket();
    let count = |lab: &Lab| {
        let d = dipamctl(&["doctor", "--socket", s(&socket), "--json"]);
        let checks: Value = serde_json::from_slice(&d.stdout).unwrap();
        let failed = checks
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["ok"] == false)
            .count();
        let st = dipamctl(&["status", "--socket", s(&socket), "--json"]);
        assert!(st.status.success(), "{st:?}");
        let st: Value = serde_json::from_slice(&st.stdout).unwrap();
        assert_eq!(
            st["doctor"]["failed"],
            failed,
            "{st:#} {checks:#} {}",
            lab.dipamd.log()
        );
        assert_eq!(st["doctor"]["checks"], checks.as_array().unwrap().len());
        let table = dipamctl(&["status", "--socket", s(&socket)]);
        let t = String::from_utf8_lossy(&table.stdout).into_owned();
        (failed, t)
    };
    let (before, t) = count(&lab);
    // A state directory others can read fails one more check.
    let state = lab.dipamd.state_dir();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (after, t2) = count(&lab);
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(after, before + 1, "{t}\n{t2}");
    assert!(t2.contains(&format!("doctor:       {after} of ")), "{t2}");
    if before == 0 {
        assert!(t.contains("doctor:       all "), "{t}");
    }
}

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

use dipam_lifecycle::{
    Lab, bins, cmd,
    deployment::{Deployment, Started},
    entry, named, require_root,
};
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

/// How many of doctor's `checks` (its `--json` list) `which` picks.
fn count_checks(checks: &Value, which: impl Fn(&Value) -> bool) -> usize {
    let all = checks.as_array().unwrap_or_else(|| panic!("{checks:#}"));
    all.iter().filter(|c| which(c)).count()
}

/// The flags that point dipamctl at `lab`'s dipamd and its files, none at its defaults: as
/// an operator passes them on a node with non-default paths.
fn paths(lab: &Lab, conf: &Path) -> Vec<String> {
    let (socket, state) = (lab.dipamd.socket(), lab.dipamd.state_dir());
    let flags = [
        ("--socket", &*socket),
        ("--state-dir", &*state),
        ("--conf-dir", conf),
    ];
    flags
        .into_iter()
        .flat_map(|(f, v)| [f.to_owned(), s(v).to_owned()])
        .collect()
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
    let cni = bins::cni_path();
    let paths = paths(&lab, conf.path());
    let args: Vec<&str> = ["doctor"]
        .into_iter()
        .chain(paths.iter().map(String::as_str))
        .chain(["--cni-path", &cni])
        .collect();
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
    let check = |name: &str| named(&r["checks"], name).clone();
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
    entry(&m["parts"], "part", name)
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
    let work = tempfile::tempdir().unwrap();
    let paths = paths(&lab, conf.path());
    let common: Vec<&str> = paths
        .iter()
        .map(String::as_str)
        .chain(["--journal-unit", "dipamd-offline-test-no-such-unit"])
        .collect();

    // Stopped (SIGSTOP): it holds its socket and its ledger but answers nothing. Its log is
    // found through its stderr, a file.
    let pid = lab.dipamd.pid().unwrap().to_string();
    cmd::run(Command::new("kill").args(["-STOP", &pid]));
    let f = work.path().join("stopped.tar.gz");
    let m = bundle(&common, &f);
    cmd::run(Command::new("kill").args(["-CONT", &pid]));
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
        let failed = count_checks(&checks, |c| c["ok"] == false);
        // With --stores, status counts every check doctor makes.
        let st = dipamctl(&["status", "--socket", s(&socket), "--json", "--stores"]);
        assert!(st.status.success(), "{st:?}");
        let st: Value = serde_json::from_slice(&st.stdout).unwrap();
        assert_eq!(
            st["doctor"]["failed"],
            failed,
            "{st:#} {checks:#} {}",
            lab.dipamd.log()
        );
        assert_eq!(st["doctor"]["checks"], checks.as_array().unwrap().len());
        // Without it, all but the comparisons of each store with the ledger (they read every
        // reservation), and the output says they were left out.
        let quick = dipamctl(&["status", "--socket", s(&socket), "--json"]);
        let quick: Value = serde_json::from_slice(&quick.stdout).unwrap();
        let compared = count_checks(&checks, |c| {
            let name = c["name"].as_str().unwrap_or_default();
            name.starts_with("network ")
                && [
                    ": delegate store agrees with the ledger",
                    ": no orphaned reservations",
                    ": running pods are recorded",
                    ": serving ADD",
                ]
                .iter()
                .any(|end| name.ends_with(end))
        });
        assert!(compared > 0, "{checks:#}");
        assert_eq!(quick["doctor"]["storesCompared"], false, "{quick:#}");
        assert_eq!(
            quick["doctor"]["checks"],
            checks.as_array().unwrap().len() - compared,
            "{quick:#} {checks:#}"
        );
        let table = dipamctl(&["status", "--socket", s(&socket), "--stores"]);
        let t = String::from_utf8_lossy(&table.stdout).into_owned();
        let quick_table = dipamctl(&["status", "--socket", s(&socket)]);
        let qt = String::from_utf8_lossy(&quick_table.stdout).into_owned();
        assert!(
            qt.contains("(stores not compared with the ledger: --stores)"),
            "{qt}"
        );
        (failed, t, quick["doctor"]["failed"].as_u64().unwrap())
    };
    let (before, t, quick_before) = count(&lab);
    // A state directory others can read fails one more check.
    let state = lab.dipamd.state_dir();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (after, t2, quick_after) = count(&lab);
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(after, before + 1, "{t}\n{t2}");
    assert_eq!(quick_after, quick_before + 1, "{t}\n{t2}");
    assert!(t2.contains(&format!("doctor:       {after} of ")), "{t2}");
    if before == 0 {
        assert!(t.contains("doctor:       all "), "{t}");
    }
}

/// The record dipamd leaves beside `socket`.
fn record_beside(socket: &Path) -> PathBuf {
    PathBuf::from(format!("{}.paths", s(socket)))
}

/// `path`'s permission bits and owner.
fn mode_uid(path: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.mode() & 0o7777, m.uid())
}

/// The offline doctor's report, given nothing but the socket.
fn doctor_at(socket: &Path) -> Value {
    let out = dipamctl(&["doctor", "--socket", s(socket), "--json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

/// dipamd on paths that are all non-default (socket, state directory, spool outside the state
/// directory, --cni-path, --conflist in a directory of its own), with two pods, started as
/// `d` starts it.
struct NonDefault {
    lab: Lab,
    _spool: tempfile::TempDir,
    sp: PathBuf,
    ids: Vec<String>,
    ra: Value,
    a: dipam_lifecycle::Attachment,
    net_d: tempfile::TempDir,
    own: PathBuf,
    started: Started,
}

fn non_default(d: Deployment) -> NonDefault {
    let (mut lab, spool, ids, ra, a) = lab_with_pods();
    let sp = spool.path().join("spool");
    let net_d = tempfile::tempdir().unwrap();
    let own = net_d.path().join("10-dipam.conflist");
    std::fs::write(&own, serde_json::to_vec_pretty(lab.list()).unwrap()).unwrap();
    let mut flags = lab.dipamd.flags().to_vec();
    flags.extend(["--conflist".to_owned(), s(&own).to_owned()]);
    lab.dipamd
        .set_flags(&flags.iter().map(String::as_str).collect::<Vec<_>>());
    // The DaemonSet's mounts make only its own volumes writable: the spool's too.
    let started = d.start(&mut lab, None, &[spool.path()]);
    NonDefault {
        lab,
        _spool: spool,
        sp,
        ids,
        ra,
        a,
        net_d,
        own,
        started,
    }
}

/// The pods' entries of the ledger (the DaemonSet's agent addresses left out).
fn pods_in(lab: &Lab) -> Vec<(String, String)> {
    lab.ledger()
        .into_iter()
        .filter(|(id, _)| !id.starts_with("dipam-"))
        .collect()
}

/// dipamd on non-default paths leaves a record of them at start. With it stopped, then
/// SIGKILLed, `doctor`, `support-bundle` and `recover`, given nothing but --socket, find the
/// real state directory, spool, conf dir, conflist and delegates, and say where they learned
/// each (issue 43: offline doctor failed "no ledger in /var/lib/dipam"). Under the shipped
/// unit's capability set, and in the DaemonSet's shape.
#[test]
fn offline_tools_learn_dipamds_non_default_paths_from_its_record() {
    learn_from_the_record(Deployment::ShippedUnit);
}

#[test]
fn offline_tools_learn_dipamds_non_default_paths_from_its_record_daemonset() {
    learn_from_the_record(Deployment::DaemonSet);
}

fn learn_from_the_record(d: Deployment) {
    require_root!();
    let NonDefault {
        mut lab,
        sp,
        ids,
        ra,
        a,
        net_d,
        own,
        // Bound, so that the spool's directory lives as long as the test.
        _spool: _keep,
        ..
    } = non_default(d);

    // Running: both copies, root's, the socket's readable by all, the state directory's
    // private like everything there.
    let (socket, state) = (lab.dipamd.socket(), lab.dipamd.state_dir());
    let beside = record_beside(&socket);
    let rec: Value = serde_json::from_slice(&std::fs::read(&beside).unwrap()).unwrap();
    assert_eq!(rec["stateDir"], s(&state), "{rec:#}");
    assert_eq!(rec["spoolDir"], s(&sp), "{rec:#}");
    assert_eq!(rec["conflist"], s(&own), "{rec:#}");
    assert_eq!(rec["cniPath"], bins::cni_path().as_str(), "{rec:#}");
    assert_eq!(rec["pid"], lab.dipamd.pid().unwrap(), "{rec:#}");
    assert_eq!(mode_uid(&beside), (0o644, 0));
    let in_state = state.join("dipamd.paths");
    assert_eq!(mode_uid(&in_state), (0o600, 0));
    let copy: Value = serde_json::from_slice(&std::fs::read(&in_state).unwrap()).unwrap();
    assert_eq!(copy, rec);

    // Stopped, a DEL spooled meanwhile: doctor with nothing but --socket.
    assert!(lab.dipamd.terminate().success());
    lab.rt
        .ipam(lab.list(), 0, "DEL", &a, Some(&ra))
        .expect("DEL with dipamd down is spooled");
    let learned = format!("from {} written by dipamd pid ", beside.display());
    let r = doctor_at(&socket);
    let p = &r["paths"];
    for (key, want) in [
        ("stateDir", s(&state)),
        ("spoolDir", s(&sp)),
        ("conflist", s(&own)),
    ] {
        assert_eq!(p[key]["path"], want, "{key}: {p:#}");
        assert!(
            p[key]["source"].as_str().unwrap().starts_with(&learned),
            "{key}: {p:#}"
        );
    }
    assert_eq!(p["cniPath"]["path"], bins::cni_path().as_str(), "{p:#}");
    assert_eq!(p["confDir"]["path"], s(net_d.path()), "{p:#}");
    assert!(
        p["confDir"]["source"]
            .as_str()
            .unwrap()
            .starts_with("the directory of dipamd's --conflist, from "),
        "{p:#}"
    );
    assert_eq!(p["warnings"], serde_json::json!([]), "{p:#}");
    let recorded = r["ledger"]["attachments"].to_string();
    assert!(ids.iter().all(|id| recorded.contains(id.as_str())), "{r:#}");
    assert_eq!(r["spool"]["files"].as_array().unwrap().len(), 1, "{r:#}");
    let ok = |name: &str| named(&r["checks"], name)["ok"] == true;
    assert!(ok("ledger is readable") && ok("conflist 10-dipam.conflist"));
    assert!(ok(&format!(
        "network {}: delegate host-local installed",
        lab.network()
    )));
    let text = dipamctl(&["doctor", "--socket", s(&socket)]);
    let t = String::from_utf8_lossy(&text.stdout);
    assert!(
        t.contains(&format!("  state directory: {} ({learned}", s(&state))),
        "{t}"
    );

    // SIGKILLed (after replaying the spooled DEL): the bundle, given nothing but --socket.
    lab.dipamd.start_again();
    lab.dipamd.kill9();
    let work = tempfile::tempdir().unwrap();
    let f = work.path().join("killed.tar.gz");
    let none = "dipamd-offline-test-no-such-unit";
    let m = bundle(&["--socket", s(&socket), "--journal-unit", none], &f);
    assert_eq!(part(&m, "dipamd's paths")["ok"], true, "{m:#}");
    assert_eq!(part(&m, "conflists")["ok"], true, "{m:#}");
    let x = root(&f.with_extension("x"));
    let read = |name: &str| -> Value {
        serde_json::from_slice(&std::fs::read(x.join(name)).unwrap()).unwrap()
    };
    assert_eq!(read("dipamd-paths.json")["stateDir"]["path"], s(&state));
    let lists = read("conflists.json");
    assert_eq!(lists["dir"], s(net_d.path()), "{lists:#}");
    assert!(lists["files"]["10-dipam.conflist"].is_object(), "{lists:#}");
    let off = read("offline-doctor.json");
    assert_eq!(off["paths"]["spoolDir"]["path"], s(&sp), "{off:#}");
    assert!(off["ledger"]["attachments"].to_string().contains(&ids[1]));

    // The ledger lost (its state directory gone with its copy of the record): recover, given
    // nothing but --socket, rebuilds it where dipamd keeps it, from the conflist dipamd
    // uses, with the delegate dipamd runs.
    std::fs::remove_dir_all(&state).unwrap();
    let out = dipamctl(&["recover", "--socket", s(&socket)]);
    assert!(out.status.success(), "{out:?}");
    let t = String::from_utf8_lossy(&out.stdout);
    for line in [
        format!("state directory: {} ({learned}", s(&state)),
        format!("dipamd's conflist: {} ({learned}", s(&own)),
        format!("delegate search path: {} ({learned}", bins::cni_path()),
        "recovered 1 pod and ".to_owned(),
    ] {
        assert!(t.contains(&line), "{line}: {t}");
    }
    lab.dipamd.start_again();
    let ledger = pods_in(&lab);
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0].0, ids[1], "{ledger:?}");
    lab.assert_agree();
}

/// A record of dipamd's paths is believed only when it is root's, writable by no one else,
/// and no link: one another user could have planted (owned by nobody, group-writable, a
/// link) is refused with a warning that says why, and the offline tools fall back to the
/// defaults, saying so. dipamd, starting, replaces a link planted at the record's name
/// instead of writing through it.
#[test]
fn a_record_of_paths_another_user_could_have_planted_is_refused() {
    require_root!();
    let mut lab = Lab::new(CONFLIST);
    let (socket, state) = (lab.dipamd.socket(), lab.dipamd.state_dir());
    let beside = record_beside(&socket);
    assert!(lab.dipamd.terminate().success());
    let good = std::fs::read(&beside).unwrap();
    assert_eq!(doctor_at(&socket)["paths"]["stateDir"]["path"], s(&state));
    let elsewhere = tempfile::tempdir().unwrap();
    let copy = elsewhere.path().join("copy.paths");
    std::fs::write(&copy, &good).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
    for (how, why) in [
        ("owned by nobody", "owned by uid 65534, not by root"),
        ("group-writable", "writable by group or others"),
        ("a link to a good copy", "symbolic link"),
    ] {
        match how {
            "owned by nobody" => std::os::unix::fs::chown(&beside, Some(65534), None).unwrap(),
            "group-writable" => {
                std::fs::set_permissions(&beside, std::fs::Permissions::from_mode(0o664)).unwrap()
            }
            _ => {
                std::fs::remove_file(&beside).unwrap();
                std::os::unix::fs::symlink(&copy, &beside).unwrap();
            }
        }
        let r = doctor_at(&socket);
        let warnings = r["paths"]["warnings"].to_string();
        assert!(
            warnings.contains("refused a record of dipamd's paths") && warnings.contains(why),
            "{how}: {r:#}"
        );
        assert_ne!(r["paths"]["stateDir"]["path"], s(&state), "{how}: {r:#}");
        let text = dipamctl(&["doctor", "--socket", s(&socket)]);
        let t = String::from_utf8_lossy(&text.stdout);
        assert!(t.contains("WARNING: refused a record"), "{how}: {t}");
        // Put back as dipamd leaves it.
        std::fs::remove_file(&beside).unwrap();
        std::fs::write(&beside, &good).unwrap();
        std::fs::set_permissions(&beside, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    assert_eq!(doctor_at(&socket)["paths"]["stateDir"]["path"], s(&state));

    // A link planted at the name: dipamd's start replaces it, its target untouched.
    let target = elsewhere.path().join("target");
    std::fs::write(&target, b"keep").unwrap();
    std::fs::remove_file(&beside).unwrap();
    std::os::unix::fs::symlink(&target, &beside).unwrap();
    lab.dipamd.start_again();
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    assert!(std::fs::symlink_metadata(&beside).unwrap().is_file());
    assert_eq!(mode_uid(&beside), (0o644, 0));
}

/// Removes both copies of dipamd's record of its paths, as a dipamd older than this
/// dipamctl would have left the node.
fn remove_records(lab: &Lab) {
    for r in [
        record_beside(&lab.dipamd.socket()),
        lab.dipamd.state_dir().join("dipamd.paths"),
    ] {
        std::fs::remove_file(&r).unwrap_or_else(|e| panic!("{}: {e}", r.display()));
    }
}

/// Asserts that the offline doctor's `paths` found each of dipamd's non-default paths, each
/// learned from a source starting with `from`.
fn assert_learned(r: &Value, n: &NonDefault, from: &str) {
    let p = &r["paths"];
    let (state, cni) = (n.lab.dipamd.state_dir(), bins::cni_path());
    for (key, want) in [
        ("stateDir", s(&state)),
        ("spoolDir", s(&n.sp)),
        ("conflist", s(&n.own)),
        ("cniPath", cni.as_str()),
    ] {
        assert_eq!(p[key]["path"], want, "{key}: {p:#}");
        assert!(
            p[key]["source"].as_str().unwrap().starts_with(from),
            "{key} not {from}: {p:#}"
        );
    }
    assert_eq!(p["confDir"]["path"], s(n.net_d.path()), "{p:#}");
    let w = p["warnings"].to_string();
    assert!(!w.contains("no record of dipamd's paths"), "{p:#}");
    let recorded = r["ledger"]["attachments"].to_string();
    assert!(
        n.ids.iter().all(|id| recorded.contains(id.as_str())),
        "{r:#}"
    );
}

/// A dipamd that left no record (one older than this dipamctl) but runs: the offline tools
/// read its paths from its own command line and environment (/proc), which in the DaemonSet's
/// shape are the manifest's `command` and `env` (its --metrics-address too), and say so.
#[test]
fn offline_tools_read_a_running_dipamds_arguments_when_it_left_no_record() {
    read_running_arguments(Deployment::ShippedUnit);
}

#[test]
fn offline_tools_read_a_running_dipamds_arguments_when_it_left_no_record_daemonset() {
    read_running_arguments(Deployment::DaemonSet);
}

fn read_running_arguments(d: Deployment) {
    require_root!();
    let n = non_default(d);
    remove_records(&n.lab);
    let socket = n.lab.dipamd.socket();
    let pid = n.lab.dipamd.pid().unwrap();
    let out = dipamctl(&["doctor", "--offline", "--socket", s(&socket), "--json"]);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let from = format!("from the command line of the running dipamd pid {pid}");
    assert_learned(&r, &n, &from);
    assert_eq!(r["paths"]["record"]["path"], format!("/proc/{pid}/cmdline"));
    if let Some(port) = n.started.metrics_port {
        let m = &r["paths"]["metrics"];
        assert_eq!(
            m["path"],
            format!("http://127.0.0.1:{port}/metrics"),
            "{m:#}"
        );
        assert_eq!(m["source"], from.as_str(), "{m:#}");
    }
    let text = dipamctl(&["doctor", "--offline", "--socket", s(&socket)]);
    let t = String::from_utf8_lossy(&text.stdout);
    let line = format!(
        "  state directory: {} ({from})",
        s(&n.lab.dipamd.state_dir())
    );
    assert!(t.contains(&line), "{line}: {t}");
}

/// A stopped dipamd that left no record: the offline tools read its paths from the installed
/// systemd unit (the shipped one, a drop-in naming an environment file, that file's
/// DIPAMD_OPTS), doctor sees the DEL spooled meanwhile, recover rebuilds the ledger where the
/// unit keeps it; a drop-in another user could have written is refused, saying why, and the
/// defaults are then assumed, saying so. dipamd ran under the unit's capability set.
#[test]
fn offline_tools_read_the_installed_unit_when_dipamd_left_no_record() {
    require_root!();
    let n = non_default(Deployment::ShippedUnit);
    let mut lab = n.lab;
    assert!(lab.dipamd.terminate().success());
    lab.rt
        .ipam(lab.list(), 0, "DEL", &n.a, Some(&n.ra))
        .expect("DEL with dipamd down is spooled");
    remove_records(&lab);
    let (socket, state) = (lab.dipamd.socket(), lab.dipamd.state_dir());
    let units = tempfile::tempdir().unwrap();
    let unit = units.path().join("dipamd.service");
    std::fs::copy(
        bins::workspace().join("deploy/systemd/dipamd.service"),
        &unit,
    )
    .unwrap();
    let dropin_dir = units.path().join("dipamd.service.d");
    std::fs::create_dir(&dropin_dir).unwrap();
    let env_file = units.path().join("default-dipamd");
    std::fs::write(
        &env_file,
        format!(
            "DIPAM_STATE_DIR={}\nDIPAMD_OPTS=\"--spool-dir {} --conflist {} --cni-path {}\"\n",
            s(&state),
            s(&n.sp),
            s(&n.own),
            bins::cni_path()
        ),
    )
    .unwrap();
    let dropin = dropin_dir.join("50-node.conf");
    std::fs::write(
        &dropin,
        format!(
            "[Service]\nEnvironment=DIPAM_SOCKET={}\nEnvironmentFile=-{}\n",
            s(&socket),
            s(&env_file)
        ),
    )
    .unwrap();
    let u = ["--unit-dir", s(units.path())];
    let out = dipamctl(&[&["doctor", "--socket", s(&socket), "--json"][..], &u].concat());
    let r: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let from = format!(
        "from the systemd unit {} + {} (dipamd not running)",
        unit.display(),
        dropin.display()
    );
    let n = NonDefault { lab, ..n };
    assert_learned(&r, &n, &from);
    assert_eq!(r["spool"]["files"].as_array().unwrap().len(), 1, "{r:#}");
    let mut lab = n.lab;

    // The ledger lost: recover rebuilds it where the unit keeps it, from host-local's store,
    // which still holds the pod whose DEL is spooled; dipamd replays that DEL at start.
    std::fs::remove_dir_all(&state).unwrap();
    let out = dipamctl(&[&["recover", "--socket", s(&socket)][..], &u].concat());
    assert!(out.status.success(), "{out:?}");
    let t = String::from_utf8_lossy(&out.stdout);
    for line in [
        format!("state directory: {} ({from})", s(&state)),
        format!("dipamd's conflist: {} ({from})", s(&n.own)),
        "recovered 2 pod and ".to_owned(),
    ] {
        assert!(t.contains(&line), "{line}: {t}");
    }

    // A drop-in another user could have written: refused, and the defaults assumed.
    std::fs::set_permissions(&dropin, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = dipamctl(&[&["doctor", "--socket", s(&socket), "--json"][..], &u].concat());
    let r: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let w = r["paths"]["warnings"].to_string();
    assert!(
        w.contains("refused the systemd unit of dipamd")
            && w.contains("50-node.conf")
            && w.contains("writable by group or others")
            && w.contains("no record of dipamd's paths"),
        "{r:#}"
    );
    assert_eq!(r["paths"]["stateDir"]["source"], "default", "{r:#}");

    std::fs::set_permissions(&dropin, std::fs::Permissions::from_mode(0o644)).unwrap();
    lab.dipamd.start_again();
    let ledger = pods_in(&lab);
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0].0, n.ids[1], "{ledger:?}");
    lab.assert_agree();
}

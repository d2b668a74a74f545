//! `dipamctl support-bundle` on a working node with non-default paths, and on a broken one
//! (dipamd down, no conf dir, a log that never ends): the bundle is always written, each part
//! is bounded in time, and what failed is noted in its MANIFEST.json.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    os::unix::fs::PermissionsExt,
    path::Path,
    process::{Command, Output},
};

use dipam_lifecycle::{Lab, bins, entry, require_root, runtime::result_ips};
use serde_json::Value;

const CONFLIST: &str = "ptp-dipam-host-local.conflist";

/// Runs `dipamctl --socket S support-bundle -o OUT --log-file LOG --conf-dir CONF EXTRA`
/// against `lab`'s dipamd, under `timeout` so that a hang fails the test instead of stalling
/// the suite.
fn bundle(lab: &Lab, out: &Path, log: &Path, conf: &Path, extra: &[&str]) -> Output {
    Command::new("timeout")
        .arg("120")
        .arg(bins::bin("dipamctl"))
        .arg("--socket")
        .arg(lab.dipamd.socket())
        .arg("support-bundle")
        .arg("-o")
        .arg(out)
        .arg("--log-file")
        .arg(log)
        .arg("--conf-dir")
        .arg(conf)
        .args(extra)
        .output()
        .unwrap()
}

/// Extracts a bundle and returns its root directory.
fn extract(bundle: &Path, into: &Path) -> std::path::PathBuf {
    let out = Command::new("tar")
        .arg("-xzf")
        .arg(bundle)
        .arg("-C")
        .arg(into)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut roots: Vec<_> = std::fs::read_dir(into).unwrap().flatten().collect();
    assert_eq!(roots.len(), 1, "one root directory");
    roots.pop().unwrap().path()
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn part<'a>(manifest: &'a Value, name: &str) -> &'a Value {
    entry(&manifest["parts"], "part", name)
}

#[test]
fn a_bundle_of_a_working_node_holds_what_a_bug_report_needs() {
    require_root!();
    let sock_dir = tempfile::tempdir().unwrap();
    let msock = sock_dir.path().join("metrics.sock");
    let lab = Lab::with_flags(CONFLIST, &["--metrics-socket", msock.to_str().unwrap()]);
    let (_ns, pod) = lab.pod();
    let r = lab.rt.ipam(lab.list(), 0, "ADD", &pod, None).unwrap();
    let ip = result_ips(&r).remove(0);
    let conf = tempfile::tempdir().unwrap();
    std::fs::write(
        conf.path().join("10-dipam.conflist"),
        serde_json::to_vec_pretty(lab.list()).unwrap(),
    )
    .unwrap();
    let work = tempfile::tempdir().unwrap();
    let out_file = work.path().join("bundle.tar.gz");
    let log = lab.dipamd.log_path();
    let out = bundle(&lab, &out_file, &log, conf.path(), &["--json"]);
    assert!(out.status.success(), "{out:?}");
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["bundle"], out_file.to_str().unwrap());
    // Container IDs and pod names inside: only root reads it.
    let mode = std::fs::metadata(&out_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let x = tempfile::tempdir().unwrap();
    let root = extract(&out_file, x.path());
    let manifest = read_json(&root.join("MANIFEST.json"));
    for p in manifest["parts"].as_array().unwrap() {
        assert_eq!(p["ok"], true, "{p}");
    }
    assert_eq!(printed["parts"], manifest["parts"]);

    let status = read_json(&root.join("status.json"));
    assert!(status["daemonVersion"].is_string(), "{status}");
    let atts = read_json(&root.join("attachments.json"));
    assert!(
        atts.as_array()
            .unwrap()
            .iter()
            .any(|a| a["containerID"] == pod.container_id.as_str()),
        "{atts}"
    );
    assert!(read_json(&root.join("doctor.json")).is_array());
    let explain = read_json(&root.join("explain.json"));
    assert!(
        explain[&pod.container_id]["events"].is_array() || explain[&pod.container_id].is_object(),
        "{explain:#}"
    );
    let metrics = std::fs::read_to_string(root.join("metrics.txt")).unwrap();
    assert!(
        metrics.contains("# TYPE") && metrics.contains("dipam_"),
        "{metrics}"
    );
    let logged = std::fs::read_to_string(root.join("dipamd.log")).unwrap();
    assert!(logged.contains("serving"), "{logged}");
    let versions = read_json(&root.join("versions.json"));
    let cmd = versions["dipamdCommandLine"].as_array().unwrap();
    assert!(
        cmd.iter().any(|a| a == "--state-dir"),
        "dipamd's flags, found through the socket's peer: {versions:#}"
    );
    assert_eq!(versions["dipamd"], status["daemonVersion"]);
    let lists = read_json(&root.join("conflists.json"));
    assert_eq!(
        lists["files"]["10-dipam.conflist"]["name"],
        lab.network().as_str()
    );
    // host-local's store by file name: the address, never the container ID inside it.
    let store = std::fs::read_to_string(root.join("delegate-store.json")).unwrap();
    assert!(store.contains(&format!("\"{ip}\"")), "{store}");
    assert!(!store.contains(&pod.container_id), "{store}");
}

#[test]
fn a_broken_node_still_gets_a_bundle_with_each_failure_noted() {
    require_root!();
    let mut lab = Lab::new(CONFLIST);
    lab.dipamd.kill9();
    let work = tempfile::tempdir().unwrap();
    // A log that never ends: a FIFO nobody writes to. Its part must time out, not hang.
    let fifo = work.path().join("log.fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let out_file = work.path().join("broken.tar.gz");
    let out = bundle(
        &lab,
        &out_file,
        &fifo,
        &work.path().join("no-such-dir"),
        &["--part-timeout", "1"],
    );
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FAILED"), "{text}");
    let x = tempfile::tempdir().unwrap();
    let root = extract(&out_file, x.path());
    let m = read_json(&root.join("MANIFEST.json"));
    for name in ["status", "doctor", "attachments", "conflists", "metrics"] {
        assert_eq!(part(&m, name)["ok"], false, "{name}: {m:#}");
    }
    for (name, why) in [("status", "cannot reach dipamd"), ("log", "timed out")] {
        let error = part(&m, name)["error"].as_str().unwrap_or_default();
        assert!(error.contains(why), "{name}: {m:#}");
    }
    // What could be taken was taken.
    let versions = read_json(&root.join("versions.json"));
    assert!(versions["dipamctl"].is_string(), "{versions}");
    assert!(
        versions["dipamdCommandLine"]["error"].is_string(),
        "{versions}"
    );
    assert!(!root.join("status.json").exists());
}

/// Issue 38 §3 (low). Root runs `dipamctl support-bundle -o DIR/bundle.tar.gz` in a directory
/// every user can write (0777, no sticky bit: `fs.protected_symlinks` guards no link there),
/// where nobody has planted links to a root-only file at the bundle's name and at the
/// temporary name it used (`bundle.tar.partial`: the target's last extension replaced).
/// Before, root truncated and overwrote the file the link pointed at. Now the victim keeps
/// its bytes, the bundle is a new regular file (root's, 0600, whole), nobody's temporary
/// link is left as it was, and root's pods are served meanwhile with nothing lost.
#[test]
fn a_bundle_never_writes_through_a_planted_link() {
    require_root!();
    let lab = Lab::new(CONFLIST);
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let private = tempfile::tempdir().unwrap();
    let victim = private.path().join("root-only");
    std::fs::write(&victim, "root's\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out_file = shared.path().join("bundle.tar.gz");
    let partial = shared.path().join("bundle.tar.partial");
    for link in [&out_file, &partial] {
        let planted = dipam_lifecycle::nobody::run(
            &["ln", "-s", victim.to_str().unwrap(), link.to_str().unwrap()],
            &[],
            "",
        );
        assert!(planted.status.success(), "nobody's link: {planted:?}");
    }
    let conf = tempfile::tempdir().unwrap();
    let log = lab.dipamd.log_path();
    let out = bundle(&lab, &out_file, &log, conf.path(), &["--part-timeout", "5"]);
    assert!(out.status.success(), "{out:?}");
    let kept = std::fs::read(&victim).unwrap();
    assert!(
        kept == b"root's\n",
        "the bundle was written through nobody's link: the victim now holds {} bytes",
        kept.len()
    );
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(&out_file).unwrap();
    assert!(meta.is_file(), "the bundle is no link: {meta:?}");
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600));
    assert!(std::fs::symlink_metadata(&partial).unwrap().is_symlink());
    let x = tempfile::tempdir().unwrap();
    let root = extract(&out_file, x.path());
    assert!(read_json(&root.join("MANIFEST.json"))["parts"].is_array());
    let left: Vec<String> = std::fs::read_dir(shared.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "bundle.tar.gz" && n != "bundle.tar.partial")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    lab.assert_serves(3);
    lab.assert_agree();
}

//! A plugin killed at a random point of its ADD (docs/cfp.md §8.1, F38), the way a runtime's
//! timeout or a killed caller ends it: SIGKILL, thousands of times, at random delays from
//! its start, as root and as an allowed non-root uid (nobody, a real process through
//! setpriv). Before, the dropped ADD handler SIGKILLed host-local between its create of
//! `<store>/<ip>` and its write of the owner: an empty file that no DEL ever matches, an
//! address lost for good. Now the ADD runs to its end and is rolled back if its plugin left,
//! and after all the runtime's DELs nothing is left: no blank file, no reservation, no
//! record, and the ledger agrees with host-local's store at every check.
//!
//! Also: a blank reservation that got into a store anyway (a power cut, a delegate killed
//! past `--delegate-timeout`) is reported by the reconcile and freed with `--reconcile-free`,
//! while a young one (a file host-local may be writing) is left alone.
//!
//! `DIPAM_KILL_RUNS` sets how many runs of kills one test makes (default 5); each prints
//! its seed and what it killed.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    Lab, Replay, Runtime, bins,
    nobody::{self, NOBODY},
    replay::{self, Rng},
    require_root, unique,
};
use serde_json::{Value, json};

/// Plugins killed per run, over [`WORKERS`] at once.
const KILLS: usize = 240;
const WORKERS: usize = 4;
/// The kill lands this long after the plugin's start, at most: its connect, dipamd's exec of
/// host-local and host-local's reservation all happen within it on a loaded 2-CPU machine.
const MAX_DELAY_US: u64 = 15_000;

/// How many runs one test makes.
fn runs() -> usize {
    dipam_lifecycle::env_or("DIPAM_KILL_RUNS", 5)
}

/// Who the plugin runs as.
#[derive(Clone, Copy, PartialEq)]
enum Caller {
    Root,
    Nobody,
}

impl Caller {
    /// The plugin's command line.
    fn argv(self) -> Vec<String> {
        let dipam = bins::bin("dipam").display().to_string();
        match self {
            Self::Root => vec![dipam],
            Self::Nobody => [
                "setpriv",
                "--reuid",
                NOBODY,
                "--regid",
                NOBODY,
                "--clear-groups",
                "--",
                &dipam,
            ]
            .map(str::to_owned)
            .to_vec(),
        }
    }
}

/// Runs the dipam plugin as `caller` for `command` of `cid` with `conf`, and SIGKILLs it
/// `kill_after` after its start, if given. Whether it exited 0 by itself.
fn plugin(
    caller: Caller,
    command: &str,
    cid: &str,
    conf: &Value,
    kill_after: Option<Duration>,
) -> bool {
    let argv = caller.argv();
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_NETNS", "/var/run/netns/killed")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_ARGS", "")
        .env("CNI_PATH", bins::cni_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let _ = child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes());
    if let Some(after) = kill_after {
        std::thread::sleep(after.saturating_sub(started.elapsed()));
        let _ = child.kill();
    }
    child.wait().unwrap().success()
}

/// The blank reservations in host-local's directory `dir`: files named by an address that
/// hold no owner.
fn blank_files(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .parse::<std::net::IpAddr>()
                .is_ok()
        })
        .filter(|e| {
            std::fs::read(e.path())
                .is_ok_and(|b| b.iter().all(|c| c.is_ascii_whitespace() || *c == 0))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// The lab: root's own network, or nobody's (a network of its own in the lab's store, which
/// dipamd allows it: `--non-root-data-dir`); dipamd's metrics on a socket in `metrics`, where
/// [`settle`] reads what it is still serving.
fn lab(caller: Caller, metrics: &Path) -> (Lab, Value, PathBuf) {
    let msock = metrics.join("metrics.sock");
    let msock = msock.to_str().unwrap();
    let flags = match caller {
        Caller::Root => vec!["--metrics-socket", msock],
        Caller::Nobody => nobody::allowed_and(&["--metrics-socket", msock]),
    };
    let lab = Lab::with_flags("ptp-dipam-host-local.conflist", &flags);
    let mut conf = Runtime::plugin_config(lab.list(), 0, None);
    if caller == Caller::Nobody {
        conf["name"] = json!(format!("{}-nobody", lab.network()));
    }
    let network = conf["name"].as_str().unwrap().to_owned();
    let dir = lab.data.path().join(network);
    (lab, conf, dir)
}

/// Waits until dipamd has finished every ADD whose plugin it lost (each runs to its end,
/// then is rolled back): no request in flight (`dipam_requests_in_flight`), nothing `adding`
/// or `deleting` in the ledger for this network, on two looks 200 ms apart. The ledger alone
/// cannot tell: an ADD whose plugin left after the commit is `committed` until its rollback
/// begins, and a check in that gap finds host-local's reservation and then no record.
fn settle(lab: &Lab, network: &str, metrics: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut quiet = 0;
    loop {
        let serving = dipam_lifecycle::daemon::requests_in_flight(
            &dipam_lifecycle::daemon::scrape_socket(&metrics.join("metrics.sock")),
        );
        let busy = lab
            .dipamd
            .ledger()
            .iter()
            .filter(|r| r["network"] == network && r["state"] != "committed")
            .count();
        quiet = if serving == 0 && busy == 0 {
            quiet + 1
        } else {
            0
        };
        if quiet == 2 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{serving} requests and {busy} operations still in flight 60 s after the last kill"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `runs()` runs of [`KILLS`] plugins killed mid-ADD as `caller`; after each, the checks.
fn kills(caller: Caller, test: &str) {
    let metrics = tempfile::tempdir().unwrap();
    let (lab, conf, dir) = lab(caller, metrics.path());
    let network = conf["name"].as_str().unwrap().to_owned();
    let seed = replay::seed();
    let replay = Replay::new("plugin_kills", test, Some(seed), lab.dipamd.log_path());
    let mut total = 0;
    for run in 0..runs() {
        let run_seed = seed.wrapping_add(run as u64 * 104_729);
        // The container IDs of every ADD, as the runtime knows them.
        let tried: Vec<Vec<String>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..WORKERS)
                .map(|w| {
                    let conf = &conf;
                    s.spawn(move || {
                        let mut rng = Rng::new(run_seed.wrapping_add(w as u64 * 7919));
                        (0..KILLS / WORKERS)
                            .map(|_| {
                                let cid = unique("killed");
                                let after = Duration::from_micros(rng.below(MAX_DELAY_US));
                                plugin(caller, "ADD", &cid, conf, Some(after));
                                cid
                            })
                            .collect()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        total += KILLS;
        replay.kill(format!(
            "run {run}: {KILLS} plugins SIGKILLed 0-{MAX_DELAY_US} µs into their ADD (seed {run_seed})"
        ));
        settle(&lab, &network, metrics.path());
        let blank = blank_files(&dir);
        assert!(
            blank.is_empty(),
            "run {run}, seed {run_seed}: blank reservations left in {}: {blank:?}",
            dir.display()
        );
        let held = dipam_lifecycle::hostlocal::store_pairs(lab.data.path(), &network);
        assert_eq!(
            lab.dipamd.ledger_pairs(&network),
            held,
            "run {run}, seed {run_seed}: ledger (left) and host-local (right) disagree"
        );
        // What a killed plugin's ADD kept is the one whose answer it got just before the
        // kill; the runtime DELs it, as after any failed ADD.
        for cid in held.iter().map(|(c, _)| c.clone()) {
            assert!(tried.iter().flatten().any(|t| *t == cid), "{cid}");
            let deadline = Instant::now() + Duration::from_secs(30);
            while !plugin(caller, "DEL", &cid, &conf, None) {
                assert!(Instant::now() < deadline, "DEL of {cid} kept failing");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let left = dipam_lifecycle::hostlocal::reservations(lab.data.path(), &network);
        assert!(
            left.is_empty(),
            "run {run}, seed {run_seed}: leaked after the runtime's DELs: {left:?}"
        );
        assert!(lab.dipamd.ledger_pairs(&network).is_empty());
        let rolled_back = lab
            .dipamd
            .log()
            .matches("the plugin left before its ADD was answered")
            .count();
        eprintln!(
            "run {run}: {KILLS} kills, {} kept their answer, {rolled_back} rolled back by dipamd so far",
            held.len()
        );
    }
    // Root's pods are still served.
    assert!(lab.add_and_del(3).is_empty(), "{}", lab.dipamd.log());
    eprintln!("{test}: {total} plugins killed mid-ADD, nothing lost");
}

#[test]
fn plugin_sigkills_mid_add_leave_nothing_behind_as_root() {
    require_root!();
    kills(
        Caller::Root,
        "plugin_sigkills_mid_add_leave_nothing_behind_as_root",
    );
}

#[test]
fn plugin_sigkills_mid_add_leave_nothing_behind_as_an_allowed_uid() {
    require_root!();
    kills(
        Caller::Nobody,
        "plugin_sigkills_mid_add_leave_nothing_behind_as_an_allowed_uid",
    );
}

/// A blank reservation older than a few seconds is reported as an orphan and freed by
/// `--reconcile-free`; a young one, which host-local may be writing, is neither.
#[test]
fn a_blank_reservation_is_reported_and_freed_by_the_reconcile() {
    require_root!();
    let flags = ["--reconcile-interval", "1", "--gc-grace", "0"];
    let mut lab = Lab::with_flags("ptp-dipam-host-local.conflist", &flags);
    let network = lab.network();
    // One real reservation first, so that the directory is host-local's own.
    let (_ns, pod) = lab.pod();
    lab.rt.add(lab.list(), &pod).unwrap();
    let dir = lab.data.path().join(&network);
    let prefix = lab.subnet.cidr.rsplit_once('.').unwrap().0.to_owned();
    let old = dir.join(format!("{prefix}.200"));
    std::fs::write(&old, b"").unwrap();
    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(an_hour_ago)
        .unwrap();
    let orphans = |lab: &Lab| -> u64 {
        let out = lab.dipamd.ctl(&["status", "--json"]);
        let s: Value = serde_json::from_slice(&out.stdout).unwrap();
        s["divergence"]["orphans"].as_u64().unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while orphans(&lab) != 1 {
        assert!(
            Instant::now() < deadline,
            "the blank reservation was never reported: {}",
            lab.dipamd.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(lab.dipamd.log().contains("a blank reservation"));
    assert!(old.exists(), "freed without --reconcile-free");

    let mut free = flags.to_vec();
    free.push("--reconcile-free");
    lab.dipamd.set_flags(&free);
    lab.dipamd.restart();
    let young = dir.join(format!("{prefix}.201"));
    std::fs::write(&young, b"").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while old.exists() {
        assert!(
            Instant::now() < deadline,
            "the blank reservation was never freed: {}",
            lab.dipamd.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(young.exists(), "a young blank file was freed");
    assert!(lab.dipamd.log().contains("freed a blank reservation"));
    std::fs::remove_file(&young).unwrap();
    lab.rt.del(lab.list(), &pod).unwrap();
    lab.assert_agree();
}

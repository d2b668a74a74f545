//! The chaos test: at least 1,000 ADDs and DELs at 8-way concurrency while dipamd is SIGKILLed
//! at random moments and restarted about 20 times. The harness behaves like a runtime: an ADD
//! that failed is followed by DELs until one succeeds (spec §5), and "try again later" (11) is
//! retried. At the end three records agree exactly: dipamd's ledger, host-local's directory
//! and the harness's own list of live pods; no address is leaked or held twice. The same with
//! the watermark warm pool on (refills, takes, rescues and releases cut by the kills). And
//! dipamd SIGKILLed in the middle of a large parallel GC, with pods being added beside it.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeSet,
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    Attachment, Lab, Replay,
    replay::{self, Rng},
    require_root,
};

const OPS: usize = 1_000;
const RESTARTS: usize = 20;
const WORKERS: usize = 8;

/// The conflist names dipamd's spool explicitly (`spoolDir`), as configs written for older
/// plugins do; the key is only checked against dipamd's spool now.
#[test]
fn sigkill_chaos_leaves_ledger_store_and_runtime_in_agreement() {
    require_root!();
    let lab = Lab::with_flags("ptp-dipam-host-local.conflist", &["--max-queue", "1024"]);
    let spool = lab.dipamd.state_dir().join("spool");
    chaos(
        lab.with_spool_dir_key(&spool),
        OPS,
        RESTARTS,
        "sigkill_chaos_leaves_ledger_store_and_runtime_in_agreement",
    );
}

/// The deployed shape of failure F3a (docs/cfp.md §8.1): dipamd with a non-default `--state-dir` and a conflist without
/// `spoolDir`, as every example in conflist/ is. Every DEL the plugin spooled while dipamd
/// was dead reaches this dipamd's spool; before the plugin found the spool by itself, 36 of
/// 300 operations leaked here, each after a DEL the runtime saw succeed.
#[test]
fn sigkill_chaos_with_a_non_default_state_dir_and_no_spool_dir() {
    require_root!();
    let lab = Lab::with_flags("ptp-dipam-host-local.conflist", &["--max-queue", "1024"]);
    assert_ne!(
        lab.dipamd.state_dir(),
        std::path::Path::new("/var/lib/dipam")
    );
    assert!(!lab.list().to_string().contains("spoolDir"));
    chaos(
        lab,
        300,
        6,
        "sigkill_chaos_with_a_non_default_state_dir_and_no_spool_dir",
    );
}

/// The chaos with the warm pool on and sized by watermarks, its surplus released after 0.2 s:
/// the kills land in refill batches, takes, rescues and releases as well as in pods' ADDs and
/// DELs. At the end the pods' records are exactly the live pods, every other record is a
/// committed pool entry, and the ledger read through delegate keys equals host-local's store.
#[test]
fn sigkill_chaos_with_the_watermark_pool_on() {
    require_root!();
    let lab = Lab::with_flags(
        "ptp-dipam-host-local.conflist",
        &[
            "--max-queue",
            "1024",
            "--node-name",
            "chaospool",
            "--pool-target",
            "4",
            "--pool-max-above",
            "8",
            "--pool-release-after",
            "0.2",
        ],
    );
    chaos(lab, 600, 12, "sigkill_chaos_with_the_watermark_pool_on");
}

/// `ops` operations at least, `restarts` SIGKILLs and restarts, then the agreement checks.
/// `test` names the test, for the replay line a failure prints.
fn chaos(mut lab: Lab, min_ops: usize, min_restarts: usize, test: &str) {
    // A /16-sized pool is not needed: live pods stay well below the /24's 253 addresses.
    let list = lab.list().clone();
    let seed = replay::seed();
    let replay = Replay::new("chaos", test, Some(seed), lab.dipamd.log_path());
    let live: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let ops = AtomicUsize::new(0);
    let restarts = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let rt = &lab.rt;
    let dipamd = &mut lab.dipamd;

    let del_until_ok = |a: &Attachment| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match rt.ipam(&list, 0, "DEL", a, None) {
                Ok(_) => return,
                Err(e) if e.code == 11 && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("DEL {}: {e}", a.container_id),
            }
        }
    };

    /// Ends the workers however the killer leaves the scope (a panic included).
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    std::thread::scope(|s| {
        for w in 0..WORKERS {
            let (live, ops, done, list) = (&live, &ops, &done, &list);
            let del_until_ok = &del_until_ok;
            s.spawn(move || {
                let mut rng = Rng::new(seed.wrapping_add(w as u64 * 7919));
                let mut mine: Vec<Attachment> = Vec::new();
                let mut n = 0;
                while !done.load(Ordering::SeqCst) {
                    ops.fetch_add(1, Ordering::SeqCst);
                    if !mine.is_empty() && (mine.len() > 12 || rng.below(2) == 0) {
                        let i = rng.below(mine.len() as u64) as usize;
                        let a = mine.swap_remove(i);
                        del_until_ok(&a);
                        live.lock().unwrap().remove(&a.container_id);
                    } else {
                        n += 1;
                        let a = Attachment::new(&format!("chaos-{w}-{n}"), "/var/run/netns/none");
                        match rt.ipam(list, 0, "ADD", &a, None) {
                            Ok(_) => {
                                live.lock().unwrap().insert(a.container_id.clone());
                                mine.push(a);
                            }
                            // Whatever the failure, the runtime tears the attachment down,
                            // then backs off before the next sandbox, as kubelet does.
                            Err(_) => {
                                del_until_ok(&a);
                                std::thread::sleep(Duration::from_millis(10 + rng.below(40)));
                            }
                        }
                    }
                }
                // Leave the survivors live: they must be exactly what the ledger holds.
            });
        }
        let _done = Done(&done);
        let mut rng = Rng::new(seed ^ 0xdead_beef);
        while ops.load(Ordering::SeqCst) < min_ops || restarts.load(Ordering::SeqCst) < min_restarts
        {
            std::thread::sleep(Duration::from_millis(50 + rng.below(150)));
            if restarts.load(Ordering::SeqCst) < min_restarts {
                replay.kill(format!(
                    "restart {} after {} operations",
                    restarts.load(Ordering::SeqCst) + 1,
                    ops.load(Ordering::SeqCst)
                ));
                dipamd.kill9();
                std::thread::sleep(Duration::from_millis(rng.below(80)));
                dipamd.start_again();
                restarts.fetch_add(1, Ordering::SeqCst);
            }
        }
        done.store(true, Ordering::SeqCst);
    });
    // Everything spooled while dipamd was down is replayed by a last restart.
    lab.dipamd.restart();
    assert_eq!(lab.spooled(), 0, "{}", lab.dipamd.log());

    let want: Vec<String> = live.into_inner().unwrap().into_iter().collect();
    let net = lab.network();
    // The restart's pool releases its surplus in the background: read the ledger and the
    // store once it has (a read between the two saw one address fewer in the store, seed
    // 1795917580249851190).
    lab.dipamd.wait_settled(&net, || lab.delegate_store());
    let records: Vec<serde_json::Value> = lab
        .dipamd
        .ledger()
        .into_iter()
        .filter(|a| a["network"] == net.as_str())
        .collect();
    // The pods' records; the pool's entries (none without the pool) must all be committed.
    let mut ledger: Vec<String> = records
        .iter()
        .filter(|a| a["owner"] != "pool")
        .map(|a| a["containerID"].as_str().unwrap().to_owned())
        .collect();
    ledger.sort();
    let pooled: Vec<&serde_json::Value> = records.iter().filter(|a| a["owner"] == "pool").collect();
    assert!(
        pooled.iter().all(|a| a["state"] == "committed"),
        "a pool entry left in flight, seed {seed}: {pooled:#?}"
    );
    let store = lab.delegate_store();
    // Pods served from the pool are held by host-local under the pool's keys.
    let by_pod: Vec<String> = records
        .iter()
        .filter(|a| a["owner"] != "pool")
        .filter(|a| {
            let id = a["delegateKey"]["containerID"]
                .as_str()
                .or(a["containerID"].as_str());
            store.iter().any(|(held, _)| Some(held.as_str()) == id)
        })
        .map(|a| a["containerID"].as_str().unwrap().to_owned())
        .collect();
    let mut ips: Vec<&String> = store.iter().map(|(_, ip)| ip).collect();
    ips.sort();
    let before = ips.len();
    ips.dedup();
    let leaked = store.len().saturating_sub(want.len() + pooled.len());
    let missing = want.iter().filter(|id| !by_pod.contains(id)).count();
    eprintln!(
        "chaos: {} ops, {} restarts, {} live pods, {} pooled; {leaked} leaked, {missing} missing, \
         {} doubled",
        ops.load(Ordering::SeqCst),
        restarts.load(Ordering::SeqCst),
        want.len(),
        pooled.len(),
        before - ips.len()
    );
    assert!(ops.load(Ordering::SeqCst) >= min_ops);
    assert_eq!(ips.len(), before, "an address is held twice");
    assert_eq!(
        ledger, want,
        "ledger (left) vs the runtime's live pods (right), seed {seed}"
    );
    assert_eq!(
        (store.len(), missing),
        (want.len() + pooled.len(), 0),
        "host-local holds (left) one address per live pod and pool entry (right), seed {seed}"
    );
    assert_eq!(
        lab.dipamd.delegate_pairs(&net),
        store,
        "ledger through delegate keys (left) vs host-local (right), seed {seed}"
    );
}

/// dipamd SIGKILLed in the middle of a large parallel GC (a random moment after 5 to 150 of
/// 200 stale attachments were logged freed), with pods being added beside it, three times.
/// After each restart the ledger and host-local agree (start-up replay finished every release
/// that was marked), nothing stale that was freed is held, every pod still holds the address
/// it was answered with (nothing was freed twice), and a second GC frees the rest.
#[test]
fn sigkill_in_the_middle_of_a_large_parallel_gc_converges() {
    require_root!();
    const STALE: usize = 200;
    let seed = replay::seed();
    let mut rng = Rng::new(seed);
    let gc_flags = [
        "--gc-grace",
        "0",
        "--gc-max-free-share",
        "1",
        "--gc-parallel",
        "8",
    ];
    let mut lab = Lab::with_flags("ptp-dipam-host-local.conflist", &gc_flags);
    let replay = Replay::new(
        "chaos",
        "sigkill_in_the_middle_of_a_large_parallel_gc_converges",
        Some(seed),
        lab.dipamd.log_path(),
    );
    let list = lab.list().clone();
    let none = "/var/run/netns/none";
    let gc = |rt: &dipam_lifecycle::Runtime, valid: &[&Attachment]| {
        rt.ipam_gc(&list, dipam_lifecycle::runtime::gc_list(valid))
    };
    let add = |rt: &dipam_lifecycle::Runtime, a: &Attachment| {
        rt.ipam(&list, 0, "ADD", a, None)
            .map(|r| dipam_lifecycle::runtime::result_ips(&r).remove(0))
    };
    let keep = Attachment::new(&dipam_lifecycle::unique("keep"), none);
    // Pods the runtime knows, and the address each was answered with.
    let mut live: Vec<(Attachment, String)> = vec![(keep.clone(), add(&lab.rt, &keep).unwrap())];
    for round in 0..3 {
        let stale: Vec<Attachment> = (0..STALE)
            .map(|_| Attachment::new(&dipam_lifecycle::unique("stale"), none))
            .collect();
        std::thread::scope(|s| {
            for part in stale.chunks(STALE / 8) {
                let (rt, add) = (&lab.rt, &add);
                s.spawn(move || {
                    for a in part {
                        add(rt, a).unwrap();
                    }
                });
            }
        });
        let valid: Vec<&Attachment> = live.iter().map(|(a, _)| a).collect();
        let kill_after = 5 + rng.below(146) as usize;
        let freed_before = lab.dipamd.log().matches("GC freed").count();
        let rt = &lab.rt;
        let dipamd = &mut lab.dipamd;
        let (gc_out, born) = std::thread::scope(|s| {
            let g = s.spawn(|| gc(rt, &valid));
            // Pods created beside the GC; an ADD cut by the kill is DELed (spooled while
            // dipamd is down), as a runtime does after a failed ADD.
            let adder = s.spawn(|| {
                let mut born = Vec::new();
                for _ in 0..4 {
                    let a = Attachment::new(&dipam_lifecycle::unique("new"), none);
                    match add(rt, &a) {
                        Ok(ip) => born.push((a, ip)),
                        Err(_) => {
                            rt.ipam(&list, 0, "DEL", &a, None).unwrap();
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                born
            });
            let deadline = Instant::now() + Duration::from_secs(60);
            while dipamd.log().matches("GC freed").count() < freed_before + kill_after {
                assert!(Instant::now() < deadline, "the GC never freed {kill_after}");
                std::thread::sleep(Duration::from_millis(2));
            }
            replay.kill(format!(
                "round {round}: after {} GC freed lines (wanted {kill_after})",
                dipamd.log().matches("GC freed").count() - freed_before
            ));
            dipamd.kill9();
            let out = g.join().unwrap();
            let born = adder.join().unwrap();
            dipamd.start_again();
            (out, born)
        });
        eprintln!(
            "round {round}: killed after {kill_after} freed; the GC saw {:?}",
            gc_out.as_ref().map(|_| ()).map_err(|e| e.code)
        );
        live.extend(born);
        // Replay finished every marked release before serving: nothing is `deleting`.
        assert!(
            !lab.dipamd
                .ledger()
                .iter()
                .any(|r| r["state"] != "committed"),
            "{:?}",
            lab.dipamd.ledger()
        );
        lab.assert_agree();
        let store = lab.delegate_store();
        for (a, ip) in &live {
            assert!(
                store.contains(&(a.container_id.clone(), ip.clone())),
                "round {round}: {} lost {ip} (freed twice?), seed {seed}",
                a.container_id
            );
        }
        let mut ips: Vec<&String> = store.iter().map(|(_, ip)| ip).collect();
        let held = ips.len();
        ips.sort();
        ips.dedup();
        assert_eq!(ips.len(), held, "an address is held twice");
        // A second GC frees the rest, and only the rest.
        let valid: Vec<&Attachment> = live.iter().map(|(a, _)| a).collect();
        gc(&lab.rt, &valid).unwrap_or_else(|e| panic!("round {round}: second GC: {e}"));
        let mut want: Vec<(String, String)> = live
            .iter()
            .map(|(a, ip)| (a.container_id.clone(), ip.clone()))
            .collect();
        want.sort();
        assert_eq!(lab.delegate_store(), want, "round {round}, seed {seed}");
        lab.assert_agree();
    }
}

//! Races and ordering. DELs get through while ADDs fill their queue; a delegate's duplicate
//! address is refused; two identical main-mode ADDs at once never undo each other's work (a
//! wall-clock step is in tests/daemon/clock.rs, which must run alone). Real dipamd, real host-local, real
//! netns, the real plugin; the ledger and host-local compared after each case.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{sync::mpsc, time::Duration};

use dipam_lifecycle::{Attachment, Lab, Runtime, hostlocal, require_root};
use serde_json::Value;

fn store(lab: &Lab) -> Vec<(String, String, String)> {
    hostlocal::reservations(lab.data.path(), &lab.network())
}

/// ADDs hang on a slow delegate with their queue full; 20 DELs sent then all succeed (they
/// were all refused with 11 when both shared one queue). Afterwards every ADD is a success
/// or an 11, and the ledger and host-local agree.
#[test]
fn dels_get_through_while_adds_fill_their_queue() {
    require_root!();
    let gate = tempfile::tempdir().unwrap();
    let open = gate.path().join("open");
    let mut lab = Lab::with_flags(
        "ptp-dipam-host-local.conflist",
        &["--max-concurrent", "4", "--max-queue", "24"],
    );
    // ADDs wait for the gate (bounded, so that a failed test does not leave it hanging).
    let (_dir, rt) = Runtime::with_standins(&[(
        "gate-ipam",
        &format!(
            "if [ \"$CNI_COMMAND\" = ADD ]; then\n\
               i=0; while [ ! -e {} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\n\
             fi\n\
             exec /usr/lib/cni/host-local",
            open.display()
        ),
    )]);
    lab.fx.list["plugins"][0]["ipam"]["delegate"]["type"] = "gate-ipam".into();
    // One key: the first ADD waits in the delegate, the next ones on its key lock (holding
    // their slots), the rest in the queue, and then the queue is full.
    let stuck = Attachment::new("stuck", "/var/run/netns/none");
    let (tx, rx) = mpsc::channel();
    let (dels, outcomes) = std::thread::scope(|s| {
        let adds: Vec<_> = (0..32)
            .map(|_| {
                let (rt, list, att, tx) = (&rt, lab.list(), &stuck, tx.clone());
                s.spawn(move || {
                    let r = rt
                        .ipam(list, 0, "ADD", att, None)
                        .map(|_| ())
                        .map_err(|e| e.code);
                    let _ = tx.send(r);
                    r
                })
            })
            .collect();
        // The queue is full once an ADD is refused (the others wait for the gate).
        let first = rx.recv_timeout(Duration::from_secs(60));
        let dels: Vec<_> = (0..20)
            .map(|i| {
                let (rt, list) = (&rt, lab.list());
                s.spawn(move || {
                    let att = Attachment::new(&format!("gone-{i}"), "/var/run/netns/none");
                    rt.ipam(list, 0, "DEL", &att, None)
                        .map(|_| ())
                        .map_err(|e| e.code)
                })
            })
            .collect();
        let dels: Vec<Result<(), u64>> = dels.into_iter().map(|h| h.join().unwrap()).collect();
        std::fs::write(&open, b"").unwrap();
        let outcomes: Vec<Result<(), u64>> = adds.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(first, Ok(Err(11)), "the ADD queue did not fill");
        (dels, outcomes)
    });
    assert_eq!(dels, vec![Ok(()); 20], "DELs refused behind the ADDs");
    assert!(
        outcomes.iter().all(|o| o.is_ok() || *o == Err(11)),
        "{outcomes:?}"
    );
    assert!(outcomes.iter().any(Result::is_ok), "{outcomes:?}");
    assert_eq!(lab.ledger().len(), 1);
    assert_eq!(store(&lab).len(), 1);
    rt.ipam(lab.list(), 0, "DEL", &stuck, None).unwrap();
    assert!(lab.ledger().is_empty());
    assert!(store(&lab).is_empty());
}

/// Two host-local stores on one range under one network: the second pod's delegate hands
/// out the first pod's address. It is refused with 156 and released from the second store,
/// the conflict is counted, and the first pod keeps its address.
#[test]
fn a_duplicate_address_from_the_delegate_is_refused_with_156() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let other = tempfile::tempdir().unwrap();
    let mut second = lab.list().clone();
    second["plugins"][0]["ipam"]["delegate"]["dataDir"] = other.path().display().to_string().into();
    let first = Attachment::new("dup-first", "/var/run/netns/none");
    let again = Attachment::new("dup-second", "/var/run/netns/none");
    let r = lab.rt.ipam(lab.list(), 0, "ADD", &first, None).unwrap();
    let e = lab.rt.ipam(&second, 0, "ADD", &again, None).unwrap_err();
    assert_eq!(e.code, 156, "{e:?}");
    assert!(e.details.contains("dup-first"), "{e:?}");
    assert_eq!(lab.ledger().len(), 1);
    lab.assert_agree();
    assert!(
        hostlocal::reservations(other.path(), &lab.network()).is_empty(),
        "the refused duplicate is still held in the second store"
    );
    let status: Value =
        serde_json::from_slice(&lab.dipamd.ctl(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["conflictsDetected"], 1, "{status}");
    // The holder is untouched and releases normally.
    lab.rt
        .ipam(lab.list(), 0, "CHECK", &first, Some(&r))
        .unwrap();
    lab.rt.ipam(lab.list(), 0, "DEL", &first, None).unwrap();
    assert!(lab.ledger().is_empty());
    lab.assert_agree();
}

/// Two identical main-mode ADDs at once (a runtime bug, but it happens), six times: one
/// succeeds, the other fails with 160 and undoes nothing of the winner's (once, one returned
/// success with its address released, or success with no eth0, the other call's rollback
/// having deleted the shared host veth). The winner's pod has eth0 with the address the
/// ledger and host-local hold, its host veth is up, and DEL then leaves nothing.
#[test]
fn two_identical_main_mode_adds_at_once_never_undo_each_other() {
    require_root!();
    let lab = Lab::new("dipam-host-local-1.1.0.conflist");
    for trial in 0..6 {
        let (ns, att) = lab.pod();
        let config = serde_json::to_vec(&Runtime::plugin_config(lab.list(), 0, None)).unwrap();
        let outcomes: Vec<Result<Value, u64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let (rt, att, config) = (&lab.rt, &att, &config);
                    s.spawn(move || {
                        rt.exec("dipam", "ADD", att, config)
                            .into_result("dipam")
                            .map_err(|e| e.code)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won: Vec<&Value> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
        assert_eq!(won.len(), 1, "trial {trial}: {outcomes:?}");
        assert!(outcomes.contains(&Err(160)), "trial {trial}: {outcomes:?}");
        let result = won[0];
        let addr = result["ips"][0]["address"].as_str().unwrap();
        let ip = addr.split('/').next().unwrap();
        let eth0 = ns.exec(&["ip", "-o", "addr", "show", "dev", "eth0"]);
        assert!(
            String::from_utf8_lossy(&eth0.stdout).contains(addr),
            "trial {trial}: eth0 lacks {addr}: {}",
            String::from_utf8_lossy(&eth0.stdout)
        );
        let host = result["interfaces"][0]["name"].as_str().unwrap();
        let link = std::process::Command::new("ip")
            .args(["-o", "link", "show", "dev", host])
            .output()
            .unwrap();
        let link = String::from_utf8_lossy(&link.stdout).into_owned();
        assert!(link.contains(",UP"), "trial {trial}: {host}: {link}");
        let ledger = lab.dipamd.ledger_ips(&lab.network());
        assert_eq!(ledger.len(), 1, "trial {trial}: {ledger:?}");
        assert_eq!(ledger[0].2, ip, "trial {trial}: {ledger:?}");
        lab.assert_agree();
        lab.rt
            .exec("dipam", "DEL", &att, &config)
            .into_result("dipam")
            .unwrap();
        assert!(lab.ledger().is_empty(), "trial {trial}");
        lab.assert_agree();
    }
}

//! F22 and F7, the CFP's worst case: the delegate's state directory dipamd sees is not the
//! runtime's, or does not persist. dipamd detects it, refuses pod ADDs with a message that
//! says which mount to fix, STATUS reports 51, and `dipamctl doctor` prints every check.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::{Lab, require_root};

#[test]
fn a_store_that_lost_every_pod_refuses_add_and_doctor_says_why() {
    require_root!();
    let mut lab = Lab::new("ptp-dipam-host-local.conflist");
    let pods: Vec<_> = (0..3).map(|_| lab.pod()).collect();
    for (_, p) in &pods {
        lab.rt.ipam(lab.list(), 0, "ADD", p, None).unwrap();
    }
    assert!(lab.dipamd.terminate().success());
    // As if dipamd now saw an empty, unshared or non-persistent directory.
    let dir = lab.data.path().join(lab.network());
    for e in std::fs::read_dir(&dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    lab.dipamd.start_again();

    let (_ns, fresh) = lab.pod();
    let e = lab.rt.ipam(lab.list(), 0, "ADD", &fresh, None).unwrap_err();
    assert_eq!(e.code, 159, "{e}");
    assert!(e.details.contains(&dir.display().to_string()), "{e}");
    assert!(e.details.contains("Mount"), "{e}");
    assert!(lab.delegate_store().is_empty(), "nothing was allocated");

    let doctor = lab.dipamd.ctl(&["doctor"]);
    assert!(!doctor.status.success());
    let text = String::from_utf8_lossy(&doctor.stdout);
    assert!(text.contains("FAIL") && text.contains("missing"), "{text}");
    assert!(text.contains("fix:"), "{text}");

    // DEL still works (the runtime tears down the pods it knows).
    for (_, p) in &pods {
        lab.rt.ipam(lab.list(), 0, "DEL", p, None).unwrap();
    }
}

#[test]
fn a_tmpfs_delegate_store_under_a_persistent_ledger_is_refused() {
    require_root!();
    let lab = Lab::with_flags(
        "ptp-dipam-host-local.conflist",
        &["--reconcile-interval", "1"],
    );
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(lab.data.path())
        .status()
        .unwrap();
    assert!(status.success());
    struct Umount(std::path::PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _umount = Umount(lab.data.path().to_owned());

    let (_a, first) = lab.pod();
    lab.rt.ipam(lab.list(), 0, "ADD", &first, None).unwrap();
    // The next reconcile knows the network and finds its store on tmpfs.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (_b, second) = lab.pod();
    let e = loop {
        match lab.rt.ipam(lab.list(), 0, "ADD", &second, None) {
            Err(e) if e.code == 159 => break e,
            Ok(_) => {
                lab.rt.ipam(lab.list(), 0, "DEL", &second, None).unwrap();
            }
            Err(e) => panic!("{e}"),
        }
        assert!(std::time::Instant::now() < deadline, "{}", lab.dipamd.log());
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(e.details.contains("tmpfs"), "{e}");
    lab.rt.ipam(lab.list(), 0, "DEL", &first, None).unwrap();
}

/// A conflist swapped under running pods (here: its network renamed): the runtime DELs the
/// pods through the new network, where the delegate holds nothing, and the DEL succeeds
/// while the address stays held on the old network. dipamd sees it at once: a WARN naming
/// both networks and a failed doctor line; the address is not freed by it (only seen).
#[test]
fn a_del_through_a_swapped_conflist_is_seen_at_once() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let (_ns, pod) = lab.pod();
    lab.rt.ipam(lab.list(), 0, "ADD", &pod, None).unwrap();
    let held = lab.delegate_store();
    let old = lab.network();
    let new = format!("{old}-swapped");
    let mut swapped = lab.list().clone();
    swapped["name"] = new.clone().into();

    lab.rt.ipam(&swapped, 0, "DEL", &pod, None).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let doctor = loop {
        let out = lab.dipamd.ctl(&["doctor"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("DELed on network") || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        doctor.contains(&format!(
            "container {} DELed on network {new:?}, held on {old}",
            pod.container_id
        )),
        "{doctor}"
    );
    let log = lab.dipamd.log();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("held_on")
            && l.contains(&old)
            && l.contains(&new)),
        "no WARN naming both networks:\n{log}"
    );
    // Seen, not freed: the old network's address is still the delegate's and the ledger's.
    assert_eq!(lab.delegate_store(), held);
    lab.assert_agree();

    // A repeated DEL of a key already released is a runtime's retry, not a crossing.
    lab.rt.ipam(lab.list(), 0, "DEL", &pod, None).unwrap();
    lab.rt.ipam(lab.list(), 0, "DEL", &pod, None).unwrap();
    assert!(lab.delegate_store().is_empty());
}

//! A step of the machine's wall clock between a key's ADD and DEL changes no outcome
//! (docs/cfp.md F29): dipamd orders a key's operations on CLOCK_BOOTTIME with the boot id,
//! never on the wall clock. The step is real (CLOCK_REALTIME, for the whole machine), so this
//! file holds one test only: nothing else may run while the clock is off.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::{Attachment, Lab, Runtime, clock::ClockStep, hostlocal, require_root};
use serde_json::Value;

const HOUR_MS: i64 = 3_600_000;

/// A DEL made after the wall clock was stepped back an hour releases the attachment (it was
/// once logged as stale at INFO, reported a success, and the address stayed held); an ADD
/// made after a DEL whose clock ran an hour ahead is not refused as stale.
#[test]
fn a_wall_clock_step_does_not_change_the_outcome() {
    require_root!();
    let mut lab = Lab::new("ptp-dipam-host-local.conflist");
    let (_ns, att) = lab.pod();
    let config = serde_json::to_vec(&Runtime::plugin_config(lab.list(), 0, None)).unwrap();
    let run = |command: &str, step_ms: i64| {
        let _step = (step_ms != 0).then(|| ClockStep::by_ms(step_ms));
        lab.rt
            .exec_env("dipam", command, &att, &config, &[])
            .into_result("dipam")
    };
    // The step is real for the plugin: a DEL spooled while dipamd is down is stamped an hour
    // back on the wall clock (and on the boot clock, now).
    lab.dipamd.kill9();
    let probe = Attachment::new("clock-probe", "/var/run/netns/none");
    {
        let _step = ClockStep::by_ms(-HOUR_MS);
        lab.rt
            .exec_env("dipam", "DEL", &probe, &config, &[])
            .into_result("dipam")
            .unwrap();
    }
    let spool = lab.dipamd.state_dir().join("spool");
    let file = std::fs::read_dir(&spool)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.path().extension().is_some_and(|x| x == "json"))
        .unwrap_or_else(|| panic!("nothing spooled in {}", spool.display()));
    let spooled: Value = serde_json::from_slice(&std::fs::read(file.path()).unwrap()).unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let behind = now_ms.saturating_sub(spooled["issuedAtMs"].as_u64().unwrap());
    assert!(
        behind > 3_500_000,
        "the wall clock was not stepped for the plugin: {behind} ms"
    );
    assert!(spooled["issuedAt"]["ns"].as_u64().is_some(), "{spooled}");
    lab.dipamd.start_again();
    assert_eq!(lab.spooled(), 0);

    // ADD now, DEL an hour "earlier": released.
    run("ADD", 0).unwrap();
    assert_eq!(lab.ledger().len(), 1);
    run("DEL", -HOUR_MS).unwrap();
    assert!(
        lab.ledger().is_empty(),
        "a DEL after a step back was dropped"
    );
    assert!(hostlocal::reservations(lab.data.path(), &lab.network()).is_empty());
    // DEL an hour "ahead", then ADD now: an ordinary ADD, not refused as stale (3).
    run("ADD", 0).unwrap();
    run("DEL", HOUR_MS).unwrap();
    run("ADD", 0).unwrap();
    assert_eq!(lab.ledger().len(), 1);
    lab.assert_agree();
    run("DEL", 0).unwrap();
    assert!(lab.ledger().is_empty());
    lab.assert_agree();
    assert!(!lab.dipamd.log().contains("not releasing the current one"));
}

//! The README's first command runs this demo on a fresh machine; the suite runs it too, so
//! that the story it tells (main mode, the agent's addresses from the pods' IPAM, a crash, a
//! GC that keeps them, a DEL spooled while dipamd is down) keeps holding. The demo checks each
//! step itself and exits non-zero when one does not hold.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::require_root;

#[test]
fn the_demo_tells_the_main_job_and_every_step_holds() {
    require_root!();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dipam-demo"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for n in 1..=6 {
        assert!(
            stdout.contains(&format!("\n== {n}. ")),
            "step {n} missing:\n{stdout}"
        );
    }
    assert_eq!(stdout.matches("-> notice: ").count(), 5, "{stdout}");
    assert!(stdout.contains("done: every step held."), "{stdout}");
    // The agent's three roles are on screen, and so is the ledger's view of the pods.
    for role in ["router", "health", "ingress"] {
        assert!(stdout.contains(role), "{role} not shown:\n{stdout}");
    }
}

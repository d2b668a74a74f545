//! F15: a corrupt ledger. dipamd refuses to start, saying why; `dipamctl recover` moves it
//! aside and rebuilds it from host-local's own directory, after which dipamd serves again
//! with every pod and agent address accounted for and the agent's address unchanged.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::process::Stdio;

use dipam_lifecycle::{AgentLab, Attachment, daemon::recover, require_root};

#[test]
fn corrupt_ledger_is_refused_then_rebuilt_from_host_local() {
    require_root!();
    let mut lab = AgentLab::new("ptp-dipam-host-local.conflist", "router", &[]);
    lab.wait_ready(1);
    let router = lab.addresses();
    let ns = dipam_lifecycle::NetNs::new();
    let pods: Vec<Attachment> = (0..3)
        .map(|i| Attachment::new(&format!("recover-{i}"), &ns.path()))
        .collect();
    for p in &pods {
        lab.rt.ipam(&lab.fx.list, 0, "ADD", p, None).unwrap();
    }
    let before = lab.ledger();
    assert_eq!(before.len(), 4);
    assert!(lab.dipamd.terminate().success());

    // Garble the middle of sled's log.
    lab.dipamd.garble_ledger();
    let refused = lab.dipamd.command().stdout(Stdio::null()).output().unwrap();
    assert!(!refused.status.success(), "dipamd served a corrupt ledger");
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("state") || why.contains("corrupt") || why.contains("unreadable"),
        "{why}"
    );

    let report = recover(
        &lab.dipamd.state_dir(),
        &lab.conflist_path(),
        "/usr/lib/cni",
    );
    assert_eq!(report["pods"], 3, "{report}");
    assert_eq!(report["agent"], 1, "{report}");
    assert!(report["movedAside"].as_str().unwrap().contains(".corrupt-"));

    lab.dipamd.start_again();
    lab.wait_ready(1);
    assert_eq!(lab.ledger(), before);
    assert_eq!(lab.addresses(), router, "the agent's address changed");
    lab.assert_agree();
    for p in &pods {
        lab.rt.ipam(&lab.fx.list, 0, "DEL", p, None).unwrap();
    }
    assert_eq!(lab.delegate_store().len(), 1);
    lab.assert_agree();
}

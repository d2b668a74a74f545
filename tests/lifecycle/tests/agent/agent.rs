//! The agent's own addresses (router, health, ingress) through the delegated IPAM: stable
//! across restarts (SIGKILL included), released when a role is turned off, re-established
//! when the delegate's store is wiped, waiting for a conflist that appears late, and never
//! handed to a pod.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use dipam_lifecycle::{AgentLab, require_root, runtime::result_ips};

/// The same agent addresses across 20 restarts, half of them SIGKILL; the ledger and the
/// delegate's store agree after each one and hold exactly one address per role.
fn stable_across_restarts(conflist: &str) {
    let mut lab = AgentLab::new(conflist, "router,health,ingress", &[]);
    lab.wait_ready(3);
    let first = lab.addresses();
    let ips: Vec<&str> = first.iter().map(|a| a.2.as_str()).collect();
    assert!(ips.iter().all(|ip| !ip.is_empty()), "{first:?}");
    let mut distinct = ips.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "roles share an address: {first:?}");
    lab.assert_agree();
    for i in 0..20 {
        if i % 2 == 0 {
            lab.dipamd.kill9();
        } else {
            assert!(lab.dipamd.terminate().success());
        }
        lab.dipamd.start_again();
        lab.wait_ready(3);
        assert_eq!(
            lab.addresses(),
            first,
            "restart {i} changed the agent's addresses"
        );
        assert_eq!(
            lab.delegate_store().len(),
            3,
            "restart {i} leaked or lost one"
        );
        lab.assert_agree();
    }
}

#[test]
fn stable_across_20_restarts_host_local() {
    require_root!();
    stable_across_restarts("ptp-dipam-host-local.conflist");
}

#[test]
fn stable_across_20_restarts_azure() {
    require_root!();
    stable_across_restarts("ptp-dipam-azure.conflist");
}

/// A role dropped from --agent-roles is released at the next start (the CFP's
/// "feature turned off leaks its address" gap), for both delegates.
#[test]
fn disabled_role_is_released_at_next_start() {
    require_root!();
    for conflist in ["ptp-dipam-host-local.conflist", "ptp-dipam-azure.conflist"] {
        let mut lab = AgentLab::new(conflist, "router,health", &[]);
        lab.wait_ready(2);
        let router = lab
            .addresses()
            .into_iter()
            .find(|a| a.0 == "router")
            .unwrap();
        lab.dipamd.kill9();
        lab.set_roles("router", &[]);
        lab.dipamd.start_again();
        lab.wait_ready(1);
        assert_eq!(lab.addresses(), vec![router.clone()]);
        assert_eq!(
            lab.delegate_store().len(),
            1,
            "{conflist}: health was not released"
        );
        lab.assert_agree();
    }
}

/// host-local's store wiped behind dipamd's back: the next check notices, the same addresses
/// are taken again, and it is reported (status counter, agent message, log).
#[test]
fn wiped_store_is_detected_and_reestablished() {
    require_root!();
    let lab = AgentLab::new(
        "ptp-dipam-host-local.conflist",
        "router,health",
        &["--agent-check-interval", "1"],
    );
    lab.wait_ready(2);
    let before = lab.addresses();
    let dir = lab.data.path().join(lab.network());
    for e in std::fs::read_dir(&dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    assert!(lab.delegate_store().is_empty());
    let deadline = Instant::now() + Duration::from_secs(15);
    while lab.delegate_store().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "not re-established:\n{}",
            lab.dipamd.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    lab.wait_ready(2);
    assert_eq!(
        lab.addresses(),
        before,
        "re-established at different addresses"
    );
    lab.assert_agree();
    let status: serde_json::Value =
        serde_json::from_slice(&lab.dipamd.ctl(&["status", "--json"]).stdout).unwrap();
    assert!(
        status["agentReestablished"].as_u64().unwrap() >= 2,
        "{status}"
    );
    let list = lab.agent(&["list"]);
    assert!(list.to_string().contains("re-established"), "{list}");
    assert!(lab.dipamd.log().contains("re-establishing"));
}

/// The conflist does not exist when dipamd starts: dipamd waits and says so, serves pods
/// meanwhile, and takes the agent's addresses as soon as the file appears.
#[test]
fn conflist_appearing_after_start() {
    require_root!();
    let mut lab = AgentLab::unstarted("ptp-dipam-host-local.conflist");
    lab.set_roles("router", &[]);
    lab.dipamd.start_again();
    let list = lab.agent(&["list"]);
    assert!(
        list["waiting"]
            .as_str()
            .unwrap()
            .contains("waiting for conflist"),
        "{list}"
    );
    let status: serde_json::Value =
        serde_json::from_slice(&lab.dipamd.ctl(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["ready"], false);
    assert!(
        status["notReady"]
            .to_string()
            .contains("waiting for conflist"),
        "{status}"
    );
    assert!(lab.dipamd.log().contains("waiting for conflist"));

    // Pod requests carry their own config and are served while the agent waits.
    let ns = dipam_lifecycle::NetNs::new();
    let att = dipam_lifecycle::Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
    let pod = lab.rt.ipam(&lab.fx.list, 0, "ADD", &att, None).unwrap();
    assert_eq!(result_ips(&pod).len(), 1);

    lab.write_conflist();
    lab.wait_ready(1);
    let router = &lab.addresses()[0];
    assert_ne!(router.2.split('/').next().unwrap(), result_ips(&pod)[0]);
    let status: serde_json::Value =
        serde_json::from_slice(&lab.dipamd.ctl(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["ready"], true, "{status}");
    lab.assert_agree();
    lab.rt.ipam(&lab.fx.list, 0, "DEL", &att, None).unwrap();
}

/// A pod ADD whose result holds an agent address (the delegate's store was wiped, or another
/// IPAM owns the range) is refused and rolled back, counted, and the agent's address is
/// re-established; the pod's retry gets another address.
#[test]
fn pod_add_never_gets_an_agent_address() {
    require_root!();
    let lab = AgentLab::new(
        "ptp-dipam-host-local.conflist",
        "router",
        &["--agent-check-interval", "3600"],
    );
    lab.wait_ready(1);
    let router = lab.addresses()[0].2.split('/').next().unwrap().to_owned();
    let dir = lab.data.path().join(lab.network());
    for e in std::fs::read_dir(&dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    // host-local, its memory wiped, hands out the first address again: the router's.
    let ns = dipam_lifecycle::NetNs::new();
    let att = dipam_lifecycle::Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
    let e = lab.rt.ipam(&lab.fx.list, 0, "ADD", &att, None).unwrap_err();
    assert_eq!(e.code, 156, "{e}");
    assert!(
        e.msg.contains(&router) && e.msg.contains("agent:router"),
        "{e}"
    );
    assert!(
        !lab.delegate_store()
            .iter()
            .any(|(id, _)| *id == att.container_id),
        "the refused pod allocation was not rolled back"
    );
    let status: serde_json::Value =
        serde_json::from_slice(&lab.dipamd.ctl(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["conflictsDetected"], 1, "{status}");
    assert!(lab.dipamd.log().contains("address conflict"));

    // The conflict woke the agent loop: the router's address is held again.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !lab.delegate_store().iter().any(|(_, ip)| *ip == router) {
        assert!(
            Instant::now() < deadline,
            "router not re-established:\n{}",
            lab.dipamd.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let retry = lab.rt.ipam(&lab.fx.list, 0, "ADD", &att, None).unwrap();
    assert_ne!(result_ips(&retry)[0], router);
    lab.assert_agree();
    lab.rt.ipam(&lab.fx.list, 0, "DEL", &att, None).unwrap();
}

/// The agent turns a role on and off at runtime; the choice survives a plain restart, and a
/// watcher sees each change.
#[test]
fn allocate_release_and_watch_at_runtime() {
    require_root!();
    let mut lab = AgentLab::new("ptp-dipam-host-local.conflist", "router", &[]);
    lab.wait_ready(1);
    let mut watch = std::process::Command::new(dipam_lifecycle::bins::bin("dipamctl"))
        .arg("--socket")
        .arg(lab.dipamd.socket())
        .args(["agent", "watch", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let reply = lab.agent(&["allocate", "health"]);
    let health = dipam_lifecycle::entry(&reply["addresses"], "role", "health").clone();
    assert_eq!(health["state"], "ready", "{reply}");
    assert_eq!(lab.delegate_store().len(), 2);

    lab.dipamd.kill9();
    lab.dipamd.start_again();
    lab.wait_ready(2);
    lab.agent(&["release", "health"]);
    assert_eq!(lab.delegate_store().len(), 1);
    lab.dipamd.kill9();
    lab.dipamd.start_again();
    lab.wait_ready(1);
    assert_eq!(lab.delegate_store().len(), 1);
    lab.assert_agree();

    // The watcher saw the initial list and then the health address appear.
    let _ = watch.kill();
    let out = watch.wait_with_output().unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(lines.len() >= 2, "{lines:?}");
    assert!(lines[0].to_string().contains("router"));
    assert!(
        lines
            .iter()
            .any(|l| l.to_string().contains(health["ip"].as_str().unwrap()))
    );

    let e = lab.dipamd.ctl(&["agent", "allocate", "dns"]);
    assert!(!e.status.success());
    assert!(String::from_utf8_lossy(&e.stderr).contains("unknown agent role"));
}

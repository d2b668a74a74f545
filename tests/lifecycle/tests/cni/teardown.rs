//! Main mode's DEL hands the pod veth's deletion to dipamd (shim-server teardown.rs): the
//! runtime's DEL returns once the address is released and the host end is retired (down, no
//! routes, marked), and dipamd deletes it moments later, in batches. These tests hold that to
//! account with real veths: the link does go, a leftover of a crash goes at the next start,
//! links that are not retired survive, a re-ADD into a netns that outlived
//! its DEL works, and a dipamd that cannot take the deletion leaves it to the plugin.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use dipam_lifecycle::{Lab, NetNs, require_root};
use dipam_proto::retired;
use serde_json::Value;

fn ip(args: &[&str]) -> std::process::Output {
    Command::new("ip").args(args).output().expect("run ip")
}

fn link_exists(name: &str) -> bool {
    ip(&["link", "show", "dev", name]).status.success()
}

fn gone_within(name: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while link_exists(name) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

fn host_end(result: &Value) -> String {
    result["interfaces"][0]["name"]
        .as_str()
        .expect("host interface")
        .to_owned()
}

/// A veth pair on the host retired the way the plugin does it (down, alias), as a plugin or
/// dipamd killed mid-DEL would leave it.
fn make_retired(name: &str, peer: &str) {
    let made = ip(&["link", "add", name, "type", "veth", "peer", "name", peer]);
    assert!(made.status.success(), "{made:?}");
    let alias = format!("{}net {name} eth0", retired::ALIAS_PREFIX);
    assert!(
        ip(&["link", "set", "dev", name, "down", "alias", &alias])
            .status
            .success()
    );
}

/// Deletes the named host links when the test ends, however it ends.
struct Links(Vec<String>);

impl Drop for Links {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = ip(&["link", "del", name]);
        }
    }
}

#[test]
fn del_returns_before_the_veth_is_deleted_and_dipamd_deletes_it() {
    require_root!();
    let lab = Lab::new("dipam-host-local-1.1.0.conflist");
    let pods: Vec<_> = (0..6).map(|_| lab.pod()).collect();
    let mut hosts = Vec::new();
    for (_, att) in &pods {
        let result = lab
            .rt
            .add(lab.list(), att)
            .unwrap_or_else(|e| panic!("{e}"));
        hosts.push((host_end(&result), result));
    }
    // Six DELs back to back: their veths are deleted by dipamd, several per kernel call.
    for (_, att) in &pods {
        lab.rt
            .del(lab.list(), att)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(lab.ledger().is_empty());
    lab.assert_agree();
    for (host, result) in &hosts {
        // At once: no route to the released address is left on the host.
        for ip_addr in dipam_lifecycle::runtime::result_ips(result) {
            let addr = ip_addr.split('/').next().unwrap().to_owned();
            let routes =
                String::from_utf8_lossy(&ip(&["route", "show", &addr]).stdout).into_owned();
            assert!(
                !routes.contains(host.as_str()),
                "route to {addr} via {host} left: {routes}"
            );
        }
        assert!(
            gone_within(host, Duration::from_secs(5)),
            "dipamd did not delete {host}:\n{}",
            lab.dipamd.log()
        );
    }
    for (ns, att) in &pods {
        let left =
            String::from_utf8_lossy(&ns.exec(&["ip", "-o", "link", "show"]).stdout).into_owned();
        assert!(!left.contains(&att.ifname), "{left}");
    }
}

#[test]
fn retired_veths_left_by_a_crash_go_at_the_next_start_and_foreign_links_stay() {
    require_root!();
    let mut lab = Lab::new("dipam-host-local-1.1.0.conflist");
    lab.dipamd.kill9();
    let i = lab.subnet.index;
    let retired_names: Vec<String> = (0..3).map(|n| format!("dpr{n}x{i}")).collect();
    let (admin, live) = (format!("dprX{i}"), format!("dprL{i}"));
    let mut all = retired_names.clone();
    all.extend([admin.clone(), live.clone()]);
    let _cleanup = Links(all);
    for (n, name) in retired_names.iter().enumerate() {
        make_retired(name, &format!("dpr{n}p{i}"));
    }
    // An administrator's link in a group of its own, and a live (not retired) dipam veth:
    // neither is dipamd's to delete, batch or not.
    for (name, peer) in [(&admin, format!("dprXp{i}")), (&live, format!("dprLp{i}"))] {
        let made = ip(&["link", "add", name, "type", "veth", "peer", "name", &peer]);
        assert!(made.status.success(), "{made:?}");
    }
    assert!(
        ip(&["link", "set", "dev", &admin, "group", "7"])
            .status
            .success()
    );
    let alias = format!("dipam net {live} eth0");
    assert!(
        ip(&["link", "set", "dev", &live, "alias", &alias])
            .status
            .success()
    );

    lab.dipamd.start_again();
    let gone: Vec<bool> = retired_names
        .iter()
        .map(|n| gone_within(n, Duration::from_secs(5)))
        .collect();
    assert!(
        gone.iter().all(|g| *g),
        "retired veths outlived the start ({gone:?}):\n{}",
        lab.dipamd.log()
    );
    assert!(
        link_exists(&admin),
        "dipamd deleted an administrator's link"
    );
    assert!(link_exists(&live), "dipamd deleted a live veth");
}

#[test]
fn a_netns_that_outlives_its_del_takes_the_same_interface_again() {
    require_root!();
    let lab = Lab::new("dipam-host-local-1.1.0.conflist");
    let (ns, att) = lab.pod();
    for round in 0..5 {
        let result = lab
            .rt
            .add(lab.list(), &att)
            .unwrap_or_else(|e| panic!("round {round} ADD: {e}"));
        let out = ns.exec(&["ip", "-o", "addr", "show", "dev", &att.ifname]);
        let shown = String::from_utf8_lossy(&out.stdout).into_owned();
        for addr in dipam_lifecycle::runtime::result_ips(&result) {
            assert!(
                shown.contains(&addr),
                "round {round}: {addr} not on {}: {shown}",
                att.ifname
            );
        }
        lab.rt
            .del(lab.list(), &att)
            .unwrap_or_else(|e| panic!("round {round} DEL: {e}"));
    }
    assert!(lab.ledger().is_empty());
    lab.assert_agree();
}

#[test]
fn a_dipamd_in_another_netns_leaves_the_deletion_to_the_plugin() {
    require_root!();
    let mut lab = Lab::new("dipam-host-local-1.1.0.conflist");
    let elsewhere = NetNs::new();
    lab.dipamd.kill9();
    lab.dipamd.run_in_netns(&elsewhere.name);
    lab.dipamd.start_again();
    let (_ns, att) = lab.pod();
    let result = lab
        .rt
        .add(lab.list(), &att)
        .unwrap_or_else(|e| panic!("{e}"));
    let host = host_end(&result);
    lab.rt
        .del(lab.list(), &att)
        .unwrap_or_else(|e| panic!("{e}"));
    // dipamd cannot see the host's links from its netns, so it must not take the deletion:
    // the plugin deleted the veth before answering.
    assert!(
        !link_exists(&host),
        "{host} outlived DEL with dipamd elsewhere"
    );
    assert!(lab.ledger().is_empty());
    lab.assert_agree();
}

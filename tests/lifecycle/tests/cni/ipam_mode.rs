//! dipam as the IPAM of a main plugin: ADD, CHECK, DEL and a second DEL at every cniVersion,
//! against the real host-local and the real azure-vnet-ipam (src/azure.rs), with the ledger
//! and the delegate's store compared after every step.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::{Lab, require_root, runtime::result_ips};
use serde_json::Value;

/// The layout rule of spec §4.1: 0.3.x/0.4.0 results carry `ips[].version`, 1.x do not, and
/// the result is in exactly the config's version.
#[track_caller]
fn assert_layout(result: &Value, version: &str) {
    assert_eq!(result["cniVersion"], version, "{result}");
    let legacy = version.starts_with("0.");
    for ip in result["ips"].as_array().expect("ips") {
        assert_eq!(ip.get("version").is_some(), legacy, "{version}: {ip}");
    }
}

/// ptp (Debian's 1.1.1) + dipam + delegate, at a version ptp supports.
fn chain_lifecycle(conflist: &str, version: &str) {
    let lab = Lab::new(conflist).with_version(version);
    let (ns, att) = lab.pod();

    let result = lab
        .rt
        .add(lab.list(), &att)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    assert_layout(&result, version);
    let ips = result_ips(&result);
    assert_eq!(ips.len(), 1, "{result}");
    assert!(
        lab.subnet.contains(&ips[0]),
        "{ips:?} not in {}",
        lab.subnet.cidr
    );
    // ptp applied the address from dipam's result inside the pod's netns.
    let addr = ns.exec(&["ip", "-o", "addr", "show", "eth0"]);
    assert!(
        String::from_utf8_lossy(&addr.stdout).contains(&format!("{}/", ips[0])),
        "{}",
        String::from_utf8_lossy(&addr.stdout)
    );
    assert_eq!(
        lab.ledger(),
        vec![(att.container_id.clone(), ips[0].clone())]
    );
    lab.assert_agree();

    if version != "0.3.1" {
        lab.rt
            .check(lab.list(), &att)
            .unwrap_or_else(|e| panic!("CHECK: {e}"));
        lab.assert_agree();
    }

    lab.rt
        .del(lab.list(), &att)
        .unwrap_or_else(|e| panic!("DEL: {e}"));
    assert!(lab.ledger().is_empty());
    lab.assert_agree();
    // DEL is idempotent (spec §2.5).
    lab.rt
        .del(lab.list(), &att)
        .unwrap_or_else(|e| panic!("second DEL: {e}"));
    lab.assert_agree();
}

#[test]
fn ptp_host_local_0_3_1() {
    require_root!();
    chain_lifecycle("ptp-dipam-host-local.conflist", "0.3.1");
}

#[test]
fn ptp_host_local_0_4_0() {
    require_root!();
    chain_lifecycle("ptp-dipam-host-local.conflist", "0.4.0");
}

#[test]
fn ptp_host_local_1_0_0() {
    require_root!();
    chain_lifecycle("ptp-dipam-host-local.conflist", "1.0.0");
}

#[test]
fn ptp_azure_0_4_0() {
    require_root!();
    chain_lifecycle("ptp-dipam-azure.conflist", "0.4.0");
}

#[test]
fn ptp_azure_1_0_0() {
    require_root!();
    chain_lifecycle("ptp-dipam-azure.conflist", "1.0.0");
}

#[test]
fn bridge_host_local_1_0_0() {
    require_root!();
    chain_lifecycle("bridge-dipam-host-local.conflist", "1.0.0");
}

/// dipam called directly as IPAM, the way a main plugin calls it, at every version. This is
/// how 1.1.0 is covered: no Debian main plugin speaks 1.1.0, so the harness plays a 1.1-capable
/// main plugin. host-local 1.1.1 itself stops at 1.0.0: dipamd sends it 1.0.0 and converts.
fn direct_lifecycle(conflist: &str, version: &str) {
    let lab = Lab::new(conflist).with_version(version);
    let (_ns, att) = lab.pod();
    let list = lab.list();

    let result = lab
        .rt
        .ipam(list, 0, "ADD", &att, None)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    assert_layout(&result, version);
    assert!(
        result.get("interfaces").is_none(),
        "an IPAM result has no interfaces: {result}"
    );
    let ips = result_ips(&result);
    assert_eq!(ips.len(), 1);
    lab.assert_agree();

    if version != "0.3.1" {
        lab.rt
            .ipam(list, 0, "CHECK", &att, Some(&result))
            .unwrap_or_else(|e| panic!("CHECK: {e}"));
    } else {
        // CHECK does not exist before 0.4.0: refused with code 1, before reaching dipamd.
        let e = lab
            .rt
            .ipam(list, 0, "CHECK", &att, Some(&result))
            .unwrap_err();
        assert_eq!(e.code, 1, "{e}");
    }
    lab.rt
        .ipam(list, 0, "DEL", &att, Some(&result))
        .unwrap_or_else(|e| panic!("DEL: {e}"));
    assert!(lab.delegate_store().is_empty());
    lab.assert_agree();
    lab.rt
        .ipam(list, 0, "DEL", &att, Some(&result))
        .unwrap_or_else(|e| panic!("second DEL: {e}"));
    lab.assert_agree();
}

#[test]
fn direct_host_local_every_version() {
    require_root!();
    for v in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        direct_lifecycle("ptp-dipam-host-local.conflist", v);
    }
}

#[test]
fn direct_azure_every_version() {
    require_root!();
    for v in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        direct_lifecycle("ptp-dipam-azure.conflist", v);
    }
}

/// host-local's file holds exactly what a runtime would have written through a plain
/// host-local: `<containerID>\r\n<ifname>`.
#[test]
fn host_local_sees_the_pods_own_identity() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let (_ns, att) = lab.pod();
    let result = lab
        .rt
        .add(lab.list(), &att)
        .unwrap_or_else(|e| panic!("{e}"));
    let ip = result_ips(&result).remove(0);
    let file = lab.data.path().join(lab.network()).join(&ip);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        format!("{}\r\neth0", att.container_id)
    );
    lab.rt.del(lab.list(), &att).unwrap();
    assert!(!file.exists());
}

/// A repeated ADD for the same attachment (a runtime retrying after a timeout) gets the same
/// answer, and the delegate holds one address, not two.
#[test]
fn duplicate_add_returns_the_recorded_result() {
    require_root!();
    for conflist in ["ptp-dipam-host-local.conflist", "ptp-dipam-azure.conflist"] {
        let lab = Lab::new(conflist);
        let (_ns, att) = lab.pod();
        let first = lab
            .rt
            .ipam(lab.list(), 0, "ADD", &att, None)
            .unwrap_or_else(|e| panic!("{e}"));
        let second = lab
            .rt
            .ipam(lab.list(), 0, "ADD", &att, None)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(first, second);
        assert_eq!(lab.delegate_store().len(), 1);
        lab.assert_agree();
        lab.rt.ipam(lab.list(), 0, "DEL", &att, None).unwrap();
        lab.assert_agree();
    }
}

/// DEL of a container nobody added succeeds (spec §2.5), and touches nothing else.
#[test]
fn del_of_an_unknown_container_succeeds() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let (_ns, att) = lab.pod();
    lab.rt.add(lab.list(), &att).unwrap();
    let (_ns2, stranger) = lab.pod();
    lab.rt
        .del(lab.list(), &stranger)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lab.ledger().len(), 1);
    lab.assert_agree();
    lab.rt.del(lab.list(), &att).unwrap();
}

/// Pods in separate netns get distinct addresses, and all of them are accounted for.
#[test]
fn several_pods_distinct_addresses() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let pods: Vec<_> = (0..4).map(|_| lab.pod()).collect();
    let mut seen = Vec::new();
    for (_, att) in &pods {
        let r = lab
            .rt
            .add(lab.list(), att)
            .unwrap_or_else(|e| panic!("{e}"));
        seen.extend(result_ips(&r));
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 4);
    lab.assert_agree();
    for (_, att) in &pods {
        lab.rt.del(lab.list(), att).unwrap();
    }
    assert!(lab.delegate_store().is_empty());
    lab.assert_agree();
}

/// CHECK fails, naming the problem, when dipamd has no record of the attachment or when the
/// runtime's cached result disagrees with the ledger.
#[test]
fn check_needs_a_matching_record() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let (_ns, att) = lab.pod();
    let result = lab.rt.ipam(lab.list(), 0, "ADD", &att, None).unwrap();
    let mut forged = result.clone();
    forged["ips"][0]["address"] = Value::String("10.200.0.99/24".into());
    let e = lab
        .rt
        .ipam(lab.list(), 0, "CHECK", &att, Some(&forged))
        .unwrap_err();
    assert_eq!(e.code, 158, "{e}");
    let e = lab.rt.ipam(lab.list(), 0, "CHECK", &att, None).unwrap_err();
    assert_eq!(e.code, 7, "{e}");
    let (_ns2, stranger) = lab.pod();
    let e = lab
        .rt
        .ipam(lab.list(), 0, "CHECK", &stranger, Some(&result))
        .unwrap_err();
    assert_eq!(e.code, 157, "{e}");
    lab.rt.ipam(lab.list(), 0, "DEL", &att, None).unwrap();
}

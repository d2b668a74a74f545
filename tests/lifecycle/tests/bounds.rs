//! Issue: bounded everything. What a delegate, a runtime or an operator can hand dipam is
//! bounded or refused: a delegate flooding its stdout, a container ID as long as the spec
//! allows, dipam named as its own delegate, a main-mode config in IPAM-mode shape, and the
//! agent's records left when agent management is turned off. Real dipamd, real host-local,
//! real netns, the real plugin; the ledger and host-local compared after each case.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use dipam_lifecycle::{Attachment, Lab, require_root};

fn ip(args: &[&str]) -> std::process::Output {
    Command::new("ip").args(args).output().expect("run ip")
}

/// The spec allows any length of container ID: one of 240 characters (once refused with 162
/// ERANGE, its host veth's alias outgrowing IFALIASZ) gets its pod wired, its alias within
/// the kernel's limit and still naming the attachment, and its DEL tears it all down.
#[test]
fn a_container_id_as_long_as_the_spec_allows_works_in_main_mode() {
    require_root!();
    let lab = Lab::new("dipam-host-local.conflist");
    let (ns, mut att) = lab.pod();
    att.container_id = format!("{}{}", att.container_id, "a".repeat(240));
    att.container_id.truncate(240);
    let result = lab.rt.add(lab.list(), &att).unwrap();
    assert_eq!(lab.ledger().len(), 1);
    lab.assert_agree();
    let eth0 = ns.exec(&["ip", "-o", "addr", "show", "dev", "eth0"]);
    assert!(eth0.status.success(), "no eth0: {result}");
    // The host end carries an alias within IFALIASZ that still says whose it is.
    let host = result["interfaces"][0]["name"].as_str().unwrap().to_owned();
    let shown = String::from_utf8_lossy(&ip(&["-d", "link", "show", "dev", &host]).stdout)
        .into_owned();
    let alias = shown
        .lines()
        .find_map(|l| l.trim().strip_prefix("alias "))
        .unwrap_or_else(|| panic!("no alias on {host}: {shown}"))
        .to_owned();
    assert!(alias.len() <= 255, "{alias}");
    assert!(alias.starts_with(&format!("dipam {} ", lab.network())), "{alias}");
    assert!(alias.contains(&att.container_id[..64]), "{alias}");
    assert!(alias.ends_with(" eth0"), "{alias}");
    lab.rt.check(lab.list(), &att).unwrap();
    lab.rt.del(lab.list(), &att).unwrap();
    assert!(lab.ledger().is_empty());
    lab.assert_agree();
}

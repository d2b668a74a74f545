//! Issue: bounded everything. What a delegate, a runtime or an operator can hand dipam is
//! bounded or refused: a delegate flooding its stdout, a container ID as long as the spec
//! allows, dipam named as its own delegate, a main-mode config in IPAM-mode shape, and the
//! agent's records left when agent management is turned off. Real dipamd, real host-local,
//! real netns, the real plugin; the ledger and host-local compared after each case.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use dipam_lifecycle::{Attachment, Lab, Runtime, flood, require_root};

fn ip(args: &[&str]) -> std::process::Output {
    Command::new("ip").args(args).output().expect("run ip")
}

/// The spec allows any length of container ID: one of 240 characters (once refused with 162
/// ERANGE, its host veth's alias outgrowing IFALIASZ) gets its pod wired, its alias within
/// the kernel's limit and still naming the attachment, and its DEL tears it all down.
#[test]
fn a_container_id_as_long_as_the_spec_allows_works_in_main_mode() {
    require_root!();
    let lab = Lab::new("dipam-host-local-1.1.0.conflist");
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
    let shown =
        String::from_utf8_lossy(&ip(&["-d", "link", "show", "dev", &host]).stdout).into_owned();
    let alias = shown
        .lines()
        .find_map(|l| l.trim().strip_prefix("alias "))
        .unwrap_or_else(|| panic!("no alias on {host}: {shown}"))
        .to_owned();
    assert!(alias.len() <= 255, "{alias}");
    assert!(
        alias.starts_with(&format!("dipam {} ", lab.network())),
        "{alias}"
    );
    assert!(alias.contains(&att.container_id[..64]), "{alias}");
    assert!(alias.ends_with(" eth0"), "{alias}");
    lab.rt.check(lab.list(), &att).unwrap();
    lab.rt.del(lab.list(), &att).unwrap();
    assert!(lab.ledger().is_empty());
    lab.assert_agree();
}

/// A delegate that allocates for real (host-local) and then prints 100 MB instead of its
/// result: four such ADDs at once are cut off at dipamd's stdout limit and answered 154,
/// dipamd's peak memory stays bounded (it reached 114 MB for one and 319 MB for four when
/// stdout was read whole), and each allocation is released through the delegate's DEL as
/// after any other garbage: the ledger and host-local agree, both empty.
#[test]
fn a_delegate_flooding_its_stdout_is_cut_off_and_released() {
    require_root!();
    let mut lab = Lab::new("ptp-dipam-host-local.conflist");
    let (_dir, rt) = Runtime::with_standins(&[(
        "flood-ipam",
        "in=$(cat)\n\
         out=$(printf '%s' \"$in\" | /usr/lib/cni/host-local); rc=$?\n\
         if [ \"$CNI_COMMAND\" = ADD ] && [ $rc -eq 0 ]; then\n\
           head -c 100000000 /dev/zero | tr '\\0' x; exit 0\n\
         fi\n\
         printf '%s' \"$out\"; exit $rc",
    )]);
    lab.fx.list["plugins"][0]["ipam"]["delegate"]["type"] = "flood-ipam".into();
    let store = || dipam_lifecycle::hostlocal::reservations(lab.data.path(), &lab.network()).len();
    let pods: Vec<Attachment> = (0..4)
        .map(|i| Attachment::new(&format!("flood-{i}"), "/var/run/netns/none"))
        .collect();
    let codes: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = pods
            .iter()
            .map(|p| {
                let (rt, list) = (&rt, lab.list());
                s.spawn(move || rt.ipam(list, 0, "ADD", p, None).unwrap_err().code)
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(codes, vec![154; 4]);
    let peak = flood::peak_kib(lab.dipamd.pid().unwrap());
    eprintln!("dipamd peak RSS after 4 floods: {peak} KiB");
    assert!(peak < 64 * 1024, "dipamd peak RSS {peak} KiB");
    assert!(lab.ledger().is_empty(), "{:?}", lab.ledger());
    assert_eq!(store(), 0, "host-local kept an address of a refused ADD");
    assert!(lab.dipamd.log().contains("stdout limit"));
}

/// dipam named as its own delegate is refused with 7 (it waited on its own key until the
/// delegate timeout), and so is `"type":"dipam"` carrying `ipam.delegate` (it ran IPAM mode
/// and created no interface), each with a message naming the shape meant; nothing is
/// allocated, and their DELs succeed so that the pod can go.
#[test]
fn self_delegation_and_a_mixed_shape_are_refused_with_7() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let (_ns, att) = lab.pod();
    let mut own = lab.list().clone();
    own["plugins"][0]["ipam"]["delegate"] = serde_json::json!({"type": "dipam"});
    let mut mixed = lab.list().clone();
    mixed["plugins"][0]["type"] = "dipam".into();
    for (list, said) in [(&own, "must not be dipam"), (&mixed, "main plugin")] {
        let e = lab.rt.ipam(list, 0, "ADD", &att, None).unwrap_err();
        assert_eq!(e.code, 7, "{e:?}");
        assert!(e.msg.contains(said), "{e:?}");
        assert!(!e.details.is_empty(), "{e:?}");
        lab.rt.ipam(list, 0, "DEL", &att, None).unwrap();
    }
    assert!(lab.ledger().is_empty());
    lab.assert_agree();
}

/// The agent's router address, allocated while agent management was on, after a restart
/// with it off (no --conflist, no --agent-roles): kept (it once stayed committed forever,
/// listed nowhere), listed by `dipamctl agent list` as "kept" with the reason and what
/// releases it, flagged by doctor, still agreed on by the ledger and host-local; and released
/// once dipamd runs with management on again without the role.
#[test]
fn agent_records_left_when_agent_management_is_off_are_listed_then_released() {
    require_root!();
    let mut lab = dipam_lifecycle::AgentLab::new("ptp-dipam-host-local.conflist", "router", &[]);
    lab.wait_ready(1);
    let ip = lab.addresses()[0].2.clone();
    lab.dipamd.set_flags(&[]);
    lab.dipamd.restart();
    assert_eq!(
        lab.addresses(),
        vec![("router".into(), "ipv4".into(), ip.clone(), "kept".into())]
    );
    let listed = lab.agent(&["list"]);
    let message = listed["addresses"][0]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("agent management is off"), "{listed}");
    assert!(message.contains("--agent-roles"), "{listed}");
    let flagged = lab
        .dipamd
        .doctor_check("agent records without agent management");
    assert_eq!(flagged["ok"], false);
    assert!(
        flagged["detail"]
            .as_str()
            .unwrap()
            .contains(ip.split('/').next().unwrap())
    );
    assert_eq!(lab.ledger().len(), 1);
    lab.assert_agree();
    // Management back on, without the role: released through the delegate.
    lab.set_roles("health", &[]);
    lab.dipamd.restart();
    lab.wait_ready(1);
    assert_eq!(lab.addresses()[0].0, "health");
    assert_eq!(lab.ledger().len(), 1);
    lab.assert_agree();
}

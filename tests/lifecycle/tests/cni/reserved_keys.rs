//! dipamd's own keys are not a runtime's: a pod ADD, CHECK or DEL under the agent's key
//! (`dipam-router-ipv4-<node>`, with its ifname or another) or a warm-pool entry's key is
//! refused with code 4, through the real plugin, while the agent's address stays held by
//! host-local, recorded once in the ledger, and `dipamctl agent list` keeps saying ready.
//! Before, the ADD got the router's address (two holders for one IP) and the DEL released it.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use dipam_lifecycle::{AgentLab, Attachment, NetNs, require_root, runtime::result_ips};
use serde_json::{Value, json};

/// Every IP, sorted (a pooled pod is named differently by the ledger and host-local).
fn ips(pairs: Vec<(String, String)>) -> Vec<String> {
    let mut v: Vec<String> = pairs.into_iter().map(|(_, ip)| ip).collect();
    v.sort();
    v
}

fn wait_pool_entry(lab: &AgentLab) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let all = lab.dipamd.ledger();
        let pool: Vec<&Value> = all.iter().filter(|a| a["owner"] == "pool").collect();
        if pool.len() == 1 && all.iter().all(|a| a["state"] == "committed") {
            return pool[0].clone();
        }
        assert!(
            Instant::now() < deadline,
            "no pool entry: {all:?}\n{}",
            lab.dipamd.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn pod_calls_under_agent_and_pool_keys_are_refused() {
    require_root!();
    let lab = AgentLab::new(
        "ptp-dipam-host-local.conflist",
        "router,health",
        &["--warm-pool", "1"],
    );
    lab.wait_ready(2);
    let list = lab.agent(&["list"]);
    let router = dipam_lifecycle::entry(&list["addresses"], "role", "router").clone();
    let router_id = router["containerID"].as_str().unwrap().to_owned();
    assert!(router_id.starts_with("dipam-router-ipv4-"), "{router}");
    let entry = wait_pool_entry(&lab);
    let pool_id = entry["containerID"].as_str().unwrap().to_owned();
    let agents = lab.addresses();
    let store = lab.delegate_store();
    let ledger = lab.dipamd.ledger();
    assert_eq!(ips(lab.ledger()), ips(store.clone()));

    let ns = NetNs::new();
    // A prevResult holding the router's address, as a forged CHECK would carry.
    let ip = router["ip"].as_str().unwrap();
    let cidr = if ip.contains('/') {
        ip.to_owned()
    } else {
        format!("{ip}/24")
    };
    let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": cidr}]});
    for (what, att) in [
        (
            "agent key, agent ifname",
            Attachment::new(&router_id, &ns.path()).with_ifname("router"),
        ),
        ("agent key, eth0", Attachment::new(&router_id, &ns.path())),
        ("pool key", Attachment::new(&pool_id, &ns.path())),
    ] {
        for (cmd, prev) in [("ADD", None), ("CHECK", Some(&prev)), ("DEL", Some(&prev))] {
            let e = lab
                .rt
                .ipam(&lab.fx.list, 0, cmd, &att, prev)
                .map(|r| panic!("{what} {cmd} accepted: {r}"))
                .unwrap_err();
            assert_eq!(e.code, 4, "{what} {cmd}: {e}");
            assert_eq!(e.exit, 1, "{what} {cmd}: {e}");
            assert!(e.msg.contains(&att.container_id), "{what} {cmd}: {e}");
            assert!(e.msg.contains("reserved"), "{what} {cmd}: {e}");
            assert!(e.details.contains("\"dipam-\""), "{what} {cmd}: {e}");
            assert_eq!(
                lab.delegate_store(),
                store,
                "{what} {cmd} changed host-local"
            );
            assert_eq!(
                lab.dipamd.ledger(),
                ledger,
                "{what} {cmd} changed the ledger"
            );
            assert_eq!(lab.addresses(), agents, "{what} {cmd} changed the agent");
        }
    }
    assert!(agents.iter().all(|a| a.3 == "ready"), "{agents:?}");

    // The node still serves pods, and none gets the agent's address.
    let pod = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
    let got = result_ips(&lab.rt.ipam(&lab.fx.list, 0, "ADD", &pod, None).unwrap());
    assert!(
        !agents.iter().any(|a| got.contains(&a.2)),
        "{got:?} {agents:?}"
    );
    lab.rt.ipam(&lab.fx.list, 0, "DEL", &pod, None).unwrap();
    assert_eq!(lab.addresses(), agents);
}

//! `dipamctl explain <container-id>`: the full history of an attachment — each request and
//! its outcome, each delegate exec with argv, environment, exit status and duration — kept
//! in the ledger, so it survives a restart.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::{Attachment, Lab, NetNs, require_root};
use serde_json::Value;

fn explain(lab: &Lab, cid: &str) -> Value {
    let out = lab.dipamd.ctl(&["explain", cid, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn explain_shows_requests_and_delegate_execs_across_a_restart() {
    require_root!();
    let mut lab = Lab::new("ptp-dipam-host-local.conflist");
    let (_ns, pod) = lab.pod();
    let r = lab.rt.ipam(lab.list(), 0, "ADD", &pod, None).unwrap();
    lab.rt.ipam(lab.list(), 0, "DEL", &pod, Some(&r)).unwrap();
    // History is written in batches at most a second apart, and what is queued at a clean
    // stop is written before dipamd exits.
    assert!(lab.dipamd.terminate().success());
    lab.dipamd.start_again();

    let v = explain(&lab, &pod.container_id);
    let events = v["events"].as_array().unwrap();
    let requests: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "request")
        .map(|e| e["op"].as_str().unwrap())
        .collect();
    assert_eq!(requests, vec!["ADD", "DEL"], "{v:#}");
    let add_exec = events
        .iter()
        .find(|e| e["kind"] == "exec" && e["env"]["CNI_COMMAND"] == "ADD")
        .unwrap_or_else(|| panic!("{v:#}"));
    assert!(
        add_exec["argv"][0]
            .as_str()
            .unwrap()
            .ends_with("host-local")
    );
    assert_eq!(
        add_exec["env"]["CNI_CONTAINERID"],
        pod.container_id.as_str()
    );
    assert_eq!(add_exec["exit"], "exited with status 0");
    assert!(add_exec["durationMs"].as_f64().unwrap() > 0.0);
    let add = events.iter().find(|e| e["op"] == "ADD").unwrap();
    assert_eq!(add["outcome"], "ok");
    assert_eq!(add["result"]["ips"], r["ips"]);
    assert!(v["attachments"].as_array().unwrap().is_empty(), "deleted");

    // A failing ADD explains itself: the code, message and details.
    let mut bad = lab.list().clone();
    bad["plugins"][0]["ipam"]["delegate"]["type"] = "not-installed".into();
    let (_ns2, other) = lab.pod();
    let e = lab.rt.ipam(&bad, 0, "ADD", &other, None).unwrap_err();
    assert_eq!(e.code, 152);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let v = explain(&lab, &other.container_id);
    let failed = &v["events"][0];
    assert_eq!(failed["outcome"], "error", "{v:#}");
    assert_eq!(failed["code"], 152);
    assert!(failed["details"].as_str().unwrap().contains("searched"));
    let text = lab.dipamd.ctl(&["explain", &other.container_id]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("code 152"));
    // Times for people: RFC 3339 in UTC, the same instant as the JSON's atMs.
    let at = failed["at"].as_str().unwrap_or_else(|| panic!("{v:#}"));
    assert!(
        at.ends_with('Z') && at.len() == "2026-11-24T07:15:00.123Z".len(),
        "{at}"
    );
    let ms = failed["atMs"].as_u64().unwrap();
    assert_eq!(&at[20..23], format!("{:03}", ms % 1000), "{at} vs {ms}");
    assert!(text.contains(&format!("  {at} ADD ")), "{text}");
}

/// `dipamctl explain` runs as root with the unit's restrictions; these are what an operator
/// has in hand when a pod misbehaves.
fn explain_fails(lab: &Lab, what: &str) -> String {
    let out = lab.dipamd.ctl(&["explain", what]);
    assert!(!out.status.success(), "{what} explained");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// An operator holds an IP (from an alert or a packet capture) or crictl's short container
/// ID, not the full ID: `explain` takes both. An IP finds the container holding it now and,
/// once freed, the last one the history shows it given to; a prefix matching two containers
/// is refused naming both; a message never carries runs of spaces from a continued literal.
#[test]
fn explain_finds_a_container_by_ip_and_by_id_prefix() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let tag = format!("{:08x}", std::process::id());
    let (ns1, ns2) = (NetNs::new(), NetNs::new());
    let one = Attachment::new(&format!("c0ffee01{tag}aa"), &ns1.path());
    let two = Attachment::new(&format!("c0ffee02{tag}bb"), &ns2.path());
    let r1 = lab.rt.ipam(lab.list(), 0, "ADD", &one, None).unwrap();
    lab.rt.ipam(lab.list(), 0, "ADD", &two, None).unwrap();
    let ip1 = dipam_lifecycle::runtime::result_ips(&r1).remove(0);

    let v = explain(&lab, &ip1);
    assert_eq!(v["containerID"], one.container_id.as_str(), "{v:#}");
    assert_eq!(
        v["attachments"][0]["ips"][0]
            .as_str()
            .unwrap()
            .split('/')
            .next(),
        Some(ip1.as_str())
    );

    let v = explain(&lab, &format!("c0ffee01{tag}"));
    assert_eq!(v["containerID"], one.container_id.as_str(), "{v:#}");
    let err = explain_fails(&lab, "c0ffee0");
    assert!(
        err.contains("2 containers start with")
            && err.contains(&one.container_id)
            && err.contains(&two.container_id),
        "{err}"
    );

    // Freed: the IP still leads to the pod the history shows it given to.
    lab.rt.ipam(lab.list(), 0, "DEL", &one, Some(&r1)).unwrap();
    let v = explain(&lab, &ip1);
    assert_eq!(v["containerID"], one.container_id.as_str(), "{v:#}");
    assert!(v["attachments"].as_array().unwrap().is_empty(), "{v:#}");
    assert_eq!(
        v["earlierHolders"],
        serde_json::json!([one.container_id]),
        "{v:#}"
    );
    let text = lab.dipamd.ctl(&["explain", &ip1]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("the history shows the address given to"),
        "{text}"
    );

    let err = explain_fails(&lab, "192.0.2.250");
    assert!(err.contains("no attachment holds 192.0.2.250"), "{err}");
    let err = explain_fails(&lab, "nosuchcontainer");
    assert!(err.contains("knows nothing of container"), "{err}");
    assert!(
        !err.contains("   "),
        "a message with a run of spaces: {err:?}"
    );
    lab.rt.ipam(lab.list(), 0, "DEL", &two, None).unwrap();
}

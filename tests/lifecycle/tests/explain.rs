//! `dipamctl explain <container-id>`: the full history of an attachment — each request and
//! its outcome, each delegate exec with argv, environment, exit status and duration — kept
//! in the ledger, so it survives a restart.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::{Lab, require_root};
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
    // History is written in batches at most a second apart; a clean stop flushes nothing
    // extra, so wait for the batch before restarting.
    std::thread::sleep(std::time::Duration::from_millis(1500));
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

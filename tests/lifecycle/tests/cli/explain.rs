//! `dipamctl explain <container-id>`: the full history of an attachment — each request and
//! its outcome, each delegate exec with argv, environment, exit status and duration — kept
//! in the ledger, so it survives a restart. Each case runs with dipamd under the shipped unit's
//! capability set and in the DaemonSet's shape (deployment.rs).

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::{Attachment, Lab, NetNs, cmd, deployment::Deployment, require_root};
use serde_json::Value;

/// `dipamctl explain WHAT` as people read it.
fn explain_text(lab: &Lab, what: &str) -> String {
    cmd::ok_named("dipamctl explain", &lab.dipamd.ctl(&["explain", what]))
}

fn explain(lab: &Lab, cid: &str) -> Value {
    cmd::json(&lab.dipamd.ctl(&["explain", cid, "--json"]))
}

#[test]
fn explain_shows_requests_and_delegate_execs_across_a_restart() {
    explain_shows_requests_and_delegate_execs_across_a_restart_in(Deployment::ShippedUnit);
}

#[test]
fn explain_shows_requests_and_delegate_execs_across_a_restart_daemonset() {
    explain_shows_requests_and_delegate_execs_across_a_restart_in(Deployment::DaemonSet);
}

fn explain_shows_requests_and_delegate_execs_across_a_restart_in(d: Deployment) {
    require_root!();
    let mut lab = d.lab("ptp-dipam-host-local.conflist", &[]);
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
    explain_finds_a_container_by_ip_and_by_id_prefix_in(Deployment::ShippedUnit);
}

#[test]
fn explain_finds_a_container_by_ip_and_by_id_prefix_daemonset() {
    explain_finds_a_container_by_ip_and_by_id_prefix_in(Deployment::DaemonSet);
}

fn explain_finds_a_container_by_ip_and_by_id_prefix_in(d: Deployment) {
    require_root!();
    let lab = d.lab("ptp-dipam-host-local.conflist", &[]);
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
    let text = explain_text(&lab, &ip1);
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

/// CNI 1.1 GC through the plugin, with `valid` as the runtime's list.
fn cni_gc(lab: &Lab, valid: Value) {
    dipam_lifecycle::runtime::settle_before_gc();
    lab.rt
        .ipam_gc(lab.list(), valid)
        .unwrap_or_else(|e| panic!("GC: {e}"));
}

/// One address, four holders in turn, each let go a different way: the runtime's DEL, an
/// operator's `dipamctl gc`, the runtime's CNI GC; the fourth holds it now. `explain <ip>`
/// says of each earlier holding when it was given, when it was freed, by whom and why (the
/// operator's second day: "who freed it?" was a guess from the requests).
#[test]
fn explain_by_ip_says_who_freed_each_earlier_holding() {
    explain_by_ip_says_who_freed_each_earlier_holding_in(Deployment::ShippedUnit);
}

#[test]
fn explain_by_ip_says_who_freed_each_earlier_holding_daemonset() {
    explain_by_ip_says_who_freed_each_earlier_holding_in(Deployment::DaemonSet);
}

fn explain_by_ip_says_who_freed_each_earlier_holding_in(d: Deployment) {
    require_root!();
    // Grace 0 and any share: the GCs here free the one pod of the network on purpose.
    let lab = d.lab(
        "ptp-dipam-host-local.conflist",
        &["--gc-grace", "0", "--gc-max-free-share", "1"],
    );
    let tag = format!("{:08x}", std::process::id());
    let nss: Vec<NetNs> = (0..4).map(|_| NetNs::new()).collect();
    let pods: Vec<Attachment> = ["de1", "0be", "c91", "a11"]
        .iter()
        .zip(&nss)
        .map(|(p, ns)| Attachment::new(&format!("{p}{tag}f00d"), &ns.path()))
        .collect();
    let r = lab.rt.ipam(lab.list(), 0, "ADD", &pods[0], None).unwrap();
    let ip = dipam_lifecycle::runtime::result_ips(&r).remove(0);
    // Each next pod asks host-local for the same address (CNI_ARGS IP=).
    let same = |a: &Attachment| {
        let mut a = a.clone();
        a.args.push_str(&format!(";IP={ip}"));
        a
    };
    lab.rt
        .ipam(lab.list(), 0, "DEL", &pods[0], Some(&r))
        .unwrap();

    let b = same(&pods[1]);
    let rb = lab.rt.ipam(lab.list(), 0, "ADD", &b, None).unwrap();
    assert_eq!(dipam_lifecycle::runtime::result_ips(&rb), vec![ip.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let (conflist, valid) = (dir.path().join("net.conflist"), dir.path().join("v.json"));
    std::fs::write(&conflist, serde_json::to_vec(lab.list()).unwrap()).unwrap();
    let nobody = serde_json::json!([{"containerID": "nobody", "ifname": "eth0"}]);
    std::fs::write(&valid, nobody.to_string()).unwrap();
    let gc = lab.dipamd.gc_valid(&conflist, &valid, &["--json"]);
    assert!(gc.status.success(), "{gc:?}");

    let c = same(&pods[2]);
    lab.rt.ipam(lab.list(), 0, "ADD", &c, None).unwrap();
    cni_gc(&lab, nobody);

    let d = same(&pods[3]);
    lab.rt.ipam(lab.list(), 0, "ADD", &d, None).unwrap();

    let v = explain(&lab, &ip);
    assert_eq!(v["containerID"], d.container_id.as_str(), "{v:#}");
    let h = v["holdings"].as_array().unwrap_or_else(|| panic!("{v:#}"));
    let ids: Vec<&str> = h
        .iter()
        .map(|x| x["containerID"].as_str().unwrap())
        .collect();
    let want: Vec<&str> = pods.iter().map(|p| p.container_id.as_str()).collect();
    assert_eq!(ids, want, "{v:#}");
    let by: Vec<&Value> = h.iter().map(|x| &x["freedBy"]).collect();
    assert_eq!(
        by,
        [
            &"del".into(),
            &"operator".into(),
            &"cni-gc".into(),
            &Value::Null
        ],
        "{v:#}"
    );
    assert!(
        h[0]["reason"]
            .as_str()
            .unwrap()
            .contains("the runtime's DEL"),
        "{v:#}"
    );
    assert!(
        h[1]["reason"].as_str().unwrap().contains("dipamctl gc"),
        "{v:#}"
    );
    assert!(h[2]["reason"].as_str().unwrap().contains("CNI GC"), "{v:#}");
    assert_eq!(h[3]["holdsNow"], true, "{v:#}");
    for x in &h[..3] {
        assert!(
            x["givenAtMs"].as_u64().unwrap() <= x["freedAtMs"].as_u64().unwrap(),
            "{v:#}"
        );
    }

    // For people: one line per holding, the freeing's author on it.
    let text = explain_text(&lab, &ip);
    assert!(
        text.contains("the history shows the address given to"),
        "{text}"
    );
    for (pod, said) in pods
        .iter()
        .zip(["by del: ", "by operator: ", "by cni-gc: ", "holds it now"])
    {
        assert!(
            text.lines()
                .any(|l| l.contains(&pod.container_id) && l.contains(said)),
            "{} {said}: {text}",
            pod.container_id
        );
    }
    // The freeing is in the pod's own history too.
    let v = explain(&lab, &pods[1].container_id);
    assert!(
        v["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "freed" && e["by"] == "operator"),
        "{v:#}"
    );
    lab.rt.ipam(lab.list(), 0, "DEL", &d, None).unwrap();
}

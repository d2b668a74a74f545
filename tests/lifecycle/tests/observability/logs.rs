//! What an operator reads in dipamd's log: one line per CNI request saying how it ended, with
//! the network, the short container ID, the IPs it concerned (on DEL too), the outcome and a
//! duration rounded to 0.1 ms; STATUS and GC probes only at debug; spool replays at info.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::{Attachment, Lab, require_root, runtime::result_ips};
use serde_json::json;

const CONFLIST: &str = "ptp-dipam-host-local.conflist";

/// The log lines of level `level` (the text format: `<time>  INFO <span>: <target>: <msg>`)
/// that contain `needle`.
fn lines<'a>(log: &'a str, level: &str, needle: &str) -> Vec<&'a str> {
    log.lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(level) && l.contains(needle))
        .collect()
}

/// The `elapsed_ms=` value of a line: a number with at most one decimal, no float noise.
fn elapsed(line: &str) -> String {
    let v = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("elapsed_ms="))
        .unwrap_or_else(|| panic!("no elapsed_ms in {line}"));
    let decimals = v.split('.').nth(1).map_or(0, str::len);
    assert!(decimals <= 1, "{v} in {line}");
    assert!(v.parse::<f64>().is_ok(), "{v} in {line}");
    v.to_owned()
}

#[test]
fn one_info_line_per_request_with_ips_on_add_and_del() {
    require_root!();
    let lab = Lab::new(CONFLIST);
    let (_ns, att) = lab.pod();
    let result = lab.rt.add(lab.list(), &att).unwrap();
    let ip = result_ips(&result).remove(0);
    lab.rt.check(lab.list(), &att).unwrap();
    lab.rt.del(lab.list(), &att).unwrap();

    let log = lab.dipamd.log();
    let short = &att.container_id[..att.container_id.len().min(12)];
    let mine: Vec<&str> = lines(&log, "INFO", &format!("container_id={}", att.container_id))
        .into_iter()
        .filter(|l| l.contains("dipam_shim::service"))
        .collect();
    // ADD, CHECK and DEL: one line each saying how the request ended. (The first request of a
    // delegate also logs its probe, once per delegate binary.)
    let all = lines(&log, "INFO", &format!("container_id={}", att.container_id));
    let others: Vec<&&str> = all
        .iter()
        .filter(|l| !l.contains("dipam_shim::service") && !l.contains("probed delegate"))
        .collect();
    assert!(
        others.is_empty(),
        "other info lines for the pod: {others:#?}"
    );
    assert_eq!(mine.len(), 3, "{mine:#?}");
    for (line, command) in mine.iter().zip(["ADD", "CHECK", "DEL"]) {
        assert!(line.contains(&format!("command=\"{command}\"")), "{line}");
        assert!(line.contains("dipam_shim::service: ok"), "{line}");
        assert!(
            line.contains(&format!("network={}", lab.network())),
            "{line}"
        );
        assert!(line.contains(&format!("container={short} ")), "{line}");
        elapsed(line);
    }
    assert!(mine[0].contains(&format!("ips={ip}/")), "ADD: {}", mine[0]);
    assert!(mine[2].contains(&format!("ips={ip}/")), "DEL: {}", mine[2]);
}

#[test]
fn status_and_gc_are_debug_and_spool_replays_are_info() {
    require_root!();
    let mut lab = Lab::new(CONFLIST);
    let mut l = lab.list().clone();
    l["cniVersion"] = json!("1.1.0");
    let none = Attachment::new("", "");
    lab.rt.ipam(&l, 0, "STATUS", &none, None).unwrap();
    l["plugins"][0]["cni.dev/valid-attachments"] = json!([]);
    // An empty list is refused unless allowed (GC safety); a refusal is a warning. A list
    // naming a live pod is the healthy probe.
    let (_ns, att) = lab.pod();
    let r = lab.rt.ipam(&l, 0, "ADD", &att, None).unwrap();
    l["plugins"][0]["cni.dev/valid-attachments"] =
        json!([dipam_lifecycle::runtime::gc_entry(&att)]);
    lab.rt.ipam(&l, 0, "GC", &none, None).unwrap();
    let log = lab.dipamd.log();
    for command in ["STATUS", "GC"] {
        let needle = format!("command=\"{command}\"");
        let info: Vec<&str> = lines(&log, "INFO", &needle)
            .into_iter()
            .filter(|l| l.contains("dipam_shim::service"))
            .collect();
        assert!(info.is_empty(), "{command} at info: {info:#?}");
        let debug = lines(&log, "DEBUG", &needle);
        assert!(
            debug.iter().any(|l| l.contains("dipam_shim::service: ok")),
            "{command} not at debug:\n{log}"
        );
    }

    // A DEL spooled while dipamd is down is replayed at the next start: one info line, with
    // the address it released.
    lab.dipamd.kill9();
    lab.rt.ipam(lab.list(), 0, "DEL", &att, Some(&r)).unwrap();
    lab.dipamd.start_again();
    let log = lab.dipamd.log();
    let ip = result_ips(&r).remove(0);
    let replayed = lines(&log, "INFO", "spooled DEL replayed");
    assert_eq!(replayed.len(), 1, "{log}");
    assert!(
        replayed[0].contains(&format!("ips={ip}/")),
        "{}",
        replayed[0]
    );
    lab.assert_agree();
}

/// A CRI runtime's ADD names its pod (containerd's four K8S_POD_* keys, in its varying order):
/// the request's line says `pod=namespace/name`, and `dipamctl explain namespace/name` finds
/// the attachment. Without them (podman, a direct call) the line says `pod=-`.
#[test]
fn a_cri_pod_is_named_on_its_line_and_explained_by_name() {
    require_root!();
    let lab = Lab::new(CONFLIST);
    let (_ns, mut att) = lab.pod();
    att.args = format!(
        "K8S_POD_UID=7f0c2a4e-1b2c-4d5e-8f90-123456789abc;IgnoreUnknown=1;\
         K8S_POD_INFRA_CONTAINER_ID={id};K8S_POD_NAME=web-0;K8S_POD_NAMESPACE=shop",
        id = att.container_id
    );
    let r = lab.rt.ipam(lab.list(), 0, "ADD", &att, None).unwrap();
    let (_ns2, plain) = lab.pod();
    lab.rt.ipam(lab.list(), 0, "ADD", &plain, None).unwrap();
    let log = lab.dipamd.log();
    let line = |cid: &str| {
        lines(&log, "INFO", &format!("container_id={cid}"))
            .into_iter()
            .find(|l| l.contains("dipam_shim::service: ok"))
            .unwrap_or_else(|| panic!("no line for {cid}:\n{log}"))
            .to_owned()
    };
    assert!(
        line(&att.container_id).contains(" pod=shop/web-0 "),
        "{}",
        line(&att.container_id)
    );
    assert!(
        line(&plain.container_id).contains(" pod=- "),
        "{}",
        line(&plain.container_id)
    );

    let out = lab.dipamd.ctl(&["explain", "shop/web-0", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ips: Vec<&str> = v["attachments"][0]["ips"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i.as_str())
        .collect();
    assert_eq!(ips, vec![r["ips"][0]["address"].as_str().unwrap()], "{v:#}");
    let out = lab.dipamd.ctl(&["explain", "shop/nobody"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no attachment in the ledger for pod"),
        "{out:?}"
    );
}

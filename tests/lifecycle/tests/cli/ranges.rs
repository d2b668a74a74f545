//! The range view (docs/cfp.md §7.4, "The range view"): `dipamctl status` (table and `--json`) and the metrics
//! scrape count, per network and family, the addresses of the delegate's ranges, and who holds
//! them: pods, the agent (its roles and claims), the warm pool, orphans (reservations no ledger
//! record accounts for) and free, like `cilium status`'s "IPAM: 5/254 allocated".
//!
//! Run as a node runs it: real host-local with its store in a non-default dataDir, dipamd with
//! a non-default state dir, the agent's router and a claim held, metrics on a unix socket; an
//! orphan written into host-local's directory as a second runtime sharing the store would
//! leave it. The three views must agree with each other and with host-local's directory, and
//! the size must be host-local's own: filling the range, host-local refuses the next ADD
//! exactly when the view says nothing is free. An opaque delegate (azure-vnet-ipam) shows
//! what the ledger knows and says the size is unknown.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use dipam_lifecycle::{AgentLab, Attachment, Lab, hostlocal, require_root, unique};
use serde_json::{Value, json};

fn scrape(sock: &Path) -> String {
    dipam_lifecycle::daemon::scrape_socket(sock)
}

/// A range gauge's value in a scrape, or `None` when the series is absent.
fn gauge(body: &str, name: &str, network: &str, family: &str, state: Option<&str>) -> Option<f64> {
    let mut labels = format!("network=\"{network}\",family=\"{family}\"");
    if let Some(s) = state {
        labels.push_str(&format!(",state=\"{s}\""));
    }
    let prefix = format!("{name}{{{labels}}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.parse().unwrap())
}

/// `dipamctl status --stores` (the ranges read from the delegate's store) as a table and as
/// JSON: (the table, this network's ranges).
fn status(dipamd: &dipam_lifecycle::Dipamd, network: &str) -> (String, Vec<Value>) {
    status_with(dipamd, network, &["--stores"])
}

/// `dipamctl status` with `extra` as a table and as JSON: (the table, this network's ranges).
fn status_with(
    dipamd: &dipam_lifecycle::Dipamd,
    network: &str,
    extra: &[&str],
) -> (String, Vec<Value>) {
    let out = dipamd.ctl(&[&["status", "--json"], extra].concat());
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ranges = v["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["network"] == network)
        .cloned()
        .collect();
    let out = dipamd.ctl(&[&["status"], extra].concat());
    assert!(out.status.success(), "{out:?}");
    (String::from_utf8(out.stdout).unwrap(), ranges)
}

fn host(lab: &AgentLab, n: u8) -> String {
    format!("{}.{n}", lab.subnet.cidr.trim_end_matches(".0/24"))
}

/// `table` (status's text) holds, whole, the line of `lab`'s ipv4 range: .10 to .17 with the
/// gateway .12 excluded, `counts`, and `tail` after the range.
#[track_caller]
fn assert_range_line(table: &str, lab: &AgentLab, counts: &str, tail: &str) {
    let (net, first, last, gw) = (lab.network(), host(lab, 10), host(lab, 17), host(lab, 12));
    let line =
        format!("range:        {net} ipv4: {counts}; {first}-{last} (gateway {gw} excluded){tail}");
    assert!(
        table.lines().any(|l| l == line),
        "want {line:?} in:\n{table}"
    );
}

#[test]
fn status_and_metrics_count_host_locals_range_until_it_is_full() {
    require_root!();
    let msock_dir = tempfile::tempdir().unwrap();
    let msock = msock_dir.path().join("metrics.sock");
    let mut lab = AgentLab::unstarted("ptp-dipam-host-local.conflist");
    // A small range with the gateway inside it: .10-.17 less .12, 7 addresses as host-local
    // counts them (delegate/ranges.rs).
    let range = json!([[{
        "subnet": lab.subnet.cidr,
        "rangeStart": host(&lab, 10),
        "rangeEnd": host(&lab, 17),
        "gateway": host(&lab, 12),
    }]]);
    lab.fx = lab.fx.clone().with_ranges(range);
    lab.write_conflist();
    lab.set_roles(
        "router",
        &[
            "--metrics-socket",
            msock.to_str().unwrap(),
            "--reconcile-interval",
            "0",
        ],
    );
    lab.dipamd.start_again();
    lab.wait_ready(1);
    let net = lab.network();
    let list = lab.fx.list.clone();

    // The agent holds its router and one claim; two pods hold one address each.
    let out = lab
        .dipamd
        .ctl(&["agent", "claim", "egress", "--family", "ipv4", "--json"]);
    assert!(out.status.success(), "{out:?}\n{}", lab.dipamd.log());
    let pods: Vec<Attachment> = (0..2)
        .map(|_| Attachment::new(&unique("pod"), "/var/run/netns/none"))
        .collect();
    for p in &pods {
        lab.rt.ipam(&list, 0, "ADD", p, None).unwrap();
    }
    // An orphan: a reservation in host-local's directory that no attachment accounts for, as
    // a second runtime sharing the store (or a DEL that lost its record) leaves it.
    let dir = lab.data.path().join(&net);
    std::fs::write(
        dir.join(host(&lab, 16)),
        "left-behind-by-another-runtime\r\neth0",
    )
    .unwrap();

    let (table, ranges) = status(&lab.dipamd, &net);
    assert_eq!(ranges.len(), 1, "{ranges:?}");
    let r = &ranges[0];
    assert_eq!(
        (
            &r["family"],
            &r["size"],
            &r["pods"],
            &r["agent"],
            &r["pool"],
            &r["orphans"],
            &r["free"],
            &r["allocated"]
        ),
        (
            &json!("ipv4"),
            &json!(7),
            &json!(2),
            &json!(2),
            &json!(0),
            &json!(1),
            &json!(2),
            &json!(5)
        ),
        "{r:#}\n{table}"
    );
    assert_eq!(r["sizeUnknown"], Value::Null, "{r:#}");
    // Against host-local's directory: every address file is counted once, the ones the ledger
    // does not hold are the orphans, and free is the size less them all.
    let store = hostlocal::reservations(lab.data.path(), &net);
    let ledger = lab.ledger();
    let orphans = store
        .iter()
        .filter(|(id, _, ip)| !ledger.contains(&(id.clone(), ip.clone())))
        .count();
    assert_eq!(
        store.len() as u64,
        r["allocated"].as_u64().unwrap(),
        "{store:?}"
    );
    assert_eq!(
        orphans as u64,
        r["orphans"].as_u64().unwrap(),
        "{store:?} {ledger:?}"
    );
    let counts = "5/7 allocated (2 pod, 2 agent, 0 pool, 1 orphan), 2 free";
    assert_range_line(&table, &lab, counts, "");
    // The scrape says what status said.
    let body = scrape(&msock);
    let g = |name: &str, state: Option<&str>| gauge(&body, name, &net, "ipv4", state);
    assert_eq!(g("dipam_range_size", None), Some(7.0), "{body}");
    for (state, want) in [
        ("pod", 2.0),
        ("agent", 2.0),
        ("pool", 0.0),
        ("orphan", 1.0),
        ("free", 2.0),
    ] {
        assert_eq!(
            g("dipam_range_addresses", Some(state)),
            Some(want),
            "{state}: {body}"
        );
    }

    // Without --stores the same counts come from the ledger's census, at a cost that does
    // not grow with the node: the orphan is not known there, and the table says so.
    let (table, ranges) = status_with(&lab.dipamd, &net, &[]);
    let r = &ranges[0];
    assert_eq!(
        (
            &r["size"],
            &r["pods"],
            &r["agent"],
            &r["pool"],
            &r["orphans"],
            &r["free"],
            &r["counted"]
        ),
        (
            &json!(7),
            &json!(2),
            &json!(2),
            &json!(0),
            &Value::Null,
            &json!(3),
            &json!("ledger")
        ),
        "{r:#}\n{table}"
    );
    let counts = "4/7 allocated (2 pod, 2 agent, 0 pool), 3 free";
    let tail = " (as the ledger records them; orphans: --stores)";
    assert_range_line(&table, &lab, counts, tail);

    assert_units_in_json(&lab.dipamd, &pods[0].container_id);

    // Fill the range: exactly `free` more pods get an address, and host-local refuses the
    // next one; the view then says nothing is free.
    for i in 0..2 {
        let p = Attachment::new(&unique("fill"), "/var/run/netns/none");
        lab.rt
            .ipam(&list, 0, "ADD", &p, None)
            .unwrap_or_else(|e| panic!("ADD {i} of the 2 free addresses: {e:?}"));
    }
    let over = Attachment::new(&unique("over"), "/var/run/netns/none");
    let e = lab.rt.ipam(&list, 0, "ADD", &over, None).unwrap_err();
    assert!(
        e.msg.contains("no IP addresses available")
            || e.details.contains("no IP addresses available"),
        "{e:?}"
    );
    let (table, ranges) = status(&lab.dipamd, &net);
    let r = &ranges[0];
    assert_eq!(
        (&r["size"], &r["allocated"], &r["free"], &r["pods"]),
        (&json!(7), &json!(7), &json!(0), &json!(4)),
        "{r:#}"
    );
    assert_eq!(hostlocal::reservations(lab.data.path(), &net).len(), 7);
    assert!(
        table.contains(&format!(
            "range:        {net} ipv4: 7/7 allocated (4 pod, 2 agent, 0 pool, 1 orphan), 0 free;"
        )),
        "{table}"
    );
    let body = scrape(&msock);
    assert_eq!(
        gauge(&body, "dipam_range_addresses", &net, "ipv4", Some("free")),
        Some(0.0),
        "{body}"
    );
}

/// docs/configuration.md, "Times in JSON": a point in time `X` is RFC 3339 UTC (or `null`)
/// beside `XMs`, Unix milliseconds naming the same instant; a duration's or a size's field
/// names its unit (`durationMs`, `uptimeSeconds`). Returns each violation, with its path.
fn unit_violations(path: &str, v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let here = format!("{path}.{k}");
                let lower = k.to_ascii_lowercase();
                if k == "at" || k.ends_with("At") {
                    match (x, m.get(&format!("{k}Ms"))) {
                        (Value::Null, Some(Value::Null)) => {}
                        (Value::String(t), Some(Value::Number(ms))) => {
                            let ms = ms.as_u64().unwrap_or_default();
                            if ms < 1_000_000_000_000 || !t.ends_with('Z') || t.len() != 24 {
                                out.push(format!("{here}: {t:?} / {ms}"));
                            }
                            // The same instant, to the second.
                            let secs = ms / 1000;
                            let (h, mi, se) =
                                ((secs % 86_400) / 3600, (secs % 3600) / 60, secs % 60);
                            if !t.contains(&format!("T{h:02}:{mi:02}:{se:02}.")) {
                                out.push(format!("{here}: {t} is not {ms} ms"));
                            }
                        }
                        other => out.push(format!("{here}: {other:?}")),
                    }
                } else if x.is_number()
                    && camel_words(k)
                        .iter()
                        .any(|w| TIME_WORDS.contains(&w.as_str()))
                    && !UNITS.iter().any(|u| lower.ends_with(u))
                {
                    out.push(format!("{here}: a number whose unit the name does not say"));
                }
                unit_violations(&here, x, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                unit_violations(&format!("{path}[{i}]"), x, out);
            }
        }
        _ => {}
    }
}

/// Words that make a number a time, a duration or a size in bytes, and the unit suffixes
/// that name its unit. (`size` of a range counts addresses, as `pods` and `free` do.)
const TIME_WORDS: [&str; 8] = [
    "time", "age", "duration", "elapsed", "took", "timeout", "interval", "uptime",
];
const UNITS: [&str; 3] = ["ms", "seconds", "bytes"];

/// `agentReestablished` -> ["agent", "reestablished"].
fn camel_words(k: &str) -> Vec<String> {
    let mut words = vec![String::new()];
    for c in k.chars() {
        if c.is_ascii_uppercase() {
            words.push(String::new());
        }
        if let Some(w) = words.last_mut() {
            w.push(c.to_ascii_lowercase());
        }
    }
    words.retain(|w| !w.is_empty());
    words
}

/// Every `--json` output of a running node follows the one convention for times and units.
fn assert_units_in_json(dipamd: &dipam_lifecycle::Dipamd, explain: &str) {
    let mut seen_times = 0;
    let mut bad = Vec::new();
    for args in [
        vec!["status", "--json"],
        vec!["attachments", "--json"],
        vec!["explain", explain, "--json"],
        vec!["agent", "list", "--json"],
        vec!["doctor", "--json"],
    ] {
        let out = dipamd.ctl(&args);
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {out:?}"));
        seen_times += v.to_string().matches("At\":\"").count();
        unit_violations(&args.join(" "), &v, &mut bad);
    }
    assert!(bad.is_empty(), "{bad:#?}");
    assert!(
        seen_times >= 4,
        "the outputs carried times to check: {seen_times}"
    );
}

#[test]
fn an_opaque_delegate_shows_what_the_ledger_knows_and_no_size() {
    require_root!();
    let msock_dir = tempfile::tempdir().unwrap();
    let msock = msock_dir.path().join("metrics.sock");
    let lab = Lab::with_flags(
        "ptp-dipam-azure.conflist",
        &["--metrics-socket", msock.to_str().unwrap()],
    );
    let net = lab.network();
    let (_ns, pod) = lab.pod();
    lab.rt.ipam(lab.list(), 0, "ADD", &pod, None).unwrap();
    let (table, ranges) = status(&lab.dipamd, &net);
    assert_eq!(
        ranges.len(),
        1,
        "{ranges:?}\n{table}\n{:?}\n{}",
        lab.dipamd.ledger(),
        lab.dipamd.log()
    );
    let r = &ranges[0];
    assert_eq!(
        (
            &r["size"],
            &r["orphans"],
            &r["free"],
            &r["pods"],
            &r["allocated"]
        ),
        (
            &Value::Null,
            &Value::Null,
            &Value::Null,
            &json!(1),
            &json!(1)
        ),
        "{r:#}"
    );
    assert!(
        r["sizeUnknown"]
            .as_str()
            .unwrap()
            .contains("azure-vnet-ipam"),
        "{r:#}"
    );
    let line = table
        .lines()
        .find(|l| l.starts_with(&format!("range:        {net} ipv4: ")))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        line.contains(": 1 allocated (1 pod, 0 agent, 0 pool); size unknown: azure-vnet-ipam"),
        "{line}"
    );
    let body = scrape(&msock);
    assert_eq!(
        gauge(&body, "dipam_range_addresses", &net, "ipv4", Some("pod")),
        Some(1.0),
        "{body}"
    );
    for (name, state) in [
        ("dipam_range_size", None),
        ("dipam_range_addresses", Some("orphan")),
        ("dipam_range_addresses", Some("free")),
    ] {
        assert_eq!(
            gauge(&body, name, &net, "ipv4", state),
            None,
            "{name} {state:?}: {body}"
        );
    }
}

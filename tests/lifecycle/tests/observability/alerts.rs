//! deploy/prometheus/alerts.yaml against real dipamd scrapes, with Debian's promtool
//! (tests/deps.sh extracts it from the `prometheus` package into `$DIPAM_TEST_CACHE`).
//!
//! `promtool check rules` validates the file. Then dipamd runs with metrics on a loopback
//! port, as the DaemonSet runs it, and is scraped three times: healthy (a pod added); after a
//! reservation made behind dipamd's back (an orphan), a recorded reservation deleted from
//! host-local's store (divergence) and a refused CNI GC; and after a SIGKILL (nothing
//! answers). Each scrape becomes promtool input series, labelled as Prometheus labels a
//! scrape (`job`, `instance`, and `up`), and `promtool test rules` asserts, for every rule in
//! the file, which alerts fire with which labels and annotations: none when healthy, exactly
//! the orphan, divergence and GC alerts when degraded, exactly DipamDown when down. The
//! series the rules and deploy/grafana/dipam.json's panels read are all in a real scrape.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read, Write},
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use dipam_lifecycle::{AgentLab, Attachment, NetNs, bins, deps, require_root, yaml};
use serde_json::{Value, json};

const JOB: &str = "dipam";

/// promtool, or `None` (after saying why, loudly) when tests/deps.sh recorded that it could
/// not be installed. Never a silent pass: neither promtool nor a reason fails the test.
fn promtool() -> Option<PathBuf> {
    let exe = deps::cache().join("prometheus/usr/bin/promtool");
    deps::installed(
        module_path!(),
        "promtool",
        &exe,
        exe.is_file(),
        "prometheus",
    )
}

fn rules_file() -> PathBuf {
    bins::workspace().join("deploy/prometheus/alerts.yaml")
}

/// Every rule of the file: (alert name, expression, labels, annotations).
struct Rule {
    alert: String,
    expr: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn rules() -> Vec<Rule> {
    let docs = yaml::parse(&std::fs::read_to_string(rules_file()).unwrap()).unwrap();
    let map = |v: &Value| -> BTreeMap<String, String> {
        v.as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect()
    };
    docs[0]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .map(|r| Rule {
            alert: r["alert"].as_str().unwrap().to_owned(),
            expr: r["expr"].as_str().unwrap().to_owned(),
            labels: map(&r["labels"]),
            annotations: map(&r["annotations"]),
        })
        .collect()
}

#[test]
fn promtool_checks_the_rules() {
    let Some(promtool) = promtool() else { return };
    let out = Command::new(promtool)
        .args(["check", "rules"])
        .arg(rules_file())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let n = rules().len();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("SUCCESS: {n} rules found")),
        "{out:?}"
    );
}

/// One scrape's body over plain HTTP/1.1, or `None` when nothing answers (Prometheus then
/// records `up 0`).
fn scrape(addr: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: dipamd\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    Some(out[out.find("\r\n\r\n").unwrap() + 4..].to_owned())
}

/// The samples of an OpenMetrics body as promtool series (`name{labels}` with the scrape's
/// `job` and `instance` added, as Prometheus adds them) and their values.
fn series(body: &str, instance: &str) -> BTreeMap<String, String> {
    let target = format!("job=\"{JOB}\",instance=\"{instance}\"");
    let mut out = BTreeMap::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (sample, value) = line.rsplit_once(' ').unwrap();
        let key = match sample.split_once('{') {
            Some((name, labels)) => format!("{name}{{{target},{labels}"),
            None => format!("{sample}{{{target}}}"),
        };
        out.insert(key, value.to_owned());
    }
    out.insert(format!("up{{{target}}}"), "1".into());
    out
}

/// The value of `name` (no labels) in a scrape.
fn value(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in:\n{body}"))
        .parse()
        .unwrap()
}

/// Minutes of each phase: the first scrape's values for `BEFORE` minutes, then the second's
/// until `EVAL`, when the alerts are evaluated (past every rule's `for`, inside every
/// `increase` window).
const BEFORE: usize = 10;
const EVAL: usize = 60;

/// promtool input series: `first`'s values for BEFORE minutes, then `then`'s (`_`: no sample).
fn input_series(first: &BTreeMap<String, String>, then: &BTreeMap<String, String>) -> Vec<Value> {
    let keys: BTreeSet<&String> = first.keys().chain(then.keys()).collect();
    keys.into_iter()
        .map(|k| {
            let values: Vec<&str> = (0..=EVAL)
                .map(|minute| {
                    let phase = if minute < BEFORE { first } else { then };
                    phase.get(k).map_or("_", String::as_str)
                })
                .collect();
            json!({"series": k, "values": values.join(" ")})
        })
        .collect()
}

/// How Prometheus prints `$value` for the whole numbers these gauges hold.
fn go_float(v: &str) -> String {
    let f: f64 = v.parse().unwrap();
    assert!(f.fract() == 0.0, "{v}");
    format!("{}", f as i64)
}

/// One promtool test: the series, and for every rule the alerts expected at EVAL. `firing`
/// names the alerts that must fire, each with the series whose value its `$value` shows.
fn test_case(
    name: &str,
    series: Vec<Value>,
    firing: &BTreeMap<&str, Option<&str>>,
    instance: &str,
) -> Value {
    test_case_with(name, series, firing, &BTreeMap::new(), instance)
}

/// [`test_case`], where an alert in `extra` also carries those labels of its series (a
/// per-network alert: `network`, `family`).
fn test_case_with(
    name: &str,
    series: Vec<Value>,
    firing: &BTreeMap<&str, Option<&str>>,
    extra: &BTreeMap<&str, BTreeMap<String, String>>,
    instance: &str,
) -> Value {
    let checks: Vec<Value> = rules()
        .iter()
        .map(|r| {
            let exp = match firing.get(r.alert.as_str()) {
                None => json!([]),
                Some(value) => {
                    let mut labels = r.labels.clone();
                    labels.insert("job".into(), JOB.into());
                    labels.insert("instance".into(), instance.into());
                    labels.extend(extra.get(r.alert.as_str()).cloned().unwrap_or_default());
                    let annotations: BTreeMap<_, _> = r
                        .annotations
                        .iter()
                        .map(|(k, t)| {
                            let mut s = t.clone();
                            for (label, v) in &labels {
                                s = s.replace(&format!("{{{{ $labels.{label} }}}}"), v);
                            }
                            if let Some(v) = value {
                                s = s.replace("{{ $value }}", v);
                            }
                            assert!(!s.contains("{{"), "{}: unrendered {s:?}", r.alert);
                            (k.clone(), s)
                        })
                        .collect();
                    json!([{"exp_labels": labels, "exp_annotations": annotations}])
                }
            };
            json!({"eval_time": format!("{EVAL}m"), "alertname": r.alert, "exp_alerts": exp})
        })
        .collect();
    json!({"name": name, "interval": "1m", "input_series": series, "alert_rule_test": checks})
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn alerts_fire_on_real_scrapes_exactly_when_they_should() {
    require_root!();
    let Some(promtool) = promtool() else { return };
    let addr = format!("127.0.0.1:{}", free_port());
    // As the DaemonSet runs it: the agent's router and health addresses, metrics on loopback.
    let mut lab = AgentLab::new(
        "ptp-dipam-host-local.conflist",
        "router,health",
        &[
            "--metrics-address",
            &addr,
            "--reconcile-interval",
            "1",
            "--gc-grace",
            "0",
        ],
    );
    lab.wait_ready(2);
    let list = lab.fx.list.clone();
    let ns = NetNs::new();
    let pod = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
    lab.rt.ipam(&list, 0, "ADD", &pod, None).unwrap();
    let healthy = scrape(&addr).expect("dipamd answers");
    assert!(
        healthy.contains("dipam_agent_addresses{state=\"ready\"} 2"),
        "{healthy}"
    );

    // An orphan: an address reserved straight through host-local, as a second runtime
    // sharing the store would, which no attachment in the ledger owns.
    let out = lab
        .rt
        .add_behind_dipams_back(&list, "reserved-behind-dipams-back");
    assert!(out.status.success(), "{out:?}");
    // Divergence: the pod's reservation vanishes from host-local's store (a wrong mount).
    let (_, _, ip) = dipam_lifecycle::hostlocal::reservations(lab.data.path(), &lab.network())
        .into_iter()
        .find(|(id, _, _)| *id == pod.container_id)
        .unwrap();
    std::fs::remove_file(lab.data.path().join(lab.network()).join(&ip)).unwrap();
    // A refused GC: the runtime's valid list is empty.
    let mut gc = list.clone();
    gc["cniVersion"] = json!("1.1.0");
    gc["plugins"][0]["cni.dev/valid-attachments"] = json!([]);
    assert_eq!(
        lab.rt
            .ipam(&gc, 0, "GC", &Attachment::new("", ""), None)
            .unwrap_err()
            .code,
        170
    );
    // The next reconciles (every second) see both.
    let deadline = Instant::now() + Duration::from_secs(20);
    let degraded = loop {
        let body = scrape(&addr).expect("dipamd answers");
        if value(&body, "dipam_divergence_orphans") >= 1.0
            && value(&body, "dipam_divergence_missing") >= 1.0
        {
            break body;
        }
        assert!(Instant::now() < deadline, "{body}\n{}", lab.dipamd.log());
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(value(&degraded, "dipam_gc_refused_total"), 1.0);
    assert_eq!(value(&healthy, "dipam_divergence_orphans"), 0.0);

    // Every dipam series a rule or a dashboard panel reads is in a real scrape: a renamed
    // series fails here.
    let dashboard: Value = serde_json::from_slice(
        &std::fs::read(bins::workspace().join("deploy/grafana/dipam.json")).unwrap(),
    )
    .unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    let exprs = rules()
        .into_iter()
        .map(|r| (r.alert, r.expr))
        .chain(panels.iter().flat_map(|p| {
            p["targets"].as_array().into_iter().flatten().map(|t| {
                (
                    p["title"].as_str().unwrap().to_owned(),
                    t["expr"].as_str().unwrap().to_owned(),
                )
            })
        }));
    let mut read = 0;
    for (what, expr) in exprs {
        for word in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("dipam_"))
        {
            read += 1;
            assert!(
                healthy.lines().any(|l| l.starts_with(word)),
                "{what}: {word} is not in a scrape:\n{healthy}"
            );
        }
    }
    assert!(read > 20, "{read}");

    lab.dipamd.kill9();
    assert!(scrape(&addr).is_none(), "nothing answers after the kill");

    let h = series(&healthy, &addr);
    let d = series(&degraded, &addr);
    let down: BTreeMap<String, String> = [(
        format!("up{{job=\"{JOB}\",instance=\"{addr}\"}}"),
        "0".into(),
    )]
    .into();
    let gauge = |name: &str| go_float(&d[&format!("{name}{{job=\"{JOB}\",instance=\"{addr}\"}}")]);
    let (orphans, missing) = (
        gauge("dipam_divergence_orphans"),
        gauge("dipam_divergence_missing"),
    );
    let degraded_firing: BTreeMap<&str, Option<&str>> = [
        ("DipamOrphanedAddresses", Some(orphans.as_str())),
        ("DipamRecordedAddressesMissing", Some(missing.as_str())),
        ("DipamGCRefused", None),
    ]
    .into();
    let tests = json!({
        "rule_files": [rules_file()],
        "evaluation_interval": "1m",
        "tests": [
            test_case("healthy", input_series(&h, &h), &BTreeMap::new(), &addr),
            test_case("degraded", input_series(&h, &d), &degraded_firing, &addr),
            test_case("down", input_series(&h, &down), &[("DipamDown", None)].into(), &addr),
        ],
    });
    promtool_test_rules(&promtool, &tests);
}

/// The "range nearly full" rule on real scrapes: a range host-local hands out 10 addresses
/// from (.10-.19, the gateway outside), the agent's router in it, metrics on loopback as the
/// DaemonSet runs them. With 2 free (20%) nothing fires; filled to its last address (host-local
/// then refuses the next ADD), `DipamRangeNearlyFull` fires for that network and family, and
/// no other rule does.
#[test]
fn range_nearly_full_fires_on_a_real_scrape_of_a_filled_range() {
    require_root!();
    let Some(promtool) = promtool() else { return };
    let addr = format!("127.0.0.1:{}", free_port());
    let mut lab = AgentLab::unstarted("ptp-dipam-host-local.conflist");
    let base = lab.subnet.cidr.trim_end_matches(".0/24").to_owned();
    let range = json!([[{
        "subnet": lab.subnet.cidr,
        "rangeStart": format!("{base}.10"),
        "rangeEnd": format!("{base}.19"),
    }]]);
    lab.fx = lab.fx.clone().with_ranges(range);
    lab.write_conflist();
    lab.set_roles(
        "router",
        &["--metrics-address", &addr, "--reconcile-interval", "1"],
    );
    lab.dipamd.start_again();
    lab.wait_ready(1);
    let list = lab.fx.list.clone();
    let net = lab.network();
    let add = || {
        let pod = Attachment::new(&dipam_lifecycle::unique("pod"), "/var/run/netns/none");
        lab.rt.ipam(&list, 0, "ADD", &pod, None)
    };
    // The range's free addresses, once a reconcile (every second) has counted `want`.
    let free_at = |want: f64| -> String {
        let line =
            format!("dipam_range_addresses{{network=\"{net}\",family=\"ipv4\",state=\"free\"}} ");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let body = scrape(&addr).expect("dipamd answers");
            let free: Option<f64> = body
                .lines()
                .find_map(|l| l.strip_prefix(&line))
                .map(|v| v.parse().unwrap());
            if free == Some(want) {
                return body;
            }
            assert!(Instant::now() < deadline, "{free:?}\n{body}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    for _ in 0..7 {
        add().unwrap();
    }
    let roomy = free_at(2.0);
    assert!(
        roomy.contains(&format!(
            "dipam_range_size{{network=\"{net}\",family=\"ipv4\"}} 10.0"
        )),
        "{roomy}"
    );
    for _ in 0..2 {
        add().unwrap();
    }
    add().expect_err("host-local refuses an ADD when the range is full");
    let full = free_at(0.0);

    let r = series(&roomy, &addr);
    let f = series(&full, &addr);
    let extra: BTreeMap<&str, BTreeMap<String, String>> = [(
        "DipamRangeNearlyFull",
        [
            ("network".to_owned(), net.clone()),
            ("family".to_owned(), "ipv4".to_owned()),
        ]
        .into(),
    )]
    .into();
    let tests = json!({
        "rule_files": [rules_file()],
        "evaluation_interval": "1m",
        "tests": [
            test_case("roomy", input_series(&r, &r), &BTreeMap::new(), &addr),
            test_case_with(
                "full",
                input_series(&r, &f),
                &[("DipamRangeNearlyFull", None)].into(),
                &extra,
                &addr,
            ),
        ],
    });
    promtool_test_rules(&promtool, &tests);
}

/// The "warm pool keeps missing" rule on a real scrape: dipamd with a watermark pool and
/// metrics on loopback; its first pod's ADD misses (the pool has no config for the network
/// yet), so the miss counter is in the scrape with its real labels. With that counter flat,
/// nothing fires; growing 2 a minute (a pool that keeps missing), `DipamWarmPoolMissing`
/// fires, and no other rule does.
#[test]
fn warm_pool_missing_fires_on_a_pool_that_keeps_missing() {
    require_root!();
    let Some(promtool) = promtool() else { return };
    let addr = format!("127.0.0.1:{}", free_port());
    let lab = AgentLab::new(
        "ptp-dipam-host-local.conflist",
        "",
        &[
            "--metrics-address",
            &addr,
            "--pool-target",
            "2",
            "--pool-release-after",
            "0",
        ],
    );
    let pod = Attachment::new(&dipam_lifecycle::unique("pod"), "/var/run/netns/none");
    lab.rt.ipam(&lab.fx.list, 0, "ADD", &pod, None).unwrap();
    let body = scrape(&addr).expect("dipamd answers");
    let s = series(&body, &addr);
    let miss = s
        .keys()
        .find(|k| k.starts_with("dipam_pool_requests_total{") && k.contains("outcome=\"miss\""))
        .unwrap_or_else(|| panic!("no miss counter in:\n{body}"))
        .clone();
    // The series is in a real scrape from the start (at 0: the first ADD of a new config
    // takes the normal path and teaches the pool its template, so it is no miss); promtool
    // below feeds the alert that very series, growing.
    assert!(s[&miss].parse::<f64>().is_ok(), "{body}");
    let growing: Vec<Value> = input_series(&s, &s)
        .into_iter()
        .map(|mut v| {
            if v["series"] == miss.as_str() {
                v["values"] = json!(format!("1+2x{EVAL}"));
            }
            v
        })
        .collect();
    let tests = json!({
        "rule_files": [rules_file()],
        "evaluation_interval": "1m",
        "tests": [
            test_case("flat", input_series(&s, &s), &BTreeMap::new(), &addr),
            test_case_with(
                "missing",
                growing,
                &[("DipamWarmPoolMissing", Some("30"))].into(),
                &[(
                    "DipamWarmPoolMissing",
                    [("outcome".to_owned(), "miss".to_owned())].into(),
                )]
                .into(),
                &addr,
            ),
        ],
    });
    promtool_test_rules(&promtool, &tests);
    lab.rt.ipam(&lab.fx.list, 0, "DEL", &pod, None).unwrap();
}

/// Runs `promtool test rules` on one test file made from `tests` and fails the test with
/// promtool's own output when a case does not hold.
fn promtool_test_rules(promtool: &std::path::Path, tests: &serde_json::Value) {
    // JSON is YAML: promtool reads it as is.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tests.yaml");
    std::fs::write(&file, serde_json::to_vec_pretty(tests).unwrap()).unwrap();
    dipam_lifecycle::cmd::run(Command::new(promtool).args(["test", "rules"]).arg(&file));
}

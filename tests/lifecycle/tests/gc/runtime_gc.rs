//! The runtime-aware GC (`dipamd --cri-endpoint`) against a real containerd driven through
//! CRI (src/containerd.rs): containerd never sends a CNI GC, so an attachment whose DEL went
//! elsewhere stays until dipamd, taking the runtime's pod sandboxes as the truth, frees it
//! after two passes. What must never be freed is not: a running sandbox's address, an
//! attachment made outside CRI, anything while the runtime cannot be reached or lists nothing.
//! dipamd runs on non-default paths (temp socket and state directory), as the harness's does.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use dipam_lifecycle::{
    Attachment, Containerd, Lab, NetNs, Subnet, hostlocal, require, require_root,
    runtime::result_ips,
};
use serde_json::Value;

/// A private containerd and the dipamd its conflist names, whose runtime-aware GC asks that
/// containerd. Fields drop in order: containerd first, so that its last DELs reach dipamd.
struct Bench {
    cd: Containerd,
    lab: Lab,
}

impl Bench {
    fn new(interval: &str, grace: &str) -> Self {
        let cd = Containerd::start();
        let endpoint = format!("unix://{}", cd.socket().display());
        let lab = lab(&endpoint, interval, grace);
        cd.set_conflist(lab.list());
        Self { cd, lab }
    }
}

/// One dipamd + host-local store (the Lab) whose runtime-aware GC asks `endpoint`, with
/// `interval` seconds between passes and no grace period unless `grace` says otherwise.
fn lab(endpoint: &str, interval: &str, grace: &str) -> Lab {
    Lab::with_flags(
        "dipam-host-local-1.1.0.conflist",
        &[
            "--cri-endpoint",
            endpoint,
            "--runtime-gc-interval",
            interval,
            "--gc-grace",
            grace,
        ],
    )
    .with_version("1.0.0")
}

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// `dipamctl status --json`'s runtimeGc object.
fn runtime_status(lab: &Lab) -> Value {
    json(&lab.dipamd.ctl(&["status", "--json"]))["runtimeGc"].clone()
}

/// Status once the runtime-aware GC refuses for `reason` ("unreachable", "empty") and its
/// refusal count has reached five: a refusal that holds over passes, not one pass's.
fn after_five_refusals(lab: &Lab, reason: &str) -> Value {
    wait_status(lab, &format!("refusing ({reason}) five times"), |s| {
        s["refusing"] == reason && s["refusals"].as_u64().unwrap_or(0) >= 5
    })
}

/// Waits until the runtime-aware GC's status satisfies `done` (its passes run on their own).
#[track_caller]
fn wait_status(lab: &Lab, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = runtime_status(lab);
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: status is {s:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One pass now (`dipamctl gc --from-runtime [--dry-run]`), as JSON, with every kept
/// attachment listed (`--kept 1000`: the lab's are a handful).
fn pass(lab: &Lab, dry_run: bool) -> Value {
    let mut args = vec!["gc", "--from-runtime", "--json", "--kept", "1000"];
    if dry_run {
        args.push("--dry-run");
    }
    let out = lab.dipamd.ctl(&args);
    let v = json(&out);
    assert!(
        out.status.success(),
        "gc --from-runtime: {v:#}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    v
}

/// The (containerID, outcome, keep codes) of every item and kept entry of a pass.
fn verdicts(v: &Value) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = ["items", "kept"]
        .iter()
        .flat_map(|k| v[*k].as_array().cloned().unwrap_or_default())
        .map(|i| {
            (
                i["containerID"].as_str().unwrap_or_default().to_owned(),
                i["outcome"].as_str().unwrap_or_default().to_owned(),
                i["keep"]
                    .as_array()
                    .map(|k| {
                        k.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

fn verdict(v: &Value, cid: &str) -> (String, String) {
    verdicts(v)
        .into_iter()
        .find(|(c, _, _)| c == cid)
        .map(|(_, o, k)| (o, k))
        .unwrap_or_else(|| panic!("{cid} not in {v:#}"))
}

/// A direct plugin ADD (no runtime) whose CNI_ARGS name a pod exactly as containerd's CRI
/// plugin does: recorded as made through CRI, for a runtime that does not know it.
fn cri_shaped(lab: &Lab) -> (NetNs, Attachment) {
    let (ns, mut att) = lab.pod();
    att.args = format!(
        "K8S_POD_NAMESPACE=default;K8S_POD_NAME=ghost;K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID=0b5c1a7e-0000-4000-8000-000000000001;IgnoreUnknown=1",
        att.container_id
    );
    lab.rt.add(lab.list(), &att).unwrap();
    (ns, att)
}

fn doctor_check(lab: &Lab) -> Value {
    let v = json(&lab.dipamd.ctl(&["doctor", "--json"]));
    v.as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "runtime-aware GC trusts the runtime's list")
        .cloned()
        .unwrap_or_else(|| panic!("no runtime GC check in {v:#}"))
}

/// The conflist changes under running sandboxes: containerd's DEL of a sandbox made on the
/// old network goes to the new one, and the old network's attachment leaks. The reconciler
/// frees it on its second pass, through host-local's DEL, while a sandbox still running on
/// the old network keeps its address, and one on the new network its own.
#[test]
fn a_conflist_swapped_under_a_sandbox_leaks_its_address_and_two_passes_free_it() {
    require!(dipam_lifecycle::containerd::unavailable());
    let subnet_b = Subnet::claim("10.77");
    // Passes only when asked (`dipamctl gc --from-runtime`), after the one at start: each
    // step below is one pass. A grace period the leak outlives by the first pass.
    let bench = Bench::new("3600", "1");
    let (cd, lab) = (&bench.cd, &bench.lab);
    let a = lab.network();
    let stays = cd.run_pod("stays").unwrap();
    let leaks = cd.run_pod("leaks").unwrap();
    let ip_stays = cd.pod_ip(&stays.id).unwrap();
    let ip_leaks = cd.pod_ip(&leaks.id).unwrap();

    // The same plugins, another network name and subnet: what a conflist update looks like.
    let fx_b = lab.fx.clone().unique_name().with_subnet(&subnet_b.cidr);
    let b = fx_b.name();
    cd.set_conflist(&fx_b.list);
    let new = cd.run_pod("new").unwrap();
    let ip_new = cd.pod_ip(&new.id).unwrap();
    assert!(
        subnet_b.contains(&ip_new),
        "{ip_new} not on the new network"
    );

    // containerd's own DELs (stop, then remove) go to the new network: the old one's
    // attachment stays, in the ledger and in host-local's store alike.
    cd.stop_pod(&leaks.id).unwrap();
    cd.remove_pod(&leaks.id).unwrap();
    let ledger_a = lab.dipamd.ledger_pairs(&a);
    assert!(
        ledger_a.contains(&(leaks.id.clone(), ip_leaks.clone())),
        "the swap should leak {ip_leaks}: {ledger_a:?}"
    );
    lab.assert_agree();
    // The record says it was made through CRI, for which pod.
    let rec = lab
        .dipamd
        .ledger()
        .into_iter()
        .find(|r| r["containerID"] == leaks.id.as_str())
        .unwrap();
    assert_eq!(rec["pod"]["namespace"], "default", "{rec:#}");
    assert_eq!(rec["pod"]["name"], "leaks", "{rec:#}");
    assert_eq!(
        rec["pod"]["uid"],
        leaks.config.metadata.as_ref().unwrap().uid.as_str(),
        "{rec:#}"
    );

    // Out of the grace period: the dry run says the next pass would keep it, as this pass is
    // the first to miss it. Wait for `new` (made after it) to leave the grace period too, so
    // that the passes below keep it for being listed alone: on a fast machine `leaks` is out
    // of grace while `new` is still in it ("listed,grace").
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let plan = pass(lab, true);
        let (outcome, keep) = verdict(&plan, &leaks.id);
        let new_keep = verdict(&plan, &new.id).1;
        if keep == "first-miss" && new_keep == "listed" {
            assert_eq!(outcome, "kept");
            break;
        }
        assert!(
            keep == "grace" || (keep == "first-miss" && new_keep.contains("grace")),
            "{plan:#}"
        );
        assert!(Instant::now() < deadline, "still in grace: {plan:#}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // First pass: missed once, kept.
    let first = pass(lab, false);
    assert_eq!(
        verdict(&first, &leaks.id),
        ("kept".into(), "first-miss".into())
    );
    assert_eq!(verdict(&first, &stays.id), ("kept".into(), "listed".into()));
    assert_eq!(verdict(&first, &new.id), ("kept".into(), "listed".into()));
    // The counts by reason cover them all, and a reply without --kept lists none of them.
    assert_eq!(first["keptByReason"]["first-miss"], 1, "{first:#}");
    assert_eq!(first["keptByReason"]["listed"], 2, "{first:#}");
    // (The next pass frees `leaks`: what it keeps are the two listed.)
    let counts = json(
        &lab.dipamd
            .ctl(&["gc", "--from-runtime", "--json", "--dry-run"]),
    );
    assert_eq!(counts["kept"], serde_json::json!([]), "{counts:#}");
    assert_eq!(counts["keptTotal"], 2, "{counts:#}");
    assert_eq!(counts["keptByReason"]["listed"], 2, "{counts:#}");
    assert_eq!(counts["keptNotListed"], 2, "{counts:#}");
    assert!(
        lab.dipamd
            .ledger_pairs(&a)
            .contains(&(leaks.id.clone(), ip_leaks.clone()))
    );
    // The plan for the next: it goes.
    let plan = pass(lab, true);
    assert_eq!(verdict(&plan, &leaks.id), ("planned".into(), String::new()));
    let table = lab.dipamd.ctl(&["gc", "--from-runtime", "--dry-run"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("default/leaks") && text.contains("1 would be freed by the next pass"),
        "{text}"
    );

    // Second pass: freed through host-local's DEL.
    let second = pass(lab, false);
    assert_eq!(
        verdict(&second, &leaks.id),
        ("freed".into(), String::new()),
        "{second:#}"
    );
    assert_eq!(
        lab.dipamd.ledger_pairs(&a),
        vec![(stays.id.clone(), ip_stays.clone())],
        "only the running sandbox stays on the old network"
    );
    lab.assert_agree();
    // The address says who freed it: the runtime-aware GC, not a DEL.
    let v = json(&lab.dipamd.ctl(&["explain", &ip_leaks, "--json"]));
    let holding = v["holdings"]
        .as_array()
        .and_then(|h| h.iter().find(|x| x["containerID"] == leaks.id.as_str()))
        .unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(holding["freedBy"], "runtime-gc", "{v:#}");
    assert!(
        holding["reason"]
            .as_str()
            .unwrap()
            .contains("the runtime-aware GC"),
        "{v:#}"
    );
    let on_b = lab.dipamd.ledger_pairs(&b);
    assert_eq!(on_b, vec![(new.id.clone(), ip_new.clone())]);
    assert_eq!(
        on_b,
        hostlocal::store_pairs(lab.data.path(), &b),
        "ledger and host-local agree on the new network"
    );
    // The running sandboxes still have their addresses, as CRI reports them.
    assert_eq!(cd.pod_ip(&stays.id).as_deref(), Some(ip_stays.as_str()));
    assert_eq!(cd.pod_ip(&new.id).as_deref(), Some(ip_new.as_str()));
    let s = runtime_status(lab);
    assert_eq!(s["freed"], 1, "{s:#}");
    assert_eq!(s["refusing"], "", "{s:#}");
    assert!(s["passes"].as_u64().unwrap() >= 3, "{s:#}");
}

/// An attachment made outside CRI (a direct plugin ADD, as `ctr run --cni` or podman make)
/// is never freed, however many passes miss it; the passes run on their own timer.
#[test]
fn an_attachment_made_outside_cri_is_never_freed() {
    require!(dipam_lifecycle::containerd::unavailable());
    let bench = Bench::new("0.2", "0");
    let (cd, lab) = (&bench.cd, &bench.lab);
    let pod = cd.run_pod("web").unwrap();
    // The harness's CNI_ARGS name a pod (namespace and name) but carry no K8S_POD_UID: not
    // made through CRI.
    let (_ns, att) = lab.pod();
    let direct = result_ips(&lab.rt.add(lab.list(), &att).unwrap()).remove(0);
    let before = runtime_status(lab)["passes"].as_u64().unwrap_or(0);
    let s = wait_status(lab, "five more passes", |s| {
        s["passes"].as_u64().unwrap_or(0) >= before + 5
    });
    assert_eq!(s["refusing"], "", "{s:#}");
    assert_eq!(s["freed"], 0, "{s:#}");
    let ledger = lab.dipamd.ledger_pairs(&lab.network());
    assert!(
        ledger.contains(&(att.container_id.clone(), direct.clone())),
        "{ledger:?}"
    );
    lab.assert_agree();
    let plan = pass(lab, true);
    assert_eq!(
        verdict(&plan, &att.container_id),
        ("kept".into(), "not-cri".into())
    );
    assert_eq!(verdict(&plan, &pod.id), ("kept".into(), "listed".into()));
    lab.rt.del(lab.list(), &att).unwrap();
}

/// A runtime that cannot be reached frees nothing, however stale the CRI attachments look,
/// and says so in status and doctor; the log says it once, not once per pass.
#[test]
fn an_unreachable_endpoint_frees_nothing_and_shows_the_refusal() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("unix://{}", dir.path().join("containerd.sock").display());
    let lab = lab(&endpoint, "0.2", "0");
    let (_ns, att) = cri_shaped(&lab);
    let s = after_five_refusals(&lab, "unreachable");
    let detail = s["refusingDetail"].as_str().unwrap_or_default();
    assert!(detail.contains("No such file or directory"), "{s:#}");
    assert_eq!(s["freed"], 0);
    assert_eq!(lab.ledger().len(), 1, "{:?}", lab.ledger());
    lab.assert_agree();
    let table = String::from_utf8_lossy(&lab.dipamd.ctl(&["status"]).stdout).into_owned();
    assert!(table.contains("refusing (unreachable)"), "{table}");
    let check = doctor_check(&lab);
    assert_eq!(check["ok"], false, "{check:#}");
    assert!(
        check["detail"].as_str().unwrap().contains("unreachable"),
        "{check:#}"
    );
    assert!(
        check["fix"].as_str().unwrap().contains("--cri-endpoint"),
        "{check:#}"
    );
    let out = lab.dipamd.ctl(&["doctor"]);
    assert!(!out.status.success(), "doctor passes while refusing");
    // One refusal line in the log for the whole outage.
    let log = lab.dipamd.log();
    assert_eq!(log.matches("runtime-aware GC refused").count(), 1, "{log}");
    // An operator's pass is refused the same way, and exits 1.
    let out = lab.dipamd.ctl(&["gc", "--from-runtime"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refused (unreachable)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lab.ledger().len(), 1);
    lab.rt.del(lab.list(), &att).unwrap();
}

/// A runtime that lists no sandbox while the ledger holds attachments made through CRI (a
/// runtime still restoring, or not the one that made them) frees nothing.
#[test]
fn an_empty_sandbox_list_with_cri_attachments_frees_nothing() {
    require!(dipam_lifecycle::containerd::unavailable());
    let bench = Bench::new("0.2", "0");
    let (cd, lab) = (&bench.cd, &bench.lab);
    assert!(cd.list_pods().unwrap().is_empty());
    let (_ns, att) = cri_shaped(lab);
    let s = after_five_refusals(lab, "empty");
    let detail = s["refusingDetail"].as_str().unwrap_or_default();
    assert!(detail.contains("1 attachment(s) made through CRI"), "{s:#}");
    assert_eq!(s["freed"], 0);
    assert_eq!(lab.ledger().len(), 1);
    lab.assert_agree();
    let check = doctor_check(lab);
    assert_eq!(check["ok"], false, "{check:#}");
    assert!(
        check["detail"].as_str().unwrap().contains("empty"),
        "{check:#}"
    );
    lab.rt.del(lab.list(), &att).unwrap();
}

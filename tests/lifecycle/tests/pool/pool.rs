//! The warm pool (`dipamd --warm-pool N`) against the real host-local: the pool fills, pods
//! take from it without a delegate exec of their own, DEL and CHECK reach the delegate under
//! the pool's key, GC keeps the pool and live pods and frees stale pooled pods (emulated for
//! Debian's host-local 1.1.1, which has no GC; natively by today's host-local, which has),
//! crashes while filling and right after a
//! take converge, a lowered or disabled pool is released at restart, and pods that ask for
//! their own addresses bypass it. After every step the ledger, read the way the delegate sees
//! it (a pooled pod under its pool key), equals the delegate's store exactly.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    path::Path,
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    AgentLab, Attachment, Dipamd, Lab, NetNs, deployment::Deployment, hostlocal, peers::Plugins,
    require_root, runtime::result_ips,
};
use serde_json::{Value, json};

const NODE: &str = "pooltest";

/// A Lab whose dipamd keeps a pool of `size` (plus `flags`).
fn lab(conflist: &str, size: usize, flags: &[&str]) -> Lab {
    let size = size.to_string();
    let mut all = vec!["--warm-pool", &size, "--node-name", NODE];
    all.extend_from_slice(flags);
    Lab::with_flags(conflist, &all)
}

/// The ledger of `network` as the delegate sees it (a pooled pod under its pool key).
fn delegate_view(d: &Dipamd, network: &str) -> Vec<(String, String)> {
    d.delegate_pairs(network)
}

/// host-local's reservations of `network`: (container ID, IP).
fn store(data: &Path, network: &str) -> Vec<(String, String)> {
    hostlocal::reservations(data, network)
        .into_iter()
        .map(|(id, _, ip)| (id, ip))
        .collect()
}

#[track_caller]
fn assert_agree(d: &Dipamd, data: &Path, network: &str) {
    assert_eq!(
        delegate_view(d, network),
        store(data, network),
        "ledger through delegate keys (left) and host-local's store (right) disagree"
    );
}

/// The pool's entries in the ledger.
fn entries(d: &Dipamd, network: &str) -> Vec<Value> {
    d.ledger()
        .into_iter()
        .filter(|a| a["network"] == network && a["owner"] == "pool")
        .collect()
}

/// A ledger record by container ID.
fn record(d: &Dipamd, network: &str, cid: &str) -> Option<Value> {
    d.ledger()
        .into_iter()
        .find(|a| a["network"] == network && a["containerID"] == cid)
}

fn status(d: &Dipamd) -> Value {
    let out = d.ctl(&["status", "--json"]);
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits until the pool holds exactly `n` committed entries and nothing is in flight.
#[track_caller]
fn wait_pool(d: &Dipamd, network: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let all: Vec<Value> = d
            .ledger()
            .into_iter()
            .filter(|a| a["network"] == network)
            .collect();
        let ready = all
            .iter()
            .filter(|a| a["owner"] == "pool" && a["state"] == "committed")
            .count();
        if ready == n && all.iter().all(|a| a["state"] == "committed") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the pool did not reach {n} entries: {all:#?}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The delegate's key of a pooled pod, asserting it is one of the pool's.
#[track_caller]
fn pool_key(d: &Dipamd, network: &str, cid: &str) -> String {
    let rec = record(d, network, cid).unwrap_or_else(|| panic!("{cid} is not in the ledger"));
    assert_eq!(rec["owner"], "pod", "{rec}");
    let key = rec["delegateKey"]["containerID"]
        .as_str()
        .unwrap_or_else(|| panic!("{cid} was not served from the pool: {rec}"))
        .to_owned();
    assert!(key.starts_with(&format!("dipam-pool-{NODE}-")), "{key}");
    assert_eq!(rec["delegateKey"]["ifname"], "eth0");
    key
}

/// The events `dipamctl explain` recorded for `cid`, once its last request is there.
fn explain_events(d: &Dipamd, cid: &str, requests: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = d.ctl(&["explain", cid, "--json"]);
        assert!(out.status.success());
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let events = v["events"].as_array().cloned().unwrap_or_default();
        if events.iter().filter(|e| e["kind"] == "request").count() >= requests {
            return events;
        }
        assert!(Instant::now() < deadline, "history of {cid}: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// (1), (2): the pool fills; pods take from it through the real ptp chain and as the main
/// plugin, with no delegate exec of their own (host-local's files name the pool's keys, and
/// the pod's history has no exec); the refiller brings it back each time; CHECK and DEL reach
/// host-local under the pool key, and DEL releases exactly that reservation.
#[test]
fn pods_take_from_the_pool_and_del_check_use_its_key() {
    require_root!();
    for conflist in [
        "ptp-dipam-host-local.conflist",
        "dipam-host-local-1.1.0.conflist",
    ] {
        let lab = lab(conflist, 4, &[]).with_version("1.0.0");
        let net = lab.network();
        let data = lab.data.path();
        // The first pod shows dipamd the network: the pool was empty, so it took the normal
        // path, and the refiller fills the pool for its config.
        let (_ns0, first) = lab.pod();
        lab.rt.add(lab.list(), &first).unwrap();
        assert!(record(&lab.dipamd, &net, &first.container_id).unwrap()["delegateKey"].is_null());
        wait_pool(&lab.dipamd, &net, 4);
        assert_agree(&lab.dipamd, data, &net);
        assert_eq!(store(data, &net).len(), 5);

        let mut pods = Vec::new();
        for i in 0..3 {
            let ready: Vec<(String, String)> = entries(&lab.dipamd, &net)
                .iter()
                .map(|e| {
                    (
                        e["containerID"].as_str().unwrap().to_owned(),
                        result_ips(&e["result"]).remove(0),
                    )
                })
                .collect();
            let (ns, pod) = lab.pod();
            let result = lab.rt.add(lab.list(), &pod).unwrap();
            let ip = result_ips(&result).remove(0);
            let key = pool_key(&lab.dipamd, &net, &pod.container_id);
            assert!(
                ready.contains(&(key.clone(), ip.clone())),
                "{conflist} pod {i}: got {ip} under {key}, the pool held {ready:?}"
            );
            // host-local never heard of the pod: its file names the pool's key.
            let held = store(data, &net);
            assert!(held.contains(&(key.clone(), ip.clone())), "{held:?}");
            assert!(!held.iter().any(|(id, _)| *id == pod.container_id));
            let events = explain_events(&lab.dipamd, &pod.container_id, 1);
            assert!(
                !events.iter().any(|e| e["kind"] == "exec"),
                "the pod's ADD ran the delegate: {events:#?}"
            );
            // The address is in the pod's netns.
            let addrs =
                String::from_utf8_lossy(&ns.exec(&["ip", "-o", "addr"]).stdout).into_owned();
            assert!(addrs.contains(&format!("{ip}/")), "{addrs}");
            assert!(
                entries(&lab.dipamd, &net)
                    .iter()
                    .all(|e| e["containerID"] != key)
            );
            wait_pool(&lab.dipamd, &net, 4);
            assert_agree(&lab.dipamd, data, &net);
            pods.push((ns, pod, key, ip));
        }
        let s = status(&lab.dipamd);
        assert_eq!(s["warmPool"]["size"], 4, "{s}");
        assert_eq!(s["warmPool"]["hits"], 3, "{s}");
        assert_eq!(s["warmPool"]["misses"], 1, "{s}");
        let pool = &s["warmPool"]["pools"][0];
        assert_eq!(
            (pool["ready"].as_u64(), pool["target"].as_u64()),
            (Some(4), Some(4)),
            "{s}"
        );

        // CHECK runs host-local's CHECK under the pool key (host-local looks its reservation
        // up by container ID: the pod's own would fail).
        for (_, pod, _, _) in &pods {
            lab.rt
                .check(lab.list(), pod)
                .unwrap_or_else(|e| panic!("{conflist}: {e}"));
        }
        // DEL releases exactly the pod's reservation under its pool key; the pool is not
        // given the address back.
        let (_ns, pod, key, ip) = pods.remove(1);
        let before = entries(&lab.dipamd, &net);
        lab.rt.del(lab.list(), &pod).unwrap();
        let held = store(data, &net);
        assert!(!held.iter().any(|(id, _)| *id == key), "{held:?}");
        assert!(!held.iter().any(|(_, i)| *i == ip), "{held:?}");
        assert_eq!(entries(&lab.dipamd, &net), before);
        assert!(record(&lab.dipamd, &net, &pod.container_id).is_none());
        assert_agree(&lab.dipamd, data, &net);
        // A second DEL is still a success, and releases nothing else.
        lab.rt.del(lab.list(), &pod).unwrap();
        assert_eq!(store(data, &net), held);
        for (_, pod, _, _) in &pods {
            lab.rt.del(lab.list(), pod).unwrap();
        }
        lab.rt.del(lab.list(), &first).unwrap();
        assert_agree(&lab.dipamd, data, &net);
        assert_eq!(store(data, &net).len(), 4, "only the pool is left");
    }
}

fn gc(lab: &Lab, valid: &[&Attachment]) -> Result<Value, dipam_lifecycle::CniError> {
    dipam_lifecycle::runtime::settle_before_gc();
    lab.rt
        .ipam_gc(lab.list(), dipam_lifecycle::runtime::gc_list(valid))
}

/// (3): a GC whose valid list names the live pods (never the pool's keys, which a runtime does
/// not know) frees nothing of the pool and nothing of a live pod, and frees a stale pod that
/// came from the pool: its pool key's reservation goes. Emulated for host-local (store
/// compared through the delegate keys) with Debian's host-local 1.1.1; native with today's
/// (its own GC handed the valid set under the pool keys).
#[test]
fn gc_keeps_the_pool_and_live_pods_and_frees_stale_pooled_pods() {
    require_root!();
    for plugins in [Plugins::Debian, Plugins::Current] {
        let delegate = format!("host-local {}", plugins.version());
        let size = 3.to_string();
        let flags = ["--warm-pool", &size, "--node-name", NODE, "--gc-grace", "0"];
        let lab = Lab::with_plugins("ptp-dipam-host-local.conflist", &flags, plugins)
            .with_version("1.1.0");
        let net = lab.network();
        let data = lab.data.path();
        let ns = NetNs::new();
        let add = |cid: &str| {
            let a = Attachment::new(&dipam_lifecycle::unique(cid), &ns.path());
            lab.rt.ipam(lab.list(), 0, "ADD", &a, None).unwrap();
            a
        };
        let own = add("own");
        wait_pool(&lab.dipamd, &net, 3);
        let live = add("live");
        let stale = add("stale");
        let live_key = pool_key(&lab.dipamd, &net, &live.container_id);
        let stale_key = pool_key(&lab.dipamd, &net, &stale.container_id);
        wait_pool(&lab.dipamd, &net, 3);
        assert_agree(&lab.dipamd, data, &net);
        let pool_before = entries(&lab.dipamd, &net);

        gc(&lab, &[&own, &live]).unwrap_or_else(|e| panic!("{delegate}: {e}"));
        let held = store(data, &net);
        assert!(
            !held.iter().any(|(id, _)| *id == stale_key),
            "{delegate}: {held:?}"
        );
        assert!(
            held.iter().any(|(id, _)| *id == live_key),
            "{delegate}: {held:?}"
        );
        assert!(
            held.iter().any(|(id, _)| *id == own.container_id),
            "{delegate}"
        );
        assert!(record(&lab.dipamd, &net, &stale.container_id).is_none());
        assert_eq!(
            entries(&lab.dipamd, &net),
            pool_before,
            "{delegate}: GC touched the pool"
        );
        assert_eq!(held.len(), 5, "{delegate}: {held:?}");
        assert_agree(&lab.dipamd, data, &net);
        if plugins == Plugins::Current {
            assert!(
                lab.dipamd
                    .log()
                    .contains("delegate GC run with the augmented valid list")
            );
        }
        lab.rt.ipam(lab.list(), 0, "DEL", &live, None).unwrap();
        lab.rt.ipam(lab.list(), 0, "DEL", &own, None).unwrap();
        assert_agree(&lab.dipamd, data, &net);
        assert_eq!(
            store(data, &net).len(),
            3,
            "{delegate}: only the pool is left"
        );
    }
}

fn wait_dead(d: &Dipamd) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while d
        .pid()
        .is_some_and(|pid| Path::new(&format!("/proc/{pid}/stat")).exists() && !zombie(pid))
    {
        assert!(
            Instant::now() < deadline,
            "dipamd did not crash:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// (4a): dipamd SIGKILLed at each step of filling an entry (the pool is filled from the
/// agent's conflist, which appears once dipamd serves, so no pod is involved): after a restart the interrupted entry is
/// released, the pool refills, and nothing leaks.
#[test]
fn a_crash_while_filling_leaks_nothing() {
    require_root!();
    for point in ["add-after-intent", "add-after-exec", "add-after-commit"] {
        let mut lab = AgentLab::unstarted("ptp-dipam-host-local.conflist");
        lab.set_roles("", &["--warm-pool", "2", "--crash-at", point]);
        lab.dipamd.start_again();
        // Only now, so the fill (and the crash) comes after dipamd has answered.
        lab.write_conflist();
        wait_dead(&lab.dipamd);
        assert!(lab.dipamd.log().contains("fault injection"), "{point}");
        lab.dipamd.kill9();
        lab.set_roles("", &["--warm-pool", "2"]);
        lab.dipamd.start_again();
        let net = lab.network();
        wait_pool(&lab.dipamd, &net, 2);
        assert_agree(&lab.dipamd, lab.data.path(), &net);
        assert_eq!(store(lab.data.path(), &net).len(), 2, "{point}: leaked");
        let s = status(&lab.dipamd);
        assert_eq!(s["warmPool"]["pools"][0]["source"], "conflist", "{s}");
    }
}

/// (4b): dipamd SIGKILLed right after the commit that hands an entry to a pod: the runtime saw
/// an error; after the restart the pod holds the address (recorded, under the pool key), the
/// pool does not offer it again, and the runtime's DEL after the failed ADD releases it.
#[test]
fn a_crash_right_after_a_take_converges_without_double_use() {
    require_root!();
    let mut lab = lab(
        "ptp-dipam-host-local.conflist",
        2,
        &["--crash-at", "pool-after-take"],
    )
    .with_plugin_timeout(2);
    let net = lab.network();
    let ns = NetNs::new();
    let first = Attachment::new(&dipam_lifecycle::unique("first"), &ns.path());
    lab.rt.ipam(lab.list(), 0, "ADD", &first, None).unwrap();
    wait_pool(&lab.dipamd, &net, 2);
    let pod = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
    let e = lab.rt.ipam(lab.list(), 0, "ADD", &pod, None).unwrap_err();
    assert_eq!(e.code, 11, "{e}");
    lab.dipamd.kill9();
    lab.dipamd
        .set_flags(&["--warm-pool", "2", "--node-name", NODE]);
    lab.dipamd.start_again();
    let key = pool_key(&lab.dipamd, &net, &pod.container_id);
    wait_pool(&lab.dipamd, &net, 2);
    assert!(
        entries(&lab.dipamd, &net)
            .iter()
            .all(|e| e["containerID"] != key)
    );
    assert_agree(&lab.dipamd, lab.data.path(), &net);
    // Every address is held once.
    let held = store(lab.data.path(), &net);
    let mut ips: Vec<&String> = held.iter().map(|(_, ip)| ip).collect();
    ips.dedup();
    assert_eq!(ips.len(), held.len(), "{held:?}");
    // The runtime's DEL after the failed ADD, then its retry.
    lab.rt.ipam(lab.list(), 0, "DEL", &pod, None).unwrap();
    assert!(
        !store(lab.data.path(), &net)
            .iter()
            .any(|(id, _)| *id == key)
    );
    lab.rt.ipam(lab.list(), 0, "ADD", &pod, None).unwrap();
    pool_key(&lab.dipamd, &net, &pod.container_id);
    wait_pool(&lab.dipamd, &net, 2);
    assert_agree(&lab.dipamd, lab.data.path(), &net);
}

/// (4c): dipamd SIGKILLed at each step of releasing a surplus entry (after it is marked
/// `deleting`, after it is forgotten): the next start finishes the release, the pool is at
/// its new size, and nothing leaks.
#[test]
fn a_crash_while_releasing_leaks_nothing() {
    crash_while_releasing(None);
}

/// (4c) with dipamd under the shipped unit's capability set and descriptor limit.
#[test]
fn a_crash_while_releasing_leaks_nothing_unit() {
    crash_while_releasing(Some(Deployment::ShippedUnit));
}

/// (4c) with dipamd started like the DaemonSet: its flags (an agent's router and health
/// addresses from its `--conflist`, so the pool also fills from that conflist before any
/// pod), its securityContext and its read-only root.
#[test]
fn a_crash_while_releasing_leaks_nothing_daemonset() {
    crash_while_releasing(Some(Deployment::DaemonSet));
}

fn crash_while_releasing(shape: Option<Deployment>) {
    require_root!();
    for point in ["pool-release-after-mark", "pool-after-release"] {
        let mut lab = lab("ptp-dipam-host-local.conflist", 4, &[]);
        if let Some(d) = shape {
            d.start(&mut lab, None, &[]);
        }
        let net = lab.network();
        let ns = NetNs::new();
        let first = Attachment::new(&dipam_lifecycle::unique("first"), &ns.path());
        lab.rt.ipam(lab.list(), 0, "ADD", &first, None).unwrap();
        wait_pool(&lab.dipamd, &net, 4);
        lab.dipamd.terminate();
        lab.dipamd
            .set_flags(&["--warm-pool", "2", "--node-name", NODE, "--crash-at", point]);
        // The release runs as soon as dipamd serves: the crash point may end it before the
        // harness sees the socket answer.
        lab.dipamd.start_again_unwaited();
        wait_dead(&lab.dipamd);
        assert!(lab.dipamd.log().contains("fault injection"), "{point}");
        lab.dipamd.kill9();
        lab.dipamd.set_flags(&[
            "--pool-target",
            "2",
            "--pool-release-after",
            "0",
            "--node-name",
            NODE,
        ]);
        lab.dipamd.start_again();
        wait_pool(&lab.dipamd, &net, 2);
        assert_agree(&lab.dipamd, lab.data.path(), &net);
        let agent = lab
            .dipamd
            .ledger()
            .iter()
            .filter(|a| a["owner"].as_str().is_some_and(|o| o.starts_with("agent")))
            .count();
        assert_eq!(
            store(lab.data.path(), &net).len(),
            3 + agent,
            "{point}: the pod, 2 entries and the agent's {agent}, nothing leaked"
        );
        let s = status(&lab.dipamd);
        assert_eq!(s["warmPool"]["target"], 2, "{s}");
    }
}

/// (5): a lowered --warm-pool releases the surplus at restart, and --warm-pool 0 releases the
/// whole pool; pods served from it keep their addresses and release them normally.
#[test]
fn a_lowered_or_disabled_pool_is_released_at_restart() {
    require_root!();
    let mut lab = lab("ptp-dipam-host-local.conflist", 4, &[]);
    let net = lab.network();
    let data = lab.data.path().to_owned();
    let ns = NetNs::new();
    let first = Attachment::new(&dipam_lifecycle::unique("first"), &ns.path());
    lab.rt.ipam(lab.list(), 0, "ADD", &first, None).unwrap();
    wait_pool(&lab.dipamd, &net, 4);
    let pod = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
    lab.rt.ipam(lab.list(), 0, "ADD", &pod, None).unwrap();
    let key = pool_key(&lab.dipamd, &net, &pod.container_id);
    wait_pool(&lab.dipamd, &net, 4);

    lab.dipamd.terminate();
    lab.dipamd
        .set_flags(&["--warm-pool", "2", "--node-name", NODE]);
    lab.dipamd.start_again();
    wait_pool(&lab.dipamd, &net, 2);
    assert_agree(&lab.dipamd, &data, &net);
    assert_eq!(store(&data, &net).len(), 4, "2 pods + 2 entries");
    assert_eq!(pool_key(&lab.dipamd, &net, &pod.container_id), key);

    lab.dipamd.terminate();
    lab.dipamd.set_flags(&[]);
    lab.dipamd.start_again();
    wait_pool(&lab.dipamd, &net, 0);
    assert_agree(&lab.dipamd, &data, &net);
    assert_eq!(store(&data, &net).len(), 2, "only the pods are left");
    let s = status(&lab.dipamd);
    assert_eq!(s["warmPool"]["size"], 0, "{s}");
    // Off, a new pod takes the normal path; the pooled pod still releases under its key.
    let late = Attachment::new(&dipam_lifecycle::unique("late"), &ns.path());
    lab.rt.ipam(lab.list(), 0, "ADD", &late, None).unwrap();
    assert!(record(&lab.dipamd, &net, &late.container_id).unwrap()["delegateKey"].is_null());
    lab.rt.ipam(lab.list(), 0, "DEL", &pod, None).unwrap();
    assert!(!store(&data, &net).iter().any(|(id, _)| *id == key));
    assert_agree(&lab.dipamd, &data, &net);
}

/// (6): requests that ask for their own address (CNI_ARGS `IP=`, `runtimeConfig.ips`) take the
/// normal path and get it; the pool stays whole. A runtime cannot use the pool's IDs.
#[test]
fn own_addresses_bypass_the_pool_and_its_ids_are_reserved() {
    require_root!();
    let lab = lab("ptp-dipam-host-local.conflist", 2, &[]);
    let net = lab.network();
    let data = lab.data.path();
    let ns = NetNs::new();
    let first = Attachment::new(&dipam_lifecycle::unique("first"), &ns.path());
    lab.rt.ipam(lab.list(), 0, "ADD", &first, None).unwrap();
    wait_pool(&lab.dipamd, &net, 2);
    let pool_before = entries(&lab.dipamd, &net);
    let base = lab.subnet.cidr.trim_end_matches("0/24").to_owned();

    let mut by_args = Attachment::new(&dipam_lifecycle::unique("byargs"), &ns.path());
    by_args.args.push_str(&format!(";IP={base}200"));
    let r = lab.rt.ipam(lab.list(), 0, "ADD", &by_args, None).unwrap();
    assert_eq!(result_ips(&r), vec![format!("{base}200")]);

    let by_rc = Attachment::new(&dipam_lifecycle::unique("byrc"), &ns.path());
    let mut list = lab.list().clone();
    list["plugins"][0]["runtimeConfig"] = json!({"ips": [format!("{base}201/24")]});
    let r = lab.rt.ipam(&list, 0, "ADD", &by_rc, None).unwrap();
    assert_eq!(result_ips(&r), vec![format!("{base}201")]);

    for a in [&by_args, &by_rc] {
        assert!(record(&lab.dipamd, &net, &a.container_id).unwrap()["delegateKey"].is_null());
        assert!(
            store(data, &net)
                .iter()
                .any(|(id, _)| *id == a.container_id)
        );
    }
    assert_eq!(entries(&lab.dipamd, &net), pool_before);
    assert_eq!(status(&lab.dipamd)["warmPool"]["bypassed"], 2);
    assert_agree(&lab.dipamd, data, &net);

    // The pool's IDs are not a runtime's: ADD and DEL are refused (code 4).
    let taken = pool_before[0]["containerID"].as_str().unwrap();
    let intruder = Attachment::new(taken, &ns.path());
    let e = lab
        .rt
        .ipam(lab.list(), 0, "ADD", &intruder, None)
        .unwrap_err();
    assert_eq!(e.code, 4, "{e}");
    let e = lab
        .rt
        .ipam(lab.list(), 0, "DEL", &intruder, None)
        .unwrap_err();
    assert_eq!(e.code, 4, "{e}");
    assert_eq!(entries(&lab.dipamd, &net), pool_before);
    assert_agree(&lab.dipamd, data, &net);
}

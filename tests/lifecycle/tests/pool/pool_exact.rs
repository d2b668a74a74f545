//! The warm pool never starves a pod (docs/cfp.md §7.7, "Never starving a pod"): a range
//! whose addresses are exactly the agent's plus the pods', against the real host-local, the
//! real dipamd with its watermark pool on and the agent's router address held, churned by 8
//! workers at once. Every ADD must succeed (a pod the delegate refuses takes a pooled
//! address), nothing may leak, and at the end the ledger, read the way the delegate sees it,
//! equals host-local's store.
//!
//! The churn calls the plugin in IPAM mode, as ptp does for each pod (the chain's own
//! plugins add nothing to the pool's accounting and would only slow the 1,000 rounds).
//!
//! It runs three times: under the test's own start, under the shipped unit's restrictions and
//! started like the DaemonSet (deployment.rs), each with an agent watching
//! (`dipamctl agent watch`): the router's address must stay the same and ready in every
//! message the agent gets while the pool and the pods fight over the range's last addresses.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};

use dipam_lifecycle::{AgentLab, Attachment, NetNs, deployment::Deployment, require_root};
use serde_json::Value;

/// A /27: host-local hands out .2 to .30, 29 addresses: the router's and 28 pods'.
const PODS: usize = 28;
const WORKERS: usize = 8;
/// Churns (a DEL and an ADD of one pod) in all; DIPAM_POOL_CHURNS overrides it.
const CHURNS: usize = 1000;

fn churns() -> usize {
    dipam_lifecycle::env_or("DIPAM_POOL_CHURNS", CHURNS)
}

fn status(lab: &AgentLab) -> Value {
    let out = lab.dipamd.ctl(&["status", "--json"]);
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits until the network is at rest (no record in flight, the pool's refiller settled),
/// then asserts the ledger, read through delegate keys, equals host-local's store.
#[track_caller]
fn assert_settled(lab: &AgentLab, context: &str) {
    let net = lab.network();
    let settled = lab.dipamd.wait_settled(&net, || lab.delegate_store());
    assert!(
        settled,
        "{context}: ledger through delegate keys (left) and host-local's store (right) \
         disagree:\n{:?}\n{:?}\n{}",
        lab.dipamd.delegate_pairs(&net),
        lab.delegate_store(),
        lab.dipamd.log()
    );
}

#[test]
fn a_range_exactly_as_large_as_its_pods_never_starves_one() {
    never_starves(None);
}

/// The same, dipamd under the shipped unit's capability set and descriptor limit.
#[test]
fn a_range_exactly_as_large_as_its_pods_never_starves_one_unit() {
    never_starves(Some(Deployment::ShippedUnit));
}

/// The same, dipamd started like the DaemonSet (its securityContext, read-only root, mounts,
/// and its flags beside the test's own: the test's `--conflist`, roles and node name win).
#[test]
fn a_range_exactly_as_large_as_its_pods_never_starves_one_daemonset() {
    never_starves(Some(Deployment::DaemonSet));
}

/// The router's (IP, state) in every message an agent's watch printed.
fn router_seen(lines: &[Value]) -> Vec<(String, String)> {
    lines
        .iter()
        .flat_map(dipam_lifecycle::agentlab::addresses_of)
        .filter(|a| a.0 == "router")
        .map(|a| (a.2, a.3))
        .collect()
}

fn never_starves(shape: Option<Deployment>) {
    require_root!();
    let mut lab = AgentLab::unstarted("ptp-dipam-host-local.conflist");
    let cidr = lab.subnet.cidr.replace("/24", "/27");
    lab.fx = lab.fx.clone().with_subnet(&cidr);
    lab.write_conflist();
    lab.set_roles(
        "router",
        &[
            "--pool-target",
            "4",
            "--pool-max-above",
            "8",
            "--pool-release-after",
            "1",
        ],
    );
    match shape {
        Some(d) => {
            d.start_agent_lab(&mut lab);
        }
        None => lab.dipamd.start_again(),
    }
    lab.wait_ready(1);
    let router = lab.addresses();
    let watch = lab.watch();
    watch.wait_for("the router ready", |v| {
        router_seen(std::slice::from_ref(v)).contains(&(router[0].2.clone(), "ready".into()))
    });
    let nss: Vec<NetNs> = (0..PODS).map(|_| NetNs::new()).collect();
    let pods: Vec<Attachment> = nss
        .iter()
        .map(|ns| Attachment::new(&dipam_lifecycle::unique("exact"), &ns.path()))
        .collect();
    let list = lab.fx.list.clone();
    let failures = std::sync::Mutex::new(Vec::<String>::new());
    let add = |pod: &Attachment, what: &str| {
        if let Err(e) = lab.rt.ipam(&list, 0, "ADD", pod, None) {
            failures
                .lock()
                .unwrap()
                .push(format!("{what} ADD {}: {e}", pod.container_id));
        }
    };
    // Every pod up, 8 at a time: the pool started filling from the conflist, so some come
    // from it and the last ones need what the pool holds.
    std::thread::scope(|s| {
        for w in 0..WORKERS {
            let (pods, add) = (&pods, &add);
            s.spawn(move || {
                for pod in pods.iter().skip(w).step_by(WORKERS) {
                    add(pod, "first");
                }
            });
        }
    });
    let total = churns();
    let done = AtomicUsize::new(0);
    let dels = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for w in 0..WORKERS {
            let (pods, add, done, dels, failures) = (&pods, &add, &done, &dels, &failures);
            let (lab, list) = (&lab, &list);
            s.spawn(move || {
                let mine: Vec<&Attachment> = pods.iter().skip(w).step_by(WORKERS).collect();
                for pod in mine.iter().cycle() {
                    let n = done.fetch_add(1, Ordering::Relaxed);
                    if n >= total {
                        return;
                    }
                    match lab.rt.ipam(list, 0, "DEL", pod, None) {
                        Ok(_) => {
                            dels.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => failures
                            .lock()
                            .unwrap()
                            .push(format!("churn {n} DEL {}: {e}", pod.container_id)),
                    }
                    add(pod, &format!("churn {n}"));
                }
            });
        }
    });
    let failed = failures.into_inner().unwrap();
    let shape_name = shape.map_or("the test's own start", Deployment::name);
    let s = status(&lab);
    let pool = &s["warmPool"]["pools"][0];
    println!(
        "{shape_name}: {total} churns, {} ADDs, {} failed; pool: {} taken, {} missed, {} \
         rescued, {} made, {} released",
        total + PODS,
        failed.len(),
        pool["hits"],
        pool["misses"],
        pool["rescues"],
        pool["refills"],
        pool["releases"]
    );
    assert!(
        failed.is_empty(),
        "{shape_name}: {failed:#?}\n{s}\n{}",
        lab.dipamd.log()
    );
    assert_eq!(dels.load(Ordering::Relaxed), total);
    // The pool served pods (it was on, not merely idle), and the range is full: every
    // address is a pod's or the router's, none left in the pool.
    assert!(pool["hits"].as_u64().unwrap() > 0, "{s}");
    assert_settled(&lab, "after the churn");
    let held = lab.delegate_store();
    assert_eq!(
        held.len(),
        PODS + 1,
        "every address is a pod's or the router's: {held:?}"
    );
    let mut ips: Vec<&String> = held.iter().map(|(_, ip)| ip).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), held.len(), "an address held twice: {held:?}");
    // Every pod gone: their addresses go back to host-local, the pool refills to its
    // target from them, and nothing else is held.
    for pod in &pods {
        lab.rt.ipam(&list, 0, "DEL", pod, None).unwrap();
    }
    assert_settled(&lab, "after every pod's DEL");
    let held = lab.delegate_store();
    let pooled = held
        .iter()
        .filter(|(id, _)| id.starts_with("dipam-pool-"))
        .count();
    assert_eq!(
        held.len(),
        1 + pooled,
        "only the router and the pool: {held:?}"
    );
    assert!(
        pooled <= 4 + 8,
        "the pool above target + max-above: {held:?}"
    );
    let after = lab.addresses();
    assert_eq!(after, router, "{shape_name}: the router's address changed");
    // What the agent saw all along: the router's one address, ready, never taken away by the
    // pool or a pod while the range was full.
    let seen = router_seen(&watch.finish());
    assert!(!seen.is_empty(), "{shape_name}: the agent saw nothing");
    assert!(
        seen.iter()
            .all(|s| *s == (router[0].2.clone(), "ready".into())),
        "{shape_name}: the agent saw the router as {seen:?}, not only {:?} ready",
        router[0].2
    );
}

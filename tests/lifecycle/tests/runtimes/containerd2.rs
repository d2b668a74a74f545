//! containerd 2.x (built from its Go module by tests/deps.sh; docs/compatibility.md), driven
//! through CRI as kubelet drives it (src/containerd.rs, config format 3), beside the 1.6
//! tests of containerd.rs. It is the first runtime here that sends CNI 1.1: STATUS on every
//! CRI Status call from 2.0.1 on (go-cni v1.1.11), a failure marking NetworkReady=false.
//! It still sends no GC: the runtime-aware GC (`dipamd --cri-endpoint`) collects for it.
//!
//! dipamd runs under the shipped systemd unit's capability set, on non-default socket, state
//! and spool paths, with an agent role allocated beside the pods.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use dipam_lifecycle::{
    AgentLab, Containerd,
    containerd::{Build, Pod},
    peers::Peer,
    require, require_peers,
    shapes::{Seeded, churn_while_killing, churn_while_upgrading, retry, shipped_unit_setpriv},
    unique,
};
use serde_json::Value;

/// How a bench's dipamd runs the runtime-aware GC.
#[derive(Clone, Copy)]
enum Gc {
    Off,
    /// On, with passes only when the test asks (`dipamctl gc --from-runtime`), no grace.
    Manual,
    /// On, as shipped: `--gc-grace` and `--runtime-gc-interval` at their defaults.
    Shipped,
}

/// `dipamd --dead-after`'s default (docs/configuration.md).
const DEAD_AFTER_DEFAULT: &str = "30";

/// A dipamd with an agent (role `router`) and a private containerd 2 using its conflist at
/// cniVersion 1.1.0. Fields drop in order: containerd first, so its last DELs reach dipamd.
struct Bench {
    cd: Containerd,
    lab: AgentLab,
}

impl Bench {
    fn new(peers: &[Peer], conflist: &str, flags: &[&str], cri: bool) -> Self {
        let gc = if cri { Gc::Manual } else { Gc::Off };
        Self::with_gc(peers, conflist, flags, gc)
    }

    fn with_gc(peers: &[Peer], conflist: &str, flags: &[&str], gc: Gc) -> Self {
        let cd = Containerd::start_build(Build::from_peers(peers));
        // A ptp that takes 1.1.0 (Debian's 1.1.1 refuses it), when IPAM mode needs one.
        if let Some(ptp) = peers.iter().find(|p| p.name == "ptp") {
            cd.use_plugin("ptp", &ptp.path);
        }
        let mut lab = AgentLab::unstarted(conflist);
        lab.fx = lab.fx.clone().with_version("1.1.0");
        lab.write_conflist();
        let spool = lab.dipamd.dir.path().join("elsewhere/spool");
        let spool = spool.display().to_string();
        let endpoint = format!("unix://{}", cd.socket().display());
        let mut all = vec!["--spool-dir", spool.as_str()];
        match gc {
            Gc::Off => all.extend(["--gc-grace", "0"]),
            Gc::Manual => all.extend([
                "--gc-grace",
                "0",
                "--cri-endpoint",
                endpoint.as_str(),
                "--reconcile-interval",
                "3600",
                "--runtime-gc-interval",
                "3600",
            ]),
            // As the shipped unit and DaemonSet run it: the endpoint, every default kept (the
            // harness turns the evidence pass off for tests not about it: back to its default).
            Gc::Shipped => all.extend([
                "--cri-endpoint",
                endpoint.as_str(),
                "--dead-after",
                DEAD_AFTER_DEFAULT,
            ]),
        }
        all.extend_from_slice(flags);
        lab.set_roles("router", &all);
        lab.dipamd.run_under(&shipped_unit_setpriv());
        lab.dipamd.start_again();
        lab.wait_ready(1);
        cd.set_conflist(&lab.fx.list);
        Self { cd, lab }
    }

    /// The ledger's one address for `pod`, which CRI reports too.
    #[track_caller]
    fn address_of(&self, pod: &Pod) -> String {
        let ledger = self.lab.ledger();
        let mine: Vec<_> = ledger.iter().filter(|(cid, _)| *cid == pod.id).collect();
        assert_eq!(
            mine.len(),
            1,
            "CNI_CONTAINERID is the sandbox ID: {ledger:?}"
        );
        assert_eq!(
            self.cd.pod_ip(&pod.id).as_deref(),
            Some(mine[0].1.as_str()),
            "CRI's pod IP is the ledger's"
        );
        mine[0].1.clone()
    }
}

fn pods_at_1_1_0(peers: &[Peer], conflist: &str) {
    let b = Bench::new(peers, conflist, &[], false);
    eprintln!("{} with {conflist} at 1.1.0", b.cd.build().label);
    let router = b.lab.addresses()[0].2.clone();
    let pods: Vec<Pod> = (0..3)
        .map(|i| {
            b.cd.run_pod(&format!("web-{i}"))
                .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", b.lab.dipamd.log()))
        })
        .collect();
    let mut ips: Vec<String> = pods.iter().map(|p| b.address_of(p)).collect();
    ips.push(router.split('/').next().unwrap().to_owned());
    ips.sort();
    ips.dedup();
    assert_eq!(
        ips.len(),
        4,
        "pods and the agent's router are distinct: {ips:?}"
    );
    b.lab.assert_agree();
    // The pod sees its address in its own namespace.
    let c = b.cd.start_sleeper(&pods[0]).unwrap();
    let (code, out, _) =
        b.cd.exec_sync(&c, &["ip", "-4", "addr", "show", "eth0"])
            .unwrap();
    assert_eq!(code, 0);
    assert!(out.contains(&b.address_of(&pods[0])), "{out}");
    for p in &pods {
        b.cd.stop_pod(&p.id).unwrap();
        b.cd.remove_pod(&p.id).unwrap();
    }
    assert_eq!(
        b.lab.ledger().len(),
        1,
        "only the router: {:?}",
        b.lab.ledger()
    );
    b.lab.assert_agree();
}

#[test]
fn main_mode_pods_at_1_1_0() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers = require_peers!("containerd", "ctr", "containerd-shim-runc-v2");
    pods_at_1_1_0(&peers, "dipam-host-local-1.1.0.conflist");
}

#[test]
fn ipam_mode_pods_at_1_1_0_under_ptp_1_10() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers = require_peers!("containerd", "ctr", "containerd-shim-runc-v2", "ptp");
    pods_at_1_1_0(&peers, "ptp-dipam-host-local.conflist");
}

/// Waits until CRI's NetworkReady is `want`; returns its reason and message.
#[track_caller]
fn wait_network_ready(cd: &Containerd, want: bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ready, why) = cd.network_ready().unwrap();
        if ready == want {
            return why;
        }
        assert!(
            Instant::now() < deadline,
            "NetworkReady stayed {ready} ({why}) for 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// CRI Status follows dipamd: NetworkReady while it serves, not while it is SIGKILLed (the
/// plugin's STATUS answers 50 and containerd reports it), and again once it is back; a pod
/// runs then.
#[test]
fn network_ready_follows_dipamd() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers = require_peers!("containerd", "ctr", "containerd-shim-runc-v2");
    let mut b = Bench::new(&peers, "dipam-host-local-1.1.0.conflist", &[], false);
    wait_network_ready(&b.cd, true);
    let before = b.cd.run_pod("before").unwrap();
    b.address_of(&before);

    b.lab.dipamd.kill9();
    let why = wait_network_ready(&b.cd, false);
    assert!(why.contains("dipam"), "the reason names the plugin: {why}");
    // A running pod keeps its address meanwhile.
    assert!(b.cd.pod_ip(&before.id).is_some());

    b.lab.dipamd.start_again();
    b.lab.wait_ready(1);
    wait_network_ready(&b.cd, true);
    let after = b.cd.run_pod("after").unwrap();
    assert_ne!(b.address_of(&after), b.address_of(&before));
    b.lab.assert_agree();
}

/// The runtime-aware GC against containerd 2: a sandbox whose DELs went to another network
/// (the conflist swapped under it) leaks its address; two passes free it, while the running
/// sandbox and the agent's router keep theirs.
#[test]
fn runtime_aware_gc_frees_what_containerd_2_leaked() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers = require_peers!("containerd", "ctr", "containerd-shim-runc-v2");
    let b = Bench::new(&peers, "dipam-host-local-1.1.0.conflist", &[], true);
    let a = b.lab.network();
    let stays = b.cd.run_pod("stays").unwrap();
    let leaks = b.cd.run_pod("leaks").unwrap();
    let ip_stays = b.address_of(&stays);
    let ip_leaks = b.address_of(&leaks);
    let subnet_b = dipam_lifecycle::Subnet::claim("10.77");
    let fx_b = b.lab.fx.clone().unique_name().with_subnet(&subnet_b.cidr);
    b.cd.set_conflist(&fx_b.list);
    b.cd.stop_pod(&leaks.id).unwrap();
    b.cd.remove_pod(&leaks.id).unwrap();
    assert!(
        b.lab
            .dipamd
            .ledger_pairs(&a)
            .contains(&(leaks.id.clone(), ip_leaks.clone())),
        "the swap leaks {ip_leaks}"
    );
    let pass = || -> Value {
        dipam_lifecycle::cmd::json(&b.lab.dipamd.ctl(&["gc", "--from-runtime", "--json"]))
    };
    let mut freed = false;
    for _ in 0..4 {
        pass();
        if !b
            .lab
            .dipamd
            .ledger_pairs(&a)
            .iter()
            .any(|(id, _)| *id == leaks.id)
        {
            freed = true;
            break;
        }
    }
    assert!(freed, "not freed in 4 passes:\n{}", b.lab.dipamd.log());
    let left = b.lab.dipamd.ledger_pairs(&a);
    assert!(left.contains(&(stays.id.clone(), ip_stays)), "{left:?}");
    assert_eq!(
        left.iter()
            .filter(|(id, _)| id.starts_with("dipam"))
            .count()
            + left.iter().filter(|(id, _)| *id == stays.id).count(),
        left.len(),
        "only the running sandbox and the agent's router stay: {left:?}"
    );
    assert_eq!(b.lab.addresses().len(), 1);
    b.lab.assert_agree();
}

/// dipamd SIGKILLed at random moments while containerd 2 runs, stops and removes pods through
/// CRI (a failed RunPodSandbox retried under a new name, as kubelet retries), with an agent
/// watching. Afterwards everything converges: no sandbox left, the ledger holds only the
/// router (the same address throughout), host-local's store holds exactly the ledger, and the
/// watch saw every restart in order. The seed and kill points are printed; dipamd's log
/// follows a failure.
#[test]
fn sigkill_mid_traffic_converges_and_leaks_nothing() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers = require_peers!("containerd", "ctr", "containerd-shim-runc-v2");
    let mut b = Bench::new(&peers, "dipam-host-local.conflist", &[], false);
    let mut rng = Seeded::new("containerd2 sigkill_mid_traffic_converges_and_leaks_nothing");
    let router = b.lab.addresses();
    let watch = b.lab.watch();
    let Bench { cd, lab } = &mut b;
    let cd = &*cd;
    let cycle = |_: u32| {
        let pod = retry("RunPodSandbox", 60, || cd.run_pod(&unique("churn")));
        retry("StopPodSandbox", 60, || cd.stop_pod(&pod.id));
        retry("RemovePodSandbox", 60, || cd.remove_pod(&pod.id));
    };
    let cycles = churn_while_killing(&mut lab.dipamd, &mut rng, 4, &cycle);
    eprintln!("{cycles} pod cycles across 4 SIGKILLs (seed {})", rng.seed);
    assert!(cycles > 0, "no pod ran");
    b.lab.wait_ready(1);
    assert_eq!(b.lab.addresses(), router, "seed {}", rng.seed);
    assert!(b.cd.list_pods().unwrap().is_empty(), "sandboxes left");
    b.lab.assert_converged(1, &format!("seed {}", rng.seed));
    watch.finish_across_restarts();
}

/// Upgrades fail no pod (docs/cfp.md §8.4): while containerd 2 runs, stops and removes pods
/// through CRI, dipamd is upgraded 10 times as a package upgrade or a DaemonSet's rolling
/// update does it (new binary installed, SIGTERM, start), under the shipped unit's
/// restrictions with an agent watching. No CRI call fails (nothing is retried here, unlike
/// the SIGKILL test above), containerd's NetworkReady (its CNI STATUS) never turns false,
/// the agent's router keeps its address, and nothing is left behind.
#[test]
fn ten_upgrades_fail_no_pod_call() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers = require_peers!("containerd", "ctr", "containerd-shim-runc-v2");
    let mut b = Bench::new(
        &peers,
        "dipam-host-local-1.1.0.conflist",
        &["--shutdown-timeout", "3"],
        false,
    );
    let mut rng = Seeded::new("containerd2 ten_upgrades_fail_no_pod_call");
    let router = b.lab.addresses();
    let watch = b.lab.watch();
    let failed = std::sync::Mutex::new(Vec::new());
    let Bench { cd, lab } = &mut b;
    let cd = &*cd;
    let note = |what: &str, r: Result<(), String>| {
        if let Err(e) = r {
            failed.lock().unwrap().push(format!("{what}: {e}"));
        }
    };
    let cycle = |i: u32| {
        let name = unique("upgrade");
        match cd.run_pod(&name) {
            Ok(pod) => {
                note(
                    "StopPodSandbox",
                    cd.stop_pod(&pod.id).map_err(|e| e.to_string()),
                );
                note(
                    "RemovePodSandbox",
                    cd.remove_pod(&pod.id).map_err(|e| e.to_string()),
                );
            }
            Err(e) => note(&format!("RunPodSandbox {name}"), Err(e.to_string())),
        }
        if i.is_multiple_of(2) {
            let ready = cd.network_ready().map_err(|e| e.to_string());
            note(
                "NetworkReady",
                ready.and_then(|(ok, why)| if ok { Ok(()) } else { Err(why) }),
            );
        }
    };
    let cycles = churn_while_upgrading(
        &mut lab.dipamd,
        &mut rng,
        10,
        Duration::from_secs(8),
        &cycle,
    );
    let failed = failed.into_inner().unwrap();
    eprintln!("{cycles} pod cycles across 10 upgrades (seed {})", rng.seed);
    assert!(cycles >= 10, "too few pods to mean anything: {cycles}");
    assert!(
        failed.is_empty(),
        "{} calls failed (seed {}):\n{failed:#?}\n{}",
        failed.len(),
        rng.seed,
        b.lab.dipamd.log()
    );
    b.lab.wait_ready(1);
    assert_eq!(b.lab.addresses(), router, "seed {}", rng.seed);
    assert!(b.cd.list_pods().unwrap().is_empty(), "sandboxes left");
    b.lab.assert_converged(1, &format!("seed {}", rng.seed));
    watch.finish_across_restarts();
}

/// The leak bound (docs/cfp.md §7.4): on containerd 2, which never sends a CNI GC, an address
/// whose pod is gone is freed within this, by the runtime-aware GC as shipped.
const LEAK_BOUND: Duration = Duration::from_secs(60);

/// Waits until no pod record of `b`'s network but `keep`'s is left; returns how long it took,
/// or panics past [`LEAK_BOUND`] with the ledger and dipamd's log.
#[track_caller]
fn freed_within_bound(b: &Bench, keep: &[&str], since: Instant, what: &str) -> Duration {
    loop {
        let left: Vec<_> = b
            .lab
            .ledger()
            .into_iter()
            .filter(|(id, _)| !id.starts_with("dipam-") && !keep.contains(&id.as_str()))
            .collect();
        if left.is_empty() {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < LEAK_BOUND,
            "{what}: {left:?} still held {:?} after the pod went\n{}",
            LEAK_BOUND,
            b.lab.dipamd.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The running pod `stays` kept `ip`, the agent's router kept its address (`router`), the
/// ledger agrees with host-local; then, the bench's own conflist back, the last pod goes and
/// only the router is left.
#[track_caller]
fn nothing_live_was_freed(
    b: &Bench,
    stays: &Pod,
    ip: &str,
    router: &[(String, String, String, String)],
) {
    assert_eq!(b.address_of(stays), ip);
    assert_eq!(b.lab.addresses(), router);
    b.lab.assert_agree();
    b.cd.set_conflist(&b.lab.fx.list);
    b.cd.stop_pod(&stays.id).unwrap();
    b.cd.remove_pod(&stays.id).unwrap();
    b.lab.assert_converged(1, "after the last pod");
}

/// A chained plugin that fails both ADD and DEL (containerd/containerd#12130's shape): the
/// sandbox's RunPodSandbox fails after dipam's ADD succeeded, containerd's teardown DEL stops
/// at the failing plugin and never reaches dipam, and containerd drops the sandbox. With the
/// runtime-aware GC as shipped, its address is freed within 60 s, while a running pod and the
/// agent's router keep theirs.
#[test]
fn a_chained_plugin_failing_add_and_del_leaks_nothing_past_60_s() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers = require_peers!("containerd", "ctr", "containerd-shim-runc-v2");
    let b = Bench::with_gc(&peers, "dipam-host-local-1.1.0.conflist", &[], Gc::Shipped);
    let router = b.lab.addresses();
    let stays = b.cd.run_pod("stays").unwrap();
    let ip_stays = b.address_of(&stays);
    let bin = tempfile::tempdir().unwrap();
    let failing = bin.path().join("fails-add-and-del");
    std::fs::write(
        &failing,
        "#!/bin/sh\ncat >/dev/null\ncase \"$CNI_COMMAND\" in\n\
         VERSION) echo '{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"1.0.0\",\"1.1.0\"]}' ;;\n\
         ADD|DEL) echo '{\"cniVersion\":\"1.1.0\",\"code\":999,\"msg\":\"chained plugin fails\"}'; exit 1 ;;\n\
         esac\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &failing,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    b.cd.use_plugin("fails-add-and-del", &failing);
    let mut chained = b.lab.fx.list.clone();
    chained["plugins"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"type": "fails-add-and-del"}));
    b.cd.set_conflist(&chained);
    let e = b.cd.run_pod("fails").unwrap_err();
    let since = Instant::now();
    assert!(e.message().contains("chained plugin fails"), "{e}");
    assert!(
        b.lab.ledger().len() >= 3,
        "dipam's ADD of the failed sandbox is recorded: {:?}",
        b.lab.ledger()
    );
    let took = freed_within_bound(&b, &[stays.id.as_str()], since, "containerd#12130");
    eprintln!("the failed sandbox's address was freed {took:?} after RunPodSandbox failed");
    nothing_live_was_freed(&b, &stays, &ip_stays, &router);
}

/// The conflist swapped under running pods: containerd's DELs of a removed sandbox go to the
/// new network, and the old network's attachment would stay forever. With the runtime-aware
/// GC as shipped it is freed within 60 s of the sandbox's removal; the pod still running on
/// the old network keeps its address.
#[test]
fn a_conflist_swapped_under_running_pods_leaks_nothing_past_60_s() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers = require_peers!("containerd", "ctr", "containerd-shim-runc-v2");
    let b = Bench::with_gc(&peers, "dipam-host-local-1.1.0.conflist", &[], Gc::Shipped);
    let router = b.lab.addresses();
    let stays = b.cd.run_pod("stays").unwrap();
    let leaks = b.cd.run_pod("leaks").unwrap();
    let ip_stays = b.address_of(&stays);
    b.address_of(&leaks);
    let subnet_b = dipam_lifecycle::Subnet::claim("10.77");
    let fx_b = b.lab.fx.clone().unique_name().with_subnet(&subnet_b.cidr);
    b.cd.set_conflist(&fx_b.list);
    b.cd.stop_pod(&leaks.id).unwrap();
    b.cd.remove_pod(&leaks.id).unwrap();
    let since = Instant::now();
    let took = freed_within_bound(&b, &[stays.id.as_str()], since, "conflist swap");
    eprintln!("the swapped-out sandbox's address was freed {took:?} after its removal");
    nothing_live_was_freed(&b, &stays, &ip_stays, &router);
}

/// Stops and removes sandbox `id` as kubelet does, each retried until it succeeds (60 s).
fn remove_as_kubelet(b: &Bench, id: &str) {
    retry("StopPodSandbox", 60, || b.cd.stop_pod(id));
    retry("RemovePodSandbox", 60, || b.cd.remove_pod(id));
}

/// A DEL lost with the spool unreachable: dipamd is SIGKILLed and its spool is out of reach
/// (the pointer beside the socket and the spool directory itself gone, as after /run was
/// emptied), so the plugin's DEL of a stopped pod fails (11) and nothing is spooled.
/// containerd keeps the sandbox and its CNI result while a teardown fails (its
/// `internal/cri/server/sandbox_stop.go`), and kubelet retries stopping and removing it; the
/// test retries as kubelet does. dipamd starts again (on containerd 2, which never sends a CNI
/// GC, with the GC as shipped): the lost pod's address is freed within 60 s, ledger =
/// host-local's store, and the running pod and the agent's router keep theirs.
/// `DIPAM_LOST_DEL_RUNS` sets how many runs it makes (default 1), each on a fresh bench.
#[test]
fn a_del_lost_with_the_spool_unreachable_leaks_nothing_past_60_s() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers = require_peers!("containerd", "ctr", "containerd-shim-runc-v2");
    let n = runs("DIPAM_LOST_DEL_RUNS");
    for run in 1..=n {
        eprintln!("run {run} of {n}: dipamd SIGKILLed, its spool removed, then a DEL");
        a_del_lost_with_the_spool_unreachable(&peers);
    }
}

/// How many runs a looped test makes: `var`, default 1.
fn runs(var: &str) -> u32 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn a_del_lost_with_the_spool_unreachable(peers: &[Peer]) {
    let mut b = Bench::with_gc(peers, "dipam-host-local-1.1.0.conflist", &[], Gc::Shipped);
    let router = b.lab.addresses();
    let stays = b.cd.run_pod("stays").unwrap();
    let lost = b.cd.run_pod("lost").unwrap();
    let ip_stays = b.address_of(&stays);
    let ip_lost = b.address_of(&lost);
    b.lab.dipamd.kill9();
    let spool = b.lab.dipamd.dir.path().join("elsewhere/spool");
    std::fs::remove_file(format!("{}.spool", b.lab.dipamd.socket().display())).unwrap();
    std::fs::remove_dir_all(&spool).unwrap();
    let e = b.cd.stop_pod(&lost.id).unwrap_err();
    assert!(
        e.message().contains("destroy network"),
        "the DEL failed: {e}"
    );
    assert!(!spool.exists(), "the failed DEL spooled nothing");
    assert!(
        b.cd.list_pods().unwrap().iter().any(|p| p.id == lost.id),
        "containerd keeps the sandbox whose teardown failed"
    );
    b.lab.dipamd.start_again();
    b.lab.wait_ready(1);
    let since = Instant::now();
    assert!(
        b.lab
            .ledger()
            .iter()
            .any(|(id, ip)| *id == lost.id && *ip == ip_lost),
        "nothing released the lost DEL's address while dipamd was down"
    );
    remove_as_kubelet(&b, &lost.id);
    let took = freed_within_bound(&b, &[stays.id.as_str()], since, "a DEL lost");
    eprintln!("the lost DEL's address was freed {took:?} after dipamd started again");
    nothing_live_was_freed(&b, &stays, &ip_stays, &router);
}

/// A runtime killed with its pods: containerd SIGKILLed with the shims of two of three pods
/// (their pause processes die with them), the network namespace of one of the dead deleted
/// as a crash's cleanup leaves it, the other's left mounted. While containerd is down (longer
/// than a runtime-aware GC interval) the runtime's list is unreachable, the looks prove
/// nothing dead and nothing is freed. containerd starts again on its state: it restores the
/// three, the dead two NOTREADY, which the test stops and removes as kubelet does for a dead
/// sandbox. Their addresses are freed within 60 s of containerd's start; the live pod keeps
/// its address through the passes and the evidence looks of the following 45 s, and the
/// agent's router keeps its own.
/// `DIPAM_RUNTIME_KILL_RUNS` sets how many runs it makes (default 1), each on a fresh bench.
#[test]
fn a_runtime_killed_with_its_pods_leaks_nothing_past_60_s() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers = require_peers!("containerd", "ctr", "containerd-shim-runc-v2");
    let n = runs("DIPAM_RUNTIME_KILL_RUNS");
    for run in 1..=n {
        eprintln!(
            "run {run} of {n}: containerd SIGKILLed with the shims of dead-0 and dead-1, \
             dead-0's netns deleted"
        );
        a_runtime_killed_with_its_pods(&peers);
    }
}

fn a_runtime_killed_with_its_pods(peers: &[Peer]) {
    let mut b = Bench::with_gc(peers, "dipam-host-local-1.1.0.conflist", &[], Gc::Shipped);
    let router = b.lab.addresses();
    let live = b.cd.run_pod("live").unwrap();
    let dead: Vec<Pod> = (0..2)
        .map(|i| b.cd.run_pod(&format!("dead-{i}")).unwrap())
        .collect();
    let ip_live = b.address_of(&live);
    for p in &dead {
        b.address_of(p);
    }
    let gone_ns = b.cd.netns_path(&dead[0].id).expect("the pod's netns");
    let ids: Vec<&str> = dead.iter().map(|p| p.id.as_str()).collect();
    b.cd.kill9_with(&ids);
    dipam_lifecycle::containerd::delete_netns(&gone_ns);
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(
        b.lab.ledger().len(),
        4,
        "nothing is freed while the runtime is down: {:?}",
        b.lab.ledger()
    );
    b.cd.start_again();
    let since = Instant::now();
    let notready: Vec<String> =
        b.cd.list_pods()
            .unwrap()
            .into_iter()
            .filter(|p| p.state != 0)
            .map(|p| p.id)
            .collect();
    let mut want: Vec<String> = dead.iter().map(|p| p.id.clone()).collect();
    want.sort();
    let mut got = notready.clone();
    got.sort();
    assert_eq!(got, want, "containerd restored the dead pods NOTREADY");
    for id in &notready {
        remove_as_kubelet(&b, id);
    }
    let took = freed_within_bound(&b, &[live.id.as_str()], since, "a runtime killed");
    eprintln!("the dead pods' addresses were freed {took:?} after containerd started again");
    while since.elapsed() < Duration::from_secs(45) {
        assert!(
            b.lab
                .ledger()
                .iter()
                .any(|(id, ip)| *id == live.id && *ip == ip_live),
            "the live pod's address was freed:\n{}",
            b.lab.dipamd.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    nothing_live_was_freed(&b, &live, &ip_live, &router);
}

/// `dipamctl install` judges the runtimes that read the conf dir, found from their own
/// configs: a 1.1.0 conflist for the directory a running containerd 2 reads installs without
/// --force and without the 1.1.0 warning, although Debian's containerd 1.6 and podman 4 are
/// in PATH (they read /etc/cni/net.d, which the conflist never reaches). (The refusal when
/// the running reader is containerd 1.6 is containerd.rs `containerd_cni_versions`.)
#[test]
fn install_judges_the_runtime_that_reads_the_conf_dir() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers = require_peers!("containerd", "ctr", "containerd-shim-runc-v2");
    let cd = Containerd::start_build(Build::from_peers(&peers));
    let dir = tempfile::tempdir().unwrap();
    let conflist = dir.path().join("src.conflist");
    let mut list: Value = serde_json::from_slice(
        &std::fs::read(
            dipam_lifecycle::bins::workspace().join("conflist/dipam-host-local-1.1.0.conflist"),
        )
        .unwrap(),
    )
    .unwrap();
    list["name"] = unique("judged").into();
    std::fs::write(&conflist, list.to_string()).unwrap();
    let install = |conf_dir: &std::path::Path, extra: &[&str]| {
        std::process::Command::new(dipam_lifecycle::bins::bin("dipamctl"))
            .args(["install", "--no-man-pages", "--plugin"])
            .arg(dipam_lifecycle::bins::bin("dipam"))
            .arg("--cni-bin-dir")
            .arg(dir.path().join("bin"))
            .arg("--conf-dir")
            .arg(conf_dir)
            .arg("--conflist")
            .arg(&conflist)
            .args(["--cni-path", "/usr/lib/cni"])
            .args(extra)
            // Debian's containerd 1.6 and podman 4.3 are here, as on the node.
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .output()
            .unwrap()
    };
    let out = install(&cd.conf_dir(), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "refused for containerd 2's own conf dir: {err}"
    );
    assert!(!err.contains("warning"), "{err}");
}

/// utime + stime of `pid` (/proc/<pid>/stat fields 14 and 15), in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command (field 2) may hold spaces: count from after its closing parenthesis.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // rest starts at field 3: utime is field 14, stime field 15.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// What an idle node pays (docs/performance.md, "Idle CPU with 110 pods"): `DIPAM_IDLE_PODS`
/// pods (default 110, kubelet's default `--max-pods`) run on containerd 2; dipamd has the GC
/// as shipped (the runtime-aware GC every 10 s on containerd's socket, the evidence pass
/// looking every 15 s at every netns, route and sandbox), under the shipped unit's
/// restrictions, with the agent's router. Once every pod is older than the grace period (so
/// each look judges all of them), dipamd's utime + stime over 60 s is read from /proc. It
/// must stay under 5% of one CPU, and no pod may be freed meanwhile. Prints the figure with
/// the load it was measured under.
#[test]
fn idle_cpu_with_110_pods_and_every_look_on() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers = require_peers!("containerd", "ctr", "containerd-shim-runc-v2");
    let n: usize = dipam_lifecycle::env_or("DIPAM_IDLE_PODS", 110);
    let b = Bench::with_gc(&peers, "dipam-host-local-1.1.0.conflist", &[], Gc::Shipped);
    let started = Instant::now();
    let pods: Vec<Pod> = (0..n)
        .map(|_| retry("RunPodSandbox", 120, || b.cd.run_pod(&unique("idle"))))
        .collect();
    eprintln!("{n} pods ran in {:?}", started.elapsed());
    let pods_in_ledger = || {
        b.lab
            .ledger()
            .iter()
            .filter(|(id, _)| pods.iter().any(|p| p.id == *id))
            .count()
    };
    assert_eq!(pods_in_ledger(), n);
    // Past --gc-grace (30 s) for the last pod, and one more runtime-GC interval.
    std::thread::sleep(Duration::from_secs(42));
    let pid = b.lab.dipamd.pid().expect("dipamd runs");
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let (before, t0, load0) = (cpu_ticks(pid), Instant::now(), load());
    std::thread::sleep(Duration::from_secs(60));
    let (after, wall, load1) = (cpu_ticks(pid), t0.elapsed(), load());
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu_s = (after - before) as f64 / hz;
    let share = cpu_s / wall.as_secs_f64();
    eprintln!(
        "idle dipamd with {n} pods, runtime-aware GC every 10 s and the evidence pass on: \
         {cpu_s:.2} s of CPU in {:.1} s = {:.2}% of one CPU (loadavg before: {} after: {})",
        wall.as_secs_f64(),
        share * 100.0,
        load0.trim(),
        load1.trim()
    );
    assert_eq!(pods_in_ledger(), n, "a live pod was freed while idle");
    assert!(
        share < 0.05,
        "idle dipamd took {:.2}% of a CPU",
        share * 100.0
    );
    for p in &pods {
        remove_as_kubelet(&b, &p.id);
    }
    b.lab.assert_converged(1, "after the idle pods");
}

//! The real azure-vnet-ipam (github.com/Azure/azure-container-networking, `cni/ipam/plugin`,
//! built by tests/deps.sh; docs/compatibility.md) as dipam's delegate, without Azure: its
//! file-backed source (`"environment": "fileIpam"`) in a private mount namespace
//! (src/azure.rs). dipamd runs the way a node runs it: under the shipped systemd unit's
//! capability set, on non-default socket, state and spool paths, with the agent's roles and
//! claims. After every step the ledger and the plugin's own state file agree exactly.
//!
//! The plugin's CHECK is a no-op, so dipam's restart protocol cannot rest on it: for this
//! delegate dipamd verifies an agent address by asking for it again under the same container
//! ID (docs/cfp.md §7.6). `state_lost_in_a_reboot_*` is the case a CHECK would miss.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    AgentLab, Attachment, NetNs, Runtime,
    azure::AzureNode,
    netns, require_peers, require_root,
    runtime::{gc_entry, result_ips},
    shapes::{Seeded, protect_system_strict, shipped_unit_setpriv, unit_read_write_paths},
};
use serde_json::{Value, json};

/// One dipamd (shipped unit's capabilities, private mounts for the plugin, agent roles) with
/// the real azure-vnet-ipam as the delegate of `conflist` (AgentLab's azure node, a pool of
/// 12), at `version`.
struct Bench {
    lab: AgentLab,
}

impl Bench {
    fn new(conflist: &str, version: &str, roles: &str, extra: &[&str]) -> Self {
        let mut lab = AgentLab::unstarted_with_pool(conflist, 12);
        lab.fx = lab.fx.clone().with_version(version);
        lab.dipamd.run_under(&shipped_unit_setpriv());
        let spool = lab.dipamd.dir.path().join("elsewhere/spool");
        let spool = spool.display().to_string();
        let mut flags = vec![
            "--spool-dir",
            spool.as_str(),
            "--gc-grace",
            "0",
            "--agent-check-interval",
            "3600",
        ];
        flags.extend_from_slice(extra);
        lab.write_conflist();
        lab.set_roles(roles, &flags);
        lab.dipamd.start_again();
        Self { lab }
    }

    fn node(&self) -> &AzureNode {
        self.lab
            .azure
            .as_ref()
            .expect("an azure conflist has a node")
    }

    fn list(&self) -> &Value {
        &self.lab.fx.list
    }

    fn main_mode(&self) -> bool {
        self.lab.fx.is_main_mode()
    }

    /// ADD for `att`: the whole chain in main mode; in IPAM mode dipam as ptp would call it
    /// (Debian's ptp stops at 1.0.0, and this runs at 1.1.0 too).
    fn add(&self, att: &Attachment) -> Result<Value, dipam_lifecycle::CniError> {
        if self.main_mode() {
            self.lab.rt.add(self.list(), att)
        } else {
            self.lab.rt.ipam(self.list(), 0, "ADD", att, None)
        }
    }

    fn del(&self, att: &Attachment) -> Result<(), dipam_lifecycle::CniError> {
        if self.main_mode() {
            self.lab.rt.del(self.list(), att)
        } else {
            self.lab.rt.ipam(self.list(), 0, "DEL", att, None).map(drop)
        }
    }

    /// CHECK with `prev`, the ADD's result (libcni's cache in main mode).
    fn check(&self, att: &Attachment, prev: &Value) -> Result<(), dipam_lifecycle::CniError> {
        if self.main_mode() {
            self.lab.rt.check(self.list(), att)
        } else {
            self.lab
                .rt
                .ipam(self.list(), 0, "CHECK", att, Some(prev))
                .map(drop)
        }
    }

    /// CNI GC (1.1.0) with `valid` as the runtime's list.
    fn gc(&self, valid: &[&Attachment]) -> Result<Value, dipam_lifecycle::CniError> {
        let mut l = self.list().clone();
        l["cniVersion"] = json!("1.1.0");
        let entries: Vec<Value> = valid.iter().map(|a| gc_entry(a)).collect();
        l["plugins"][0]["cni.dev/valid-attachments"] = json!(entries);
        l["plugins"][0]["cni.dev/attachments"] = json!(entries);
        let conf = Runtime::plugin_config(&l, 0, None);
        self.lab
            .rt
            .exec(
                "dipam",
                "GC",
                &Attachment::new("", ""),
                conf.to_string().as_bytes(),
            )
            .into_result("dipam")
    }

    /// The ledger and the plugin's state hold exactly the same (container ID, address)s.
    #[track_caller]
    fn assert_agree(&self) {
        assert_eq!(
            self.lab.ledger(),
            self.node().held(),
            "ledger (left) vs azure-vnet-ipam's state (right)"
        );
    }

    /// An address of the pool the plugin holds for no one: the plugin hands out free
    /// addresses in no fixed order, so a requested IP is chosen, never fixed.
    fn free_ip(&self) -> String {
        let held: Vec<String> = self.node().held().into_iter().map(|(_, ip)| ip).collect();
        self.node()
            .pool
            .iter()
            .map(ToString::to_string)
            .find(|ip| !held.contains(ip))
            .expect("a free address in the pool")
    }

    fn agent_ips(&self) -> Vec<String> {
        self.lab
            .addresses()
            .into_iter()
            .map(|(.., ip, _)| ip.split('/').next().unwrap().to_owned())
            .collect()
    }

    /// `dipamctl agent claim <args> --json`: the claim.
    fn claim(&self, args: &[&str]) -> Value {
        let mut all = vec!["agent", "claim"];
        all.extend_from_slice(args);
        all.push("--json");
        let out = self.lab.dipamd.ctl(&all);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        assert!(
            out.status.success(),
            "claim {args:?}: {}\n{v:#}",
            String::from_utf8_lossy(&out.stderr)
        );
        v["claim"].clone()
    }
}

fn bare(v: &Value) -> String {
    v.as_str()
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap()
        .to_owned()
}

/// Pods, the agent's roles and a claim with a requested IP, CHECK, GC (emulated: the plugin
/// has none) and a SIGKILL, in `conflist`'s mode at `version`.
fn pods_roles_claims(conflist: &str, version: &str) {
    require_peers!("azure-vnet-ipam");
    let b = Bench::new(conflist, version, "router,health", &[]);
    b.lab.wait_ready(2);
    let want = b.free_ip();
    let egress = b.claim(&["egress", "--ip", &want]);
    assert_eq!(egress["state"], "ready", "{egress:#}");
    assert_eq!(bare(&egress["ip"]), want);
    b.assert_agree();

    let pods: Vec<(NetNs, Attachment)> = (0..3).map(|_| netns::pod()).collect();
    let mut pod_ips = Vec::new();
    for (_, att) in &pods {
        let r = b
            .add(att)
            .unwrap_or_else(|e| panic!("ADD: {e}\n{}", b.lab.dipamd.log()));
        let ips = result_ips(&r);
        assert_eq!(ips.len(), 1, "{r:#}");
        assert_eq!(r["dns"]["nameservers"][0], "168.63.129.16", "{r:#}");
        pod_ips.push(ips[0].clone());
        if version != "0.3.1" {
            b.check(att, &r).unwrap_or_else(|e| panic!("CHECK: {e}"));
        }
    }
    let agent = b.agent_ips();
    assert_eq!(agent.len(), 3, "{agent:?}");
    for ip in &pod_ips {
        assert!(!agent.contains(ip), "a pod got the agent's {ip}");
        assert!(b.node().pool.iter().any(|a| a.to_string() == *ip), "{ip}");
    }
    assert_eq!(b.node().held().len(), 6);
    b.assert_agree();

    // A claim asking for a pod's address is refused, naming the holder; nothing changes.
    let out = b
        .lab
        .dipamd
        .ctl(&["agent", "claim", "taken", "--ip", &pod_ips[0], "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(v["claim"]["state"], "failed", "{v:#}");
    assert!(
        v["claim"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("held by pod"),
        "{v:#}"
    );
    b.assert_agree();

    // DEL of the first; then GC listing only the second: the third goes through the
    // plugin's DEL (it has no GC), the agent's three stay.
    b.del(&pods[0].1).unwrap();
    b.assert_agree();
    if version == "1.1.0" {
        dipam_lifecycle::runtime::settle_before_gc();
        b.gc(&[&pods[1].1])
            .unwrap_or_else(|e| panic!("GC: {e}\n{}", b.lab.dipamd.log()));
        let held: Vec<String> = b.node().held().into_iter().map(|(_, ip)| ip).collect();
        assert!(
            !held.contains(&pod_ips[2]),
            "GC kept the stale pod: {held:?}"
        );
        assert!(
            held.contains(&pod_ips[1]),
            "GC freed the listed pod: {held:?}"
        );
        for ip in &agent {
            assert!(held.contains(ip), "GC freed the agent's {ip}: {held:?}");
        }
        assert_eq!(held.len(), 4);
    } else {
        b.del(&pods[2].1).unwrap();
    }
    b.assert_agree();

    // SIGKILL and a restart: the same agent addresses, nothing leaked or lost.
    let mut b = b;
    let before = b.lab.addresses();
    b.lab.dipamd.kill9();
    b.lab.dipamd.start_again();
    b.lab.wait_ready(3);
    assert_eq!(b.lab.addresses(), before);
    b.assert_agree();
    b.del(&pods[1].1).unwrap();
    let out = b.lab.dipamd.ctl(&["agent", "unclaim", "egress", "--json"]);
    assert!(out.status.success());
    assert_eq!(b.node().held().len(), 2, "{:?}", b.node().held());
    b.assert_agree();
}

#[test]
fn main_mode_pods_roles_claims_gc_1_1_0() {
    require_root!();
    pods_roles_claims("dipam-azure.conflist", "1.1.0");
}

#[test]
fn ipam_mode_pods_roles_claims_gc_1_1_0() {
    require_root!();
    pods_roles_claims("ptp-dipam-azure.conflist", "1.1.0");
}

#[test]
fn ipam_mode_through_debians_ptp_1_0_0() {
    require_root!();
    require_peers!("azure-vnet-ipam");
    let b = Bench::new("ptp-dipam-azure.conflist", "1.0.0", "router", &[]);
    b.lab.wait_ready(1);
    let ns = NetNs::new();
    let att = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
    let r = b
        .lab
        .rt
        .add(b.list(), &att)
        .unwrap_or_else(|e| panic!("ADD: {e}\n{}", b.lab.dipamd.log()));
    let ip = result_ips(&r).remove(0);
    let out = ns.exec(&["ip", "-4", "addr", "show", "eth0"]);
    let inside = dipam_lifecycle::links::ipv4_addresses(&String::from_utf8_lossy(&out.stdout));
    assert!(
        inside.iter().any(|a| a.starts_with(&ip)),
        "{inside:?} vs {ip}"
    );
    b.lab.rt.check(b.list(), &att).unwrap();
    b.assert_agree();
    b.lab.rt.del(b.list(), &att).unwrap();
    assert_eq!(b.node().held().len(), 1);
    b.assert_agree();
}

/// The reboot case a CHECK cannot see: the plugin's state (on /run, a tmpfs) is gone and
/// dipamd's ledger (on disk) is not. Meanwhile another caller of the plugin has taken the
/// health address. dipamd must restore the router's and the claim's reservations (same
/// addresses) before any pod can take them, and give health another address, marked changed.
#[test]
fn state_lost_in_a_reboot_is_restored_before_pods_run() {
    require_root!();
    require_peers!("azure-vnet-ipam");
    let mut b = Bench::new("dipam-azure.conflist", "1.1.0", "router,health", &[]);
    b.lab.wait_ready(2);
    let want = b.free_ip();
    b.claim(&["egress", "--ip", &want]);
    b.assert_agree();
    let before = b.lab.addresses();
    let ip_of = |addrs: &[(String, String, String, String)], role: &str| {
        addrs
            .iter()
            .find(|a| a.0 == role)
            .map(|a| a.2.split('/').next().unwrap().to_owned())
            .unwrap()
    };
    let health = ip_of(&before, "health");
    let router = ip_of(&before, "router");

    b.lab.dipamd.kill9();
    b.node().wipe_state();
    let (ok, out) = b.node().exec("ADD", "another-runtimes-pod", Some(&health));
    assert!(ok, "{out}");

    b.lab.dipamd.start_again();
    b.lab.wait_ready(3);
    let after = b.lab.addresses();
    assert_eq!(ip_of(&after, "router"), router, "{after:?}");
    assert_eq!(
        ip_of(&after, "claim:egress"),
        want,
        "the claim keeps its requested IP: {after:?}"
    );
    let new_health = ip_of(&after, "health");
    assert_ne!(new_health, health, "health kept an address another holds");
    // The change was found and reported (the changed mark itself goes to the first reader,
    // here wait_ready's list): the plugin refused the old address, another was taken.
    let log = b.lab.dipamd.log();
    assert!(
        log.contains("the delegate no longer holds this agent address")
            && log.contains("the previous agent address is not available; taking another"),
        "{log}"
    );
    // The plugin holds exactly the ledger's addresses plus the other caller's.
    let mut held = b.node().held();
    held.retain(|(id, _)| id != "another-runtimes-pod");
    assert_eq!(b.lab.ledger(), held);

    // Pods until the pool is empty: none gets an agent address.
    let agent = b.agent_ips();
    let mut pods = Vec::new();
    loop {
        let ns = NetNs::new();
        let att = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
        match b.add(&att) {
            Ok(r) => {
                let ip = result_ips(&r).remove(0);
                assert!(!agent.contains(&ip), "pod got the agent's {ip}");
                assert_ne!(ip, health, "pod got the other caller's {ip}");
                pods.push((ns, att));
            }
            Err(e) => {
                assert!(
                    e.msg.contains("no available addresses") || e.msg.contains("available"),
                    "{e}"
                );
                break;
            }
        }
        assert!(
            pods.len() <= b.node().pool.len(),
            "more pods than addresses"
        );
    }
    assert_eq!(
        pods.len(),
        b.node().pool.len() - 4,
        "every free address went to a pod"
    );
    for (_, att) in &pods {
        b.del(att).unwrap();
    }
    let mut held = b.node().held();
    held.retain(|(id, _)| id != "another-runtimes-pod");
    assert_eq!(b.lab.ledger(), held);
}

/// Pods come and go from two threads while dipamd is SIGKILLed at random moments (the seed
/// is printed; `DIPAM_SEED` replays it). A failed ADD is followed by a DEL, as runtimes do;
/// a DEL is retried until it succeeds (it is spooled while dipamd is down). At the end the
/// plugin holds exactly the agent's addresses, the same ones as at the start.
#[test]
fn sigkill_at_random_moments_leaks_nothing() {
    require_root!();
    require_peers!("azure-vnet-ipam");
    let b = Bench::new("dipam-azure.conflist", "1.1.0", "router,health", &[]);
    let mut rng = Seeded::new("sigkill_at_random_moments_leaks_nothing");
    b.lab.wait_ready(2);
    let agent = b.lab.addresses();
    let b = Arc::new(std::sync::Mutex::new(b));
    let stop = Arc::new(AtomicBool::new(false));
    // The runtime's side: each thread ADDs and DELs pods until told to stop.
    let (list, rt_path) = {
        let g = b.lock().unwrap();
        (g.list().clone(), g.node().cni_path())
    };
    let workers: Vec<_> = (0..2)
        .map(|w| {
            let stop = stop.clone();
            let list = list.clone();
            let rt = Runtime::new(rt_path.clone());
            std::thread::spawn(move || {
                let mut done = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let ns = NetNs::new();
                    let att =
                        Attachment::new(&dipam_lifecycle::unique(&format!("w{w}")), &ns.path());
                    let _ = rt.add(&list, &att);
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while let Err(e) = rt.del(&list, &att) {
                        assert!(Instant::now() < deadline, "DEL never succeeded: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    done += 1;
                }
                done
            })
        })
        .collect();
    for round in 0..8 {
        let wait = 100 + rng.below(900);
        std::thread::sleep(Duration::from_millis(wait));
        let mut g = b.lock().unwrap();
        eprintln!("round {round}: SIGKILL after {wait} ms");
        g.lab.dipamd.kill9();
        std::thread::sleep(Duration::from_millis(rng.below(300)));
        g.lab.dipamd.start_again();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let cycles: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let g = b.lock().unwrap();
    g.lab.wait_ready(2);
    assert_eq!(g.lab.addresses(), agent, "seed {}", rng.seed);
    // Spooled DELs drain within seconds of a start.
    let deadline = Instant::now() + Duration::from_secs(20);
    while g.lab.ledger().len() > 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        g.lab.ledger().len(),
        2,
        "seed {}: {:?}",
        rng.seed,
        g.lab.ledger()
    );
    g.assert_agree();
    eprintln!("{cycles} pod cycles across 8 SIGKILLs");
    assert!(cycles > 0, "no pod ran");
}

/// A delegate config without `subnet` is refused with a clear error before the plugin runs:
/// azure-vnet-ipam would answer the first ADD and fail every later one.
#[test]
fn a_config_without_subnet_is_refused_with_the_fix() {
    require_root!();
    require_peers!("azure-vnet-ipam");
    let b = Bench::new("dipam-azure.conflist", "1.0.0", "router", &[]);
    b.lab.wait_ready(1);
    let mut list = b.list().clone();
    list["plugins"][0]["ipam"]
        .as_object_mut()
        .unwrap()
        .remove("subnet");
    let ns = NetNs::new();
    let att = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
    let e = b.lab.rt.add(&list, &att).unwrap_err();
    assert_eq!(e.code, 7, "{e}");
    assert!(e.msg.contains("ipam.subnet"), "{e}");
    assert!(e.details.contains("\"subnet\""), "{e}");
    assert_eq!(b.node().held().len(), 1, "only the router");
}

/// The shipped unit's file-system sandbox (ProtectSystem=strict and its ReadWritePaths, plus
/// the moved paths' drop-in this bench's non-default state dir needs) with the real plugin:
/// without deploy/systemd/azure-vnet-ipam.conf every ADD fails and nothing is allocated (the
/// plugin cannot write its state on /run); with it, pods and the agent's router go through,
/// and the plugin's state and log are where it keeps them.
#[test]
fn the_units_sandbox_needs_and_gets_the_azure_drop_in() {
    require_root!();
    require_peers!("azure-vnet-ipam");
    let dropin = dipam_lifecycle::bins::workspace().join("deploy/systemd/azure-vnet-ipam.conf");
    let mut lab = AgentLab::unstarted_with_pool("dipam-azure.conflist", 12);
    lab.fx = lab.fx.clone().with_version("1.1.0");
    lab.write_conflist();
    lab.set_roles("router", &["--agent-check-interval", "3600"]);
    lab.dipamd.run_under(&shipped_unit_setpriv());
    // The bench's own directory stands for a moved --state-dir and --socket, made writable
    // by a drop-in as deploy/README.md says.
    let own = lab.dipamd.dir.path().to_owned();
    let sandbox = |dropins: &[&std::path::Path]| {
        let mut rw = unit_read_write_paths(dropins);
        rw.push(own.clone());
        protect_system_strict(&own, &rw)
    };
    let node_wrapper =
        |lab: &AgentLab, inner: &[String]| lab.azure.as_ref().unwrap().wrapper(inner);

    // The unit alone: /run is read-only to the plugin.
    let w = node_wrapper(&lab, &sandbox(&[]));
    lab.dipamd.enter(&w);
    lab.dipamd.start_again();
    let ns = NetNs::new();
    let att = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
    let e = lab
        .rt
        .add(&lab.fx.list, &att)
        .expect_err("an ADD succeeded although the plugin cannot write its state");
    assert!(
        e.to_string().contains("read-only file system"),
        "the plugin's own error says why: {e}"
    );
    assert!(lab.azure.as_ref().unwrap().held().is_empty());
    assert!(lab.ledger().is_empty(), "{:?}", lab.ledger());
    lab.rt.del(&lab.fx.list, &att).unwrap();
    lab.dipamd.kill9();

    // With the drop-in: the router, then a pod, then its DEL.
    let w = node_wrapper(&lab, &sandbox(&[&dropin]));
    lab.dipamd.enter(&w);
    lab.dipamd.start_again();
    lab.wait_ready(1);
    let r = lab
        .rt
        .add(&lab.fx.list, &att)
        .unwrap_or_else(|e| panic!("ADD: {e}\n{}", lab.dipamd.log()));
    assert_eq!(result_ips(&r).len(), 1, "{r:#}");
    assert_eq!(lab.azure.as_ref().unwrap().held().len(), 2);
    lab.assert_agree();
    lab.rt.del(&lab.fx.list, &att).unwrap();
    assert_eq!(lab.azure.as_ref().unwrap().held().len(), 1);
    lab.assert_agree();
    assert!(
        lab.azure
            .as_ref()
            .unwrap()
            .log()
            .contains("azure-vnet-ipam"),
        "the plugin logged to /var/log"
    );
}

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
    require_containerd, require_peers,
    shapes::{Seeded, churn_while_killing, retry, shipped_unit_setpriv},
    unique,
};
use serde_json::Value;

/// A dipamd with an agent (role `router`) and a private containerd 2 using its conflist at
/// cniVersion 1.1.0. Fields drop in order: containerd first, so its last DELs reach dipamd.
struct Bench {
    cd: Containerd,
    lab: AgentLab,
}

impl Bench {
    fn new(peers: &[Peer], conflist: &str, flags: &[&str], cri: bool) -> Self {
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
        let mut all = vec!["--spool-dir", spool.as_str(), "--gc-grace", "0"];
        if cri {
            all.extend([
                "--cri-endpoint",
                endpoint.as_str(),
                "--reconcile-interval",
                "3600",
            ]);
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
    require_containerd!();
    let peers = require_peers!("containerd", "ctr", "containerd-shim-runc-v2");
    pods_at_1_1_0(&peers, "dipam-host-local-1.1.0.conflist");
}

#[test]
fn ipam_mode_pods_at_1_1_0_under_ptp_1_10() {
    require_containerd!();
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
    require_containerd!();
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
    require_containerd!();
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
        let out = b.lab.dipamd.ctl(&["gc", "--from-runtime", "--json"]);
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
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
    require_containerd!();
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

/// `dipamctl install` judges the runtimes that read the conf dir, found from their own
/// configs: a 1.1.0 conflist for the directory a running containerd 2 reads installs without
/// --force and without the 1.1.0 warning, although Debian's containerd 1.6 and podman 4 are
/// in PATH (they read /etc/cni/net.d, which the conflist never reaches). (The refusal when
/// the running reader is containerd 1.6 is containerd.rs `containerd_cni_versions`.)
#[test]
fn install_judges_the_runtime_that_reads_the_conf_dir() {
    require_containerd!();
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

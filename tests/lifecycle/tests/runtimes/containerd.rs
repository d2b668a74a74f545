//! A real container runtime through the API kubelet uses: Debian's containerd 1.6 runs pod
//! sandboxes on dipam conflists, driven through CRI (src/containerd.rs), in main mode and as
//! the IPAM of ptp (with host-local from /usr/lib/cni as the delegate). After each step
//! dipamd's ledger and host-local's store agree, and the pod sees the address the ledger
//! holds. containerd's protocol (which DELs it sends when, its keys, its errors) is
//! docs/sources.md §10.2.
//!
//! Each test shares one containerd across its steps; the conflist is swapped in its conf_dir
//! where a test needs another.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeSet,
    process::Command,
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    Containerd, Lab,
    containerd::Pod,
    links::{assert_no_host_veths, ipv4_addresses as addresses, nat_rules_for},
    require,
};
use serde_json::json;

#[derive(Debug, Clone, Copy)]
enum Mode {
    /// `"type": "dipam"` wires the pod; host-local is its `ipam`.
    Main,
    /// ptp wires the pod; dipam is its IPAM, host-local dipam's delegate.
    Ipam,
}

impl Mode {
    fn conflist(self) -> &'static str {
        match self {
            Self::Main => "dipam-host-local-1.1.0.conflist",
            Self::Ipam => "ptp-dipam-host-local.conflist",
        }
    }
}

/// One dipamd + host-local store (the Lab) and one private containerd using its conflist.
/// Fields drop in order: containerd first, so that its last DELs still reach dipamd.
struct Bench {
    cd: Containerd,
    lab: Lab,
}

impl Bench {
    fn new(mode: Mode, version: &str) -> Self {
        Self::with(Lab::new(mode.conflist()).with_version(version))
    }

    /// `mode`'s conflist with portmap chained after the plugin that wires the pod.
    fn with_portmap(mode: Mode) -> Self {
        let mut lab = Lab::new(mode.conflist()).with_version("1.0.0");
        lab.fx.list["plugins"].as_array_mut().unwrap().push(json!({
            "type": "portmap",
            "capabilities": {"portMappings": true},
            "snat": true,
        }));
        Self::with(lab)
    }

    fn with(lab: Lab) -> Self {
        let cd = Containerd::start();
        cd.set_conflist(lab.list());
        Self { cd, lab }
    }

    fn net(&self) -> String {
        self.lab.network()
    }

    /// The ledger's one address for `pod`, checked against host-local's store and CRI's view.
    #[track_caller]
    fn address_of(&self, pod: &Pod) -> String {
        let ledger = self.lab.dipamd.ledger_ips(&self.net());
        let mine: Vec<_> = ledger.iter().filter(|(cid, ..)| *cid == pod.id).collect();
        assert_eq!(
            mine.len(),
            1,
            "CNI_CONTAINERID is the sandbox ID: {ledger:?}"
        );
        let (_, ifname, ip) = mine[0];
        assert_eq!(ifname, "eth0");
        assert!(
            self.lab.subnet.contains(ip),
            "{ip} not in {}",
            self.lab.subnet.cidr
        );
        assert_eq!(
            self.cd.pod_ip(&pod.id).as_deref(),
            Some(ip.as_str()),
            "CRI's pod IP is the ledger's"
        );
        ip.clone()
    }

    /// Nothing of these pods is left anywhere: not in the ledger, not in host-local's store,
    /// not in containerd, and neither their network namespaces nor host veths.
    #[track_caller]
    fn assert_nothing_left(&self, netns: &[String]) {
        assert!(self.lab.ledger().is_empty(), "{:?}", self.lab.ledger());
        assert!(self.lab.delegate_store().is_empty());
        self.lab.assert_agree();
        assert!(
            self.cd.list_pods().unwrap().is_empty(),
            "{:?}",
            self.cd.list_pods()
        );
        for ns in netns {
            assert!(!std::path::Path::new(ns).exists(), "{ns} is left");
        }
        assert_no_host_veths(&self.net(), dipam_proto::retired::ALIAS_PREFIX);
    }
}

fn lifecycle(mode: Mode) {
    let b = Bench::with_portmap(mode);
    let host_port = 21000 + u16::try_from(b.lab.subnet.index).unwrap() * 10;
    let pod =
        b.cd.run_pod_with(b.cd.pod_config("web", &[(host_port, 80)]))
            .unwrap();
    let ip = b.address_of(&pod);
    b.lab.assert_agree();
    let netns = b.cd.netns_path(&pod.id).expect("the sandbox's netns");
    assert!(netns.starts_with("/var/run/netns/cni-"), "{netns}");
    // portmap read containerd's runtimeConfig: a DNAT of the host port to the pod.
    let rules = nat_rules_for(&pod.id);
    assert!(
        rules
            .iter()
            .any(|r| r.contains(&format!("--dport {host_port}"))
                && r.contains(&format!("--to-destination {ip}:80"))),
        "no DNAT of {host_port} to {ip}:80 in {rules:#?}"
    );

    let c = b.cd.start_sleeper(&pod).unwrap();
    let (code, out, err) = b.cd.exec_sync(&c, &["ip", "-o", "-4", "addr"]).unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(addresses(&out), vec![ip.clone()], "inside the pod: {out}");

    // StopPodSandbox: DEL with the netns and prevResult; everything is released.
    b.cd.stop_pod(&pod.id).unwrap();
    assert!(b.lab.ledger().is_empty(), "{:?}", b.lab.ledger());
    assert!(b.lab.delegate_store().is_empty());
    b.lab.assert_agree();
    assert!(
        nat_rules_for(&pod.id).is_empty(),
        "portmap's rules are gone"
    );
    // RemovePodSandbox: a second DEL, without netns or prevResult, of an attachment dipam
    // has already released: it must succeed and change nothing.
    b.cd.remove_pod(&pod.id).unwrap();
    b.assert_nothing_left(&[netns]);
}

#[test]
fn containerd_runs_a_pod_on_dipam_as_the_main_plugin() {
    require!(dipam_lifecycle::containerd::unavailable());
    lifecycle(Mode::Main);
}

#[test]
fn containerd_runs_a_pod_on_ptp_with_dipam_as_ipam() {
    require!(dipam_lifecycle::containerd::unavailable());
    lifecycle(Mode::Ipam);
}

/// 8 RunPodSandbox at once (containerd runs its loopback beside each ADD), then 8 stops and
/// removes at once: 8 distinct addresses, then none.
fn concurrent(mode: Mode) {
    let b = Bench::new(mode, "1.0.0");
    let pods: Vec<Pod> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let cd = &b.cd;
                s.spawn(move || cd.run_pod(&format!("pod{i}")))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    let ips: BTreeSet<String> = pods.iter().map(|p| b.address_of(p)).collect();
    assert_eq!(ips.len(), 8, "distinct addresses: {ips:?}");
    assert_eq!(b.lab.ledger().len(), 8);
    b.lab.assert_agree();
    let netns: Vec<String> = pods
        .iter()
        .map(|p| b.cd.netns_path(&p.id).unwrap())
        .collect();
    std::thread::scope(|s| {
        for p in &pods {
            let cd = &b.cd;
            s.spawn(move || {
                cd.stop_pod(&p.id).unwrap();
                cd.remove_pod(&p.id).unwrap();
            });
        }
    });
    b.assert_nothing_left(&netns);
}

#[test]
fn containerd_runs_8_sandboxes_at_once_main_mode() {
    require!(dipam_lifecycle::containerd::unavailable());
    concurrent(Mode::Main);
}

#[test]
fn containerd_runs_8_sandboxes_at_once_ipam_mode() {
    require!(dipam_lifecycle::containerd::unavailable());
    concurrent(Mode::Ipam);
}

/// dipamd down at RunPodSandbox: containerd reports dipam's own message (whichever plugin
/// called it), nothing is allocated, and once dipamd is back pods run again.
fn dipamd_down(mode: Mode) {
    let mut b = Bench::new(mode, "1.0.0");
    b.lab.dipamd.kill9();
    let err = b.cd.run_pod("nodaemon").unwrap_err();
    let socket = b.lab.dipamd.socket();
    let want = format!("dipamd is not reachable at {}", socket.display());
    assert!(
        err.message().contains(&want),
        "containerd's error does not carry dipam's message ({want}): {err:?}"
    );
    assert!(
        err.message()
            .contains("failed to setup network for sandbox"),
        "{err:?}"
    );
    assert!(b.lab.delegate_store().is_empty(), "nothing was allocated");
    assert!(
        b.cd.list_pods().unwrap().is_empty(),
        "the sandbox was undone"
    );

    b.lab.dipamd.start_again();
    assert!(b.lab.ledger().is_empty(), "{:?}", b.lab.ledger());
    b.lab.assert_agree();
    let pod = b.cd.run_pod("back").unwrap();
    b.address_of(&pod);
    b.lab.assert_agree();
    let netns = b.cd.netns_path(&pod.id).unwrap();
    b.cd.stop_pod(&pod.id).unwrap();
    b.cd.remove_pod(&pod.id).unwrap();
    b.assert_nothing_left(&[netns]);
}

#[test]
fn containerd_reports_dipamd_down_at_run_main_mode() {
    require!(dipam_lifecycle::containerd::unavailable());
    dipamd_down(Mode::Main);
}

#[test]
fn containerd_reports_dipamd_down_at_run_ipam_mode() {
    require!(dipam_lifecycle::containerd::unavailable());
    dipamd_down(Mode::Ipam);
}

/// dipamd SIGKILLed and restarted while pods run: the restarted daemon holds them all, and
/// their stop and removal leave nothing. A pod stopped and removed while dipamd is down
/// succeeds too (its DELs are spooled) and is released when dipamd is back.
fn dipamd_restart(mode: Mode) {
    let mut b = Bench::new(mode, "1.0.0");
    let mut pods: Vec<Pod> = (0..3)
        .map(|i| b.cd.run_pod(&format!("pod{i}")).unwrap())
        .collect();
    let before: Vec<String> = pods.iter().map(|p| b.address_of(p)).collect();
    let netns: Vec<String> = pods
        .iter()
        .map(|p| b.cd.netns_path(&p.id).unwrap())
        .collect();
    b.lab.assert_agree();
    b.lab.dipamd.kill9();
    let gone = pods.remove(0);
    b.cd.stop_pod(&gone.id).unwrap();
    b.cd.remove_pod(&gone.id).unwrap();
    assert!(b.lab.spooled() > 0, "the DELs wait in the spool");
    b.lab.dipamd.start_again();
    assert_eq!(b.lab.spooled(), 0, "replayed before dipamd serves");
    let after: Vec<String> = pods.iter().map(|p| b.address_of(p)).collect();
    assert_eq!(before[1..], after, "the ledger survived SIGKILL");
    assert_eq!(
        b.lab.ledger().len(),
        2,
        "the spooled DEL released {}",
        before[0]
    );
    b.lab.assert_agree();
    for p in &pods {
        b.cd.stop_pod(&p.id).unwrap();
        b.lab.assert_agree();
        b.cd.remove_pod(&p.id).unwrap();
        b.lab.assert_agree();
    }
    b.assert_nothing_left(&netns);
}

#[test]
fn containerd_pods_survive_a_dipamd_sigkill_main_mode() {
    require!(dipam_lifecycle::containerd::unavailable());
    dipamd_restart(Mode::Main);
}

#[test]
fn containerd_pods_survive_a_dipamd_sigkill_ipam_mode() {
    require!(dipam_lifecycle::containerd::unavailable());
    dipamd_restart(Mode::Ipam);
}

/// The sandbox's pause process SIGKILLed: containerd sends no DEL (the pod goes NOTREADY and
/// keeps its netns), so the address stays held; StopPodSandbox then releases it.
fn pause_killed(mode: Mode) {
    let b = Bench::new(mode, "1.0.0");
    let pod = b.cd.run_pod("victim").unwrap();
    let ip = b.address_of(&pod);
    let netns = b.cd.netns_path(&pod.id).unwrap();
    let pid = b.cd.pause_pid(&pod.id).expect("the pause process's pid");
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pods = b.cd.list_pods().unwrap();
        let state = pods.iter().find(|p| p.id == pod.id).map(|p| p.state);
        if state == Some(k8s_cri::v1::PodSandboxState::SandboxNotready as i32) {
            break;
        }
        assert!(Instant::now() < deadline, "still {state:?} 20 s after kill");
        std::thread::sleep(Duration::from_millis(50));
    }
    // No DEL came: the address is still held, and the netns is still there for the DEL.
    assert_eq!(b.address_of_held(&pod), ip);
    b.lab.assert_agree();
    assert!(std::path::Path::new(&netns).exists());
    b.cd.stop_pod(&pod.id).unwrap();
    assert!(b.lab.ledger().is_empty(), "{:?}", b.lab.ledger());
    b.lab.assert_agree();
    b.cd.remove_pod(&pod.id).unwrap();
    b.assert_nothing_left(&[netns]);
}

impl Bench {
    /// The ledger's address for `pod`, whatever CRI says of it (a NOTREADY pod has none).
    fn address_of_held(&self, pod: &Pod) -> String {
        let ledger = self.lab.dipamd.ledger_pairs(&self.net());
        assert_eq!(ledger.len(), 1, "{ledger:?}");
        assert_eq!(ledger[0].0, pod.id);
        ledger[0].1.clone()
    }
}

#[test]
fn containerd_pause_process_killed_then_stop_and_remove_main_mode() {
    require!(dipam_lifecycle::containerd::unavailable());
    pause_killed(Mode::Main);
}

#[test]
fn containerd_pause_process_killed_then_stop_and_remove_ipam_mode() {
    require!(dipam_lifecycle::containerd::unavailable());
    pause_killed(Mode::Ipam);
}

/// Conflists at 0.3.1, 0.4.0 and 1.0.0 in both modes, on one containerd (the conflist swapped
/// in its conf_dir): run, stop and remove work and leave nothing. 1.1.0 fails every ADD under
/// containerd 1.6 (its libcni cannot parse a 1.1.0 result), and leaves nothing either: the
/// DEL containerd sends after a failed ADD releases what dipam allocated.
#[test]
fn containerd_cni_versions() {
    require!(dipam_lifecycle::containerd::unavailable());
    let cd = Containerd::start();
    for mode in [Mode::Main, Mode::Ipam] {
        for version in ["0.3.1", "0.4.0", "1.0.0"] {
            let lab = Lab::new(mode.conflist()).with_version(version);
            cd.set_conflist(lab.list());
            let pod = cd
                .run_pod("v")
                .unwrap_or_else(|e| panic!("{mode:?} at {version}: {e:?}"));
            let ledger = lab.dipamd.ledger_pairs(&lab.network());
            assert_eq!(ledger.len(), 1, "{mode:?} at {version}: {ledger:?}");
            assert_eq!(ledger[0].0, pod.id);
            assert_eq!(cd.pod_ip(&pod.id), Some(ledger[0].1.clone()));
            lab.assert_agree();
            cd.stop_pod(&pod.id).unwrap();
            cd.remove_pod(&pod.id).unwrap();
            assert!(lab.ledger().is_empty(), "{mode:?} at {version}");
            assert!(lab.delegate_store().is_empty(), "{mode:?} at {version}");
            assert!(cd.list_pods().unwrap().is_empty());
        }
    }
    // Main mode at 1.1.0 (in IPAM mode Debian's ptp 1.1.1 refuses a 1.1.0 config first),
    // installed as a node installs it: `dipamctl install` into the running containerd's
    // conf_dir refuses it, naming containerd 1.6 (found running with this conf_dir, from its
    // own config) and the version to use; --force=chaining names another check and still
    // refuses; --force=cni-version installs it, and containerd picks it up and fails exactly
    // as the refusal said.
    let lab = Lab::new(Mode::Main.conflist()).with_version("1.1.0");
    for e in std::fs::read_dir(cd.conf_dir()).unwrap().flatten() {
        std::fs::remove_file(e.path()).unwrap();
    }
    let src = lab.dipamd.dir.path().join("v110.conflist");
    std::fs::write(&src, serde_json::to_vec_pretty(lab.list()).unwrap()).unwrap();
    let install = |force: Option<&str>| {
        let mut cmd = Command::new(dipam_lifecycle::bins::bin("dipamctl"));
        cmd.arg("install")
            .arg("--cni-bin-dir")
            .arg(cd.bin_dir())
            .arg("--conf-dir")
            .arg(cd.conf_dir())
            .arg("--conflist")
            .arg(&src)
            .arg("--no-man-pages")
            // The runtime is found in PATH, as on a node: this one's containerd 1.6.
            .env("PATH", runtime_path(cd.build()));
        cmd.args(force);
        cmd.output().unwrap()
    };
    let out = install(None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "refused: {stderr}");
    assert!(
        stderr.contains("containerd 1.6") && stderr.contains("\"cniVersion\": \"1.0.0\""),
        "the refusal names containerd 1.6 and the version to use: {stderr}"
    );
    assert!(
        stderr.contains("reads this conf dir") && stderr.contains("runs as pid"),
        "the refusal says how containerd 1.6 is known to read the conf dir: {stderr}"
    );
    assert_eq!(std::fs::read_dir(cd.conf_dir()).unwrap().count(), 0);
    let out = install(Some("--force=chaining"));
    assert_eq!(
        out.status.code(),
        Some(1),
        "--force=chaining overrode the cniVersion check"
    );
    assert_eq!(std::fs::read_dir(cd.conf_dir()).unwrap().count(), 0);
    let out = install(Some("--force=cni-version"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "dipamctl install --force=cni-version: {stderr}"
    );
    assert!(
        stderr.contains("warning") && stderr.contains("cannot parse a 1.1.0 result"),
        "--force installs and warns: {stderr}"
    );
    cd.wait_loaded(lab.list());
    let err = cd.run_pod("v110").unwrap_err();
    assert!(
        err.message().contains("unsupported CNI result version"),
        "containerd 1.6 cannot parse a 1.1.0 result: {err:?}"
    );
    assert!(lab.ledger().is_empty(), "{:?}", lab.ledger());
    assert!(lab.delegate_store().is_empty());
    assert!(cd.list_pods().unwrap().is_empty());
    assert_no_host_veths(&lab.network(), dipam_proto::retired::ALIAS_PREFIX);
}

/// The guard itself: dropped with a pod and its container still running, it stops and
/// removes them through CRI (so dipam frees the address), and leaves no process, netns,
/// mount, runc state or directory behind.
#[test]
fn containerd_guard_cleans_up_a_running_pod() {
    require!(dipam_lifecycle::containerd::unavailable());
    let lab = Lab::new(Mode::Main.conflist()).with_version("1.0.0");
    let cd = Containerd::start();
    cd.set_conflist(lab.list());
    let pod = cd.run_pod("left").unwrap();
    let container = cd.start_sleeper(&pod).unwrap();
    let netns = cd.netns_path(&pod.id).unwrap();
    let dir = cd.dir().to_owned();
    let socket = cd.socket().into_os_string().into_string().unwrap();
    assert_eq!(lab.ledger().len(), 1);
    drop(cd);
    assert!(lab.ledger().is_empty(), "{:?}", lab.ledger());
    assert!(lab.delegate_store().is_empty());
    assert!(!std::path::Path::new(&netns).exists(), "{netns}");
    assert!(!dir.exists(), "{}", dir.display());
    for id in [&pod.id, &container] {
        let runc = std::path::Path::new("/run/containerd/runc/k8s.io").join(id);
        assert!(!runc.exists(), "{}", runc.display());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(dir.to_str().unwrap()), "{mounts}");
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        assert!(
            !args.iter().any(|a| a.ends_with(socket.as_bytes())
                || a.ends_with(format!("{}/config.toml", dir.display()).as_bytes())),
            "pid {:?} is left: {}",
            e.file_name(),
            String::from_utf8_lossy(&cmdline)
        );
    }
    assert_no_host_veths(&lab.network(), dipam_proto::retired::ALIAS_PREFIX);
}

/// A PATH whose `containerd` is `build`'s, ahead of the rest of this process's PATH.
fn runtime_path(build: &dipam_lifecycle::containerd::Build) -> std::ffi::OsString {
    let dir = build
        .containerd
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&path))).unwrap()
}

//! dipamd under the restrictions it ships with. The capability lines of
//! deploy/systemd/dipamd.service (`CapabilityBoundingSet`, `AmbientCapabilities`,
//! `NoNewPrivileges`) and the DaemonSet's `securityContext` in deploy/kubernetes/dipam.yaml
//! (`capabilities.add/drop`, `allowPrivilegeEscalation`) are parsed, and dipamd runs under
//! exactly that set through `setpriv`. It then takes main-mode and IPAM-mode pods through ADD,
//! CHECK, DEL and GC beside the agent's addresses: each host veth is gone after its DEL, the
//! ledger and host-local agree, and no operation was refused. One capability short, and with
//! every capability in a user namespace that does not own the network namespace, the veths
//! still go and `dipamctl status`/`doctor` say what was refused.
//!
//! What these tests cannot reproduce in-process: the unit's mount sandbox (ProtectSystem=,
//! ReadWritePaths=, PrivateTmp=, ...), its system-call filter and address-family restriction,
//! and a container runtime's seccomp/AppArmor/SELinux profiles. deploy.rs checks the unit's
//! paths against dipamd's flags instead.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    process::Command,
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    AgentLab, Attachment, NetNs, netns, require_root,
    restrictions::{Restrictions, daemonset_restrictions, shipped_unit, unit_restrictions},
};
use serde_json::{Value, json};

/// The capability lines dipamd shipped with before CAP_NET_ADMIN was added: one short.
fn one_short() -> Restrictions {
    unit_restrictions(
        "NoNewPrivileges=yes\n\
         CapabilityBoundingSet=CAP_CHOWN CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER\n",
    )
}

/// dipamd really runs under `r`: the kernel's view of its capability sets.
fn assert_runs_under(lab: &AgentLab, r: &Restrictions) {
    let pid = lab.dipamd.pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{name} in {status}"))
            .to_owned()
    };
    let hex = |name: &str| u64::from_str_radix(&field(name), 16).unwrap();
    for set in ["CapBnd:", "CapPrm:", "CapEff:"] {
        assert_eq!(hex(set), r.mask(), "{set} of dipamd ({r:?})");
    }
    assert_eq!(field("NoNewPrivs:") == "1", r.no_new_privs);
}

fn status(lab: &AgentLab) -> Value {
    let out = lab.dipamd.ctl(&["status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn link_exists(name: &str) -> bool {
    Command::new("ip")
        .args(["link", "show", "dev", name])
        .output()
        .unwrap()
        .status
        .success()
}

#[track_caller]
fn assert_gone(lab: &AgentLab, host: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while link_exists(host) {
        assert!(
            Instant::now() < deadline,
            "host veth {host} outlived its DEL:\n{}",
            lab.dipamd.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// CNI GC through the plugin, as libcni sends it (gc.rs).
fn gc(lab: &AgentLab, keep: &[&Attachment]) {
    let mut l = lab.fx.list.clone();
    l["cniVersion"] = json!("1.1.0");
    let valid: Vec<Value> = keep
        .iter()
        .map(|a| json!({"containerID": a.container_id, "ifname": a.ifname}))
        .collect();
    let i = dipam_lifecycle::fixture::dipam_plugin_index(&l);
    l["plugins"][i]["cni.dev/valid-attachments"] = json!(valid);
    l["plugins"][i]["cni.dev/attachments"] = json!(valid);
    let plugin = dipam_lifecycle::Runtime::plugin_config(&l, i, None);
    let kind = plugin["type"].as_str().unwrap().to_owned();
    let out = if kind == "dipam" {
        lab.rt.exec(
            "dipam",
            "GC",
            &Attachment::new("", ""),
            &serde_json::to_vec(&plugin).unwrap(),
        )
    } else {
        return lab
            .rt
            .ipam(&l, i, "GC", &Attachment::new("", ""), None)
            .map(drop)
            .unwrap_or_else(|e| panic!("GC: {e}"));
    };
    out.into_result("dipam")
        .unwrap_or_else(|e| panic!("GC: {e}"));
}

/// One shape (main or IPAM mode) under `r`: the agent's addresses, then pods through ADD,
/// CHECK, DEL and GC; the host veth of each DEL'd main-mode pod goes; the ledger and
/// host-local agree throughout. Returns the bench for the caller's own checks.
fn exercise(conflist: &str, r: &Restrictions, extra: &[&str]) -> AgentLab {
    let mut lab = AgentLab::unstarted(conflist);
    lab.write_conflist();
    // --socket-group: the chown that CAP_CHOWN is in the set for (65534: nogroup).
    let mut flags = vec![
        "--gc-grace",
        "0",
        "--gc-max-free-share",
        "1",
        "--socket-group",
        "65534",
    ];
    flags.extend_from_slice(extra);
    lab.set_roles("router,health", &flags);
    lab.dipamd.run_under(&r.setpriv());
    lab.dipamd.start_again();
    assert_runs_under(&lab, r);
    let socket = std::fs::metadata(lab.dipamd.socket()).unwrap();
    assert_eq!(
        (socket.gid(), socket.permissions().mode() & 0o777),
        (65534, 0o660),
        "--socket-group under {r:?}"
    );
    lab.wait_ready(2);
    let agent = lab.addresses();
    let main = lab.fx.is_main_mode();

    let pods: Vec<(NetNs, Attachment)> = (0..3).map(|_| netns::pod()).collect();
    let mut hosts = Vec::new();
    for (_, att) in &pods {
        let result = lab
            .rt
            .add(&lab.fx.list, att)
            .unwrap_or_else(|e| panic!("ADD: {e}\n{}", lab.dipamd.log()));
        hosts.push(result["interfaces"][0]["name"].as_str().map(str::to_owned));
        lab.rt
            .check(&lab.fx.list, att)
            .unwrap_or_else(|e| panic!("CHECK: {e}"));
    }
    lab.assert_agree();
    assert_eq!(lab.ledger().len(), 2 + pods.len());

    // DEL the first: its host veth goes (main mode: deleted by dipamd, or by the plugin
    // when dipamd cannot).
    lab.rt
        .del(&lab.fx.list, &pods[0].1)
        .unwrap_or_else(|e| panic!("DEL: {e}"));
    if main {
        assert_gone(
            &lab,
            hosts[0].as_deref().expect("main mode names the host veth"),
        );
    }
    lab.assert_agree();

    // GC with only the second valid: the third is freed, the agent's addresses stay.
    gc(&lab, &[&pods[1].1]);
    let left: Vec<String> = lab.ledger().into_iter().map(|(id, _)| id).collect();
    assert!(left.contains(&pods[1].1.container_id), "{left:?}");
    assert!(!left.contains(&pods[2].1.container_id), "GC kept {left:?}");
    assert_eq!(
        lab.addresses(),
        agent,
        "GC or a DEL touched the agent's addresses"
    );
    lab.assert_agree();

    for (_, att) in &pods[1..] {
        lab.rt
            .del(&lab.fx.list, att)
            .unwrap_or_else(|e| panic!("DEL: {e}"));
    }
    if main {
        assert_gone(&lab, hosts[1].as_deref().unwrap());
    }
    assert_eq!(lab.ledger().len(), 2, "only the agent's addresses are left");
    lab.assert_agree();
    lab
}

/// Under the set it ships with, dipamd refuses nothing and deletes the retired veths itself.
#[track_caller]
fn assert_nothing_refused(lab: &AgentLab) {
    let s = status(lab);
    assert_eq!(s["privilegeFailures"]["count"], 0, "{s:#}");
    assert_eq!(s["teardown"]["by"], "dipamd", "{s:#}");
    assert_eq!(s["teardown"]["failures"], 0, "{s:#}");
    for name in [
        "no operation lacked a privilege",
        "retired veths are deleted",
    ] {
        let c = lab.dipamd.doctor_check(name);
        assert_eq!(c["ok"], true, "{c:#}");
    }
}

#[test]
fn the_systemd_units_capabilities_parse_as_expected() {
    let r = unit_restrictions(
        "[Service]\nCapabilityBoundingSet=CAP_CHOWN\nCapabilityBoundingSet=CAP_NET_ADMIN \
         cap_kill\nAmbientCapabilities=CAP_KILL\nNoNewPrivileges=yes\n",
    );
    assert_eq!(
        r.bounding.into_iter().collect::<Vec<_>>(),
        ["chown", "kill", "net_admin"]
    );
    assert_eq!(r.ambient.into_iter().collect::<Vec<_>>(), ["kill"]);
    assert!(r.no_new_privs);
    let shipped = shipped_unit();
    assert!(shipped.bounding.contains("net_admin"), "{shipped:?}");
    assert!(shipped.no_new_privs);
    // The DaemonSet and the unit give dipamd the same capabilities.
    assert_eq!(daemonset_restrictions().bounding, shipped.bounding);
}

#[test]
fn main_mode_under_the_systemd_units_capabilities() {
    require_root!();
    let lab = exercise("dipam-host-local-1.1.0.conflist", &shipped_unit(), &[]);
    assert_nothing_refused(&lab);
    // dipamd's teardown worker counts a batch once the whole batch is done, a moment after
    // the link itself is gone (which is what `exercise` waited for): poll the count.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let s = status(&lab);
        if s["teardown"]["deleted"].as_u64().unwrap() >= 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{s:#}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn ipam_mode_under_the_systemd_units_capabilities() {
    require_root!();
    let lab = exercise("ptp-dipam-host-local.conflist", &shipped_unit(), &[]);
    assert_nothing_refused(&lab);
}

#[test]
fn main_mode_under_the_daemonsets_security_context() {
    require_root!();
    let lab = exercise(
        "dipam-host-local-1.1.0.conflist",
        &daemonset_restrictions(),
        &[],
    );
    assert_nothing_refused(&lab);
}

#[test]
fn ipam_mode_under_the_daemonsets_security_context() {
    require_root!();
    let lab = exercise(
        "ptp-dipam-host-local.conflist",
        &daemonset_restrictions(),
        &[],
    );
    assert_nothing_refused(&lab);
}

/// The set dipamd shipped with before: no CAP_NET_ADMIN. dipamd must not take a deletion it
/// cannot do (the plugin deletes its veth itself, so the veth still goes), and it says so in
/// status, doctor and the metrics instead of only in its log.
#[test]
fn one_capability_short_the_veths_still_go_and_doctor_says_why() {
    require_root!();
    let metrics_dir = tempfile::tempdir().unwrap();
    let metrics = metrics_dir.path().join("metrics.sock");
    let lab = exercise(
        "dipam-host-local-1.1.0.conflist",
        &one_short(),
        &["--metrics-socket", metrics.to_str().unwrap()],
    );
    let s = status(&lab);
    assert!(
        s["privilegeFailures"]["count"].as_u64().unwrap() >= 1,
        "{s:#}"
    );
    let last = s["privilegeFailures"]["lastError"].as_str().unwrap();
    assert!(last.contains("CAP_NET_ADMIN"), "{last}");
    assert!(
        s["teardown"]["by"].as_str().unwrap().starts_with("off"),
        "{s:#}"
    );
    let c = lab.dipamd.doctor_check("no operation lacked a privilege");
    assert_eq!(c["ok"], false, "{c:#}");
    assert!(
        c["detail"].as_str().unwrap().contains("CAP_NET_ADMIN"),
        "{c:#}"
    );
    let doctor = lab.dipamd.ctl(&["doctor"]);
    assert!(
        !doctor.status.success(),
        "doctor passed one capability short"
    );
    assert!(
        !lab.dipamd.log().contains("deleting a retired veth failed"),
        "dipamd still tried to delete veths it may not"
    );
    let text = scrape(&metrics);
    assert!(
        text.contains("\ndipam_privilege_failures_total 1\n"),
        "{text}"
    );
    assert!(
        text.contains("\ndipam_teardown_failures_total 0\n"),
        "{text}"
    );
}

/// GET /metrics on dipamd's metrics socket.
fn scrape(path: &std::path::Path) -> String {
    dipam_lifecycle::daemon::scrape_socket(path)
}

/// Every capability, but in a user namespace that does not own the host's network namespace
/// (a rootless or user-namespaced container): the kernel refuses link changes although the
/// capability sets say otherwise. dipamd asks the kernel, not its capability sets, so it
/// behaves as one capability short: the veths still go, and doctor says why.
#[test]
fn every_capability_in_a_user_namespace_is_still_refused_and_said() {
    require_root!();
    let mut lab = AgentLab::unstarted("dipam-host-local-1.1.0.conflist");
    lab.write_conflist();
    lab.set_roles("router,health", &[]);
    lab.dipamd
        .run_under(&["unshare".into(), "--user".into(), "--map-root-user".into()]);
    lab.dipamd.start_again();
    lab.wait_ready(2);
    let ns = NetNs::new();
    let att = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
    let result = lab
        .rt
        .add(&lab.fx.list, &att)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    let host = result["interfaces"][0]["name"].as_str().unwrap().to_owned();
    lab.rt
        .del(&lab.fx.list, &att)
        .unwrap_or_else(|e| panic!("DEL: {e}"));
    assert_gone(&lab, &host);
    lab.assert_agree();
    let c = lab.dipamd.doctor_check("no operation lacked a privilege");
    assert_eq!(c["ok"], false, "{c:#}");
    assert!(
        c["detail"].as_str().unwrap().contains("CAP_NET_ADMIN"),
        "{c:#}"
    );
}

/// The real azure-vnet-ipam (its state and lock on /run, its log in /var/log: src/azure.rs)
/// as the delegate, under the unit's set: a delegate that keeps its store elsewhere than
/// host-local.
#[test]
fn azure_ipam_under_the_systemd_units_capabilities() {
    require_root!();
    let lab = exercise("ptp-dipam-azure.conflist", &shipped_unit(), &[]);
    assert_nothing_refused(&lab);
}

/// The unit gives no CAP_KILL: the delegates a restarted dipamd may have to kill run as root,
/// as it does. One that runs as another user cannot be killed then; dipamd must not wait on
/// it past its bounds, and must say so in status instead of only in its log.
#[test]
fn a_delegate_it_may_not_kill_is_reported_and_does_not_hold_the_start() {
    require_root!();
    let mut lab = AgentLab::unstarted("ptp-dipam-host-local.conflist");
    lab.write_conflist();
    lab.set_roles("router", &["--delegate-timeout", "0.5"]);
    lab.dipamd.run_under(&shipped_unit().setpriv());
    // A "delegate" left by a killed predecessor, running as nobody.
    let since = boot_ticks();
    let mut other = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sleep",
            "60",
        ])
        .spawn()
        .unwrap();
    let until = boot_ticks() + 1;
    let reap = Reap(&mut other);
    lab.dipamd.plant_exec_slot(reap.0.id(), since, until);

    lab.dipamd.start_again();
    lab.wait_ready(1);
    let s = status(&lab);
    assert_eq!(s["privilegeFailures"]["count"], 1, "{s:#}");
    let last = s["privilegeFailures"]["lastError"].as_str().unwrap();
    assert!(last.contains("killing delegate pid"), "{last}");
    assert_eq!(
        lab.dipamd.doctor_check("no operation lacked a privilege")["ok"],
        false
    );
    assert!(
        reap.0.try_wait().unwrap().is_none(),
        "it was killed after all"
    );
}

/// CLOCK_BOOTTIME in clock ticks, the clock /proc/<pid>/stat's start time counts in.
fn boot_ticks() -> u64 {
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap();
    let secs: f64 = uptime.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (secs * hz) as u64
}

/// Kills and reaps the child on drop.
struct Reap<'a>(&'a mut std::process::Child);

impl Drop for Reap<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

//! dipam under the reference runtime library, libcni v1.3 (the one CRI-O and today's plugins
//! build on), through the project's driver over libcni's Go API and through cnitool, chained
//! with today's reference plugins (v1.10, built by tests/deps.sh) and with Debian 12's 1.1.1:
//! - every cniVersion (0.3.1, 0.4.0, 1.0.0, 1.1.0 and a `cniVersions` array) in main mode
//!   and in IPAM mode: ADD, CHECK, STATUS, GC with a valid list, DEL, run once through the
//!   project's emulation of libcni (src/runtime.rs) and once through real libcni, with the
//!   same outcome required of both;
//! - a GC with a valid list frees the stale pods (those libcni cached, by its own DELs; those
//!   it did not, by dipam's GC: host-local v1.10's own GC, Debian's host-local by emulation)
//!   and keeps the agent's roles and claims, with dipamd under the shipped unit's capability
//!   set on non-default paths and `dipamctl agent watch` watching;
//! - in IPAM mode no GC reaches dipam (no main plugin passes GC on to its IPAM): libcni's own
//!   DELs are all that frees, which the test pins;
//! - cnitool: ADD, CHECK, STATUS, DEL, and its GC without a valid list, which dipam refuses
//!   (code 170) after libcni has DELed what cnitool cached, freeing nothing else;
//! - STATUS: 50 while dipamd is down, success once it is up, directly in main mode and
//!   through ptp v1.10 (which passes STATUS on to its IPAM) in IPAM mode;
//! - portmap v1.10 after dipam's main mode, and bridge v1.10 over dipam's IPAM mode; bridge
//!   after dipam's main mode fails at bridge's own ADD, and the runtime's DEL frees it all;
//! - SIGKILL of dipamd at a random moment of a libcni ADD/DEL stream (the seed is printed).

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    io::BufRead,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    AgentLab, Attachment, CniError, Lab, NetNs, Runtime, bins,
    libcni::{CniTool, LibCni, Valid},
    peers::{self, Plugins},
    require_root,
    runtime::{list_version, result_ips},
    shapes::{Seeded, shipped_unit_setpriv},
};
use serde_json::{Value, json};

/// The versions every sequence runs at; "cniVersions" is a list with an array only.
const VERSIONS: [&str; 5] = ["0.3.1", "0.4.0", "1.0.0", "1.1.0", "cniVersions"];

fn at_version(list: &Value, v: &str) -> Value {
    let mut l = list.clone();
    if v == "cniVersions" {
        l.as_object_mut().unwrap().remove("cniVersion");
        l["cniVersions"] = json!(["0.3.1", "0.4.0", "1.0.0", "1.1.0"]);
    } else {
        l["cniVersion"] = json!(v);
    }
    l
}

/// After a GC: the ledger holds `kept`'s pod and nothing else, and agrees with the store.
#[track_caller]
fn assert_only_pod_left(lab: &Lab, kept: &Attachment, what: &str) -> Vec<(String, String)> {
    let ledger = lab.ledger();
    assert_eq!(ledger.len(), 1, "{what} left {ledger:?}");
    assert_eq!(
        ledger[0].0, kept.container_id,
        "{what} freed the pod it had to keep"
    );
    lab.assert_agree();
    ledger
}

/// One client of the CNI API: the emulation or real libcni.
trait Client {
    fn add(&self, list: &Value, att: &Attachment) -> Result<Value, CniError>;
    fn check(&self, list: &Value, att: &Attachment) -> Result<(), CniError>;
    fn del(&self, list: &Value, att: &Attachment) -> Result<(), CniError>;
    fn status(&self, list: &Value) -> Result<(), CniError>;
    fn gc(&self, list: &Value, valid: &[&Attachment]) -> Result<(), CniError>;
}

/// Both clients' ADD, CHECK, DEL and STATUS are their own inherent methods of the same
/// signatures: one impl of them, only GC's list differs.
macro_rules! client_verbs {
    ($ty:ty) => {
        fn add(&self, list: &Value, att: &Attachment) -> Result<Value, CniError> {
            <$ty>::add(self, list, att)
        }
        fn check(&self, list: &Value, att: &Attachment) -> Result<(), CniError> {
            <$ty>::check(self, list, att)
        }
        fn del(&self, list: &Value, att: &Attachment) -> Result<(), CniError> {
            <$ty>::del(self, list, att)
        }
        fn status(&self, list: &Value) -> Result<(), CniError> {
            <$ty>::status(self, list)
        }
    };
}

impl Client for Runtime {
    client_verbs!(Runtime);
    fn gc(&self, list: &Value, valid: &[&Attachment]) -> Result<(), CniError> {
        let v: Value = valid
            .iter()
            .map(|a| dipam_lifecycle::runtime::gc_entry(a))
            .collect();
        Runtime::gc(self, list, Some(&v)).map_err(|mut e| e.remove(0))
    }
}

impl Client for LibCni {
    client_verbs!(LibCni);
    fn gc(&self, list: &Value, valid: &[&Attachment]) -> Result<(), CniError> {
        LibCni::gc(
            self,
            list,
            &Valid::List(valid.iter().map(|a| (*a).clone()).collect()),
        )
    }
}

/// A result with what differs from run to run (addresses, MACs, netns paths, host-side
/// interface names) replaced by placeholders, so two clients' results can be compared.
fn shape(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| {
                    let x = match (k.as_str(), x) {
                        ("address", Value::String(s)) => {
                            json!(format!("<ip>/{}", s.rsplit('/').next().unwrap_or("")))
                        }
                        ("mac", _) => json!("<mac>"),
                        ("sandbox", _) => json!("<netns>"),
                        ("name", Value::String(s)) if s != "eth0" => json!("<host-if>"),
                        _ => shape(x),
                    };
                    (k.clone(), x)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(shape).collect()),
        other => other.clone(),
    }
}

fn outcome<T>(op: &str, r: Result<T, CniError>, show: impl Fn(T) -> Value) -> Value {
    match r {
        Ok(v) => json!({"op": op, "ok": show(v)}),
        Err(e) => json!({"op": op, "code": e.code, "msg": e.msg}),
    }
}

/// ADD a and b, CHECK a, STATUS, GC keeping a, DEL a twice; what each step gave, and the
/// ledger's size after the GC and at the end. Asserts the invariants on the way.
fn sequence(lab: &Lab, client: &dyn Client, list: &Value, what: &str) -> Vec<Value> {
    let (_na, a) = lab.pod();
    let (_nb, b) = lab.pod();
    let mut out = Vec::new();
    let added = client.add(list, &a);
    let ok = added.is_ok();
    if let Ok(r) = &added {
        let ips = result_ips(r);
        assert!(
            ips.len() == 1 && lab.subnet.contains(&ips[0]),
            "{what}: ADD gave {r:#}"
        );
        assert_eq!(r["cniVersion"], json!(list_version(list)), "{what}: {r:#}");
    }
    out.push(outcome("ADD a", added, |r| shape(&r)));
    if !ok {
        // A runtime DELs after a failed ADD; nothing may stay allocated.
        out.push(outcome("DEL a", client.del(list, &a), |()| json!(true)));
        assert!(
            lab.ledger().is_empty(),
            "{what}: a failed ADD left {:?}",
            lab.ledger()
        );
        lab.assert_agree();
        return out;
    }
    out.push(outcome("ADD b", client.add(list, &b), |r| shape(&r)));
    out.push(outcome("CHECK a", client.check(list, &a), |()| json!(true)));
    out.push(outcome("STATUS", client.status(list), |()| json!(true)));
    dipam_lifecycle::runtime::settle_before_gc();
    out.push(outcome("GC [a]", client.gc(list, &[&a]), |()| json!(true)));
    let after_gc = assert_only_pod_left(lab, &a, &format!("{what}: GC [a]"));
    out.push(json!({"op": "ledger after GC", "pods": after_gc.len()}));
    out.push(outcome("DEL a", client.del(list, &a), |()| json!(true)));
    out.push(outcome("DEL a again", client.del(list, &a), |()| {
        json!(true)
    }));
    assert!(lab.ledger().is_empty(), "{what}: {:?}", lab.ledger());
    lab.assert_agree();
    out
}

/// Every version through the emulation and through libcni, in one mode, with one set of
/// plugins; the two must agree step by step. Returns the outcomes by version.
fn versions_agree(conflist: &str, plugins: Plugins) -> Vec<(String, Vec<Value>)> {
    let mut lab = Lab::with_flags(conflist, &["--gc-grace", "0"]);
    lab.rt = Runtime::new(peers::cni_path(plugins));
    let libcni = LibCni::new(peers::cni_path(plugins));
    let mut all = Vec::new();
    for v in VERSIONS {
        let list = at_version(lab.list(), v);
        let what = format!("{conflist} with plugins {} at {v}", plugins.version());
        let emulated = sequence(&lab, &lab.rt, &list, &format!("{what} (emulation)"));
        let real = sequence(&lab, &libcni, &list, &format!("{what} (libcni)"));
        assert_eq!(
            emulated, real,
            "{what}: the emulation (left) and real libcni (right) differ"
        );
        all.push((v.to_owned(), real));
    }
    all
}

fn step<'a>(steps: &'a [Value], op: &str) -> &'a Value {
    steps.iter().find(|s| s["op"] == op).unwrap_or(&Value::Null)
}

/// Below 0.4.0 libcni refuses CHECK itself; from 0.4.0 every step succeeds.
#[track_caller]
fn assert_all_succeed(by_version: &[(String, Vec<Value>)]) {
    for (v, steps) in by_version {
        for s in steps {
            if s["op"] == "CHECK a" && v == "0.3.1" {
                assert!(
                    s["msg"]
                        .as_str()
                        .unwrap()
                        .contains("does not support the CHECK"),
                    "{v}: {s}"
                );
            } else if s.get("code").is_some() {
                panic!("{v}: {s} failed: {steps:#?}");
            }
        }
    }
}

#[test]
fn main_mode_at_every_version_with_current_plugins_emulation_and_libcni_agree() {
    require_root!();
    assert_all_succeed(&versions_agree(
        "dipam-host-local-1.1.0.conflist",
        Plugins::Current,
    ));
}

#[test]
fn main_mode_at_every_version_with_debian_plugins_emulation_and_libcni_agree() {
    require_root!();
    assert_all_succeed(&versions_agree(
        "dipam-host-local-1.1.0.conflist",
        Plugins::Debian,
    ));
}

#[test]
fn ipam_mode_under_ptp_at_every_version_with_current_plugins_emulation_and_libcni_agree() {
    require_root!();
    assert_all_succeed(&versions_agree(
        "ptp-dipam-host-local.conflist",
        Plugins::Current,
    ));
}

/// Debian's ptp 1.1.1 stops at 1.0.0: at 1.1.0 (and with an array, which libcni turns into
/// 1.1.0) it refuses the config before asking its IPAM, and nothing is allocated.
#[test]
fn ipam_mode_under_ptp_at_every_version_with_debian_plugins_emulation_and_libcni_agree() {
    require_root!();
    let all = versions_agree("ptp-dipam-host-local.conflist", Plugins::Debian);
    for (v, steps) in &all {
        if v == "1.1.0" || v == "cniVersions" {
            let add = step(steps, "ADD a");
            assert!(
                add["msg"]
                    .as_str()
                    .unwrap_or("")
                    .contains("incompatible CNI versions"),
                "{v}: ptp 1.1.1 accepted 1.1.0: {steps:#?}"
            );
        }
    }
    let below: Vec<_> = all
        .into_iter()
        .filter(|(v, _)| v != "1.1.0" && v != "cniVersions")
        .collect();
    assert_eq!(below.len(), 3);
    assert_all_succeed(&below);
}

/// `dipamctl agent watch --json`, collected by a thread until dropped.
struct Watcher {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Watcher {
    fn start(lab: &AgentLab) -> Self {
        let mut child = Command::new(bins::bin("dipamctl"))
            .arg("--socket")
            .arg(lab.dipamd.socket())
            .args(["agent", "watch", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        Self { child, lines }
    }

    fn seen(&self) -> Vec<Value> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An agent lab at 1.1.0 with `plugins` for dipamd's own delegate calls, dipamd under the
/// shipped unit's capability set (its paths are a temp dir's: never the defaults), with the
/// router and health roles and one claim, all ready.
fn agent_lab(conflist: &str, plugins: Plugins) -> (AgentLab, String) {
    let mut lab = AgentLab::unstarted(conflist);
    lab.fx = lab.fx.clone().with_version("1.1.0");
    lab.rt = Runtime::new(peers::cni_path(plugins));
    lab.dipamd.set_cni_path(&peers::cni_path(plugins));
    lab.write_conflist();
    lab.set_roles("router,health", &["--gc-grace", "0"]);
    lab.dipamd.run_under(&shipped_unit_setpriv());
    lab.dipamd.start_again();
    lab.wait_ready(2);
    let want = format!("{}.200", lab.subnet.cidr.trim_end_matches(".0/24"));
    let claim = lab.agent(&["claim", "egress", "--ip", &want]);
    assert_eq!(claim["claim"]["state"], "ready", "{claim:#}");
    lab.wait_ready(3);
    (lab, want)
}

/// The GC a runtime like CRI-O runs at start, through real libcni with a valid list: the
/// stale pod libcni cached is DELed by libcni, the one it never cached (its cache lost) is
/// freed by dipam's GC, and the agent's roles and claim, which no runtime lists, stay.
fn gc_keeps_agent_and_frees_stale(plugins: Plugins) {
    require_root!();
    let (lab, claimed) = agent_lab("dipam-host-local-1.1.0.conflist", plugins);
    let agent_before = lab.addresses();
    let watch = Watcher::start(&lab);
    let libcni = LibCni::new(peers::cni_path(plugins));
    let list = lab.fx.list.clone();
    let nss: Vec<NetNs> = (0..6).map(|_| NetNs::new()).collect();
    let pods: Vec<Attachment> = nss
        .iter()
        .map(|ns| Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path()))
        .collect();
    let mut ips = Vec::new();
    for p in &pods {
        ips.push(result_ips(&libcni.add(&list, p).unwrap_or_else(|e| panic!("{e}"))).remove(0));
    }
    assert!(!ips.contains(&claimed), "a pod got the claimed address");
    // pods[4]: stale, cached. pods[5]: stale, and its runtime lost its cache entry.
    libcni.forget(&list, &pods[5]);
    let valid: Vec<Attachment> = pods[..4].to_vec();
    dipam_lifecycle::runtime::settle_before_gc();
    libcni
        .gc(&list, &Valid::List(valid))
        .unwrap_or_else(|e| panic!("GC: {e}\n{}", lab.dipamd.log()));

    let ledger = lab.ledger();
    for (i, p) in pods.iter().enumerate() {
        let held = ledger.iter().any(|(id, _)| *id == p.container_id);
        assert_eq!(
            held,
            i < 4,
            "pod {i} ({}) held: {held}; ledger {ledger:?}",
            ips[i]
        );
    }
    let store = lab.delegate_store();
    for (i, ip) in ips.iter().enumerate() {
        assert_eq!(
            store.iter().any(|(_, s)| s == ip),
            i < 4,
            "{ip} in {store:?}"
        );
    }
    assert_eq!(
        lab.addresses(),
        agent_before,
        "GC touched the agent's addresses"
    );
    assert!(
        store.iter().any(|(_, s)| *s == claimed),
        "the claim's reservation is gone"
    );
    lab.assert_agree();
    assert!(
        lab.dipamd.log().contains("GC freed"),
        "dipam's GC freed nothing:\n{}",
        lab.dipamd.log()
    );
    // The watcher saw the agent's addresses, and never a change to them.
    let seen = watch.seen();
    assert!(!seen.is_empty(), "the watcher saw nothing");
    for m in &seen {
        let a = dipam_lifecycle::agentlab::addresses_of(m);
        assert!(a.is_empty() || a == agent_before, "watched a change: {m}");
    }
    for p in &pods[..4] {
        libcni.del(&list, p).unwrap_or_else(|e| panic!("{e}"));
    }
    lab.assert_agree();
}

/// host-local v1.10 has a GC of its own (frees every reservation the list does not name):
/// dipamd runs it with the agent's attachments added to the runtime's list.
#[test]
fn libcni_gc_with_a_valid_list_keeps_the_agent_and_frees_stale_pods_current_host_local() {
    gc_keeps_agent_and_frees_stale(Plugins::Current);
}

/// Debian's host-local 1.1.1 has no GC: dipamd frees the stale pod with its DEL.
#[test]
fn libcni_gc_with_a_valid_list_keeps_the_agent_and_frees_stale_pods_debian_host_local() {
    gc_keeps_agent_and_frees_stale(Plugins::Debian);
}

/// In IPAM mode the runtime's GC reaches ptp, which does not pass it on to its IPAM (no
/// main plugin does, v1.10 included): libcni's DELs of the stale attachments it cached free
/// them, and a pod whose cache entry was lost stays allocated until an operator's `dipamctl
/// gc` (or the runtime-aware GC) frees it. Pinned so the docs stay true.
#[test]
fn ipam_mode_gc_never_reaches_dipam_through_ptp() {
    require_root!();
    let (lab, _) = agent_lab("ptp-dipam-host-local.conflist", Plugins::Current);
    let libcni = LibCni::new(peers::cni_path(Plugins::Current));
    let list = lab.fx.list.clone();
    let nss: Vec<NetNs> = (0..3).map(|_| NetNs::new()).collect();
    let pods: Vec<Attachment> = nss
        .iter()
        .map(|ns| Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path()))
        .collect();
    for p in &pods {
        libcni.add(&list, p).unwrap_or_else(|e| panic!("{e}"));
    }
    libcni.forget(&list, &pods[2]);
    dipam_lifecycle::runtime::settle_before_gc();
    libcni
        .gc(&list, &Valid::List(vec![pods[0].clone()]))
        .unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<String> = lab.ledger().into_iter().map(|(id, _)| id).collect();
    assert!(ids.contains(&pods[0].container_id));
    assert!(
        !ids.contains(&pods[1].container_id),
        "libcni's DEL did not free pod 1"
    );
    assert!(
        ids.contains(&pods[2].container_id),
        "a GC reached dipam through ptp"
    );
    assert!(
        !lab.dipamd.log().contains("GC freed"),
        "{}",
        lab.dipamd.log()
    );
    lab.assert_agree();
}

/// cnitool: ADD, CHECK, STATUS and DEL at 1.1.0 in main mode; then its GC, which passes no
/// valid list: libcni DELs the attachment cnitool cached, and dipam refuses the GC itself
/// (170, "a list that names nothing") so that nothing else of the network is freed.
#[test]
fn cnitool_drives_dipam_and_its_gc_without_a_list_frees_only_what_it_cached() {
    require_root!();
    let mut lab = Lab::with_flags("dipam-host-local-1.1.0.conflist", &["--gc-grace", "0"]);
    lab.fx = lab.fx.clone().with_version("1.1.0");
    lab.rt = Runtime::new(peers::cni_path(Plugins::Current));
    let tool = CniTool::new(peers::cni_path(Plugins::Current), lab.list());
    let net = lab.network();
    let ns = NetNs::new();
    let run = |verb: &str| {
        let out = tool.run(verb, &net, std::path::Path::new(&ns.path()));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stdout, stderr) = run("add");
    assert!(ok, "cnitool add: {stderr}");
    let result: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["cniVersion"], "1.1.0");
    assert!(lab.subnet.contains(&result_ips(&result)[0]), "{result:#}");
    for verb in ["check", "status"] {
        let (ok, _, stderr) = run(verb);
        assert!(ok, "cnitool {verb}: {stderr}");
    }
    // A pod of another runtime on the same network (the emulation, whose cache cnitool does
    // not share), which a GC without a list must not free.
    let (_other_ns, other) = lab.pod();
    lab.rt.add(lab.list(), &other).unwrap();
    assert_eq!(lab.ledger().len(), 2);

    let (ok, _, stderr) = run("gc");
    assert!(
        !ok,
        "cnitool gc succeeded: dipam accepted a GC without a valid list"
    );
    assert!(
        stderr.contains("refused") && stderr.contains("list is absent"),
        "cnitool gc: {stderr}"
    );
    assert_only_pod_left(&lab, &other, "cnitool gc");
    let status: Value =
        serde_json::from_slice(&lab.dipamd.ctl(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["gc"]["refused"], 1, "{status}");
    // cnitool's own attachment is gone (libcni DELed it): its DEL now finds nothing.
    let (ok, _, stderr) = run("del");
    assert!(ok, "cnitool del: {stderr}");
    lab.rt.del(lab.list(), &other).unwrap();
    lab.assert_agree();
}

/// STATUS is 50 while dipamd is down and success once it is up: in main mode through
/// libcni and cnitool, and in IPAM mode through ptp v1.10, which passes STATUS on to its
/// IPAM (plugins >= 1.6). Debian's ptp 1.1.1 cannot run at 1.1.0, so has no STATUS at all.
#[test]
fn status_is_50_while_dipamd_is_down_and_0_once_it_is_up() {
    require_root!();
    for conflist in [
        "dipam-host-local-1.1.0.conflist",
        "ptp-dipam-host-local.conflist",
    ] {
        // dipamd stays down: STATUS fails once the plugin's 2 s wait for it ends.
        let mut lab = Lab::with_flags(conflist, &[]).with_plugin_timeout(2);
        lab.fx = lab.fx.clone().with_version("1.1.0");
        lab.rt = Runtime::new(peers::cni_path(Plugins::Current));
        let libcni = LibCni::new(peers::cni_path(Plugins::Current));
        let tool = CniTool::new(peers::cni_path(Plugins::Current), lab.list());
        let net = lab.network();
        let cnitool_status = || tool.run("status", &net, std::path::Path::new("/proc/self/ns/net"));
        libcni
            .status(lab.list())
            .unwrap_or_else(|e| panic!("{conflist} up: {e}"));
        assert!(
            cnitool_status().status.success(),
            "{conflist}: cnitool status up"
        );

        lab.dipamd.kill9();
        let e = libcni.status(lab.list()).unwrap_err();
        assert_eq!(e.code, 50, "{conflist} down: {e}");
        assert!(!e.msg.is_empty(), "{e}");
        let out = cnitool_status();
        assert!(
            !out.status.success(),
            "{conflist}: cnitool status succeeded while down"
        );
        let emulated = lab.rt.status(lab.list()).unwrap_err();
        assert_eq!(emulated.code, 50, "{conflist}: emulation {emulated}");

        lab.dipamd.start_again();
        libcni
            .status(lab.list())
            .unwrap_or_else(|e| panic!("{conflist} back: {e}"));
        assert!(
            cnitool_status().status.success(),
            "{conflist}: cnitool status back"
        );
    }
}

/// portmap v1.10 after dipam's main mode (its port mapping in the host's nat table while the
/// pod lives, gone after DEL), and bridge v1.10 over dipam's IPAM mode, through libcni.
#[test]
fn portmap_after_main_mode_and_bridge_over_ipam_mode_with_current_plugins() {
    require_root!();
    let mut lab = Lab::with_flags("dipam-portmap.conflist", &[]);
    lab.fx = lab.fx.clone().with_version("1.1.0");
    let libcni = LibCni::new(peers::cni_path(Plugins::Current));
    let (_ns, pod) = lab.pod();
    let port = 30_000 + (std::process::id() % 20_000) as u16;
    let pod = pod.with_capability(
        "portMappings",
        json!([{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]),
    );
    let r = libcni
        .add(lab.list(), &pod)
        .unwrap_or_else(|e| panic!("{e}"));
    let ip = result_ips(&r).remove(0);
    // portmap v1.10 writes iptables rules, or nftables ones with `"backend": "nftables"` or
    // where only nftables is there: read both.
    let nat = || {
        let mut text = String::new();
        for argv in [
            &["iptables-save", "-t", "nat"][..],
            &["nft", "list", "ruleset"][..],
        ] {
            if let Ok(out) = Command::new(argv[0]).args(&argv[1..]).output() {
                text.push_str(&String::from_utf8_lossy(&out.stdout));
            }
        }
        text
    };
    let dnat = format!("{ip}:80");
    assert!(
        nat().contains(&port.to_string()) && nat().contains(&dnat),
        "no DNAT for {port} -> {dnat}:\n{}",
        nat()
    );
    libcni
        .check(lab.list(), &pod)
        .unwrap_or_else(|e| panic!("{e}"));
    libcni.status(lab.list()).unwrap_or_else(|e| panic!("{e}"));
    libcni
        .del(lab.list(), &pod)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!nat().contains(&dnat), "portmap left its DNAT:\n{}", nat());
    lab.assert_agree();
    assert!(lab.ledger().is_empty());

    let mut lab = Lab::with_flags("bridge-dipam-host-local.conflist", &[]);
    lab.fx = lab.fx.clone().with_version("1.1.0");
    let (_ns, pod) = lab.pod();
    let r = libcni
        .add(lab.list(), &pod)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(result_ips(&r).len(), 1, "{r:#}");
    assert_eq!(lab.ledger().len(), 1);
    libcni
        .check(lab.list(), &pod)
        .unwrap_or_else(|e| panic!("{e}"));
    // bridge v1.10 passes STATUS on to dipam too.
    libcni.status(lab.list()).unwrap_or_else(|e| panic!("{e}"));
    libcni
        .del(lab.list(), &pod)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(lab.ledger().is_empty());
    lab.assert_agree();
}

/// bridge chained after dipam's main mode, as written by a user who wants a bridge for
/// pods dipam networks: the reference bridge plugin is an interface plugin that ignores
/// prevResult on ADD and always creates the pod's interface itself, named CNI_IFNAME, which
/// dipam already created. Today's bridge (v1.10.0, at 1.1.0) fails the ADD with "container
/// veth name (\"eth0\") peer provided (\"veth...\") already exists", Debian's (1.1.1, at
/// 1.0.0) with "container veth name provided (eth0) already exists"; the DEL a runtime then sends (libcni's DelNetworkList) releases dipam's address,
/// so nothing leaks. The working shape is bridge with dipam as its IPAM (above).
#[test]
fn bridge_after_main_mode_fails_at_bridges_add_and_the_del_releases_everything() {
    require_root!();
    for (plugins, version) in [(Plugins::Current, "1.1.0"), (Plugins::Debian, "1.0.0")] {
        let mut raw = dipam_lifecycle::Fixture::load("dipam-host-local.conflist");
        raw.list["plugins"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "bridge", "bridge": "cni0"}));
        let lab = Lab::from_fixture(raw.with_version(version), &[]);
        let libcni = LibCni::new(peers::cni_path(plugins));
        let (ns, pod) = lab.pod();
        let e = libcni.add(lab.list(), &pod).unwrap_err();
        eprintln!("{plugins:?} {version}: {e:?}");
        // The driver reports libcni's error: which plugin failed is in its text.
        assert!(
            e.stderr.contains("plugin type=\"bridge\" failed (add)"),
            "{plugins:?}: {e:?}"
        );
        assert_eq!(e.code, 999, "bridge's plain Go error: {e:?}");
        assert!(
            e.msg.contains("container veth name")
                && e.msg.contains("eth0")
                && e.msg.contains("already exists"),
            "{plugins:?}: {e:?}"
        );
        // dipam's part had succeeded: its address is held until the runtime's DEL.
        assert_eq!(lab.ledger().len(), 1, "{plugins:?}");
        lab.assert_agree();
        libcni
            .del(lab.list(), &pod)
            .unwrap_or_else(|e| panic!("{plugins:?}: {e}"));
        assert!(lab.ledger().is_empty(), "{plugins:?}: {:?}", lab.ledger());
        lab.assert_agree();
        let links = String::from_utf8_lossy(&ns.exec(&["ip", "-o", "link"]).stdout).into_owned();
        assert!(!links.contains("eth0"), "{plugins:?}: {links}");
    }
}

/// libcni ADDs and DELs pods in main mode at 1.1.0 while dipamd is SIGKILLed at a random
/// moment and started again: every ADD either succeeded (and its pod holds one address) or
/// failed and was DELed, every DEL of a pod eventually succeeds, and once all are DELed the
/// ledger and host-local v1.10 hold nothing. STATUS answers 50 while dipamd is down.
#[test]
fn sigkill_of_dipamd_at_a_random_moment_under_libcni_converges() {
    require_root!();
    // The kill points are drawn from a seed it prints: DIPAM_SEED replays them.
    let mut rng = Seeded::new("sigkill_of_dipamd_at_a_random_moment_under_libcni_converges");
    let mut lab = Lab::with_flags("dipam-host-local-1.1.0.conflist", &[]);
    lab.fx = lab.fx.clone().with_version("1.1.0");
    let libcni = Arc::new(LibCni::new(peers::cni_path(Plugins::Current)));
    let list = lab.list().clone();
    let nss: Vec<NetNs> = (0..8).map(|_| NetNs::new()).collect();
    let pods: Vec<Attachment> = nss
        .iter()
        .map(|ns| Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path()))
        .collect();
    let kill_after = Duration::from_millis(rng.below(1500));
    eprintln!("SIGKILL after {kill_after:?}");
    let worker = {
        let (libcni, list, pods) = (libcni.clone(), list.clone(), pods.clone());
        std::thread::spawn(move || {
            // An ADD that fails while dipamd is down is DELed below, as a runtime does.
            pods.iter()
                .map(|p| (p.container_id.clone(), libcni.add(&list, p).is_ok()))
                .collect::<Vec<_>>()
        })
    };
    std::thread::sleep(kill_after);
    lab.dipamd.kill9();
    let e = libcni.status(&list).unwrap_err();
    assert_eq!(e.code, 50, "{e}");
    std::thread::sleep(Duration::from_millis(rng.below(300)));
    lab.dipamd.start_again();
    let outcomes = worker.join().unwrap();
    eprintln!("ADD outcomes (container ID, ok): {outcomes:?}");
    let held: Vec<String> = lab.ledger().into_iter().map(|(id, _)| id).collect();
    for (id, ok) in &outcomes {
        // A successful ADD holds its address across the kill and restart.
        assert!(
            !ok || held.contains(id),
            "{id}'s ADD succeeded but it holds nothing"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for p in &pods {
        loop {
            match libcni.del(&list, p) {
                Ok(()) => break,
                Err(e) => {
                    assert!(Instant::now() < deadline, "DEL never succeeded: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(lab.ledger().is_empty() && lab.delegate_store().is_empty() && lab.spooled() == 0) {
        assert!(
            Instant::now() < deadline,
            "not converged: ledger {:?} store {:?} spooled {}",
            lab.ledger(),
            lab.delegate_store(),
            lab.spooled()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    lab.assert_agree();
    libcni.status(&list).unwrap_or_else(|e| panic!("{e}"));
}

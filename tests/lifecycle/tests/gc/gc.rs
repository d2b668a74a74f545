//! CNI 1.1 GC and STATUS: agent-owned attachments survive a list that lacks them, stale pods
//! are freed through a delegate with native GC and by emulation against the real host-local,
//! a concurrent ADD keeps its address, ADDs beside a large GC never get an address whose
//! release is still in flight, unsafe lists are refused, and STATUS tells down, starting and
//! ready apart. A GC whose caller gave up (the plugin's timeoutSeconds) still frees all it
//! planned, GCs whose callers hang up while one runs do not pile up, and a dipamd stopped
//! mid-GC exits within its bound and its next start finishes the GC's marked records.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::{
    AgentLab, Attachment, CniError, Lab,
    deployment::Deployment,
    peers::{self, Plugins},
    require_root,
    runtime::result_ips,
};
use serde_json::{Value, json};

/// Runs CNI GC through the plugin (as libcni does: plugin config + name + cniVersion + both
/// list keys, no container variables).
fn gc(
    rt: &dipam_lifecycle::Runtime,
    list: &Value,
    valid: Option<Value>,
) -> Result<Value, CniError> {
    let mut l = list.clone();
    l["cniVersion"] = json!("1.1.0");
    if let Some(v) = valid {
        l["plugins"][0]["cni.dev/valid-attachments"] = v.clone();
        l["plugins"][0]["cni.dev/attachments"] = v;
    }
    rt.ipam(&l, 0, "GC", &Attachment::new("", ""), None)
}

fn entry(a: &Attachment) -> Value {
    json!({"containerID": a.container_id, "ifname": a.ifname})
}

fn add(lab_rt: &dipam_lifecycle::Runtime, list: &Value, a: &Attachment) -> String {
    result_ips(&lab_rt.ipam(list, 0, "ADD", a, None).unwrap()).remove(0)
}

/// Agent-owned attachments are not in the runtime's list (the runtime does not know them);
/// GC must never free them. Stale pods are freed by emulation (host-local has no GC).
#[test]
fn agent_addresses_survive_and_stale_pods_go_host_local() {
    require_root!();
    let lab = AgentLab::new(
        "ptp-dipam-host-local.conflist",
        "router,health",
        &["--gc-grace", "0"],
    );
    lab.wait_ready(2);
    let agent_ips = lab.addresses();
    let ns = dipam_lifecycle::NetNs::new();
    let keep = Attachment::new(&dipam_lifecycle::unique("keep"), &ns.path());
    let stale = Attachment::new(&dipam_lifecycle::unique("stale"), &ns.path());
    add(&lab.rt, &lab.fx.list, &keep);
    let stale_ip = add(&lab.rt, &lab.fx.list, &stale);
    assert_eq!(lab.delegate_store().len(), 4);

    dipam_lifecycle::runtime::settle_before_gc();
    gc(&lab.rt, &lab.fx.list, Some(json!([entry(&keep)]))).unwrap_or_else(|e| panic!("{e}"));
    let store = lab.delegate_store();
    assert_eq!(store.len(), 3, "{store:?}");
    assert!(!store.iter().any(|(_, ip)| *ip == stale_ip));
    assert!(store.iter().any(|(id, _)| *id == keep.container_id));
    assert_eq!(
        lab.addresses(),
        agent_ips,
        "GC touched the agent's addresses"
    );
    lab.assert_agree();
    assert!(lab.dipamd.log().contains("GC freed"));
}

/// host-local holds a reservation dipamd never recorded (made behind its back): emulated GC
/// frees it by running host-local's DEL; dry-run shows it first and frees nothing.
#[test]
fn emulated_gc_frees_host_local_orphans_and_dry_run_frees_nothing() {
    require_root!();
    let lab = Lab::with_flags("ptp-dipam-host-local.conflist", &["--gc-grace", "0"]);
    let (_ns, pod) = lab.pod();
    lab.rt.ipam(lab.list(), 0, "ADD", &pod, None).unwrap();
    // An allocation straight through host-local, as a second runtime would make it.
    let out = lab
        .rt
        .add_behind_dipams_back(lab.list(), "orphan-behind-dipams-back");
    assert!(out.status.success());
    assert_eq!(lab.delegate_store().len(), 2);

    let path = lab.dipamd.dir.path().join("net.conflist");
    std::fs::write(&path, serde_json::to_vec(lab.list()).unwrap()).unwrap();
    let dry = lab.dipamd.ctl(&[
        "gc",
        "--conflist",
        path.to_str().unwrap(),
        "--use-ledger",
        "--dry-run",
        "--json",
    ]);
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let plan: Value = serde_json::from_slice(&dry.stdout).unwrap();
    let items = plan["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{plan}");
    assert_eq!(items[0]["kind"], "orphan");
    assert_eq!(items[0]["containerID"], "orphan-behind-dipams-back");
    assert_eq!(items[0]["outcome"], "planned");
    assert!(
        items[0]["reason"]
            .as_str()
            .unwrap()
            .contains("unknown to dipamd")
    );
    assert_eq!(lab.delegate_store().len(), 2, "dry run freed something");

    gc(&lab.rt, lab.list(), Some(json!([entry(&pod)]))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lab.delegate_store().len(), 1);
    lab.assert_agree();
}

/// A delegate with native CNI 1.1 GC: the real host-local of today's plugins (v1.10.0
/// implements GC: it frees every reservation its valid list does not name). dipamd runs its
/// GC with the augmented list and drops the freed records from the ledger.
#[test]
fn native_gc_delegate_frees_stale_pods() {
    require_root!();
    let plugins = Plugins::Current;
    let lab = Lab::with_plugins(
        "ptp-dipam-host-local.conflist",
        &["--gc-grace", "0"],
        plugins,
    )
    .with_version("1.1.0");
    let (_a, keep) = lab.pod();
    let (_b, stale) = lab.pod();
    lab.rt.ipam(lab.list(), 0, "ADD", &keep, None).unwrap();
    lab.rt.ipam(lab.list(), 0, "ADD", &stale, None).unwrap();
    // A reservation made straight through host-local, unknown to dipamd: only the delegate's
    // own GC can know to free it (dipamd reads no store of a delegate that has GC).
    let out = dipam_lifecycle::Runtime::new(peers::cni_path(plugins))
        .add_behind_dipams_back(lab.list(), "orphan-in-host-local");
    let orphan_ip = result_ips(&serde_json::from_slice(&out.stdout).unwrap()).remove(0);
    assert_eq!(lab.delegate_store().len(), 3);

    dipam_lifecycle::runtime::settle_before_gc();
    gc(&lab.rt, lab.list(), Some(json!([entry(&keep)]))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lab.delegate_store().len(), 1);
    assert!(
        !lab.delegate_store().iter().any(|(_, ip)| *ip == orphan_ip),
        "host-local's own GC kept the orphan {orphan_ip}"
    );
    lab.assert_agree();
    assert!(
        lab.dipamd
            .log()
            .contains("delegate GC run with the augmented valid list"),
        "dipamd did not run host-local's GC:\n{}",
        lab.dipamd.log()
    );
}

/// An ADD racing a GC keeps its address: GC never frees an attachment in flight or younger
/// than the grace period.
#[test]
fn concurrent_add_during_gc_keeps_its_ip() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let (_ns, old) = lab.pod();
    lab.rt.ipam(lab.list(), 0, "ADD", &old, None).unwrap();
    for round in 0..5 {
        let (_n, fresh) = lab.pod();
        let list = lab.list().clone();
        let old_entry = entry(&old);
        std::thread::scope(|s| {
            let g = s.spawn(|| gc(&lab.rt, &list, Some(json!([old_entry]))));
            let a = s.spawn(|| lab.rt.ipam(&list, 0, "ADD", &fresh, None));
            g.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round} GC: {e}"));
            a.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round} ADD: {e}"));
        });
        assert!(
            lab.delegate_store()
                .iter()
                .any(|(id, _)| *id == fresh.container_id),
            "round {round}: GC freed the pod being added"
        );
        lab.assert_agree();
    }
}

/// GC locks what it frees, not the network, so pods' ADDs run beside a large GC, and the
/// delegate may hand one of them an address the GC is releasing at that moment: host-local
/// unlinks its reservation before its DEL exits, and only the DEL's exit makes the release
/// certain. Here the range is full (1 kept + 63 stale attachments in 64 addresses), so every
/// ADD gets an address the GC frees, and host-local's DEL waits 100 ms after unlinking (a
/// stand-in that runs the real host-local first), so that many ADDs are handed an address
/// whose release is still in flight. Asserted:
/// - no ADD is answered with a freed address before dipamd logged it freed ("GC freed" is
///   written once the DEL returned and the record is gone), so none got one still being
///   released;
/// - no ADD is refused for an address conflict (156) on the way: it waits instead;
/// - the wait was exercised (dipamd's debug line), so the test can fail;
/// - no address is held twice, and the ledger and host-local agree at the end.
#[test]
fn adds_during_a_large_gc_never_get_an_address_still_being_released() {
    require_root!();
    const STALE: usize = 63;
    const ADDS: usize = 30;
    let mut lab = Lab::with_flags(
        "ptp-dipam-host-local.conflist",
        &["--gc-grace", "0", "--gc-max-free-share", "1"],
    );
    let subnet: ipnet::Ipv4Net = lab.subnet.cidr.parse().unwrap();
    let base = u32::from(subnet.network());
    let ip = |n: u32| std::net::Ipv4Addr::from(base + n).to_string();
    lab.fx.list["plugins"][0]["ipam"]["delegate"]["ranges"] = json!([[{
        "subnet": lab.subnet.cidr, "rangeStart": ip(2), "rangeEnd": ip(65)
    }]]);
    let (_standins, rt) = dipam_lifecycle::Runtime::with_standins(&[(
        "host-local",
        &format!(
            "real={}/host-local\n\
             [ \"$CNI_COMMAND\" = DEL ] || exec \"$real\"\n\
             \"$real\"; rc=$?\n\
             sleep 0.1\n\
             exit $rc",
            dipam_lifecycle::bins::REFERENCE_PLUGINS
        ),
    )]);
    lab.rt = rt;
    let list = lab.list().clone();
    let none = "/var/run/netns/none";
    let keep = Attachment::new(&dipam_lifecycle::unique("keep"), none);
    add(&lab.rt, &list, &keep);
    let stale: Vec<Attachment> = (0..STALE)
        .map(|_| Attachment::new(&dipam_lifecycle::unique("stale"), none))
        .collect();
    std::thread::scope(|s| {
        for part in stale.chunks(STALE.div_ceil(4)) {
            let (rt, list) = (&lab.rt, &list);
            s.spawn(move || {
                for a in part {
                    add(rt, list, a);
                }
            });
        }
    });
    let stale_ips: std::collections::HashSet<String> =
        lab.delegate_store().into_iter().map(|(_, ip)| ip).collect();
    assert_eq!(stale_ips.len(), STALE + 1, "the range is not full");
    dipam_lifecycle::runtime::settle_before_gc();

    let gc_done = std::sync::atomic::AtomicBool::new(false);
    let (gc_out, added) = std::thread::scope(|s| {
        let g = s.spawn(|| {
            let out = gc(&lab.rt, &list, Some(json!([entry(&keep)])));
            gc_done.store(true, std::sync::atomic::Ordering::SeqCst);
            out
        });
        // A runtime creating pods meanwhile: an ADD that fails (the range is full until the
        // GC's first DELs) is DELed and retried, as kubelet does.
        let mut added: Vec<(Attachment, String)> = Vec::new();
        let mut refused = Vec::new();
        while added.len() < ADDS {
            let a = Attachment::new(&dipam_lifecycle::unique("new"), none);
            match lab.rt.ipam(&list, 0, "ADD", &a, None) {
                Ok(r) => {
                    let got = result_ips(&r).remove(0);
                    // Answered: if the address was a stale one, its release was certain
                    // before (logged before the record went and the ADD could go on).
                    if stale_ips.contains(&got) {
                        let log = lab.dipamd.log();
                        let quoted = format!("\"{got}/");
                        assert!(
                            log.lines()
                                .any(|l| l.contains("GC freed") && l.contains(&quoted)),
                            "{} was answered with {got} before its release was certain",
                            a.container_id
                        );
                    }
                    added.push((a, got));
                }
                Err(e) => {
                    refused.push(e.code);
                    assert_ne!(
                        e.code, 156,
                        "an ADD was refused for an address conflict: {e}"
                    );
                    lab.rt.ipam(&list, 0, "DEL", &a, None).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
        }
        let during = gc_done.load(std::sync::atomic::Ordering::SeqCst);
        eprintln!(
            "{} ADDs, {} refused (range full) and retried; GC still running after them: {}",
            added.len(),
            refused.len(),
            !during
        );
        (g.join().unwrap(), added)
    });
    gc_out.unwrap_or_else(|e| panic!("GC: {e}"));
    let log = lab.dipamd.log();
    assert!(
        log.contains("whose release is in flight; waiting for it to end"),
        "no ADD was handed an address whose release was in flight: the test did not test"
    );
    // Nothing stale is left; the kept pod and every new pod hold their own address.
    let mut want: Vec<(String, String)> = added
        .iter()
        .map(|(a, ip)| (a.container_id.clone(), ip.clone()))
        .chain(
            lab.delegate_store()
                .into_iter()
                .filter(|(id, _)| *id == keep.container_id),
        )
        .collect();
    want.sort();
    assert_eq!(lab.ledger(), want);
    let mut ips: Vec<&String> = want.iter().map(|(_, ip)| ip).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), want.len(), "an address is held twice: {want:?}");
    lab.assert_agree();
}

/// Empty, null and absent lists are refused, and so is a list that would free most pods;
/// nothing is freed in either case.
#[test]
fn unsafe_lists_are_refused() {
    require_root!();
    let lab = Lab::with_flags("ptp-dipam-host-local.conflist", &["--gc-grace", "0"]);
    let pods: Vec<_> = (0..4).map(|_| lab.pod()).collect();
    for (_, p) in &pods {
        lab.rt.ipam(lab.list(), 0, "ADD", p, None).unwrap();
    }
    for (what, valid) in [
        ("empty", Some(json!([]))),
        ("null", Some(Value::Null)),
        ("absent", None),
        ("one of four", Some(json!([entry(&pods[0].1)]))),
    ] {
        let e = gc(&lab.rt, lab.list(), valid).unwrap_err();
        assert_eq!(e.code, 170, "{what}: {e}");
        assert_eq!(lab.delegate_store().len(), 4, "{what} freed something");
    }
    let status: Value =
        serde_json::from_slice(&lab.dipamd.ctl(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["gc"]["refused"], 4, "{status}");
}

/// STATUS: dipamd down → 50; waiting for its conflist → 50 naming it; ready → success; the
/// delegate's store wiped under running pods → 51.
#[test]
fn status_down_starting_ready_and_limited() {
    require_root!();
    let mut lab = AgentLab::unstarted("ptp-dipam-host-local.conflist");
    lab.set_roles("router", &["--reconcile-interval", "1"]);
    let mut list = lab.fx.list.clone();
    list["cniVersion"] = json!("1.1.0");
    let status = |lab: &AgentLab| {
        lab.rt
            .ipam(&list, 0, "STATUS", &Attachment::new("", ""), None)
    };

    let e = status(&lab).unwrap_err();
    assert_eq!(e.code, 50, "down: {e}");
    lab.dipamd.start_again();
    let e = status(&lab).unwrap_err();
    assert_eq!(e.code, 50, "starting: {e}");
    assert!(e.details.contains("waiting for conflist"), "{e}");
    lab.write_conflist();
    lab.wait_ready(1);
    status(&lab).unwrap_or_else(|e| panic!("ready: {e}"));

    let ns = dipam_lifecycle::NetNs::new();
    let pod = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
    lab.rt.ipam(&lab.fx.list, 0, "ADD", &pod, None).unwrap();
    let dir = lab.data.path().join(lab.network());
    for e in std::fs::read_dir(&dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let e = loop {
        match status(&lab) {
            Err(e) if e.code == 51 => break e,
            _ => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no 51:\n{}",
                    lab.dipamd.log()
                );
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
    };
    assert!(e.details.contains("may be handed out twice"), "{e}");
}

/// A lab whose host-local sleeps `secs` before the first DEL of each container (and logs the
/// container ID of every DEL to the returned file; a DEL run again, by the next start's
/// replay, does not sleep), dipamd freeing up to every pod (`--gc-max-free-share 1`), and
/// the plugin waiting 2 s for dipamd. The stand-in is a real host-local behind a script: the
/// slow delegate of a loaded node at 10,000 attachments (docs/performance.md run 29), where a
/// GC outran the plugin's timeoutSeconds, cannot be made on demand, and the sleep before the
/// real DEL makes every release happen after the plugin gave up.
/// The two directories (stand-ins, DEL log) live as long as the returned guards.
fn slow_del_lab(secs: u32) -> (Lab, [tempfile::TempDir; 2], std::path::PathBuf) {
    let lab = Lab::with_flags(
        "ptp-dipam-host-local.conflist",
        &["--gc-grace", "0", "--gc-max-free-share", "1"],
    )
    .with_plugin_timeout(2);
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("dels");
    let (standins, rt) = dipam_lifecycle::Runtime::with_standins(&[(
        "host-local",
        &format!(
            "if [ \"$CNI_COMMAND\" = DEL ]; then\n\
               echo \"$CNI_CONTAINERID\" >> {log}\n\
               seen={dir}/seen-$CNI_CONTAINERID\n\
               [ -e \"$seen\" ] || {{ : > \"$seen\"; sleep {secs}; }}\n\
             fi\n\
             exec {}/host-local \"$@\"",
            dipam_lifecycle::bins::REFERENCE_PLUGINS,
            log = log.display(),
            dir = log_dir.path().display(),
        ),
    )]);
    let mut lab = lab;
    lab.rt = rt;
    (lab, [standins, log_dir], log)
}

/// The container IDs of this test process's pods among `pairs` (not the agent's addresses a
/// deployed dipamd allocates), sorted, once each.
fn ours(pairs: Vec<(String, String)>) -> Vec<String> {
    let mine = format!("-{}-", std::process::id());
    let mut v: Vec<String> = pairs
        .into_iter()
        .map(|(id, _)| id)
        .filter(|id| id.contains(&mine))
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Waits up to `secs` for the ledger and host-local's directory of `lab` to hold exactly
/// `want` of this test's pods (container IDs); panics naming what is left.
#[track_caller]
fn wait_for_only(lab: &Lab, want: &[&Attachment], secs: u64) {
    let mut want: Vec<String> = want.iter().map(|a| a.container_id.clone()).collect();
    want.sort();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let (ledger, store) = (ours(lab.ledger()), ours(lab.delegate_store()));
        if ledger == want && store == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "after {secs} s the ledger holds {ledger:?} and host-local {store:?}, not only \
             {want:?}\ndipamd's log:\n{}",
            lab.dipamd.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// A GC whose plugin gives up (code 11: its timeoutSeconds, 2 s here, passed while host-local
/// was still releasing) runs to its end anyway: with no restart of dipamd and no other
/// operation on those keys, every stale attachment ends freed in the ledger and in
/// host-local's directory, and the valid ones are kept. Before, the GC was dropped with the
/// call: what it had marked stayed `deleting` until dipamd's next start.
#[test]
fn a_gc_whose_caller_gave_up_still_frees_every_stale_attachment() {
    require_root!();
    let (lab, _dirs, dels) = slow_del_lab(4);
    caller_gives_up_and_the_gc_frees(&lab, &dels);
}

/// The same under the shipped unit's restrictions and started like the DaemonSet (its
/// capabilities, read-only root, the manifest's flags): the GC's task needs nothing the
/// request's handler did not have.
#[test]
fn a_gc_whose_caller_gave_up_still_frees_every_stale_attachment_deployed() {
    require_root!();
    for d in Deployment::BOTH {
        eprintln!("{}", d.name());
        let (mut lab, dirs, dels) = slow_del_lab(4);
        // The DEL log is the stand-in's, written from dipamd's mount namespace.
        d.start(&mut lab, None, &[dirs[1].path()]);
        caller_gives_up_and_the_gc_frees(&lab, &dels);
    }
}

/// Four stale attachments and two valid ones; the GC with the valid list times out in the
/// plugin (code 11), and then frees the stale ones, each DELed once, with nobody waiting.
fn caller_gives_up_and_the_gc_frees(lab: &Lab, dels: &std::path::Path) {
    const STALE: usize = 4;
    let list = lab.list().clone();
    let none = "/var/run/netns/none";
    let keep: Vec<Attachment> = (0..2)
        .map(|_| Attachment::new(&dipam_lifecycle::unique("gckeep"), none))
        .collect();
    let stale: Vec<Attachment> = (0..STALE)
        .map(|_| Attachment::new(&dipam_lifecycle::unique("gcstale"), none))
        .collect();
    for a in keep.iter().chain(&stale) {
        add(&lab.rt, &list, a);
    }
    dipam_lifecycle::runtime::settle_before_gc();
    let valid = Value::Array(keep.iter().map(entry).collect());
    let e = gc(&lab.rt, &list, Some(valid)).unwrap_err();
    assert_eq!(e.code, 11, "the plugin did not give up on its timeout: {e}");
    // Each DEL sleeps 4 s, two at a time: nothing was released when the plugin left.
    assert_eq!(
        ours(lab.ledger()).len(),
        keep.len() + STALE,
        "freed before the timeout"
    );
    wait_for_only(lab, &keep.iter().collect::<Vec<_>>(), 30);
    let log = lab.dipamd.log();
    assert!(
        log.contains("GC finished after its caller left"),
        "dipamd did not say the GC finished without its caller:\n{log}"
    );
    // Its task logs in the CNI call's span: an operator finds its lines by that call.
    for line in log.lines().filter(|l| l.contains("GC freed")) {
        assert!(
            // The text format's `cni{...}`, the JSON format's `"name":"cni"`.
            (line.contains("cni{") || line.contains(r#""name":"cni""#)) && line.contains("GC"),
            "a line of the GC outside its CNI call's span: {line}"
        );
    }
    let deleted = std::fs::read_to_string(dels).unwrap();
    for a in &stale {
        assert_eq!(
            deleted.lines().filter(|l| *l == a.container_id).count(),
            1,
            "{} was not DELed exactly once: {deleted}",
            a.container_id
        );
    }
    lab.assert_agree();
}

/// Calling GC and hanging up again and again does not pile up GCs: while one runs (its own
/// caller gone), the GCs arriving on the same network wait for it with their callers, and
/// those callers giving up leaves nothing behind. Each later GC's list omits two pods the
/// first one keeps: had any of them been left waiting in dipamd, it would have run after the
/// first and freed them.
#[test]
fn gcs_whose_callers_hang_up_while_one_runs_do_not_pile_up() {
    require_root!();
    let (lab, _dirs, dels) = slow_del_lab(3);
    let list = lab.list().clone();
    let none = "/var/run/netns/none";
    let mk = |p: &str, n: usize| -> Vec<Attachment> {
        (0..n)
            .map(|_| Attachment::new(&dipam_lifecycle::unique(p), none))
            .collect()
    };
    let (keep, extra, stale) = (mk("gckeep", 1), mk("gcextra", 2), mk("gcstale", 3));
    for a in keep.iter().chain(&extra).chain(&stale) {
        add(&lab.rt, &list, a);
    }
    dipam_lifecycle::runtime::settle_before_gc();
    let first = Value::Array(keep.iter().chain(&extra).map(entry).collect());
    let later = Value::Array(keep.iter().map(entry).collect());
    std::thread::scope(|s| {
        let g = s.spawn(|| gc(&lab.rt, &list, Some(first)));
        // The first GC holds the network's GC lock by now (its plan takes milliseconds; its
        // DELs take 3 s each, two at a time: about 6 s).
        std::thread::sleep(std::time::Duration::from_millis(700));
        let later: Vec<_> = (0..4)
            .map(|_| s.spawn(|| gc(&lab.rt, &list, Some(later.clone()))))
            .collect();
        for h in later {
            let e = h.join().unwrap().unwrap_err();
            assert_eq!(e.code, 11, "a later GC did not time out waiting: {e}");
        }
        assert_eq!(g.join().unwrap().unwrap_err().code, 11);
    });
    let kept: Vec<&Attachment> = keep.iter().chain(&extra).collect();
    wait_for_only(&lab, &kept, 30);
    // Long enough for a GC left waiting to have run after the first and DELed the extras
    // (it would start at once; its first DEL is logged before its 3 s sleep).
    std::thread::sleep(std::time::Duration::from_secs(4));
    wait_for_only(&lab, &kept, 0);
    let deleted = std::fs::read_to_string(&dels).unwrap();
    for a in &extra {
        assert!(
            !deleted.contains(&a.container_id),
            "a GC whose caller left while it waited ran later and DELed {}",
            a.container_id
        );
    }
    let log = lab.dipamd.log();
    assert_eq!(
        log.matches("GC finished after its caller left").count(),
        1,
        "not exactly one GC ran without its caller:\n{log}"
    );
    lab.assert_agree();
}

/// dipamd stopped (SIGTERM) while a GC whose caller left is mid-release: the GC does not hold
/// its exit up (dipamd exits within its shutdown bound, `--shutdown-timeout` 5 s plus 1 s for
/// blocking work, long before the GC's 30 s DELs would end), the records the GC marked stay
/// `deleting`, and the next start releases them before it serves (its replay runs their DELs
/// again: each stale container is DELed twice).
#[test]
fn sigterm_during_a_gc_whose_caller_left_exits_in_time_and_the_next_start_finishes_it() {
    require_root!();
    let (mut lab, _dirs, dels) = slow_del_lab(30);
    let list = lab.list().clone();
    let none = "/var/run/netns/none";
    let keep = Attachment::new(&dipam_lifecycle::unique("gckeep"), none);
    let stale: Vec<Attachment> = (0..2)
        .map(|_| Attachment::new(&dipam_lifecycle::unique("gcstale"), none))
        .collect();
    for a in std::iter::once(&keep).chain(&stale) {
        add(&lab.rt, &list, a);
    }
    dipam_lifecycle::runtime::settle_before_gc();
    let e = gc(&lab.rt, &list, Some(json!([entry(&keep)]))).unwrap_err();
    assert_eq!(e.code, 11, "the plugin did not give up on its timeout: {e}");
    let started = |id: &str| {
        std::fs::read_to_string(&dels)
            .unwrap_or_default()
            .lines()
            .filter(|l| *l == id)
            .count()
    };
    // Both DELs run (two at a time): both records are marked `deleting` by now.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stale.iter().any(|a| started(&a.container_id) == 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the GC's DELs never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let t = std::time::Instant::now();
    let status = lab
        .dipamd
        .terminate_within(std::time::Duration::from_secs(8));
    let took = t.elapsed();
    assert!(status.success(), "dipamd exited with {status}");
    assert!(
        lab.dipamd
            .log()
            .matches("GC finished after its caller left")
            .count()
            == 0,
        "the GC ended before the stop: the test did not test"
    );
    eprintln!("dipamd exited {took:?} after SIGTERM, mid-GC");
    lab.dipamd.start_again();
    wait_for_only(&lab, &[&keep], 30);
    for a in &stale {
        assert_eq!(
            started(&a.container_id),
            2,
            "{}: not DELed once by the GC and once by the next start's replay",
            a.container_id
        );
    }
    lab.assert_agree();
}

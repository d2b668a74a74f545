//! GC input is checked, not guessed: a runtime's list (CNI GC through the plugin) or an
//! operator's file (`dipamctl gc --valid`) with any entry that is not exactly
//! `{containerID, ifname}` is refused whole and frees nothing, against the real host-local;
//! freeing all pods of a small network takes `--force`; and a dry run lists what it keeps and
//! why.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    AgentLab, Attachment, CniError, Dipamd, Lab, NetNs, cmd, require_root, runtime::gc_entry,
};
use serde_json::{Value, json};

const VALID: &str = "cni.dev/valid-attachments";
const LEGACY: &str = "cni.dev/attachments";

/// CNI GC through the plugin as libcni sends it (plugin config, name, cniVersion 1.1.0, no
/// container variables), with `keys` set to the given values.
fn gc(
    rt: &dipam_lifecycle::Runtime,
    list: &Value,
    keys: &[(&str, &Value)],
) -> Result<Value, CniError> {
    dipam_lifecycle::runtime::settle_before_gc();
    let mut l = list.clone();
    l["cniVersion"] = json!("1.1.0");
    for (k, v) in keys {
        l["plugins"][0][*k] = (*v).clone();
    }
    rt.ipam(&l, 0, "GC", &Attachment::new("", ""), None)
}

/// The malformed entries a runtime or an operator's script could write, each with what the
/// refusal must say about it. `id` is the pod the entry means.
fn bad_entries(id: &str) -> Vec<(&'static str, Value, &'static str)> {
    vec![
        (
            "wrong-case key",
            json!({"containerId": id, "ifname": "eth0"}),
            "wrong case",
        ),
        (
            "missing ifname",
            json!({"containerID": id}),
            "\"ifname\" is missing",
        ),
        (
            "extra key",
            json!({"containerID": id, "ifname": "eth0", "netns": "/var/run/netns/x"}),
            "\"netns\" is not allowed",
        ),
        (
            "number as containerID",
            json!({"containerID": 42, "ifname": "eth0"}),
            "not a string",
        ),
        (
            "list as ifname",
            json!({"containerID": id, "ifname": ["eth0"]}),
            "not a string",
        ),
        ("bare string", json!(id), "not an object"),
    ]
}

/// A lab with three pods older than the grace period (0 here).
fn three_pods() -> (Lab, Vec<(NetNs, Attachment)>) {
    let lab = Lab::with_flags("ptp-dipam-host-local.conflist", &["--gc-grace", "0"]);
    let pods: Vec<_> = (0..3).map(|_| lab.pod()).collect();
    for (_, p) in &pods {
        lab.rt.ipam(lab.list(), 0, "ADD", p, None).unwrap();
    }
    assert_eq!(lab.delegate_store().len(), 3);
    lab.assert_agree();
    (lab, pods)
}

fn status(d: &Dipamd) -> Value {
    serde_json::from_slice(&d.ctl(&["status", "--json"]).stdout).unwrap()
}

/// Each malformed shape in the runtime's list refuses the whole GC with code 7, naming the
/// entry; host-local and the ledger keep all three pods. Before the check, the entry for the
/// third pod was skipped and that pod freed (the control at the end shows the list without
/// it does free it).
#[test]
fn malformed_runtime_lists_refuse_the_whole_gc() {
    require_root!();
    let (lab, pods) = three_pods();
    let before = lab.delegate_store();
    let good = [gc_entry(&pods[0].1), gc_entry(&pods[1].1)];
    let mut refusals = 0;
    for (what, bad, says) in bad_entries(&pods[2].1.container_id) {
        let list = json!([good[0], good[1], bad]);
        // libcni >= 1.2.3 sends both keys; 1.2.0-1.2.2 only the first; either alone is read.
        for keys in [vec![(VALID, &list), (LEGACY, &list)], vec![(LEGACY, &list)]] {
            let e = gc(&lab.rt, lab.list(), &keys).unwrap_err();
            refusals += 1;
            assert_eq!(e.code, 7, "{what}: {e}");
            assert!(e.msg.contains(&format!("{}[2]", keys[0].0)), "{what}: {e}");
            assert!(
                e.msg.contains(&bad.to_string()),
                "{what}: the entry is not quoted: {e}"
            );
            assert!(e.details.contains(says), "{what}: {e}");
            assert!(e.details.contains("nothing was freed"), "{what}: {e}");
            assert_eq!(lab.delegate_store(), before, "{what} freed something");
            lab.assert_agree();
        }
    }
    // An object where the list belongs.
    let object = gc_entry(&pods[0].1);
    let e = gc(&lab.rt, lab.list(), &[(VALID, &object), (LEGACY, &object)]).unwrap_err();
    refusals += 1;
    assert_eq!(e.code, 7, "{e}");
    assert!(e.msg.contains("is an object, not a list"), "{e}");
    assert_eq!(lab.delegate_store(), before);
    // A huge entry is quoted, not echoed whole.
    let huge = json!([{"x".repeat(200_000): "eth0"}]);
    let e = gc(&lab.rt, lab.list(), &[(VALID, &huge)]).unwrap_err();
    refusals += 1;
    assert_eq!(e.code, 7, "{e}");
    assert!(
        e.msg.len() + e.details.len() < 2000,
        "{} bytes",
        e.msg.len()
    );
    assert_eq!(lab.delegate_store(), before);
    assert_eq!(status(&lab.dipamd)["gc"]["refused"], refusals);

    // Control: the same list without the bad entry frees the third pod.
    let list = json!(good);
    gc(&lab.rt, lab.list(), &[(VALID, &list), (LEGACY, &list)]).unwrap_or_else(|e| panic!("{e}"));
    let after = lab.delegate_store();
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(!after.iter().any(|(id, _)| *id == pods[2].1.container_id));
    lab.assert_agree();
}

/// A node's valid list is one entry per pod, about 100 bytes each, and libcni >= 1.2.3 sends
/// it under both keys: at 10,000 pods a GC's config is about 1.9 MiB, past the 1 MiB every
/// other config is held to (a GC above ~5,300 pods was refused as too large). Through the
/// real plugin and dipamd, a list of 10,000 entries besides the two live pods frees exactly
/// the third; a config past the GC's own 16 MiB bound is refused with code 7 and frees
/// nothing.
#[test]
fn a_gc_naming_ten_thousand_pods_goes_through() {
    require_root!();
    let (lab, pods) = three_pods();
    let mut entries: Vec<Value> = (0..10_000)
        .map(|i| json!({"containerID": format!("{i:064x}"), "ifname": "eth0"}))
        .collect();
    entries.push(gc_entry(&pods[0].1));
    entries.push(gc_entry(&pods[1].1));
    let list = json!(entries);
    let bytes = list.to_string().len() * 2;
    assert!(bytes > 3 << 19, "{bytes}: the config is past 1.5 MiB");
    gc(&lab.rt, lab.list(), &[(VALID, &list), (LEGACY, &list)]).unwrap_or_else(|e| panic!("{e}"));
    let after = lab.delegate_store();
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(!after.iter().any(|(id, _)| *id == pods[2].1.container_id));
    lab.assert_agree();

    // Past the bound: refused whole, with what to fix, and the two pods stay.
    let pad = json!("x".repeat(17 << 20));
    let e = gc(&lab.rt, lab.list(), &[(VALID, &list), ("padding", &pad)]).unwrap_err();
    assert_eq!(e.code, 7, "{e}");
    assert!(e.msg.contains("larger than 16 MiB"), "{e}");
    assert_eq!(lab.delegate_store(), after);
    lab.assert_agree();
}

/// The same check when dipam is the main plugin (`"type": "dipam"`): its GC reaches dipamd
/// the same way, and a wrong-case key refuses it whole.
#[test]
fn main_mode_gc_checks_the_list_too() {
    require_root!();
    let lab = Lab::with_flags("dipam-host-local-1.1.0.conflist", &["--gc-grace", "0"]);
    let pods: Vec<_> = (0..2).map(|_| lab.pod()).collect();
    for (_, p) in &pods {
        lab.rt.add(lab.list(), p).unwrap();
    }
    let before = lab.delegate_store();
    assert_eq!(before.len(), 2);
    let list = json!([
        gc_entry(&pods[0].1),
        {"containerId": pods[1].1.container_id, "ifname": "eth0"}
    ]);
    let mut conf = dipam_lifecycle::Runtime::plugin_config(lab.list(), 0, None);
    conf["cniVersion"] = json!("1.1.0");
    conf[VALID] = list.clone();
    conf[LEGACY] = list;
    let e = lab
        .rt
        .exec(
            "dipam",
            "GC",
            &Attachment::new("", ""),
            &serde_json::to_vec(&conf).unwrap(),
        )
        .into_result("dipam")
        .unwrap_err();
    assert_eq!(e.code, 7, "{e}");
    assert!(e.msg.contains("[1]"), "{e}");
    assert_eq!(lab.delegate_store(), before);
    lab.assert_agree();
    for (_, p) in &pods {
        lab.rt.del(lab.list(), p).unwrap();
    }
    assert!(lab.delegate_store().is_empty());
}

fn conflist_file(lab: &Lab) -> PathBuf {
    let path = lab.dipamd.dir.path().join("net.conflist");
    std::fs::write(&path, serde_json::to_vec(lab.list()).unwrap()).unwrap();
    path
}

/// `dipamctl gc --valid FILE` with each malformed shape (and an object instead of a list):
/// dipamctl exits non-zero naming the file and the entry, with and without --dry-run, and
/// nothing is freed.
#[test]
fn dipamctl_refuses_malformed_files_and_frees_nothing() {
    require_root!();
    let (lab, pods) = three_pods();
    let before = lab.delegate_store();
    let conflist = conflist_file(&lab);
    let file = lab.dipamd.dir.path().join("valid.json");
    let ctl = |dry: bool| {
        let extra: &[&str] = if dry { &["--dry-run"] } else { &[] };
        lab.dipamd.gc_valid(&conflist, &file, extra)
    };
    let good = [gc_entry(&pods[0].1), gc_entry(&pods[1].1)];
    let mut cases: Vec<(String, Value, String)> = bad_entries(&pods[2].1.container_id)
        .into_iter()
        .map(|(what, bad, says)| {
            (
                what.to_owned(),
                json!([good[0], good[1], bad]),
                says.to_owned(),
            )
        })
        .collect();
    cases.push((
        "object instead of a list".into(),
        gc_entry(&pods[0].1),
        "is an object, not a list".into(),
    ));
    for (what, content, says) in cases {
        std::fs::write(&file, serde_json::to_vec(&content).unwrap()).unwrap();
        for dry in [true, false] {
            let out = ctl(dry);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{what}: accepted");
            assert!(err.contains(file.to_str().unwrap()), "{what}: {err}");
            assert!(err.contains(&says), "{what}: {err}");
            if content.is_array() {
                assert!(err.contains("[2]"), "{what}: the entry is not named: {err}");
            }
            assert_eq!(lab.delegate_store(), before, "{what} freed something");
            lab.assert_agree();
        }
    }
    // Control: the good list frees the third pod.
    std::fs::write(&file, serde_json::to_vec(&json!(good)).unwrap()).unwrap();
    let out = ctl(false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lab.delegate_store().len(), 2);
    lab.assert_agree();
}

/// The share interlock at every size: freeing the only pod of a network, or both of two, is
/// what a truncated list does. The runtime's GC is refused (170) and so is dipamctl's, until
/// an operator passes --force; freeing one of two goes through.
#[test]
fn freeing_all_of_a_small_network_takes_force() {
    require_root!();
    let lab = Lab::with_flags("ptp-dipam-host-local.conflist", &["--gc-grace", "0"]);
    let conflist = conflist_file(&lab);
    let file = lab.dipamd.dir.path().join("valid.json");
    // A list that names only a pod this network does not hold.
    let elsewhere = json!([{"containerID": "running-elsewhere", "ifname": "eth0"}]);
    std::fs::write(&file, serde_json::to_vec(&elsewhere).unwrap()).unwrap();
    let ctl = |extra: &[&str]| lab.dipamd.gc_valid(&conflist, &file, extra);
    // The runtime's GC, both keys naming only that pod.
    let gc_elsewhere = || {
        gc(
            &lab.rt,
            lab.list(),
            &[(VALID, &elsewhere), (LEGACY, &elsewhere)],
        )
    };

    let (_a, only) = lab.pod();
    lab.rt.ipam(lab.list(), 0, "ADD", &only, None).unwrap();
    let e = gc_elsewhere().unwrap_err();
    assert_eq!(e.code, 170, "1 of 1: {e}");
    assert!(e.details.contains("1 of the network's 1"), "{e}");
    for extra in [&["--dry-run"][..], &[]] {
        let out = ctl(extra);
        assert!(!out.status.success(), "1 of 1 {extra:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    }
    assert_eq!(
        lab.delegate_store().len(),
        1,
        "1 of 1 freed without --force"
    );
    let v = cmd::json(&ctl(&["--force", "--json"]));
    assert_eq!(
        v["items"][0]["containerID"],
        only.container_id.as_str(),
        "{v}"
    );
    assert_eq!(v["items"][0]["outcome"], "freed", "{v}");
    assert!(lab.delegate_store().is_empty());
    lab.assert_agree();

    let (_b, a) = lab.pod();
    let (_c, b) = lab.pod();
    lab.rt.ipam(lab.list(), 0, "ADD", &a, None).unwrap();
    lab.rt.ipam(lab.list(), 0, "ADD", &b, None).unwrap();
    let e = gc_elsewhere().unwrap_err();
    assert_eq!(e.code, 170, "2 of 2: {e}");
    assert_eq!(lab.delegate_store().len(), 2, "2 of 2 freed");
    let one = json!([gc_entry(&a)]);
    gc(&lab.rt, lab.list(), &[(VALID, &one), (LEGACY, &one)])
        .unwrap_or_else(|e| panic!("1 of 2: {e}"));
    let store = lab.delegate_store();
    assert_eq!(store.len(), 1);
    assert_eq!(store[0].0, a.container_id);
    lab.assert_agree();
}

/// (container ID, keep reasons) of a plan's kept items, and the IDs it would free.
fn plan(v: &Value) -> (Vec<(String, Vec<String>)>, Vec<String>) {
    let mut kept: Vec<(String, Vec<String>)> = v["kept"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            assert_eq!(i["outcome"], "kept", "{i}");
            assert!(!i["reason"].as_str().unwrap().is_empty(), "{i}");
            let mut why: Vec<String> = i["keep"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_str().unwrap().to_owned())
                .collect();
            why.sort();
            (i["containerID"].as_str().unwrap().to_owned(), why)
        })
        .collect();
    kept.sort();
    let freed = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["containerID"].as_str().unwrap().to_owned())
        .collect();
    (kept, freed)
}

/// Every IP, sorted: the ledger and host-local's store name a pooled pod differently (its own
/// ID, the pool key), but hold the same addresses.
fn ips(pairs: Vec<(String, String)>) -> Vec<String> {
    let mut v: Vec<String> = pairs.into_iter().map(|(_, ip)| ip).collect();
    v.sort();
    v
}

/// `dipamctl gc --dry-run --json` (and the table) with an agent and a warm pool running:
/// inside the grace period every attachment is kept for it; after a restart with no grace,
/// the listed pod is kept as in the list, the router as the agent's, the pool entry as the
/// pool's, and only the unlisted pod would be freed. Nothing is freed by either dry run; the
/// real GC then frees exactly the planned pod, and the agent stays ready.
#[test]
fn dry_run_lists_what_it_keeps_and_why() {
    require_root!();
    let flags = |grace: &'static str| ["--gc-grace", grace, "--warm-pool", "1"];
    let mut lab = AgentLab::new("ptp-dipam-host-local.conflist", "router", &flags("3600"));
    lab.wait_ready(1);
    let router = lab.agent(&["list"])["addresses"][0]["containerID"]
        .as_str()
        .unwrap()
        .to_owned();
    let ns = NetNs::new();
    let listed = Attachment::new(&dipam_lifecycle::unique("listed"), &ns.path());
    let stale = Attachment::new(&dipam_lifecycle::unique("stale"), &ns.path());
    for p in [&listed, &stale] {
        lab.rt.ipam(&lab.fx.list, 0, "ADD", p, None).unwrap();
    }
    let pool_entry = wait_pool_entry(&lab);
    let file = lab.dipamd.dir.path().join("valid.json");
    std::fs::write(
        &file,
        serde_json::to_vec(&json!([gc_entry(&listed)])).unwrap(),
    )
    .unwrap();
    let dry = |lab: &AgentLab, json: bool| {
        let mut args = vec!["gc", "--valid", file.to_str().unwrap(), "--dry-run"];
        if json {
            args.push("--json");
        }
        dipam_lifecycle::cmd::ok_named("dipamctl gc --dry-run", &lab.dipamd.ctl(&args))
    };
    let before = ips(lab.delegate_store());
    assert_eq!(ips(lab.ledger()), before);

    let (kept, freed) = plan(&serde_json::from_str(&dry(&lab, true)).unwrap());
    let g = |r: &[&str]| r.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut want = vec![
        (router.clone(), g(&["agent", "grace"])),
        (listed.container_id.clone(), g(&["grace", "valid-list"])),
        (stale.container_id.clone(), g(&["grace"])),
        (pool_entry.clone(), g(&["grace", "pool"])),
    ];
    want.sort();
    assert_eq!(kept, want);
    assert!(freed.is_empty(), "{freed:?}");

    lab.set_roles("router", &flags("0"));
    lab.dipamd.restart();
    lab.wait_ready(1);
    let (kept, freed) = plan(&serde_json::from_str(&dry(&lab, true)).unwrap());
    let mut want = vec![
        (router.clone(), g(&["agent"])),
        (listed.container_id.clone(), g(&["valid-list"])),
        (pool_entry.clone(), g(&["pool"])),
    ];
    want.sort();
    assert_eq!(kept, want);
    assert_eq!(freed, vec![stale.container_id.clone()]);
    let table = dry(&lab, false);
    assert!(table.contains("the agent's router address"), "{table}");
    assert!(table.contains("a warm-pool entry"), "{table}");
    assert!(table.contains("in the valid list"), "{table}");
    assert!(table.contains("1 would be freed, 3 kept"), "{table}");
    assert_eq!(
        ips(lab.delegate_store()),
        before,
        "a dry run freed something"
    );

    let out = lab
        .dipamd
        .ctl(&["gc", "--valid", file.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, freed) = plan(&serde_json::from_slice(&out.stdout).unwrap());
    assert_eq!(freed, vec![stale.container_id.clone()]);
    assert_eq!(lab.delegate_store().len(), before.len() - 1);
    assert_eq!(ips(lab.ledger()), ips(lab.delegate_store()));
    lab.wait_ready(1);
}

/// Waits for the warm pool's one entry to be committed; returns its container ID.
fn wait_pool_entry(lab: &AgentLab) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let all = lab.dipamd.ledger();
        let pool: Vec<&Value> = all.iter().filter(|a| a["owner"] == "pool").collect();
        if pool.len() == 1
            && pool[0]["state"] == "committed"
            && all.iter().all(|a| a["state"] == "committed")
        {
            return pool[0]["containerID"].as_str().unwrap().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no pool entry: {all:?}\n{}",
            lab.dipamd.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

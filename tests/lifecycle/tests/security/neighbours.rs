//! A non-root neighbour on root's network (issue 28 §5, docs/cfp.md "Threat model"): an
//! allowed uid (nobody, 65534, a real process through setpriv, `--allow-uid`) adds under root's
//! network name, with container ID `0` (first in key order) and its own range in a store
//! dipamd allows it (`--non-root-data-dir`), against a dipamd under the shipped unit's
//! capability set with a reconcile every second. Its records decide nothing for root: root's
//! ADDs are never refused with 159, `dipamctl status` shows root's range, and a reservation
//! lost from its store makes neither CNI STATUS answer 51 nor health NOT_SERVING. The
//! runtime-aware GC (a real containerd) collects its record in its own scope, from its own
//! store, and doctor reports each scope apart. Every case also runs against a dipamd started
//! like the DaemonSet (deployment.rs).

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{os::unix::fs::PermissionsExt, time::Duration};

use dipam_lifecycle::{
    Attachment, Containerd, Lab, Runtime, deployment::Deployment, hostlocal, nobody, require,
    require_root,
};
use serde_json::{Value, json};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

fn health(lab: &Lab) -> i32 {
    let socket = lab.dipamd.socket();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let ch = dipam_proto::connect(&socket).await.unwrap();
            HealthClient::new(ch)
                .check(HealthCheckRequest { service: "".into() })
                .await
                .unwrap()
                .into_inner()
                .status
        })
}

/// CNI STATUS as a 1.1 runtime sends it for root's network: `Ok` or the CNI code.
fn cni_status(lab: &Lab) -> Result<(), u64> {
    let mut list = lab.list().clone();
    list["cniVersion"] = json!("1.1.0");
    lab.rt
        .ipam(&list, 0, "STATUS", &Attachment::new("", ""), None)
        .map(drop)
        .map_err(|e| e.code)
}

fn status_json(lab: &Lab) -> Value {
    let out = lab.dipamd.ctl(&["status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A store dipamd allows nobody (`--non-root-data-dir`): root-owned, 0755.
fn their_store() -> tempfile::TempDir {
    let theirs = dipam_lifecycle::temp_dir("nobodys-allowed-store-");
    std::fs::set_permissions(theirs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    theirs
}

/// A lab in shape `d` that lets nobody in (its socket group, `--allow-uid`) with
/// [`their_store`] as nobody's allowed store, plus `extra` flags.
fn nobodys_lab(d: Deployment, extra: &[&str]) -> (Lab, tempfile::TempDir) {
    let theirs = their_store();
    let dir = theirs.path().display().to_string();
    let mut flags = nobody::allowed_and(extra);
    flags.extend(["--non-root-data-dir", dir.as_str()]);
    let mut lab = Lab::with_flags("ptp-dipam-host-local.conflist", &flags);
    d.start(&mut lab, None, &[theirs.path()]);
    (lab, theirs)
}

#[test]
fn a_non_root_callers_records_never_decide_for_roots_network() {
    never_decide(Deployment::ShippedUnit);
}

/// As above, against a dipamd started like the DaemonSet.
#[test]
fn a_non_root_callers_records_never_decide_for_roots_network_daemonset() {
    never_decide(Deployment::DaemonSet);
}

fn never_decide(d: Deployment) {
    require_root!();
    let (lab, theirs) = nobodys_lab(d, &["--reconcile-interval", "1"]);
    let dir = theirs.path().display().to_string();
    let net = lab.network();
    let (_ns, kept) = lab.pod();
    lab.rt.add(lab.list(), &kept).unwrap();

    // nobody under root's network name, container ID 0 first in key order, its own range.
    let their_subnet = format!("10.250.{}.0/24", std::process::id() % 250);
    let mut conf = Runtime::plugin_config(lab.list(), 0, None);
    conf["ipam"]["delegate"]["dataDir"] = json!(dir);
    conf["ipam"]["delegate"]["ranges"] = json!([[{ "subnet": their_subnet }]]);
    for cid in ["0", "nobody-2"] {
        let answer = nobody::ipam("ADD", cid, &conf);
        assert!(answer.get("code").is_none(), "{cid}: {answer}");
    }
    std::thread::sleep(Duration::from_secs(3));
    lab.assert_serves(5);
    let status = status_json(&lab);
    let ranges = status["ranges"].to_string();
    eprintln!("root's ranges with nobody on its network: {ranges}");
    assert!(
        ranges.contains(lab.subnet.cidr.trim_end_matches("0/24")) && !ranges.contains("10.250."),
        "{ranges}"
    );

    // One of nobody's reservations is lost from its store (nobody cannot write there: the
    // loss is made by root, as a wipe of that directory would).
    let theirs_net = theirs.path().join(&net);
    let lost = std::fs::read_dir(&theirs_net)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| std::fs::read_to_string(p).is_ok_and(|t| t.starts_with("nobody-2")))
        .expect("nobody-2's reservation");
    std::fs::remove_file(&lost).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let status = status_json(&lab);
    eprintln!(
        "after the loss: ready {} missing {} STATUS {:?} health {}",
        status["ready"],
        status["divergence"]["missing"],
        cni_status(&lab),
        health(&lab)
    );
    assert_eq!(cni_status(&lab), Ok(()), "{}", lab.dipamd.log());
    assert_eq!(health(&lab), ServingStatus::Serving as i32);
    assert_eq!(status["ready"], true, "{status}");
    assert_eq!(status["divergence"]["missing"], 0, "{status}");
    lab.assert_serves(5);

    for cid in ["0", "nobody-2"] {
        let answer = nobody::ipam("DEL", cid, &conf);
        assert!(answer.get("code").is_none(), "{cid}: {answer}");
    }
    lab.rt.del(lab.list(), &kept).unwrap();
    lab.assert_agree();
    let left: Vec<_> = std::fs::read_dir(&theirs_net)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect();
    assert!(left.is_empty(), "nobody's store still holds {left:?}");
}

/// One runtime-aware GC pass now (`dipamctl gc --from-runtime --json --kept 1000`): each
/// item's and kept entry's (containerID, outcome, keep codes).
fn runtime_pass(lab: &Lab) -> Vec<(String, String, String)> {
    let out = lab
        .dipamd
        .ctl(&["gc", "--from-runtime", "--json", "--kept", "1000"]);
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("gc --from-runtime: {e}: {out:?}"));
    assert!(out.status.success(), "{v:#}");
    ["items", "kept"]
        .iter()
        .flat_map(|k| v[*k].as_array().cloned().unwrap_or_default())
        .map(|i| {
            let s = |k: &str| i[k].as_str().unwrap_or_default().to_owned();
            (s("containerID"), s("outcome"), i["keep"].to_string())
        })
        .collect()
}

#[test]
fn the_runtime_gc_and_doctor_take_a_non_root_record_in_its_own_scope() {
    runtime_gc_and_doctor(Deployment::ShippedUnit);
}

/// As above, against a dipamd started like the DaemonSet.
#[test]
fn the_runtime_gc_and_doctor_take_a_non_root_record_in_its_own_scope_daemonset() {
    runtime_gc_and_doctor(Deployment::DaemonSet);
}

/// nobody adds under root's network name (container ID `0`, first in key order), made
/// through CRI as far as its CNI_ARGS say, in its own store and range. doctor reports its
/// scope apart from root's (named with its uid, its own store); the runtime-aware GC, whose
/// runtime (a real containerd) lists no such sandbox, frees it after two passes from its own
/// store, while root's sandbox keeps its address and root's store is untouched.
fn runtime_gc_and_doctor(d: Deployment) {
    require!(dipam_lifecycle::containerd::unavailable());
    let theirs = their_store();
    let dir = theirs.path().display().to_string();
    let cd = Containerd::start();
    let endpoint = format!("unix://{}", cd.socket().display());
    let mut lab = Lab::with_flags(
        "dipam-host-local-1.1.0.conflist",
        &[
            "--cri-endpoint",
            &endpoint,
            "--reconcile-interval",
            "3600",
            "--runtime-gc-interval",
            "3600",
            "--gc-grace",
            "0",
            "--gc-max-free-share",
            "1",
            "--non-root-data-dir",
            &dir,
        ]
        .into_iter()
        .chain(nobody::ALLOWED)
        .collect::<Vec<_>>(),
    )
    .with_version("1.0.0");
    d.start(&mut lab, None, &[theirs.path()]);
    cd.set_conflist(lab.list());
    let net = lab.network();
    let stays = cd.run_pod("stays").unwrap();
    let ip_stays = cd.pod_ip(&stays.id).unwrap();

    let their_subnet = format!("10.251.{}.0/24", std::process::id() % 250);
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": net,
        "type": "ptp",
        "ipam": {
            "type": "dipam",
            "socketPath": lab.dipamd.socket(),
            "delegate": {"type": "host-local", "dataDir": dir, "ranges": [[{"subnet": their_subnet}]]}
        }
    });
    let cri_args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=ghost;K8S_POD_INFRA_CONTAINER_ID=0;\
                    K8S_POD_UID=0b5c1a7e-0000-4000-8000-000000000002;IgnoreUnknown=1";
    let answer = nobody::ipam_with_args("ADD", "0", cri_args, &conf);
    assert!(answer.get("code").is_none(), "{answer}");
    let theirs_net = theirs.path().join(&net);
    let held = |dir: &std::path::Path| hostlocal::store_pairs(dir, &net);
    assert_eq!(held(theirs.path()).len(), 1, "nobody's reservation");

    // doctor: root's scope and nobody's, each with its own store.
    let root = lab.dipamd.doctor_check(&format!(
        "network {net}: delegate store agrees with the ledger"
    ));
    let mine = lab.dipamd.doctor_check(&format!(
        "network {net} (uid 65534): delegate store agrees with the ledger"
    ));
    eprintln!("doctor ({}): root's {root}\nnobody's {mine}", d.name());
    assert_eq!(root["ok"], true, "{root:#}");
    assert_eq!(mine["ok"], true, "{mine:#}");
    let details = |c: &Value| c["detail"].as_str().unwrap_or_default().to_owned();
    assert!(
        details(&root).contains(&lab.data.path().display().to_string()),
        "{root:#}"
    );
    assert!(details(&mine).contains(&dir), "{mine:#}");

    // Two passes: missed once, then freed from nobody's own store.
    let verdict = |v: &[(String, String, String)], cid: &str| {
        v.iter()
            .find(|(c, _, _)| c == cid)
            .map(|(_, o, k)| (o.clone(), k.clone()))
            .unwrap_or_else(|| panic!("{cid} not in {v:?}"))
    };
    let first = runtime_pass(&lab);
    assert_eq!(verdict(&first, "0").1, r#"["first-miss"]"#, "{first:?}");
    assert_eq!(verdict(&first, &stays.id).1, r#"["listed"]"#, "{first:?}");
    let root_store_before = held(lab.data.path());
    let second = runtime_pass(&lab);
    eprintln!("runtime-aware GC ({}): {second:?}", d.name());
    assert_eq!(
        verdict(&second, "0").0,
        "freed",
        "{second:?}\n{}",
        lab.dipamd.log()
    );
    assert!(
        held(theirs.path()).is_empty(),
        "nobody's store still holds {:?}",
        held(theirs.path())
    );
    assert!(theirs_net.is_dir());
    assert_eq!(
        held(lab.data.path()),
        root_store_before,
        "root's store changed"
    );
    assert!(
        lab.ledger().contains(&(stays.id.clone(), ip_stays.clone())),
        "{:?}",
        lab.ledger()
    );
    assert!(!lab.ledger().iter().any(|(c, _)| c == "0"));
    lab.assert_agree();
    lab.assert_serves(3);

    // containerd's own DELs, while dipamd serves.
    cd.stop_pod(&stays.id).unwrap();
    cd.remove_pod(&stays.id).unwrap();
    lab.assert_agree();
    assert!(!lab.ledger().iter().any(|(c, _)| *c == stays.id));
}

/// nobody runs the dipam plugin as [`nobody::ipam`] does, but in a user and time namespace of
/// its own whose boot clock runs a day ahead (any unprivileged user may make one): its
/// request carries an `issued_at` a day in the future, as one it wrote itself would.
fn ipam_a_day_ahead(command: &str, cid: &str, conf: &Value) -> Value {
    let dipam = dipam_lifecycle::bins::bin("dipam").display().to_string();
    let out = nobody::run(
        &[
            "unshare",
            "--user",
            "--map-current-user",
            "--time",
            "--fork",
            "--boottime",
            "86400",
            &dipam,
        ],
        &[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", "/var/run/netns/nobodys"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", &dipam_lifecycle::bins::cni_path()),
        ],
        &conf.to_string(),
    );
    assert!(
        out.status.success() || !out.stdout.is_empty(),
        "the plugin in nobody's time namespace did not run: {out:?}"
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// Issue 38 §3 (low). nobody DELs, a day ahead on the boot clock, the key of a pod root is
/// about to add (and a key of its own). Before, dipamd kept that DEL's tombstone against
/// every caller: root's ADD of the key failed with 3 for ten minutes. Now nobody's DEL
/// succeeds and does nothing (the spec's DEL of what is not there), its tombstone binds
/// nobody alone and its stamp is clamped to dipamd's now: root's ADD is served, so is
/// nobody's own ADD after its DEL, and nothing is lost.
#[test]
fn a_non_root_del_from_the_future_never_blocks_roots_add() {
    future_del(Deployment::ShippedUnit);
}

/// As above, against a dipamd started like the DaemonSet.
#[test]
fn a_non_root_del_from_the_future_never_blocks_roots_add_daemonset() {
    future_del(Deployment::DaemonSet);
}

fn future_del(d: Deployment) {
    require_root!();
    let (lab, theirs) = nobodys_lab(d, &[]);
    let dir = theirs.path().display().to_string();
    let mut conf = Runtime::plugin_config(lab.list(), 0, None);
    conf["ipam"]["delegate"]["dataDir"] = json!(dir);
    let their_subnet = format!("10.249.{}.0/24", std::process::id() % 250);
    conf["ipam"]["delegate"]["ranges"] = json!([[{ "subnet": their_subnet }]]);

    let (_ns, pod) = lab.pod();
    let own = dipam_lifecycle::unique("nobody-own");
    for cid in [pod.container_id.as_str(), own.as_str()] {
        let answer = ipam_a_day_ahead("DEL", cid, &conf);
        assert!(answer.get("code").is_none(), "{cid}: {answer}");
    }
    let served = lab.rt.add(lab.list(), &pod);
    assert!(served.is_ok(), "{served:?}\n{}", lab.dipamd.log());
    lab.assert_agree();
    let answer = nobody::ipam("ADD", &own, &conf);
    assert!(answer.get("code").is_none(), "nobody's own ADD: {answer}");
    assert!(nobody::ipam("DEL", &own, &conf).get("code").is_none());
    lab.rt.del(lab.list(), &pod).unwrap();
    lab.assert_serves(5);
    lab.assert_agree();
    eprintln!(
        "a DEL a day ahead ({}): root's ADD of its key served, nobody's own ADD served",
        d.name()
    );
}

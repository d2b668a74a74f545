//! Adopting a live node (docs/cfp.md §7.4, "Unrecorded reservations"): a node whose runtime
//! already runs 20 pods on plain ptp + host-local gets dipam put in front of its IPAM with
//! `dipamctl install --wrap --in-place`, as the README says, under Debian's podman 4.3 (CNI
//! backend) and containerd (through CRI). Then doctor, the reconcile loop with freeing on
//! (every second), the operator's GC and the runtime-aware GC all run, and every pod keeps
//! its address and its connectivity (the host pings each; one pod pings another), while a
//! reservation nothing uses is still freed. New pods get other addresses, and every pod's
//! DEL releases through dipamd.
//!
//! Also the two datapath rules of main mode that a lost reservation used to break silently:
//! an ADD whose address the host still routes to another live veth is refused with 165
//! (nothing taken over, nothing leaked), and an attachment a GC frees loses its host veth
//! and route with its address.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use dipam_lifecycle::{
    Containerd, Dipamd, Fixture, Lab, NetNs, Subnet, bins,
    cmd::{self, ok},
    daemon::{ctl_at, install_wrap},
    hostlocal,
    links::ipv4_addresses as addresses,
    podman::{self, Podman},
    require, require_root,
};
use serde_json::{Value, json};
use tempfile::TempDir;

const PODS: usize = 20;
const IMAGE: &str = "localhost/dipam-busybox:adopt";

/// The chain a node has before dipam: conflist/ptp-dipam-host-local.conflist with dipam taken
/// out (its delegate back as ptp's `ipam`), on this test's subnet and host-local store.
fn plain_chain(version: &str, store: &Path, subnet: &Subnet) -> Value {
    let mut list = Fixture::load("ptp-dipam-host-local.conflist")
        .unique_name()
        .with_delegate_state(store)
        .with_subnet(&subnet.cidr)
        .with_version(version)
        .list;
    for p in list["plugins"].as_array_mut().unwrap() {
        if p["ipam"]["type"] == "dipam" {
            let delegate = p["ipam"]["delegate"].clone();
            p["ipam"] = delegate;
        }
    }
    assert!(!list.to_string().contains("dipam\""), "{list:#}");
    list
}

/// The host reaches `ip` (ptp routes each pod's address to its veth).
#[track_caller]
fn assert_reachable(ip: &str) {
    let ping = Command::new(busybox())
        .args(["ping", "-c", "1", "-W", "2", ip])
        .output()
        .unwrap();
    cmd::ok_named(&format!("the host's ping of pod {ip}"), &ping);
}

fn busybox() -> PathBuf {
    ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("busybox (tests/deps.sh installs busybox-static)")
}

/// A reservation written into host-local's directory an hour ago for a container that never
/// existed, whose address no netns holds: what a DEL that never came leaves. Its address.
fn dead_reservation(store: &Path, network: &str, subnet: &Subnet) -> String {
    let ip = format!("{}.250", subnet.cidr.trim_end_matches(".0/24"));
    let file = store.join(network).join(&ip);
    fs::write(&file, "dead-container-never-ran\r\neth0").unwrap();
    let status = Command::new("touch")
        .args(["-d", "1 hour ago"])
        .arg(&file)
        .status()
        .unwrap();
    assert!(status.success());
    ip
}

/// Everything an operator runs on an adopted node, and the proof that no pod lost its
/// address: the ledger holds exactly the running pods (plus `extra`), doctor passes both of
/// its reservation checks, the reconcile (freeing on, every second) frees only the dead
/// reservation, the operator's GC frees nothing, and every pod is still reachable.
#[track_caller]
fn assert_adopted_and_kept(
    dipamd: &Dipamd,
    conflist: &Path,
    store: &Path,
    network: &str,
    pods: &[(String, String)],
    subnet: &Subnet,
) {
    let expected: Vec<(String, String, String)> = {
        let mut v: Vec<_> = pods
            .iter()
            .map(|(id, ip)| (id.clone(), "eth0".to_owned(), ip.clone()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        dipamd.ledger_ips(network),
        expected,
        "the ledger adopted every pod"
    );
    for a in dipamd.ledger() {
        assert_eq!(a["owner"], "pod", "{a}");
        assert_eq!(a["state"], "committed", "{a}");
    }

    // A reservation nothing uses beside them: doctor names it an orphan, and only it.
    let dead = dead_reservation(store, network, subnet);
    let doctor: Value =
        serde_json::from_slice(&ctl_at(&dipamd.socket(), &["doctor", "--json"]).stdout)
            .expect("doctor --json");
    let check = |name: &str| {
        doctor
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == format!("network {network}: {name}"))
            .cloned()
            .unwrap_or_else(|| panic!("no check {name:?} in {doctor:#}"))
    };
    let orphans = check("no orphaned reservations");
    let recorded = check("running pods are recorded");
    assert_eq!(recorded["ok"], true, "{recorded}");
    // The reconcile may have freed it already (it runs every second): then there is none.
    let detail = orphans["detail"].as_str().unwrap();
    if orphans["ok"] == false {
        assert!(
            detail.contains(&dead) && detail.contains("1 orphan(s)"),
            "{orphans}"
        );
    }
    for (_, ip) in pods {
        assert!(
            !detail.contains(&format!("{ip} ")),
            "{ip} called an orphan: {orphans}"
        );
    }

    // The reconcile loop, freeing on, frees the dead one and nothing else.
    let deadline = Instant::now() + Duration::from_secs(30);
    while hostlocal::reservations(store, network)
        .iter()
        .any(|(_, _, ip)| *ip == dead)
    {
        assert!(
            Instant::now() < deadline,
            "the reconcile did not free the dead reservation {dead}:\n{}",
            dipamd.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Two more rounds, to be sure.
    std::thread::sleep(Duration::from_millis(2500));
    let held: Vec<(String, String, String)> = hostlocal::reservations(store, network);
    assert_eq!(held, expected, "host-local still holds every pod's address");

    // The operator's GC, as doctor used to advise it: nothing to free.
    let c = conflist.to_str().unwrap();
    let gc = cmd::json(&ctl_at(
        &dipamd.socket(),
        &["gc", "--conflist", c, "--use-ledger", "--json"],
    ));
    assert_eq!(gc["items"], json!([]), "{gc:#}");
    assert_eq!(dipamd.ledger_ips(network), expected);

    let status = cmd::json(&ctl_at(&dipamd.socket(), &["status", "--json"]));
    assert_eq!(status["divergence"]["orphans"], 0, "{status:#}");
    for (_, ip) in pods {
        assert_reachable(ip);
    }
}

/// A private podman whose CNI backend loads the conflists in `netd`, finding plugins in
/// `bin` (where `install --wrap` puts dipam) and the reference plugins; with the busybox
/// image.
fn podman_on(netd: &Path, bin: &Path) -> Podman {
    let p = Podman::new("adopt-podman-", |_| {
        Some(format!(
            "network_backend = \"cni\"\ncni_plugin_dirs = [\"{bin}\", \"{reference}\"]\n\
             network_config_dir = \"{netd}\"",
            bin = bin.display(),
            reference = bins::REFERENCE_PLUGINS,
            netd = netd.display(),
        ))
    });
    p.import_busybox(IMAGE, &["sh", "ip", "ping", "sleep"]);
    p
}

/// A podman container on `net` that sleeps; its ID and address.
fn podman_pod(p: &Podman, net: &str) -> (String, String) {
    let id = p
        .ok(&[
            "run",
            "-d",
            "--network",
            net,
            "--cap-add",
            "NET_RAW",
            IMAGE,
            "sleep",
            "600",
        ])
        .trim()
        .to_owned();
    let seen = addresses(&p.ok(&["exec", &id, "ip", "-o", "-4", "addr"]));
    assert_eq!(seen.len(), 1, "{seen:?}");
    (id, seen[0].clone())
}

/// podman: the pods run before dipam; `install --wrap --in-place` while dipamd is down prints
/// the exact step, and dipamd, started on the wrapped conflist, adopts them at start.
#[test]
fn a_podman_node_with_20_running_pods_is_adopted_and_no_pod_loses_its_address() {
    require!(podman::containers_unavailable());
    let dir = TempDir::with_prefix("adopt-podman-node-").unwrap();
    let (netd, bin, store) = (
        dir.path().join("net.d"),
        dir.path().join("bin"),
        dir.path().join("store"),
    );
    for d in [&netd, &bin, &store] {
        fs::create_dir_all(d).unwrap();
    }
    let subnet = Subnet::claim("10.77");
    // podman 4.3's libcni parses results up to 0.4.0 (docs/sources.md §10.1).
    let plain = plain_chain("0.4.0", &store, &subnet);
    let net = plain["name"].as_str().unwrap().to_owned();
    let conflist = netd.join(format!("{net}.conflist"));
    fs::write(&conflist, serde_json::to_vec_pretty(&plain).unwrap()).unwrap();
    let mut dipamd = Dipamd::unstarted(&[]);
    let podman = podman_on(&netd, &bin);

    let pods: Vec<(String, String)> = (0..PODS).map(|_| podman_pod(&podman, &net)).collect();
    assert_eq!(hostlocal::reservations(&store, &net).len(), PODS);

    // dipamd is not running yet: the rewrite happens, and the exact step is printed.
    let out = install_wrap(&dipamd.socket(), &conflist, &bin, &["--in-place"]);
    let text = ok(&out);
    assert!(text.contains("wrapped:"), "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let step = format!(
        "`dipamctl adopt --conflist {} --socket {}`",
        conflist.display(),
        dipamd.socket().display()
    );
    assert!(stderr.contains(&step), "{stderr}");

    // dipamd on the wrapped conflist adopts the running pods at start, then reconciles every
    // second with freeing on.
    dipamd.set_flags(&[
        "--conflist",
        conflist.to_str().unwrap(),
        "--reconcile-interval",
        "1",
        "--reconcile-free",
        "--gc-grace",
        "1",
    ]);
    dipamd.start_again();
    assert_adopted_and_kept(&dipamd, &conflist, &store, &net, &pods, &subnet);
    // Between pods, too.
    let ping = podman.run(&[
        "exec",
        &pods[0].0,
        "ping",
        "-c",
        "1",
        "-W",
        "2",
        &pods[PODS - 1].1,
    ]);
    assert!(ping.status.success(), "{ping:?}");

    // A new pod goes through dipam and gets an address no running pod has.
    let (id, ip) = podman_pod(&podman, &net);
    assert!(
        pods.iter().all(|(_, held)| *held != ip),
        "{ip} handed out twice"
    );
    assert!(
        dipamd
            .ledger_pairs(&net)
            .contains(&(id.clone(), ip.clone()))
    );
    assert_reachable(&ip);

    // podman tears each container down with the config cached at its ADD: the pods from
    // before the wrap DEL straight through host-local, around dipamd. The reconcile sees
    // their addresses released and unused, and forgets the adopted records; the new pod's
    // DEL went through dipamd. Nothing is left anywhere, and ADDs were never refused.
    podman.ok(&["rm", "--all", "--force", "--time", "0"]);
    assert_eq!(hostlocal::reservations(&store, &net), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !dipamd.ledger_ips(&net).is_empty() {
        assert!(
            Instant::now() < deadline,
            "adopted records outlived their pods: {:?}\n{}",
            dipamd.ledger_ips(&net),
            dipamd.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        dipamd
            .log()
            .contains("forgot an adopted attachment whose pod was deleted around dipamd"),
        "{}",
        dipamd.log()
    );
    let (id, ip) = podman_pod(&podman, &net);
    assert!(dipamd.ledger_pairs(&net).contains(&(id, ip)));
}

/// containerd: the pods run before dipam; a GC and `adopt --dry-run` on the wrapped copy
/// keep every one; `install --wrap --in-place` with dipamd (and its runtime-aware GC) up
/// adopts them at once.
#[test]
fn a_containerd_node_with_20_running_pods_is_adopted_and_no_pod_loses_its_address() {
    require!(dipam_lifecycle::containerd::unavailable());
    let dir = TempDir::with_prefix("adopt-containerd-node-").unwrap();
    let (bin, store) = (dir.path().join("bin"), dir.path().join("store"));
    for d in [&bin, &store] {
        fs::create_dir_all(d).unwrap();
    }
    let subnet = Subnet::claim("10.77");
    let plain = plain_chain("1.0.0", &store, &subnet);
    let net = plain["name"].as_str().unwrap().to_owned();
    // Field order: containerd goes first on drop, so that its last DELs reach dipamd.
    struct Node {
        cd: Containerd,
        dipamd: Dipamd,
    }
    let cd = Containerd::start();
    let endpoint = format!("unix://{}", cd.socket().display());
    let dipamd = Dipamd::start_with(&[
        "--reconcile-interval",
        "1",
        "--runtime-gc-interval",
        "1",
        "--reconcile-free",
        "--gc-grace",
        "1",
        "--cri-endpoint",
        &endpoint,
    ]);
    let node = Node { cd, dipamd };
    node.cd.set_conflist(&plain);
    let conflist = node.cd.conf_dir().join(format!("10-{net}.conflist"));

    let pods: Vec<(String, String)> = (0..PODS)
        .map(|i| {
            let pod = node.cd.run_pod(&format!("adopt-{i}")).unwrap();
            let ip = node.cd.pod_ip(&pod.id).unwrap();
            (pod.id, ip)
        })
        .collect();
    assert_eq!(hostlocal::reservations(&store, &net).len(), PODS);
    // Past --gc-grace (1 s) for the newest pod: a younger reservation is kept as `grace`
    // before any evidence is looked at, and this test is about the evidence (`alive`). On a
    // quiet machine the last pod was still inside it when the GC below ran.
    std::thread::sleep(Duration::from_millis(1500));

    // Reviewed first: the wrapped copy beside the file, which no runtime loads. dipamd does
    // not record these pods yet, and still neither its GC nor a dry adoption would free one.
    let socket = node.dipamd.socket();
    ok(&install_wrap(&socket, &conflist, &bin, &[]));
    let copy = PathBuf::from(format!("{}.dipam", conflist.display()));
    let c = copy.to_str().unwrap();
    let gc = cmd::json(&ctl_at(
        &socket,
        &["gc", "--conflist", c, "--use-ledger", "--json"],
    ));
    assert_eq!(gc["items"], json!([]), "a GC freed a running pod: {gc:#}");
    let kept = gc["kept"].as_array().unwrap();
    assert_eq!(kept.len(), PODS, "{gc:#}");
    for k in kept {
        assert_eq!(k["keep"], json!(["alive"]), "{k}");
    }
    assert_eq!(hostlocal::reservations(&store, &net).len(), PODS);
    let plan = cmd::json(&ctl_at(
        &socket,
        &["adopt", "--conflist", c, "--dry-run", "--json"],
    ));
    assert_eq!(plan["adopted"].as_array().unwrap().len(), PODS, "{plan:#}");
    assert!(
        node.dipamd.ledger_ips(&net).is_empty(),
        "a dry run records nothing"
    );

    // As the README says: in place, with dipamd up. The running pods are recorded at once.
    let text = ok(&install_wrap(&socket, &conflist, &bin, &["--in-place"]));
    assert!(
        text.contains(&format!(
            "adopted:   {PODS} running attachment(s) of network {net}"
        )),
        "{text}"
    );
    let wrapped: Value = serde_json::from_slice(&fs::read(&conflist).unwrap()).unwrap();
    node.cd.wait_loaded(&wrapped);
    assert_adopted_and_kept(&node.dipamd, &conflist, &store, &net, &pods, &subnet);

    // The runtime-aware GC lists every sandbox; two passes free nothing either.
    for _ in 0..2 {
        let pass = cmd::json(&ctl_at(&socket, &["gc", "--from-runtime", "--json"]));
        assert_eq!(pass["items"], json!([]), "{pass:#}");
    }
    assert_eq!(hostlocal::reservations(&store, &net).len(), PODS);
    for (_, ip) in &pods {
        assert_reachable(ip);
    }

    // A new pod goes through dipam and gets an address no running pod has.
    let pod = node.cd.run_pod("adopt-new").unwrap();
    let ip = node.cd.pod_ip(&pod.id).unwrap();
    assert!(
        pods.iter().all(|(_, held)| *held != ip),
        "{ip} handed out twice"
    );
    assert!(
        node.dipamd
            .ledger_pairs(&net)
            .contains(&(pod.id.clone(), ip.clone()))
    );
    assert_reachable(&ip);

    // Every pod's DEL releases through dipamd.
    for id in pods.iter().map(|(id, _)| id).chain([&pod.id]) {
        node.cd.stop_pod(id).unwrap();
        node.cd.remove_pod(id).unwrap();
    }
    assert_eq!(node.dipamd.ledger_ips(&net), Vec::new());
    assert_eq!(hostlocal::reservations(&store, &net), Vec::new());
}

/// A veth pair whose host end routes `ip`, its peer in a netns of its own: a pod that holds
/// an address its IPAM lost. Deleted on drop.
struct ForeignPod {
    host: String,
    _ns: NetNs,
}

impl ForeignPod {
    fn new(ip: &str) -> Self {
        let ns = NetNs::new();
        let host = format!("vfp{}", std::process::id() % 100_000);
        let run = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().unwrap();
            assert!(out.status.success(), "ip {args:?}: {out:?}");
        };
        run(&[
            "link", "add", &host, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ]);
        run(&["link", "set", &host, "up"]);
        run(&["route", "add", &format!("{ip}/32"), "dev", &host]);
        Self { host, _ns: ns }
    }

    fn route_dev(ip: &str) -> String {
        let out = Command::new("ip")
            .args(["-o", "route", "show", &format!("{ip}/32")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for ForeignPod {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host])
            .output();
    }
}

/// Main mode: host-local hands out an address another live veth still holds (its
/// reservation was lost). The ADD is refused with 165, naming the veth and the fix; the
/// route stays where it was, and nothing of the ADD is left.
#[test]
fn an_add_whose_address_is_routed_to_another_live_veth_is_refused() {
    require_root!();
    let lab = Lab::new("dipam-host-local-1.1.0.conflist").with_version("1.0.0");
    // host-local's first address in a fresh store: the one after the gateway.
    let first = format!("{}.2", lab.subnet.cidr.trim_end_matches(".0/24"));
    let foreign = ForeignPod::new(&first);
    let (_ns, att) = lab.pod();
    let e = lab.rt.add(lab.list(), &att).unwrap_err();
    assert_eq!(e.code, 165, "{e}");
    assert!(
        e.msg.contains(&first) && e.msg.contains(&foreign.host),
        "{e}"
    );
    assert!(
        e.details.contains("dipamctl attachments") && e.details.contains("ip link delete"),
        "{e}"
    );
    assert!(
        ForeignPod::route_dev(&first).contains(&foreign.host),
        "the route was taken over: {}",
        ForeignPod::route_dev(&first)
    );
    // Nothing allocated is lost, and no veth of the attempt is left.
    assert!(lab.ledger().is_empty(), "{:?}", lab.ledger());
    assert!(
        lab.delegate_store().is_empty(),
        "{:?}",
        lab.delegate_store()
    );
    dipam_lifecycle::links::assert_no_host_veths(
        &lab.network(),
        dipam_proto::retired::ALIAS_PREFIX,
    );

    // Once the holder is gone, the next ADD goes through.
    drop(foreign);
    let (_ns2, att2) = lab.pod();
    lab.rt.add(lab.list(), &att2).unwrap();
    lab.assert_agree();
}

/// Main mode: an attachment a GC frees loses its host veth and its host route with its
/// address, as a DEL's would.
#[test]
fn a_main_mode_attachment_freed_by_gc_loses_its_veth_and_route() {
    require_root!();
    // No grace period: the pod freed was added a moment ago.
    let lab = Lab::with_flags("dipam-host-local-1.1.0.conflist", &["--gc-grace", "0"])
        .with_version("1.1.0");
    let (_keep_ns, keep) = lab.pod();
    lab.rt.add(lab.list(), &keep).unwrap();
    let (_ns, gone) = lab.pod();
    let result = lab.rt.add(lab.list(), &gone).unwrap();
    let ip = dipam_lifecycle::runtime::result_ips(&result).remove(0);
    let alias = format!("alias dipam {} {} eth0", lab.network(), gone.container_id);
    let links = || {
        let out = Command::new("ip")
            .args(["-o", "-d", "link", "show"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(links().contains(&alias), "{}", links());
    assert!(
        ForeignPod::route_dev(&ip).contains("dev dp"),
        "{}",
        ForeignPod::route_dev(&ip)
    );

    // The operator's GC with a list that names only the other pod.
    let dir = TempDir::with_prefix("adopt-gc-").unwrap();
    let conflist = dir.path().join("net.conflist");
    fs::write(&conflist, serde_json::to_vec(lab.list()).unwrap()).unwrap();
    let valid = dir.path().join("valid.json");
    fs::write(
        &valid,
        json!([{"containerID": keep.container_id, "ifname": "eth0"}]).to_string(),
    )
    .unwrap();
    let gc = cmd::json(&lab.dipamd.gc_valid(&conflist, &valid, &["--json"]));
    let items = gc["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{gc:#}");
    assert_eq!(items[0]["outcome"], "freed", "{gc:#}");
    assert_eq!(items[0]["containerID"], gone.container_id.as_str());

    // The route went at once (the veth is set down before the release); the veth shortly.
    assert_eq!(
        ForeignPod::route_dev(&ip),
        "",
        "the freed address is still routed"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while links().contains(&format!(" {} eth0", gone.container_id)) {
        assert!(
            Instant::now() < deadline,
            "the freed pod's veth outlived 5 s:\n{}",
            links()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The other pod keeps its own.
    assert!(links().contains(&format!(
        "alias dipam {} {} eth0",
        lab.network(),
        keep.container_id
    )));
    lab.assert_agree();
}

//! The shipped DaemonSet (deploy/kubernetes/dipam.yaml) on a real single-node Kubernetes
//! cluster (src/cluster: etcd, the API server, controller manager, scheduler, kube-proxy,
//! the kubelet and containerd 2, at the versions tests/peers/pins builds), applied as shipped:
//! the one change is the image reference, made by a kustomization's `images:` entry, the
//! override deploy/README.md documents.
//!
//! What it shows, in one cluster (starting one costs about a minute):
//! - the image starts, its probes pass, the DaemonSet pod becomes Ready, and the node with it;
//! - the init container reads the Node's spec.podCIDRs through the `kubernetes` Service with
//!   only the shipped RBAC, and writes them as host-local's ranges; the agent's addresses
//!   come from that range;
//! - 20 pods of a Deployment are Ready, each with its own address in the node's podCIDR,
//!   named (namespace/name) in `dipamctl attachments`; they reach each other and the node;
//! - scaled to 0, the ledger and host-local hold only the agent's addresses;
//! - `dipamctl status` and `doctor` in the DaemonSet pod say healthy; the metrics answer;
//! - `kubectl rollout restart` of the DaemonSet while the Deployment scales up and down: no
//!   sandbox creation fails (the kubelet's events), no pod stays failed, nothing leaks, the
//!   agent keeps its addresses;
//! - a node reboot (kubelet, containerd and every pod SIGKILLed, the pods' network
//!   namespaces and /run gone, a new boot id in the file dipamd is pointed at): every pod
//!   comes back with an address, no sandbox creation fails (the pods' ADDs wait for the new
//!   dipamd), and within 30 s of dipamd's start, with no GC asked for, the
//!   ledger holds exactly the pods' and the agent's (unchanged) addresses and host-local
//!   exactly the ledger's.
//!
//! A second cluster (one at a time: [`one_cluster`]) runs the azure-vnet-ipam overlay
//! (deploy/kubernetes-azure-vnet-ipam) with the real plugin as the delegate, its
//! interfaces.json naming the node's link, and reboots the node: azure's state file on /run
//! goes with the reboot, every pod comes back, no sandbox creation fails, and within 30 s of
//! dipamd's start the ledger holds exactly the pods' and the agent's (unchanged) addresses
//! and azure's state exactly the ledger's.
//!
//! With DIPAM_CLUSTER_LATENCY set it then measures pod start latency (create to Ready, 20
//! pods) for dipam as shipped, the reference ptp + host-local, dipam with dipamd requesting
//! each CPU request DIPAM_CLUSTER_CPU lists (default a whole CPU), the reference again, and
//! dipam with a warm pool (docs/performance.md, run 17; run it with DIPAM_BIN_DIR naming a
//! release build).

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    collections::BTreeSet,
    sync::{Mutex, MutexGuard, PoisonError},
    time::Instant,
};

use dipam_lifecycle::cluster::{
    self, Cluster,
    workload::{
        self, DS, agent_ips, apply_kustomized, apply_text, deployment, dipamctl_in_pod,
        host_local_store, ips_of, latencies_with, ledger, patch_daemonset, percentile,
        pod_start_latencies, ready, rollout_status, wait_daemonset_ready, wait_pods_ready,
    },
};
use dipam_lifecycle::daemon::delegate_pairs_in;
use ipnet::Ipv4Net;
use serde_json::Value;

/// Where the node's boot id is kept for dipamd (node path, the state volume's): a node
/// restart here cannot change the kernel's, so the DaemonSet's dipamd is pointed at this file
/// (its hidden `--boot-id-file`) and the test writes a new one for each "boot".
const BOOT_ID: &str = "/var/lib/dipam/boot-id";

/// One cluster at a time in this process: two would share the node's host paths, its
/// cgroup root's name (the process id) and the API server's ports on the machine's loopback.
static CLUSTER: Mutex<()> = Mutex::new(());

fn one_cluster() -> MutexGuard<'static, ()> {
    CLUSTER.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Writes a new boot id for the node's next dipamd start.
fn next_boot(c: &Cluster) {
    std::fs::write(
        c.node.path(BOOT_ID),
        format!("{}\n", dipam_lifecycle::unique("boot")),
    )
    .unwrap();
}

/// Applies deploy/kubernetes as shipped, with dipamd pointed at the node's boot id file
/// ([`BOOT_ID`]).
fn apply_shipped(c: &Cluster) {
    next_boot(c);
    workload::apply_shipped(c, &["--boot-id-file", BOOT_ID]);
}

#[test]
fn the_shipped_daemonset_on_a_real_node() {
    dipam_lifecycle::require_root!();
    let Some(peers) = dipam_lifecycle::peers::all(module_path!(), cluster::PEERS) else {
        return;
    };
    dipam_lifecycle::require!(cluster::etcd_missing());
    let _one = one_cluster();
    let start = Instant::now();
    let c = Cluster::start(peers);
    let node = c.node_object().unwrap();
    let pod_cidr: Ipv4Net = node["spec"]["podCIDR"].as_str().unwrap().parse().unwrap();
    assert!(!ready(&node), "NotReady before any CNI config: {node}");

    apply_shipped(&c);
    let ds_pod = wait_daemonset_ready(&c, 300);
    eprintln!("DaemonSet Ready after {:?}", start.elapsed());
    c.wait_for("the node to be Ready", 120, |c| {
        c.node_object().filter(ready)
    });

    // The init container read the node's podCIDR through the kubernetes Service, with the
    // shipped RBAC, and wrote it as host-local's ranges.
    let env = &ds_pod["spec"]["initContainers"][0];
    assert!(
        env["env"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["name"] != "KUBERNETES_SERVICE_HOST")
    );
    let log = c.kubectl_ok(&["-n", "kube-system", "logs", DS, "-c", "install"]);
    assert!(
        log.contains(&pod_cidr.to_string()),
        "install's log names the range: {log}"
    );
    let conflist: Value = serde_json::from_slice(
        &std::fs::read(c.node.path("/etc/cni/net.d/10-dipam.conflist")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        conflist["plugins"][0]["ipam"]["ranges"],
        serde_json::json!([[{"subnet": pod_cidr.to_string()}]]),
        "{conflist}"
    );
    let agent = agent_ips(&c);
    assert_eq!(agent.len(), 2, "router and health: {:?}", ledger(&c));
    for ip in &agent {
        assert!(
            pod_cidr.contains(&ip.parse::<std::net::Ipv4Addr>().unwrap()),
            "{ip} in {pod_cidr}"
        );
    }

    // 20 pods.
    apply_text(&c, "web", &deployment("web", 20));
    let pods = wait_pods_ready(&c, "web", 20, 300);
    let mut seen = BTreeSet::new();
    for (name, ip) in &pods {
        let addr: std::net::Ipv4Addr = ip.parse().unwrap_or_else(|_| panic!("{name}: {ip:?}"));
        assert!(pod_cidr.contains(&addr), "{name}: {ip} in {pod_cidr}");
        assert!(!agent.contains(ip), "{name}: {ip} is the agent's");
        assert!(seen.insert(ip.clone()), "{ip} twice: {pods:?}");
    }
    let table = String::from_utf8(dipamctl_in_pod(&c, &["attachments"]).stdout).unwrap();
    for (name, ip) in &pods {
        let line = table
            .lines()
            .find(|l| l.contains(&format!("default/{name}")))
            .unwrap_or_else(|| panic!("{name} not in dipamctl attachments:\n{table}"));
        assert!(line.contains(ip.as_str()), "{line}");
    }
    // They reach each other and the node.
    let targets: Vec<&str> = pods
        .iter()
        .map(|(_, ip)| ip.as_str())
        .chain([cluster::NODE_IP])
        .collect();
    let script = format!(
        "for ip in {}; do ping -c 1 -W 2 $ip >/dev/null || {{ echo unreachable $ip; exit 1; }}; done",
        targets.join(" ")
    );
    let from = format!("pod/{}", pods[0].0);
    c.kubectl_ok(&["exec", &from, "--", "sh", "-c", &script]);

    // Scaled to 0: only the agent's addresses are held, in the ledger and in host-local.
    c.kubectl_ok(&["scale", "deployment/web", "--replicas=0"]);
    c.wait_for("web's pods to go", 180, |c| {
        c.get_json(&["pods", "-l", "app=web"])["items"]
            .as_array()?
            .is_empty()
            .then_some(())
    });
    c.wait_for("the ledger to hold only the agent's addresses", 60, |c| {
        (ledger(c).len() == 2).then_some(())
    });
    assert_eq!(agent_ips(&c), agent);
    assert_eq!(
        host_local_store(&c),
        agent,
        "host-local holds only the agent's"
    );

    // Healthy, as the operator sees it from the pod.
    for args in [&["status", "--ready"][..], &["doctor"][..]] {
        let out = dipamctl_in_pod(&c, args);
        assert!(
            out.status.success(),
            "dipamctl {args:?} in the pod: {out:?}"
        );
    }
    // The metrics endpoint, on the node's loopback (the pod runs in the host's network).
    let out = c
        .node
        .command(false, std::path::Path::new("/bin/busybox"))
        .args(["wget", "-q", "-O", "-", "http://127.0.0.1:9475/metrics"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("dipam_"),
        "metrics: {out:?}"
    );

    rollout_restart_under_churn(&c, &agent, pod_cidr);
    eprintln!("rollout case done after {:?}", start.elapsed());
    let mut c = c;
    node_restart(&mut c, &agent, pod_cidr);
    eprintln!("node restart case done after {:?}", start.elapsed());
    // The latency figures of docs/performance.md, only when asked: they mean something only
    // with the release binaries users deploy (DIPAM_BIN_DIR), not the debug build the suite
    // runs.
    if std::env::var_os("DIPAM_CLUSTER_LATENCY").is_some() {
        c.kubectl_ok(&["delete", "deployment", "web", "--wait=true"]);
        measure(&c, pod_cidr);
        eprintln!("measured after {:?}", start.elapsed());
    }
}

/// The node's path of azure-vnet-ipam's state (its `/var/run/azure-vnet-ipam.json`, the
/// node's /run through the overlay's `azure-run` mount).
const AZURE_STATE: &str = "/run/azure-vnet-ipam.json";
/// The pods of the azure case.
const AZURE_PODS: usize = 8;

/// The azure-vnet-ipam overlay on a real node, through a reboot (issue: "the real node reboot
/// with azure-vnet-ipam as the delegate and its state file wiped: 0 failed pod starts"): the
/// overlay applied as deploy/kubernetes-azure-vnet-ipam says (its subnet set, the plugin in
/// the node's /opt/cni/bin, interfaces.json naming the node's link), pods Running with
/// addresses of the plugin's pool, then a power loss with a new boot id. The plugin's state
/// file lived on the node's /run and is gone; dipamd forgets the earlier boot's pods before it
/// serves (docs/cfp.md §7.4). Every pod comes back, no sandbox creation fails after the
/// reboot, and within 30 s of dipamd's start the ledger holds exactly the running pods' and
/// the agent's addresses (the agent's unchanged), and azure's state exactly the ledger's.
#[test]
fn azure_vnet_ipam_as_the_delegate_through_a_node_reboot() {
    dipam_lifecycle::require_root!();
    let mut names = cluster::PEERS.to_vec();
    names.push("azure-vnet-ipam");
    let Some(peers) = dipam_lifecycle::peers::all(module_path!(), &names) else {
        return;
    };
    dipam_lifecycle::require!(cluster::etcd_missing());
    let _one = one_cluster();
    let start = Instant::now();
    let mut c = Cluster::start(peers);
    let node = c.node_object().unwrap();
    let pod_cidr: Ipv4Net = node["spec"]["podCIDR"].as_str().unwrap().parse().unwrap();
    c.install_cni_plugin("azure-vnet-ipam");
    let pool = azure_source(&c, pod_cidr);
    next_boot(&c);
    let subnet = format!("\"subnet\": \"{pod_cidr}\"");
    apply_kustomized(
        &c,
        "kubernetes-azure-vnet-ipam",
        &[("\"subnet\": \"10.240.0.0/16\"", &subnet)],
        &["--boot-id-file", BOOT_ID],
    );
    wait_daemonset_ready(&c, 300);
    c.wait_for("the node to be Ready", 120, |c| {
        c.node_object().filter(ready)
    });
    eprintln!("azure: DaemonSet Ready after {:?}", start.elapsed());
    let agent = agent_ips(&c);
    assert_eq!(agent.len(), 2, "router and health: {:?}", ledger(&c));
    assert!(
        agent.iter().all(|ip| pool.contains(ip)),
        "{agent:?} of {pool:?}"
    );

    apply_text(&c, "web", &deployment("web", AZURE_PODS as u32));
    let before = azure_agrees(&c, &agent, &pool);
    // The overlay's mounts carry the plugin's files to the node's own: its state and lock
    // (/var/run), its log (/var/log); it read interfaces.json (/etc/kubernetes) or it would
    // have handed out nothing.
    let state = c.node.path(AZURE_STATE);
    assert!(state.is_file(), "azure's state is on the node's /run");
    assert!(
        c.node.path("/run/azure-vnet").is_dir(),
        "azure's lock directory"
    );
    assert!(
        c.node.path("/var/log/azure-vnet-ipam.log").is_file(),
        "azure's log is on the node's /var/log"
    );
    let held_before = dipam_lifecycle::azure::held_in(&state);

    let failed_before = failed_sandboxes(&c);
    let started = reboot(&mut c);
    // Every pod of the earlier boot freed before dipamd served: released through the plugin
    // or forgotten (its state gone), none kept.
    let freed = reboot_counts(&c);
    assert_eq!(
        (freed["released"] + freed["forgotten"], freed["kept"]),
        (AZURE_PODS as u64, 0),
        "{freed:?}"
    );
    let after = azure_agrees(&c, &agent, &pool);
    let agreed = unix_now();
    eprintln!(
        "azure, after the reboot: ledger = azure's state = pods {} s after dipamd started",
        agreed.saturating_sub(started)
    );
    assert!(
        agreed <= started + 30,
        "ledger, azure's state and the pods agreed only {} s after dipamd started",
        agreed - started
    );
    // The state was wiped, not carried over: no pod of the earlier boot is in it (each new
    // sandbox has a new container ID), only the agent's own IDs are, with the same addresses.
    let held = dipam_lifecycle::azure::held_in(&state);
    let pod_ids: BTreeSet<&String> = before.iter().map(|(id, _)| id).collect();
    assert!(
        held.iter().all(|(id, _)| !pod_ids.contains(id)),
        "a pod of the earlier boot is in azure's state: {held:?}"
    );
    let agent_held = |h: &[(String, String)]| -> Vec<(String, String)> {
        h.iter()
            .filter(|(_, ip)| agent.contains(ip))
            .cloned()
            .collect()
    };
    assert_eq!(
        agent_held(&held),
        agent_held(&held_before),
        "the agent's entries"
    );
    assert_eq!(after.len(), AZURE_PODS, "{after:?}");
    assert_none_failed_since(&c, &failed_before, "after the reboot");
    eprintln!("azure case done after {:?}", start.elapsed());
}

/// Writes the node's /etc/kubernetes/interfaces.json, azure-vnet-ipam's file-backed source:
/// the node's link (node0, whose MAC the plugin matches) with `cidr` and 40 addresses of it to
/// hand out. Those addresses.
fn azure_source(c: &Cluster, cidr: Ipv4Net) -> BTreeSet<String> {
    let out = c
        .node
        .command(false, std::path::Path::new("ip"))
        .args(["-j", "link", "show", "node0"])
        .output()
        .unwrap();
    let links: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mac = links[0]["address"].as_str().unwrap();
    let (interfaces, pool) = dipam_lifecycle::azure::interfaces_json(mac, &cidr.to_string(), 40);
    std::fs::write(
        c.node.path("/etc/kubernetes/interfaces.json"),
        serde_json::to_vec_pretty(&interfaces).unwrap(),
    )
    .unwrap();
    pool.iter().map(ToString::to_string).collect()
}

/// Waits (up to 60 s past the pods' Ready) until the ledger holds exactly the web pods'
/// addresses (each of the plugin's pool, none shared) and the agent's, and azure's state
/// exactly the ledger's, by container ID; the pods' (container ID, address).
fn azure_agrees(
    c: &Cluster,
    agent: &BTreeSet<String>,
    pool: &BTreeSet<String>,
) -> Vec<(String, String)> {
    let pods = wait_pods_ready(c, "web", AZURE_PODS, 300);
    let ips: BTreeSet<&String> = pods.iter().map(|(_, ip)| ip).collect();
    assert_eq!(ips.len(), AZURE_PODS, "no address shared: {pods:?}");
    for (name, ip) in &pods {
        assert!(pool.contains(ip), "{name}: {ip} is not of azure's pool");
    }
    let state = c.node.path(AZURE_STATE);
    c.wait_for(
        "the ledger to hold exactly the pods and the agent, and azure's state the ledger's",
        60,
        |c| {
            let mut want = pods.clone();
            want.sort();
            let recorded = delegate_pairs_in(&ledger(c), "dipam");
            let held = dipam_lifecycle::azure::held_in(&state);
            (pod_addresses(c) == want && agent_ips(c) == *agent && held == recorded).then(|| {
                recorded
                    .into_iter()
                    .filter(|(_, ip)| !agent.contains(ip))
                    .collect()
            })
        },
    )
}

/// Pod start latency over a 20-pod Deployment, p50 and p90: dipam as shipped (main mode),
/// the reference ptp + host-local conflist, and dipam with a warm pool of 20.
fn measure(c: &Cluster, cidr: Ipv4Net) {
    let report = |label: &str, l: &[std::time::Duration]| {
        eprintln!(
            "LATENCY {label}: p50 {:?} p90 {:?} (n={}, min {:?}, max {:?})",
            percentile(l, 50),
            percentile(l, 90),
            l.len(),
            l[0],
            l[l.len() - 1]
        );
    };
    let main = pod_start_latencies(c, "lat-main", 20);
    report("dipam main mode", &main);

    // The reference: ptp + host-local, in the top of the node's range (dipam's pods are
    // gone; its agent holds the bottom), as the lexically first conflist containerd loads.
    let hosts: Vec<std::net::Ipv4Addr> = cidr.hosts().collect();
    let ptp = serde_json::json!({
        "cniVersion": "1.0.0", "name": "ptp-ref",
        "plugins": [{"type": "ptp", "mtu": 1500, "ipam": {"type": "host-local",
            "ranges": [[{"subnet": cidr.to_string(), "rangeStart": hosts[192].to_string(),
                         "rangeEnd": hosts[hosts.len() - 1].to_string()}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": true}}]
    });
    let conf = c.node.path("/etc/cni/net.d/05-ptp-ref.conflist");
    report(
        "ptp + host-local",
        &latencies_with(c, &conf, &ptp, "lat-ptp"),
    );

    // dipamd's CPU request: every pod's ADD waits on dipamd, which runs (with the host-local
    // it execs) in the DaemonSet pod's cgroup, whose share of a busy node comes from its
    // request. DIPAM_CLUSTER_CPU lists the requests to measure after the shipped one (default
    // a whole CPU), each patched in by a rollout; the reference runs again after them, so a
    // change in the machine's load between the first and last shows.
    let requests = std::env::var("DIPAM_CLUSTER_CPU").unwrap_or_else(|_| "1".to_owned());
    for request in requests.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        set_cpu_request(c, request);
        let l = pod_start_latencies(c, &format!("lat-cpu-{}", request.replace('.', "-")), 20);
        report(
            &format!("dipam main mode, dipamd requesting {request} CPU"),
            &l,
        );
    }
    report(
        "ptp + host-local, again",
        &latencies_with(c, &conf, &ptp, "lat-ptp-again"),
    );

    // The warm pool: the DaemonSet's dipamd with --warm-pool 20, filled before the pods.
    let patch = r#"[{"op":"add","path":"/spec/template/spec/containers/0/command/-","value":"--warm-pool"},
                    {"op":"add","path":"/spec/template/spec/containers/0/command/-","value":"20"}]"#;
    patch_daemonset(c, patch);
    c.wait_for("the warm pool to fill", 120, |c| {
        let out = dipamctl_in_pod(c, &["status", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        let pools = v["warmPool"]["pools"].as_array()?.clone();
        pools
            .iter()
            .any(|p| p["ready"].as_u64() >= Some(20))
            .then_some(())
    });
    let pool = pod_start_latencies(c, "lat-pool", 20);
    report("dipam with a warm pool of 20", &pool);
}

/// Patches the DaemonSet's CPU request (a rollout) and waits for its pod to be Ready again.
fn set_cpu_request(c: &Cluster, request: &str) {
    patch_daemonset(
        c,
        &format!(
            r#"[{{"op":"replace","path":"/spec/template/spec/containers/0/resources/requests/cpu","value":"{request}"}}]"#
        ),
    );
}

/// The pods' addresses in the ledger, by pod name (namespace default).
fn pod_addresses(c: &Cluster) -> Vec<(String, String)> {
    let mut out: Vec<_> = ledger(c)
        .iter()
        .filter(|a| a["owner"] == "pod")
        .flat_map(|a| {
            let name = a["pod"]["name"].as_str().unwrap_or_default().to_owned();
            ips_of(a).into_iter().map(move |ip| (name.clone(), ip))
        })
        .collect();
    out.sort();
    out
}

/// Every pod of `app` Ready with the address the ledger records for it, the ledger holding
/// exactly those and the agent's, and host-local exactly what the ledger holds.
#[track_caller]
fn assert_no_leak(c: &Cluster, app: &str, n: usize, agent: &BTreeSet<String>, cidr: Ipv4Net) {
    let pods = wait_pods_ready(c, app, n, 300);
    c.wait_for(
        "the ledger to hold exactly the pods and the agent",
        120,
        |c| {
            let recorded = pod_addresses(c);
            let mut want: Vec<_> = pods.clone();
            want.sort();
            (recorded == want && agent_ips(c) == *agent).then_some(())
        },
    );
    let mut held: BTreeSet<String> = pods.iter().map(|(_, ip)| ip.clone()).collect();
    for (name, ip) in &pods {
        assert!(
            cidr.contains(&ip.parse::<std::net::Ipv4Addr>().unwrap()),
            "{name}: {ip}"
        );
    }
    assert_eq!(held.len(), n, "no address shared: {pods:?}");
    held.extend(agent.iter().cloned());
    assert_eq!(
        host_local_store(c),
        held,
        "host-local holds exactly the ledger's"
    );
}

/// The kubelet's FailedCreatePodSandBox events (a RunPodSandbox that failed: the CNI ADD,
/// among others), by UID and count: an event that recurs keeps its UID and counts up.
fn failed_sandboxes(c: &Cluster) -> BTreeSet<(String, u64, String)> {
    let ev = c.get_json(&[
        "events",
        "-A",
        "--field-selector",
        "reason=FailedCreatePodSandBox",
    ]);
    ev["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
                e["count"].as_u64().unwrap_or(1),
                format!(
                    "{}: {}",
                    e["involvedObject"]["name"].as_str().unwrap_or_default(),
                    e["message"].as_str().unwrap_or_default()
                ),
            )
        })
        .collect()
}

/// No sandbox creation failed since `before` ([`failed_sandboxes`]) was taken.
#[track_caller]
fn assert_none_failed_since(c: &Cluster, before: &BTreeSet<(String, u64, String)>, when: &str) {
    let failed: Vec<_> = failed_sandboxes(c).difference(before).cloned().collect();
    assert!(
        failed.is_empty(),
        "{} sandbox creations failed {when}: {failed:#?}",
        failed.len()
    );
}

/// `kubectl rollout restart daemonset/dipam` while the Deployment is scaled up and down (docs/cfp.md
/// §8.4): no sandbox creation fails (the kubelet's events), no pod stays failed, nothing
/// leaks, the agent keeps its addresses.
fn rollout_restart_under_churn(c: &Cluster, agent: &BTreeSet<String>, cidr: Ipv4Net) {
    let failed_before = failed_sandboxes(c);
    let before = wait_daemonset_ready(c, 60)["metadata"]["uid"].clone();
    c.kubectl_ok(&["scale", "deployment/web", "--replicas=8"]);
    c.kubectl_ok(&["-n", "kube-system", "rollout", "restart", DS]);
    for n in ["14", "5", "12"] {
        std::thread::sleep(std::time::Duration::from_secs(3));
        c.kubectl_ok(&["scale", "deployment/web", &format!("--replicas={n}")]);
    }
    rollout_status(c);
    let after = wait_daemonset_ready(c, 60);
    assert_ne!(
        after["metadata"]["uid"], before,
        "the DaemonSet's pod was replaced"
    );
    assert_no_leak(c, "web", 12, agent, cidr);
    let pods = c.get_json(&["pods", "-l", "app=web"]);
    for p in pods["items"].as_array().unwrap() {
        assert_eq!(p["status"]["phase"], "Running", "{p}");
    }
    assert_none_failed_since(c, &failed_before, "during the rollout");
}

/// The node restarts as after a power loss, with a new boot id (docs/cfp.md §7.4, "Dead
/// attachments"): every pod comes back with an address, no sandbox creation fails (an ADD
/// before dipamd serves waits for it, within the plugin's deadline), and within 30 s of dipamd's start
/// the ledger holds exactly the running pods' and the agent's addresses (the agent's
/// unchanged), host-local exactly the ledger's, with no GC asked for: the reboot rule freed
/// every pod of the earlier boot before dipamd served.
fn node_restart(c: &mut Cluster, agent: &BTreeSet<String>, cidr: Ipv4Net) {
    let failed_before = failed_sandboxes(c);
    let started = reboot(c);
    let pods = wait_pods_ready(c, "web", 12, 300);
    assert!(pods.iter().all(|(_, ip)| !ip.is_empty()), "{pods:?}");
    assert_no_leak(c, "web", 12, agent, cidr);
    let agreed = unix_now();
    assert!(
        agreed <= started + 30,
        "ledger, host-local and the pods agreed only {} s after dipamd started",
        agreed - started
    );
    eprintln!(
        "after the reboot: ledger = host-local = pods {} s after dipamd started",
        agreed.saturating_sub(started)
    );
    assert_none_failed_since(c, &failed_before, "after the reboot");
}

/// Reboots the node with a new boot id, waits until every pod runs new containers and
/// dipamd is Ready, and checks that dipamd saw the reboot; dipamd's start, in seconds since
/// the epoch (the second after its stamp: the API's stamps have whole seconds).
fn reboot(c: &mut Cluster) -> u64 {
    let before: BTreeSet<String> = containers(c, "-A").into_iter().collect();
    // Read by the next dipamd only (once, at its start).
    next_boot(c);
    c.reboot_node();
    // The API still shows the pods Ready from before until the kubelet reports again: wait
    // for every pod's containers to be new ones.
    c.wait_for(
        "every pod to run new containers after the restart",
        300,
        |c| {
            let now = containers(c, "-A");
            (now.len() == before.len() && now.iter().all(|id| !before.contains(id))).then_some(())
        },
    );
    let ds = wait_daemonset_ready(c, 300);
    let started = ds["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == "dipamd")
        .and_then(|s| s["state"]["running"]["startedAt"].as_str())
        .map(str::to_owned)
        .expect("dipamd's start time");
    let log = c.kubectl_ok(&["-n", "kube-system", "logs", DS, "-c", "dipamd"]);
    assert!(
        log.contains("a reboot: the pod attachments of the earlier boot"),
        "dipamd saw no reboot:\n{log}"
    );
    rfc3339_secs(&started) + 1
}

/// dipamd's counts from its reboot line (JSON log): released, forgotten, kept.
fn reboot_counts(c: &Cluster) -> std::collections::BTreeMap<&'static str, u64> {
    let log = c.kubectl_ok(&["-n", "kube-system", "logs", DS, "-c", "dipamd"]);
    let line: Value = log
        .lines()
        .filter(|l| l.contains("a reboot: the pod attachments of the earlier boot"))
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no reboot line in JSON:\n{log}"));
    let fields = if line["fields"].is_object() {
        &line["fields"]
    } else {
        &line
    };
    ["released", "forgotten", "kept"]
        .into_iter()
        .map(|k| {
            let n = fields[k]
                .as_u64()
                .unwrap_or_else(|| panic!("no {k} in {line}"));
            (k, n)
        })
        .collect()
}

/// Seconds since the epoch now.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An RFC 3339 UTC stamp as the API writes them (`2026-11-29T01:02:03Z`), in seconds since the
/// epoch.
fn rfc3339_secs(stamp: &str) -> u64 {
    let out = std::process::Command::new("date")
        .args(["-u", "-d", stamp, "+%s"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// The running containers' IDs of every pod (kube-system's and the Deployment's), Ready ones
/// only: a container that is not Ready (yet) is left out.
fn containers(c: &Cluster, scope: &str) -> Vec<String> {
    let pods = c.get_json(&["pods", scope]);
    let mut out = Vec::new();
    for p in pods["items"].as_array().unwrap() {
        for s in p["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if s["ready"] == true
                && let Some(id) = s["containerID"].as_str()
            {
                out.push(id.to_owned());
            }
        }
    }
    out
}

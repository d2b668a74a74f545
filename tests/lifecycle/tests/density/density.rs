//! A dense node: the shipped DaemonSet on a real single-node cluster (src/cluster, the peers
//! tests/runtimes/kubernetes.rs runs) whose kubelet takes more pods than the upstream default, with a
//! pod range sized for them. A Deployment of N pods (DIPAM_DENSITY_PODS, 110 unless set; 250
//! for the figures of docs/performance.md) is created at once and becomes Ready, then a burst
//! of 110 more; no sandbox may fail on the way, every pod gets its own address in the node's
//! range, and once they are gone the ledger and host-local hold only the agent's addresses.
//!
//! Each burst's create-to-Ready p50/p90/p99, containerd's RunPodSandbox p50/p99 (from its
//! log) and the failed sandboxes are printed (`DENSITY ...` lines). With DIPAM_CLUSTER_LATENCY
//! set, the same two bursts also run through the reference, ptp + host-local v1.10.0 (the
//! lexically first conflist), and through dipam with the warm pool's watermarks that
//! docs/configuration.md recommends for the node's size, then the reference once more, so a
//! change in the machine's load shows. Figures mean something only with the release
//! binaries users deploy: DIPAM_BIN_DIR naming a release build.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use dipam_lifecycle::cluster::{
    self, Cluster, Sizing,
    workload::{
        Burst, agent_ips, apply_shipped, burst_with, host_local_store, ledger, patch_daemonset,
        percentile, ready, start_burst, wait_daemonset_ready,
    },
};
use ipnet::Ipv4Net;

/// The burst the upstream default node (110 pods) must absorb at once.
const BURST: u32 = 110;

#[test]
fn a_dense_node_starts_every_pod() {
    dipam_lifecycle::require_root!();
    let Some(peers) = dipam_lifecycle::peers::all(module_path!(), cluster::PEERS) else {
        return;
    };
    dipam_lifecycle::require!(cluster::etcd_missing());
    let pods: u32 = dipam_lifecycle::env_or("DIPAM_DENSITY_PODS", 110);
    // The DaemonSet's own pod counts against maxPods too; the range must hold the pods, the
    // agent's two addresses, and the reference's pods in its top half (a /24 up to 110 pods,
    // a /23 up to 250).
    let sizing = Sizing {
        max_pods: pods + 10,
        node_mask: if pods <= 120 { 24 } else { 23 },
    };
    let c = Cluster::start_sized(peers, sizing);
    let node = c.node_object().unwrap();
    let cidr: Ipv4Net = node["spec"]["podCIDR"].as_str().unwrap().parse().unwrap();
    assert_eq!(cidr.prefix_len(), sizing.node_mask, "{node}");
    apply_shipped(&c, &[]);
    wait_daemonset_ready(&c, 300);
    c.wait_for("the node to be Ready", 120, |c| {
        c.node_object().filter(ready)
    });
    let agent = agent_ips(&c);
    assert_eq!(agent.len(), 2, "router and health: {:?}", ledger(&c));

    let dense = start_burst(&c, "dense", pods, 900);
    report(&format!("dipam as shipped, {pods} pods"), &dense);
    let burst = start_burst(&c, "burst", BURST, 600);
    report(&format!("dipam as shipped, burst of {BURST}"), &burst);
    for (what, b) in [("dense", &dense), ("burst", &burst)] {
        assert_eq!(b.failures, 0, "{what}: a sandbox failed to start");
        // Every pod's ADD went through dipamd (a retried ADD logs twice).
        assert!(
            b.dipamd_add.len() >= b.ready.len(),
            "{what}: dipamd's ADDs in its log: {}",
            b.dipamd_add.len()
        );
    }
    only_the_agent_left(&c, &agent);

    if std::env::var_os("DIPAM_CLUSTER_LATENCY").is_some() {
        compare(&c, cidr, pods, &agent);
    }
}

/// The reference and the warm pool, each over the same two bursts.
fn compare(c: &Cluster, cidr: Ipv4Net, pods: u32, agent: &BTreeSet<String>) {
    // ptp + host-local in the top half of the node's range (dipam's pods are gone; its agent
    // holds the bottom).
    let hosts: Vec<std::net::Ipv4Addr> = cidr.hosts().collect();
    let ptp = serde_json::json!({
        "cniVersion": "1.0.0", "name": "ptp-ref",
        "plugins": [{"type": "ptp", "mtu": 1500, "ipam": {"type": "host-local",
            "ranges": [[{"subnet": cidr.to_string(), "rangeStart": hosts[hosts.len() / 2].to_string(),
                         "rangeEnd": hosts[hosts.len() - 1].to_string()}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": true}}]
    });
    let conf = c.node.path("/etc/cni/net.d/05-ptp-ref.conflist");
    // `run` names the Deployments (a DNS label), `label` the printed lines.
    let reference = |run: &str, label: &str| {
        let dense = burst_with(c, &conf, &ptp, &format!("ref-dense{run}"), pods, 900);
        report(&format!("ptp + host-local{label}, {pods} pods"), &dense);
        let burst = burst_with(c, &conf, &ptp, &format!("ref-burst{run}"), BURST, 600);
        report(
            &format!("ptp + host-local{label}, burst of {BURST}"),
            &burst,
        );
    };
    reference("", "");

    // docs/configuration.md's watermarks for the node's size (110 pods: target 8, 32 above;
    // 250: 16 and 64), through the DaemonSet's DIPAM_POOL_* variables.
    let (target, above) = if pods <= 120 { (8, 32) } else { (16, 64) };
    pool(c, target, above);
    let dense = start_burst(c, "pool-dense", pods, 900);
    report(
        &format!("dipam, pool target {target} max-above {above}, {pods} pods"),
        &dense,
    );
    let burst = start_burst(c, "pool-burst", BURST, 600);
    report(
        &format!("dipam, pool target {target} max-above {above}, burst of {BURST}"),
        &burst,
    );
    pool(c, 0, 0);
    only_the_agent_left(c, agent);
    reference("-again", ", again");

    // dipam as shipped once more, so that each configuration runs twice in turns (dipam, the
    // reference, the pool, the reference, dipam): at this size the node's own load moves a
    // burst by 10-15 %, and one turn each cannot tell a difference from the time it ran at.
    let dense = start_burst(c, "dense-again", pods, 900);
    report(&format!("dipam as shipped, again, {pods} pods"), &dense);
    let burst = start_burst(c, "burst-again", BURST, 600);
    report(
        &format!("dipam as shipped, again, burst of {BURST}"),
        &burst,
    );
    for (what, b) in [("dense-again", &dense), ("burst-again", &burst)] {
        assert_eq!(b.failures, 0, "{what}: a sandbox failed to start");
    }
    only_the_agent_left(c, agent);
}

/// Sets the DaemonSet's pool watermarks (a rollout), waiting for the target to be ready.
fn pool(c: &Cluster, target: u32, above: u32) {
    let env = |i: usize, v: u32| {
        format!(
            r#"{{"op":"replace","path":"/spec/template/spec/containers/0/env/{i}/value","value":"{v}"}}"#
        )
    };
    let names = c.get_json(&["-n", "kube-system", "daemonset", "dipam"]);
    let vars = names["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .clone();
    let at = |name: &str| vars.iter().position(|v| v["name"] == name).unwrap();
    patch_daemonset(
        c,
        &format!(
            "[{},{}]",
            env(at("DIPAM_POOL_TARGET"), target),
            env(at("DIPAM_POOL_MAX_ABOVE"), above)
        ),
    );
    c.wait_for("the pool to reach its target", 120, |c| {
        let pooled = ledger(c).iter().filter(|a| a["owner"] == "pool").count();
        (pooled == target as usize).then_some(())
    });
}

/// The ledger and host-local's store hold the agent's addresses and nothing else.
#[track_caller]
fn only_the_agent_left(c: &Cluster, agent: &BTreeSet<String>) {
    c.wait_for("the ledger to hold only the agent's addresses", 120, |c| {
        (ledger(c).len() == agent.len()).then_some(())
    });
    assert_eq!(agent_ips(c), *agent);
    assert_eq!(
        host_local_store(c),
        *agent,
        "host-local holds only the agent's"
    );
}

fn report(label: &str, b: &Burst) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let p = |l: &[std::time::Duration], q| {
        if l.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.2}", percentile(l, q).as_secs_f64())
        }
    };
    // dipamd's handler is milliseconds where the rest is seconds: three more decimals.
    let p3 = |l: &[std::time::Duration], q| {
        if l.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.5}", percentile(l, q).as_secs_f64())
        }
    };
    eprintln!(
        "DENSITY {label}: create-to-Ready p50 {} p90 {} p99 {} s (n={}); RunPodSandbox p50 {} p99 {} s (n={}); dipamd's ADD handler p50 {} p99 {} s (n={}); failed sandboxes {}; load {}",
        p(&b.ready, 50),
        p(&b.ready, 90),
        p(&b.ready, 99),
        b.ready.len(),
        p(&b.sandbox, 50),
        p(&b.sandbox, 99),
        b.sandbox.len(),
        p3(&b.dipamd_add, 50),
        p3(&b.dipamd_add, 99),
        b.dipamd_add.len(),
        b.failures,
        load.trim()
    );
}

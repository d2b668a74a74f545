//! A real container runtime: Debian's podman 4.3 with its CNI backend (libcni 1.1.2) runs
//! containers on dipam conflists, as the main plugin and as the IPAM of ptp, and the container
//! sees the address dipamd's ledger recorded for it.
//!
//! Everything podman touches is private to the test: containers.conf (CONTAINERS_CONF) with
//! `network_backend = "cni"`, a temp `network_config_dir` holding the one conflist, temp
//! `--root`/`--runroot`/`--tmpdir`, and an image built offline from busybox-static with
//! `podman import` (no registry). podman 4.3's protocol is docs/sources.md §10.1; the quirks of
//! test machines are handled by the harness's private podman (src/podman.rs): runc rather than
//! crun, and `default_ulimits` lowered to the hard limits this process has.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::{
    Lab, bins,
    links::{assert_no_host_veths, ipv4_addresses as addresses},
    podman::{self, Podman},
    require,
};
use serde_json::Value;

const IMAGE: &str = "localhost/dipam-busybox:test";

/// A private podman whose CNI backend loads `conflist` alone, with the busybox image.
fn podman_on(conflist: &Value) -> Podman {
    let p = Podman::new("podman-", |dir| {
        let netd = dir.join("net.d");
        std::fs::create_dir_all(&netd).unwrap();
        let name = conflist["name"].as_str().unwrap();
        std::fs::write(
            netd.join(format!("{name}.conflist")),
            serde_json::to_vec_pretty(conflist).unwrap(),
        )
        .unwrap();
        Some(format!(
            "network_backend = \"cni\"\ncni_plugin_dirs = [\"{bins}\", \"{reference}\"]\n\
             network_config_dir = \"{netd}\"",
            bins = bins::dir().display(),
            reference = bins::REFERENCE_PLUGINS,
            netd = netd.display(),
        ))
    });
    p.import_busybox(IMAGE, &["sh", "ip", "ping", "sleep", "cat"]);
    p
}

/// podman 4.3's libcni parses results as 0.4.0 at most (1.1.0 would fail to parse): its own
/// conflists say 0.4.0, and so does this one.
fn run_on(conflist: &str) {
    let lab = Lab::new(conflist).with_version("0.4.0");
    let podman = podman_on(lab.list());
    let net = lab.network();

    // podman validates every plugin with VERSION when it loads the network (§10.1).
    let nets = podman.ok(&["network", "ls", "--format", "{{.Name}}"]);
    assert!(
        nets.lines().any(|l| l == net),
        "podman did not load {net}: {nets}"
    );

    // A long-running container: its address, as the container sees it, is the ledger's.
    let id = podman
        .ok(&[
            "run",
            "-d",
            "--network",
            &net,
            "--cap-add",
            "NET_RAW",
            IMAGE,
            "sleep",
            "120",
        ])
        .trim()
        .to_owned();
    let ledger = lab.dipamd.ledger_ips(&net);
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    let (cid, ifname, ip) = &ledger[0];
    assert_eq!(cid, &id, "podman's container ID is the attachment's");
    assert_eq!(ifname, "eth0");
    assert!(lab.subnet.contains(ip), "{ip} not in {}", lab.subnet.cidr);
    lab.assert_agree();
    let seen = podman.ok(&["exec", &id, "ip", "-o", "-4", "addr"]);
    assert_eq!(addresses(&seen), vec![ip.clone()], "{seen}");
    let gw = lab.subnet.gateway();
    let ping = podman.run(&["exec", &id, "ping", "-c", "1", "-W", "2", &gw]);
    assert!(
        ping.status.success(),
        "the container cannot reach {gw}: {}{}",
        String::from_utf8_lossy(&ping.stdout),
        String::from_utf8_lossy(&ping.stderr)
    );
    // Removing the container tears its network down: DEL through dipam, address released.
    podman.ok(&["rm", "--force", "--time", "0", &id]);
    assert!(lab.ledger().is_empty(), "{:?}", lab.ledger());
    assert!(lab.delegate_store().is_empty());

    // The plain form: `podman run --rm ... ip addr` sees an address of the network.
    let out = podman.ok(&[
        "run",
        "--rm",
        "--network",
        &net,
        IMAGE,
        "ip",
        "-o",
        "-4",
        "addr",
    ]);
    let seen = addresses(&out);
    assert_eq!(seen.len(), 1, "{out}");
    assert!(lab.subnet.contains(&seen[0]), "{out}");
    assert!(lab.ledger().is_empty(), "--rm released the address");
    lab.assert_agree();
    assert_no_host_veths(&net, dipam_proto::retired::ALIAS_PREFIX);
}

#[test]
fn podman_runs_a_container_on_dipam_as_the_main_plugin() {
    require!(podman::containers_unavailable());
    run_on("dipam-host-local-1.1.0.conflist");
}

#[test]
fn podman_runs_a_container_on_ptp_with_dipam_as_ipam() {
    require!(podman::containers_unavailable());
    run_on("ptp-dipam-host-local.conflist");
}

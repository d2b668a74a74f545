//! Every example network config in README.md, docs/ and conflist/ works as written on the
//! runtimes docs/compatibility.md lists: read from the markdown and the files themselves
//! (src/examples.rs), each is run through a real runtime at its own cniVersion, and a pod
//! gets an address of the example's delegate that the ledger records, and its removal frees
//! it. An example below 1.1.0 runs under podman 4.3 and containerd 1.6 with Debian 12's
//! plugins (1.1.1); a 1.1.0 example (GC and STATUS) runs under containerd 2 with the
//! reference plugins v1.10.0 (and under CRI-O in crio.rs), the runtimes that send them.
//!
//! The test changes only what lets tests run side by side (as conflist/README.md says): the
//! network's name, dipamd's socket, the delegate's state directory, the subnet and a bridge's
//! name. The examples delegating to azure-vnet-ipam run the real plugin, which keeps its
//! files at paths fixed in its source (/etc/kubernetes/interfaces.json, /var/run,
//! /var/log): the one process that execs it, dipamd, runs in a private mount namespace
//! whose /etc, /run and /var/log are overlays over test-private directories (src/azure.rs),
//! and the runtime itself runs as it always does. The runtime's plugin directory holds the
//! real azure-vnet-ipam too, as a node's /opt/cni/bin does; after every step dipamd's ledger
//! and the plugin's own state file agree.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::{
    Containerd, Fixture, Lab,
    containerd::Build,
    examples::{self, Example},
    links::ipv4_addresses,
    peers::Peer,
    podman::{self, Podman},
    require, require_peers,
};

const IMAGE: &str = "localhost/dipam-examples:test";

/// The examples a runtime of this kind is meant to run: `new` for 1.1.0 ones.
fn examples(new: bool) -> Vec<Example> {
    let all = examples::all();
    // The extraction itself can fail: every place that shows examples must yield some.
    for place in ["README.md", "docs/configuration.md", "conflist/"] {
        assert!(
            all.iter().any(|e| e.source.starts_with(place)),
            "no example found in {place}: {:?}",
            all.iter().map(|e| &e.source).collect::<Vec<_>>()
        );
    }
    assert!(
        all.iter().any(|e| e.version() == "1.1.0"),
        "one example is at 1.1.0, for GC and STATUS"
    );
    let azure = all
        .iter()
        .filter(|e| e.delegate() == "azure-vnet-ipam")
        .count();
    assert!(
        azure >= 2,
        "conflist/ ships the azure-vnet-ipam examples (main and IPAM mode)"
    );
    all.into_iter()
        .filter(|e| (e.version() == "1.1.0") == new)
        .collect()
}

/// The real azure-vnet-ipam, for a runtime's plugin directory: the bench's own (its node's
/// link to the peer tests/deps.sh built), so that no stale binary of that name answers.
fn azure_plugin(lab: &Lab) -> Option<std::path::PathBuf> {
    lab.azure
        .as_ref()
        .map(|node| node.dir().join("bin/azure-vnet-ipam"))
}

/// A bench for one example, with its own cniVersion.
fn lab(e: &Example) -> Lab {
    eprintln!("--- {} (cniVersion {})", e.source, e.version());
    Lab::from_fixture(
        Fixture {
            list: e.list.clone(),
        },
        &[],
    )
}

/// The ledger's one address for `id`, which must be in the bench's subnet.
#[track_caller]
fn address_of(lab: &Lab, e: &Example, id: &str) -> String {
    let ledger = lab.ledger();
    assert_eq!(ledger.len(), 1, "{}: {ledger:?}", e.source);
    assert_eq!(ledger[0].0, id, "{}", e.source);
    assert!(
        lab.subnet.contains(&ledger[0].1),
        "{}: {ledger:?}",
        e.source
    );
    lab.assert_agree();
    ledger[0].1.clone()
}

#[track_caller]
fn assert_freed(lab: &Lab, e: &Example) {
    assert!(lab.ledger().is_empty(), "{}: {:?}", e.source, lab.ledger());
    assert!(lab.delegate_store().is_empty(), "{}", e.source);
}

#[test]
fn podman_4_3_runs_every_example_below_1_1_0() {
    require!(podman::containers_unavailable());
    let list = examples(false);
    assert!(!list.is_empty());
    for e in &list {
        let lab = lab(e);
        let net = lab.network();
        let p = Podman::new("podman-examples-", |dir| {
            let netd = dir.join("net.d");
            std::fs::create_dir_all(&netd).unwrap();
            std::fs::write(
                netd.join(format!("{net}.conflist")),
                serde_json::to_vec_pretty(lab.list()).unwrap(),
            )
            .unwrap();
            // The real azure-vnet-ipam's directory first (only its binary is there).
            let mut dirs: Vec<String> = azure_plugin(&lab)
                .iter()
                .map(|p| p.parent().unwrap().display().to_string())
                .collect();
            dirs.push(dipam_lifecycle::bins::dir().display().to_string());
            dirs.push(dipam_lifecycle::bins::REFERENCE_PLUGINS.to_owned());
            Some(format!(
                "network_backend = \"cni\"\ncni_plugin_dirs = {dirs:?}\n\
                 network_config_dir = \"{}\"",
                netd.display(),
            ))
        });
        p.import_busybox(IMAGE, &["sh", "ip", "sleep"]);
        let id = p
            .ok(&["run", "-d", "--network", &net, IMAGE, "sleep", "120"])
            .trim()
            .to_owned();
        let ip = address_of(&lab, e, &id);
        let seen = p.ok(&["exec", &id, "ip", "-o", "-4", "addr"]);
        assert_eq!(ipv4_addresses(&seen), vec![ip], "{}: {seen}", e.source);
        p.ok(&["rm", "--force", "--time", "0", &id]);
        assert_freed(&lab, e);
    }
}

/// Runs a pod on each example under `cd`: CRI's pod IP is the ledger's; stop and remove free it.
fn pods_on(cd: &Containerd, list: &[Example]) {
    assert!(!list.is_empty());
    for e in list {
        let lab = lab(e);
        if let Some(real) = azure_plugin(&lab) {
            cd.use_plugin("azure-vnet-ipam", &real);
        }
        cd.set_conflist(lab.list());
        let pod = cd
            .run_pod("example")
            .unwrap_or_else(|err| panic!("{}: {err:?}\n{}", e.source, lab.dipamd.log()));
        let ip = address_of(&lab, e, &pod.id);
        assert_eq!(cd.pod_ip(&pod.id), Some(ip), "{}", e.source);
        cd.stop_pod(&pod.id).unwrap();
        cd.remove_pod(&pod.id).unwrap();
        assert_freed(&lab, e);
    }
}

#[test]
fn containerd_1_6_runs_every_example_below_1_1_0() {
    require!(dipam_lifecycle::containerd::unavailable());
    let cd = Containerd::start();
    pods_on(&cd, &examples(false));
}

#[test]
fn containerd_2_runs_every_1_1_0_example() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers: Vec<Peer> = require_peers!(
        "containerd",
        "ctr",
        "containerd-shim-runc-v2",
        "ptp",
        "bridge",
        "portmap"
    );
    let cd = Containerd::start_build(Build::from_peers(&peers));
    let list = examples(true);
    // The chained plugins at v1.10.0, which take 1.1.0 (Debian's 1.1.1 stop at 1.0.0).
    for e in &list {
        for t in e.plugin_types() {
            if let Some(p) = peers.iter().find(|p| p.name == t) {
                cd.use_plugin(&t, &p.path);
            }
        }
    }
    pods_on(&cd, &list);
}

/// The azure-vnet-ipam examples (at 1.0.0, which containerd 2 takes too) under containerd 2
/// with today's reference plugins, the runtime and plugins of a current node: besides
/// containerd 1.6 above, which runs them with Debian's.
#[test]
fn containerd_2_runs_the_azure_examples() {
    require!(dipam_lifecycle::containerd::unavailable());
    let peers: Vec<Peer> = require_peers!("containerd", "ctr", "containerd-shim-runc-v2", "ptp");
    let cd = Containerd::start_build(Build::from_peers(&peers));
    let ptp = peers.iter().find(|p| p.name == "ptp").unwrap();
    cd.use_plugin("ptp", &ptp.path);
    let list: Vec<Example> = examples(false)
        .into_iter()
        .filter(|e| e.delegate() == "azure-vnet-ipam")
        .collect();
    assert_eq!(
        list.iter()
            .map(|e| e.list["plugins"][0]["type"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["dipam", "ptp"],
        "main mode and IPAM mode: {:?}",
        list.iter().map(|e| &e.source).collect::<Vec<_>>()
    );
    pods_on(&cd, &list);
}

//! A real container runtime through the API kubelet uses: Debian's containerd 1.6 runs pod
//! sandboxes on dipam conflists, driven through CRI (src/containerd.rs), in main mode and as
//! the IPAM of ptp. After each step dipamd's ledger and host-local's store agree, and the pod
//! sees the address the ledger holds. containerd's protocol is docs/sources.md §10.2.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::{Containerd, Lab, require_containerd};

/// One dipamd + host-local store (the Lab) and one private containerd using its conflist.
/// Fields drop in order: containerd first, so that its last DELs still reach dipamd.
struct Bench {
    cd: Containerd,
    lab: Lab,
}

impl Bench {
    fn new(conflist: &str, version: &str) -> Self {
        let lab = Lab::new(conflist).with_version(version);
        let cd = Containerd::start();
        cd.set_conflist(lab.list());
        Self { cd, lab }
    }

    fn net(&self) -> String {
        self.lab.network()
    }
}

/// The IPv4 addresses `ip -o -4 addr` printed, without prefix, loopback left out.
fn addresses(ip_addr_output: &str) -> Vec<String> {
    ip_addr_output
        .lines()
        .filter(|l| l.contains("inet ") && !l.contains(" lo"))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next().map(str::to_owned)
        })
        .collect()
}

/// Run, exec, stop, remove: the ledger, host-local and the pod agree after each step.
fn lifecycle(b: &Bench) {
    let net = b.net();
    let pod = b.cd.run_pod("web").unwrap();
    let ledger = b.lab.dipamd.ledger_ips(&net);
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    let (cid, ifname, ip) = &ledger[0];
    assert_eq!(cid, &pod.id, "CNI_CONTAINERID is the sandbox ID");
    assert_eq!(ifname, "eth0");
    assert!(
        b.lab.subnet.contains(ip),
        "{ip} not in {}",
        b.lab.subnet.cidr
    );
    b.lab.assert_agree();
    assert_eq!(
        b.cd.pod_ip(&pod.id).as_deref(),
        Some(ip.as_str()),
        "CRI's pod IP"
    );

    let c = b.cd.start_sleeper(&pod).unwrap();
    let (code, out, err) = b.cd.exec_sync(&c, &["ip", "-o", "-4", "addr"]).unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(addresses(&out), vec![ip.clone()], "inside the pod: {out}");

    b.cd.stop_pod(&pod.id).unwrap();
    assert!(b.lab.ledger().is_empty(), "{:?}", b.lab.ledger());
    b.lab.assert_agree();
    b.cd.remove_pod(&pod.id).unwrap();
    assert!(b.lab.ledger().is_empty(), "{:?}", b.lab.ledger());
    b.lab.assert_agree();
    assert!(b.cd.list_pods().unwrap().is_empty());
}

#[test]
fn containerd_runs_a_pod_on_dipam_as_the_main_plugin() {
    require_containerd!();
    let b = Bench::new("dipam-host-local.conflist", "1.0.0");
    lifecycle(&b);
}

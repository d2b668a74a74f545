//! What the runtime tests (tests/runtimes/containerd.rs, tests/runtimes/podman.rs) check after a real runtime
//! ran dipam: the addresses a container sees, and that no host veth of the network is left.

use std::{
    process::Command,
    time::{Duration, Instant},
};

/// The IPv4 addresses `ip -o -4 addr` printed, without prefix, loopback left out.
pub fn ipv4_addresses(ip_addr_output: &str) -> Vec<String> {
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

/// No host veth of `network` is left (main mode names its host ends in their alias): none
/// live, and the ones DEL retired are deleted by dipamd moments later. `retired` is the alias
/// prefix of a retired link, `dipam_proto::retired::ALIAS_PREFIX` (the harness links no
/// dipam crate; the tests do).
#[track_caller]
pub fn assert_no_host_veths(network: &str, retired: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = Command::new("ip")
            .args(["-o", "-d", "link", "show"])
            .output()
            .expect("run ip link show");
        let links = String::from_utf8_lossy(&out.stdout).into_owned();
        let live: Vec<&str> = links
            .lines()
            .filter(|l| l.contains(&format!("alias dipam {network} ")))
            .collect();
        assert!(live.is_empty(), "{live:#?}");
        let retired = format!("alias {retired}{network} ");
        if !links.lines().any(|l| l.contains(&retired)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "retired veths of {network} outlived 5 s:\n{links}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The NAT rules portmap made for container `id`, in main mode and under a real runtime alike:
/// the rules that jump to its per-container chain carry the ID in a comment, the chain's own
/// rules the DNAT target.
pub fn nat_rules_for(id: &str) -> Vec<String> {
    let out = Command::new("iptables")
        .args(["-t", "nat", "-S"])
        .output()
        .expect("run iptables (a dependency of containernetworking-plugins)");
    let all = String::from_utf8_lossy(&out.stdout).into_owned();
    let chains: Vec<String> = all
        .lines()
        .filter(|l| l.contains(id))
        .filter_map(|l| l.split(" -j ").nth(1).map(|c| c.trim().to_owned()))
        .collect();
    all.lines()
        .filter(|l| l.contains(id) || chains.iter().any(|c| l.contains(c)))
        .map(str::to_owned)
        .collect()
}

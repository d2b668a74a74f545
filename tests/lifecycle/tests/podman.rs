//! A real container runtime: Debian's podman 4.3 with its CNI backend (libcni 1.1.2) runs
//! containers on dipam conflists, as the main plugin and as the IPAM of ptp, and the container
//! sees the address dipamd's ledger recorded for it.
//!
//! Everything podman touches is private to the test: containers.conf (CONTAINERS_CONF) with
//! `network_backend = "cni"`, a temp `network_config_dir` holding the one conflist, temp
//! `--root`/`--runroot`/`--tmpdir`, and an image built offline from busybox-static with
//! `podman import` (no registry). podman 4.3's protocol is docs/sources.md §10.1; the quirks of
//! test machines are handled here: runc rather than crun, and `default_ulimits` lowered to the hard
//! limits this process has (runc refuses to raise nofile/nproc above them).

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use dipam_lifecycle::{Lab, bins, is_root};
use serde_json::Value;
use tempfile::TempDir;

const IMAGE: &str = "localhost/dipam-busybox:test";

/// Why podman cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    if !is_root() {
        return Some("podman tests need root (rootful podman with CNI networks)".into());
    }
    for tool in ["podman", "runc", "busybox", "timeout"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            return Some(format!(
                "{tool} is not installed (tests/deps.sh installs podman, runc and busybox-static)"
            ));
        }
    }
    None
}

macro_rules! require_podman {
    () => {
        if let Some(why) = unavailable() {
            eprintln!("\n*** SKIPPED {}: {why} ***\n", module_path!());
            return;
        }
    };
}

/// The hard limit of `resource`, capped at `cap`.
fn hard_limit(resource: libc::__rlimit_resource_t, cap: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; the resource is a valid constant.
    let ok = unsafe { libc::getrlimit(resource, &mut lim) } == 0;
    if ok { lim.rlim_max.min(cap) } else { 1024 }
}

/// A private podman: its own config, network dir, storage and image.
struct Podman {
    dir: TempDir,
}

impl Podman {
    fn new(conflist: &Value) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("podman-")
            .tempdir()
            .unwrap();
        let netd = dir.path().join("net.d");
        std::fs::create_dir_all(&netd).unwrap();
        let name = conflist["name"].as_str().unwrap();
        std::fs::write(
            netd.join(format!("{name}.conflist")),
            serde_json::to_vec_pretty(conflist).unwrap(),
        )
        .unwrap();
        let nofile = hard_limit(libc::RLIMIT_NOFILE, 20000);
        let nproc = hard_limit(libc::RLIMIT_NPROC, 4096);
        let conf = format!(
            r#"[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]

[network]
network_backend = "cni"
cni_plugin_dirs = ["{bins}", "{reference}"]
network_config_dir = "{netd}"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "none"
"#,
            bins = bins::dir().display(),
            reference = bins::REFERENCE_PLUGINS,
            netd = netd.display(),
        );
        std::fs::write(dir.path().join("containers.conf"), conf).unwrap();
        let p = Self { dir };
        p.import_image();
        p
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    /// `podman <args>` against this private setup, bounded by a timeout.
    fn run(&self, args: &[&str]) -> Output {
        Command::new("timeout")
            .arg("180")
            .arg("podman")
            .arg("--root")
            .arg(self.path("root"))
            .arg("--runroot")
            .arg(self.path("runroot"))
            .arg("--tmpdir")
            .arg(self.path("tmp"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .env("CONTAINERS_CONF", self.path("containers.conf"))
            .output()
            .expect("run podman")
    }

    #[track_caller]
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "podman {args:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A one-binary image: busybox-static and the applets the tests use.
    fn import_image(&self) {
        let rootfs = self.path("rootfs");
        for d in ["bin", "etc", "proc", "sys", "dev", "tmp"] {
            std::fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        std::fs::copy(busybox(), rootfs.join("bin/busybox")).unwrap();
        for applet in ["sh", "ip", "ping", "sleep", "cat"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
        }
        let tar = self.path("rootfs.tar");
        let status = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .unwrap();
        assert!(status.success());
        self.ok(&["import", tar.to_str().unwrap(), IMAGE]);
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force", "--time", "0"]);
    }
}

fn busybox() -> PathBuf {
    ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("busybox")
}

/// The IPv4 addresses `ip -o -4 addr` printed, without prefix.
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

/// podman 4.3's libcni parses results as 0.4.0 at most (1.1.0 would fail to parse): its own
/// conflists say 0.4.0, and so does this one.
fn run_on(conflist: &str) {
    let lab = Lab::new(conflist).with_version("0.4.0");
    let podman = Podman::new(lab.list());
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
    assert_no_host_veths(&net);
}

/// No host veth of this network is left (main mode names its host ends in their alias): none
/// live, and the ones DEL retired are deleted by dipamd moments later.
fn assert_no_host_veths(network: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let out = Command::new("ip")
            .args(["-o", "-d", "link", "show"])
            .output()
            .unwrap();
        let links = String::from_utf8_lossy(&out.stdout).into_owned();
        let live: Vec<&str> = links
            .lines()
            .filter(|l| l.contains(&format!("alias dipam {network} ")))
            .collect();
        assert!(live.is_empty(), "{live:#?}");
        let retired = format!("alias {}{network} ", dipam_proto::retired::ALIAS_PREFIX);
        if !links.lines().any(|l| l.contains(&retired)) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "retired veths of {network} outlived 5 s:\n{links}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn podman_runs_a_container_on_dipam_as_the_main_plugin() {
    require_podman!();
    run_on("dipam-host-local.conflist");
}

#[test]
fn podman_runs_a_container_on_ptp_with_dipam_as_ipam() {
    require_podman!();
    run_on("ptp-dipam-host-local.conflist");
}

//! A private CRI-O (built from its Go module by tests/deps.sh, with Debian's conmon and runc),
//! driven through CRI as kubelet drives it. CRI-O is the runtime that sends a real CNI GC: at
//! start, once its CNI plugin answers STATUS, it sends GC on every network of its network
//! directory with the sandboxes it restored as the valid list (`null` for a network with
//! none), and it holds RunPodSandbox until STATUS succeeds (cri-o `server/server.go`,
//! `internal/config/cnimgr`; docs/sources.md §10.4).
//!
//! Everything it can move is under a temp directory: its `root` and `runroot`
//! (containers/storage), the CRI socket, `network_dir` and `plugin_dirs`, conmon's and runc's
//! state, the pinned namespaces (`namespaces_dir`: a pod's CNI_NETNS is
//! `<dir>/ns/netns/<uuid>`), its version and shutdown files, and its config drop-in directory
//! (empty, so that nothing of the host's /etc/crio applies). What it cannot move: libcni's
//! result cache (/var/lib/cni, as for containerd) and the pods' cgroups (cgroupfs).
//!
//! There is no registry: the same busybox docker-archive as containerd's
//! (`containerd::image_tar`) is loaded into CRI-O's storage with Debian's podman
//! (`podman --root --runroot load`), which shares the containers/storage format.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use k8s_cri::v1::PodSandboxConfig;
use serde_json::Value;
use tempfile::TempDir;
use tonic::Status;

use crate::{containerd::IMAGE, cri::Cri, peers::Peer};

/// Why CRI-O cannot run here (besides the peers themselves): the only reasons to skip
/// (`require!`).
pub fn unavailable() -> Option<String> {
    if !crate::is_root() {
        return Some("CRI-O tests need root".into());
    }
    for (tool, path) in [
        ("conmon", "/usr/bin/conmon"),
        ("runc", "/usr/sbin/runc"),
        ("podman", "/usr/bin/podman"),
    ] {
        if !Path::new(path).is_file() {
            return Some(format!(
                "{tool} is not installed at {path} (tests/deps.sh installs conmon, runc and podman)"
            ));
        }
    }
    None
}

/// A private CRI-O and a CRI client to it. Stops and removes every pod through CRI on drop
/// (so that their DELs reach dipam), then kills CRI-O and cleans up: keep the dipamd it calls
/// alive until then (declare this guard after the dipamd's).
pub struct Crio {
    dir: TempDir,
    crio: PathBuf,
    child: Option<Child>,
    cri: Cri,
}

impl Crio {
    /// Prepares CRI-O's directories, config and image; `crio` and `pinns` are the built
    /// peers. Not started: write the conflist first, then [`Self::start`].
    pub fn new(crio: &Peer, pinns: &Peer) -> Self {
        let dir = crate::temp_dir("crio-");
        let d = dir.path();
        for sub in [
            "root", "runroot", "net.d", "bin", "logs", "conf.d", "ns", "exits", "attach", "runc",
            "pods",
        ] {
            std::fs::create_dir_all(d.join(sub)).expect("CRI-O's directories");
        }
        crate::containerd::link_plugins(&d.join("bin"));
        let runc = runc_for_this_host(d);
        std::fs::write(d.join("crio.conf"), config(d, &pinns.path, &runc)).expect("crio.conf");
        std::fs::write(
            d.join("policy.json"),
            r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
        )
        .expect("policy.json");
        load_image(d);
        let cri = Cri::unix(d.join("crio.sock"), "CRI-O");
        Self {
            dir,
            crio: crio.path.clone(),
            child: None,
            cri,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The running crio's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// CRI-O's `network_dir`.
    pub fn conf_dir(&self) -> PathBuf {
        self.dir().join("net.d")
    }

    /// Writes `list` as a conflist of the network directory (CRI-O's default network is the
    /// first in lexical order); `prefix` orders it.
    pub fn write_conflist(&self, prefix: &str, list: &Value) {
        let name = list["name"].as_str().unwrap_or("net");
        let path = self.conf_dir().join(format!("{prefix}-{name}.conflist"));
        let tmp = self.dir().join("conflist.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(list).expect("JSON")).expect("write");
        std::fs::rename(&tmp, &path).expect("rename the conflist into place");
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir().join("crio.log")).unwrap_or_default()
    }

    /// Starts CRI-O and waits until its CRI socket answers (RuntimeReady; NetworkReady is
    /// whatever the plugin's STATUS says).
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "CRI-O is running");
        let d = self.dir.path();
        let log = crate::cmd::append_log(&d.join("crio.log"));
        self.child = Some(crate::cmd::spawn_daemon(
            Command::new(&self.crio)
                .arg("--config")
                .arg(d.join("crio.conf"))
                .arg("--config-dir")
                .arg(d.join("conf.d"))
                .args(["--log-level", "debug"]),
            log,
        ));
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::new();
        while Instant::now() < deadline {
            match self.cri.status() {
                Ok(s)
                    if s.status
                        .iter()
                        .flat_map(|s| &s.conditions)
                        .any(|c| c.r#type == "RuntimeReady" && c.status) =>
                {
                    return;
                }
                Ok(s) => last = format!("{s:?}"),
                Err(e) => last = e.to_string(),
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "crio exited during start ({status}):\n{}",
                    tail(&self.log(), 60)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "CRI-O did not answer within 60 s (last: {last}):\n{}",
            tail(&self.log(), 60)
        );
    }

    /// SIGKILL, as a node crash would: pods keep running (conmon holds them), and CRI-O
    /// restores them at its next start.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether CRI's Status reports NetworkReady, and its reason and message when not.
    pub fn network_ready(&self) -> Result<(bool, String), Status> {
        self.cri.network_ready()
    }

    /// A pod config named `name` in namespace `default`, with a unique UID.
    pub fn pod_config(&self, name: &str) -> PodSandboxConfig {
        crate::cri::pod_config(name, &self.dir().join("pods"))
    }

    /// RunPodSandbox for a pod named `name`: the CNI ADD happens inside it. Returns its ID.
    pub fn run_pod(&self, name: &str) -> Result<String, Status> {
        self.cri.run_pod_sandbox(self.pod_config(name))
    }

    crate::cri::sandbox_calls!();

    /// Processes whose command line names this guard's directory (conmon, the pods' runc
    /// children): what outlives a killed CRI-O.
    fn leftovers(&self) -> Vec<i32> {
        let needle = self.dir().display().to_string();
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| *pid != std::process::id() as i32)
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
            })
            .collect()
    }
}

impl Drop for Crio {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- CRI-O log ({}) -----\n{}\n----- end of CRI-O log -----",
                self.dir().join("crio.log").display(),
                tail(&self.log(), 60)
            );
        }
        if self.child.is_some()
            && let Ok(pods) = self.list_pods()
        {
            for p in pods {
                let _ = self.stop_pod(&p.id);
                let _ = self.remove_pod(&p.id);
            }
        }
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the pid of a child we have not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in self.leftovers() {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        crate::containerd::unmount_under(self.dir());
    }
}

/// CRI-O's configuration: everything it can move is under `d` (crio.conf(5); cri-o
/// `pkg/config/config.go`).
fn config(d: &Path, pinns: &Path, runc: &Path) -> String {
    format!(
        r#"[crio]
root = "{d}/root"
runroot = "{d}/runroot"
storage_driver = "overlay"
log_dir = "{d}/logs"
version_file = "{d}/version"
version_file_persist = "{d}/version-persist"
clean_shutdown_file = "{d}/clean.shutdown"

[crio.api]
listen = "{d}/crio.sock"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
namespaces_dir = "{d}/ns"
pinns_path = "{pinns}"
container_exits_dir = "{d}/exits"
container_attach_socket_dir = "{d}/attach"
selinux = false
hooks_dir = []
irqbalance_config_file = ""
irqbalance_config_restore_file = "disable"

[crio.runtime.runtimes.runc]
runtime_path = "{runc}"
runtime_type = "oci"
runtime_root = "{d}/runc"
monitor_path = "/usr/bin/conmon"

[crio.image]
pause_image = "{IMAGE}"
# The image's own command (busybox sleeping), not the default /pause.
pause_command = ""
signature_policy = "{d}/policy.json"

[crio.network]
network_dir = "{d}/net.d"
plugin_dirs = ["{d}/bin"]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
"#,
        d = d.display(),
        pinns = pinns.display(),
        runc = runc.display(),
    )
}

/// Debian's runc, or, where root lacks CAP_SYS_RESOURCE (as on this project's build
/// machines), runc behind a wrapper that sets `process.oomScoreAdj` in the bundle's config.json
/// to its own score (which needs no privilege) before runc runs. CRI-O gives every pod's infra container -998 (kubelet's
/// value) and has no setting like containerd's `restrict_oom_score_adj`; lowering the score
/// needs CAP_SYS_RESOURCE, and without it runc fails "failed to update
/// /proc/self/oom_score_adj: Permission denied" and no pod runs. The score is nothing
/// dipam's tests look at.
fn runc_for_this_host(d: &Path) -> PathBuf {
    let runc = PathBuf::from("/usr/sbin/runc");
    let cap_eff = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        })
        .unwrap_or(0);
    const CAP_SYS_RESOURCE: u32 = 24;
    if cap_eff & (1 << CAP_SYS_RESOURCE) != 0 {
        return runc;
    }
    let wrapper = d.join("runc-wrapper");
    let script = format!(
        r#"#!/bin/sh
# See runc_for_this_host in tests/lifecycle/src/crio.rs.
bundle=
prev=
for a in "$@"; do
  case $prev in --bundle|-b) bundle=$a ;; esac
  case $a in --bundle=*) bundle=${{a#--bundle=}} ;; esac
  prev=$a
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
  own=$(cat /proc/self/oom_score_adj)
  sed -i -E "s/(\"oomScoreAdj\":[[:space:]]*)-?[0-9]+/\\1$own/" "$bundle/config.json"
fi
exec {runc} "$@"
"#,
        runc = runc.display()
    );
    std::fs::write(&wrapper, script).expect("write the runc wrapper");
    let mut perms = std::fs::metadata(&wrapper).expect("stat").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&wrapper, perms).expect("make the runc wrapper executable");
    wrapper
}

/// Loads the test image into CRI-O's storage with podman (same containers/storage layout).
fn load_image(d: &Path) {
    let tar = crate::containerd::image_tar();
    crate::cmd::run(
        Command::new("podman")
            .arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .args(["--storage-driver", "overlay", "load", "-i"])
            .arg(&tar),
    );
}

fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

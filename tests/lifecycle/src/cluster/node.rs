//! The node's private world: a network namespace and a mount namespace, each kept by a bind
//! mount of its nsfs file, so that every component can be started (and restarted) in them.
//!
//! The shipped DaemonSet mounts host paths (`/opt/cni/bin`, `/etc/cni/net.d`, `/var/lib/cni`,
//! `/run/dipam`, `/var/lib/dipam`, `/run/containerd`; with azure-vnet-ipam also `/run`,
//! `/var/log` and `/etc/kubernetes`) and names containerd's socket at its host path. To run
//! it as shipped without touching the machine's own directories, the kubelet and containerd
//! run in a mount namespace where each of those paths (and the kubelet's and the pods' own:
//! `/var/lib/kubelet`, `/var/log/pods`, `/run/netns`, ...) is, or is below, a private
//! directory of the test bind-mounted over it. Everything of the cluster runs in one
//! network namespace with a veth pair (the kernel here has no dummy links) holding the node's address, so the components use
//! their usual ports, and kube-proxy's iptables rules and the pods' routes live and die with
//! it. The control plane and kube-proxy share only the network namespace.
//!
//! The pods' cgroups live under a cgroup root of the test's own (the kubelet's
//! `cgroupRoot`), created in every cgroup v1 hierarchy and removed on drop.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

/// The node's address (on a veth inside the node's network namespace: its "NIC").
pub const NODE_IP: &str = "10.250.0.10";

/// The host paths the node gets private copies of, inside its mount namespace. The whole of
/// /run, /var/log and /etc/kubernetes: with azure-vnet-ipam as the delegate the DaemonSet
/// mounts the node's /run, /var/log and /etc/kubernetes (its state file, lock, logs and
/// interfaces.json), which must be the node's, never the machine's.
pub const PRIVATE_PATHS: &[&str] = &[
    "/opt/cni/bin",
    "/etc/cni/net.d",
    "/etc/kubernetes",
    "/var/lib/cni",
    "/var/lib/dipam",
    "/run",
    "/var/lib/kubelet",
    "/var/log",
];

/// What a reboot empties: /run, a tmpfs on every distribution this runs on (dipamd's socket,
/// containerd's state, the pods' netns files, azure-vnet-ipam's state and lock).
pub const VOLATILE_PATH: &str = "/run";

pub struct Node {
    /// `<dir>/ns`: a private mount holding the `net` and `mnt` nsfs bind mounts.
    ns: PathBuf,
    /// `<dir>/host`: the private directories, at their host paths below it.
    pub host: PathBuf,
    /// The cgroup root's name, e.g. `dipam-kube-1234`.
    pub cgroup: String,
    /// The host paths that did not exist and were created as mount points.
    created: Vec<PathBuf>,
}

fn sh(script: &str) -> std::process::Output {
    Command::new("sh")
        .args(["-c", script])
        .output()
        .expect("spawn sh")
}

#[track_caller]
fn sh_ok(script: &str) {
    let out = sh(script);
    assert!(
        out.status.success(),
        "{script}\nfailed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Node {
    /// Creates the namespaces, the private directories and the cgroup root under `dir`.
    pub fn create(dir: &Path) -> Self {
        let ns = dir.join("ns");
        let host = dir.join("host");
        let cgroup = format!("dipam-kube-{}", std::process::id());
        let mut created = Vec::new();
        for p in PRIVATE_PATHS {
            std::fs::create_dir_all(host.join(&p[1..])).expect("a private directory");
            // Each missing directory of the path, outermost first, to remove on drop.
            let mut missing: Vec<&Path> = Path::new(p)
                .ancestors()
                .take_while(|a| !a.exists())
                .collect();
            missing.reverse();
            for m in missing {
                std::fs::create_dir(m).expect("a mount point");
                created.push(m.to_path_buf());
            }
        }
        std::fs::create_dir_all(&ns).expect("the namespaces' directory");
        let (n, h) = (ns.display(), host.display());
        // unshare(1) keeps a namespace by bind-mounting its nsfs file, which must be on a
        // private mount.
        sh_ok(&format!(
            "mount --bind {n} {n} && mount --make-private {n} && touch {n}/net {n}/mnt"
        ));
        let mut binds = String::new();
        for p in PRIVATE_PATHS {
            binds.push_str(&format!("mount --bind {h}{p} {p} && "));
        }
        // Slave of the host's mounts, then shared inside: containerd refuses a
        // `mountPropagation: HostToContainer` volume (the DaemonSet's /run/containerd) whose
        // source is on a private mount.
        sh_ok(&format!(
            "unshare --net={n}/net --mount={n}/mnt --propagation slave sh -c '\
             {binds} mount --make-rshared / && ip link set lo up && \
             ip link add node0 type veth peer name node0-peer && \
             ip addr add {NODE_IP}/24 dev node0 && ip link set node0-peer up && \
             ip link set node0 up && ip route add default dev node0'"
        ));
        let node = Self {
            ns,
            host,
            cgroup,
            created,
        };
        node.create_cgroups();
        node
    }

    /// `nsenter` into the network namespace, and the mount namespace too when `mount`.
    pub fn command(&self, mount: bool, program: &Path) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.ns.join("net").display()));
        if mount {
            c.arg(format!("--mount={}", self.ns.join("mnt").display()));
        }
        c.arg("--").arg(program);
        c
    }

    /// Runs a shell script in both namespaces; its output.
    pub fn sh(&self, script: &str) -> std::process::Output {
        self.command(true, Path::new("/bin/sh"))
            .args(["-c", script])
            .output()
            .expect("nsenter sh")
    }

    /// The host path of the node's `path` (one of `PRIVATE_PATHS`, or below one).
    pub fn path(&self, path: &str) -> PathBuf {
        self.host.join(path.trim_start_matches('/'))
    }

    fn mnt_ino(&self) -> u64 {
        std::fs::metadata(self.ns.join("mnt")).map_or(0, |m| m.ino())
    }

    /// The processes of the node: those in its mount namespace (containerd, the kubelet, the
    /// shims) and those in its cgroup root (every pod's, each in a mount namespace of its own).
    pub fn processes(&self) -> Vec<i32> {
        let want = format!("mnt:[{}]", self.mnt_ino());
        let marker = format!("/{}/", self.cgroup);
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            // A zombie is dead already (its parent reaps it).
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            {
                continue;
            }
            let ns = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap_or_default();
            let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if ns.as_os_str() == want.as_str() || cg.contains(&marker) {
                out.push(pid);
            }
        }
        out
    }

    /// SIGKILLs every process of the node, as a power loss would, until none is left.
    #[track_caller]
    pub fn kill_all(&self) {
        if let Err(left) = self.try_kill_all() {
            panic!("node processes survive SIGKILL for 30 s: {left:?}");
        }
    }

    /// [`Self::kill_all`] for drop: survivors are reported, not a panic.
    pub fn kill_all_quietly(&self) {
        if let Err(left) = self.try_kill_all() {
            eprintln!("node processes survive SIGKILL for 30 s: {left:?}");
        }
    }

    fn try_kill_all(&self) -> Result<(), Vec<i32>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = self.processes();
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(left);
            }
            for pid in left {
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What a reboot does to the node's volatile state, once its processes are dead: every
    /// mount made under the node's paths (the pods' network namespaces, rootfs overlays,
    /// the kubelet's tmpfs volumes) goes, /run is empty again, and the pods' cgroups are gone.
    pub fn reboot_cleanup(&self) {
        let mut script = String::from(
            "awk '{print $5}' /proc/self/mountinfo | sort -r | while read m; do case $m in ",
        );
        let pats: Vec<String> = PRIVATE_PATHS.iter().map(|p| format!("{p}/*")).collect();
        script.push_str(&pats.join("|"));
        script.push_str(") umount -l \"$m\" ;; esac; done; ");
        // Only the node's own /run (its inode checked first: a namespace that somehow saw the
        // machine's would lose every other process's sockets), never across a mount left.
        let private = std::fs::metadata(self.path(VOLATILE_PATH)).expect("the node's /run");
        script.push_str(&format!(
            "[ \"$(stat -c %d:%i {VOLATILE_PATH})\" = {}:{} ] || {{ echo {VOLATILE_PATH} is not the private one >&2; exit 3; }}; \
             find {VOLATILE_PATH} -xdev -mindepth 1 -delete",
            private.dev(),
            private.ino()
        ));
        let out = self.sh(&script);
        assert!(out.status.success(), "reboot cleanup: {out:?}");
        self.remove_cgroups(false);
    }

    /// The mounted cgroup hierarchies (v1 ones have `tasks`; a hybrid host's `unified` v2
    /// one only `cgroup.procs`, and runc makes its cgroups there too).
    fn hierarchies(v1_only: bool) -> Vec<PathBuf> {
        let marker = if v1_only { "tasks" } else { "cgroup.procs" };
        std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) && p.join(marker).exists()
            })
            .collect()
    }

    /// The kubelet's `cgroupRoot`, in every cgroup v1 hierarchy (it must exist); cpuset's
    /// needs its CPUs and memory nodes before anything can join it.
    fn create_cgroups(&self) {
        for h in Self::hierarchies(true) {
            let d = h.join(&self.cgroup);
            let _ = std::fs::create_dir(&d);
            for f in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(v) = std::fs::read_to_string(h.join(f)) {
                    std::fs::write(d.join(f), v.trim()).expect("inherit cpuset");
                }
            }
        }
    }

    /// Removes the cgroups below the root (and the root itself when `root`), deepest first.
    fn remove_cgroups(&self, root: bool) {
        for h in Self::hierarchies(false) {
            let top = h.join(&self.cgroup);
            let mut dirs = Vec::new();
            collect_dirs(&top, &mut dirs);
            dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for d in dirs.iter().filter(|d| root || **d != top) {
                let _ = std::fs::remove_dir(d);
            }
        }
    }
}

fn collect_dirs(d: &Path, out: &mut Vec<PathBuf>) {
    if !d.is_dir() {
        return;
    }
    out.push(d.to_path_buf());
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_dirs(&e.path(), out);
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill_all_quietly();
        let n = self.ns.display();
        // The namespaces die with their last reference: these bind mounts, once every
        // process in them is gone (the mounts inside the mount namespace go with it).
        let _ = sh(&format!(
            "umount {n}/mnt; umount {n}/net; umount -l {n}; rm -rf {n}"
        ));
        self.remove_cgroups(true);
        for p in self.created.iter().rev() {
            let _ = std::fs::remove_dir(p);
        }
    }
}

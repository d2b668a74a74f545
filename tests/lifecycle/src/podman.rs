//! A private rootful podman: its own containers.conf (CONTAINERS_CONF), storage (`--root`,
//! `--runroot`, `--tmpdir`, the vfs driver) and no registry, all in one temp directory.
//! tests/runtimes/podman.rs runs containers on dipam conflists with it, tests/deploy/image.rs builds and runs
//! dipam's image. The choices every test machine needs are made here once: runc rather than
//! podman's default crun (tests/deps.sh installs runc), cgroupfs (no systemd needed), no
//! event log, and `default_ulimits` lowered to this process's hard limits (runc refuses to
//! raise nofile/nproc above them, which podman's defaults would).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use tempfile::TempDir;

use crate::is_root;

/// Why rootful podman (and `tools` beside it) cannot run here, if it cannot: `root` says why
/// root is needed, `install` what installs the tools.
pub fn unavailable(root: &str, tools: &[&str], install: &str) -> Option<String> {
    if !is_root() {
        return Some(root.into());
    }
    tools
        .iter()
        .find_map(|tool| crate::require::tool(tool, install).err())
}

/// Why rootful podman cannot run containers of the busybox image here ([`Podman::import_busybox`]),
/// if it cannot.
pub fn containers_unavailable() -> Option<String> {
    unavailable(
        "podman tests need root (rootful podman with CNI networks)",
        &["podman", "runc", "busybox", "timeout"],
        "tests/deps.sh installs podman, runc and busybox-static",
    )
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

/// A private podman; containers (and, if asked, images) are removed on drop.
pub struct Podman {
    dir: TempDir,
    remove_images: bool,
}

impl Podman {
    /// A podman in a new temp directory `PREFIX*`, whose containers.conf has the settings
    /// above, then `[network]` from `network(dir)` if given (`dir` is the temp directory).
    pub fn new(prefix: &str, network: impl FnOnce(&Path) -> Option<String>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("temp dir");
        let nofile = hard_limit(libc::RLIMIT_NOFILE, 20000);
        let nproc = hard_limit(libc::RLIMIT_NPROC, 4096);
        let network = network(dir.path())
            .map(|n| format!("[network]\n{n}\n\n"))
            .unwrap_or_default();
        std::fs::write(
            dir.path().join("containers.conf"),
            format!(
                "[containers]\ndefault_ulimits = [\"nofile={nofile}:{nofile}\", \"nproc={nproc}:{nproc}\"]\n\n\
                 {network}[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"none\"\n"
            ),
        )
        .expect("write containers.conf");
        Self {
            dir,
            remove_images: false,
        }
    }

    /// Also removes every image on drop (`rmi --all`): for images the test built.
    pub fn removing_images(mut self) -> Self {
        self.remove_images = true;
        self
    }

    pub fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    /// `podman <args>` against this private setup, bounded by a timeout.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("timeout");
        cmd.arg("180")
            .arg("podman")
            .arg("--root")
            .arg(self.path("root"))
            .arg("--runroot")
            .arg(self.path("runroot"))
            .arg("--tmpdir")
            .arg(self.path("tmp"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .env("CONTAINERS_CONF", self.path("containers.conf"));
        cmd
    }

    /// `podman <args>` against this private setup, bounded by a timeout.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run podman")
    }

    /// `podman <args>`, which must succeed; its stdout.
    #[track_caller]
    pub fn ok(&self, args: &[&str]) -> String {
        let out = crate::cmd::run(&mut self.command(args));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force", "--time", "0"]);
        if self.remove_images {
            let _ = self.run(&["rmi", "--all", "--force"]);
        }
    }
}

impl Podman {
    /// Imports a one-binary image as `image`: busybox-static and the applets `applets`
    /// (`podman import` of a tar, so no registry is needed).
    pub fn import_busybox(&self, image: &str, applets: &[&str]) {
        let rootfs = self.path("rootfs");
        for d in ["bin", "etc", "proc", "sys", "dev", "tmp"] {
            std::fs::create_dir_all(rootfs.join(d)).expect("rootfs");
        }
        let busybox = ["/bin/busybox", "/usr/bin/busybox"]
            .iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .expect("busybox (tests/deps.sh installs busybox-static)");
        std::fs::copy(busybox, rootfs.join("bin/busybox")).expect("copy busybox");
        for applet in applets {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))
                .expect("applet link");
        }
        let tar = self.path("rootfs.tar");
        let status = std::process::Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .expect("tar");
        assert!(status.success(), "tar of the rootfs");
        self.ok(&["import", &tar.display().to_string(), image]);
    }
}

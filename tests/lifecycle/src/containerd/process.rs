//! containerd's process: spawned; killed with some of its pods, as a node's OOM killer or a
//! crashed runtime takes them; started again on the same root and state. CRI then restores
//! every sandbox from its metadata, reconnects to the shims that survived (their pods keep
//! running) and reports the others NOTREADY, still listed until they are stopped and removed
//! (kubelet does that for a pod whose sandbox died; containerd's
//! `internal/cri/server/sandbox_stop.go` sends their DEL then, with an empty netns path where
//! the namespace is gone).

use std::{
    path::Path,
    process::{Child, Command},
    time::Duration,
};

use super::{Build, Containerd, children};

impl Containerd {
    /// SIGKILLs containerd and the shims of `pods`, each with every process under it (the
    /// pod's pause and containers): those pods die. The other pods' shims keep running.
    pub fn kill9_with(&mut self, pods: &[&str]) {
        let shims: Vec<i32> = self
            .shims()
            .into_iter()
            .filter(|&pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let mut args = cmdline.split(|b| *b == 0);
                let mut id = None;
                while let Some(a) = args.next() {
                    if a == b"-id" {
                        id = args.next();
                    }
                }
                id.is_some_and(|id| pods.iter().any(|p| p.as_bytes() == id))
            })
            .collect();
        assert_eq!(
            shims.len(),
            pods.len(),
            "one shim per sandbox (containerd 2 groups a pod's containers under its sandbox's)"
        );
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for shim in shims {
            let kids = children(shim);
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(shim, libc::SIGKILL) };
            for kid in kids {
                // SAFETY: as above.
                unsafe { libc::kill(kid, libc::SIGKILL) };
            }
        }
        // Give init a moment to reap the killed pods.
        std::thread::sleep(Duration::from_millis(200));
    }

    /// Starts containerd again on the same root, state and configuration, and waits until CRI
    /// is ready (its sandboxes restored).
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "containerd still runs");
        self.child = Some(spawn(self.dir.path(), &self.build));
        self.wait_ready();
    }
}

/// Starts `build` on the configuration under `d`, logging to `d`/containerd.log (appended: a
/// restart keeps the earlier run's lines).
pub(super) fn spawn(d: &Path, build: &Build) -> Child {
    let log = crate::cmd::append_log(&d.join("containerd.log"));
    let mut cmd = Command::new(&build.containerd);
    if let Some(shims) = &build.shim_dir {
        // The shim is looked up in PATH: this build's first, then Debian's runc.
        let path = std::env::var_os("PATH").unwrap_or_default();
        let dirs = std::iter::once(shims.clone()).chain(std::env::split_paths(&path));
        cmd.env(
            "PATH",
            std::env::join_paths(dirs).expect("a PATH of valid directories"),
        );
    }
    cmd.arg("--config")
        .arg(d.join("config.toml"))
        .args(["--log-level", "info"]);
    crate::cmd::spawn_daemon(&mut cmd, log)
}

/// Deletes a pod's network namespace (unmounts and removes its file), as a reboot or a
/// runtime's crash cleanup leaves it: nothing on the node holds its addresses any more.
pub fn delete_netns(path: &str) {
    if let Ok(c) = std::ffi::CString::new(path.as_bytes()) {
        // SAFETY: umount2 with a valid NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    let _ = std::fs::remove_file(path);
}

//! A real network namespace, created with `ip netns add` and deleted on drop.

use std::{path::PathBuf, process::Command};

/// A pod as a runtime makes one: a new network namespace, and an attachment of a unique
/// container ID (`eth0`) in it.
pub fn pod() -> (NetNs, crate::Attachment) {
    let ns = NetNs::new();
    let att = crate::Attachment::new(&crate::unique("pod"), &ns.path());
    (ns, att)
}

pub struct NetNs {
    pub name: String,
    deleted: bool,
}

impl NetNs {
    pub fn new() -> Self {
        let name = crate::unique("dipamt");
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .expect("run `ip netns add` (iproute2)");
        assert!(
            out.status.success(),
            "ip netns add {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            name,
            deleted: false,
        }
    }

    /// The path a runtime passes as CNI_NETNS.
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// Runs a command inside the namespace (`ip netns exec`).
    pub fn exec(&self, args: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .expect("run ip netns exec")
    }

    /// Deletes the namespace now, as a runtime does when a sandbox goes away before DEL.
    pub fn delete(&mut self) {
        if !self.deleted {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.name])
                .status();
            self.deleted = true;
        }
    }

    pub fn exists(&self) -> bool {
        PathBuf::from(self.path()).exists()
    }
}

impl Default for NetNs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        self.delete();
    }
}

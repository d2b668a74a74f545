//! `dipamctl install` refuses, unless `--force`, a conflist that would fail every pod's ADD
//! on the node: a chained plugin that cannot take its cniVersion (asked with CNI VERSION, the
//! real Debian 12 plugins and the reference plugins v1.10.0), and a delegate IPAM that is not
//! installed, or an interface plugin (bridge) chained after dipam as the main plugin. The
//! refusal names the version or chain to use and changes nothing on the node. (A runtime
//! that cannot take the version, containerd 1.6, is refused in containerd.rs
//! `containerd_cni_versions`, which then runs the forced conflist under it.)

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use dipam_lifecycle::{bins, peers::Peer, require_peers};
use serde_json::Value;
use tempfile::TempDir;

/// A node's CNI directories, empty, and the conflist to install.
struct Node {
    dir: TempDir,
}

impl Node {
    fn new(conflist: &Value) -> Self {
        let dir = dipam_lifecycle::temp_dir("install-checks-");
        for d in ["bin", "net.d", "empty", "path"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        std::fs::write(
            dir.path().join("src.conflist"),
            serde_json::to_vec_pretty(conflist).unwrap(),
        )
        .unwrap();
        Self { dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// `dipamctl install` with these plugin directories (--cni-path) and extra flags; no
    /// container runtime in PATH (containerd.rs covers those).
    fn install(&self, cni_path: &[&Path], extra: &[&str]) -> Output {
        let joined = std::env::join_paths(cni_path).unwrap();
        Command::new(bins::bin("dipamctl"))
            .arg("install")
            .arg("--plugin")
            .arg(bins::bin("dipam"))
            .arg("--no-man-pages")
            .arg("--cni-bin-dir")
            .arg(self.path("bin"))
            .arg("--conf-dir")
            .arg(self.path("net.d"))
            .arg("--conflist")
            .arg(self.path("src.conflist"))
            .arg("--cni-path")
            .arg(joined)
            .args(extra)
            .env("PATH", self.path("path"))
            .output()
            .unwrap()
    }

    fn installed(&self) -> bool {
        self.path("net.d/10-dipam.conflist").exists()
    }
}

fn example(name: &str, version: &str) -> Value {
    let mut v: Value = serde_json::from_slice(
        &std::fs::read(bins::workspace().join("conflist").join(name)).unwrap(),
    )
    .unwrap();
    v["cniVersion"] = version.into();
    v
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_chained_plugin_that_cannot_take_the_version_is_refused_unless_forced() {
    let peers: Vec<Peer> = require_peers!("portmap");
    let debian = Path::new(bins::REFERENCE_PLUGINS);
    let node = Node::new(&example("dipam-portmap.conflist", "1.1.0"));

    // Debian's portmap 1.1.1 stops at 1.0.0: refused, naming it and the version to use.
    let out = node.install(&[debian], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("plugins[1] (portmap, /usr/lib/cni/portmap) does not take cniVersion 1.1.0")
            && err.contains("use \"cniVersion\": \"1.0.0\"")
            && err.contains("--force"),
        "{err}"
    );
    assert!(!node.installed(), "a refusal changes nothing");

    // --force installs it, and says what it installed despite.
    let out = node.install(&[debian], &["--force"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(node.installed());
    assert!(
        err.contains("warning: installed with --force") && err.contains("portmap"),
        "{err}"
    );
    std::fs::remove_file(node.path("net.d/10-dipam.conflist")).unwrap();

    // The reference portmap v1.10.0 takes 1.1.0: installed, nothing said about it.
    let v110 = peers[0].path.parent().unwrap().to_owned();
    let out = node.install(&[&v110, debian], &[]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(node.installed());
    assert!(!err.contains("portmap"), "{err}");

    // At 1.0.0, which the refusal named, Debian's portmap installs.
    let node = Node::new(&example("dipam-portmap.conflist", "1.0.0"));
    let out = node.install(&[debian], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_delegate_that_is_not_installed_is_refused_unless_forced() {
    let node = Node::new(&example("ptp-dipam-host-local.conflist", "1.0.0"));
    // ptp is where the runtime finds it, host-local nowhere dipamd looks.
    let only_ptp = node.path("empty");
    std::os::unix::fs::symlink(
        Path::new(bins::REFERENCE_PLUGINS).join("ptp"),
        only_ptp.join("ptp"),
    )
    .unwrap();
    let out = node.install(&[&only_ptp], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the delegate IPAM \"host-local\" is not installed")
            && err.contains(&only_ptp.display().to_string())
            && err.contains("--cni-path"),
        "{err}"
    );
    assert!(
        !err.contains("use \"cniVersion\""),
        "no version helps: {err}"
    );
    assert!(!node.installed());

    let out = node.install(&[&only_ptp], &["--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(node.installed());

    // Where dipamd's default --cni-path has it (Debian's /usr/lib/cni), it installs.
    std::fs::remove_file(node.path("net.d/10-dipam.conflist")).unwrap();
    let out = node.install(&[Path::new(bins::REFERENCE_PLUGINS)], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(node.installed());
}

/// bridge chained after dipam as the main plugin fails every pod's ADD at bridge ("container
/// veth name ... already exists": libcni.rs
/// `bridge_after_main_mode_fails_at_bridges_add_and_the_del_releases_everything`), whatever
/// its version: refused with both Debian's bridge and v1.10.0, naming the IPAM-mode chain
/// that works, and installed only with --force.
#[test]
fn bridge_after_main_mode_is_refused_naming_the_ipam_mode_chain() {
    let peers: Vec<Peer> = require_peers!("bridge");
    let mut list = example("dipam-host-local.conflist", "1.0.0");
    list["plugins"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"type": "bridge", "bridge": "cni0"}));
    let node = Node::new(&list);
    let v110 = peers[0].path.parent().unwrap().to_owned();
    for dirs in [[Path::new(bins::REFERENCE_PLUGINS)], [v110.as_path()]] {
        let out = node.install(&dirs, &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{dirs:?}: {err}");
        assert!(
            err.contains("plugins[1] (bridge) follows dipam as the main plugin (plugins[0])")
                && err.contains("already exists")
                && err.contains("conflist/bridge-dipam-host-local.conflist")
                && err.contains("--force"),
            "{dirs:?}: {err}"
        );
        assert!(
            !err.contains("use \"cniVersion\""),
            "no version helps: {err}"
        );
        assert!(!node.installed(), "a refusal changes nothing");
    }
    let out = node.install(&[Path::new(bins::REFERENCE_PLUGINS)], &["--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(node.installed());

    // The shipped bridge example (dipam as bridge's IPAM) installs.
    let node = Node::new(&example("bridge-dipam-host-local.conflist", "1.0.0"));
    let out = node.install(&[Path::new(bins::REFERENCE_PLUGINS)], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
}

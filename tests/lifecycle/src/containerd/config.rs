//! containerd's configuration files, one per config format: everything containerd can move
//! is under the guard's directory.

use std::path::Path;

use super::IMAGE;

/// containerd's configuration (format version 2, as 1.6 reads it). Everything it can move
/// is under `d`; plugins that would touch the host's own paths are disabled.
pub(super) fn config(d: &Path) -> String {
    let p = |s: &str| d.join(s).to_string_lossy().into_owned();
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp",
]

{sockets}
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  # Without it runc fails with "can't get final child's PID from pipe" where root lacks
  # CAP_SYS_RESOURCE (docs/sources.md §10.2).
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{netd}"
    max_conf_num = 1
"#,
        root = p("root"),
        state = p("state"),
        sockets = sockets(&p("containerd.sock")),
        bin = p("bin"),
        netd = p("net.d"),
    )
}

/// The sockets' part of either format: gRPC at `grpc`, ttrpc beside it, metrics off.
fn sockets(grpc: &str) -> String {
    format!(
        "[grpc]\n  address = \"{grpc}\"\n\n[ttrpc]\n  address = \"{grpc}.ttrpc\"\n\n[metrics]\n  address = \"\"\n"
    )
}

/// containerd 2.x's configuration (format version 3; containerd's `docs/cri/config.md`): the
/// same settings as [`config`], under the plugins 2.x splits the CRI plugin into. NRI (a
/// socket under /var/run/nri) is disabled with the rest that would touch the host's paths.
pub(super) fn config_v3(d: &Path) -> String {
    let p = |s: &str| d.join(s).to_string_lossy().into_owned();
    let (bin, netd) = (p("bin"), p("net.d"));
    config_v3_at(
        &p("root"),
        &p("state"),
        &p("containerd.sock"),
        IMAGE,
        &bin,
        &netd,
    )
}

/// [`config_v3`] with every path given: the test cluster's node runs the same containerd
/// at the host's usual paths (crate::cluster).
pub(crate) fn config_v3_at(
    root: &str,
    state: &str,
    grpc: &str,
    sandbox: &str,
    bin: &str,
    netd: &str,
) -> String {
    let sockets = sockets(grpc);
    format!(
        r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.internal.v1.opt", "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
]

{sockets}
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{sandbox}"

[plugins.'io.containerd.cri.v1.runtime']
  # As in config(): runc fails where root lacks CAP_SYS_RESOURCE otherwise.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{bin}"]
    conf_dir = "{netd}"
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#
    )
}

//! The node's images, offline (there is no registry): each a docker-archive tar imported
//! into containerd's `k8s.io` namespace, where the CRI plugin finds it.
//!
//! - dipam's, built from deploy/Containerfile with podman exactly as tests/image.rs builds it
//!   (the three binaries stripped of debug info), then `podman save`d;
//! - the pause image: Kubernetes' own `build/pause/linux/pause.c` of the pinned release,
//!   compiled statically by tests/peers/build.sh (peer `pause`), alone in a scratch image
//!   with `/pause` as its entrypoint, as Kubernetes' `build/pause/Dockerfile` makes it;
//! - busybox (Debian's busybox-static) for the workload pods (src/containerd.rs builds it).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::json;

use crate::{bins, podman::Podman};

/// The dipam image's reference; the test's kustomization sets it (deploy/README.md,
/// "The image reference").
pub const DIPAM_IMAGE: &str = "localhost/dipam";
pub const DIPAM_TAG: &str = "test";
/// The sandbox image (containerd's `pinned_images.sandbox`).
pub const PAUSE_IMAGE: &str = "localhost/dipam-test/pause:3.9";
/// The workload image.
pub const BUSYBOX_IMAGE: &str = crate::containerd::IMAGE;

#[track_caller]
fn run(cmd: &mut Command) -> String {
    crate::cmd::ok(&crate::cmd::run(cmd))
}

fn sha256(path: &Path) -> String {
    run(Command::new("sha256sum").arg(path))
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A one-layer docker-archive of `rootfs` with image config `config`, tagged `tag`.
fn archive(rootfs: &Path, config: serde_json::Value, tag: &str, out: &Path) {
    let work = tempfile::tempdir().expect("temp dir");
    let w = work.path();
    std::fs::create_dir_all(w.join("layer")).expect("layer dir");
    run(Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner"])
        .args(["--mtime=@0", "-C"])
        .arg(rootfs)
        .arg("-cf")
        .arg(w.join("layer/layer.tar"))
        .arg("."));
    let diff = sha256(&w.join("layer/layer.tar"));
    let image = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff}")]},
    });
    std::fs::write(w.join("config.json"), image.to_string()).expect("config.json");
    let manifest =
        json!([{"Config": "config.json", "RepoTags": [tag], "Layers": ["layer/layer.tar"]}]);
    std::fs::write(w.join("manifest.json"), manifest.to_string()).expect("manifest.json");
    run(Command::new("tar")
        .arg("-C")
        .arg(w)
        .arg("-cf")
        .arg(out)
        .args(["manifest.json", "config.json", "layer"]));
}

/// The pause image's archive in `dir`, from the statically built `pause` binary.
pub fn pause_archive(pause: &Path, dir: &Path) -> PathBuf {
    let rootfs = dir.join("pause-rootfs");
    std::fs::create_dir_all(&rootfs).expect("pause rootfs");
    std::fs::copy(pause, rootfs.join("pause")).expect("copy pause");
    let out = dir.join("pause.tar");
    archive(
        &rootfs,
        json!({"Entrypoint": ["/pause"], "User": "65535:65535"}),
        PAUSE_IMAGE,
        &out,
    );
    out
}

/// dipam's image from deploy/Containerfile, built and saved with a private podman; its
/// archive in `dir`.
pub fn dipam_archive(dir: &Path) -> PathBuf {
    let podman = Podman::new("cluster-image-", |_| None).removing_images();
    let ctx = podman.path("context");
    std::fs::create_dir_all(&ctx).expect("context");
    for name in ["dipam", "dipamd", "dipamctl"] {
        run(Command::new("strip")
            .arg("--strip-debug")
            .arg("-o")
            .arg(ctx.join(name))
            .arg(bins::dir().join(name)));
    }
    let tag = format!("{DIPAM_IMAGE}:{DIPAM_TAG}");
    let containerfile = bins::workspace().join("deploy/Containerfile");
    podman.ok(&[
        "build",
        "--pull=never",
        "-f",
        &containerfile.to_string_lossy(),
        "-t",
        &tag,
        &ctx.to_string_lossy(),
    ]);
    let out = dir.join("dipam.tar");
    podman.ok(&[
        "save",
        "--format",
        "docker-archive",
        "-o",
        &out.to_string_lossy(),
        &tag,
    ]);
    out
}

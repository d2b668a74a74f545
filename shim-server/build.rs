//! Two things for the build:
//!
//! - The git commit `dipamd --version` and `dipamctl --version` show, beside the crate
//!   version, so that a bug report names the exact build: `DIPAM_GIT_COMMIT` for the binaries
//!   (not the library, which then does not rebuild on every commit). Taken from
//!   `DIPAM_GIT_COMMIT` when set (a build from a source tarball can say where it came from),
//!   else from `git rev-parse` in this checkout (CI builds from a clone), else "unknown": a
//!   build outside git still works.
//! - The CRI client the runtime-aware GC uses (gc/runtime/cri.rs), generated from
//!   cri/api.proto, the part of the Kubernetes CRI API it calls. protoc comes from
//!   `protoc-bin-vendored`, as for dipam.v1 (proto/build.rs): building dipamd needs nothing
//!   but cargo (docs/sources.md §12.3).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-env-changed=DIPAM_GIT_COMMIT");
    let commit = std::env::var("DIPAM_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=DIPAM_GIT_COMMIT={commit}");
    // Rerun when HEAD moves: HEAD itself (a checkout or a detached commit), the branch it
    // names (a new commit), and packed-refs (where a fetch may put that branch). Paths from
    // git itself, so a worktree's private HEAD is the one watched.
    let mut watch = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(branch);
    }
    for name in watch {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    // Without any rerun-if line cargo would rerun this for every file in the package.
    println!("cargo:rerun-if-changed=build.rs");

    let proto = "cri/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let mut cfg = prost_build::Config::new();
    cfg.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        // dipamd is the runtime's client, never its server.
        .build_server(false)
        .compile_with_config(cfg, &[proto], &["cri"])?;
    Ok(())
}

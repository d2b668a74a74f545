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

include!("build_commit.rs");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    emit_git_commit();

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

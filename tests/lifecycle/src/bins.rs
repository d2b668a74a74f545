//! Where the binaries under test are. The harness builds them once per test process with
//! cargo, so a test never runs a stale binary; `DIPAM_BIN_DIR` points at prebuilt ones
//! instead (e.g. a release build, or an installed /opt/cni/bin).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

/// The workspace root (two levels above this crate).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// Chooses the binaries' directory for this process (e.g. a benchmark's release build),
/// instead of `DIPAM_BIN_DIR` or a cargo build: no process environment to mutate. Returns
/// false when the directory was already chosen (set, or used by [`dir`]), which then stays.
pub fn set_dir(dir: PathBuf) -> bool {
    DIR.set(dir).is_ok()
}

/// The directory holding `dipam`, `dipamd`, `dipamctl` and the `azure-vnet-ipam` stand-in.
pub fn dir() -> &'static Path {
    DIR.get_or_init(|| {
        if let Some(d) = std::env::var_os("DIPAM_BIN_DIR") {
            return PathBuf::from(d);
        }
        // dipamd's crash points (`--crash-at`), for the fault-injection tests.
        build(false, &["--features", "dipam-shim/fault-injection"])
            .unwrap_or_else(|e| panic!("building the binaries under test: {e}"))
    })
}

/// Builds dipam's binaries (plugin, daemon, CLI, test doubles) with cargo, debug or release,
/// and returns the directory they are in.
pub fn build(release: bool, extra: &[&str]) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut args = vec!["build", "--quiet", "--bins"];
    if release {
        args.push("--release");
    }
    for p in ["dipam-plugin", "dipam-shim", "dipam-lifecycle"] {
        args.extend(["-p", p]);
    }
    args.extend_from_slice(extra);
    let status = Command::new(cargo)
        .current_dir(workspace())
        .args(&args)
        .status()
        .map_err(|e| format!("run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo {} failed", args.join(" ")));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    Ok(target.join(if release { "release" } else { "debug" }))
}

pub fn bin(name: &str) -> PathBuf {
    let p = dir().join(name);
    assert!(p.is_file(), "{} is missing", p.display());
    p
}

/// Where Debian's containernetworking-plugins installs the reference plugins.
pub const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

/// CNI_PATH for the runtime: our binaries first, then the reference plugins.
pub fn cni_path() -> String {
    let hl = Path::new(REFERENCE_PLUGINS).join("host-local");
    assert!(
        hl.is_file(),
        "{} is missing: install Debian's containernetworking-plugins (apt-get install \
         containernetworking-plugins), as .ci/run and tests/run.sh do",
        hl.display()
    );
    format!("{}:{REFERENCE_PLUGINS}", dir().display())
}

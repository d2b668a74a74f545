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
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(workspace())
            .args([
                "build",
                "--quiet",
                "--bins",
                "-p",
                "dipam-plugin",
                "-p",
                "dipam-shim",
                "-p",
                "dipam-lifecycle",
                // dipamd's crash points (`--crash-at`), for the fault-injection tests.
                "--features",
                "dipam-shim/fault-injection",
            ])
            .status()
            .expect("run cargo build for the binaries under test");
        assert!(
            status.success(),
            "cargo build of the binaries under test failed"
        );
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace().join("target"));
        target.join("debug")
    })
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

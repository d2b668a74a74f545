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
///
/// The directory is the one cargo reports for the plugin it built, not a guess: the workspace
/// builds for an explicit target (`.cargo/config.toml`: static binaries), so it is
/// `target/<host triple>/<profile>`, and a `CARGO_TARGET_DIR` or `--target` moves it again.
pub fn build(release: bool, extra: &[&str]) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut args = vec![
        "build",
        "--quiet",
        "--bins",
        "--message-format=json-render-diagnostics",
    ];
    if release {
        args.push("--release");
    }
    for p in ["dipam-plugin", "dipam-shim", "dipam-lifecycle"] {
        args.extend(["-p", p]);
    }
    args.extend_from_slice(extra);
    // Diagnostics still reach the terminal (stderr); stdout is cargo's JSON messages.
    let out = Command::new(cargo)
        .current_dir(workspace())
        .args(&args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo {} failed", args.join(" ")));
    }
    plugin_dir(&String::from_utf8_lossy(&out.stdout))
        .ok_or_else(|| format!("cargo {} did not report the dipam binary", args.join(" ")))
}

/// The directory of the `dipam` executable in cargo's `--message-format=json` output.
fn plugin_dir(messages: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "dipam")
        .find_map(|m| {
            let exe = Path::new(m["executable"].as_str()?);
            exe.parent().map(Path::to_path_buf)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_dir_is_where_cargo_put_the_plugin() {
        let messages = [
            r#"{"reason":"compiler-artifact","target":{"name":"dipamd","kind":["bin"]},"executable":"/w/target/x86_64-unknown-linux-gnu/release/dipamd"}"#,
            r#"{"reason":"compiler-artifact","target":{"name":"dipam_plugin","kind":["lib"]},"executable":null}"#,
            "not json",
            r#"{"reason":"compiler-artifact","target":{"name":"dipam","kind":["bin"]},"executable":"/w/target/x86_64-unknown-linux-gnu/release/dipam"}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        assert_eq!(
            plugin_dir(&messages),
            Some(PathBuf::from("/w/target/x86_64-unknown-linux-gnu/release"))
        );
        assert_eq!(
            plugin_dir(r#"{"reason":"build-finished","success":true}"#),
            None
        );
    }
}

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

/// The directory holding `dipam`, `dipamd`, `dipamctl` and the harness's tools.
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
/// and returns the directory they are in: the binaries users install, built the way they
/// build them (README "Install").
///
/// Everything is built for the host's target (`.cargo/config.toml`: static glibc). The
/// plugin, which the runtime execs for every CNI call, is also built against musl when that
/// Rust target is installed (tests/deps.sh adds it): glibc's start-up asks the CPU for its
/// cache sizes with dozens of `cpuid` instructions, each a VM exit on a virtual machine, and
/// a musl build starts ~0.6 ms sooner per call (docs/performance.md). The binaries are then
/// hard-linked together into `<target dir>/lifecycle/<profile>`, the musl `dipam` among the
/// others, because tests put one directory on CNI_PATH. Without the musl target the host
/// build's own directory is returned, and everything works the same, a little slower.
///
/// Paths are the ones cargo reports, not guesses (an explicit target, a `CARGO_TARGET_DIR`
/// or `--target` all move them).
pub fn build(release: bool, extra: &[&str]) -> Result<PathBuf, String> {
    let mut args = vec!["--bins"];
    for p in ["dipam-plugin", "dipam-shim", "dipam-ctl", "dipam-lifecycle"] {
        args.extend(["-p", p]);
    }
    args.extend_from_slice(extra);
    let host = executables(&cargo_build(release, &args)?);
    let plugin = host
        .iter()
        .find(|(name, _)| name == "dipam")
        .map(|(_, exe)| exe.clone())
        .ok_or("cargo did not report the dipam binary")?;
    let host_dir = plugin
        .parent()
        .map(Path::to_path_buf)
        .ok_or("the dipam binary has no directory")?;
    let Some(musl) = musl_target() else {
        return Ok(host_dir);
    };
    let musl_build = cargo_build(
        release,
        &["-p", "dipam-plugin", "--bin", "dipam", "--target", &musl],
    )?;
    let Some((_, musl_plugin)) = executables(&musl_build)
        .into_iter()
        .find(|(name, _)| name == "dipam")
    else {
        return Err(format!("cargo did not report the dipam binary for {musl}"));
    };
    // <target dir>/<host triple>/<profile> -> <target dir>/lifecycle/<profile>
    let profile = host_dir.file_name().ok_or("no profile directory")?;
    let target_dir = host_dir
        .ancestors()
        .nth(2)
        .ok_or("no target directory above the binaries")?;
    let dir = target_dir.join("lifecycle").join(profile);
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    for (name, exe) in host {
        let exe = if name == "dipam" { &musl_plugin } else { &exe };
        link(exe, &dir.join(&name))?;
    }
    Ok(dir)
}

/// Runs `cargo build` with `args` and returns its JSON messages.
fn cargo_build(release: bool, args: &[&str]) -> Result<String, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut all = vec![
        "build",
        "--quiet",
        "--message-format=json-render-diagnostics",
    ];
    if release {
        all.push("--release");
    }
    all.extend_from_slice(args);
    // Diagnostics still reach the terminal (stderr); stdout is cargo's JSON messages.
    let out = Command::new(cargo)
        .current_dir(workspace())
        .args(&all)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo {} failed", all.join(" ")));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every executable in cargo's `--message-format=json` output, by binary name.
fn executables(messages: &str) -> Vec<(String, PathBuf)> {
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter_map(|m| {
            let name = m["target"]["name"].as_str()?.to_owned();
            Some((name, PathBuf::from(m["executable"].as_str()?)))
        })
        .collect()
}

/// The musl twin of the host's target (`x86_64-unknown-linux-gnu` ->
/// `x86_64-unknown-linux-musl`) when its standard library is installed; `None` otherwise,
/// with a note on stderr the first time.
fn musl_target() -> Option<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let vv = Command::new(&rustc).arg("-vV").output().ok()?;
    let host = String::from_utf8_lossy(&vv.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))?;
    let musl = musl_twin(&host)?;
    let libdir = Command::new(&rustc)
        .args(["--print", "target-libdir", "--target", &musl])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if libdir.is_some_and(|d| d.is_dir()) {
        return Some(musl);
    }
    static NOTED: OnceLock<()> = OnceLock::new();
    NOTED.get_or_init(|| {
        eprintln!(
            "note: the Rust target {musl} is not installed, so the plugin is built against \
             glibc (~0.6 ms slower per CNI call); `rustup target add {musl}` (tests/deps.sh \
             does) builds it against musl"
        )
    });
    None
}

/// `<arch>-<vendor>-linux-gnu<abi>` -> `<arch>-<vendor>-linux-musl<abi>`.
fn musl_twin(host: &str) -> Option<String> {
    let (base, abi) = host.rsplit_once("-linux-gnu")?;
    Some(format!("{base}-linux-musl{abi}"))
}

/// Hard-links `exe` as `to` (a copy across file systems), replacing what was there: cargo
/// writes a rebuilt binary as a new file, so an old link would keep the old one.
fn link(exe: &Path, to: &Path) -> Result<(), String> {
    // Linked under a name of this process's, then renamed over `to` in one step: two test
    // processes starting at once (a developer's parallel runs) each replace the links, and
    // a remove-then-link let the loser of the race fall back to `copy`, which rewrote the
    // winner's link, the built binary itself, while the other process ran it ("Exec format
    // error" from dipamctl).
    let tmp = to.with_file_name(format!(
        ".{}.{}",
        to.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("remove {}: {e}", tmp.display())),
    }
    std::fs::hard_link(exe, &tmp)
        .or_else(|_| std::fs::copy(exe, &tmp).map(drop))
        .map_err(|e| format!("link {} as {}: {e}", exe.display(), tmp.display()))?;
    std::fs::rename(&tmp, to)
        .map_err(|e| format!("rename {} to {}: {e}", tmp.display(), to.display()))?;
    // rename(2) does nothing when both names are links to one file already (the binary did
    // not change): the temporary name is then still there.
    let _ = std::fs::remove_file(&tmp);
    Ok(())
}

pub fn bin(name: &str) -> PathBuf {
    let p = dir().join(name);
    assert!(p.is_file(), "{} is missing", p.display());
    p
}

/// dipam, dipamd and dipamctl copied into `to` without their debug info: a tenth of the bytes
/// of a debug build (~400 MB) to copy around, as a release build would be.
pub fn copy_stripped(to: &Path) {
    std::fs::create_dir_all(to).expect("create the directory for the binaries");
    for name in ["dipam", "dipamd", "dipamctl"] {
        crate::cmd::run(
            Command::new("strip")
                .arg("--strip-debug")
                .arg("-o")
                .arg(to.join(name))
                .arg(dir().join(name)),
        );
    }
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
    fn executables_are_what_cargo_reported() {
        let messages = [
            r#"{"reason":"compiler-artifact","target":{"name":"dipamd","kind":["bin"]},"executable":"/w/target/x86_64-unknown-linux-gnu/release/dipamd"}"#,
            r#"{"reason":"compiler-artifact","target":{"name":"dipam_plugin","kind":["lib"]},"executable":null}"#,
            "not json",
            r#"{"reason":"compiler-artifact","target":{"name":"dipam","kind":["bin"]},"executable":"/w/target/x86_64-unknown-linux-gnu/release/dipam"}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        assert_eq!(
            executables(&messages),
            [
                (
                    "dipamd".to_owned(),
                    PathBuf::from("/w/target/x86_64-unknown-linux-gnu/release/dipamd")
                ),
                (
                    "dipam".to_owned(),
                    PathBuf::from("/w/target/x86_64-unknown-linux-gnu/release/dipam")
                ),
            ]
        );
        assert!(executables(r#"{"reason":"build-finished","success":true}"#).is_empty());
    }

    #[test]
    fn the_musl_twin_of_a_gnu_host() {
        assert_eq!(
            musl_twin("x86_64-unknown-linux-gnu").as_deref(),
            Some("x86_64-unknown-linux-musl")
        );
        assert_eq!(
            musl_twin("arm-unknown-linux-gnueabihf").as_deref(),
            Some("arm-unknown-linux-musleabihf")
        );
        assert_eq!(musl_twin("x86_64-unknown-linux-musl"), None);
        assert_eq!(musl_twin("aarch64-apple-darwin"), None);
    }
}

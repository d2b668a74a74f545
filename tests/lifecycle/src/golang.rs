//! Test binaries of this repository's Go modules (examples/go-agent), built with the
//! machine's Go (tests/peers/build.sh needs it too) from the Go module proxy, the first time a
//! test asks. `go test -c` makes one binary of a module's tests, which the lifecycle test runs
//! against its own dipamd, as root or as another uid.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

/// The machine's `go`: on PATH, or Go's default install directory.
pub fn go() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("go"))
        .find(|p| p.is_file());
    on_path
        .or_else(|| Some(PathBuf::from("/usr/local/go/bin/go")).filter(|p| p.is_file()))
        .expect("Go is not installed: tests/peers/build.sh and this test need the machine's Go")
}

/// `go test -c` of the module in `module` (relative to the workspace), into `dir` as `name`,
/// executable by every uid; its path. Panics with Go's output when it does not build.
pub fn test_binary(module: &str, dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    let built = Command::new(go())
        .current_dir(crate::bins::workspace().join(module))
        .args(["test", "-c", "-trimpath", "-o"])
        .arg(&out)
        .arg(".")
        // The machine's Go, never a toolchain a go.mod would download, and go.sum as
        // committed.
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=readonly")
        .output()
        .expect("run go test -c");
    assert!(
        built.status.success(),
        "go test -c {module}: {}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755))
        .expect("make the test binary executable by all");
    out
}

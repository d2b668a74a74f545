//! The lifecycle harness: it acts as the container runtime. It owns network namespaces, temp
//! directories and dipamd processes through guards that clean up on drop, and drives the
//! built binaries (never the crates: it links no dipam library) with the conflists from
//! `conflist/`, following libcni's semantics: chain order, prevResult, DEL in reverse order,
//! and a result cache.

pub mod agentlab;
pub mod azure;
pub mod bins;
pub mod bodies;
pub mod clock;
pub mod cluster;
pub mod cmd;
pub mod containerd;
pub mod cri;
pub mod crio;
pub mod daemon;
pub mod deployment;
pub mod deps;
pub mod examples;
pub mod fixture;
pub mod flood;
pub mod golang;
pub mod hostlocal;
pub mod kubeapi;
pub mod lab;
pub mod libcni;
pub mod links;
pub mod netns;
pub mod nobody;
pub mod peers;
pub mod podman;
pub mod replay;
pub mod require;
pub mod restrictions;
pub mod runtime;
pub mod scenario;
pub mod shapes;
pub mod unit_file;
pub mod yaml;

pub use agentlab::AgentLab;
pub use containerd::Containerd;
pub use daemon::Dipamd;
pub use fixture::{Fixture, Subnet};
pub use kubeapi::KubeApi;
pub use lab::Lab;
pub use netns::NetNs;
pub use replay::Replay;
pub use runtime::{Attachment, CniError, Runtime};

/// Lifecycle tests need root (network namespaces, veths). Elsewhere they say so loudly and
/// pass without running; on CI, where they run as root, not being root fails them
/// (require.rs).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Returns early from a test when not root, under the one rule of [`require!`].
#[macro_export]
macro_rules! require_root {
    () => {
        $crate::require!($crate::require::root())
    };
}

/// A temp directory named `prefix...`, removed on drop: the prefix says, in a listing of /tmp
/// after a failure, which part of the harness left it.
#[track_caller]
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .unwrap_or_else(|e| panic!("a temp dir {prefix}*: {e}"))
}

/// The number in the environment variable `name` (a test's `DIPAM_*_RUNS`, `DIPAM_*_PODS`:
/// run it longer or larger to hunt a race or a limit), else `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A unique-enough suffix for names in this process (netns, container IDs).
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The entry of the JSON array `list` whose `name` is `name`: a check of `dipamctl doctor
/// --json`, a container or volume of a manifest. The test fails, showing the list, when there
/// is none.
#[track_caller]
pub fn named<'a>(list: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    entry(list, "name", name)
}

/// The entry of the JSON array `list` whose `key` is `value` (a support bundle's part by its
/// `part`, ...). The test fails, showing the list, when there is none.
#[track_caller]
pub fn entry<'a>(list: &'a serde_json::Value, key: &str, value: &str) -> &'a serde_json::Value {
    list.as_array()
        .and_then(|l| l.iter().find(|e| e[key] == value))
        .unwrap_or_else(|| panic!("no entry with {key} {value:?} in {list:#}"))
}

/// The permission bits of the file `p` (as `chmod` takes them).
#[track_caller]
pub fn mode(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Cargo finds test binaries by itself only at `tests/*.rs` and `tests/*/main.rs`: a file put
/// in a feature folder without its `[[test]]` entry in Cargo.toml is never built and never
/// run, and nothing says so. This fails instead, naming the file and the entry to add.
#[cfg(test)]
mod every_test_file_is_built {
    use std::path::Path;

    fn rust_files(dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p.display().to_string());
            }
        }
    }

    #[test]
    fn each_file_under_tests_is_a_test_binary_of_cargo_toml() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
        let mut files = Vec::new();
        rust_files(&root.join("tests"), &mut files);
        assert!(files.len() > 50, "only {} test files found", files.len());
        let missing: Vec<String> = files
            .iter()
            .map(|f| {
                f.trim_start_matches(&format!("{}/", root.display()))
                    .to_owned()
            })
            .filter(|rel| !manifest.contains(&format!("path = \"{rel}\"")))
            .collect();
        assert!(
            missing.is_empty(),
            "never built: add to tests/lifecycle/Cargo.toml, for each,\n[[test]]\nname = \"<file \
             stem>\"\npath = \"<the path below>\"\n\n{missing:#?}"
        );
    }
}

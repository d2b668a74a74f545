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

//! The real peers (Go binaries built at pinned versions by tests/deps.sh) as the tests find
//! them: `$DIPAM_TEST_CACHE/peers/peers.json` (default /var/cache/dipam-tests), a JSON object
//! keyed by binary name, each `{"module", "version", "path"}`.
//!
//! A missing peer is never a silent pass: on CI (`CI=true`) it fails the test; elsewhere the
//! test says loudly that it skipped and why.

use std::path::PathBuf;

use serde_json::Value;

/// One built peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub module: String,
    pub version: String,
    pub path: PathBuf,
}

impl Peer {
    /// `module@version`, for logs and the compatibility matrix.
    pub fn label(&self) -> String {
        format!("{} {}@{}", self.name, self.module, self.version)
    }
}

fn manifest() -> PathBuf {
    crate::deps::cache().join("peers").join("peers.json")
}

/// The peer `name`, or why it is not there.
pub fn find(name: &str) -> Result<Peer, String> {
    let path = manifest();
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "{} is not readable ({e}): tests/deps.sh builds the real peers and writes it",
            path.display()
        )
    })?;
    let all: Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let entry = all.get(name).ok_or_else(|| {
        let why = crate::deps::cache()
            .join("peers")
            .join(format!("{name}.unavailable"));
        match std::fs::read_to_string(&why) {
            Ok(reason) => format!("{name} was not built: {}", reason.trim()),
            Err(_) => format!("{} has no entry for {name}", path.display()),
        }
    })?;
    let field = |k: &str| entry[k].as_str().unwrap_or_default().to_owned();
    let bin = PathBuf::from(field("path"));
    if !bin.is_file() {
        return Err(format!(
            "{name} is recorded at {} in {}, but no file is there",
            bin.display(),
            path.display()
        ));
    }
    Ok(Peer {
        name: name.to_owned(),
        module: field("module"),
        version: field("version"),
        path: bin,
    })
}

/// Every peer in `names`, or `None` after saying why the test skips. On CI a missing peer
/// panics instead: CI must prove what it claims. `test` is the caller's `module_path!()`.
pub fn require(test: &str, names: &[&str]) -> Option<Vec<Peer>> {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for n in names {
        match find(n) {
            Ok(p) => found.push(p),
            Err(e) => missing.push(e),
        }
    }
    if missing.is_empty() {
        return Some(found);
    }
    let why = missing.join("; ");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("a real peer is missing on CI (tests/deps.sh must build it): {why}");
    }
    eprintln!("\n*** SKIPPED {test}: {why} ***\n");
    None
}

/// Returns early from a test when a real peer is missing (a failure on CI); otherwise binds
/// the peers found, in the order named.
#[macro_export]
macro_rules! require_peers {
    ($($name:expr),+ $(,)?) => {
        match $crate::peer_bins::require(module_path!(), &[$($name),+]) {
            Some(p) => p,
            None => return,
        }
    };
}

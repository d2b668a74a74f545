//! The real peers tests/peers/build.sh (run by tests/deps.sh) builds from the Go module proxy:
//! libcni's cnitool and the project's libcni driver, today's reference plugins,
//! azure-vnet-ipam, containerd 2, crictl and CRI-O. It records each in
//! `$DIPAM_TEST_CACHE/peers/peers.json` (`{"NAME": {"module", "version", "path", ...}}`), or,
//! when one could not be built, the reason in `peers/NAME.unavailable`.
//!
//! A missing peer is never a silent pass: on CI (`CI` set) it fails the test; elsewhere a
//! test skips loudly only when tests/deps.sh recorded why the peer cannot be built here.

use std::path::{Path, PathBuf};

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
    /// `name module@version`, for logs and the compatibility matrix.
    pub fn label(&self) -> String {
        format!("{} {}@{}", self.name, self.module, self.version)
    }

    /// The directory holding the binary: for the plugins, a directory to put on CNI_PATH
    /// (tests/peers/build.sh puts every plugin of one module version in one directory).
    pub fn dir(&self) -> PathBuf {
        self.path
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    }
}

/// `$DIPAM_TEST_CACHE/peers`.
pub fn dir() -> PathBuf {
    crate::deps::cache().join("peers")
}

fn lookup(name: &str) -> Result<Peer, String> {
    let file = dir().join("peers.json");
    let unavailable = dir().join(format!("{name}.unavailable"));
    let why = || {
        std::fs::read_to_string(&unavailable)
            .map(|w| {
                format!(
                    "; tests/deps.sh recorded why in {}: {}",
                    unavailable.display(),
                    w.trim()
                )
            })
            .unwrap_or_default()
    };
    let text = std::fs::read_to_string(&file).map_err(|e| {
        format!(
            "{} cannot be read ({e}): run tests/deps.sh, which builds the real peers \
             (tests/peers/build.sh){}",
            file.display(),
            why()
        )
    })?;
    let all: Value = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not JSON ({e}): run tests/deps.sh again",
            file.display()
        )
    })?;
    let entry = &all[name];
    let s = |k: &str| entry[k].as_str().map(str::to_owned);
    match (s("module"), s("version"), s("path")) {
        (Some(module), Some(version), Some(path)) if Path::new(&path).is_file() => Ok(Peer {
            name: name.to_owned(),
            module,
            version,
            path: PathBuf::from(path),
        }),
        (_, _, Some(path)) => Err(format!(
            "peer {name} is recorded in {} at {path}, which is gone: run tests/deps.sh",
            file.display()
        )),
        _ => Err(format!(
            "peer {name} is not in {}: run tests/deps.sh, which builds it from \
             tests/peers/pins{}",
            file.display(),
            why()
        )),
    }
}

/// The peer `name`, or a panic that says why it is missing and what builds it. For tests
/// that cannot mean anything without it.
#[track_caller]
pub fn require(name: &str) -> Peer {
    lookup(name).unwrap_or_else(|why| panic!("{why}"))
}

/// The peer `name`, or `None` after saying loudly why not, when tests/deps.sh recorded that
/// it cannot be built here and CI is not set. With CI set, or with no recorded reason, a
/// missing peer is a failure: never a silent pass. `test` is the caller's `module_path!()`.
#[track_caller]
pub fn get(test: &str, name: &str) -> Option<Peer> {
    all(test, &[name]).map(|mut v| v.remove(0))
}

/// Every peer in `names`, in that order, or `None` (after saying why the test skips) under
/// the rule of [`get`].
#[track_caller]
pub fn all(test: &str, names: &[&str]) -> Option<Vec<Peer>> {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    let mut unrecorded = false;
    for n in names {
        match lookup(n) {
            Ok(p) => found.push(p),
            Err(why) => {
                unrecorded |= !dir().join(format!("{n}.unavailable")).is_file();
                missing.push(why);
            }
        }
    }
    if missing.is_empty() {
        return Some(found);
    }
    let why = missing.join("; ");
    if unrecorded {
        panic!("a real peer is missing (tests/deps.sh must build it): {why}");
    }
    crate::require::missing(test, &why);
    None
}

/// Returns early from a test when a real peer is missing and tests/deps.sh recorded why (a
/// failure on CI); otherwise binds the peers found, in the order named.
#[macro_export]
macro_rules! require_peers {
    ($($name:expr),+ $(,)?) => {
        match $crate::peers::all(module_path!(), &[$($name),+]) {
            Some(p) => p,
            None => return,
        }
    };
}

/// CNI_PATH with the harness's binaries (dipam, the stand-ins) first, then the reference
/// plugins of `plugins`: the directory of the built `host-local` (all of one version), or
/// Debian's /usr/lib/cni for [`Plugins::Debian`].
pub fn cni_path(plugins: Plugins) -> String {
    format!(
        "{}:{}",
        crate::bins::dir().display(),
        plugins.dir().display()
    )
}

/// Which reference plugins a test runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plugins {
    /// Debian 12's containernetworking-plugins 1.1.1 in /usr/lib/cni.
    Debian,
    /// The pinned current release, built by tests/peers/build.sh.
    Current,
}

impl Plugins {
    pub fn dir(self) -> PathBuf {
        match self {
            Self::Debian => PathBuf::from(crate::bins::REFERENCE_PLUGINS),
            Self::Current => require("host-local").dir(),
        }
    }

    /// The plugins' version, for messages and the compatibility matrix.
    pub fn version(self) -> String {
        match self {
            Self::Debian => "1.1.1 (Debian 12)".into(),
            Self::Current => require("host-local").version,
        }
    }

    /// The newest cniVersion these plugins accept in a config.
    pub fn max_cni_version(self) -> &'static str {
        match self {
            Self::Debian => "1.0.0",
            Self::Current => "1.1.0",
        }
    }
}

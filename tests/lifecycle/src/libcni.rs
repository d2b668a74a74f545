//! The reference runtime library, libcni (github.com/containernetworking/cni), driving dipam
//! for real, through two clients tests/peers/build.sh builds:
//! - [`LibCni`]: the project's driver over libcni's Go API (tests/lifecycle/go/libcni-driver),
//!   the calls containerd and CRI-O make: `AddNetworkList`, `CheckNetworkList`,
//!   `DelNetworkList`, `GCNetworkList` (with a valid list, as CRI-O passes one) and
//!   `GetStatusNetworkList`, with its own result cache directory;
//! - [`CniTool`]: libcni's own command-line client, `cnitool`, which GCs with no valid list.
//!
//! [`crate::Runtime`] is the project's emulation of the same library; tests/runtimes/libcni.rs runs
//! one sequence through both and compares them.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::{Attachment, CniError, peers};

/// What a GC passes as the valid list (libcni `GCArgs`).
#[derive(Debug, Clone)]
pub enum Valid {
    /// No `GCArgs` at all: no `cni.dev/valid-attachments` key is sent, and libcni DELs every
    /// attachment it cached for the network first (what cnitool does).
    Absent,
    /// `GCArgs` with a nil list: the key is sent as `null` (CRI-O, for a network without pods).
    Null,
    /// These attachments are valid.
    List(Vec<Attachment>),
}

/// libcni through the project's driver, with a result cache of its own.
pub struct LibCni {
    driver: PeerPath,
    pub cni_path: String,
    pub cache: TempDir,
}

struct PeerPath(PathBuf);

impl LibCni {
    /// A libcni runtime searching `cni_path` for plugins.
    #[track_caller]
    pub fn new(cni_path: String) -> Self {
        Self {
            driver: PeerPath(peers::require("libcni-driver").path),
            cni_path,
            cache: crate::temp_dir("libcni-cache-"),
        }
    }

    fn request(&self, op: &str, list: &Value, att: &Attachment) -> Value {
        let args: Vec<[String; 2]> = att
            .args
            .split(';')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                [k.to_owned(), v.to_owned()]
            })
            .collect();
        json!({
            "op": op,
            "conflist": list,
            "pluginDirs": self.cni_path.split(':').collect::<Vec<_>>(),
            "cacheDir": self.cache.path(),
            "containerID": att.container_id,
            "netns": att.netns,
            "ifName": att.ifname,
            "args": args,
            "capabilityArgs": att.capability_args,
        })
    }

    /// Runs the driver with `req`; its answer, or libcni's error as a [`CniError`].
    pub fn call(&self, req: &Value) -> Result<Value, CniError> {
        let mut child = Command::new(&self.driver.0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {}: {e}", self.driver.0.display()));
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(&serde_json::to_vec(req).expect("request JSON"))
                .expect("write the request");
        }
        let out = child
            .wait_with_output()
            .expect("wait for the libcni driver");
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "the libcni driver answered no JSON ({e}): stdout {:?} stderr {:?}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        if answer["ok"] == true {
            return Ok(answer["result"].clone());
        }
        let e = &answer["error"];
        let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
        Err(CniError {
            plugin: "libcni".into(),
            exit: out.status.code().unwrap_or(-1),
            code: e["code"].as_u64().unwrap_or(0),
            msg: s("msg"),
            details: s("details"),
            stderr: s("text"),
        })
    }

    /// `AddNetworkList`: the chain's result, in the list's cniVersion, cached by libcni.
    pub fn add(&self, list: &Value, att: &Attachment) -> Result<Value, CniError> {
        self.call(&self.request("add", list, att))
    }

    /// `CheckNetworkList` (libcni refuses it below 0.4.0 without exec'ing anything).
    pub fn check(&self, list: &Value, att: &Attachment) -> Result<(), CniError> {
        self.call(&self.request("check", list, att)).map(drop)
    }

    /// `DelNetworkList`, with the cached result as prevResult (>= 0.4.0).
    pub fn del(&self, list: &Value, att: &Attachment) -> Result<(), CniError> {
        self.call(&self.request("del", list, att)).map(drop)
    }

    /// `GetStatusNetworkList`: every top-level plugin, first error wins; nothing below 1.1.0.
    pub fn status(&self, list: &Value) -> Result<(), CniError> {
        self.call(&self.request("status", list, &Attachment::new("", "")))
            .map(drop)
    }

    /// `GCNetworkList`: a DEL for every cached attachment of the network that `valid` does not
    /// name, then (>= 1.1.0) GC on every top-level plugin.
    pub fn gc(&self, list: &Value, valid: &Valid) -> Result<(), CniError> {
        let mut req = self.request("gc", list, &Attachment::new("", ""));
        match valid {
            Valid::Absent => {}
            Valid::Null => req["validAttachments"] = Value::Null,
            Valid::List(atts) => {
                req["validAttachments"] = atts.iter().map(crate::runtime::gc_entry).collect();
            }
        }
        self.call(&req).map(drop)
    }

    /// What libcni cached for `att` (what a later CHECK or DEL sends as prevResult).
    pub fn cached(&self, list: &Value, att: &Attachment) -> Option<Value> {
        self.call(&self.request("cached", list, att))
            .ok()
            .filter(|v| !v.is_null())
    }

    /// Drops libcni's cache entry of `att`, as a runtime that lost its cache (a wiped
    /// /var/lib/cni, a crash between the ADD and the cache write) has none: libcni's GC then
    /// knows nothing of that attachment, and only the plugin's GC can free it.
    pub fn forget(&self, list: &Value, att: &Attachment) {
        let name = format!(
            "{}-{}-{}",
            list["name"].as_str().unwrap_or_default(),
            att.container_id,
            att.ifname
        );
        let path = self.cache.path().join("results").join(name);
        std::fs::remove_file(&path)
            .unwrap_or_else(|e| panic!("remove libcni's cache entry {}: {e}", path.display()));
    }
}

/// libcni's own client, `cnitool`, with the conflist in a directory of its own (NETCONFPATH).
/// It caches results in libcni's default /var/lib/cni, as it has no option for another.
pub struct CniTool {
    bin: PathBuf,
    pub cni_path: String,
    pub netdir: TempDir,
}

impl CniTool {
    #[track_caller]
    pub fn new(cni_path: String, list: &Value) -> Self {
        let netdir = crate::temp_dir("cnitool-net-");
        std::fs::write(
            netdir.path().join("10-net.conflist"),
            serde_json::to_vec_pretty(list).expect("json"),
        )
        .expect("write the conflist");
        Self {
            bin: peers::require("cnitool").path,
            cni_path,
            netdir,
        }
    }

    /// `cnitool VERB NETWORK NETNS`; cnitool names the container `cnitool-<hash of netns>`.
    pub fn run(&self, verb: &str, network: &str, netns: &Path) -> Output {
        Command::new(&self.bin)
            .args([verb, network])
            .arg(netns)
            .env("NETCONFPATH", self.netdir.path())
            .env("CNI_PATH", &self.cni_path)
            .output()
            .unwrap_or_else(|e| panic!("run cnitool: {e}"))
    }
}

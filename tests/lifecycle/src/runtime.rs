//! A container runtime in miniature, with libcni's semantics (docs/sources.md §5, §10.3):
//! - ADD runs the chain in order, each plugin getting the previous result as prevResult, and
//!   caches the final result;
//! - CHECK runs in order with the cached result as prevResult (only for cniVersion >= 0.4.0,
//!   which libcni enforces before exec);
//! - DEL runs in reverse order with the cached result as prevResult (>= 0.4.0), then drops
//!   the cache entry;
//! - every call gets the six CNI_* variables, "" for the ones it does not use;
//! - `runtimeConfig` carries the attachment's capability args, for each plugin only the
//!   capabilities it declares `true` in `capabilities` (libcni `injectRuntimeConfig`,
//!   docs/sources.md §2.2);
//! - the list's version is the highest of `cniVersion` and `cniVersions` that libcni
//!   implements (1.1.0 for libcni 1.3), and every plugin gets it (libcni `NetworkConfFromBytes`);
//! - CHECK below 0.4.0 is an error from libcni itself, no plugin runs; `disableCheck` and
//!   `disableGC` make CHECK and GC succeed without running anything;
//! - GC ([`Runtime::gc`]) DELs every cached attachment of the network the valid list does not
//!   name, then (>= 1.1.0) runs GC on every plugin of the list, with the list under both keys
//!   when one is given; STATUS ([`Runtime::status`]) runs on every plugin (>= 1.1.0) and stops
//!   at the first error (libcni `GCNetworkList`, `GetStatusNetworkList`).
//!
//! tests/runtimes/libcni.rs runs the same sequences through this emulation and through real libcni
//! (docs/sources.md §13 says what differed before they agreed).

use std::{
    collections::HashMap,
    io::Write,
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
};

use serde_json::{Value, json};

/// What a runtime knows about one attachment.
#[derive(Debug, Clone)]
pub struct Attachment {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    /// What the runtime offers for capabilities (`portMappings`, `dns`, ...), by name, in the
    /// runtime's own JSON (containerd capitalises keys, podman does not).
    pub capability_args: serde_json::Map<String, Value>,
}

impl Attachment {
    pub fn new(container_id: &str, netns: &str) -> Self {
        Self {
            container_id: container_id.into(),
            netns: netns.into(),
            ifname: "eth0".into(),
            args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=lifecycle".into(),
            capability_args: serde_json::Map::new(),
        }
    }

    pub fn with_ifname(mut self, ifname: &str) -> Self {
        self.ifname = ifname.into();
        self
    }

    /// Offers `value` for capability `cap` (e.g. `portMappings`).
    pub fn with_capability(mut self, cap: &str, value: Value) -> Self {
        self.capability_args.insert(cap.into(), value);
        self
    }
}

/// A failed plugin call, as libcni reports it.
#[derive(Debug, Clone)]
pub struct CniError {
    pub plugin: String,
    pub exit: i32,
    pub code: u64,
    pub msg: String,
    pub details: String,
    pub stderr: String,
}

impl std::fmt::Display for CniError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} failed (exit {}): code {} {:?} details {:?}; stderr: {}",
            self.plugin, self.exit, self.code, self.msg, self.details, self.stderr
        )
    }
}

/// The raw outcome of one exec.
#[derive(Debug)]
pub struct Exec {
    pub status: std::process::ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Exec {
    pub fn into_result(self, plugin: &str) -> Result<Value, CniError> {
        let stderr = String::from_utf8_lossy(&self.stderr).into_owned();
        if self.status.success() {
            if self.stdout.iter().all(u8::is_ascii_whitespace) {
                return Ok(Value::Null);
            }
            return serde_json::from_slice(&self.stdout).map_err(|e| CniError {
                plugin: plugin.into(),
                exit: 0,
                code: 0,
                msg: format!("result is not JSON: {e}"),
                details: String::from_utf8_lossy(&self.stdout).into_owned(),
                stderr,
            });
        }
        let json: Value = serde_json::from_slice(&self.stdout).unwrap_or(Value::Null);
        Err(CniError {
            plugin: plugin.into(),
            exit: self.status.code().unwrap_or(-1),
            code: json["code"].as_u64().unwrap_or(0),
            msg: json["msg"].as_str().unwrap_or_default().into(),
            details: json["details"].as_str().unwrap_or_default().into(),
            stderr,
        })
    }
}

/// (network, container ID, ifname), as libcni keys its cache.
type CacheKey = (String, String, String);

pub struct Runtime {
    pub cni_path: String,
    /// The result cache: (network, container ID, ifname) -> final ADD result, and the
    /// attachment it was made for (libcni caches the netns, CNI_ARGS and capability args
    /// with the result; its GC's DELs use them).
    cache: Mutex<HashMap<CacheKey, (Value, Attachment)>>,
}

fn version_at_least(v: &str, floor: (u32, u32)) -> bool {
    version_tuple(v) >= (floor.0, floor.1, 0)
}

fn version_tuple(v: &str) -> (u32, u32, u32) {
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
    )
}

/// The newest spec version libcni 1.3 implements.
pub const LIBCNI_CURRENT: &str = "1.1.0";

/// The version libcni gives a list: the highest of `cniVersion` and the `cniVersions` array
/// that it implements (entries above [`LIBCNI_CURRENT`] are skipped), `cniVersion` alone when
/// there is no array.
pub fn list_version(list: &Value) -> String {
    let single = list["cniVersion"].as_str().unwrap_or_default().to_owned();
    let Some(many) = list["cniVersions"].as_array() else {
        return single;
    };
    let cur = version_tuple(LIBCNI_CURRENT);
    many.iter()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .chain((!single.is_empty()).then_some(single))
        .filter(|v| version_tuple(v) <= cur)
        .max_by_key(|v| version_tuple(v))
        .unwrap_or_default()
}

fn flag(list: &Value, key: &str) -> bool {
    match &list[key] {
        Value::Bool(b) => *b,
        Value::String(s) => s.eq_ignore_ascii_case("true"),
        _ => false,
    }
}

/// The error libcni returns itself, without running a plugin.
fn libcni_error(msg: String) -> CniError {
    CniError {
        plugin: "libcni".into(),
        exit: 0,
        code: 0,
        msg,
        details: String::new(),
        stderr: String::new(),
    }
}

impl Runtime {
    /// A runtime whose CNI_PATH searches `dir` of stand-in delegates (shell scripts, one per
    /// `(name, body)`) before the real plugins, as a node with an extra plugin directory
    /// would. The directory lives as long as the returned guard.
    pub fn with_standins(scripts: &[(&str, &str)]) -> (tempfile::TempDir, Self) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, body) in scripts {
            let p = dir.path().join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write a stand-in");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
                .expect("make a stand-in executable");
        }
        let rt = Self::new(format!(
            "{}:{}",
            dir.path().display(),
            crate::bins::cni_path()
        ));
        (dir, rt)
    }

    pub fn new(cni_path: String) -> Self {
        Self {
            cni_path,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Finds a plugin the way libcni does: the first regular file named `kind` in CNI_PATH.
    pub fn find(&self, kind: &str) -> PathBuf {
        self.cni_path
            .split(':')
            .map(|d| Path::new(d).join(kind))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("plugin {kind} not found in {}", self.cni_path))
    }

    /// Execs one plugin with `config` on stdin.
    pub fn exec(&self, kind: &str, command: &str, att: &Attachment, config: &[u8]) -> Exec {
        self.exec_env(kind, command, att, config, &[])
    }

    /// Execs with extra or overriding environment (for malformed-input tests).
    pub fn exec_env(
        &self,
        kind: &str,
        command: &str,
        att: &Attachment,
        config: &[u8],
        env: &[(&str, &str)],
    ) -> Exec {
        let mut cmd = Command::new(self.find(kind));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &att.container_id)
            .env("CNI_NETNS", &att.netns)
            .env("CNI_IFNAME", &att.ifname)
            .env("CNI_ARGS", &att.args)
            .env("CNI_PATH", &self.cni_path);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = crate::cmd::spawn_piped(&mut cmd);
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(config);
        }
        let out = child.wait_with_output().expect("wait for plugin");
        Exec {
            status: out.status,
            stdout: out.stdout,
            stderr: out.stderr,
        }
    }

    /// An ADD of `container_id` straight through host-local, the delegate of `list`'s
    /// (IPAM-mode) dipam, as a second runtime sharing the store would make it: a reservation
    /// no attachment in dipamd's ledger owns.
    pub fn add_behind_dipams_back(&self, list: &Value, container_id: &str) -> Exec {
        let mut direct = Self::plugin_config(list, 0, None);
        direct["ipam"] = direct["ipam"]["delegate"].clone();
        let att = Attachment::new(container_id, "/var/run/netns/none");
        let config = serde_json::to_vec(&direct).expect("a config serialises");
        self.exec("host-local", "ADD", &att, &config)
    }

    /// The request config libcni derives for plugin `i` of `list` (spec §3): the plugin object
    /// plus the list's name and cniVersion, and prevResult when given.
    pub fn plugin_config(list: &Value, i: usize, prev: Option<&Value>) -> Value {
        let mut conf = list["plugins"][i].clone();
        conf["name"] = list["name"].clone();
        conf["cniVersion"] = json!(list_version(list));
        if let Some(p) = prev.filter(|p| !p.is_null()) {
            conf["prevResult"] = p.clone();
        }
        conf
    }

    /// `plugin_config` plus `runtimeConfig` for the ADD/CHECK/DEL of `att`: a capability's
    /// value goes in only when plugin `i` declares it and the runtime has one; the key is left
    /// out when nothing matches (libcni `injectRuntimeConfig`).
    pub fn request_config(list: &Value, i: usize, prev: Option<&Value>, att: &Attachment) -> Value {
        let mut conf = Self::plugin_config(list, i, prev);
        let mut rc = serde_json::Map::new();
        if let Some(caps) = conf["capabilities"].as_object() {
            for (cap, on) in caps {
                if on.as_bool() == Some(true)
                    && let Some(v) = att.capability_args.get(cap)
                {
                    rc.insert(cap.clone(), v.clone());
                }
            }
        }
        if !rc.is_empty() {
            conf["runtimeConfig"] = Value::Object(rc);
        }
        conf
    }

    fn key(list: &Value, att: &Attachment) -> CacheKey {
        (
            list["name"].as_str().unwrap_or_default().to_owned(),
            att.container_id.clone(),
            att.ifname.clone(),
        )
    }

    pub fn cached(&self, list: &Value, att: &Attachment) -> Option<Value> {
        self.cache
            .lock()
            .ok()
            .and_then(|c| c.get(&Self::key(list, att)).map(|(v, _)| v.clone()))
    }

    /// ADD through the whole chain; on success the result is cached.
    pub fn add(&self, list: &Value, att: &Attachment) -> Result<Value, CniError> {
        let mut prev: Option<Value> = None;
        let n = list["plugins"].as_array().map_or(0, Vec::len);
        for i in 0..n {
            let conf = Self::request_config(list, i, prev.as_ref(), att);
            let kind = conf["type"].as_str().unwrap_or_default().to_owned();
            let bytes = serde_json::to_vec(&conf).unwrap_or_default();
            let result = self.exec(&kind, "ADD", att, &bytes).into_result(&kind)?;
            prev = Some(typed_result(result));
        }
        let result = prev.unwrap_or(Value::Null);
        if let Ok(mut c) = self.cache.lock() {
            c.insert(Self::key(list, att), (result.clone(), att.clone()));
        }
        Ok(result)
    }

    /// CHECK through the chain with the cached result (libcni refuses it below 0.4.0).
    pub fn check(&self, list: &Value, att: &Attachment) -> Result<(), CniError> {
        let version = list_version(list);
        if !version_at_least(&version, (0, 4)) {
            return Err(libcni_error(format!(
                "configuration version \"{version}\" does not support the CHECK command"
            )));
        }
        if flag(list, "disableCheck") {
            return Ok(());
        }
        let prev = self.cached(list, att);
        let n = list["plugins"].as_array().map_or(0, Vec::len);
        for i in 0..n {
            let conf = Self::request_config(list, i, prev.as_ref(), att);
            let kind = conf["type"].as_str().unwrap_or_default().to_owned();
            let bytes = serde_json::to_vec(&conf).unwrap_or_default();
            self.exec(&kind, "CHECK", att, &bytes).into_result(&kind)?;
        }
        Ok(())
    }

    /// DEL in reverse order; the cache entry goes once the whole chain succeeded.
    pub fn del(&self, list: &Value, att: &Attachment) -> Result<(), CniError> {
        let version = list_version(list);
        let prev = if version_at_least(&version, (0, 4)) {
            self.cached(list, att)
        } else {
            None
        };
        let n = list["plugins"].as_array().map_or(0, Vec::len);
        for i in (0..n).rev() {
            let conf = Self::request_config(list, i, prev.as_ref(), att);
            let kind = conf["type"].as_str().unwrap_or_default().to_owned();
            let bytes = serde_json::to_vec(&conf).unwrap_or_default();
            self.exec(&kind, "DEL", att, &bytes).into_result(&kind)?;
        }
        if let Ok(mut c) = self.cache.lock() {
            c.remove(&Self::key(list, att));
        }
        Ok(())
    }

    /// GC as libcni runs it (`GCNetworkList`): a DEL through the chain for every attachment
    /// of this network in the cache that `valid` does not name (every one when `valid` is
    /// `None`, as cnitool passes no list), then, for cniVersion >= 1.1.0, GC on every plugin
    /// of the list, with `cni.dev/valid-attachments` and the legacy `cni.dev/attachments`
    /// when a list (or null) is given. Errors are collected; every plugin still runs.
    pub fn gc(&self, list: &Value, valid: Option<&Value>) -> Result<(), Vec<CniError>> {
        if flag(list, "disableGC") {
            return Ok(());
        }
        let name = list["name"].as_str().unwrap_or_default();
        let keep = |cid: &str, ifname: &str| {
            valid.and_then(Value::as_array).is_some_and(|v| {
                v.iter()
                    .any(|e| e["containerID"] == cid && e["ifname"] == ifname)
            })
        };
        let stale: Vec<Attachment> = self
            .cache
            .lock()
            .map(|c| {
                c.iter()
                    .filter(|((net, cid, ifname), _)| net == name && !keep(cid, ifname))
                    .map(|(_, (_, att))| att.clone())
                    .collect()
            })
            .unwrap_or_default();
        let mut errs = Vec::new();
        for att in stale {
            if let Err(e) = self.del(list, &att) {
                errs.push(e);
            }
        }
        if version_at_least(&list_version(list), (1, 1)) {
            let n = list["plugins"].as_array().map_or(0, Vec::len);
            for i in 0..n {
                let mut conf = Self::plugin_config(list, i, None);
                if let Some(v) = valid {
                    conf["cni.dev/valid-attachments"] = v.clone();
                    conf["cni.dev/attachments"] = v.clone();
                }
                let kind = conf["type"].as_str().unwrap_or_default().to_owned();
                let bytes = serde_json::to_vec(&conf).unwrap_or_default();
                let none = Attachment::new("", "").with_ifname("");
                let none = Attachment {
                    args: String::new(),
                    ..none
                };
                if let Err(e) = self.exec(&kind, "GC", &none, &bytes).into_result(&kind) {
                    errs.push(e);
                }
            }
        }
        if errs.is_empty() { Ok(()) } else { Err(errs) }
    }

    /// STATUS as libcni runs it (`GetStatusNetworkList`): nothing below cniVersion 1.1.0;
    /// otherwise every plugin of the list in order, with empty CNI_* variables, stopping at
    /// the first error.
    pub fn status(&self, list: &Value) -> Result<(), CniError> {
        if !version_at_least(&list_version(list), (1, 1)) {
            return Ok(());
        }
        let none = Attachment {
            args: String::new(),
            ..Attachment::new("", "").with_ifname("")
        };
        let n = list["plugins"].as_array().map_or(0, Vec::len);
        for i in 0..n {
            let conf = Self::plugin_config(list, i, None);
            let kind = conf["type"].as_str().unwrap_or_default().to_owned();
            let bytes = serde_json::to_vec(&conf).unwrap_or_default();
            self.exec(&kind, "STATUS", &none, &bytes)
                .into_result(&kind)?;
        }
        Ok(())
    }

    /// Calls the `ipam` object of plugin `i` directly as a main plugin would call its IPAM:
    /// the whole plugin config on stdin, exec'd by `ipam.type`. Used where no reference main
    /// plugin supports the version under test (Debian's ptp stops at 1.0.0).
    pub fn ipam(
        &self,
        list: &Value,
        i: usize,
        command: &str,
        att: &Attachment,
        prev: Option<&Value>,
    ) -> Result<Value, CniError> {
        let conf = Self::plugin_config(list, i, prev);
        let kind = conf["ipam"]["type"].as_str().unwrap_or_default().to_owned();
        let bytes = serde_json::to_vec(&conf).unwrap_or_default();
        self.exec(&kind, command, att, &bytes).into_result(&kind)
    }

    /// A CNI 1.1 GC of `list`'s network through the IPAM of its first plugin ([`Self::ipam`]),
    /// with `valid` (a list of [`gc_entry`]s) as the runtime's list: under both keys a
    /// runtime may send it, `cni.dev/valid-attachments` and the older `cni.dev/attachments`.
    pub fn ipam_gc(&self, list: &Value, valid: Value) -> Result<Value, CniError> {
        let mut l = list.clone();
        l["cniVersion"] = json!("1.1.0");
        l["plugins"][0]["cni.dev/valid-attachments"] = valid.clone();
        l["plugins"][0]["cni.dev/attachments"] = valid;
        self.ipam(&l, 0, "GC", &Attachment::new("", ""), None)
    }
}

/// A plugin's result as libcni hands it on (as prevResult, to its cache and to the runtime):
/// parsed into its Go type and marshalled again (pkg/types/040 and 100). Keys the type does
/// not know are gone; a 1.0.0+ result drops an empty `dns` (types100 `MarshalJSON`), while a
/// 0.3.x/0.4.0 one always has `dns`, `{}` when the plugin sent none (types040 has no such
/// method). Debian's ptp 1.1.1 prints `"dns":{}` at 1.0.0, which libcni drops: found by
/// tests/runtimes/libcni.rs.
pub fn typed_result(mut result: Value) -> Value {
    let version = result["cniVersion"].as_str().unwrap_or_default().to_owned();
    if !version_at_least(&version, (0, 3)) {
        return result;
    }
    let Some(obj) = result.as_object_mut() else {
        return result;
    };
    obj.retain(|k, _| {
        matches!(
            k.as_str(),
            "cniVersion" | "interfaces" | "ips" | "routes" | "dns"
        )
    });
    let dns_empty = obj.get("dns").and_then(Value::as_object).is_none_or(|d| {
        d.values().all(|v| {
            v.is_null() || v.as_str() == Some("") || v.as_array().is_some_and(Vec::is_empty)
        })
    });
    if version_at_least(&version, (1, 0)) {
        if dns_empty {
            obj.remove("dns");
        }
    } else if dns_empty {
        obj.insert("dns".into(), json!({}));
    }
    result
}

/// The bare addresses in a result.
pub fn result_ips(result: &Value) -> Vec<String> {
    let mut ips: Vec<String> = result["ips"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|ip| ip["address"].as_str()?.split('/').next().map(str::to_owned))
        .collect();
    ips.sort();
    ips
}

/// A GC attachment entry, as libcni writes it.
pub fn gc_entry(att: &Attachment) -> Value {
    json!({"containerID": att.container_id, "ifname": att.ifname})
}

/// A runtime's GC list naming `keep`.
pub fn gc_list(keep: &[&Attachment]) -> Value {
    keep.iter().map(|a| gc_entry(a)).collect()
}

/// Waits out the clock tick in which a CNI GC is about to begin, before a test sends a GC
/// right after its last ADD. dipamd dates a CNI GC from its plugin's fork, which the kernel
/// records only to the clock tick (10 ms at USER_HZ 100), and keeps every pod whose ADD
/// ended in or after that tick for the next GC (docs/cfp.md §7.4, "Born after the GC"). A
/// runtime sends GC long after its last ADD; a test can send it within a millisecond, and
/// its stale pod is then (rightly) kept. Not for a GC that runs beside ADDs on purpose: those
/// ADDs must end after the fork.
pub fn settle_before_gc() {
    std::thread::sleep(std::time::Duration::from_millis(30));
}

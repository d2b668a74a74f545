//! A test bench: one dipamd, one runtime, one conflist adjusted for isolation, one subnet and
//! the delegate's own store in a temp dir; plus the invariant every test checks after every
//! step: dipamd's ledger and the delegate's store agree exactly. A conflist whose delegate is
//! `azure-vnet-ipam` runs the real plugin ([`AzureNode`]).

use std::path::Path;

use serde_json::Value;
use tempfile::TempDir;

use crate::{Attachment, Dipamd, Fixture, NetNs, Runtime, Subnet, azure::AzureNode, hostlocal};

pub struct Lab {
    pub dipamd: Dipamd,
    pub rt: Runtime,
    pub fx: Fixture,
    /// The real azure-vnet-ipam's node, when the conflist delegates to it.
    pub azure: Option<AzureNode>,
    pub subnet: Subnet,
    pub data: TempDir,
}

impl Lab {
    /// `n` root pods added and deleted through the whole chain; returns the failures (the
    /// attacker tests' measure of "root's pods keep being served").
    pub fn add_and_del(&self, n: usize) -> Vec<String> {
        let mut failed = Vec::new();
        for _ in 0..n {
            let (_ns, pod) = self.pod();
            if let Err(e) = self.rt.add(self.list(), &pod) {
                failed.push(format!("ADD: {e:?}"));
                continue;
            }
            if let Err(e) = self.rt.del(self.list(), &pod) {
                failed.push(format!("DEL: {e:?}"));
            }
        }
        failed
    }

    /// `n` root pods added and deleted, none failing: when one fails, the test fails with
    /// the failures and dipamd's log.
    #[track_caller]
    pub fn assert_serves(&self, n: usize) {
        let failed = self.add_and_del(n);
        assert!(failed.is_empty(), "{failed:#?}\n{}", self.dipamd.log());
    }

    /// Loads `conflist/<conflist>` and starts a dipamd for it.
    pub fn new(conflist: &str) -> Self {
        Self::with_flags(conflist, &[])
    }

    /// As [`Lab::new`], with extra dipamd flags.
    pub fn with_flags(conflist: &str, flags: &[&str]) -> Self {
        Self::start(Fixture::load(conflist), flags, None)
    }

    /// As [`Lab::with_flags`], for a conflist taken from elsewhere (the docs' examples).
    pub fn from_fixture(raw: Fixture, flags: &[&str]) -> Self {
        Self::start(raw, flags, None)
    }

    /// As [`Lab::with_flags`], with the runtime's CNI_PATH and dipamd's `--cni-path` on the
    /// reference plugins of `plugins` (e.g. today's host-local, which implements CNI GC, where
    /// Debian's does not).
    pub fn with_plugins(conflist: &str, flags: &[&str], plugins: crate::peers::Plugins) -> Self {
        Self::start(Fixture::load(conflist), flags, Some(plugins))
    }

    fn start(raw: Fixture, flags: &[&str], plugins: Option<crate::peers::Plugins>) -> Self {
        let subnet = Subnet::claim(subnet_prefix(&raw));
        let mut dipamd = Dipamd::unstarted(flags);
        if let Some(p) = plugins {
            dipamd.set_cni_path(&crate::peers::cni_path(p));
        }
        let data = crate::temp_dir("delegate-store-");
        let (fx, azure, mut rt) = isolate(raw, &subnet, &mut dipamd, data.path());
        if let Some(p) = plugins {
            // dipamd execs a pod's delegate from the CNI_PATH the runtime gave the plugin.
            rt = Runtime::new(crate::peers::cni_path(p));
        }
        let mut fx = fx;
        // The bridge plugin keeps its bridge after DEL, with the gateway address of the subnet
        // it was created for: each bench gets its own bridge, removed on drop. The conflist
        // gets no spoolDir, as none of conflist/ has one: the plugin must find the spool of
        // this dipamd (whose --state-dir is not the default) by itself.
        for p in fx.list["plugins"].as_array_mut().into_iter().flatten() {
            if p["type"] == "bridge" {
                p["bridge"] = serde_json::json!(format!("dpb{}", subnet.index));
            }
        }
        dipamd.start_again();
        Self {
            dipamd,
            rt,
            fx,
            azure,
            subnet,
            data,
        }
    }

    /// Sets the dipam plugin's `spoolDir` key in the conflist (older configs carry one).
    pub fn with_spool_dir_key(self, dir: &std::path::Path) -> Self {
        self.with_dipam_key("spoolDir", serde_json::json!(dir))
    }

    /// Sets the dipam plugin's `timeoutSeconds`: how long the plugin waits for a dipamd that
    /// does not serve. A test that keeps dipamd down on purpose and expects the call to fail
    /// sets it short, instead of waiting the default 55 s for each call.
    pub fn with_plugin_timeout(self, secs: u64) -> Self {
        self.with_dipam_key("timeoutSeconds", serde_json::json!(secs))
    }

    /// Sets `key` of the dipam plugin (or of its `ipam` section in IPAM mode).
    pub fn with_dipam_key(mut self, key: &str, value: Value) -> Self {
        for p in self.fx.list["plugins"].as_array_mut().into_iter().flatten() {
            if p["ipam"]["type"] == "dipam" {
                p["ipam"][key] = value.clone();
            } else if p["type"] == "dipam" {
                p[key] = value.clone();
            }
        }
        self
    }

    pub fn with_version(mut self, v: &str) -> Self {
        self.fx = self.fx.clone().with_version(v);
        self
    }

    pub fn list(&self) -> &Value {
        &self.fx.list
    }

    pub fn network(&self) -> String {
        self.fx.name()
    }

    /// A fresh netns and the attachment a runtime would create in it.
    pub fn pod(&self) -> (NetNs, Attachment) {
        crate::netns::pod()
    }

    /// DELs waiting in the spool.
    pub fn spooled(&self) -> usize {
        std::fs::read_dir(self.dipamd.state_dir().join("spool"))
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                    .count()
            })
            .unwrap_or(0)
    }

    /// (container ID, IP) pairs in the delegate's own store.
    pub fn delegate_store(&self) -> Vec<(String, String)> {
        store(self.azure.as_ref(), &self.fx, self.data.path())
    }

    /// (container ID, IP) pairs in dipamd's ledger for this network.
    pub fn ledger(&self) -> Vec<(String, String)> {
        self.dipamd.ledger_pairs(&self.network())
    }

    /// The invariant: the ledger and the delegate's store hold exactly the same allocations.
    #[track_caller]
    pub fn assert_agree(&self) {
        assert_eq!(
            self.ledger(),
            self.delegate_store(),
            "ledger (left) and {} store (right) disagree",
            self.fx.delegate()
        );
    }
}

/// The subnet prefix a bench for `raw` claims from: the azure nodes' own, so that their link
/// names never collide.
pub(crate) fn subnet_prefix(raw: &Fixture) -> &'static str {
    if raw.delegate() == "azure-vnet-ipam" {
        crate::azure::PREFIX
    } else {
        "10.77"
    }
}

/// `raw` adjusted for one bench: `dipamd`'s socket, the delegate's store under `data` and the
/// bench's subnet; for `azure-vnet-ipam`, the real plugin's node serving `dipamd` (its config
/// replaces the conflist's). Also the runtime, with the CNI_PATH that goes with it.
pub(crate) fn isolate(
    raw: Fixture,
    subnet: &Subnet,
    dipamd: &mut Dipamd,
    data: &Path,
) -> (Fixture, Option<AzureNode>, Runtime) {
    isolate_with_pool(raw, subnet, dipamd, data, crate::azure::POOL)
}

/// [`isolate`], with an azure pool of `pool` addresses.
pub(crate) fn isolate_with_pool(
    raw: Fixture,
    subnet: &Subnet,
    dipamd: &mut Dipamd,
    data: &Path,
    pool: u8,
) -> (Fixture, Option<AzureNode>, Runtime) {
    let azure = (raw.delegate() == "azure-vnet-ipam").then(|| AzureNode::for_subnet(subnet, pool));
    dipamd.set_store(data);
    let mut fx = raw
        .unique_name()
        .with_socket(&dipamd.socket())
        .with_delegate_state(data)
        .with_subnet(&subnet.cidr);
    let rt = match &azure {
        Some(node) => {
            node.serve(dipamd);
            fx = fx.with_delegate_conf(&node.delegate());
            Runtime::new(node.cni_path())
        }
        None => Runtime::new(crate::bins::cni_path()),
    };
    (fx, azure, rt)
}

/// (container ID, IP) pairs in the delegate's store: the azure node's state, or the store
/// under `data`.
pub(crate) fn store(azure: Option<&AzureNode>, fx: &Fixture, data: &Path) -> Vec<(String, String)> {
    match azure {
        Some(node) => node.held(),
        None => hostlocal::store_pairs(data, &fx.name()),
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for p in self.fx.list["plugins"].as_array().into_iter().flatten() {
            if let Some(bridge) = p["bridge"].as_str() {
                let _ = std::process::Command::new("ip")
                    .args(["link", "del", bridge])
                    .output();
            }
        }
    }
}

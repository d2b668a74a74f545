//! A test bench: one dipamd, one runtime, one conflist adjusted for isolation, one subnet and
//! the delegate's own store in a temp dir; plus the invariant every test checks after every
//! step: dipamd's ledger and the delegate's store agree exactly.

use std::path::PathBuf;

use serde_json::Value;
use tempfile::TempDir;

use crate::{Attachment, Dipamd, Fixture, NetNs, Runtime, Subnet, bins, hostlocal};

pub struct Lab {
    pub dipamd: Dipamd,
    pub rt: Runtime,
    pub fx: Fixture,
    pub subnet: Subnet,
    pub data: TempDir,
}

impl Lab {
    /// Loads `conflist/<conflist>` and starts a dipamd for it.
    pub fn new(conflist: &str) -> Self {
        Self::with_flags(conflist, &[])
    }

    /// As [`Lab::new`], with extra dipamd flags.
    pub fn with_flags(conflist: &str, flags: &[&str]) -> Self {
        Self::from_fixture(Fixture::load(conflist), flags)
    }

    /// As [`Lab::with_flags`], for a conflist taken from elsewhere (the docs' examples).
    pub fn from_fixture(raw: Fixture, flags: &[&str]) -> Self {
        let prefix = if raw.delegate() == "azure-vnet-ipam" {
            "10.78"
        } else {
            "10.77"
        };
        let subnet = Subnet::claim(prefix);
        let dipamd = Dipamd::start_with(flags);
        let data = tempfile::Builder::new()
            .prefix("delegate-store-")
            .tempdir()
            .expect("temp dir");
        let mut fx = raw
            .unique_name()
            .with_socket(&dipamd.socket())
            .with_delegate_state(data.path())
            .with_subnet(&subnet.cidr);
        // The bridge plugin keeps its bridge after DEL, with the gateway address of the subnet
        // it was created for: each bench gets its own bridge, removed on drop. The conflist
        // gets no spoolDir, as none of conflist/ has one: the plugin must find the spool of
        // this dipamd (whose --state-dir is not the default) by itself.
        for p in fx.list["plugins"].as_array_mut().into_iter().flatten() {
            if p["type"] == "bridge" {
                p["bridge"] = serde_json::json!(format!("dpb{}", subnet.index));
            }
        }
        Self {
            dipamd,
            rt: Runtime::new(bins::cni_path()),
            fx,
            subnet,
            data,
        }
    }

    /// Sets the dipam plugin's `spoolDir` key in the conflist (older configs carry one).
    pub fn with_spool_dir_key(mut self, dir: &std::path::Path) -> Self {
        for p in self.fx.list["plugins"].as_array_mut().into_iter().flatten() {
            if p["ipam"]["type"] == "dipam" {
                p["ipam"]["spoolDir"] = serde_json::json!(dir);
            } else if p["type"] == "dipam" {
                p["spoolDir"] = serde_json::json!(dir);
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
        let ns = NetNs::new();
        let att = Attachment::new(&crate::unique("pod"), &ns.path());
        (ns, att)
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

    pub fn azure_state(&self) -> PathBuf {
        self.data.path().join("azure-vnet-ipam.json")
    }

    /// (container ID, IP) pairs in the delegate's own store.
    pub fn delegate_store(&self) -> Vec<(String, String)> {
        hostlocal::store_pairs(&self.fx.delegate(), self.data.path(), &self.network())
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

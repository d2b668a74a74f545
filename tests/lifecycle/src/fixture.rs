//! The example conflists from `conflist/`, adjusted only where tests must not collide: the
//! socket, the delegate's state directory, the subnet, and (per test) the cniVersion.

use std::{
    fs::OpenOptions,
    io::Write,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};

use crate::bins;

/// A conflist loaded from `conflist/`.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub list: Value,
}

impl Fixture {
    /// Loads `conflist/<name>`.
    pub fn load(name: &str) -> Self {
        let path = bins::workspace().join("conflist").join(name);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        Self {
            list: serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display())),
        }
    }

    pub fn name(&self) -> String {
        self.list["name"].as_str().unwrap_or_default().to_owned()
    }

    /// Where dipam's own keys (socketPath, ...) live in each plugin dipam serves: the `ipam`
    /// object in IPAM mode (`{"type":"ptp","ipam":{"type":"dipam",...}}`), the plugin object
    /// itself in main mode (`{"type":"dipam",...}`).
    fn dipam_keys(&mut self) -> impl Iterator<Item = &mut Value> {
        self.list["plugins"]
            .as_array_mut()
            .into_iter()
            .flatten()
            .filter(|p| p["type"] == "dipam" || p["ipam"]["type"] == "dipam")
            .map(|p| {
                if p["type"] == "dipam" {
                    p
                } else {
                    &mut p["ipam"]
                }
            })
    }

    /// The delegate IPAM's config in each plugin dipam serves: `ipam.delegate` in IPAM mode,
    /// `ipam` in main mode.
    fn delegates(&mut self) -> impl Iterator<Item = &mut Value> {
        self.dipam_keys().map(|keys| {
            if keys.get("delegate").is_some() {
                &mut keys["delegate"]
            } else {
                &mut keys["ipam"]
            }
        })
    }

    pub fn with_socket(mut self, socket: &Path) -> Self {
        for keys in self.dipam_keys() {
            keys["socketPath"] = json!(socket);
        }
        self
    }

    /// Points the delegate's own store at `dir` (host-local's `dataDir`). The real
    /// azure-vnet-ipam's store has a fixed path: [`crate::azure::AzureNode`] isolates it.
    pub fn with_delegate_state(mut self, dir: &Path) -> Self {
        for delegate in self.delegates() {
            if delegate["type"] == "host-local" {
                delegate["dataDir"] = json!(dir);
            }
        }
        self
    }

    pub fn with_subnet(mut self, subnet: &str) -> Self {
        for delegate in self.delegates() {
            match delegate["type"].as_str() {
                // The pool id every azure-vnet-ipam call names (the real plugin's node
                // replaces the whole config: AzureNode::delegate).
                Some("azure-vnet-ipam") => delegate["subnet"] = json!(subnet),
                _ => delegate["ranges"] = json!([[{ "subnet": subnet }]]),
            }
        }
        self
    }

    /// Replaces the delegate's whole config (a real plugin's keys instead of a stand-in's).
    pub fn with_delegate_conf(mut self, conf: &Value) -> Self {
        for delegate in self.delegates() {
            *delegate = conf.clone();
        }
        self
    }

    /// Sets the delegate's `ranges` (host-local) to `ranges`, e.g. a dual-stack pair.
    pub fn with_ranges(mut self, ranges: Value) -> Self {
        for delegate in self.delegates() {
            delegate["ranges"] = ranges.clone();
        }
        self
    }

    /// Sets the delegate's `routes` (host-local).
    pub fn with_routes(mut self, routes: Value) -> Self {
        for delegate in self.delegates() {
            delegate["routes"] = routes.clone();
        }
        self
    }

    pub fn with_version(mut self, version: &str) -> Self {
        self.list["cniVersion"] = json!(version);
        self
    }

    pub fn with_name(mut self, name: &str) -> Self {
        self.list["name"] = json!(name);
        self
    }

    /// Sets the network name so parallel tests never share host-local's per-network dir.
    pub fn unique_name(self) -> Self {
        let n = crate::unique(&self.name());
        self.with_name(&n)
    }

    /// The delegate type of the first dipam plugin.
    pub fn delegate(&self) -> String {
        self.list["plugins"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|p| {
                if p["type"] == "dipam" {
                    p["ipam"]["type"].as_str()
                } else if p["ipam"]["type"] == "dipam" {
                    p["ipam"]["delegate"]["type"].as_str()
                } else {
                    None
                }
            })
            .unwrap_or_default()
            .to_owned()
    }

    /// Whether the first dipam plugin is the main plugin (`"type":"dipam"`).
    pub fn is_main_mode(&self) -> bool {
        self.list["plugins"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["type"] == "dipam")
    }
}

/// An IPv4 /24 that no other concurrently running test uses. Claims are files under
/// /run/dipam-lifecycle (O_EXCL); a claim whose process is gone is taken over. Host routes
/// (ptp adds one per pod) would collide if two tests used the same addresses.
pub struct Subnet {
    pub cidr: String,
    pub index: u32,
    claim: PathBuf,
}

impl Subnet {
    /// Claims `<first_octets>.<n>.0/24`, e.g. `claim("10.77")`.
    pub fn claim(prefix: &str) -> Self {
        let dir = Path::new("/run/dipam-lifecycle");
        std::fs::create_dir_all(dir).expect("create /run/dipam-lifecycle");
        for index in 1..=250u32 {
            let claim = dir.join(format!("{prefix}.{index}"));
            let take = |p: &Path| {
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(p)
                    .and_then(|mut f| write!(f, "{}", std::process::id()))
            };
            let ok = take(&claim).is_ok() || {
                let owner = std::fs::read_to_string(&claim)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok());
                let dead = owner.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
                dead && std::fs::remove_file(&claim).is_ok() && take(&claim).is_ok()
            };
            if ok {
                return Self {
                    cidr: format!("{prefix}.{index}.0/24"),
                    index,
                    claim,
                };
            }
        }
        panic!("no free {prefix}.x.0/24 subnet for this test");
    }

    /// The gateway host-local assigns by default (network + 1).
    pub fn gateway(&self) -> String {
        let base = self.cidr.trim_end_matches(".0/24");
        format!("{base}.1")
    }

    pub fn contains(&self, ip: &str) -> bool {
        let base = self.cidr.trim_end_matches("0/24");
        ip.starts_with(base)
    }
}

impl Drop for Subnet {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.claim);
    }
}

/// The index in `list` of the plugin dipam serves: dipam itself in main mode, the plugin whose
/// IPAM it is in IPAM mode. Panics, showing the list, when there is none.
pub fn dipam_plugin_index(list: &Value) -> usize {
    list["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .position(|p| p["type"] == "dipam" || p["ipam"]["type"] == "dipam")
        .unwrap_or_else(|| panic!("no plugin uses dipam in {list:#}"))
}

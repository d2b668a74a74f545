//! The real azure-vnet-ipam (github.com/Azure/azure-container-networking, `cni/ipam/plugin`),
//! run without Azure through its file-backed address source (docs/sources.md §8).
//!
//! The plugin's paths are fixed in its source: it reads `/etc/kubernetes/interfaces.json`,
//! keeps its state in `/var/run/azure-vnet-ipam.json` (lock: `/var/run/azure-vnet/`) and logs
//! to `/var/log/azure-vnet-ipam.log`. So that nothing on the host is touched and parallel
//! tests never share a state file, each [`AzureNode`] runs dipamd (and so every plugin
//! dipamd execs) in a private mount namespace: `/etc`, `/run` and `/var/log` are overlays
//! whose upper layers are this guard's directories, `/etc/kubernetes` is a bind of its own,
//! and the host's `/run/netns` is moved back in on top, so that the pods' network namespaces
//! stay reachable (mounts made there later propagate in: the namespace is a slave of the
//! host's). The state file is then `<dir>/run/azure-vnet-ipam.json` on the host, and it
//! survives a dipamd restart (a new namespace over the same layers).
//!
//! The pool: `interfaces.json` lists one interface whose MAC is that of a bridge link this
//! guard creates on the host (with no ports: the plugin only matches MACs), and a /24 with
//! the addresses it may hand out. The plugin needs `ipam.subnet` in every call: without it, an
//! ADD asks for a whole pool, and a pool that holds an address is not handed out twice.
//!
//! [`crate::Lab`] and [`crate::AgentLab`] give every conflist whose delegate is
//! `azure-vnet-ipam` such a node ([`AzureNode::serve`]): the real plugin, never a stand-in.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::{Dipamd, Subnet, bins, cmd::run, peers::Peer};

/// The subnets the azure nodes take theirs from ([`Subnet::claim`]): one prefix, so that the
/// index in each node's link name is unique.
pub const PREFIX: &str = "10.79";

/// How many addresses a bench's pool offers unless it asks for fewer (.10 up).
pub const POOL: u8 = 200;

/// The plugin's state file under the overlay of /run.
const STATE: &str = "azure-vnet-ipam.json";

pub struct AzureNode {
    dir: TempDir,
    link: String,
    /// The /24 of the pool, e.g. `10.79.3.0/24`.
    pub cidr: String,
    /// The subnet's claim, when this node took its own.
    _claim: Option<Subnet>,
    /// The addresses interfaces.json offers, in order.
    pub pool: Vec<Ipv4Addr>,
}

impl AzureNode {
    /// A node whose interfaces.json offers `count` addresses of a fresh /24 (from .10 up),
    /// with `peer` as the `azure-vnet-ipam` in [`Self::cni_path`].
    pub fn new(peer: &Peer, count: u8) -> Self {
        let subnet = Subnet::claim(PREFIX);
        let (cidr, index) = (subnet.cidr.clone(), subnet.index);
        let mut node = Self::on(peer, count, &cidr, index);
        node._claim = Some(subnet);
        node
    }

    /// A node for the real `azure-vnet-ipam` tests/deps.sh built (a missing peer fails the
    /// test, saying what builds it), whose pool is `count` addresses of `subnet`, a claim of
    /// [`PREFIX`] the caller holds.
    pub fn for_subnet(subnet: &Subnet, count: u8) -> Self {
        assert!(
            subnet.cidr.starts_with(&format!("{PREFIX}.")),
            "an azure node's subnet is claimed under {PREFIX}: {}",
            subnet.cidr
        );
        Self::on(
            &crate::peers::require("azure-vnet-ipam"),
            count,
            &subnet.cidr,
            subnet.index,
        )
    }

    fn on(peer: &Peer, count: u8, cidr: &str, index: u32) -> Self {
        assert!((1..=240).contains(&count), "a pool of 1 to 240 addresses");
        let dir = crate::temp_dir("azure-node-");
        let d = dir.path();
        for sub in [
            "bin", "kube", "stage", "etc", "etc.work", "run", "run.work", "log", "log.work",
        ] {
            std::fs::create_dir_all(d.join(sub)).expect("azure node dirs");
        }
        std::os::unix::fs::symlink(&peer.path, d.join("bin/azure-vnet-ipam"))
            .expect("link the real azure-vnet-ipam");
        let link = format!("dpaz{index}");
        let mac = format!("02:d1:9a:00:00:{index:02x}");
        let _ = Command::new("ip").args(["link", "del", &link]).output();
        run(Command::new("ip").args(["link", "add", &link, "type", "bridge"]));
        run(Command::new("ip").args(["link", "set", &link, "address", &mac]));
        let (interfaces, pool) = interfaces_json(&mac, cidr, count);
        std::fs::write(
            d.join("kube/interfaces.json"),
            serde_json::to_vec_pretty(&interfaces).expect("JSON"),
        )
        .expect("interfaces.json");
        std::fs::write(d.join("setup.sh"), setup_script(d)).expect("setup.sh");
        Self {
            dir,
            link,
            cidr: cidr.to_owned(),
            _claim: None,
            pool,
        }
    }

    /// Makes `dipamd` run this node's real plugin from its next start: the plugin first on
    /// its `--cni-path`, and dipamd (under whatever `run_under` gives it) in this node's
    /// private mount namespace.
    pub fn serve(&self, dipamd: &mut Dipamd) {
        dipamd.set_cni_path(&self.cni_path());
        dipamd.enter(&self.wrapper(&[]));
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// CNI_PATH (and dipamd's `--cni-path`): the real azure-vnet-ipam ahead of the harness's
    /// binaries, so that it, never the stand-in, answers to `azure-vnet-ipam`.
    pub fn cni_path(&self) -> String {
        format!("{}:{}", self.dir().join("bin").display(), bins::cni_path())
    }

    /// The argv that runs the rest of a command line (`inner`, then dipamd's) in this node's
    /// private mount namespace: for `Dipamd::run_under`. `inner` may be a capability wrapper
    /// (setpriv), which then runs inside the namespace.
    pub fn wrapper(&self, inner: &[String]) -> Vec<String> {
        let mut argv: Vec<String> = ["unshare", "--mount", "--propagation", "slave", "sh"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        argv.push(self.dir().join("setup.sh").display().to_string());
        argv.extend_from_slice(inner);
        argv
    }

    /// The delegate config for this node's pool.
    pub fn delegate(&self) -> Value {
        json!({
            "type": "azure-vnet-ipam",
            "environment": "fileIpam",
            "subnet": self.cidr,
        })
    }

    fn state_path(&self) -> PathBuf {
        self.dir().join("run").join(STATE)
    }

    /// What the plugin holds: (container ID, address) of every address in use, sorted.
    pub fn held(&self) -> Vec<(String, String)> {
        held_in(&self.state_path())
    }

    /// Removes the plugin's state, as a reboot does (it lives on /run, a tmpfs): dipamd must
    /// be stopped.
    pub fn wipe_state(&self) {
        match std::fs::remove_file(self.state_path()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("remove {}: {e}", self.state_path().display()),
        }
    }

    /// Records `id` as holding `addr` in the plugin's state, as another caller of the plugin
    /// (a pod of another runtime) would have: dipamd must be stopped and the state exist.
    pub fn hold_behind_dipams_back(&self, id: &str, addr: &str) {
        let text = std::fs::read_to_string(self.state_path()).expect("the plugin's state");
        let mut state: Value = serde_json::from_str(&text).expect("JSON");
        let pools = state["IPAM"]["AddressSpaces"]["local"]["Pools"]
            .as_object_mut()
            .expect("the local address space has pools");
        let rec = pools
            .values_mut()
            .find_map(|p| p["Addresses"].get_mut(addr))
            .unwrap_or_else(|| panic!("{addr} is not in the plugin's pool"));
        assert_ne!(rec["InUse"], true, "{addr} is held already: {rec}");
        rec["ID"] = json!(id);
        rec["InUse"] = json!(true);
        std::fs::write(
            self.state_path(),
            serde_json::to_vec_pretty(&state).expect("JSON"),
        )
        .expect("write the plugin's state");
    }

    /// Runs the plugin itself (in this node's namespace) as another caller would, e.g. a pod
    /// of a runtime that does not go through dipam: (exit success, stdout).
    pub fn exec(&self, command: &str, container_id: &str, ip: Option<&str>) -> (bool, String) {
        use std::io::Write as _;
        let mut ipam = self.delegate();
        if let Some(ip) = ip {
            ipam["ipAddress"] = json!(ip);
        }
        let conf = json!({"cniVersion": "1.0.0", "name": "other", "ipam": ipam});
        let mut argv = self.wrapper(&[]);
        argv.push(self.dir().join("bin/azure-vnet-ipam").display().to_string());
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container_id)
            .env("CNI_NETNS", "/var/run/netns/another-runtimes-pod")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", self.dir().join("bin"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run azure-vnet-ipam");
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(conf.to_string().as_bytes());
        }
        let out = child.wait_with_output().expect("wait for azure-vnet-ipam");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// The plugin's own log (`/var/log/azure-vnet-ipam.log` in the namespace).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir().join("log/azure-vnet-ipam.log")).unwrap_or_default()
    }
}

impl Drop for AzureNode {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .output();
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "----- azure-vnet-ipam log -----\n{}\n----- state -----\n{}",
                lines[lines.len().saturating_sub(30)..].join("\n"),
                std::fs::read_to_string(self.state_path()).unwrap_or_default()
            );
        }
    }
}

/// What the plugin's state file at `state` holds: (container ID, address) of every address in
/// use, sorted; nothing when there is no file (a fresh node, or /run after a reboot).
pub fn held_in(state: &Path) -> Vec<(String, String)> {
    let Ok(text) = std::fs::read_to_string(state) else {
        return Vec::new();
    };
    let state: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON ({e}): {text}", state.display()));
    let mut held: Vec<(String, String)> = state["IPAM"]["AddressSpaces"]
        .as_object()
        .into_iter()
        .flat_map(|spaces| spaces.values())
        .flat_map(|space| space["Pools"].as_object().into_iter().flatten())
        .flat_map(|(_, pool)| pool["Addresses"].as_object().into_iter().flatten())
        .filter(|(_, rec)| rec["InUse"] == true)
        .map(|(addr, rec)| {
            (
                rec["ID"].as_str().unwrap_or_default().to_owned(),
                addr.clone(),
            )
        })
        .collect();
    held.sort();
    held
}

/// The plugin's file-backed address source (`/etc/kubernetes/interfaces.json` with
/// `"environment": "fileIpam"`): one primary interface, the link whose MAC is `mac` (the
/// plugin matches MACs only), whose subnet `cidr` (a /24) offers `count` addresses from .10
/// up (.4 is the interface's own); and those addresses, in order.
pub fn interfaces_json(mac: &str, cidr: &str, count: u8) -> (Value, Vec<Ipv4Addr>) {
    let base = cidr.trim_end_matches(".0/24").to_owned();
    let pool: Vec<Ipv4Addr> = (10..10 + u16::from(count))
        .map(|h| format!("{base}.{h}").parse().expect("an IPv4 address"))
        .collect();
    let mut addresses = vec![json!({"Address": format!("{base}.4"), "IsPrimary": true})];
    addresses.extend(
        pool.iter()
            .map(|a| json!({"Address": a.to_string(), "IsPrimary": false})),
    );
    let interfaces = json!({"Interfaces": [{
        "MacAddress": mac.replace(':', ""),
        "IsPrimary": true,
        "IPSubnets": [{"Prefix": cidr, "IPAddresses": addresses}],
    }]});
    (interfaces, pool)
}

/// The namespace's set-up, run by `unshare` before it execs the rest of its arguments. The
/// overlays leave the host's /etc, /run and /var/log untouched: every write lands in `d`.
fn setup_script(d: &Path) -> String {
    let d = d.display();
    format!(
        r#"set -eu
d={d}
# The host's /run/netns first (hidden by /run's overlay below), to move back on top of it.
mkdir -p /run/netns
mount --rbind /run/netns "$d/stage"
for p in etc run log; do
  case $p in etc) t=/etc ;; run) t=/run ;; log) t=/var/log ;; esac
  mount -t overlay overlay -o "lowerdir=$t,upperdir=$d/$p,workdir=$d/$p.work" "$t"
done
mkdir -p /etc/kubernetes
mount --bind "$d/kube" /etc/kubernetes
mkdir -p /run/netns
mount --move "$d/stage" /run/netns
exec "$@"
"#
    )
}

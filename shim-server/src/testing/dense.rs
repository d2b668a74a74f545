//! A dense node for the unit tests: a real sled ledger on disk holding thousands of records
//! shaped as a CRI runtime's pods leave them (a ptp + host-local config with its `dataDir`,
//! containerd's CNI_ARGS, a namespace path, a full result), and host-local's directory with
//! a file per address, as the passes over the ledger and the delegate's store meet them on a
//! node with thousands of pods.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, CriPod, Owner};
use serde_json::json;
use tempfile::TempDir;

use crate::{l2_core::delegate::Executor, l5_node::node::Node};

/// The network every record is on.
pub const NET: &str = "dense";

pub struct Dense {
    #[allow(dead_code)]
    pub dir: TempDir,
    pub node: Arc<Node>,
    /// host-local's `dataDir` (its directory for the network is `<data>/dense`).
    pub data: PathBuf,
}

/// The `i`th pod's address: 10.60.0.2 on, 250 to a /24.
pub fn ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 60, (i / 250) as u8, (i % 250 + 2) as u8))
}

/// The `i`th pod's container ID: 64 hex digits, as containerd makes them.
pub fn cid(i: usize) -> String {
    format!("{i:064x}")
}

/// The delegate config every record was added with (host-local under ptp, IPAM mode).
pub fn config(data: &Path) -> serde_json::Value {
    json!({"cniVersion": "1.1.0", "name": NET, "type": "ptp", "ipMasq": true, "mtu": 1450,
        "ipam": {"type": "host-local", "dataDir": data,
            "ranges": [[{"subnet": "10.60.0.0/16", "gateway": "10.60.0.1"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}})
}

/// The `i`th pod's record, committed, made through CRI an hour ago.
pub fn record(i: usize, data: &Path) -> AttachmentRecord {
    let cid = cid(i);
    let at = crate::l1_leaves::clock::now().saturating_sub(3600);
    AttachmentRecord {
        key: AttachmentKey::new(NET, &cid, "eth0"),
        owner: Owner::Pod,
        state: AttachmentState::Committed,
        delegate_type: "host-local".into(),
        delegate_version: "1.1.0".into(),
        delegate_config: config(data).to_string(),
        netns: format!("/var/run/netns/cni-{i:08x}-1b2c-4d3e-8f90-a1b2c3d4e5f6"),
        cni_args: format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-{i};\
             K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID=0000{i:04}-aaaa-bbbb-cccc-dddddddddddd"
        ),
        cni_path: "/opt/cni/bin".into(),
        result: Some(json!({"cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
            "ips": [{"address": format!("{}/16", ip(i)), "gateway": "10.60.0.1", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.60.0.1"}], "dns": {}})),
        config_digest: format!("{:064x}", 7),
        request_id: format!("req-{i}"),
        created_at: at,
        updated_at: at,
        issued_ms: 0,
        issued_at: None,
        delegate_key: None,
        creator_uid: None,
        cri_pod: Some(CriPod {
            namespace: "default".into(),
            name: format!("web-{i}"),
            uid: format!("uid-{i}"),
        }),
    }
}

/// A node on a real sled ledger in a fresh directory holding `records`.
pub fn node(records: &[AttachmentRecord], dir: TempDir) -> Dense {
    let store = dipam_state::open(&dir.path().join("state")).expect("sled opens");
    let node = crate::testing::node_on_with(
        Arc::new(store),
        Executor::new(vec![dir.path().join("bin")], Duration::from_secs(10)),
        crate::l3_clients::gc::GcPolicy::default(),
    );
    node.core
        .ledger
        .put_all(records, dipam_state::Durability::SurvivesPowerCut)
        .expect("sled takes the records");
    let data = dir.path().join("data");
    Dense { dir, node, data }
}

/// A fresh directory, host-local's `dataDir` in it, and `n` pods' records (`record(0..n)`)
/// for a test to edit before [`node`] takes them.
pub fn unsaved(n: usize) -> (TempDir, PathBuf, Vec<AttachmentRecord>) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let data = dir.path().join("data");
    let records: Vec<AttachmentRecord> = (0..n).map(|i| record(i, &data)).collect();
    (dir, data, records)
}

/// `n` pods (`record(0..n)`) on a fresh node, and their records.
pub fn pods(n: usize) -> (Dense, Vec<AttachmentRecord>) {
    let (dir, _, records) = unsaved(n);
    (node(&records, dir), records)
}

/// The container IDs of pods `0..n` but `gone`: what a runtime that lost those lists.
pub fn listed_but(n: usize, gone: &[usize]) -> Vec<String> {
    (0..n).filter(|i| !gone.contains(i)).map(cid).collect()
}

impl Dense {
    /// What every record of the ledger takes decoded, held at once (`list(None)`), on `rt`
    /// (held.rs), after one read that fills sled's cache so that no measure counts its pages.
    pub fn whole(&self, rt: &tokio::runtime::Runtime) -> usize {
        rt.block_on(self.node.core.ledger(|l| l.list(None)))
            .expect("the ledger reads");
        super::held::measure(rt, self.node.core.ledger(|l| l.list(None))).1
    }

    /// Writes host-local's file for `ip` naming `owner` (`<containerID>\r\n<ifname>`, or as
    /// given), an hour old: past every grace period.
    pub fn reserve(&self, ip: IpAddr, owner: &str) {
        let dir = self.data.join(NET);
        std::fs::create_dir_all(&dir).expect("the store's directory");
        let path = dir.join(ip.to_string());
        std::fs::write(&path, owner).expect("a reservation file");
        let old = SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(old))
            .expect("an old mtime");
    }
}

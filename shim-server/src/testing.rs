//! What the crate's unit tests share: a daemon context (`Node`) on the in-memory ledger whose
//! delegate is a shell script, the requests and records they make, and the calls that drive
//! it as a plugin would. Tests live beside their code (`#[cfg(test)] mod tests`, or
//! `tests.rs` in the module's folder when they outgrow the file) and import from here.

use std::{os::unix::fs::PermissionsExt, sync::Arc, time::Duration};

use dipam_proto::v1::{CniRequest, Mode};
use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, MemStore, Owner};
use serde_json::{Value, json};
use tempfile::TempDir;

pub mod dense;
pub mod held;

/// The unit tests' allocator: the system's, counting what a measured runtime holds
/// (held.rs).
#[global_allocator]
static COUNTING: held::Counting = held::Counting;

use crate::{
    l1_leaves::access::Caller, l1_leaves::error::ShimError, l2_core::core::Identity,
    l2_core::delegate::Executor, l5_node::node::Node, l5_node::rpc::add,
};

/// A shim on `store` whose only delegate is `script`, installed as `fake-ipam` in the returned
/// temp dir (where the scripts keep their call logs).
pub fn scripted_node(script: &str, store: Arc<MemStore>) -> (TempDir, Arc<Node>) {
    scripted_node_with(script, store, crate::l1_leaves::events::Events::default())
}

/// [`scripted_node`], reporting to `events`.
pub fn scripted_node_with(
    script: &str,
    store: Arc<MemStore>,
    events: crate::l1_leaves::events::Events,
) -> (TempDir, Arc<Node>) {
    scripted_node_policy(
        script,
        store,
        events,
        crate::l3_clients::gc::GcPolicy::default(),
    )
}

/// [`scripted_node_with`] with the GC's `policy`.
pub fn scripted_node_policy(
    script: &str,
    store: Arc<MemStore>,
    events: crate::l1_leaves::events::Events,
    policy: crate::l3_clients::gc::GcPolicy,
) -> (TempDir, Arc<Node>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fake-ipam");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut exec = Executor::new(vec![dir.path().to_owned()], Duration::from_secs(10));
    exec.events = events;
    (dir, node_on_with(store, exec, policy))
}

/// A node on `store` running delegates with `exec`: no socket, no agent, default GC and
/// admission.
pub fn node_on(store: Arc<MemStore>, exec: Executor) -> Arc<Node> {
    node_on_with(store, exec, crate::l3_clients::gc::GcPolicy::default())
}

/// [`node_on`] with the GC's `policy`.
pub fn node_on_with(
    store: Arc<dyn dipam_state::Store>,
    exec: Executor,
    policy: crate::l3_clients::gc::GcPolicy,
) -> Arc<Node> {
    Node::new(
        store,
        exec,
        Identity {
            socket: "/unused".into(),
            state_dir: "/unused".into(),
            spool_dir: "/unused".into(),
        },
        None,
        policy,
        crate::l1_leaves::access::Admission::default(),
    )
}

/// ADD as `caller`, with no AddEarly stream: the answer's bytes.
pub async fn add_as(node: &Node, caller: Caller, req: CniRequest) -> Result<Vec<u8>, ShimError> {
    add::run(
        node,
        caller,
        req,
        &mut crate::l2_core::core::attach::Early::default(),
    )
    .await
    .map(|added| added.result)
}

/// An IPAM-mode request for `cid` through the scripted `fake-ipam` delegate, with `extra`
/// merged into the config.
pub fn request(cid: &str, version: &str, extra: Value) -> CniRequest {
    let mut conf = json!({
        "cniVersion": version, "name": "net", "type": "ptp",
        "ipam": {"type": "dipam", "delegate": {"type": "fake-ipam", "subnet": "10.9.0.0/24"}}
    });
    if let (Some(c), Some(e)) = (conf.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    CniRequest {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        request_id: "test".into(),
        command: String::new(),
        container_id: cid.into(),
        netns: "/var/run/netns/x".into(),
        ifname: "eth0".into(),
        cni_args: String::new(),
        cni_path: String::new(),
        stdin: serde_json::to_vec(&conf).unwrap(),
        mode: Mode::Ipam as i32,
        issued_at_ms: crate::l1_leaves::clock::now_ms(),
        issued_at: crate::l1_leaves::order::now().map(|b| dipam_proto::v1::BootStamp {
            boot_id: b.boot_id,
            ns: b.ns,
        }),
        retired_link: None,
    }
}

/// Every reply of one AddEarly for `req`, through the service as a plugin sees it.
pub async fn add_early_replies(
    node: &Arc<Node>,
    req: CniRequest,
) -> Vec<dipam_proto::v1::CniReply> {
    use dipam_proto::v1::cni_server::Cni;
    use tokio_stream::StreamExt;
    let svc = crate::l6_transport::service::Service(Arc::clone(node));
    let mut req = tonic::Request::new(req);
    req.extensions_mut()
        .insert(crate::l1_leaves::access::Caller::ROOT);
    let stream = svc.add_early(req).await.unwrap().into_inner();
    stream
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

// The GC's shared delegate and records (gc/collect/mod.rs's tests, gc/runtime/pass/tests.rs).

/// The delegate "fake-ipam": appends `COMMAND CONTAINERID` to `calls` beside itself for every
/// call, answers VERSION, and runs `cases` (more `case` arms) for the other commands.
pub fn script(cases: &str) -> String {
    format!(
        r#"#!/bin/sh
d=$(dirname "$0")
echo "$CNI_COMMAND $CNI_CONTAINERID" >> "$d/calls"
case "$CNI_COMMAND" in
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}}' ;;
{cases}esac
"#
    )
}

/// A record of `cid`/eth0 on "net", made through fake-ipam at `created_at` (seconds), holding
/// 10.9.0.9.
pub fn record(
    cid: &str,
    owner: Owner,
    state: AttachmentState,
    created_at: u64,
) -> AttachmentRecord {
    AttachmentRecord {
        key: AttachmentKey::new("net", cid, "eth0"),
        owner,
        state,
        delegate_type: "fake-ipam".into(),
        delegate_version: "1.0.0".into(),
        delegate_config: r#"{"cniVersion":"1.0.0","name":"net","type":"fake-ipam"}"#.into(),
        netns: String::new(),
        cni_args: String::new(),
        cni_path: String::new(),
        result: Some(json!({"cniVersion":"1.0.0","ips":[{"address":"10.9.0.9/24"}]})),
        config_digest: String::new(),
        request_id: "t".into(),
        created_at,
        updated_at: created_at,
        issued_ms: 0,
        issued_at: None,
        delegate_key: None,
        creator_uid: None,
        cri_pod: None,
    }
}

/// A node whose delegate is `script` and whose in-memory ledger holds `records`.
pub async fn node_with(script: &str, records: Vec<AttachmentRecord>) -> (TempDir, Arc<Node>) {
    let (dir, node) = scripted_node(script, Arc::new(MemStore::new()));
    for r in records {
        node.core
            .ledger(move |l| l.put(&r))
            .await
            .expect("an in-memory ledger takes the record");
    }
    (dir, node)
}

/// The container IDs of every record in `node`'s ledger, in key order.
pub async fn ledger_ids(node: &Node) -> Vec<String> {
    node.core
        .ledger(|l| l.list(None))
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key.container_id)
        .collect()
}

/// A [`MemStore`] that counts the reads of the attachments that return more than one record
/// (scans): a request whose cost must not grow with the ledger makes none.
#[derive(Debug, Default)]
pub struct CountingStore {
    inner: MemStore,
    pub scans: std::sync::atomic::AtomicUsize,
}

impl dipam_state::Store for CountingStore {
    fn get(
        &self,
        tree: dipam_state::Tree,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, dipam_state::StoreError> {
        self.inner.get(tree, key)
    }

    fn scan_prefix(
        &self,
        tree: dipam_state::Tree,
        prefix: &[u8],
    ) -> Result<Vec<dipam_state::KeyValue>, dipam_state::StoreError> {
        if tree == dipam_state::Tree::Attachments {
            self.scans.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.inner.scan_prefix(tree, prefix)
    }

    fn commit_with(
        &self,
        batch: dipam_state::Batch,
        durability: dipam_state::Durability,
    ) -> Result<(), dipam_state::StoreError> {
        self.inner.commit_with(batch, durability)
    }

    fn len(&self, tree: dipam_state::Tree) -> Result<usize, dipam_state::StoreError> {
        if tree == dipam_state::Tree::Attachments {
            self.scans.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.inner.len(tree)
    }
}

//! What the GC's unit tests share (collect.rs's and runtime/pass/tests.rs): a scripted
//! delegate that logs every call, the ledger record of a pod on network "net" made through
//! it, and a node whose in-memory ledger holds such records.

use std::sync::Arc;

use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, MemStore, Owner};
use serde_json::json;
use tempfile::TempDir;

use crate::{node::Node, rpc::tests::scripted_node};

/// The delegate "fake-ipam": appends `COMMAND CONTAINERID` to `calls` beside itself for every
/// call, answers VERSION, and runs `cases` (more `case` arms) for the other commands.
pub(crate) fn script(cases: &str) -> String {
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
pub(crate) fn record(
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
pub(crate) async fn node_with(
    script: &str,
    records: Vec<AttachmentRecord>,
) -> (TempDir, Arc<Node>) {
    let (dir, node) = scripted_node(script, Arc::new(MemStore::new()));
    for r in records {
        node.ledger(move |l| l.put(&r))
            .await
            .expect("an in-memory ledger takes the record");
    }
    (dir, node)
}

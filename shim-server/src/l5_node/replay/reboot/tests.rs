//! The reboot replay on the in-memory ledger with a scripted delegate: a changed boot id frees
//! every pod of the earlier boot (released, or forgotten where the delegate cannot release
//! it), keeps the agent's and the pool's, and records the new boot.

use std::sync::Arc;

use dipam_state::{AttachmentState, MemStore, Owner};

use super::*;
use crate::testing::{ledger_ids, node_with, record, script, scripted_node};

fn records() -> Vec<AttachmentRecord> {
    let t = crate::l1_leaves::clock::now();
    vec![
        record("pod-a", Owner::Pod, AttachmentState::Committed, t),
        record("pod-b", Owner::Pod, AttachmentState::Adding, t),
        record(
            "agent",
            Owner::Agent {
                role: "router".into(),
            },
            AttachmentState::Committed,
            t,
        ),
        record("pool", Owner::Pool, AttachmentState::Committed, t),
    ]
}

#[tokio::test]
async fn a_new_boot_frees_every_pod_of_the_earlier_one_and_only_those() {
    let (dir, node) = node_with(&script("DEL) ;;\n"), records()).await;
    let first = release_earlier_boot(&node, Some("boot-1")).await.unwrap();
    assert_eq!(
        first,
        Rebooted::default(),
        "a ledger naming no boot proves nothing"
    );
    assert_eq!(ledger_ids(&node).await.len(), 4);
    let same = release_earlier_boot(&node, Some("boot-1")).await.unwrap();
    assert_eq!(same, Rebooted::default());

    let done = release_earlier_boot(&node, Some("boot-2")).await.unwrap();
    assert_eq!(done.previous.as_deref(), Some("boot-1"));
    assert_eq!(done.released, 2, "{done:?}");
    assert_eq!(ledger_ids(&node).await, ["agent", "pool"]);
    let calls = std::fs::read_to_string(dir.path().join("calls")).unwrap();
    assert!(
        calls.contains("DEL pod-a") && calls.contains("DEL pod-b"),
        "{calls}"
    );
    assert!(
        !calls.contains("DEL agent") && !calls.contains("DEL pool"),
        "{calls}"
    );
    let boot = node.core.ledger(|l| l.setting(BOOT_SETTING)).await.unwrap();
    assert_eq!(boot.as_deref(), Some("boot-2"));
}

#[tokio::test]
async fn a_delegate_whose_state_went_with_the_reboot_has_its_pods_forgotten() {
    let store = Arc::new(MemStore::new());
    let (_dir, node) = scripted_node(
        &script("DEL) echo '{\"code\":11,\"msg\":\"state is gone\"}'; exit 1 ;;\n"),
        store,
    );
    for r in records() {
        node.core.ledger(move |l| l.put(&r)).await.unwrap();
    }
    node.core
        .ledger(|l| l.set_setting(BOOT_SETTING, Some("boot-1")))
        .await
        .unwrap();
    let done = release_earlier_boot(&node, Some("boot-2")).await.unwrap();
    assert_eq!(done.forgotten, 2, "{done:?}");
    assert_eq!(ledger_ids(&node).await, ["agent", "pool"]);
}

#[tokio::test]
async fn no_boot_id_changes_nothing() {
    let (_dir, node) = node_with(&script("DEL) ;;\n"), records()).await;
    node.core
        .ledger(|l| l.set_setting(BOOT_SETTING, Some("boot-1")))
        .await
        .unwrap();
    assert_eq!(
        release_earlier_boot(&node, None).await.unwrap(),
        Rebooted::default()
    );
    assert_eq!(ledger_ids(&node).await.len(), 4);
}

#[test]
fn the_boot_id_is_read_trimmed_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("boot_id");
    std::fs::write(&f, "0b1c\n").unwrap();
    assert_eq!(boot_id(&f).as_deref(), Some("0b1c"));
    std::fs::write(&f, "\n").unwrap();
    assert_eq!(boot_id(&f), None);
    std::fs::write(&f, "x".repeat(4096)).unwrap();
    assert_eq!(boot_id(&f), None);
    assert_eq!(boot_id(&dir.path().join("absent")), None);
    assert!(boot_id(std::path::Path::new(crate::l1_leaves::order::BOOT_ID_FILE)).is_some());
}

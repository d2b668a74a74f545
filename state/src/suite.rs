//! One behaviour suite that [`MemStore`] and [`SledStore`] must both pass (each behaviour is a
//! generic fn, instantiated per store by `both_stores!`), plus the tests only an on-disk store
//! can have: reopen, locking, corruption and a kill -9 durability test.

use std::path::Path;

use crate::{
    AttachmentKey, AttachmentRecord, AttachmentState, Batch, Durability, Ledger, MemStore, Owner,
    SCHEMA_KEY, SCHEMA_VERSION, Store, StoreError, Tree, ensure_schema, sled_store::SledStore,
};

pub(crate) fn record(network: &str, container_id: &str, ifname: &str) -> AttachmentRecord {
    AttachmentRecord {
        key: AttachmentKey::new(network, container_id, ifname),
        owner: Owner::Pod,
        state: AttachmentState::Committed,
        delegate_type: "host-local".into(),
        delegate_version: "1.0.0".into(),
        delegate_config: r#"{"cniVersion":"1.0.0","name":"n","type":"host-local"}"#.into(),
        netns: "/var/run/netns/x".into(),
        cni_args: "K8S_POD_NAME=p".into(),
        cni_path: "/opt/cni/bin".into(),
        result: Some(serde_json::json!({"ips":[{"address":"10.1.0.5/24"}]})),
        config_digest: "sha256:00".into(),
        request_id: "req-1".into(),
        created_at: 1_700_000_000,
        updated_at: 1_700_000_001,
        issued_ms: 0,
        issued_at: None,
        delegate_key: None,
        creator_uid: None,
        cri_pod: None,
    }
}

fn put(store: &impl Store, tree: Tree, key: &str, value: &str) {
    let mut batch = Batch::new();
    batch.put(tree, key, value);
    store.commit(batch).unwrap();
}

fn keys(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<&[u8]> {
    entries.iter().map(|(k, _)| k.as_slice()).collect()
}

// ---- the shared suite --------------------------------------------------------------------

fn put_get_delete<S: Store>(store: S, _path: &Path) {
    assert_eq!(store.get(Tree::Attachments, b"k").unwrap(), None);
    put(&store, Tree::Attachments, "k", "v1");
    assert_eq!(
        store.get(Tree::Attachments, b"k").unwrap(),
        Some(b"v1".to_vec())
    );
    // Trees are separate keyspaces.
    assert_eq!(store.get(Tree::History, b"k").unwrap(), None);
    put(&store, Tree::Attachments, "k", "v2");
    assert_eq!(
        store.get(Tree::Attachments, b"k").unwrap(),
        Some(b"v2".to_vec())
    );
    assert_eq!(store.len(Tree::Attachments).unwrap(), 1);

    let mut batch = Batch::new();
    batch
        .delete(Tree::Attachments, "k")
        .delete(Tree::Attachments, "never-there");
    store.commit(batch).unwrap();
    assert_eq!(store.get(Tree::Attachments, b"k").unwrap(), None);
    assert!(store.is_empty(Tree::Attachments).unwrap());
    // A fresh store records its schema version and nothing else.
    assert_eq!(store.len(Tree::Meta).unwrap(), 1);
    assert!(store.is_empty(Tree::History).unwrap());

    // An empty batch is accepted and changes nothing.
    assert!(Batch::new().is_empty());
    store.commit(Batch::new()).unwrap();
    assert!(store.is_empty(Tree::Attachments).unwrap());
}

fn batch_spans_trees_in_order<S: Store>(store: S, _path: &Path) {
    put(&store, Tree::Attachments, "old", "x");
    let mut batch = Batch::new();
    batch
        .put(Tree::Attachments, "a", "1")
        .put(Tree::History, "a", "h1")
        .delete(Tree::Attachments, "old")
        // Later ops on the same key win, in both directions.
        .put(Tree::Attachments, "gone", "x")
        .delete(Tree::Attachments, "gone")
        .delete(Tree::History, "back")
        .put(Tree::History, "back", "h2");
    assert_eq!(batch.len(), 7);
    store.commit(batch).unwrap();

    assert_eq!(
        store.get(Tree::Attachments, b"a").unwrap(),
        Some(b"1".to_vec())
    );
    assert_eq!(
        store.get(Tree::History, b"a").unwrap(),
        Some(b"h1".to_vec())
    );
    assert_eq!(store.get(Tree::Attachments, b"old").unwrap(), None);
    assert_eq!(store.get(Tree::Attachments, b"gone").unwrap(), None);
    assert_eq!(
        store.get(Tree::History, b"back").unwrap(),
        Some(b"h2".to_vec())
    );
    assert_eq!(store.len(Tree::Attachments).unwrap(), 1);
    assert_eq!(store.len(Tree::History).unwrap(), 2);
}

fn scan_prefix_is_sorted_and_isolated<S: Store>(store: S, _path: &Path) {
    let mut batch = Batch::new();
    // Inserted out of order, with a neighbour network sharing the textual prefix.
    for k in [
        "b\0x",
        "a\0z",
        "ab\0a",
        "a\0b",
        "a\0a\0eth1",
        "a\0a\0eth0",
        "a",
        "\0",
    ] {
        batch.put(Tree::Attachments, k, k.to_uppercase());
    }
    batch.put(Tree::History, "a\0zz", "other tree");
    store.commit(batch).unwrap();

    let a = store.scan_prefix(Tree::Attachments, b"a\0").unwrap();
    assert_eq!(
        keys(&a),
        [&b"a\0a\0eth0"[..], b"a\0a\0eth1", b"a\0b", b"a\0z"]
    );
    assert_eq!(a[0].1, b"A\0A\0ETH0".to_vec());

    let all = store.scan_prefix(Tree::Attachments, b"").unwrap();
    assert_eq!(
        keys(&all),
        [
            &b"\0"[..],
            b"a",
            b"a\0a\0eth0",
            b"a\0a\0eth1",
            b"a\0b",
            b"a\0z",
            b"ab\0a",
            b"b\0x"
        ]
    );
    assert!(
        store
            .scan_prefix(Tree::Attachments, b"c")
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        keys(&store.scan_prefix(Tree::History, b"a").unwrap()),
        [&b"a\0zz"[..]]
    );
    // Keys only: the same keys, in the same order, as the full scan.
    for prefix in [&b"a\0"[..], b"", b"c"] {
        assert_eq!(
            store.scan_keys(Tree::Attachments, prefix).unwrap(),
            keys(&store.scan_prefix(Tree::Attachments, prefix).unwrap())
                .into_iter()
                .map(<[u8]>::to_vec)
                .collect::<Vec<_>>()
        );
    }
}

fn ledger_round_trips_records<S: Store>(store: S, _path: &Path) {
    let ledger = Ledger::new(store);
    let shared = ledger.clone();
    let r1 = record("a", "c1", "eth0");
    let mut r2 = record("a", "c1", "eth1");
    r2.owner = Owner::Agent {
        role: "router".into(),
    };
    r2.state = AttachmentState::Adding;
    r2.result = None;
    let r3 = record("ab", "c1", "eth0");
    let r4 = record("b", "c0", "eth0");
    for r in [&r4, &r3, &r2, &r1] {
        ledger.put(r).unwrap();
    }

    // Clones share the store.
    assert_eq!(shared.get(&r2.key).unwrap().as_ref(), Some(&r2));
    assert_eq!(shared.count().unwrap(), 4);
    assert_eq!(
        ledger.get(&AttachmentKey::new("a", "c1", "eth9")).unwrap(),
        None
    );

    assert_eq!(ledger.list(Some("a")).unwrap(), [r1.clone(), r2.clone()]);
    assert_eq!(ledger.list(Some("ab")).unwrap(), std::slice::from_ref(&r3));
    assert!(ledger.list(Some("")).unwrap().is_empty());
    assert_eq!(
        ledger.list(None).unwrap(),
        [r1.clone(), r2.clone(), r3.clone(), r4.clone()]
    );
    assert!(matches!(
        ledger.list(Some("a\0c1")),
        Err(StoreError::InvalidKey(_))
    ));

    let mut r1b = r1.clone();
    r1b.state = AttachmentState::Deleting;
    r1b.updated_at += 5;
    ledger.put(&r1b).unwrap();
    assert_eq!(ledger.get(&r1.key).unwrap(), Some(r1b));
    assert_eq!(ledger.count().unwrap(), 4);

    ledger.remove(&r1.key).unwrap();
    ledger.remove(&r1.key).unwrap(); // absent: still Ok
    assert_eq!(ledger.get(&r1.key).unwrap(), None);
    assert_eq!(ledger.count().unwrap(), 3);

    let bad = record("a", "c\0", "eth0");
    assert!(matches!(ledger.put(&bad), Err(StoreError::InvalidKey(_))));
    assert!(matches!(
        ledger.get(&bad.key),
        Err(StoreError::InvalidKey(_))
    ));
    assert!(matches!(
        ledger.remove(&bad.key),
        Err(StoreError::InvalidKey(_))
    ));
    assert_eq!(ledger.count().unwrap(), 3);
}

fn ledger_reports_undecodable_records<S: Store>(store: S, _path: &Path) {
    let ledger = Ledger::new(store);
    let good = record("n", "c1", "eth0");
    ledger.put(&good).unwrap();

    // A value that is not a record.
    let key = AttachmentKey::new("n", "c2", "eth0");
    put(
        ledger.store(),
        Tree::Attachments,
        "n\0c2\0eth0",
        "{not json",
    );
    let err = ledger.get(&key).unwrap_err();
    match &err {
        StoreError::Decode { tree, key, .. } => {
            assert_eq!(*tree, "attachments");
            assert_eq!(key, "n\\x00c2\\x00eth0");
        }
        other => panic!("expected Decode, got {other:?}"),
    }
    assert!(matches!(
        ledger.list(Some("n")),
        Err(StoreError::Decode { .. })
    ));

    // A valid record filed under another attachment's key must not answer for it.
    let mut batch = Batch::new();
    batch.put(
        Tree::Attachments,
        "n\0c2\0eth0",
        serde_json::to_vec(&good).unwrap(),
    );
    ledger.store().commit(batch).unwrap();
    let err = ledger.get(&key).unwrap_err();
    assert!(
        err.to_string().contains("record says its key is n/c1/eth0"),
        "{err}"
    );
}

fn schema_is_checked<S: Store>(store: S, path: &Path) {
    // The store is already at the current version: ensure_schema is idempotent.
    ensure_schema(&store, path).unwrap();
    assert_eq!(
        store.get(Tree::Meta, SCHEMA_KEY).unwrap(),
        Some(SCHEMA_VERSION.to_string().into_bytes())
    );

    put(&store, Tree::Meta, "schema_version", "99");
    match ensure_schema(&store, path).unwrap_err() {
        StoreError::SchemaTooNew {
            found: 99,
            supported: SCHEMA_VERSION,
            path: p,
        } => {
            assert_eq!(p, path)
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    put(&store, Tree::Meta, "schema_version", "0");
    assert!(matches!(
        ensure_schema(&store, path),
        Err(StoreError::Corrupt { .. })
    ));
    put(&store, Tree::Meta, "schema_version", "one");
    assert!(matches!(
        ensure_schema(&store, path),
        Err(StoreError::Corrupt { .. })
    ));

    // A missing version on an empty store is a fresh store...
    let mut batch = Batch::new();
    batch.delete(Tree::Meta, SCHEMA_KEY);
    store.commit(batch.clone()).unwrap();
    ensure_schema(&store, path).unwrap();
    assert_eq!(
        store.get(Tree::Meta, SCHEMA_KEY).unwrap(),
        Some(b"1".to_vec())
    );
    // ...but with records present it means the metadata was lost.
    put(&store, Tree::Attachments, "n\0c\0eth0", "{}");
    store.commit(batch).unwrap();
    let err = ensure_schema(&store, path).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("refuses to start"), "{err}");
}

macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod mem {
            $(
                #[test]
                fn $name() {
                    super::$name(crate::MemStore::default(), std::path::Path::new("<memory>"));
                }
            )*
        }
        mod sled {
            $(
                #[test]
                fn $name() {
                    let dir = tempfile::tempdir().unwrap();
                    super::$name(crate::sled_store::SledStore::open(dir.path()).unwrap(), dir.path());
                }
            )*
        }
    };
}

both_stores!(
    put_get_delete,
    batch_spans_trees_in_order,
    scan_prefix_is_sorted_and_isolated,
    ledger_round_trips_records,
    ledger_reports_undecodable_records,
    schema_is_checked,
);

// ---- MemStore only -----------------------------------------------------------------------

#[test]
fn mem_injected_failure_applies_nothing() {
    let store = MemStore::default();
    store.fail_next_commits(1);
    let mut batch = Batch::new();
    batch
        .put(Tree::Attachments, "a", "1")
        .put(Tree::History, "a", "1");
    assert!(matches!(
        store.commit(batch.clone()),
        Err(StoreError::Backend(_))
    ));
    assert!(store.is_empty(Tree::Attachments).unwrap());
    assert!(store.is_empty(Tree::History).unwrap());
    store.commit(batch).unwrap();
    assert_eq!(store.len(Tree::History).unwrap(), 1);
}

// ---- SledStore only ----------------------------------------------------------------------

pub(crate) mod sled_only {
    use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
    use std::os::unix::fs::FileExt;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};

    use super::*;
    use crate::sled_store::read_seq;

    #[test]
    fn data_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let recs: Vec<_> = (0..50)
            .map(|i| record("net", &format!("c{i:03}"), "eth0"))
            .collect();
        {
            let ledger = Ledger::new(SledStore::open(dir.path()).unwrap());
            for r in &recs {
                ledger.put(r).unwrap();
            }
            ledger.remove(&recs[7].key).unwrap();
            put(ledger.store(), Tree::History, "h", "v");
        }
        let ledger = Ledger::new(SledStore::open(dir.path()).unwrap());
        assert_eq!(ledger.store().path(), dir.path());
        assert_eq!(ledger.count().unwrap(), 49);
        assert_eq!(ledger.get(&recs[8].key).unwrap().as_ref(), Some(&recs[8]));
        assert_eq!(ledger.get(&recs[7].key).unwrap(), None);
        assert_eq!(ledger.list(Some("net")).unwrap().len(), 49);
        assert_eq!(
            ledger.store().get(Tree::History, b"h").unwrap(),
            Some(b"v".to_vec())
        );
        assert_eq!(ledger.store().len(Tree::Meta).unwrap(), 1);
    }

    #[test]
    fn second_open_is_locked() {
        let dir = tempfile::tempdir().unwrap();
        let first = SledStore::open(dir.path()).unwrap();
        let err = SledStore::open(dir.path()).unwrap_err();
        match &err {
            StoreError::Locked { path } => assert_eq!(path, dir.path()),
            other => panic!("expected Locked, got {other:?}"),
        }
        assert!(
            err.to_string().contains("in use by another dipamd"),
            "{err}"
        );
        drop(first);
        // The lock goes with the store.
        SledStore::open(dir.path()).unwrap();
    }

    #[test]
    fn newer_schema_is_refused_on_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = SledStore::open(dir.path()).unwrap();
            put(&store, Tree::Meta, "schema_version", "99");
        }
        for _ in 0..2 {
            // Twice: a refused open must not leave the lock held.
            match SledStore::open(dir.path()).unwrap_err() {
                StoreError::SchemaTooNew {
                    found: 99,
                    supported: 1,
                    ..
                } => {}
                other => panic!("expected SchemaTooNew, got {other:?}"),
            }
        }
    }

    /// A closed store with `n` records, for the damage tests.
    fn closed_store(n: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(SledStore::open(dir.path()).unwrap());
        for i in 0..n {
            ledger
                .put(&record("net", &format!("c{i:03}"), "eth0"))
                .unwrap();
        }
        dir
    }

    /// A half-written snapshot (`snap.<lsn>.generating`, as sled leaves one when its write
    /// failed on a full disk or the process died before the rename) is no damage: the store
    /// opens with everything it held. sled read it as the latest snapshot and refused to
    /// open, so a full disk ended with a ledger reported damaged.
    #[test]
    fn a_half_written_snapshot_is_no_damage() {
        let dir = closed_store(5);
        let planted = dir.path().join("snap.7FFFFFFFFFFFFFFF.generating");
        std::fs::write(&planted, b"half a snapshot, cut off by a full disk").unwrap();
        let ledger = Ledger::new(SledStore::open(dir.path()).unwrap());
        assert_eq!(ledger.count().unwrap(), 5);
        assert!(!planted.exists(), "the unfinished snapshot was left behind");
    }

    fn garble(path: &Path, offset: u64, len: usize) {
        let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(&vec![0xFF; len]).unwrap();
    }

    type Damage = fn(&Path);

    fn expect_corrupt(dir: &Path, what: &str) {
        match SledStore::open(dir) {
            Err(StoreError::Corrupt { path, detail }) => {
                assert_eq!(path, dir, "{what}");
                assert!(!detail.is_empty(), "{what}");
            }
            Err(other) => panic!("{what}: expected Corrupt, got {other:?}"),
            Ok(store) => panic!(
                "{what}: a damaged store opened with {} records",
                store.len(Tree::Attachments).unwrap()
            ),
        }
    }

    // sled 0.34 does not report these: it replays the log up to the first bad checksum and
    // opens what came before (measured: 104 of 200 records for the first case, 0 for the
    // rest). The commit witness turns each into Corrupt.
    #[test]
    fn damaged_data_file_is_refused() {
        let cases: [(&str, Damage); 4] = [
            ("4 KiB of 0xFF in the middle", |db| {
                let len = std::fs::metadata(db).unwrap().len();
                garble(db, len / 2, 4096);
            }),
            ("truncated to half", |db| {
                let f = std::fs::OpenOptions::new().write(true).open(db).unwrap();
                let len = f.metadata().unwrap().len();
                f.set_len(len / 2).unwrap();
            }),
            ("64 bytes of 0xFF near the start", |db| garble(db, 100, 64)),
            ("emptied", |db| std::fs::File::create(db).map(drop).unwrap()),
        ];
        for (what, damage) in cases {
            let dir = closed_store(200);
            damage(&dir.path().join("db"));
            expect_corrupt(dir.path(), what);
            // Refusing is stable: the failed open released the lock and changed nothing.
            expect_corrupt(dir.path(), what);
        }
    }

    #[test]
    fn removed_data_file_is_refused() {
        let dir = closed_store(3);
        std::fs::remove_file(dir.path().join("db")).unwrap();
        expect_corrupt(dir.path(), "db removed");
    }

    fn expect_corrupt_saying(dir: &Path, what: &str, saying: &str) {
        match SledStore::open(dir) {
            Err(e @ StoreError::Corrupt { .. }) => {
                let text = e.to_string();
                assert!(text.contains(saying), "{what}: {text}");
                assert!(text.contains("dipamctl recover"), "{what}: {text}");
            }
            Err(other) => panic!("{what}: expected Corrupt, got {other:?}"),
            Ok(store) => panic!(
                "{what}: opened with {} records",
                store.len(Tree::Attachments).unwrap()
            ),
        }
    }

    fn witness_path(dir: &Path) -> std::path::PathBuf {
        dir.join(crate::sled_store::WITNESS_FILE)
    }

    fn journal_path(dir: &Path) -> std::path::PathBuf {
        dir.join(crate::journal::JOURNAL_FILE)
    }

    /// The store exists (sled holds commits, the journal is there): a missing or garbled
    /// witness is refused, never recreated from what the store happens to hold. Above all
    /// with damage sled does not report, which the witness alone would have caught.
    #[test]
    fn a_lost_witness_is_refused() {
        let dir = closed_store(3);
        // 1 schema commit + 3 records, in the kernel and on the disk.
        assert_eq!(claims(dir.path()), (4, 4));
        std::fs::remove_file(witness_path(dir.path())).unwrap();
        expect_corrupt_saying(dir.path(), "witness removed", "witness");
        std::fs::write(witness_path(dir.path()), b"\xff\xfe").unwrap();
        expect_corrupt_saying(dir.path(), "witness garbled", "unreadable");
        std::fs::write(witness_path(dir.path()), b"").unwrap();
        expect_corrupt_saying(dir.path(), "witness emptied", "unreadable");

        // Issue shape: no witness, and sled's log garbled (sled opens what came before).
        let dir = closed_store(200);
        std::fs::remove_file(witness_path(dir.path())).unwrap();
        let db = dir.path().join("db");
        let len = std::fs::metadata(&db).unwrap().len();
        garble(&db, len / 2, 4096);
        expect_corrupt_saying(dir.path(), "witness removed, db garbled", "witness");

        // sled emptied too: the journal still says the store existed.
        let dir = closed_store(3);
        std::fs::remove_file(witness_path(dir.path())).unwrap();
        std::fs::remove_file(dir.path().join("db")).unwrap();
        expect_corrupt_saying(dir.path(), "witness and db removed", "journal is there");
    }

    /// A journal removed from a store whose witness claims commits is refused: it may have
    /// held acknowledged commits sled never wrote. A store of a build before the journal
    /// (an earlier witness, no journal) opens.
    #[test]
    fn a_lost_journal_is_refused() {
        let dir = closed_store(3);
        std::fs::remove_file(journal_path(dir.path())).unwrap();
        expect_corrupt_saying(dir.path(), "journal removed", "journal");
        // Still refused: the failed open created nothing.
        assert!(!journal_path(dir.path()).exists());
        expect_corrupt_saying(dir.path(), "journal removed", "journal");

        std::fs::write(witness_path(dir.path()), format!("{:020}\n", 4)).unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        assert_eq!(store.len(Tree::Attachments).unwrap(), 3);
        drop(store);
        assert_eq!(claims(dir.path()), (4, 4));
    }

    /// A fresh directory opens; so does one where a first start died before its first
    /// commit (the witness says nothing was acknowledged).
    #[test]
    fn fresh_stores_open() {
        let dir = tempfile::tempdir().unwrap();
        drop(SledStore::open(dir.path()).unwrap());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(witness_path(dir.path()), b"").unwrap();
        drop(SledStore::open(dir.path()).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let w = format!("v2 {:020} {:020} {:-<36}\n", 0, 0, "");
        std::fs::write(witness_path(dir.path()), w).unwrap();
        drop(SledStore::open(dir.path()).unwrap());
    }

    /// Every commit is claimed in the kernel slot; only Disk commits in the disk slot. In
    /// the boot that wrote it, the kernel claim binds (the page cache survived, so every
    /// acknowledged commit must be there); after a reboot only the disk claim does, since a
    /// power cut may take back a kernel-only commit and that is no damage.
    #[test]
    fn kernel_claims_bind_in_their_boot_only() {
        let dir = closed_store(1);
        // 1 schema commit + 1 record.
        assert_eq!(claims(dir.path()), (2, 2));
        let ledger = Ledger::new(SledStore::open(dir.path()).unwrap());
        ledger
            .put_with(
                &record("net", "p1", "eth0"),
                Durability::SurvivesProcessCrash,
            )
            .unwrap();
        assert_eq!(
            claims(dir.path()),
            (2, 3),
            "a Process commit is claimed in the kernel"
        );
        ledger.put(&record("net", "p2", "eth0")).unwrap();
        assert_eq!(claims(dir.path()), (4, 4), "a Disk commit claims both");
        drop(ledger);

        let held = last_seq(dir.path());
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap()
            .trim()
            .to_string();
        let witness = |disk: u64, kernel: u64, boot: &str| {
            std::fs::write(
                witness_path(dir.path()),
                format!("v2 {disk:020} {kernel:020} {boot:-<36}\n"),
            )
            .unwrap();
        };
        // Another boot acknowledged more in the kernel only: lost to a power cut, no damage.
        witness(held, held + 3, "00000000-0000-0000-0000-000000000000");
        drop(SledStore::open(dir.path()).unwrap());
        // This boot did: a commit acknowledged to a caller is missing.
        witness(held, held + 1, &boot);
        expect_corrupt_saying(dir.path(), "kernel claim ahead, this boot", "acknowledged");
        // A disk claim binds in any boot.
        witness(held + 1, held + 1, "00000000-0000-0000-0000-000000000000");
        expect_corrupt_saying(dir.path(), "disk claim ahead", "acknowledged");
    }

    /// Issue shape: the last journal record (a pod's ADD result, a kernel-only commit)
    /// garbled after a kill. Refused whatever the witness says: the record is whole-length,
    /// so it was written in full, and it may have been acknowledged. A record cut short
    /// instead (end marker missing, zeros after) was never acknowledged as on the disk: the
    /// store opens without it, unless this boot's witness claims it.
    #[test]
    fn a_garbled_last_journal_record_is_refused_and_a_torn_one_is_not() {
        let journaled = |dir: &Path| -> (u64, u64) {
            let seq = last_seq(dir);
            journal_commit(dir, seq + 1, &one_put("intent", "adding"));
            let start = std::fs::read(journal_path(dir))
                .unwrap()
                .iter()
                .rposition(|b| *b != 0)
                .unwrap() as u64
                + 1;
            journal_commit(dir, seq + 2, &one_put("result", "committed"));
            (seq, start)
        };

        let dir = closed_store(2);
        let (_, start) = journaled(dir.path());
        garble(&journal_path(dir.path()), start + 30, 1);
        expect_corrupt_saying(dir.path(), "last record garbled", "journal");

        // Torn: its last 10 bytes (the end marker among them) never written.
        let dir = closed_store(2);
        let (seq, _) = journaled(dir.path());
        let bytes = std::fs::read(journal_path(dir.path())).unwrap();
        let end = bytes.iter().rposition(|b| *b != 0).unwrap() + 1;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(journal_path(dir.path()))
            .unwrap();
        f.write_all_at(&[0; 10], (end - 10) as u64).unwrap();
        // This boot's witness claims it: a commit acknowledged in the kernel is missing.
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        std::fs::write(
            witness_path(dir.path()),
            format!("v2 {seq:020} {:020} {:-<36}\n", seq + 2, boot.trim()),
        )
        .unwrap();
        expect_corrupt_saying(dir.path(), "torn, claimed", "acknowledged");
        // Not claimed (the process died inside the append): opens, without it.
        std::fs::write(
            witness_path(dir.path()),
            format!("v2 {seq:020} {:020} {:-<36}\n", seq + 1, boot.trim()),
        )
        .unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        assert_eq!(
            store.get(Tree::History, b"intent").unwrap(),
            Some(b"adding".to_vec())
        );
        assert_eq!(store.get(Tree::History, b"result").unwrap(), None);
    }

    /// The number of the last commit of a closed store: a clean close claims every commit.
    fn last_seq(dir: &Path) -> u64 {
        claims(dir).0
    }

    /// The witness's (disk, kernel) claims.
    fn claims(dir: &Path) -> (u64, u64) {
        let text = std::fs::read_to_string(dir.join(crate::sled_store::WITNESS_FILE)).unwrap();
        let fields: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(fields[0], "v2", "{text}");
        (fields[1].parse().unwrap(), fields[2].parse().unwrap())
    }

    /// Appends commit `seq` to the journal of a closed store, as a run killed before sled
    /// wrote that commit to its own log would have left it.
    fn journal_commit(dir: &Path, seq: u64, batch: &Batch) {
        let (mut journal, _, _) = crate::journal::Journal::open(dir).unwrap();
        journal.append(seq, batch).unwrap();
    }

    fn one_put(key: &str, value: &str) -> Batch {
        let mut batch = Batch::new();
        batch.put(Tree::History, key, value);
        batch
    }

    /// A commit that reached the journal and not sled's log (a kill before sled's background
    /// flush) is there after the next open, and the witness then claims it.
    #[test]
    fn an_open_replays_what_only_the_journal_holds() {
        let dir = closed_store(2);
        let seq = last_seq(dir.path());
        assert!(
            crate::journal::read(dir.path()).is_empty(),
            "a clean close empties it"
        );
        journal_commit(dir.path(), seq + 1, &one_put("a", "1"));
        journal_commit(dir.path(), seq + 2, &one_put("b", "2"));
        {
            let store = SledStore::open(dir.path()).unwrap();
            assert_eq!(store.get(Tree::History, b"a").unwrap(), Some(b"1".to_vec()));
            assert_eq!(store.get(Tree::History, b"b").unwrap(), Some(b"2".to_vec()));
            // Replayed into sled's files: the journal is empty again, numbering goes on.
            assert!(crate::journal::read(dir.path()).is_empty());
            put(&store, Tree::History, "c", "3");
        }
        assert_eq!(last_seq(dir.path()), seq + 3);
        let store = SledStore::open(dir.path()).unwrap();
        assert_eq!(store.len(Tree::History).unwrap(), 3);
        assert_eq!(store.len(Tree::Attachments).unwrap(), 2);
    }

    /// Commits the journal holds that sled already has are not applied twice, and a journal
    /// that does not continue sled's numbering is refused: there is a hole.
    #[test]
    fn an_open_replays_only_what_continues_sled() {
        let dir = closed_store(1);
        let seq = last_seq(dir.path());
        // Already in sled (a delete of a key sled holds would otherwise remove it).
        let mut stale = Batch::new();
        stale.delete(
            Tree::Attachments,
            AttachmentKey::new("net", "c000", "eth0").encode().unwrap(),
        );
        journal_commit(dir.path(), seq, &stale);
        journal_commit(dir.path(), seq + 1, &one_put("next", "1"));
        {
            let store = SledStore::open(dir.path()).unwrap();
            assert_eq!(
                store.len(Tree::Attachments).unwrap(),
                1,
                "{seq} was applied again"
            );
            assert_eq!(
                store.get(Tree::History, b"next").unwrap(),
                Some(b"1".to_vec())
            );
        }
        // A journal that continues past a hole: sled lost commits it had made durable.
        let seq = last_seq(dir.path());
        journal_commit(dir.path(), seq + 2, &one_put("after-a-hole", "1"));
        expect_corrupt_saying(dir.path(), "a hole before the journal", "continues from");
    }

    /// A journal is no way to patch over a damaged sled: when sled lost commits older than
    /// the journal's first record, the store is refused as before.
    #[test]
    fn a_journal_does_not_hide_damage() {
        let dir = closed_store(200);
        let seq = last_seq(dir.path());
        journal_commit(dir.path(), seq + 1, &one_put("later", "1"));
        let db = dir.path().join("db");
        let len = std::fs::metadata(&db).unwrap().len();
        garble(&db, len / 2, 4096);
        expect_corrupt(dir.path(), "sled garbled, journal ahead of it");
        // Refused without replaying anything into sled: still refused.
        expect_corrupt(dir.path(), "sled garbled, journal ahead of it");
        assert_eq!(crate::journal::read(dir.path()).len(), 1);
    }

    /// Past its bound the journal is checkpointed (sled made durable, journal emptied), so an
    /// open never replays more than that; nothing is lost on the way.
    #[test]
    fn the_journal_is_checkpointed_past_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let value = "v".repeat(16 * 1024);
        let commits = (crate::journal::CHECKPOINT_BYTES / value.len() as u64) as usize + 20;
        let store = SledStore::open(dir.path()).unwrap();
        for i in 0..commits {
            let mut batch = Batch::new();
            batch.put(Tree::History, format!("k{i:05}"), value.as_str());
            store
                .commit_with(batch, Durability::SurvivesProcessCrash)
                .unwrap();
        }
        // The applier checkpoints once it has written the commits into sled.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let journaled = crate::journal::read(dir.path()).len();
            if journaled < 30 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{journaled} records in the journal after {commits} commits"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        drop(store);
        let store = SledStore::open(dir.path()).unwrap();
        assert_eq!(store.len(Tree::History).unwrap(), commits);
    }

    /// What reads return while commits are pending (in the journal, not yet in sled) and
    /// after the applier wrote them into sled is the same, for every kind of read.
    #[test]
    fn reads_are_the_same_before_and_after_the_applier() {
        let dir = closed_store(3);
        let store = SledStore::open(dir.path()).unwrap();
        let key = |c: &str| AttachmentKey::new("net", c, "eth0").encode().unwrap();
        let mut batch = Batch::new();
        batch
            .delete(Tree::Attachments, key("c001"))
            .put(Tree::Attachments, key("c007"), b"new".to_vec())
            .put(Tree::Attachments, key("c000"), b"changed".to_vec())
            .put(Tree::History, "h", "1");
        store
            .commit_with(batch, Durability::SurvivesProcessCrash)
            .unwrap();
        let read = |store: &SledStore| {
            (
                store.get(Tree::Attachments, &key("c000")).unwrap(),
                store.get(Tree::Attachments, &key("c001")).unwrap(),
                store.scan_prefix(Tree::Attachments, b"").unwrap(),
                store.scan_keys(Tree::Attachments, b"").unwrap(),
                store.len(Tree::Attachments).unwrap(),
                store.len(Tree::History).unwrap(),
            )
        };
        let pending = read(&store);
        assert!(
            !store.inner.pending.lock().unwrap().is_empty(),
            "the commit went into sled at once"
        );
        assert_eq!(pending.0.as_deref(), Some(&b"changed"[..]));
        assert_eq!(pending.1, None);
        assert_eq!(pending.3.len(), 3);
        assert_eq!((pending.4, pending.5), (3, 1));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !store.inner.pending.lock().unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline, "never applied");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(read(&store), pending);
        // In sled itself now, with its number.
        assert_eq!(
            store.inner.engine.read().unwrap().as_ref().unwrap().trees[Tree::History.index()]
                .get("h")
                .unwrap()
                .as_deref(),
            Some(&b"1"[..])
        );
        assert_eq!(
            read_seq(
                &store.inner.engine.read().unwrap().as_ref().unwrap().db,
                dir.path()
            )
            .unwrap(),
            last_seq(dir.path()) + 1
        );
    }

    /// A journal that cannot be written (a full disk) does not fail commits: the store falls
    /// back to sled's own transaction, flush and fdatasync, in commit order, and the next
    /// open has everything.
    #[test]
    fn a_failed_journal_append_falls_back_to_sled() {
        let dir = closed_store(1);
        let store = SledStore::open(dir.path()).unwrap();
        put(&store, Tree::History, "before", "1");
        store
            .inner
            .commits
            .lock()
            .unwrap()
            .journal
            .as_mut()
            .unwrap()
            .fail_next_append = true;
        put(&store, Tree::History, "failed-append", "2");
        assert!(store.fault().is_none(), "the fall-back is no fault");
        store
            .commit_with(one_put("after", "3"), Durability::SurvivesProcessCrash)
            .unwrap();
        let mut del = Batch::new();
        del.delete(Tree::History, "before");
        store.commit(del).unwrap();
        let expect = |store: &SledStore| {
            assert_eq!(store.get(Tree::History, b"before").unwrap(), None);
            assert_eq!(
                store.get(Tree::History, b"failed-append").unwrap(),
                Some(b"2".to_vec())
            );
            assert_eq!(
                store.get(Tree::History, b"after").unwrap(),
                Some(b"3".to_vec())
            );
            assert_eq!(store.len(Tree::Attachments).unwrap(), 1);
        };
        expect(&store);
        // The applier makes sled durable and starts a fresh journal, without a reopen or a restart.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while store.inner.commits.lock().unwrap().journal.is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the journal never came back"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        expect(&store);
        store
            .commit_with(one_put("journaled", "4"), Durability::SurvivesProcessCrash)
            .unwrap();
        // Through the journal again.
        assert_eq!(
            crate::journal::read(dir.path())
                .last()
                .map(|e| e.batch.clone()),
            Some(one_put("journaled", "4"))
        );
        let (_, kernel) = claims(dir.path());
        drop(store);
        assert_eq!(
            last_seq(dir.path()),
            kernel,
            "a clean close claims the last commit on the disk"
        );
        let store = SledStore::open(dir.path()).unwrap();
        expect(&store);
        // A fresh journal again.
        assert!(store.inner.commits.lock().unwrap().journal.is_some());
    }

    /// A small tmpfs mounted for one test, unmounted on drop.
    pub(crate) struct SmallFs {
        dir: tempfile::TempDir,
    }

    impl SmallFs {
        /// `None` when not root (mounting needs it).
        pub(crate) fn mount(bytes: u64) -> Option<Self> {
            let dir = tempfile::tempdir().unwrap();
            let ok = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "dipam-test"])
                .arg(dir.path())
                .status()
                .is_ok_and(|s| s.success());
            ok.then_some(Self { dir })
        }

        pub(crate) fn path(&self) -> &Path {
            self.dir.path()
        }

        /// Writes a filler file until the file system is full.
        pub(crate) fn fill(&self) -> std::path::PathBuf {
            let path = self.path().join("filler");
            let mut f = std::fs::File::create(&path).unwrap();
            let chunk = vec![0xAB; 64 * 1024];
            while f.write_all(&chunk).is_ok() {}
            let _ = f.sync_all();
            path
        }
    }

    impl Drop for SmallFs {
        fn drop(&mut self) {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }

    fn rss_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// A full disk under the store: commits fail (at once, saying the disk is full, once
    /// the first has), reads never spin (sled's own `len` did, at 100% CPU with memory
    /// growing, under its sticky write error), memory stays bounded, and once space returns
    /// the store takes commits again without being reopened by its owner. Nothing
    /// acknowledged is lost on the way, and the store opens again afterwards.
    #[test]
    fn a_full_disk_faults_and_recovers_without_a_restart() {
        let Some(fs) = SmallFs::mount(24 * 1024 * 1024) else {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        };
        let dir = fs.path().join("state");
        let store = SledStore::open(&dir).unwrap();
        let filler = fs.fill();
        let value = "v".repeat(2048);
        let mut acked = Vec::new();
        let mut failed = None;
        for i in 0..20_000 {
            let mut batch = Batch::new();
            batch.put(Tree::History, format!("k{i:06}"), value.as_str());
            match store.commit(batch) {
                Ok(()) => acked.push(i),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let failed = failed.expect("every commit succeeded on a full disk");
        eprintln!("{} commits acknowledged, then: {failed}", acked.len());
        assert!(failed.is_disk_full(), "{failed}");
        let fault = store.fault().expect("no fault reported");
        assert!(fault.contains("full"), "{fault}");
        // Reads come back (with a value or an error), and memory does not grow with them.
        let rss = rss_kib();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..200 {
                    let _ = store.len(Tree::History);
                    let _ = store.scan_keys(Tree::History, b"");
                    let _ = store.get(Tree::History, b"k000001");
                }
                tx.send(()).unwrap();
            });
            // A guard against a hang, not a timing: 200 rounds take well under a second.
            rx.recv_timeout(std::time::Duration::from_secs(120))
                .expect("reads spin on a full disk");
        });
        assert!(
            rss_kib() < rss + 32 * 1024,
            "RSS grew from {rss} to {} KiB",
            rss_kib()
        );
        // Later commits fail at once, with the cause.
        match store.commit(one_put("while-full", "1")) {
            Err(e @ StoreError::Unavailable { .. }) => {
                assert!(e.is_disk_full(), "{e}");
                assert!(e.to_string().contains("free space"), "{e}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }

        // A start on this file system is refused, saying how much it needs.
        match SledStore::open(&fs.path().join("other")) {
            Err(e @ StoreError::NoSpace { .. }) => {
                assert!(e.is_disk_full());
                assert!(e.to_string().contains("needs at least"), "{e}");
            }
            other => panic!("expected NoSpace, got {other:?}"),
        }

        std::fs::remove_file(&filler).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while store.fault().is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "still failing after space returned: {:?}",
                store.fault()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        store.commit(one_put("after", "1")).unwrap();
        let check = |store: &SledStore| {
            for i in &acked {
                assert!(
                    store
                        .get(Tree::History, format!("k{i:06}").as_bytes())
                        .unwrap()
                        .is_some(),
                    "acknowledged k{i:06} lost"
                );
            }
            assert!(store.get(Tree::History, b"after").unwrap().is_some());
        };
        check(&store);
        drop(store);
        check(&SledStore::open(&dir).unwrap());
    }

    /// Env var naming the directory the crash child writes to. Its presence is what makes
    /// [`crash_child`] do anything.
    const CRASH_DIR_ENV: &str = "DIPAM_STATE_CRASH_DIR";
    /// Env var with the key prefix the crash child uses, distinct per round.
    const CRASH_ROUND_ENV: &str = "DIPAM_STATE_CRASH_ROUND";
    /// Acknowledgements to wait for before the kill.
    const ACKS_BEFORE_KILL: usize = 150;
    /// The signal `Child::kill` sends on Unix (9 on Linux; not worth a libc dependency).
    const SIGKILL: i32 = 9;

    /// Child half of [`kill_9_loses_no_acknowledged_commit`]: commits records until killed,
    /// printing `ACK <key>` after each commit returns. Does nothing when run by hand.
    #[test]
    #[ignore = "helper process for kill_9_loses_no_acknowledged_commit"]
    fn crash_child() {
        let (Some(dir), Some(round)) = (
            std::env::var_os(CRASH_DIR_ENV),
            std::env::var(CRASH_ROUND_ENV).ok(),
        ) else {
            return;
        };
        let store = SledStore::open(Path::new(&dir)).unwrap();
        let mut out = std::io::stdout().lock();
        // Bounded so a parent that never kills cannot leave it running forever.
        for i in 0..100_000 {
            let container = format!("r{round}-c{i:06}");
            let rec = record("crash", &container, "eth0");
            let key = rec.key.encode().unwrap();
            let mut batch = Batch::new();
            // Two trees in one batch: the parent checks they survive together.
            batch
                .put(
                    Tree::Attachments,
                    key.clone(),
                    serde_json::to_vec(&rec).unwrap(),
                )
                .put(Tree::History, key, container.clone());
            // Every other commit only into the kernel: a kill must not lose those either.
            let durability = if i % 2 == 0 {
                Durability::SurvivesPowerCut
            } else {
                Durability::SurvivesProcessCrash
            };
            store.commit_with(batch, durability).unwrap();
            writeln!(out, "ACK {container}").unwrap();
            out.flush().unwrap();
        }
    }

    /// Runs [`crash_child`] on `dir` until it has acknowledged [`ACKS_BEFORE_KILL`]
    /// commits, SIGKILLs it, and returns every container it acknowledged.
    fn crash_round(dir: &Path, round: usize) -> Vec<String> {
        let mut acked = Vec::new();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "suite::sled_only::crash_child",
                "--nocapture",
            ])
            .env(CRASH_DIR_ENV, dir)
            .env(CRASH_ROUND_ENV, round.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut this_round = 0;
        for line in lines.by_ref() {
            if let Some(key) = line.unwrap().strip_prefix("ACK ") {
                acked.push(key.to_string());
                this_round += 1;
                if this_round == ACKS_BEFORE_KILL {
                    child.kill().unwrap(); // SIGKILL
                    break;
                }
            }
        }
        // Lines already in the pipe were printed after their commit returned: also acked.
        for line in lines {
            if let Some(key) = line.unwrap().strip_prefix("ACK ") {
                acked.push(key.to_string());
            }
        }
        let status = child.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(SIGKILL),
            "round {round}: child was not killed mid-loop ({status}); acks seen: {this_round}"
        );
        acked
    }

    /// Issue shape, with a real kill: the last whole journal record garbled afterwards (it
    /// holds an acknowledged commit, whether or not sled's background flush wrote it too).
    /// The open is refused, and refused again: nothing was replayed or released meanwhile.
    #[test]
    fn kill_9_then_a_garbled_last_journal_record_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let acked = crash_round(dir.path(), 0);
        assert!(!acked.is_empty());
        let bytes = std::fs::read(journal_path(dir.path())).unwrap();
        let (entries, end) = crate::journal::parse(&bytes);
        assert!(!entries.is_empty(), "the kill left no journal");
        // A payload byte of the last whole record.
        garble(&journal_path(dir.path()), end as u64 - 12, 1);
        expect_corrupt_saying(dir.path(), "last record garbled after kill -9", "journal");
        expect_corrupt_saying(dir.path(), "last record garbled after kill -9", "journal");
    }

    /// kill -9 at an arbitrary point of a commit loop loses nothing that was acknowledged,
    /// whether the commit went to the disk or only to the kernel (`Durability::SurvivesProcessCrash`), and
    /// never leaves half a batch. Three rounds on one directory, so recovery of an
    /// already-recovered store is covered too.
    #[test]
    fn kill_9_loses_no_acknowledged_commit() {
        let dir = tempfile::tempdir().unwrap();
        let mut acked: Vec<String> = Vec::new();
        for round in 0..3 {
            acked.extend(crash_round(dir.path(), round));
        }

        // What the kills left in the journal is what sled's log may lack; the open replays it.
        let journaled = crate::journal::read(dir.path());
        assert!(
            !journaled.is_empty(),
            "the last round's commits are not in the journal"
        );
        let store = SledStore::open(dir.path()).unwrap();
        for container in &acked {
            let key = AttachmentKey::new("crash", container.as_str(), "eth0")
                .encode()
                .unwrap();
            assert!(
                store.get(Tree::Attachments, &key).unwrap().is_some(),
                "acknowledged {container} lost"
            );
        }
        // All or nothing per batch: the trees hold exactly the same keys.
        let attachments = store.scan_prefix(Tree::Attachments, b"").unwrap();
        let history = store.scan_prefix(Tree::History, b"").unwrap();
        assert_eq!(keys(&attachments), keys(&history));
        // At most one commit per round can have landed without its ACK being printed.
        assert!(attachments.len() >= acked.len() && attachments.len() <= acked.len() + 3);
        let ledger = Ledger::new(store);
        assert_eq!(ledger.list(Some("crash")).unwrap().len(), attachments.len());
    }
}

//! Tests of the reads that decode one record at a time ([`Ledger::for_each`],
//! [`Ledger::index`], [`Ledger::select`]) against what a whole scan returns: dipamd's start
//! builds its census, address index and replay lists from them (docs/performance.md, run 29).

use std::sync::Arc;

use crate::{
    AttachmentRecord, AttachmentState, Durability, Holder, Ledger, MemStore, Owner, Store, Tree,
    sled_store::SledStore,
};

/// Records over three networks, several pages of [`Store::visit_prefix`] (256 a page on
/// sled), with every owner, a non-root creator and records not committed.
pub(crate) fn records(n: usize) -> Vec<AttachmentRecord> {
    (0..n)
        .map(|i| {
            let mut r = crate::suite::record(&format!("net{}", i % 3), &format!("c{i:05}"), "eth0");
            r.result = Some(serde_json::json!({"ips":[{"address": format!("10.{}.{}.{}/8", i / 65536, i / 256 % 256, i % 256)}]}));
            match i % 10 {
                1 => r.owner = Owner::Pool,
                2 => {
                    r.owner = Owner::Agent {
                        role: "router".into(),
                    }
                }
                3 => r.creator_uid = Some(1000 + (i % 2) as u32),
                4 => {
                    r.state = AttachmentState::Adding;
                    r.result = None;
                }
                5 => r.state = AttachmentState::Deleting,
                _ => {}
            }
            r
        })
        .collect()
}

/// What a whole scan of the store decodes, in key order: the reads before the streamed ones.
fn scanned<S: Store + ?Sized>(store: &S) -> Vec<AttachmentRecord> {
    store
        .scan_prefix(Tree::Attachments, b"")
        .unwrap()
        .iter()
        .map(|(_, v)| serde_json::from_slice(v).unwrap())
        .collect()
}

/// Everything the census counts, in a comparable form.
fn counted<S: Store + ?Sized>(l: &Ledger<S>) -> String {
    l.census(|c| {
        let mut groups: Vec<_> = c
            .groups()
            .map(|(k, g)| format!("{k:?} {:?} {:?} {}", g.v4, g.v6, g.len()))
            .collect();
        groups.sort();
        let mut cids: Vec<_> = c.container_ids().map(str::to_owned).collect();
        cids.sort();
        let not_committed = c.keys_where(|e| e.state != AttachmentState::Committed);
        format!(
            "{} {:?} {:?} {groups:?} {} {not_committed:?}",
            c.len(),
            c.of_uid(1000),
            c.of_uid(1001),
            cids.len()
        )
    })
    .unwrap()
}

/// On real sled, with commits made just before the read (the applier may not have written
/// them into sled yet, so the pages lay the pending ones over sled's), the streamed pass
/// sees exactly what a whole scan sees, and the census it builds equals one built from a
/// whole scan (a `MemStore` copy, whose visit reads the prefix whole).
#[test]
fn a_streamed_pass_reads_what_a_whole_scan_reads() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SledStore::open(dir.path()).unwrap());
    let recs = records(1_000);
    let writer = Ledger::from_arc(store.clone());
    writer
        .put_all(&recs[..900], Durability::SurvivesPowerCut)
        .unwrap();
    // Pending at the read, most likely: puts across pages, a replacement, removals.
    writer
        .put_all(&recs[900..], Durability::SurvivesProcessCrash)
        .unwrap();
    let mut changed = recs[300].clone();
    changed.owner = Owner::Pool;
    writer.put(&changed).unwrap();
    writer
        .remove_all(
            &[recs[0].key.clone(), recs[511].key.clone()],
            Durability::SurvivesProcessCrash,
        )
        .unwrap();

    let l = Ledger::from_arc(store.clone());
    let mut seen = Vec::new();
    l.index(|r| seen.push(r.clone())).unwrap();
    let whole = scanned(&*store);
    assert_eq!(seen.len(), 998);
    assert_eq!(seen, whole, "the streamed pass and a whole scan differ");
    assert_eq!(l.census_scans(), 1, "the census came from the same pass");
    assert_eq!(
        l.list(Some("net1")).unwrap(),
        whole
            .iter()
            .filter(|r| r.key.network == "net1")
            .cloned()
            .collect::<Vec<_>>()
    );

    let rebuilt = Ledger::new(MemStore::new());
    rebuilt
        .put_all(&whole, Durability::SurvivesPowerCut)
        .unwrap();
    assert_eq!(counted(&l), counted(&rebuilt));

    // The census's selections are what filtering every record gives, with no scan.
    let pool = l.select(|e| e.holder == Holder::Pool).unwrap();
    let want: Vec<_> = whole
        .iter()
        .filter(|r| r.owner == Owner::Pool)
        .cloned()
        .collect();
    assert_eq!(pool, want);
    let unsettled = l
        .select(|e| e.state != AttachmentState::Committed && e.creator_uid.is_none())
        .unwrap();
    let want: Vec<_> = whole
        .iter()
        .filter(|r| r.state != AttachmentState::Committed && r.creator_uid.is_none())
        .cloned()
        .collect();
    assert!(!want.is_empty());
    assert_eq!(unsettled, want);
    assert_eq!(l.census_scans(), 1, "a selection scanned the ledger");
}

/// A selection follows the commits made after the census was built, and leaves out a record
/// removed since.
#[test]
fn a_selection_follows_the_commits() {
    let l = Ledger::new(MemStore::new());
    let recs = records(40);
    l.put_all(&recs, Durability::SurvivesPowerCut).unwrap();
    // In key order: the network first (c00012 is net0's, c00002 net2's).
    let agent = |l: &Ledger<MemStore>| {
        l.select(|e| e.holder == Holder::Agent)
            .unwrap()
            .into_iter()
            .map(|r| r.key.container_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(agent(&l), ["c00012", "c00022", "c00002", "c00032"]);
    l.remove(&recs[12].key).unwrap();
    let mut moved = recs[3].clone();
    moved.owner = Owner::Agent {
        role: "health".into(),
    };
    l.put(&moved).unwrap();
    assert_eq!(agent(&l), ["c00003", "c00022", "c00002", "c00032"]);
    assert_eq!(l.census_scans(), 1);
}

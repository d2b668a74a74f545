//! Tests of [`Ledger::page`] (and so [`Store::visit_after`]) on real sled on disk: the
//! pages of a listing (`dipamctl attachments`) hold every record once, filters included,
//! while records come and go between them.

use std::sync::Arc;

use crate::{
    AttachmentRecord, Durability, Ledger, MemStore, Owner, Store, sled_store::SledStore,
    streamed::records,
};

/// Every page of a listing of `network` whose records `keep` accepts, `size` a page: the
/// records in order, and each page's length. `between` runs after each page but the last,
/// with the last record listed.
fn pages<S: Store>(
    l: &Ledger<S>,
    network: Option<&str>,
    size: usize,
    keep: impl Fn(&AttachmentRecord) -> bool,
    mut between: impl FnMut(&AttachmentRecord),
) -> (Vec<AttachmentRecord>, Vec<usize>) {
    let (mut all, mut lens) = (Vec::new(), Vec::new());
    let mut after: Option<Vec<u8>> = None;
    loop {
        let (page, next) = l.page(network, after.as_deref(), size, &keep).unwrap();
        lens.push(page.len());
        all.extend(page);
        match next {
            Some(n) => {
                assert_eq!(
                    Some(&n),
                    all.last().map(|r| r.key.encode().unwrap()).as_ref()
                );
                between(all.last().expect("a page with a next one is not empty"));
                after = Some(n);
            }
            None => return (all, lens),
        }
    }
}

/// A sled ledger in `dir` holding `recs`, the last hundred committed just before (most
/// likely still pending when read, so pages lay them over sled's entries).
fn sled(dir: &std::path::Path, recs: &[AttachmentRecord]) -> Ledger<SledStore> {
    let l = Ledger::from_arc(Arc::new(SledStore::open(dir).unwrap()));
    let cut = recs.len().saturating_sub(100);
    l.put_all(&recs[..cut], Durability::SurvivesPowerCut)
        .unwrap();
    l.put_all(&recs[cut..], Durability::SurvivesProcessCrash)
        .unwrap();
    l
}

/// Whole listings, by page sizes on and across sled's read pages (256 entries), read every
/// record once and in key order: what one whole read returns, with every page but the last
/// full. The in-memory twin pages the same.
#[test]
fn the_pages_of_a_listing_hold_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let recs = records(1_000);
    let l = sled(dir.path(), &recs);
    let whole = l.list(None).unwrap();
    assert_eq!(whole.len(), 1_000);
    let mem = Ledger::new(MemStore::new());
    mem.put_all(&recs, Durability::SurvivesPowerCut).unwrap();
    for size in [1, 7, 255, 256, 257, 500, 999, 1_000, 5_000] {
        let (all, lens) = pages(&l, None, size, |_| true, |_| {});
        assert_eq!(all, whole, "page size {size}");
        assert_eq!(lens.len(), 1_000_usize.div_ceil(size), "page size {size}");
        assert!(
            lens[..lens.len() - 1].iter().all(|&n| n == size),
            "{lens:?}"
        );
        assert_eq!(pages(&mem, None, size, |_| true, |_| {}).0, whole);
    }
    // A page size of 0 reads one record a page, never none forever.
    assert_eq!(l.page(None, None, 0, |_| true).unwrap().0.len(), 1);
}

/// With a network and an owner filter, the filters apply while reading: each page is full
/// of matching records (not a page of records with the others dropped), and the pages hold
/// exactly the matching records.
#[test]
fn filtered_pages_are_full_of_matching_records() {
    let dir = tempfile::tempdir().unwrap();
    let recs = records(1_500);
    let l = sled(dir.path(), &recs);
    let whole = l.list(None).unwrap();
    let pool = |r: &AttachmentRecord| r.owner == Owner::Pool;
    let (all, lens) = pages(&l, None, 40, pool, |_| {});
    let want: Vec<_> = whole.iter().filter(|r| pool(r)).cloned().collect();
    assert_eq!(want.len(), 150);
    assert_eq!(all, want);
    assert_eq!(lens, [40, 40, 40, 30]);

    let (all, lens) = pages(&l, Some("net1"), 100, |_| true, |_| {});
    assert_eq!(all, l.list(Some("net1")).unwrap());
    assert_eq!(lens, [100, 100, 100, 100, 100]);
    let (all, _) = pages(&l, Some("net2"), 9, pool, |_| {});
    let want: Vec<_> = whole
        .iter()
        .filter(|r| r.key.network == "net2" && pool(r))
        .cloned()
        .collect();
    assert!(!want.is_empty());
    assert_eq!(all, want);
    assert!(
        pages(&l, Some("no-such-net"), 9, |_| true, |_| {})
            .0
            .is_empty()
    );
    // A token of another network's key (a caller's mistake or a forgery) starts that
    // network's listing at its start or ends it; it never reads outside the network.
    let (page, _) = l.page(Some("net1"), Some(b"net0"), 5, |_| true).unwrap();
    assert_eq!(page, l.list(Some("net1")).unwrap()[..5]);
    let (page, next) = l.page(Some("net1"), Some(b"net2"), 5, |_| true).unwrap();
    assert!(page.is_empty() && next.is_none());
}

/// Records removed and added between pages: every record present for the whole listing is
/// listed exactly once; none is listed twice; one removed before its page is not listed,
/// one added after the listing passed its key is not, one added ahead of it is.
#[test]
fn records_that_come_and_go_between_pages_move_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let recs = records(900);
    let l = sled(dir.path(), &recs);
    let before = l.list(None).unwrap();
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    let (all, _) = pages(
        &l,
        None,
        50,
        |_| true,
        |last| {
            // Remove the last record listed, and one not listed yet; add one behind the
            // listing and one ahead of it.
            let i = before.iter().position(|r| r.key == last.key).unwrap();
            let mut gone = vec![last.key.clone()];
            if let Some(ahead) = before.get(i + 25) {
                gone.push(ahead.key.clone());
                removed.push(ahead.key.clone());
            }
            l.remove_all(&gone, Durability::SurvivesProcessCrash)
                .unwrap();
            let n = added.len();
            let behind = crate::suite::record("net0", &format!("b{n:05}"), "eth0");
            let front = crate::suite::record("net2", &format!("z{n:05}"), "eth0");
            l.put_all(&[behind, front.clone()], Durability::SurvivesProcessCrash)
                .unwrap();
            added.push(front.key);
        },
    );
    let keys: std::collections::HashSet<_> = all.iter().map(|r| r.key.clone()).collect();
    assert_eq!(keys.len(), all.len(), "a record was listed twice");
    assert!(removed.len() > 10, "{removed:?}");
    for r in &before {
        assert_eq!(
            keys.contains(&r.key),
            !removed.contains(&r.key),
            "{}: present throughout, so listed; removed before its page, so not",
            r.key
        );
    }
    assert!(
        !keys.iter().any(|k| k.container_id.starts_with('b')),
        "behind"
    );
    // The added ones ahead sort after every net2 record listed before they came.
    assert!(added.iter().all(|k| keys.contains(k)), "ahead");
}

/// [`Store::visit_after`] on `store`: it starts just after the key given (at the prefix's
/// start for none, or for a key sorting before the prefix), stays inside the prefix and the
/// tree, and stops where the visitor breaks.
fn visit_after_starts_after_and_stops<S: Store>(store: &S) {
    use std::ops::ControlFlow;

    use crate::{Batch, Tree};
    let mut batch = Batch::new();
    for k in ["a\0x", "b\0a", "b\0b", "b\0c", "b\0d", "bb\0a", "c\0a"] {
        batch.put(Tree::Attachments, k, k.to_uppercase());
    }
    batch.put(Tree::History, "b\0bb", "other tree");
    store.commit(batch).unwrap();
    let visit = |after: Option<&[u8]>, stop: usize| {
        let mut seen: Vec<String> = Vec::new();
        store
            .visit_after(Tree::Attachments, b"b\0", after, &mut |k, v| {
                assert_eq!(v, k.to_ascii_uppercase());
                seen.push(String::from_utf8(k.to_vec()).unwrap());
                Ok(if seen.len() == stop {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                })
            })
            .unwrap();
        seen
    };
    assert_eq!(visit(None, 9), ["b\0a", "b\0b", "b\0c", "b\0d"]);
    assert_eq!(visit(Some(b"b\0b"), 9), ["b\0c", "b\0d"]);
    assert_eq!(
        visit(Some(b"b\0bb"), 9),
        ["b\0c", "b\0d"],
        "a key no record has"
    );
    assert_eq!(visit(Some(b"a\0x"), 9), ["b\0a", "b\0b", "b\0c", "b\0d"]);
    assert!(visit(Some(b"b\0d"), 9).is_empty());
    assert!(visit(Some(b"c"), 9).is_empty());
    assert_eq!(
        visit(None, 2),
        ["b\0a", "b\0b"],
        "stopped where the visitor broke"
    );
}

/// A store that keeps the trait's default [`Store::visit_after`] (a whole scan, filtered).
struct Defaults(MemStore);

impl Store for Defaults {
    fn get(&self, tree: crate::Tree, key: &[u8]) -> Result<Option<Vec<u8>>, crate::StoreError> {
        self.0.get(tree, key)
    }
    fn scan_prefix(
        &self,
        tree: crate::Tree,
        prefix: &[u8],
    ) -> Result<Vec<crate::KeyValue>, crate::StoreError> {
        self.0.scan_prefix(tree, prefix)
    }
    fn commit_with(&self, batch: crate::Batch, d: Durability) -> Result<(), crate::StoreError> {
        self.0.commit_with(batch, d)
    }
    fn len(&self, tree: crate::Tree) -> Result<usize, crate::StoreError> {
        self.0.len(tree)
    }
}

#[test]
fn visit_after_is_the_same_on_every_store() {
    let dir = tempfile::tempdir().unwrap();
    visit_after_starts_after_and_stops(&SledStore::open(dir.path()).unwrap());
    visit_after_starts_after_and_stops(&MemStore::new());
    visit_after_starts_after_and_stops(&Defaults(MemStore::new()));
}

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

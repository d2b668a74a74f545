//! The ledger's census (dipam-state `census.rs`), which dipamd builds at start and keeps for
//! its whole life, measured on a real sled ledger with the unit tests' counting allocator.

use crate::testing::{dense, held};

/// At 3,000 pods the census keeps one copy of each key, under 640 B per record, where three
/// copies of every key and a hash set per container ID kept ~1,100 (11.3 MB at 10,000,
/// docs/performance.md, run 48); and it still answers by container ID, group and state.
#[test]
fn the_census_keeps_one_copy_of_each_key() {
    const N: usize = 3_000;
    let _one = held::one_at_a_time();
    let rt = held::runtime();
    let (d, records) = dense::pods(N);
    drop(records);
    // sled's cache filled first: its pages are not the census's.
    let _ = d.whole(&rt);
    let ledger = &d.node.core.ledger;
    let scans = ledger.census_scans();
    let (n, peak, kept) = held::measure_kept(&rt, async { ledger.count() });
    assert_eq!(n.unwrap(), N);
    assert_eq!(
        ledger.census_scans(),
        scans + 1,
        "the census was built by this count"
    );
    eprintln!(
        "census of {N}: {kept} B kept ({} B per record), {peak} B at its peak",
        kept / N
    );
    assert!(kept < N * 640, "the census keeps {} B per record", kept / N);
    ledger
        .census(|c| {
            let using: Vec<_> = c.using_container_id(&dense::cid(7)).collect();
            assert_eq!(using.len(), 1, "{using:?}");
            assert_eq!(using[0].0.container_id, dense::cid(7));
            assert_eq!(using[0].1, None, "root's record");
            assert_eq!(c.using_container_id("nobody").count(), 0);
            let groups: Vec<_> = c.groups().collect();
            assert_eq!(groups.len(), 1, "one network, creator and config");
            assert_eq!(groups[0].1.len(), N);
            assert_eq!(groups[0].1.records.pods, N as u64);
            let sample = groups[0].1.sample().expect("a member").clone();
            assert!(c.entry(&sample).is_some());
            assert_eq!(
                c.keys_where(|e| e.state == dipam_state::AttachmentState::Committed)
                    .len(),
                N
            );
            assert_eq!(c.container_ids().count(), N);
        })
        .unwrap();
}

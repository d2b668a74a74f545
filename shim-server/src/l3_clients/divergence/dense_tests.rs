//! The reconcile on a dense node: real sled on disk, 3,000 records shaped as a runtime's pods
//! leave them, host-local's real directory layout. It finds exactly the divergences planted
//! (addresses missing from the store, a reservation no record names, a blank file, an
//! adopted record whose pod was deleted around dipamd), and holds a fraction of what the
//! network's records take decoded: it once held them all, twice cloned (docs/performance.md,
//! run 32).

use dipam_state::AttachmentKey;

use super::*;
use crate::testing::{
    dense::{self, NET},
    held,
};

const N: usize = 3_000;

#[test]
fn the_reconcile_finds_every_divergence_and_holds_no_record() {
    let _one = held::one_at_a_time();
    let rt = held::runtime();
    let (dir, data, mut records) = dense::unsaved(N);
    // An adopted record (read from the store once) whose file is gone: its pod was deleted
    // around dipamd.
    records[7].request_id = import::ADOPTED.into();
    let d = dense::node(&records, dir);
    let missing = [7, 10, 11, 2_999];
    for i in (0..N).filter(|i| !missing.contains(i)) {
        d.reserve(dense::ip(i), &format!("{}\r\neth0", dense::cid(i)));
    }
    let stranger: IpAddr = "10.60.200.1".parse().unwrap();
    let blank: IpAddr = "10.60.200.2".parse().unwrap();
    d.reserve(stranger, "ffff\r\neth0");
    d.reserve(blank, "");
    let dc = DelegateConf {
        kind: "host-local".into(),
        network: NET.into(),
        version: rscni_types::version::SpecVersion::CURRENT,
        conf: dense::config(&data),
    };
    let node = d.node.clone();
    let whole = d.whole(&rt);

    let ((div, ranges), peak) =
        held::measure(&rt, async { look(&node.watch(), &dc, None).await.unwrap() });
    let div = div.expect("host-local's store is read");
    let key = |i: usize| AttachmentKey::new(NET, dense::cid(i), "eth0");
    let mut want: Vec<String> = missing
        .iter()
        .map(|&i| format!("{} ({})", dense::ip(i), key(i)))
        .collect();
    want.sort();
    let mut got = div.missing.clone();
    got.sort();
    assert_eq!(got, want, "every address the store lacks, and no other");
    let unrecorded: Vec<(IpAddr, &str)> = div
        .unrecorded
        .iter()
        .map(|r| (r.ip, r.container_id.as_str()))
        .collect();
    assert_eq!(unrecorded, vec![(stranger, "ffff"), (blank, "")]);
    let gone: Vec<&AttachmentRecord> = div.gone_adopted.iter().collect();
    assert_eq!(gone, vec![&records[7]], "the adopted record, whole");
    // 3 of the 2,999 pod records counted for the refusal are missing: not all of them.
    assert_eq!(div.misconfigured.is_some(), on_tmpfs(&data));
    let v4 = ranges.iter().find(|r| r.family == "ipv4").unwrap();
    assert_eq!((v4.pods, v4.orphans), ((N - missing.len()) as u64, Some(2)));
    eprintln!("whole network decoded: {whole} B; the reconcile's peak: {peak} B");
    assert!(
        peak * 2 < whole,
        "the reconcile held {peak} B at its peak, the network's records take {whole} B decoded"
    );
}

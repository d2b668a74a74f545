//! F13: a burst of 200 concurrent requests. dipamd runs a bounded number at once, answers the
//! overflow promptly with code 11 instead of queueing forever, keeps its memory bounded, and
//! accounts for every address it did hand out.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use dipam_lifecycle::{Attachment, Lab, flood::rss_kib, require_root};

#[test]
fn burst_of_200_is_bounded_and_accounted_for() {
    require_root!();
    let lab = Lab::with_flags(
        "ptp-dipam-host-local.conflist",
        &["--max-concurrent", "4", "--max-queue", "32"],
    );
    let pid = lab.dipamd.pid().unwrap();
    let pods: Vec<Attachment> = (0..200)
        .map(|i| Attachment::new(&format!("burst-{i}"), "/var/run/netns/none"))
        .collect();
    let started = Instant::now();
    let outcomes: Vec<Result<(), u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|p| {
                let lab = &lab;
                s.spawn(move || {
                    lab.rt
                        .ipam(lab.list(), 0, "ADD", p, None)
                        .map(|_| ())
                        .map_err(|e| e.code)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = started.elapsed();
    let ok = outcomes.iter().filter(|o| o.is_ok()).count();
    let busy = outcomes.iter().filter(|o| **o == Err(11)).count();
    assert_eq!(ok + busy, 200, "only success or 11 expected: {outcomes:?}");
    assert!(ok > 0);
    assert!(
        took < Duration::from_secs(60),
        "overflow was not answered promptly: {took:?}"
    );
    let rss = rss_kib(pid);
    assert!(rss < 96 * 1024, "dipamd RSS {rss} KiB after the burst");
    assert_eq!(lab.delegate_store().len(), ok);
    lab.assert_agree();
    // The runtime DELs every attachment, failed ADDs included (spec §5); 11 means retry.
    for p in &pods {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match lab.rt.ipam(lab.list(), 0, "DEL", p, None) {
                Ok(_) => break,
                Err(e) if e.code == 11 && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    assert!(lab.delegate_store().is_empty());
    lab.assert_agree();
    eprintln!("burst: {ok} served, {busy} told to retry, {took:?}, dipamd RSS {rss} KiB");
}

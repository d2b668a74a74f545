//! Measures how much an open of the store grows the state directory, the numbers behind
//! `dipam_state::needed_to_open` (docs/configuration.md, "Free space"):
//!
//! ```text
//! cargo run -p dipam-state --example open_growth -- DIR RECORDS [killed]
//! ```
//!
//! writes RECORDS ledger-sized records into a new store in DIR, closes it (or, with
//! `killed`, dies without closing it, as kill -9 would, leaving its journal to replay), then
//! opens and closes it three times and prints the peak of the blocks the directory used.

// A measuring tool: a panic is its error report.
#![allow(clippy::unwrap_used)]

use dipam_state::{Batch, Durability, Store, Tree};
use std::path::Path;
fn used(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        use std::os::unix::fs::MetadataExt;
        total += m.blocks() * 512;
    }
    total
}
fn main() {
    let dir = std::env::args().nth(1).unwrap();
    let n: usize = std::env::args().nth(2).unwrap().parse().unwrap();
    let dir = Path::new(&dir);
    let killed = std::env::args().nth(3).is_some();
    if killed && std::env::var_os("CHILD").is_none() {
        // The writer dies without closing the store (as kill -9 would): its journal is
        // what the next open replays.
        let st = std::process::Command::new(std::env::current_exe().unwrap())
            .args(std::env::args().skip(1))
            .env("CHILD", "1")
            .status()
            .unwrap();
        assert!(!st.success());
    } else {
        let store = dipam_state::open(dir).unwrap();
        for i in 0..n {
            let mut b = Batch::new();
            b.put(
                Tree::Attachments,
                format!("net\0c{i:06}\0eth0"),
                vec![b'x'; 900],
            );
            b.put(Tree::History, format!("h{i:06}"), vec![b'y'; 300]);
            store
                .commit_with(b, Durability::SurvivesProcessCrash)
                .unwrap();
        }
        if killed {
            std::process::abort();
        }
        drop(store);
        if std::env::var_os("CHILD").is_some() {
            return;
        }
    }
    let journal = std::fs::read(dir.join("dipam-journal")).unwrap();
    let used_journal = journal.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    let before = used(dir);
    let db_before = std::fs::metadata(dir.join("db")).unwrap().len();
    let mut peak = before;
    for _ in 0..3 {
        let store = dipam_state::open(dir).unwrap();
        peak = peak.max(used(dir));
        drop(store);
        peak = peak.max(used(dir));
    }
    let db_after = std::fs::metadata(dir.join("db")).unwrap().len();
    println!(
        "{n} records, journal {used_journal} bytes used: dir {before} -> peak {peak} (+{}), db file {db_before} -> {db_after}",
        peak - before
    );
}

//! Commits that are in the journal and not yet in sled: what a [`crate::sled_store::SledStore`] read must
//! see on top of sled, and what its applier writes into sled a few milliseconds later.
//!
//! Why not write sled at once: every sled 0.34 transaction seals its I/O buffer twice
//! (`pin_log`: `roll_iobuf`, then the batch's own buffer), and each seal hands a write to
//! sled's I/O pool with `notify_all`, waking all seven of its idle threads. On the 2-CPU
//! benchmark machine that chain ran beside the delegate's start (the intent) and the
//! plugin's last netlink step (the result) of every pod's ADD (a `perf sched` timeline,
//! docs/performance.md). Deferred, one transaction carries every commit of a burst, after
//! the burst.
//!
//! Kept because it is measured: docs/performance.md, "What was done, and what each change
//! measured", row "sled written by an applier thread" (ADD (b) 4.93 -> 4.49 ms, 8-way pods/s
//! 1.41x -> 1.82x). Remove it only with a run of dipam-bench that shows the gain gone.
//!
//! Only the newest op per key is kept: applying those is the same as applying every pending
//! commit in order, since each op is a blind put or delete.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::store::Op;
use crate::{Batch, KeyValue, Tree};

/// A key's newest pending op: the commit it came from, and the value (`None`: deleted).
type Newest = (u64, Option<Vec<u8>>);

/// The pending ops, per tree.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    trees: [BTreeMap<Vec<u8>, Newest>; Tree::ALL.len()],
    /// The last commit added, and when; when the oldest pending one was added.
    last: u64,
    last_at: Option<Instant>,
    since: Option<Instant>,
}

/// What an applier writes into sled: the net effect of the pending commits up to `upto`.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub upto: u64,
    pub ops: Batch,
}

impl Pending {
    /// Adds commit `seq`'s ops. Returns true when nothing was pending before (the applier
    /// has something to do).
    pub fn add(&mut self, seq: u64, batch: Batch) -> bool {
        let was_empty = self.is_empty();
        for op in batch.into_ops() {
            match op {
                Op::Put { tree, key, value } => {
                    self.trees[tree.index()].insert(key, (seq, Some(value)));
                }
                Op::Delete { tree, key } => {
                    self.trees[tree.index()].insert(key, (seq, None));
                }
            }
        }
        let now = Instant::now();
        self.last = seq;
        self.last_at = Some(now);
        if was_empty {
            self.since = Some(now);
        }
        was_empty
    }

    pub fn is_empty(&self) -> bool {
        self.trees.iter().all(BTreeMap::is_empty)
    }

    /// When the last commit was added, and when the oldest pending one was.
    pub fn times(&self) -> Option<(Instant, Instant)> {
        self.last_at.zip(self.since).filter(|_| !self.is_empty())
    }

    /// `Some(value or None)` when `key` has a pending op; `None` when sled has the answer.
    pub fn get(&self, tree: Tree, key: &[u8]) -> Option<Option<Vec<u8>>> {
        self.trees[tree.index()].get(key).map(|(_, v)| v.clone())
    }

    /// The pending ops on keys starting with `prefix`, sorted by key.
    pub fn overlay(&self, tree: Tree, prefix: &[u8]) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        self.trees[tree.index()]
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, (_, v))| (k.clone(), v.clone()))
            .collect()
    }

    /// Every pending op, for the applier; `None` when nothing is pending.
    pub fn snapshot(&self) -> Option<Snapshot> {
        if self.is_empty() {
            return None;
        }
        let mut ops = Batch::new();
        for (tree, entries) in Tree::ALL.iter().zip(&self.trees) {
            for (key, (_, value)) in entries {
                match value {
                    Some(value) => ops.put(*tree, key.clone(), value.clone()),
                    None => ops.delete(*tree, key.clone()),
                };
            }
        }
        Some(Snapshot {
            upto: self.last,
            ops,
        })
    }

    /// Forgets the ops of commits up to `upto`, now in sled. A key written again since keeps
    /// its newer op.
    pub fn applied(&mut self, upto: u64) {
        for entries in &mut self.trees {
            entries.retain(|_, (seq, _)| *seq > upto);
        }
        if self.is_empty() {
            self.since = None;
        }
    }
}

/// `base` (sorted, from sled) with `overlay` (sorted, pending) laid over it.
pub(crate) fn merge(
    base: Vec<KeyValue>,
    overlay: Vec<(Vec<u8>, Option<Vec<u8>>)>,
) -> Vec<KeyValue> {
    if overlay.is_empty() {
        return base;
    }
    let mut all: BTreeMap<Vec<u8>, Vec<u8>> = base.into_iter().collect();
    for (key, value) in overlay {
        match value {
            Some(value) => all.insert(key, value),
            None => all.remove(&key),
        };
    }
    all.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(tree: Tree, k: &str, v: &str) -> Batch {
        let mut b = Batch::new();
        b.put(tree, k, v);
        b
    }

    #[test]
    fn the_newest_op_per_key_wins_and_survives_an_older_apply() {
        let mut p = Pending::default();
        assert!(p.add(1, put(Tree::Attachments, "a", "1")));
        assert!(!p.add(2, put(Tree::Attachments, "b", "1")));
        let mut del = Batch::new();
        del.delete(Tree::Attachments, "b")
            .put(Tree::History, "a", "h");
        p.add(3, del);
        assert_eq!(p.get(Tree::Attachments, b"a"), Some(Some(b"1".to_vec())));
        assert_eq!(p.get(Tree::Attachments, b"b"), Some(None));
        assert_eq!(p.get(Tree::Attachments, b"c"), None);
        assert_eq!(p.get(Tree::History, b"b"), None);

        let snap = p.snapshot().unwrap();
        assert_eq!(snap.upto, 3);
        assert_eq!(snap.ops.len(), 3);
        // Written again while the applier ran: the newer op stays pending.
        p.add(4, put(Tree::Attachments, "a", "2"));
        p.applied(snap.upto);
        assert_eq!(p.get(Tree::Attachments, b"a"), Some(Some(b"2".to_vec())));
        assert_eq!(p.get(Tree::Attachments, b"b"), None);
        assert!(!p.is_empty());
        p.applied(4);
        assert!(p.is_empty() && p.snapshot().is_none() && p.times().is_none());
    }

    #[test]
    fn overlays_merge_over_sled_by_prefix() {
        let mut p = Pending::default();
        p.add(1, put(Tree::Attachments, "n/b", "new"));
        p.add(2, put(Tree::Attachments, "n/d", "4"));
        p.add(3, put(Tree::Attachments, "o/x", "other"));
        let mut del = Batch::new();
        del.delete(Tree::Attachments, "n/a");
        p.add(4, del);
        let base: Vec<KeyValue> = [("n/a", "1"), ("n/b", "2"), ("n/c", "3")]
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        let merged = merge(base, p.overlay(Tree::Attachments, b"n/"));
        let merged: Vec<(&[u8], &[u8])> = merged
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
            .collect();
        assert_eq!(
            merged,
            [
                (&b"n/b"[..], &b"new"[..]),
                (&b"n/c"[..], &b"3"[..]),
                (&b"n/d"[..], &b"4"[..])
            ]
        );
    }
}

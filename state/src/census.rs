//! What dipamd asks of the whole ledger on a request's path, kept beside it instead of read
//! from it: how many records there are, which uid created each and how large it is, and
//! which attachments use a container ID. Each of these was one scan of every record per
//! request: a non-root ADD counted its uid's records and looked for its container ID in
//! every record, and `dipamctl status` counted them all, so at 2,500 attachments a
//! non-root ADD and a status call paid for 2,500 decoded records (docs/performance.md).
//!
//! The census is built from one scan (dipamd does it at start, before serving) and then
//! follows every commit [`Ledger`](crate::Ledger) makes: a put replaces the key's entry, a
//! delete drops it. Both are keyed by the attachment, so an update is idempotent, and the
//! census is exact as long as the commits of one key are not concurrent (dipamd writes a key
//! only under that key's lock). Nothing of it is on disk: a restart or a crash rebuilds it
//! from the ledger, which is the truth.

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
};

use crate::record::{AttachmentKey, AttachmentRecord};

/// What the census keeps of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The non-root uid whose ADD created it (None: root, the agent, the pool).
    pub creator_uid: Option<u32>,
    /// Its size as encoded in the ledger.
    pub bytes: u64,
    /// The container ID the delegate holds it under, when not the key's.
    pub delegate_cid: Option<String>,
}

impl Entry {
    fn of(rec: &AttachmentRecord, bytes: u64) -> Self {
        let delegate_cid = rec
            .delegate_key
            .as_ref()
            .filter(|d| d.container_id != rec.key.container_id)
            .map(|d| d.container_id.clone());
        Self {
            creator_uid: rec.creator_uid,
            bytes,
            delegate_cid,
        }
    }
}

/// The counts, as one view under the census's lock.
#[derive(Debug, Default)]
pub struct Counts {
    entries: HashMap<AttachmentKey, Entry>,
    /// uid -> (records, bytes) of the records it created.
    by_uid: HashMap<u32, (usize, u64)>,
    /// container ID (the key's or the delegate's) -> the attachments using it.
    by_cid: HashMap<String, HashSet<AttachmentKey>>,
}

impl Counts {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The records `uid` created and their bytes.
    pub fn of_uid(&self, uid: u32) -> (usize, u64) {
        self.by_uid.get(&uid).copied().unwrap_or_default()
    }

    /// The entry of `key`'s record, if there is one.
    pub fn entry(&self, key: &AttachmentKey) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// The attachments whose key or delegate key uses container ID `cid`, with their
    /// creators.
    pub fn using_container_id<'a>(
        &'a self,
        cid: &str,
    ) -> impl Iterator<Item = (&'a AttachmentKey, Option<u32>)> + 'a {
        self.by_cid
            .get(cid)
            .into_iter()
            .flatten()
            .filter_map(|k| self.entries.get(k).map(|e| (k, e.creator_uid)))
    }

    fn insert(&mut self, key: AttachmentKey, entry: Entry) {
        self.remove(&key);
        if let Some(uid) = entry.creator_uid {
            let t = self.by_uid.entry(uid).or_default();
            t.0 += 1;
            t.1 += entry.bytes;
        }
        for cid in std::iter::once(&key.container_id).chain(entry.delegate_cid.as_ref()) {
            self.by_cid
                .entry(cid.clone())
                .or_default()
                .insert(key.clone());
        }
        self.entries.insert(key, entry);
    }

    fn remove(&mut self, key: &AttachmentKey) {
        let Some(old) = self.entries.remove(key) else {
            return;
        };
        if let Some(uid) = old.creator_uid
            && let Some(t) = self.by_uid.get_mut(&uid)
        {
            t.0 -= 1;
            t.1 -= old.bytes;
            if t.0 == 0 {
                self.by_uid.remove(&uid);
            }
        }
        for cid in std::iter::once(&key.container_id).chain(old.delegate_cid.as_ref()) {
            if let Some(set) = self.by_cid.get_mut(cid) {
                set.remove(key);
                if set.is_empty() {
                    self.by_cid.remove(cid);
                }
            }
        }
    }
}

/// The census of one ledger, shared by its clones; built on first use.
#[derive(Debug, Default)]
pub(crate) struct Census {
    counts: Mutex<Option<Counts>>,
    /// Full scans the census made (tests: a request must not cause one).
    scans: std::sync::atomic::AtomicU64,
}

/// One change a commit made, applied once the commit succeeded.
pub(crate) enum Change {
    Put(AttachmentKey, Entry),
    Gone(AttachmentKey),
}

impl Change {
    pub(crate) fn put(rec: &AttachmentRecord, bytes: usize) -> Self {
        Change::Put(rec.key.clone(), Entry::of(rec, bytes as u64))
    }
}

impl Census {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Counts>> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the counts, building them first with `scan` (every record and its encoded
    /// size) if they were never built.
    pub(crate) fn with<R, E>(
        &self,
        scan: impl FnOnce() -> Result<Vec<(AttachmentRecord, usize)>, E>,
        f: impl FnOnce(&Counts) -> R,
    ) -> Result<R, E> {
        let mut counts = self.lock();
        if counts.is_none() {
            // Built under the lock: a commit that lands during the scan applies its change
            // after it (it waits for the lock), and a change is idempotent.
            let mut built = Counts::default();
            for (rec, bytes) in scan()? {
                built.insert(rec.key.clone(), Entry::of(&rec, bytes as u64));
            }
            self.scans
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *counts = Some(built);
        }
        Ok(f(counts.as_ref().expect("built above")))
    }

    /// Applies what a successful commit changed; nothing while the census is not built (its
    /// scan will read the commit).
    pub(crate) fn apply(&self, changes: Vec<Change>) {
        let mut counts = self.lock();
        let Some(c) = counts.as_mut() else {
            return;
        };
        for change in changes {
            match change {
                Change::Put(k, e) => c.insert(k, e),
                Change::Gone(k) => c.remove(&k),
            }
        }
    }

    pub(crate) fn scans(&self) -> u64 {
        self.scans.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use crate::{AttachmentKey, DelegateKey, Durability, Ledger, MemStore, Store, Tree};

    /// What a fresh scan of the ledger would count: the census must always agree with it.
    fn rebuilt(store: std::sync::Arc<MemStore>) -> Vec<(Option<u32>, usize, u64)> {
        now(&Ledger::from_arc(store))
    }

    fn now(l: &Ledger<MemStore>) -> Vec<(Option<u32>, usize, u64)> {
        let mut out: Vec<_> = [None, Some(7), Some(8)]
            .into_iter()
            .map(|uid| {
                let (n, b) = match uid {
                    Some(u) => l.census(|c| c.of_uid(u)).unwrap(),
                    None => (l.count().unwrap(), 0),
                };
                (uid, n, b)
            })
            .collect();
        out.sort();
        out
    }

    /// Every write path of the ledger keeps the census equal to a rebuild from the records,
    /// with no scan after the first; the container-ID index follows the delegate's key too.
    #[test]
    fn the_census_follows_every_commit_without_scanning() {
        let store = std::sync::Arc::new(MemStore::new());
        let l = Ledger::from_arc(store.clone());
        assert_eq!(l.count().unwrap(), 0);
        assert_eq!(l.census_scans(), 1);
        let mut a = crate::suite::record("n", "a", "eth0");
        a.creator_uid = Some(7);
        let mut b = crate::suite::record("n", "b", "eth0");
        b.creator_uid = Some(7);
        b.delegate_config = "x".repeat(5000);
        let mut c = crate::suite::record("m", "a", "eth0");
        c.creator_uid = Some(8);
        l.put(&a).unwrap();
        l.put_all(&[b.clone(), c.clone()], Durability::SurvivesPowerCut)
            .unwrap();
        assert_eq!(now(&l), rebuilt(store.clone()));
        let (n, bytes) = l.census(|c| c.of_uid(7)).unwrap();
        assert_eq!(n, 2);
        assert!(bytes > 5000, "{bytes}");
        assert_eq!(l.census(|c| c.using_container_id("a").count()).unwrap(), 2);
        // A pooled attachment handed to a pod: the delegate's container ID names it too.
        let mut taken = crate::suite::record("n", "pod", "eth0");
        taken.delegate_key = Some(DelegateKey {
            container_id: "dipam-pool-1".into(),
            ifname: "eth0".into(),
            netns: String::new(),
            cni_args: String::new(),
        });
        l.put_removing(&taken, &a.key, Durability::SurvivesPowerCut)
            .unwrap();
        assert_eq!(now(&l), rebuilt(store.clone()));
        let pool: Vec<_> = l
            .census(|c| {
                c.using_container_id("dipam-pool-1")
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap();
        assert_eq!(pool, vec![taken.key.clone()]);
        // Replacing a record counts it once, with its new size.
        b.delegate_config.clear();
        l.put(&b).unwrap();
        assert_eq!(now(&l), rebuilt(store.clone()));
        l.remove(&b.key).unwrap();
        l.remove_all(
            &[c.key.clone(), AttachmentKey::new("x", "y", "z")],
            Durability::SurvivesPowerCut,
        )
        .unwrap();
        assert_eq!(now(&l), rebuilt(store.clone()));
        assert_eq!(l.census(|c| c.of_uid(7)).unwrap(), (0, 0));
        assert_eq!(l.census(|c| c.using_container_id("a").count()).unwrap(), 0);
        assert_eq!(l.census_scans(), 1, "a commit made the census scan again");
        assert_eq!(store.len(Tree::Attachments).unwrap(), l.count().unwrap());
    }
}

//! An in-memory [`Store`] with the same semantics as [`crate::sled_store::SledStore`], for unit tests of
//! code above the store (the ledger, the daemon's handlers).

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::schema::{SCHEMA_KEY, SCHEMA_VERSION};
use crate::store::Op;
use crate::{Batch, Durability, KeyValue, Store, StoreError, Tree, VisitUntil};

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

/// A [`Store`] kept in a `Mutex<BTreeMap>` per tree. Nothing is persisted.
///
/// [`MemStore::default`] looks like a freshly opened store: the meta tree already records
/// [`SCHEMA_VERSION`].
#[derive(Debug)]
pub struct MemStore {
    trees: Mutex<HashMap<Tree, Map>>,
    /// Number of upcoming commits that fail, for testing error paths above the store.
    fail_commits: AtomicUsize,
    /// Commits that still succeed before `fail_commits` starts counting.
    pass_commits: AtomicUsize,
    /// Commits made with [`Durability::SurvivesProcessCrash`], for tests of which commits may skip the disk.
    process_commits: AtomicUsize,
    /// What [`Store::fault`] reports, for tests of health reports.
    fault: Mutex<Option<String>>,
}

impl Default for MemStore {
    fn default() -> Self {
        let mut meta = Map::new();
        meta.insert(SCHEMA_KEY.to_vec(), SCHEMA_VERSION.to_string().into_bytes());
        let mut trees = HashMap::new();
        trees.insert(Tree::Meta, meta);
        Self {
            trees: Mutex::new(trees),
            fail_commits: AtomicUsize::new(0),
            pass_commits: AtomicUsize::new(0),
            process_commits: AtomicUsize::new(0),
            fault: Mutex::new(None),
        }
    }
}

impl MemStore {
    /// A fresh store (same as [`Default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the next `n` non-empty commits fail with [`StoreError::Backend`] without applying
    /// anything, as a full disk would.
    pub fn fail_next_commits(&self, n: usize) {
        self.fail_commits.store(n, Ordering::SeqCst);
    }

    /// Lets the next `pass` non-empty commits succeed, then fails `n`: reaches the second
    /// commit of a two-commit operation (an intent, then its result).
    pub fn fail_commits_after(&self, pass: usize, n: usize) {
        self.pass_commits.store(pass, Ordering::SeqCst);
        self.fail_commits.store(n, Ordering::SeqCst);
    }

    /// Makes [`Store::fault`] report `fault` (`None`: healthy), as a
    /// sled store (`crate::sled_store::SledStore`) whose writes fail would. Commits are not affected: combine with
    /// [`MemStore::fail_next_commits`].
    pub fn set_fault(&self, fault: Option<&str>) {
        if let Ok(mut f) = self.fault.lock() {
            *f = fault.map(str::to_owned);
        }
    }

    /// How many commits so far asked only for [`Durability::SurvivesProcessCrash`].
    pub fn process_commits(&self) -> usize {
        self.process_commits.load(Ordering::SeqCst)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, HashMap<Tree, Map>>, StoreError> {
        // A poisoned lock means a panic mid-access; every commit applies fully under one lock
        // hold and cannot panic half-way, so the data is still consistent, but report it rather
        // than hide a bug in a test.
        self.trees
            .lock()
            .map_err(|_| StoreError::Backend("MemStore mutex poisoned".into()))
    }
}

impl Store for MemStore {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock()?.get(&tree).and_then(|m| m.get(key)).cloned())
    }

    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
        let trees = self.lock()?;
        let Some(map) = trees.get(&tree) else {
            return Ok(Vec::new());
        };
        Ok(map
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    /// As on sled: a few entries at a time, the lock let go between them (so a commit may
    /// land between two, as on sled), until `visit` breaks.
    fn visit_after(
        &self,
        tree: Tree,
        prefix: &[u8],
        after: Option<&[u8]>,
        visit: &mut VisitUntil<'_>,
    ) -> Result<(), StoreError> {
        const PAGE: usize = 64;
        let mut from = crate::store::start_after(prefix, after);
        loop {
            let page: Vec<KeyValue> = match self.lock()?.get(&tree) {
                Some(map) => map
                    .range::<Vec<u8>, _>((from.clone(), Bound::Unbounded))
                    .take_while(|(k, _)| k.starts_with(prefix))
                    .take(PAGE)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                None => Vec::new(),
            };
            for (k, v) in &page {
                if visit(k, v)?.is_break() {
                    return Ok(());
                }
            }
            match page.last() {
                Some((last, _)) if page.len() == PAGE => from = Bound::Excluded(last.clone()),
                _ => return Ok(()),
            }
        }
    }

    /// In memory every commit is as durable as it gets, so `durability` is only counted
    /// ([`MemStore::process_commits`]).
    fn commit_with(&self, batch: Batch, durability: Durability) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let passed = self
            .pass_commits
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let failed = !passed
            && self
                .fail_commits
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if failed {
            return Err(StoreError::Backend(
                "MemStore: injected commit failure".into(),
            ));
        }
        if durability == Durability::SurvivesProcessCrash {
            self.process_commits.fetch_add(1, Ordering::SeqCst);
        }
        let mut trees = self.lock()?;
        for op in batch.ops() {
            match op {
                Op::Put { tree, key, value } => {
                    trees
                        .entry(*tree)
                        .or_default()
                        .insert(key.clone(), value.clone());
                }
                Op::Delete { tree, key } => {
                    if let Some(map) = trees.get_mut(tree) {
                        map.remove(key);
                    }
                }
            }
        }
        Ok(())
    }

    fn len(&self, tree: Tree) -> Result<usize, StoreError> {
        Ok(self.lock()?.get(&tree).map_or(0, Map::len))
    }

    fn fault(&self) -> Option<String> {
        self.fault.lock().ok()?.clone()
    }
}

//! The byte-level storage interface that the rest of dipamd programs against.

use crate::StoreError;

/// One `(key, value)` entry, as returned by [`Store::scan_prefix`].
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// What [`Store::visit_prefix`] hands each entry (key, value) to; an error ends the visit.
pub type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), StoreError> + 'a;

/// What [`Store::visit_after`] hands each entry (key, value) to: `Break` ends the visit
/// there (a page is full), as an error does.
pub type VisitUntil<'a> =
    dyn FnMut(&[u8], &[u8]) -> Result<std::ops::ControlFlow<()>, StoreError> + 'a;

/// Where [`Store::visit_after`] starts: just after `after`, or at the prefix's first key when
/// `after` sorts before the prefix (the whole prefix is after it) or is `None`.
pub(crate) fn start_after(prefix: &[u8], after: Option<&[u8]>) -> std::ops::Bound<Vec<u8>> {
    match after {
        Some(a) if a >= prefix => std::ops::Bound::Excluded(a.to_vec()),
        _ => std::ops::Bound::Included(prefix.to_vec()),
    }
}

/// A named keyspace inside a store. Each variant is one sled tree (or one map in
/// [`crate::MemStore`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tree {
    /// Store-level metadata such as the schema version.
    Meta,
    /// One [`crate::AttachmentRecord`] per (network, container id, ifname).
    Attachments,
    /// What happened to recent containers (dipamd's history, `dipamctl explain`).
    History,
}

impl Tree {
    /// Every tree, in a fixed order. A store opens all of them up front.
    pub const ALL: [Tree; 3] = [Tree::Meta, Tree::Attachments, Tree::History];

    /// The tree's on-disk name. Never change an existing name: it is part of the format.
    pub fn name(&self) -> &'static str {
        match self {
            Tree::Meta => "meta",
            Tree::Attachments => "attachments",
            Tree::History => "history",
        }
    }

    /// Position in [`Tree::ALL`].
    pub(crate) fn index(self) -> usize {
        match self {
            Tree::Meta => 0,
            Tree::Attachments => 1,
            Tree::History => 2,
        }
    }

    /// The tree at `index` in [`Tree::ALL`] (the commit journal's encoding).
    pub(crate) fn from_index(index: u8) -> Option<Tree> {
        Tree::ALL.get(usize::from(index)).copied()
    }
}

/// One write inside a [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    Put {
        tree: Tree,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        tree: Tree,
        key: Vec<u8>,
    },
}

/// A set of writes applied together by [`Store::commit`]. Ops apply in insertion order, so a
/// later op on the same key wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    ops: Vec<Op>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value` in `tree`.
    pub fn put(
        &mut self,
        tree: Tree,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> &mut Self {
        self.ops.push(Op::Put {
            tree,
            key: key.into(),
            value: value.into(),
        });
        self
    }

    /// Removes `key` from `tree`; removing an absent key is not an error.
    pub fn delete(&mut self, tree: Tree, key: impl Into<Vec<u8>>) -> &mut Self {
        self.ops.push(Op::Delete {
            tree,
            key: key.into(),
        });
        self
    }

    /// True when the batch holds no ops.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub(crate) fn ops(&self) -> &[Op] {
        &self.ops
    }

    pub(crate) fn into_ops(self) -> Vec<Op> {
        self.ops
    }
}

/// The failure a commit must survive once it has returned: what the caller needs, not how
/// the store provides it (today a journal append, plus an fdatasync for
/// [`Durability::SurvivesPowerCut`]; see journal.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Survives a power cut, a kernel panic or a host reset (the commit is on the disk:
    /// fdatasync). The default, and what every write-ahead intent needs: the delegate acts on
    /// it, so a lost intent after a power cut would leave an address the ledger forgot (a
    /// leak, or the same address handed out twice).
    SurvivesPowerCut,
    /// Survives dipamd (or any process holding the store) being killed or crashing, not a
    /// power cut: the commit is in the kernel's page cache. It reaches the disk with the next
    /// [`Durability::SurvivesPowerCut`] commit, which covers every earlier one, or the
    /// kernel's writeback. For a commit whose loss in a power cut leaves a state the next
    /// start already reconciles: a pod's ADD result after its durable intent (the pod died
    /// with the node, and start-up replay releases the intent), a pod's take from the warm
    /// pool (the entry is the pool's again), the history's batches. Saves an fdatasync on the
    /// ADD path (docs/performance.md, "A pod's result and its pool take commit into the
    /// kernel": ADD 5.54 -> 5.39 ms).
    SurvivesProcessCrash,
}

/// A small transactional key/value store with several trees.
///
/// Every method blocks (the real implementation does disk I/O and fdatasync), so async callers
/// should use `tokio::task::spawn_blocking`.
pub trait Store: Send + Sync + 'static {
    /// The value stored under `key`, if any.
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// Every entry whose key starts with `prefix`, sorted by key (bytewise). An empty prefix
    /// returns the whole tree.
    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError>;

    /// Applies every op atomically (all or none, across trees) and returns only once durable
    /// (on the disk). An empty batch is a no-op.
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.commit_with(batch, Durability::SurvivesPowerCut)
    }

    /// [`Store::commit`], returning once the commit is as durable as `durability` says.
    fn commit_with(&self, batch: Batch, durability: Durability) -> Result<(), StoreError>;

    /// The keys (only) of every entry whose key starts with `prefix`, sorted: for bookkeeping
    /// over a large tree without reading its values.
    fn scan_keys(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self
            .scan_prefix(tree, prefix)?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    /// Hands every entry whose key starts with `prefix` to `visit`, in key order, without
    /// holding them all at once: a pass over the whole ledger (dipamd's start) then holds a
    /// page of raw entries, not the tree. Not a snapshot: a commit made during the visit may
    /// or may not be seen, as with two [`Store::scan_prefix`] calls. The default reads the
    /// whole prefix first.
    fn visit_prefix(
        &self,
        tree: Tree,
        prefix: &[u8],
        visit: &mut Visit<'_>,
    ) -> Result<(), StoreError> {
        for (k, v) in self.scan_prefix(tree, prefix)? {
            visit(&k, &v)?;
        }
        Ok(())
    }

    /// Hands the entries under `prefix` whose key is after `after` (all of them when `None`)
    /// to `visit`, in key order, until it says `Break`: a page of a listing (`dipamctl
    /// attachments`) reads from where the previous page ended and stops when it is full,
    /// instead of reading the tree. As [`Store::visit_prefix`], without holding the entries
    /// at once and not a snapshot. The default reads the whole prefix first.
    fn visit_after(
        &self,
        tree: Tree,
        prefix: &[u8],
        after: Option<&[u8]>,
        visit: &mut VisitUntil<'_>,
    ) -> Result<(), StoreError> {
        for (k, v) in self.scan_prefix(tree, prefix)? {
            if after.is_some_and(|a| k.as_slice() <= a) {
                continue;
            }
            if visit(&k, &v)?.is_break() {
                break;
            }
        }
        Ok(())
    }

    /// Number of entries in `tree`.
    fn len(&self, tree: Tree) -> Result<usize, StoreError>;

    /// True when `tree` has no entries.
    fn is_empty(&self, tree: Tree) -> Result<bool, StoreError> {
        Ok(self.len(tree)? == 0)
    }

    /// Why commits are failing right now (a full disk, say), for health reports: `None` when
    /// the store takes commits. While it is `Some`, every commit fails at once with
    /// [`StoreError::Unavailable`], and the store retries in the background.
    fn fault(&self) -> Option<String> {
        None
    }
}

//! The real [`Store`]: sled 0.34 in one state directory, with a commit journal, made
//! power-loss durable.
//!
//! sled 0.34's `flush()` ends in `sync_file_range`, which survives a process crash but is not
//! a durability barrier: it flushes neither the device write cache nor file metadata
//! (measured in reference/crates.md §2.2). It is also slow on the path of a pod's ADD: it
//! wakes sled's whole I/O pool and waits for the device (docs/performance.md). So a commit
//! here is the sled transaction (in memory) plus one append to the commit journal
//! (journal.rs), fdatasynced when the commit must survive a power cut; sled writes its log
//! in the background, and a checkpoint (sled flush, fdatasync of sled's files, journal
//! emptied) runs when the journal has grown past a bound, when the store closes, and after
//! an open replayed the journal. The files sled writes but never syncs (`conf`, the
//! directory entries, large-value blob files) are synced by this module.
//!
//! sled 0.34 also does not report a damaged log: recovery stops at the first bad checksum and
//! opens whatever came before, so a garbled `db` file opens as an older (or empty) store
//! (measured: overwriting 4 KiB in the middle of a 200-record store reopened with 104 records
//! and no error). To turn that silent loss into [`StoreError::Corrupt`], every commit carries a
//! sequence number, and the last acknowledged number is also kept in a small witness file
//! next to the store ([`WITNESS_FILE`]); on open, a store behind its witness (after the
//! journal's replay) is refused.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sled::Transactional;
use sled::transaction::{ConflictableTransactionResult, TransactionError};

use crate::journal::{CHECKPOINT_BYTES, JOURNAL_FILE, Journal};
use crate::pending::{Pending, merge};
use crate::schema::ensure_schema;
use crate::store::Op;
use crate::{Batch, Durability, KeyValue, Store, StoreError, Tree};

/// sled's page cache size. The ledger holds one small record per attachment (a node has at
/// most a few hundred), so sled's 1 GiB default would only be a way to grow dipamd's RSS.
/// The cache fills with the history tree (`dipamctl explain`) as pods come and go: at 16 MiB
/// dipamd sat at ~20 MiB idle after the bench's concurrent rounds, at 8 MiB at ~15.5, with the
/// same throughput (docs/performance.md).
const CACHE_CAPACITY: u64 = 8 * 1024 * 1024;

/// How often sled's background thread writes its log. Durability comes from the commit
/// journal, so this only bounds how much sled holds in memory only; the thread is kept
/// (rather than disabled with `None`) because it is also the only place sled 0.34 reclaims
/// log segments, and without it the file only grows.
const BACKGROUND_FLUSH_MS: u64 = 1000;

/// The file holding the sequence number of the last acknowledged commit (see the module doc).
pub(crate) const WITNESS_FILE: &str = "dipam-commit-seq";

/// The key, in sled's default tree (not one of [`Tree`], so the public trees behave exactly
/// like [`crate::MemStore`]'s), of the sequence number of the last commit.
const SEQ_KEY: &[u8] = b"dipam_commit_seq";

/// The ledger on disk: a sled database in `dir` plus the handles needed to make its writes
/// durable.
///
/// # Durability
///
/// [`Store::commit`] returns only after the batch is appended to the commit journal and the
/// journal has been `fdatasync`ed; reads see it from then on. An acknowledged commit
/// therefore survives a process kill -9 and a power loss or host crash, as long as the disk
/// honours cache flushes: the next open replays the journal's commits that sled's log lacks.
/// A [`Durability::Process`] commit skips the fdatasync: it survives a kill (the journal's
/// page cache does), not a power cut.
///
/// sled itself gets the commits a few milliseconds later, from the store's applier thread:
/// every commit of a burst in one sled transaction, so all or none of each (pending.rs says
/// why). Until then reads lay the pending commits over what sled returns.
///
/// If the journal cannot be written (a full disk, say), commits fall back to a sled
/// transaction, sled's own flush and an fdatasync of sled's data file, for as long as this
/// store stays open.
///
/// # Single daemon
///
/// sled takes an exclusive `flock` on `<dir>/db` for the store's lifetime, and a second opener
/// (another process, or a second `open` in the same process, since each open is a new file
/// description) gets [`StoreError::Locked`]. The lock is released when the store is dropped or
/// the process dies.
///
/// # Damage
///
/// A store that sled cannot read back, or that reads back older than the last commit this
/// directory acknowledged (sled silently drops a damaged log tail), fails to open with
/// [`StoreError::Corrupt`].
pub struct SledStore {
    pub(crate) inner: Arc<Inner>,
    /// Writes pending commits into sled (see [`Inner::apply_pending`]).
    applier: Option<thread::JoinHandle<()>>,
}

/// How long the applier waits after the last commit before it writes pending commits into
/// sled: a pod's ADD commits its intent and, ~3 ms later, its result, and the sled
/// transaction should come after both, off the ADD's path.
const APPLY_QUIET: Duration = Duration::from_millis(10);
/// The longest a commit stays pending while commits keep coming (a busy node), so that what
/// reads lay over sled stays small.
const APPLY_AT_MOST: Duration = Duration::from_millis(100);
/// How long an open retries sled's lock (see [`SledStore::open`]).
const LOCK_RETRY: Duration = Duration::from_millis(500);
/// The wait before the applier tries again after sled refused a transaction.
const APPLY_RETRY: Duration = Duration::from_millis(500);

pub(crate) struct Inner {
    dir: PathBuf,
    pub(crate) db: sled::Db,
    /// Indexed by [`Tree::index`]; the last element is sled's default tree, which holds
    /// [`SEQ_KEY`].
    pub(crate) trees: Vec<sled::Tree>,
    /// The commit lock: the number of the last commit and the journal. Held across the
    /// append and the hand-over to `pending`, so commits are numbered, journaled and applied
    /// in one order.
    pub(crate) commits: Mutex<Commits>,
    /// Commits in the journal and not yet in sled.
    pub(crate) pending: Mutex<Pending>,
    /// Wakes the applier: a first pending commit, or the store closing.
    wake: Condvar,
    closing: AtomicBool,
    /// Set by a commit that took the journal past [`CHECKPOINT_BYTES`]: the applier
    /// checkpoints after its next apply.
    journal_full: AtomicBool,
    /// Held while pending commits are written into sled, by the applier or a checkpoint, so
    /// that two writes of the same commits never race.
    applying: Mutex<()>,
    /// A second handle on the journal, to fdatasync it outside the commit lock.
    journal_file: File,
    journal_path: PathBuf,
    /// The witness file and the number last written to it.
    witness: Mutex<(File, u64)>,
    data_path: PathBuf,
    /// A read-only handle on `<dir>/db`: fsync acts on the inode, so it syncs sled's writes.
    data_file: File,
    /// Blob files already synced, with the length they had when synced.
    synced_blobs: Mutex<HashMap<OsString, u64>>,
}

/// What the commit lock guards.
pub(crate) struct Commits {
    /// The sequence number of the last committed transaction.
    seq: u64,
    /// `None` once an append failed: a later record behind a missing one would never be
    /// read back (the journal's numbering must be unbroken), so every later commit of this
    /// store goes through sled's flush instead. The next open replays what is there and
    /// starts a fresh journal.
    pub(crate) journal: Option<Journal>,
}

impl fmt::Debug for SledStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SledStore")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

impl SledStore {
    /// Opens (creating if needed) the store in `dir`, checks its schema version and migrates
    /// it if it is older.
    ///
    /// Errors: [`StoreError::Locked`] if another dipamd has it open, [`StoreError::Corrupt`] if
    /// sled cannot read it back, [`StoreError::SchemaTooNew`] if a newer dipamd wrote it.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;

        // Mode: LowSpace (sled's default) keeps the log compact; our write rate is a few
        // commits per pod start, far from where HighThroughput would pay off.
        let config = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_CAPACITY)
            .mode(sled::Mode::LowSpace)
            .flush_every_ms(Some(BACKGROUND_FLUSH_MS));

        // Damage that sled notices comes back as `Error::Corruption`; damage it does not is
        // caught by the witness check below. sled 0.34 also has `unwrap`s and asserts on its
        // recovery path, so a damaged file may panic instead: that is an unreadable store too,
        // and the operator should get an error, not a backtrace.
        //
        // A store this process has just closed may keep sled's lock for a moment: the last
        // write job in sled's I/O pool holds the file until it returns. So a lock conflict is
        // retried briefly before it is reported (another dipamd holds it for good).
        let locked_until = Instant::now() + LOCK_RETRY;
        let db = loop {
            match panic::catch_unwind(AssertUnwindSafe(|| config.open())) {
                Ok(Err(e)) => match map_sled(dir, e) {
                    StoreError::Locked { .. } if Instant::now() < locked_until => {
                        thread::sleep(Duration::from_millis(10));
                    }
                    e => return Err(e),
                },
                other => break other,
            }
        };
        let db = match db {
            Ok(Ok(db)) => db,
            Ok(Err(e)) => return Err(map_sled(dir, e)),
            Err(payload) => {
                return Err(StoreError::Corrupt {
                    path: dir.to_path_buf(),
                    detail: format!(
                        "sled panicked while recovering: {}",
                        panic_message(&*payload)
                    ),
                });
            }
        };

        let mut trees = Tree::ALL
            .iter()
            .map(|t| db.open_tree(t.name()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| map_sled(dir, e))?;
        trees.push((*db).clone());

        let mut seq = read_seq(&db, dir)?;
        let journal_path = dir.join(JOURNAL_FILE);
        let (journal, entries) = Journal::open(dir).map_err(io_err(&journal_path))?;
        // The journal's commits that sled's log lacks: those after sled's last, if they
        // continue its numbering. A journal that starts further on (sled lost commits it had
        // made durable before the journal's last checkpoint) replays nothing, and the witness
        // below then refuses the store.
        let replay: Vec<_> = entries.into_iter().filter(|e| e.seq > seq).collect();
        let replay = if replay.first().is_some_and(|e| e.seq == seq + 1) {
            replay
        } else {
            Vec::new()
        };
        let replayed_to = replay.last().map_or(seq, |e| e.seq);
        let witness_path = dir.join(WITNESS_FILE);
        let acknowledged = read_witness(&witness_path)?;
        if let Some(acknowledged) = acknowledged.filter(|a| *a > replayed_to) {
            return Err(StoreError::Corrupt {
                path: dir.to_path_buf(),
                detail: format!(
                    "commits up to #{acknowledged} were acknowledged, but the store only holds \
                     commits up to #{replayed_to} (sled discards a damaged log without reporting it)"
                ),
            });
        }
        for entry in &replay {
            transact(&trees, dir, &entry.batch, entry.seq)?;
            seq = entry.seq;
        }
        let witness = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&witness_path)
            .map_err(io_err(&witness_path))?;
        if acknowledged != Some(seq) {
            // New, lost or unreadable witness: restart it from what the store holds. Losing
            // the witness only weakens damage detection; it cannot make a good store fail.
            write_witness(&witness, seq).map_err(io_err(&witness_path))?;
            witness.sync_all().map_err(io_err(&witness_path))?;
        }

        let data_path = dir.join("db");
        let data_file = File::open(&data_path).map_err(io_err(&data_path))?;

        // sled writes `conf` without syncing it and never syncs the directories holding its
        // files. Do it once here so the files a later fdatasync relies on are reachable.
        sync_path(&dir.join("conf"))?;
        // (The directory sync below also makes a newly created witness file reachable.)
        sync_path(&dir.join("blobs"))?;
        sync_path(dir)?;

        let journal_file = journal.sync_handle().map_err(io_err(&journal_path))?;
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            db,
            trees,
            commits: Mutex::new(Commits {
                seq,
                journal: Some(journal),
            }),
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            closing: AtomicBool::new(false),
            journal_full: AtomicBool::new(false),
            applying: Mutex::new(()),
            journal_file,
            journal_path,
            witness: Mutex::new((witness, seq)),
            data_path,
            data_file,
            synced_blobs: Mutex::new(HashMap::new()),
        });
        inner.sync_blobs()?;
        // What was replayed goes into sled's files, and the journal starts empty: its
        // records must continue sled's durable numbering (see the replay above).
        inner.checkpoint()?;
        let applier = thread::Builder::new()
            .name("dipam-ledger".into())
            .spawn({
                let inner = inner.clone();
                move || inner.run_applier()
            })
            .map_err(io_err(dir))?;
        let store = Self {
            inner,
            applier: Some(applier),
        };
        ensure_schema(&store, dir)?;
        Ok(store)
    }

    /// The state directory.
    pub fn path(&self) -> &Path {
        &self.inner.dir
    }
}

impl Inner {
    fn tree(&self, tree: Tree) -> &sled::Tree {
        &self.trees[tree.index()]
    }

    fn sled_err(&self) -> impl Fn(sled::Error) -> StoreError + '_ {
        move |e| map_sled(&self.dir, e)
    }

    /// Makes sled durable and empties the journal: pending commits written into sled,
    /// sled's log written (`flush`), its data and blob files fdatasynced, then the journal
    /// zeroed. Holds the commit lock, so no commit lands in between. Every commit so far is
    /// then on the disk, which the witness may claim.
    fn checkpoint(&self) -> Result<(), StoreError> {
        let mut commits = lock(&self.commits)?;
        let Commits { seq, journal } = &mut *commits;
        let Some(journal) = journal.as_mut().filter(|j| j.is_dirty()) else {
            return Ok(());
        };
        self.apply_pending()?;
        self.db.flush().map_err(self.sled_err())?;
        self.sync_blobs()?;
        self.data_file
            .sync_data()
            .map_err(io_err(&self.data_path))?;
        journal.reset().map_err(io_err(&self.journal_path))?;
        self.claim(*seq)
    }

    /// Writes every pending commit into sled, in one transaction that also records the last
    /// one's number, then forgets them. Readers see them throughout: in `pending` until they
    /// are in sled, since they are forgotten only after.
    fn apply_pending(&self) -> Result<(), StoreError> {
        let _applying = lock(&self.applying)?;
        let Some(snapshot) = lock(&self.pending)?.snapshot() else {
            return Ok(());
        };
        transact(&self.trees, &self.dir, &snapshot.ops, snapshot.upto)?;
        lock(&self.pending)?.applied(snapshot.upto);
        Ok(())
    }

    /// The applier thread: once commits are pending, waits until none has come for
    /// [`APPLY_QUIET`] (at most [`APPLY_AT_MOST`] after the oldest), then writes them into
    /// sled, and checkpoints when the journal has passed its bound. Ends when the store
    /// closes; the close's checkpoint writes what is left.
    fn run_applier(&self) {
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        loop {
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            let Some((last, oldest)) = pending.times() else {
                pending = match self.wake.wait(pending) {
                    Ok(p) => p,
                    Err(_) => return,
                };
                continue;
            };
            let due = (last + APPLY_QUIET).min(oldest + APPLY_AT_MOST);
            let now = Instant::now();
            if now < due {
                pending = match self.wake.wait_timeout(pending, due - now) {
                    Ok((p, _)) => p,
                    Err(_) => return,
                };
                continue;
            }
            drop(pending);
            let mut retry = self.apply_pending().is_err();
            if !retry && self.journal_full.swap(false, Ordering::AcqRel) {
                // A failed checkpoint is retried after the next apply; the journal simply
                // grows meanwhile.
                retry = self.checkpoint().is_err();
                if retry {
                    self.journal_full.store(true, Ordering::Release);
                }
            }
            if retry {
                // The commits stay pending (and in the journal); reads still see them.
                thread::sleep(APPLY_RETRY);
            }
            pending = match self.pending.lock() {
                Ok(p) => p,
                Err(_) => return,
            };
        }
    }

    /// Records in the witness that every commit up to `seq` is on the disk. Written but not
    /// synced: after a power cut it may lag behind the store (weaker detection, never a false
    /// alarm), and an fdatasync here would double the cost of every commit.
    fn claim(&self, seq: u64) -> Result<(), StoreError> {
        let mut witness = lock(&self.witness)?;
        if seq > witness.1 {
            write_witness(&witness.0, seq).map_err(io_err(&self.dir.join(WITNESS_FILE)))?;
            witness.1 = seq;
        }
        Ok(())
    }

    /// fsyncs blob files (sled's out-of-line storage for values over ~128 KiB) that are new or
    /// have grown since last synced, then their directory. sled writes them with plain
    /// `write_all` and never syncs them. Ledger records are far smaller, so this is normally
    /// one empty `readdir`.
    fn sync_blobs(&self) -> Result<(), StoreError> {
        let blobs = self.dir.join("blobs");
        let entries = fs::read_dir(&blobs).map_err(io_err(&blobs))?;
        let mut synced = lock(&self.synced_blobs)?;
        let mut present = HashMap::new();
        let mut any_new = false;
        for entry in entries {
            let entry = entry.map_err(io_err(&blobs))?;
            let path = entry.path();
            // The length is read before syncing, so a blob still being written when we look is
            // synced again by the commit that wrote it (it will have grown).
            let len = match entry.metadata() {
                Ok(m) => m.len(),
                // sled garbage-collects blobs concurrently.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(StoreError::Io { path, source: e }),
            };
            let name = entry.file_name();
            if synced.get(&name) != Some(&len) {
                match File::open(&path).and_then(|f| f.sync_all()) {
                    Ok(()) => any_new = true,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(StoreError::Io { path, source: e }),
                }
            }
            present.insert(name, len);
        }
        if any_new {
            sync_path(&blobs)?;
        }
        *synced = present;
        Ok(())
    }
}

impl Inner {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(pending) = lock(&self.pending)?.get(tree, key) {
            return Ok(pending);
        }
        Ok(self
            .tree(tree)
            .get(key)
            .map_err(self.sled_err())?
            .map(|v| v.to_vec()))
    }

    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
        // The overlay first: a commit applied meanwhile is then in sled, with the same value.
        let overlay = lock(&self.pending)?.overlay(tree, prefix);
        self.scan_under(tree, prefix, overlay)
    }

    /// sled's entries under `prefix`, with `overlay` (pending ops read before) laid over them.
    fn scan_under(
        &self,
        tree: Tree,
        prefix: &[u8],
        overlay: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ) -> Result<Vec<KeyValue>, StoreError> {
        let base = self
            .tree(tree)
            .scan_prefix(prefix)
            .map(|kv| {
                kv.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(self.sled_err())
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(merge(base, overlay))
    }

    fn scan_keys(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        let overlay = lock(&self.pending)?.overlay(tree, prefix);
        if !overlay.is_empty() {
            let entries = self.scan_under(tree, prefix, overlay)?;
            return Ok(entries.into_iter().map(|(k, _)| k).collect());
        }
        // Nothing pending here: sled's keys alone, without reading the values.
        self.tree(tree)
            .scan_prefix(prefix)
            .keys()
            .map(|k| k.map(|k| k.to_vec()).map_err(self.sled_err()))
            .collect()
    }

    fn len(&self, tree: Tree) -> Result<usize, StoreError> {
        let overlay = lock(&self.pending)?.overlay(tree, b"");
        let sled = self.tree(tree);
        let mut len = sled.len();
        for (key, value) in overlay {
            match (sled.contains_key(&key).map_err(self.sled_err())?, value) {
                (false, Some(_)) => len += 1,
                (true, None) => len -= 1,
                _ => {}
            }
        }
        Ok(len)
    }

    fn commit_with(&self, batch: Batch, durability: Durability) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (seq, journaled) = {
            let mut commits = lock(&self.commits)?;
            let seq = commits.seq + 1;
            let appended = commits
                .journal
                .as_mut()
                .map(|j| j.append(seq, &batch).map(|()| j.len()));
            let journaled = match appended {
                Some(Ok(len)) => {
                    if lock(&self.pending)?.add(seq, batch) {
                        self.wake.notify_one();
                    }
                    Some(len)
                }
                Some(Err(_)) | None => {
                    // From now on sled's flush makes commits durable (see `Commits`); what
                    // is pending goes into sled first, to keep the order.
                    commits.journal = None;
                    self.apply_pending()?;
                    transact(&self.trees, &self.dir, &batch, seq)?;
                    None
                }
            };
            commits.seq = seq;
            (seq, journaled)
        };

        match journaled {
            Some(_) if durability == Durability::Process => {}
            // The fdatasync covers this record and every earlier one.
            Some(_) => self
                .journal_file
                .sync_data()
                .map_err(io_err(&self.journal_path))?,
            None => {
                // Without the journal: flush writes sled's log (sync_file_range), then blobs
                // and the data file are fdatasynced. Blobs first, so a durable log entry never
                // points at a blob that a power cut could lose.
                self.db.flush().map_err(self.sled_err())?;
                if durability == Durability::Disk {
                    self.sync_blobs()?;
                    self.data_file
                        .sync_data()
                        .map_err(io_err(&self.data_path))?;
                }
            }
        }
        if durability == Durability::Disk {
            // A Process commit is in the kernel only and not claimed: a power cut may lose
            // it, and a store that lost an unsynced tail is not damaged. The next Disk
            // commit's fdatasync covers it, and that commit's number is the witness's.
            self.claim(seq)?;
        }
        if journaled.is_some_and(|len| len >= CHECKPOINT_BYTES) {
            // The applier checkpoints once it has written this commit into sled: off this
            // request's path, which must not pay two fdatasyncs and a 2 MiB write.
            self.journal_full.store(true, Ordering::Release);
        }
        Ok(())
    }
}

impl Store for SledStore {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(tree, key)
    }

    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
        self.inner.scan_prefix(tree, prefix)
    }

    /// Applies every op atomically (all or none, across trees) and returns only once durable:
    /// a commit that returned `Ok` survives kill -9 and, with [`Durability::Disk`] (thanks to
    /// fdatasync), power loss.
    fn commit_with(&self, batch: Batch, durability: Durability) -> Result<(), StoreError> {
        self.inner.commit_with(batch, durability)
    }

    fn scan_keys(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.inner.scan_keys(tree, prefix)
    }

    fn len(&self, tree: Tree) -> Result<usize, StoreError> {
        self.inner.len(tree)
    }
}

impl Drop for SledStore {
    /// A store closed cleanly leaves an empty journal and a witness that claims every commit:
    /// the next open has nothing to replay, and damage to sled's files is refused (by the
    /// witness) instead of patched over with this run's journal.
    fn drop(&mut self) {
        self.inner.closing.store(true, Ordering::Release);
        if let Ok(_pending) = self.inner.pending.lock() {
            // Under the lock, so the applier is either waiting (and wakes) or will see
            // `closing` before it waits again.
            self.inner.wake.notify_all();
        }
        if let Some(applier) = self.applier.take() {
            let _ = applier.join();
        }
        let _ = self.inner.checkpoint();
    }
}

/// Applies `batch` plus the commit number `seq` in one sled transaction.
fn transact(trees: &[sled::Tree], dir: &Path, batch: &Batch, seq: u64) -> Result<(), StoreError> {
    let seq_index = trees.len() - 1;
    // Transact over every tree: simpler than collecting the touched ones, and the cost is
    // one overlay per tree. sled may re-run this closure on conflict, so it only touches
    // the transactional views (no I/O, no side effects).
    let result = trees.transaction(
        |txs| -> ConflictableTransactionResult<(), std::convert::Infallible> {
            for op in batch.ops() {
                match op {
                    Op::Put { tree, key, value } => {
                        txs[tree.index()].insert(key.as_slice(), value.as_slice())?;
                    }
                    Op::Delete { tree, key } => {
                        txs[tree.index()].remove(key.as_slice())?;
                    }
                }
            }
            txs[seq_index].insert(SEQ_KEY, &seq.to_be_bytes()[..])?;
            Ok(())
        },
    );
    match result {
        Ok(()) => Ok(()),
        Err(TransactionError::Abort(never)) => match never {},
        Err(TransactionError::Storage(e)) => Err(map_sled(dir, e)),
    }
}

/// Locks `m`. A poisoned mutex means a panic in this module while holding it; report it
/// instead of guessing whether the state it guards is still right.
fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>, StoreError> {
    m.lock()
        .map_err(|_| StoreError::Backend("SledStore mutex poisoned by an earlier panic".into()))
}

/// The number of the last commit recorded in the store; 0 for a store never committed to.
pub(crate) fn read_seq(db: &sled::Db, dir: &Path) -> Result<u64, StoreError> {
    let Some(raw) = db.get(SEQ_KEY).map_err(|e| map_sled(dir, e))? else {
        return Ok(0);
    };
    let bytes: [u8; 8] = raw.as_ref().try_into().map_err(|_| StoreError::Corrupt {
        path: dir.to_path_buf(),
        detail: format!(
            "commit sequence number has {} bytes instead of 8",
            raw.len()
        ),
    })?;
    Ok(u64::from_be_bytes(bytes))
}

/// Width of the zero-padded number in the witness file. Fixed, so each update is a single
/// in-place `pwrite` of the same bytes range.
const WITNESS_WIDTH: usize = 20;

/// The number in the witness file, or `None` if the file is missing or unreadable.
fn read_witness(path: &Path) -> Result<Option<u64>, StoreError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(text.trim().parse().ok()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        // Invalid UTF-8 (a torn write after a power cut) reads as "no witness".
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Ok(None),
        Err(source) => Err(StoreError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn write_witness(file: &File, seq: u64) -> io::Result<()> {
    file.write_all_at(format!("{seq:0WITNESS_WIDTH$}\n").as_bytes(), 0)
}

/// Maps a sled error to ours, recognising the lock conflict and corruption.
fn map_sled(dir: &Path, e: sled::Error) -> StoreError {
    match e {
        // sled 0.34 wraps fs2's EWOULDBLOCK as `Other` with the message
        // `could not acquire lock on "<dir>/db": ... WouldBlock ...`.
        sled::Error::Io(source)
            if source.kind() == io::ErrorKind::WouldBlock
                || source.to_string().contains("could not acquire lock") =>
        {
            StoreError::Locked {
                path: dir.to_path_buf(),
            }
        }
        sled::Error::Io(source) => StoreError::Io {
            path: dir.to_path_buf(),
            source,
        },
        e @ sled::Error::Corruption { .. } => StoreError::Corrupt {
            path: dir.to_path_buf(),
            detail: e.to_string(),
        },
        other => StoreError::Backend(other.to_string()),
    }
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// fsyncs a file or directory by path (opening a directory read-only is allowed on Linux).
fn sync_path(path: &Path) -> Result<(), StoreError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io_err(path))
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

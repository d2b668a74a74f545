//! The real [`Store`]: sled 0.34 in one state directory, with a commit journal, made
//! power-loss durable, refusing damage it cannot rule out, and recovering from a full disk
//! without a restart.
//!
//! sled 0.34's `flush()` ends in `sync_file_range`, which survives a process crash but is not
//! a durability barrier: it flushes neither the device write cache nor file metadata. It is
//! also slow on the path of a pod's ADD: it wakes sled's whole I/O pool and waits for the
//! device (docs/performance.md). So a commit here is one append to the commit journal
//! (journal.rs), fdatasynced when the commit must survive a power cut, and an in-memory
//! overlay that reads lay over sled; the applier thread writes the overlay into sled a few
//! milliseconds later, and a checkpoint (sled flush, fdatasync of sled's files, journal
//! emptied) runs when the journal has grown past a bound, when the store closes, and after
//! an open replayed the journal. The files sled writes but never syncs (`conf`, the
//! directory entries, large-value blob files) are synced by this module.
//!
//! # Integrity (docs/cfp.md §7.5)
//!
//! sled 0.34 does not report a damaged log: recovery stops at the first bad checksum and
//! opens whatever came before, so a garbled `db` file opens as an older (or empty) store
//! (measured: overwriting 4 KiB in the middle of a 200-record store reopened with 104 records
//! and no error). Every commit therefore carries a sequence number, and a small witness file
//! next to the store ([`WITNESS_FILE`]) records the last commit acknowledged to the kernel
//! (with the boot it was made in) and the last one acknowledged as on the disk. An open
//! refuses ([`StoreError::Corrupt`]) a store that, after replaying the journal, holds less
//! than the witness proves was acknowledged: everything acknowledged in this boot (the page
//! cache survived), every disk commit after a reboot.
//!
//! The store's existence is recorded in three places: sled's own files, the witness and the
//! journal. A store any of them shows existed must have the witness and the journal, or it is
//! refused: deleting one witness must not turn "cannot prove" into "looks fresh". A garbled
//! journal tail is refused too, unless it is provably a torn append (journal.rs).
//!
//! # A full disk (docs/cfp.md §7.5, "Writes that fail")
//!
//! sled 0.34 makes any failed write of its log sticky: every later write, and reads that
//! need a page from the file, fail with that error until the database is reopened (its
//! "global error"). And `sled::Tree::len` counts an iterator that, under that error, yields
//! the same error forever without advancing: one `len` spun at 100% CPU and grew dipamd's
//! memory until the OOM killer ended it. So: `len` here counts itself and stops at the first
//! error; the first failed write puts the store in a fault state ([`Store::fault`]) in which
//! commits fail at once with that cause; and the applier thread retries, with a bounded
//! backoff, a full in-process reopen (sled reopened, the journal replayed, a checkpoint),
//! which is what clears sled's error. Once space returns the next attempt succeeds and
//! commits are served again, without a restart.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use sled::Transactional;
use sled::transaction::{ConflictableTransactionResult, TransactionError};

use crate::chunks;
use crate::journal::{CHECKPOINT_BYTES, JOURNAL_FILE, Journal, Tail};
use crate::pending::{Pending, merge};
use crate::schema::ensure_schema;
use crate::{Batch, Durability, KeyValue, Store, StoreError, Tree, Visit, VisitUntil};

mod engine;
mod ops;
mod witness;

use engine::*;
pub(crate) use witness::read_seq;
use witness::*;

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

/// The file holding what the store acknowledged (see the module doc and [`Witness`]).
pub(crate) const WITNESS_FILE: &str = "dipam-commit-seq";

/// The key, in sled's default tree (not one of [`Tree`], so the public trees behave exactly
/// like [`crate::MemStore`]'s), of the sequence number of the last commit.
const SEQ_KEY: &[u8] = b"dipam_commit_seq";

/// Where the kernel keeps the id of the current boot: a witness claim made in this boot is
/// binding for kernel-only commits too, since the page cache that holds them survived.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The ledger on disk: a sled database in `dir` plus the handles needed to make its writes
/// durable.
///
/// # Durability
///
/// [`Store::commit`] returns only after the batch is appended to the commit journal and the
/// journal has been `fdatasync`ed; reads see it from then on. An acknowledged commit
/// therefore survives a process kill -9 and a power loss or host crash, as long as the disk
/// honours cache flushes: the next open replays the journal's commits that sled's log lacks.
/// A [`Durability::SurvivesProcessCrash`] commit skips the fdatasync: it survives a kill (the journal's
/// page cache does), not a power cut.
///
/// sled itself gets the commits a few milliseconds later, from the store's applier thread:
/// every commit of a burst in one sled transaction, so all or none of each (pending.rs says
/// why). Until then reads lay the pending commits over what sled returns.
///
/// If the journal cannot be written, commits fall back to a sled transaction, sled's own
/// flush and an fdatasync of sled's data file, until the applier has made sled durable and
/// started a fresh journal.
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
/// A store that sled cannot read back, that reads back older than what its witness proves
/// was acknowledged, that lost its witness or its journal, or whose journal is garbled,
/// fails to open with [`StoreError::Corrupt`].
pub struct SledStore {
    pub(crate) inner: Arc<Inner>,
    /// Writes pending commits into sled (see [`Inner::apply_pending`]) and reopens the store
    /// after a failed write (see [`Inner::reopen`]).
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
/// The first wait before the applier tries to reopen a store whose writes failed; it doubles
/// after every failed attempt, up to [`REOPEN_BACKOFF_MAX`]: a full disk costs one reopen
/// attempt every few seconds, never a busy loop, and a freed disk is noticed within that.
const REOPEN_BACKOFF_MIN: Duration = Duration::from_millis(250);
/// The longest wait between two reopen attempts: dipamd serves again within about this long
/// of space returning (docs/configuration.md promises a few seconds). An attempt on a disk
/// still full costs a close and an open of sled, which a 2-CPU node does not notice every 2 s.
const REOPEN_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// The journal's size at which a commit checkpoints before it appends (and, should that
/// race, is refused): every journaled commit is also held in memory until sled has it, so
/// this bounds that memory whatever the disk does.
const JOURNAL_HARD_LIMIT: u64 = 2 * CHECKPOINT_BYTES;

/// Why commits are failing, for [`Store::fault`] and the error every commit gets meanwhile.
#[derive(Debug, Clone)]
struct Fault {
    since: SystemTime,
    cause: String,
    disk_full: bool,
    /// The store cannot prove what it holds any more: no reopen is attempted; a restart
    /// runs the start-up checks.
    permanent: bool,
    /// Why the last reopen attempt failed, if one did: an operator whose disk has room again
    /// must see what still stands in the way (a lock, a close that never ended), not only
    /// the first cause.
    last_attempt: Option<String>,
}

impl Fault {
    /// The first cause, and what stands in the way now if a reopen failed since.
    fn text(self) -> String {
        match self.last_attempt {
            Some(attempt) => format!("{}; the last reopen failed: {attempt}", self.cause),
            None => self.cause,
        }
    }
}

pub(crate) struct Inner {
    dir: PathBuf,
    /// `None` while a reopen has not succeeded (reads fail with the fault).
    pub(crate) engine: RwLock<Option<Engine>>,
    /// The commit lock: the number of the last commit and the journal. Held across the
    /// append and the hand-over to `pending`, so commits are numbered, journaled and applied
    /// in one order.
    pub(crate) commits: Mutex<Commits>,
    /// Commits in the journal and not yet in sled.
    pub(crate) pending: Mutex<Pending>,
    /// Wakes the applier: a first pending commit, a failed write, or the store closing.
    wake: Condvar,
    closing: AtomicBool,
    /// Set by a commit that took the journal past [`CHECKPOINT_BYTES`]: the applier
    /// checkpoints after its next apply.
    journal_full: AtomicBool,
    /// Set when a write failed: the applier reopens the store.
    needs_reopen: AtomicBool,
    /// Set when an append to the journal failed and commits went to sled's own flush: the
    /// applier starts a fresh journal ([`Inner::restart_journal`]), without a reopen, so
    /// that commits keep being served meanwhile.
    journal_lost: AtomicBool,
    /// Held while pending commits are written into sled, by the applier or a checkpoint, so
    /// that two writes of the same commits never race.
    applying: Mutex<()>,
    /// A second handle on the journal, to fdatasync it outside the commit lock.
    journal_file: File,
    journal_path: PathBuf,
    /// The witness file and what it claims.
    witness: Mutex<Witness>,
    data_path: PathBuf,
    /// Blob files already synced, with the length they had when synced.
    synced_blobs: Mutex<HashMap<OsString, u64>>,
    fault: Mutex<Option<Fault>>,
}

/// What the commit lock guards.
pub(crate) struct Commits {
    /// The sequence number of the last committed transaction.
    seq: u64,
    /// `None` once an append failed: a later record behind a missing one would never be
    /// read back (the journal's numbering must be unbroken), so commits go through sled's
    /// flush instead until the applier starts a fresh journal.
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
    /// Opens (creating if needed) the store in `dir`, checks its integrity and schema version
    /// and migrates it if it is older.
    ///
    /// Errors: [`StoreError::Locked`] if another dipamd has it open, [`StoreError::Corrupt`] if
    /// it cannot be proven to hold every acknowledged commit, [`StoreError::SchemaTooNew`] if
    /// a newer dipamd wrote it, [`StoreError::NoSpace`] if the file system lacks the room an
    /// open needs.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        crate::space::check(dir)?;

        // What says the store existed, read before anything is created.
        let witness_path = dir.join(WITNESS_FILE);
        let journal_path = dir.join(JOURNAL_FILE);
        let claimed = read_witness(&witness_path)?;
        let journal_existed = journal_path.exists();

        let engine = open_engine(dir)?;
        let mut seq = read_seq(&engine.db, dir)?;
        let sled_has_commits = seq > 0
            || engine
                .trees
                .iter()
                .any(|t| t.first().map(|kv| kv.is_some()).unwrap_or(true));
        let boot = boot_id();
        let required = match &claimed {
            WitnessRead::Missing | WitnessRead::Unreadable(_)
                if sled_has_commits || journal_existed =>
            {
                let what = match &claimed {
                    WitnessRead::Unreadable(why) => format!("is unreadable ({why})"),
                    _ => "is missing".to_string(),
                };
                return Err(StoreError::Corrupt {
                    path: dir.to_path_buf(),
                    detail: format!(
                        "the commit witness {} {what}, yet the store exists ({}): nothing \
                         proves it still holds every commit it acknowledged",
                        witness_path.display(),
                        if sled_has_commits {
                            format!("sled holds commits up to #{seq}")
                        } else {
                            "its commit journal is there".to_string()
                        }
                    ),
                });
            }
            WitnessRead::Missing | WitnessRead::Unreadable(_) => 0,
            WitnessRead::Legacy(disk) => *disk,
            WitnessRead::Claims(w) => {
                if !journal_existed && w.kernel.max(w.disk) > 0 {
                    return Err(StoreError::Corrupt {
                        path: dir.to_path_buf(),
                        detail: format!(
                            "the commit journal {} is missing, yet the witness says commits up \
                             to #{} were acknowledged: the journal may have held some that sled \
                             never wrote",
                            journal_path.display(),
                            w.kernel.max(w.disk)
                        ),
                    });
                }
                if boot.as_deref() == Some(w.boot.as_str()) {
                    w.kernel.max(w.disk)
                } else {
                    w.disk
                }
            }
        };

        // The witness is created before the journal: a journal without a witness is then
        // never a fresh store's leftover.
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&witness_path)
            .map_err(io_err(&witness_path))?;
        let witness = Witness {
            file,
            disk: 0,
            kernel: 0,
            boot: boot.unwrap_or_default(),
        };
        if matches!(claimed, WitnessRead::Missing) {
            witness.write().map_err(io_err(&witness_path))?;
            witness.file.sync_all().map_err(io_err(&witness_path))?;
            sync_path(dir)?;
        }
        Self::open_checked(dir, engine, witness, &mut seq, required, journal_path)
    }

    /// The rest of [`SledStore::open`], once the witness is settled: the journal's replay and
    /// checks, the handles, the checkpoint, the applier and the schema.
    fn open_checked(
        dir: &Path,
        engine: Engine,
        mut witness: Witness,
        seq: &mut u64,
        required: u64,
        journal_path: PathBuf,
    ) -> Result<Self, StoreError> {
        let (journal, entries, tail) = Journal::open(dir).map_err(io_err(&journal_path))?;
        check_tail(dir, &journal_path, &tail)?;
        let replay = to_replay(dir, *seq, entries)?;
        let replayed_to = replay.last().map_or(*seq, |e| e.seq);
        if required > replayed_to {
            return Err(StoreError::Corrupt {
                path: dir.to_path_buf(),
                detail: format!(
                    "commits up to #{required} were acknowledged, but the store only holds \
                     commits up to #{replayed_to} (sled discards a damaged log without reporting \
                     it)"
                ),
            });
        }
        for entry in &replay {
            transact(&engine.trees, dir, &entry.batch, entry.seq)?;
            *seq = entry.seq;
        }

        // sled writes `conf` without syncing it and never syncs the directories holding its
        // files. Do it once here so the files a later fdatasync relies on are reachable.
        sync_path(&dir.join("conf"))?;
        sync_path(&dir.join("blobs"))?;
        sync_path(dir)?;

        witness.disk = *seq;
        witness.kernel = *seq;
        let journal_file = journal.sync_handle().map_err(io_err(&journal_path))?;
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            engine: RwLock::new(Some(engine)),
            commits: Mutex::new(Commits {
                seq: *seq,
                journal: Some(journal),
            }),
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            closing: AtomicBool::new(false),
            journal_full: AtomicBool::new(false),
            needs_reopen: AtomicBool::new(false),
            journal_lost: AtomicBool::new(false),
            applying: Mutex::new(()),
            journal_file,
            journal_path,
            witness: Mutex::new(witness),
            data_path: dir.join("db"),
            synced_blobs: Mutex::new(HashMap::new()),
            fault: Mutex::new(None),
        });
        inner.sync_blobs()?;
        // What was replayed goes into sled's files, and the journal starts empty: its
        // records must continue sled's durable numbering (see the replay above). The witness
        // then claims everything, in this boot.
        inner.checkpoint()?;
        {
            let w = lock(&inner.witness)?;
            w.write().map_err(io_err(&dir.join(WITNESS_FILE)))?;
            w.file
                .sync_data()
                .map_err(io_err(&dir.join(WITNESS_FILE)))?;
        }
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
    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.inner.dir
    }
}

/// The longest a read or a reopen waits for the engine's lock: a reopen holds it only to
/// swap the engine, so a longer wait means something holds it that should not, and the
/// caller gets an error (150 for a CNI request) instead of a hang.
const ENGINE_WAIT: Duration = Duration::from_secs(2);

impl Inner {
    fn sled_err(&self) -> impl Fn(sled::Error) -> StoreError + '_ {
        move |e| map_sled(&self.dir, e)
    }

    /// The engine, or the fault that took it away. Waits at most [`ENGINE_WAIT`] for it.
    fn engine(&self) -> Result<RwLockReadGuard<'_, Option<Engine>>, StoreError> {
        let until = Instant::now() + ENGINE_WAIT;
        let engine = loop {
            match self.engine.try_read() {
                Ok(engine) => break engine,
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < until => {
                    thread::sleep(Duration::from_millis(1));
                }
                Err(std::sync::TryLockError::WouldBlock) => return Err(self.unavailable()),
                Err(std::sync::TryLockError::Poisoned(_)) => {
                    return Err(StoreError::Backend(
                        "SledStore lock poisoned by an earlier panic".into(),
                    ));
                }
            }
        };
        if engine.is_none() {
            return Err(self.unavailable());
        }
        Ok(engine)
    }

    /// Swaps the engine for `engine`, waiting at most [`ENGINE_WAIT`] for the lock; the old
    /// one is returned, to be closed without the lock ([`close_engine`]).
    fn swap_engine(&self, engine: Option<Engine>) -> Result<Option<Engine>, StoreError> {
        let until = Instant::now() + ENGINE_WAIT;
        loop {
            match self.engine.try_write() {
                Ok(mut slot) => return Ok(std::mem::replace(&mut *slot, engine)),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < until => {
                    thread::sleep(Duration::from_millis(1));
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    return Err(StoreError::Backend(format!(
                        "the ledger's engine stayed in use for {ENGINE_WAIT:?}; reopen deferred"
                    )));
                }
                Err(std::sync::TryLockError::Poisoned(_)) => {
                    return Err(StoreError::Backend(
                        "SledStore lock poisoned by an earlier panic".into(),
                    ));
                }
            }
        }
    }

    /// The error a commit (or a read without sled) gets while the store is in a fault.
    fn unavailable(&self) -> StoreError {
        let fault = self.fault.lock().ok().and_then(|f| f.clone());
        StoreError::Unavailable {
            path: self.dir.clone(),
            since: fault.as_ref().map_or_else(SystemTime::now, |f| f.since),
            disk_full: fault.as_ref().is_some_and(|f| f.disk_full),
            cause: fault.map_or_else(|| "the ledger is being reopened".into(), Fault::text),
        }
    }

    /// Records a failed write: commits fail from now on with its cause, and the applier
    /// reopens the store. The first cause stays until a reopen succeeds.
    fn fail(&self, e: &StoreError, permanent: bool) {
        self.record_fault(e, permanent);
        if let Ok(_pending) = self.pending.lock() {
            self.wake.notify_all();
        }
    }

    /// [`Inner::fail`] without waking the applier: for the applier itself, which holds the
    /// lock the wake-up needs.
    fn record_fault(&self, e: &StoreError, permanent: bool) {
        if let Ok(mut fault) = self.fault.lock() {
            match fault.as_mut() {
                Some(f) => {
                    // What made it permanent is what the operator must read.
                    if permanent && !f.permanent {
                        f.last_attempt = Some(e.to_string());
                    }
                    f.permanent |= permanent;
                }
                None => {
                    *fault = Some(Fault {
                        since: SystemTime::now(),
                        cause: e.to_string(),
                        disk_full: e.is_disk_full(),
                        permanent,
                        last_attempt: None,
                    })
                }
            }
        }
        self.needs_reopen.store(true, Ordering::Release);
    }

    fn faulted(&self) -> bool {
        self.fault.lock().map(|f| f.is_some()).unwrap_or(true)
    }

    /// Makes sled durable and empties the journal: pending commits written into sled,
    /// sled's log written (`flush`), its data and blob files fdatasynced, then the journal
    /// zeroed. Holds the commit lock, so no commit lands in between. Every commit so far is
    /// then on the disk, which the witness may claim.
    fn checkpoint(&self) -> Result<(), StoreError> {
        self.checkpoint_locked(&mut *lock(&self.commits)?)
    }

    /// [`Inner::checkpoint`] for a caller that holds the commit lock.
    fn checkpoint_locked(&self, commits: &mut Commits) -> Result<(), StoreError> {
        let Commits { seq, journal } = commits;
        let Some(journal) = journal.as_mut().filter(|j| j.is_dirty()) else {
            return Ok(());
        };
        self.apply_pending()?;
        {
            let engine = self.engine()?;
            let engine = engine.as_ref().expect("checked by engine()");
            self.persist(engine, Durability::SurvivesPowerCut)?;
        }
        journal.reset().map_err(io_err(&self.journal_path))?;
        self.claim(*seq, Durability::SurvivesPowerCut)
    }

    /// Writes every pending commit into sled, in one transaction that also records the last
    /// one's number, then forgets them. Readers see them throughout: in `pending` until they
    /// are in sled, since they are forgotten only after.
    fn apply_pending(&self) -> Result<(), StoreError> {
        let _applying = lock(&self.applying)?;
        let Some(snapshot) = lock(&self.pending)?.snapshot() else {
            return Ok(());
        };
        {
            let engine = self.engine()?;
            let engine = engine.as_ref().expect("checked by engine()");
            transact(&engine.trees, &self.dir, &snapshot.ops, snapshot.upto)?;
        }
        lock(&self.pending)?.applied(snapshot.upto);
        Ok(())
    }

    /// Closes sled and opens it again, replays the journal and checkpoints: what clears
    /// sled's sticky write error once the disk has room again (see the module doc). Every
    /// commit acknowledged so far is in the journal (or, after the journal was given up, in
    /// sled's flushed log), so the reopened store must hold every one the witness claims;
    /// if it does not, it cannot prove what it holds and stays refused until a restart runs
    /// the start-up checks.
    ///
    /// No lock is held while sled closes or opens (either can take long, and sled 0.34's
    /// close can wait forever, chunks.rs): the old engine is taken out in one short swap and
    /// closed on a thread of its own ([`close_engine`]); reads meanwhile fail at once with the
    /// fault (150 for a CNI request), and commits too, as they do during any fault.
    fn reopen(&self) -> Result<(), StoreError> {
        if let Some(old) = self.swap_engine(None)? {
            // Closed first: sled's lock on `db` goes with it, and the open below needs it.
            close_engine(&self.dir, old)?;
        }
        let engine = open_engine(&self.dir)?;
        let mut commits = lock(&self.commits)?;
        let applying = lock(&self.applying)?;
        let replayed_to = match self.replay_into(&engine, &mut commits) {
            Ok(seq) => seq,
            Err(e) => {
                drop(applying);
                drop(commits);
                // Not dropped here: the applier would hang with it if sled's close did.
                let _ = close_engine(&self.dir, engine);
                return Err(e);
            }
        };
        if let Some(other) = self.swap_engine(Some(engine))? {
            // Only a reopen puts an engine in, and only the applier reopens.
            close_engine(&self.dir, other)?;
        }
        self.claim(replayed_to, Durability::SurvivesPowerCut)?;
        self.journal_full.store(false, Ordering::Release);
        drop(applying);
        Ok(())
    }

    /// The reopen's work on the freshly opened `engine`, under the commit lock: the journal
    /// replayed into it, the witness checked against what it holds, a checkpoint. Returns the
    /// number of its last commit.
    fn replay_into(&self, engine: &Engine, commits: &mut Commits) -> Result<u64, StoreError> {
        let sled_seq = read_seq(&engine.db, &self.dir)?;
        let (mut journal, entries, tail) =
            Journal::open(&self.dir).map_err(io_err(&self.journal_path))?;
        let permanent = |e: StoreError| {
            self.fail(&e, true);
            e
        };
        check_tail(&self.dir, &self.journal_path, &tail).map_err(permanent)?;
        let replay = to_replay(&self.dir, sled_seq, entries).map_err(permanent)?;
        let replayed_to = replay.last().map_or(sled_seq, |e| e.seq);
        let claimed = {
            let w = lock(&self.witness)?;
            w.kernel.max(w.disk)
        };
        if claimed > replayed_to {
            return Err(permanent(StoreError::Corrupt {
                path: self.dir.clone(),
                detail: format!(
                    "reopened after a failed write, the store holds commits up to \
                     #{replayed_to}, but commits up to #{claimed} were acknowledged"
                ),
            }));
        }
        for entry in &replay {
            transact(&engine.trees, &self.dir, &entry.batch, entry.seq)?;
        }
        // Everything pending was journaled before it was pending: it is in sled now.
        *lock(&self.pending)? = Pending::default();
        self.persist(engine, Durability::SurvivesPowerCut)?;
        journal.reset().map_err(io_err(&self.journal_path))?;
        commits.seq = replayed_to;
        commits.journal = Some(journal);
        Ok(replayed_to)
    }

    /// The applier thread: once commits are pending, waits until none has come for
    /// [`APPLY_QUIET`] (at most [`APPLY_AT_MOST`] after the oldest), then writes them into
    /// sled, and checkpoints when the journal has passed its bound. After a failed write it
    /// reopens the store, retrying with a backoff. Ends when the store closes; the close's
    /// checkpoint writes what is left.
    fn run_applier(&self) {
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        let mut backoff = REOPEN_BACKOFF_MIN;
        loop {
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            if self.needs_reopen.load(Ordering::Acquire) {
                let permanent = self
                    .fault
                    .lock()
                    .map(|f| f.as_ref().is_some_and(|f| f.permanent))
                    .unwrap_or(true);
                if !permanent {
                    drop(pending);
                    let reopened = self.reopen();
                    pending = match self.pending.lock() {
                        Ok(p) => p,
                        Err(_) => return,
                    };
                    match reopened {
                        Ok(()) => {
                            self.needs_reopen.store(false, Ordering::Release);
                            if let Ok(mut f) = self.fault.lock() {
                                *f = None;
                            }
                            backoff = REOPEN_BACKOFF_MIN;
                            continue;
                        }
                        Err(e) => {
                            self.record_fault(&e, false);
                            if let Ok(mut f) = self.fault.lock()
                                && let Some(f) = f.as_mut()
                            {
                                f.last_attempt = Some(e.to_string());
                            }
                        }
                    }
                }
                pending = match self.wake.wait_timeout(pending, backoff) {
                    Ok((p, _)) => p,
                    Err(_) => return,
                };
                backoff = (backoff * 2).min(REOPEN_BACKOFF_MAX);
                continue;
            }
            if self.journal_lost.swap(false, Ordering::AcqRel) {
                drop(pending);
                if let Err(e) = self.restart_journal() {
                    // sled's own writes fail too: a fault, which the reopen clears.
                    self.fail(&e, false);
                }
                pending = match self.pending.lock() {
                    Ok(p) => p,
                    Err(_) => return,
                };
                continue;
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
            let mut result = self.apply_pending();
            if result.is_ok() && self.journal_full.swap(false, Ordering::AcqRel) {
                result = self.checkpoint();
                if result.is_err() {
                    self.journal_full.store(true, Ordering::Release);
                }
            }
            if let Err(e) = result {
                // The commits stay pending (and in the journal); the reopen replays them.
                self.fail(&e, false);
            }
            pending = match self.pending.lock() {
                Ok(p) => p,
                Err(_) => return,
            };
        }
    }

    /// A fresh journal after an append failed (commits meanwhile went through sled's own
    /// flush): sled made durable, then the journal zeroed and taken back into use, under the
    /// commit lock. No reopen: the engine stays, and commits are served throughout (a reopen
    /// swapped the engine out, and commits in that window failed with 150 although nothing
    /// had failed but one append).
    fn restart_journal(&self) -> Result<(), StoreError> {
        let mut commits = lock(&self.commits)?;
        if commits.journal.is_some() {
            return Ok(());
        }
        self.apply_pending()?;
        {
            let engine = self.engine()?;
            let engine = engine.as_ref().expect("checked by engine()");
            self.persist(engine, Durability::SurvivesPowerCut)?;
        }
        // What the journal holds (a torn record among them) is in sled now: zeroed unread.
        let (mut journal, _, _) = Journal::open(&self.dir).map_err(io_err(&self.journal_path))?;
        journal.reset().map_err(io_err(&self.journal_path))?;
        commits.journal = Some(journal);
        self.claim(commits.seq, Durability::SurvivesPowerCut)
    }

    /// Records in the witness that every commit up to `seq` is in the kernel and, for
    /// [`Durability::SurvivesPowerCut`], on the disk. Written but not synced: after a power cut it may
    /// lag behind the store (weaker detection, never a false alarm: the disk claim is written
    /// only after the fdatasync, and the kernel claim binds only in the boot that wrote it),
    /// and an fdatasync here would double the cost of every commit.
    fn claim(&self, seq: u64, durability: Durability) -> Result<(), StoreError> {
        let mut witness = lock(&self.witness)?;
        let disk = durability == Durability::SurvivesPowerCut && seq > witness.disk;
        if seq > witness.kernel || disk {
            witness.kernel = witness.kernel.max(seq);
            if disk {
                witness.disk = seq;
            }
            witness
                .write()
                .map_err(io_err(&self.dir.join(WITNESS_FILE)))?;
        }
        Ok(())
    }

    /// sled's log written (flush: sync_file_range, which survives kill -9), and for a Disk
    /// commit the blobs, then the data file, fdatasynced: blobs first, so a durable log entry
    /// never points at a blob that a power cut could lose.
    fn persist(&self, engine: &Engine, durability: Durability) -> Result<(), StoreError> {
        engine.db.flush().map_err(self.sled_err())?;
        if durability == Durability::SurvivesPowerCut {
            self.sync_blobs()?;
            engine
                .data_file
                .sync_data()
                .map_err(io_err(&self.data_path))?;
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
        if !self.inner.faulted() {
            let _ = self.inner.checkpoint();
        }
    }
}

/// Locks `m`. A poisoned mutex means a panic in this module while holding it; report it
/// instead of guessing whether the state it guards is still right.
fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>, StoreError> {
    m.lock()
        .map_err(|_| StoreError::Backend("SledStore mutex poisoned by an earlier panic".into()))
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

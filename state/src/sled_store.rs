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

/// The sled database and the handles that go with it; replaced whole by a reopen.
pub(crate) struct Engine {
    pub(crate) db: sled::Db,
    /// Indexed by [`Tree::index`]; the last element is sled's default tree, which holds
    /// [`SEQ_KEY`].
    pub(crate) trees: Vec<sled::Tree>,
    /// A read-only handle on `<dir>/db`: fsync acts on the inode, so it syncs sled's writes.
    data_file: File,
}

impl Engine {
    fn tree(&self, tree: Tree) -> &sled::Tree {
        &self.trees[tree.index()]
    }

    /// The tree of large values' pieces (chunks.rs): the one before sled's default tree.
    fn pieces(&self) -> &sled::Tree {
        &self.trees[self.trees.len() - 2]
    }

    /// A value as sled holds it, with a large one put together from its pieces.
    fn resolve(
        &self,
        dir: &Path,
        value: sled::IVec,
    ) -> Result<Result<Vec<u8>, chunks::Torn>, StoreError> {
        match chunks::Stub::parse(&value) {
            None => Ok(Ok(value.to_vec())),
            Some(stub) => stub
                .assemble(|k| self.pieces().get(k))
                .map_err(|e| map_sled(dir, e)),
        }
    }
}

/// How many times a read starts over when a large value it read was replaced meanwhile.
const TORN_RETRIES: usize = 8;

/// The error of a read that kept meeting replaced values.
fn kept_changing(dir: &Path) -> StoreError {
    StoreError::Backend(format!(
        "a large value in {} kept changing while it was read",
        dir.display()
    ))
}

/// The longest a read or a reopen waits for the engine's lock: a reopen holds it only to
/// swap the engine, so a longer wait means something holds it that should not, and the
/// caller gets an error (150 for a CNI request) instead of a hang.
const ENGINE_WAIT: Duration = Duration::from_secs(2);

/// How long a reopen waits for the old sled engine to close (it flushes and joins its
/// threads) before it leaves it to a thread of its own. sled's files stay locked until it
/// has closed, so the reopen fails meanwhile, and is retried.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// The most old engines left closing at once. sled 0.34 can wait forever in its close after
/// a failed write of a large value (chunks.rs says why such writes no longer happen); each
/// such engine holds a thread and its memory, so past this many the store stops reopening
/// and reports a fault a restart clears.
const MAX_CLOSING: usize = 2;

/// Old engines whose close has not finished.
static CLOSING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Closes `engine` on a thread of its own, waiting at most [`CLOSE_WAIT`] for it: never
/// under a lock, so that readers and commits get errors rather than a hang while sled
/// closes. Err: it is still closing (its files are still locked).
fn close_engine(dir: &Path, engine: Engine) -> Result<(), StoreError> {
    if CLOSING.load(Ordering::Acquire) >= MAX_CLOSING {
        // Dropped here would hang this thread: leaked instead (bounded: it takes no reopen).
        std::mem::forget(engine);
        return Err(StoreError::Backend(format!(
            "{MAX_CLOSING} earlier sled engines of {} never finished closing; restart dipamd",
            dir.display()
        )));
    }
    CLOSING.fetch_add(1, Ordering::AcqRel);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let spawned = thread::Builder::new()
        .name("dipam-ledger-close".into())
        .spawn(move || {
            drop(engine);
            CLOSING.fetch_sub(1, Ordering::AcqRel);
            let _ = done_tx.send(());
        });
    if let Err(e) = spawned {
        CLOSING.fetch_sub(1, Ordering::AcqRel);
        return Err(io_err(dir)(e));
    }
    done_rx.recv_timeout(CLOSE_WAIT).map_err(|_| {
        StoreError::Backend(format!(
            "the previous sled engine of {} has not finished closing after {CLOSE_WAIT:?}",
            dir.display()
        ))
    })
}

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

/// Opens sled in `dir` with the trees, retrying a lock the same process just released.
///
/// Damage that sled notices comes back as `Error::Corruption`; damage it does not is caught
/// by the witness. sled 0.34 also has `unwrap`s and asserts on its recovery path, so a
/// damaged file may panic instead: that is an unreadable store too, and the operator should
/// get an error, not a backtrace.
///
/// A store this process has just closed may keep sled's lock for a moment: the last write
/// job in sled's I/O pool holds the file until it returns. So a lock conflict is retried
/// briefly before it is reported (another dipamd holds it for good).
fn open_engine(dir: &Path) -> Result<Engine, StoreError> {
    discard_unfinished_snapshots(dir)?;
    // Mode: LowSpace (sled's default) keeps the log compact; our write rate is a few
    // commits per pod start, far from where HighThroughput would pay off.
    let config = sled::Config::new()
        .path(dir)
        .cache_capacity(CACHE_CAPACITY)
        .mode(sled::Mode::LowSpace)
        .flush_every_ms(Some(BACKGROUND_FLUSH_MS));
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
    trees.push(db.open_tree(chunks::TREE).map_err(|e| map_sled(dir, e))?);
    trees.push((*db).clone());
    let data_path = dir.join("db");
    let data_file = File::open(&data_path).map_err(io_err(&data_path))?;
    Ok(Engine {
        db,
        trees,
        data_file,
    })
}

/// Removes the snapshot files sled 0.34 left half-written. sled writes a snapshot to
/// `snap.<lsn>.generating`, syncs it and renames it to `snap.<lsn>`; but its open reads the
/// highest-named `snap.` file without skipping `.generating` ones, so one left by a write
/// that failed (a full disk) or a kill in between was read as the latest snapshot, failed
/// its checksum, and sled refused to open: a store that lost nothing was reported damaged,
/// and after a full disk dipamd never served again until `dipamctl recover` (measured: one
/// round in ten of a full disk with 400 kB values). Such a file is by construction never the
/// snapshot of record (the rename is what makes it one), and the log is authoritative
/// beyond the last complete snapshot, so it is removed unread.
fn discard_unfinished_snapshots(dir: &Path) -> Result<(), StoreError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            match fs::remove_file(entry.path()) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&entry.path())(e)),
            }
        }
    }
    Ok(())
}

/// The commits an open replays from the journal: those after sled's last (`seq`), which must
/// continue its numbering. A journal that starts further on means sled lost commits it had
/// made durable before the journal's last checkpoint.
fn to_replay(
    dir: &Path,
    seq: u64,
    entries: Vec<crate::journal::Entry>,
) -> Result<Vec<crate::journal::Entry>, StoreError> {
    let replay: Vec<_> = entries.into_iter().filter(|e| e.seq > seq).collect();
    match replay.first() {
        Some(first) if first.seq != seq + 1 => Err(StoreError::Corrupt {
            path: dir.to_path_buf(),
            detail: format!(
                "the commit journal continues from #{}, but the store only holds commits up to \
                 #{seq} (sled discards a damaged log without reporting it)",
                first.seq
            ),
        }),
        _ => Ok(replay),
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

/// Refuses a journal whose tail is damaged (journal.rs says what that means).
fn check_tail(dir: &Path, journal_path: &Path, tail: &Tail) -> Result<(), StoreError> {
    match tail {
        Tail::Clean | Tail::Torn { .. } => Ok(()),
        Tail::Damaged { at, detail } => Err(StoreError::Corrupt {
            path: dir.to_path_buf(),
            detail: format!(
                "the commit journal {} is damaged at byte {at}: {detail}; it may have held a \
                 commit that was acknowledged, so the store cannot prove what it holds",
                journal_path.display()
            ),
        }),
    }
}

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

impl Inner {
    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        for _ in 0..TORN_RETRIES {
            if let Some(pending) = lock(&self.pending)?.get(tree, key) {
                return Ok(pending);
            }
            let engine = self.engine()?;
            let engine = engine.as_ref().expect("checked by engine()");
            let Some(value) = engine.tree(tree).get(key).map_err(self.sled_err())? else {
                return Ok(None);
            };
            if let Ok(value) = engine.resolve(&self.dir, value)? {
                return Ok(Some(value));
            }
        }
        Err(kept_changing(&self.dir))
    }

    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
        for _ in 0..TORN_RETRIES {
            // The overlay first: a commit applied meanwhile is then in sled, with the same
            // value.
            let overlay = lock(&self.pending)?.overlay(tree, prefix);
            if let Ok(entries) = self.scan_under(tree, prefix, overlay)? {
                return Ok(entries);
            }
        }
        Err(kept_changing(&self.dir))
    }

    /// sled's entries under `prefix`, with `overlay` (pending ops read before) laid over them.
    /// Torn: a large value was replaced while it was read; read again.
    fn scan_under(
        &self,
        tree: Tree,
        prefix: &[u8],
        overlay: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ) -> Result<Result<Vec<KeyValue>, chunks::Torn>, StoreError> {
        let engine = self.engine()?;
        let engine = engine.as_ref().expect("checked by engine()");
        let mut base = Vec::new();
        for kv in engine.tree(tree).scan_prefix(prefix) {
            let (k, v) = kv.map_err(self.sled_err())?;
            match engine.resolve(&self.dir, v)? {
                Ok(v) => base.push((k.to_vec(), v)),
                Err(torn) => return Ok(Err(torn)),
            }
        }
        Ok(Ok(merge(base, overlay)))
    }

    fn scan_keys(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        let overlay = lock(&self.pending)?.overlay(tree, prefix);
        if !overlay.is_empty() {
            let entries = self.scan_prefix(tree, prefix)?;
            return Ok(entries.into_iter().map(|(k, _)| k).collect());
        }
        // Nothing pending here: sled's keys alone, without reading the values.
        let engine = self.engine()?;
        let engine = engine.as_ref().expect("checked by engine()");
        engine
            .tree(tree)
            .scan_prefix(prefix)
            .keys()
            .map(|k| k.map(|k| k.to_vec()).map_err(self.sled_err()))
            .collect()
    }

    fn len(&self, tree: Tree) -> Result<usize, StoreError> {
        let overlay = lock(&self.pending)?.overlay(tree, b"");
        let engine = self.engine()?;
        let engine = engine.as_ref().expect("checked by engine()");
        let sled = engine.tree(tree);
        // Not `sled::Tree::len`: it counts an iterator that, after a failed write, yields the
        // same error forever (see the module doc). The first error ends the count here.
        //
        // The overlay is laid over the keys this iteration saw, not over a second look at
        // sled: the applier may write the overlay's commits into sled between the two, and a
        // count that iterated before and looked after missed them both ways (a ledger of 4
        // counted 0 under a loaded test run).
        let mut overlay: HashMap<Vec<u8>, (bool, bool)> = overlay
            .into_iter()
            .map(|(key, value)| (key, (value.is_some(), false)))
            .collect();
        let mut len = 0;
        for key in sled.iter().keys() {
            let key = key.map_err(self.sled_err())?;
            len += 1;
            if let Some((_, seen)) = overlay.get_mut(key.as_ref()) {
                *seen = true;
            }
        }
        for (present, seen) in overlay.into_values() {
            match (seen, present) {
                (false, true) => len += 1,
                (true, false) => len -= 1,
                _ => {}
            }
        }
        Ok(len)
    }

    fn commit_with(&self, batch: Batch, durability: Durability) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        if self.faulted() {
            return Err(self.unavailable());
        }
        let result = self.commit_inner(batch, durability);
        if let Err(e) = &result {
            self.fail(e, false);
        }
        result
    }

    fn commit_inner(&self, batch: Batch, durability: Durability) -> Result<(), StoreError> {
        let (seq, journaled) = {
            let mut commits = lock(&self.commits)?;
            let seq = commits.seq + 1;
            if commits
                .journal
                .as_ref()
                .is_some_and(|j| j.len() >= JOURNAL_HARD_LIMIT)
            {
                // Backpressure: this commit checkpoints before it appends. Large values
                // (400 kB network configs) filled the journal faster than the applier's
                // checkpoints emptied it, and the 11th such commit in a row was refused
                // although nothing had failed. A checkpoint that fails is a real write
                // failure: the fault and a reopen follow.
                self.checkpoint_locked(&mut commits)?;
            }
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
                    // is pending goes into sled first, to keep the order. The applier
                    // then starts a fresh journal (`restart_journal`).
                    if commits.journal.take().is_some() {
                        self.journal_lost.store(true, Ordering::Release);
                        if let Ok(_p) = self.pending.lock() {
                            self.wake.notify_all();
                        }
                    }
                    self.apply_pending()?;
                    let engine = self.engine()?;
                    let engine = engine.as_ref().expect("checked by engine()");
                    transact(&engine.trees, &self.dir, &batch, seq)?;
                    None
                }
            };
            commits.seq = seq;
            (seq, journaled)
        };

        match journaled {
            Some(_) if durability == Durability::SurvivesProcessCrash => {}
            // The fdatasync covers this record and every earlier one.
            Some(_) => self
                .journal_file
                .sync_data()
                .map_err(io_err(&self.journal_path))?,
            None => {
                // Without the journal: flush writes sled's log (sync_file_range), then blobs
                // and the data file are fdatasynced. Blobs first, so a durable log entry never
                // points at a blob that a power cut could lose.
                let engine = self.engine()?;
                let engine = engine.as_ref().expect("checked by engine()");
                self.persist(engine, durability)?;
            }
        }
        // A Process commit is claimed in the kernel only: a power cut may lose it, and a
        // store that lost an unsynced tail after a reboot is not damaged. The next Disk
        // commit's fdatasync covers it.
        self.claim(seq, durability)?;
        if journaled.is_some_and(|len| len >= CHECKPOINT_BYTES) {
            // The applier checkpoints once it has written this commit into sled: off this
            // request's path, which must not pay two fdatasyncs and a 2 MiB write.
            self.journal_full.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn fault(&self) -> Option<String> {
        let f = self.fault.lock().ok()?.clone()?;
        Some(
            StoreError::Unavailable {
                path: self.dir.clone(),
                since: f.since,
                disk_full: f.disk_full,
                cause: f.text(),
            }
            .to_string(),
        )
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
    /// a commit that returned `Ok` survives kill -9 and, with [`Durability::SurvivesPowerCut`] (thanks to
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

    fn fault(&self) -> Option<String> {
        self.inner.fault()
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

/// What the witness file says (see [`Witness`]).
enum WitnessRead {
    Missing,
    /// Present but not a witness: a garbled file proves nothing.
    Unreadable(String),
    /// An earlier build's witness: the last disk commit only.
    Legacy(u64),
    Claims(Witness0),
}

/// The claims of a witness read back.
struct Witness0 {
    disk: u64,
    kernel: u64,
    boot: String,
}

/// The witness file: `v2 <disk> <kernel> <boot id>`, numbers zero-padded so every update is
/// one in-place `pwrite` of the same byte range. `disk`: the last commit known to be on the
/// disk (its fdatasync returned). `kernel`: the last commit acknowledged at all, binding
/// only in the boot `boot`, since a power cut may take back what was only in the kernel.
pub(crate) struct Witness {
    file: File,
    disk: u64,
    kernel: u64,
    boot: String,
}

/// Width of the zero-padded numbers and of the boot id in the witness file.
const WITNESS_WIDTH: usize = 20;
const BOOT_WIDTH: usize = 36;

impl Witness {
    fn write(&self) -> io::Result<()> {
        let boot = format!("{:-<BOOT_WIDTH$}", self.boot);
        self.file.write_all_at(
            format!(
                "v2 {:0WITNESS_WIDTH$} {:0WITNESS_WIDTH$} {}\n",
                self.disk,
                self.kernel,
                &boot[..BOOT_WIDTH.min(boot.len())]
            )
            .as_bytes(),
            0,
        )
    }
}

/// The id of the running boot, if the kernel says.
fn boot_id() -> Option<String> {
    fs::read_to_string(BOOT_ID)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Applies `batch` plus the commit number `seq` in one sled transaction.
fn transact(trees: &[sled::Tree], dir: &Path, batch: &Batch, seq: u64) -> Result<(), StoreError> {
    let seq_index = trees.len() - 1;
    let pieces_index = trees.len() - 2;
    // Transact over every tree: simpler than collecting the touched ones, and the cost is
    // one overlay per tree. sled may re-run this closure on conflict, so it only touches
    // the transactional views (no I/O, no side effects).
    let result = trees.transaction(
        |txs| -> ConflictableTransactionResult<(), std::convert::Infallible> {
            chunks::write(txs, &txs[pieces_index], batch.ops(), seq)?;
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

/// What the witness file at `path` says.
fn read_witness(path: &Path) -> Result<WitnessRead, StoreError> {
    let text = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(WitnessRead::Missing),
        Err(source) => {
            return Err(StoreError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let Ok(text) = std::str::from_utf8(&text) else {
        return Ok(WitnessRead::Unreadable("not text".into()));
    };
    let fields: Vec<&str> = text.split_whitespace().collect();
    let number = |s: &str| s.parse::<u64>().ok();
    Ok(match fields.as_slice() {
        [n] => match number(n) {
            Some(n) => WitnessRead::Legacy(n),
            None => WitnessRead::Unreadable(format!("{:?}", text.trim())),
        },
        ["v2", disk, kernel, boot] => match (number(disk), number(kernel)) {
            (Some(disk), Some(kernel)) => WitnessRead::Claims(Witness0 {
                disk,
                kernel,
                boot: boot.trim_end_matches('-').to_string(),
            }),
            _ => WitnessRead::Unreadable(format!("{:?}", text.trim())),
        },
        [] => WitnessRead::Unreadable("empty".into()),
        _ => WitnessRead::Unreadable(format!("{:?}", text.trim())),
    })
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

//! The sled engine under the store: opening it (with the lock retries and the half-written
//! snapshots sled 0.34 leaves), closing it off the caller's thread, applying one batch to its
//! trees, and what an open takes from the commit journal (its tail checked, the commits to
//! replay). Replaced whole by a reopen (sled_store.rs).

use super::*;

/// The sled database and the handles that go with it; replaced whole by a reopen.
pub(crate) struct Engine {
    pub(crate) db: sled::Db,
    /// Indexed by [`Tree::index`]; the last element is sled's default tree, which holds
    /// [`SEQ_KEY`].
    pub(crate) trees: Vec<sled::Tree>,
    /// A read-only handle on `<dir>/db`: fsync acts on the inode, so it syncs sled's writes.
    pub(super) data_file: File,
}

impl Engine {
    pub(super) fn tree(&self, tree: Tree) -> &sled::Tree {
        &self.trees[tree.index()]
    }

    /// The tree of large values' pieces (chunks.rs): the one before sled's default tree.
    pub(super) fn pieces(&self) -> &sled::Tree {
        &self.trees[self.trees.len() - 2]
    }

    /// A value as sled holds it, with a large one put together from its pieces.
    pub(super) fn resolve(
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
pub(super) const TORN_RETRIES: usize = 8;

/// The error of a read that kept meeting replaced values.
pub(super) fn kept_changing(dir: &Path) -> StoreError {
    StoreError::Backend(format!(
        "a large value in {} kept changing while it was read",
        dir.display()
    ))
}

/// How long a reopen waits for the old sled engine to close (it flushes and joins its
/// threads) before it leaves it to a thread of its own. sled's files stay locked until it
/// has closed, so the reopen fails meanwhile, and is retried.
pub(super) const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// The most old engines left closing at once. sled 0.34 can wait forever in its close after
/// a failed write of a large value (chunks.rs says why such writes no longer happen); each
/// such engine holds a thread and its memory, so past this many the store stops reopening
/// and reports a fault a restart clears.
pub(super) const MAX_CLOSING: usize = 2;

/// Old engines whose close has not finished.
pub(super) static CLOSING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Closes `engine` on a thread of its own, waiting at most [`CLOSE_WAIT`] for it: never
/// under a lock, so that readers and commits get errors rather than a hang while sled
/// closes. Err: it is still closing (its files are still locked).
pub(super) fn close_engine(dir: &Path, engine: Engine) -> Result<(), StoreError> {
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
pub(super) fn open_engine(dir: &Path) -> Result<Engine, StoreError> {
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
pub(super) fn discard_unfinished_snapshots(dir: &Path) -> Result<(), StoreError> {
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
pub(super) fn to_replay(
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

/// Applies `batch` plus the commit number `seq` in one sled transaction.
pub(super) fn transact(
    trees: &[sled::Tree],
    dir: &Path,
    batch: &Batch,
    seq: u64,
) -> Result<(), StoreError> {
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

/// Maps a sled error to ours, recognising the lock conflict and corruption.
pub(super) fn map_sled(dir: &Path, e: sled::Error) -> StoreError {
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

pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Refuses a journal whose tail is damaged (journal.rs says what that means).
pub(super) fn check_tail(dir: &Path, journal_path: &Path, tail: &Tail) -> Result<(), StoreError> {
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

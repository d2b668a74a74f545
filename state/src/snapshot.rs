//! A look at a ledger without opening it: for `dipamctl doctor --offline` and
//! `support-bundle` on a node whose dipamd is down, or starting.
//!
//! Opening the ledger in place is not read-only: sled takes an exclusive `flock` on
//! `<dir>/db` (a dipamd starting meanwhile would then fail with "locked", and a unit with
//! `Restart=always` would retry until the look ends), and an open replays the commit journal
//! and writes the witness. So the store's files are copied, read-only, into a private scratch
//! directory, the copy is opened (its checks and replay act on the copy), its records are
//! read, and the copy is removed. The original's files are only ever opened for reading; no
//! lock is taken on them.
//!
//! A copy taken while a dipamd writes may be torn: it then fails to open as corrupt, and the
//! caller says so (the original is untouched and says nothing about it).

use std::{
    fs,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
};

use crate::{
    AttachmentRecord, Ledger, StoreError, journal::JOURNAL_FILE, sled_store::WITNESS_FILE,
};

/// sled's own files in the store directory (0.34: its config, its log, its snapshots, its
/// blobs) and dipam's journal and witness; nothing else in the directory (the DEL spool,
/// the delegate exec records) belongs to the store.
fn is_store_file(name: &str) -> bool {
    name == "conf"
        || name == "db"
        || name.starts_with("snap.")
        || name == JOURNAL_FILE
        || name == WITNESS_FILE
}

/// Every attachment record of the ledger in `dir`, read from a copy made under `scratch`
/// (which must exist; the copy is removed before this returns).
///
/// Errors: [`StoreError::Io`] naming the file that could not be copied, or what opening
/// the copy reports ([`StoreError::Corrupt`] for a copy torn by a running dipamd).
/// A `dir` with no ledger in it is an error too, never an empty ledger.
pub fn read_copy(dir: &Path, scratch: &Path) -> Result<Vec<AttachmentRecord>, StoreError> {
    if !dir.join("db").is_file() {
        return Err(StoreError::Io {
            path: dir.join("db"),
            source: std::io::ErrorKind::NotFound.into(),
        });
    }
    let copy = scratch.join(format!(
        "dipam-ledger-copy-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&copy)
        .map_err(io(&copy))?;
    let result = copy_store(dir, &copy).and_then(|()| {
        let store = crate::sled_store::SledStore::open(&copy)?;
        Ledger::new(store).list(None)
    });
    let _ = fs::remove_dir_all(&copy);
    result
}

fn copy_store(dir: &Path, copy: &Path) -> Result<(), StoreError> {
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let from = entry.path();
        let kind = entry.file_type().map_err(io(&from))?;
        if kind.is_file() && is_store_file(&name) {
            fs::copy(&from, copy.join(&name)).map_err(io(&from))?;
        } else if kind.is_dir() && name == "blobs" {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(copy.join("blobs"))
                .map_err(io(copy))?;
            for blob in fs::read_dir(&from).map_err(io(&from))? {
                let blob = blob.map_err(io(&from))?;
                if blob.file_type().is_ok_and(|t| t.is_file()) {
                    fs::copy(blob.path(), copy.join("blobs").join(blob.file_name()))
                        .map_err(io(&blob.path()))?;
                }
            }
        }
    }
    Ok(())
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
    let path: PathBuf = path.to_owned();
    move |source| StoreError::Io {
        path: path.clone(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;

    #[test]
    fn a_copy_reads_the_records_and_leaves_the_original_unlocked_and_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        {
            let store = crate::open(&state).unwrap();
            let ledger = Ledger::new(store);
            let rec = crate::suite::record("net", "c1", "eth0");
            ledger.put(&rec).unwrap();
        }
        // Held open by a "dipamd": the copy still reads it, and never waits for its lock.
        let held = crate::open(&state).unwrap();
        let names = || {
            let mut v: Vec<_> = fs::read_dir(&state)
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .collect();
            v.sort();
            v
        };
        let before = names();
        let recs = read_copy(&state, scratch.path()).unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].key.container_id, "c1");
        let after = names();
        drop(held);
        assert_eq!(before, after, "nothing created beside the original");
        assert_eq!(
            fs::read_dir(scratch.path()).unwrap().count(),
            0,
            "copy removed"
        );
        // No ledger is an error, not an empty one.
        assert!(read_copy(dir.path(), scratch.path()).is_err());
        assert_eq!(
            crate::open(&state)
                .unwrap()
                .len(crate::Tree::Attachments)
                .unwrap(),
            1
        );
    }
}

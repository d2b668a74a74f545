//! The free space an open of the store needs, checked before anything is written.
//!
//! An open writes: sled's recovery rewrites part of its log and reserves a fresh segment
//! (measured in docs/configuration.md, "Free space"), the commit journal is preallocated to
//! its full size when it is smaller, and the checkpoint that ends the open flushes sled again.
//! On a file system without that room the open fails half-way, with an I/O error that names
//! nothing the operator can act on; checked first, it fails with [`StoreError::NoSpace`],
//! saying how much is missing.

use std::path::Path;

use crate::StoreError;
use crate::journal::{JOURNAL_FILE, PREALLOCATED};

/// What an open needs beyond the journal's preallocation and replay: sled extends its file to
/// a whole 512 KiB segment and rewrites part of its log (measured: +0.1 to +0.5 MiB per open
/// of a cleanly closed store of 10 to 5,000 records), plus room for the first commits.
pub const OPEN_MARGIN: u64 = 2 * 1024 * 1024;

/// How much sled's files grow per byte of journal an open replays into them: measured 3.3
/// (a 1.9 MB journal left by a killed writer grew sled's file by 6.3 MB), rounded up.
const REPLAY_GROWTH: u64 = 4;

/// The bytes an open of the store in `dir` needs free: the journal's preallocation where
/// the file is smaller, sled's growth for what the journal holds to replay, and
/// [`OPEN_MARGIN`].
pub fn needed_to_open(dir: &Path) -> u64 {
    let journal = std::fs::read(dir.join(JOURNAL_FILE)).unwrap_or_default();
    let to_replay = journal.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1) as u64;
    PREALLOCATED.saturating_sub(journal.len() as u64) + REPLAY_GROWTH * to_replay + OPEN_MARGIN
}

/// Refuses an open of `dir` when its file system has less free space than
/// [`needed_to_open`]. Free space is what `df` shows as available (`f_bavail`): dipamd runs as
/// root and could also use the blocks reserved for root, but those are the file system's
/// last resort, not the ledger's.
pub(crate) fn check(dir: &Path) -> Result<(), StoreError> {
    let stat = nix::sys::statvfs::statvfs(dir).map_err(|e| StoreError::Io {
        path: dir.to_path_buf(),
        source: std::io::Error::from(e),
    })?;
    #[allow(clippy::unnecessary_cast)] // the field types differ between libcs
    let available = stat.blocks_available() as u64 * stat.fragment_size() as u64;
    let needed = needed_to_open(dir);
    if available < needed {
        return Err(StoreError::NoSpace {
            path: dir.to_path_buf(),
            available,
            needed,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_with_its_journal_needs_only_the_margin() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(needed_to_open(dir.path()), PREALLOCATED + OPEN_MARGIN);
        drop(crate::sled_store::SledStore::open(dir.path()).unwrap());
        assert_eq!(needed_to_open(dir.path()), OPEN_MARGIN);
    }
}

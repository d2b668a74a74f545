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

/// What an open needs beyond the journal's preallocation: sled's growth at open (a fresh
/// segment of its log and the rewritten tail) plus the checkpoint's flush, with room to spare.
/// docs/configuration.md gives the measurements behind it.
pub const OPEN_MARGIN: u64 = 8 * 1024 * 1024;

/// The bytes an open of the store in `dir` needs free.
pub fn needed_to_open(dir: &Path) -> u64 {
    let journal = std::fs::metadata(dir.join(JOURNAL_FILE)).map_or(0, |m| m.len());
    PREALLOCATED.saturating_sub(journal) + OPEN_MARGIN
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

/// `n` bytes for a person: "2.3 MiB".
pub(crate) fn human(n: u64) -> String {
    const UNITS: [&str; 4] = ["bytes", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(2_411_724), "2.3 MiB");
        assert_eq!(human(8 * 1024 * 1024), "8.0 MiB");
    }

    #[test]
    fn a_store_with_its_journal_needs_only_the_margin() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(needed_to_open(dir.path()), PREALLOCATED + OPEN_MARGIN);
        drop(crate::SledStore::open(dir.path()).unwrap());
        assert_eq!(needed_to_open(dir.path()), OPEN_MARGIN);
    }
}

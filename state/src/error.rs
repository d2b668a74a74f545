//! The one error type of the state crate. Messages are written for the operator reading
//! dipamd's startup log, since most of these stop the daemon.

use std::path::PathBuf;
use std::time::SystemTime;

/// Everything that can go wrong reading or writing the ledger.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another process (normally another dipamd) holds the store's lock.
    #[error(
        "state directory {} is in use by another dipamd (only one daemon may run per state directory)",
        path.display()
    )]
    Locked {
        /// The state directory.
        path: PathBuf,
    },

    /// The store exists but cannot be proven to hold every commit it acknowledged.
    #[error(
        "state store at {} cannot be trusted: {detail}; dipamd refuses to start rather than guess \
         which attachments exist, since releasing an address a running pod holds, or keeping \
         one nobody holds, would follow. With dipamd stopped, rebuild the ledger from the \
         delegate's store with `dipamctl recover --state-dir {} --conflist FILE`, which moves \
         the damaged ledger aside and keeps the DEL spool, or restore the directory from a \
         backup",
        path.display(),
        path.display()
    )]
    Corrupt {
        /// The state directory.
        path: PathBuf,
        /// What was found to be wrong.
        detail: String,
    },

    /// The store was written by a newer dipamd whose format this one does not know.
    #[error(
        "state store at {} has schema version {found}, but this dipamd supports at most \
         {supported}; refusing to start (run a newer dipamd or use another state directory)",
        path.display()
    )]
    SchemaTooNew {
        /// The state directory.
        path: PathBuf,
        /// The version recorded in the store.
        found: u32,
        /// [`crate::SCHEMA_VERSION`] of this build.
        supported: u32,
    },

    /// The file system holding the store lacks the free space an open needs.
    #[error(
        "state directory {} has {available} bytes free ({}), but opening the ledger needs at \
         least {needed} ({}): sled rewrites part of its log at open and the commit journal is \
         preallocated. Free space on that file system (or give --state-dir a larger one) and \
         start dipamd again",
        path.display(),
        human(*available),
        human(*needed)
    )]
    NoSpace {
        /// The state directory.
        path: PathBuf,
        /// Bytes available (as `df` shows them).
        available: u64,
        /// Bytes an open needs.
        needed: u64,
    },

    /// Writes to the store have been failing (a full disk, say); every commit fails at once
    /// with this until the store has been reopened, which is retried in the background.
    #[error(
        "the ledger in {} cannot be written ({}s ago): {cause}; dipamd keeps retrying and \
         serves again as soon as it can{}",
        path.display(),
        since.elapsed().map_or(0, |d| d.as_secs()),
        if *disk_full {
            " (the file system is full: free space under the state directory)"
        } else {
            ""
        }
    )]
    Unavailable {
        /// The state directory.
        path: PathBuf,
        /// When the first write failed.
        since: SystemTime,
        /// The first failure.
        cause: String,
        /// The failure was ENOSPC.
        disk_full: bool,
    },

    /// An operating-system I/O error on the store's files.
    #[error("I/O error on state store {}: {source}", path.display())]
    Io {
        /// The file or directory the error is about.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A stored record does not parse.
    #[error("cannot decode {tree} record {key}: {detail}")]
    Decode {
        /// The tree's name ([`crate::Tree::name`]).
        tree: &'static str,
        /// The key, with non-printable bytes escaped.
        key: String,
        /// What did not parse.
        detail: String,
    },

    /// A key cannot be encoded unambiguously (e.g. a field contains NUL).
    #[error("invalid key: {0}")]
    InvalidKey(String),

    /// Any other failure of the storage engine.
    #[error("state store error: {0}")]
    Backend(String),
}

impl StoreError {
    /// True when the error is (or was caused by) a full file system, ENOSPC.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::Io { source, .. } => {
                source.raw_os_error() == Some(28)
                    || source.kind() == std::io::ErrorKind::StorageFull
            }
            StoreError::NoSpace { .. } => true,
            StoreError::Unavailable { disk_full, .. } => *disk_full,
            _ => false,
        }
    }
}

/// `n` bytes for a person: "2.3 MiB" (the free space [`StoreError::NoSpace`] reports).
fn human(n: u64) -> String {
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
    use super::human;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(2_411_724), "2.3 MiB");
        assert_eq!(human(8 * 1024 * 1024), "8.0 MiB");
    }
}

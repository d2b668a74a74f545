//! The one error type of the state crate. Messages are written for the operator reading
//! dipamd's startup log, since most of these stop the daemon.

use std::path::PathBuf;

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

    /// The store exists but cannot be read back consistently.
    #[error(
        "state store at {} is unreadable: {detail}; dipamd refuses to start rather than guess which \
         attachments exist (restore the directory from a backup, or, with dipamd stopped, rebuild \
         the ledger from the delegate's store with `dipamctl recover --state-dir DIR --conflist \
         FILE`, which moves the damaged ledger aside and keeps the DEL spool)",
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

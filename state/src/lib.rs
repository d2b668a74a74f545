//! dipamd's ledger: what was asked of the delegated IPAM plugin, what it answered, and who
//! owns each attachment.
//!
//! The crate has two layers:
//!
//! * [`Store`]: a tiny byte-level key/value interface (get, prefix scan, atomic multi-tree
//!   batch commit). [`open`] opens the real one, on sled (the type stays inside this crate);
//!   [`MemStore`] is an in-memory twin for unit tests of code above the store. sled is used
//!   only inside this crate and none of its types appear in the public API, so the engine can
//!   be swapped without touching the daemon.
//! * [`Ledger`]: typed attachment records ([`AttachmentRecord`] keyed by [`AttachmentKey`])
//!   stored as JSON in the [`Tree::Attachments`] tree, generic over any [`Store`].
//!
//! Every write path ends in [`Store::commit`], which returns only once the change is durable.
//! All calls block on disk I/O: call them from `spawn_blocking`, not directly on a tokio worker.

mod census;
mod chunks;
#[cfg(test)]
mod churn;
mod error;
mod journal;
mod ledger;
mod mem;
#[cfg(test)]
mod paged;
mod pending;
mod record;
mod schema;
mod sled_store;
mod snapshot;
mod space;
mod store;
#[cfg(test)]
mod streamed;

#[cfg(test)]
mod suite;

pub use census::{
    Counts as CensusCounts, Entry as CensusEntry, Group as CensusGroup, GroupKey, Held, Holder,
};
pub use error::StoreError;
pub use ledger::Ledger;
pub use mem::MemStore;
pub use record::{
    AttachmentKey, AttachmentRecord, AttachmentState, BootStamp, CriPod, DelegateKey, Owner,
};
pub use schema::{SCHEMA_KEY, SCHEMA_VERSION, ensure_schema};
pub use snapshot::read_copy;
pub use space::{OPEN_MARGIN, needed_to_open};
pub use store::{Batch, Durability, KeyValue, Store, Tree, Visit, VisitUntil};

/// Opens (creating if needed) the ledger's store in `dir`, on disk: checks its integrity and
/// schema version and migrates an older one. The one way dipamd and `dipamctl recover` get a
/// store; what backs it (sled, with dipam's commit journal) is this crate's business.
///
/// Errors: [`StoreError::Locked`] if another process has it open, [`StoreError::Corrupt`] if
/// it cannot be proven to hold every acknowledged commit, [`StoreError::SchemaTooNew`] if a
/// newer dipamd wrote it, [`StoreError::NoSpace`] if the file system lacks the room an open
/// needs.
pub fn open(dir: &std::path::Path) -> Result<impl Store, StoreError> {
    sled_store::SledStore::open(dir)
}

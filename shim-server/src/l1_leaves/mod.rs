//! The ground layer, leaves: facts and small mechanisms every layer may use (keys, clocks,
//! errors, events, locks, the caller's checks and quotas). Nothing here uses another layer.
//!
//! lib.rs lists the layers in order; `dipam-layers` fails on any edge up them
//! (docs/architecture.md §2).

pub mod access;
pub mod authority;
pub mod clock;
pub mod cri_args;
pub mod error;
pub mod events;
pub mod fault;
pub mod keylock;
pub mod keys;
// Every listener's connection budget and accept-time checks (access.rs and the transport
// below use it).
pub mod listen;
// The bounded label set of the attachments gauge (the core and the daemon's census).
pub mod metric_labels;
pub mod order;
// The record of dipamd's paths that the offline tools read (the daemon writes it).
pub mod paths_record;
pub mod perms;
pub mod privilege;
// What one non-root caller may take of dipamd (access.rs's admission uses it).
pub mod quota;
// What the memories of recent ADDs and DELs hold for a key (core/births.rs, tombstones.rs).
pub mod tag;
pub mod trim;
pub mod validate;

//! The core layer: an attachment's life (`core`), over the delegate (`delegate`) and the
//! ledger, and the addresses it hands out (`addrs`). It knows nothing of its clients.
//!
//! lib.rs lists the layers in order; `dipam-layers` fails on any edge up them
//! (docs/architecture.md §2).

pub mod addrs;
pub mod core;
pub mod delegate;

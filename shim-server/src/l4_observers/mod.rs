//! The observers layer: what is fed by the core's and the clients' events (the history, the
//! metrics and their listener).
//!
//! lib.rs lists the layers in order; `dipam-layers` fails on any edge up them
//! (docs/architecture.md §2).

pub mod history;
pub mod metrics;
pub mod metrics_listen;

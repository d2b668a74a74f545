//! The daemon layer: dipamd's flags, logging and start-up phases, over everything below.
//!
//! lib.rs lists the layers in order; `dipam-layers` fails on any edge up them
//! (docs/architecture.md §2).

pub mod daemon;
pub mod logging;
pub mod startup_checks;

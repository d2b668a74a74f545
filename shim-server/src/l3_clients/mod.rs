//! The clients layer: each a handle and its work on the core (the warm pool, the agent API,
//! the GC, the spool's replay, the teardown of retired veths, ...). A client uses the core
//! and the leaves, never another layer above.
//!
//! lib.rs lists the layers in order; `dipam-layers` fails on any edge up them
//! (docs/architecture.md §2).

pub mod adopt;
pub mod agent;
// DELs of containers held on another network only (a swapped conflist).
pub mod crossed;
pub mod divergence;
pub mod gc;
pub mod liveness;
pub mod pool;
pub mod sandboxes;
pub mod spool;
pub mod teardown;

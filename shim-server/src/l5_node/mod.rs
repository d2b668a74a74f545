//! The node layer: the node (the core and the clients' handles assembled), the RPCs on it
//! (one module per RPC), and the start-up replays through them.
//!
//! lib.rs lists the layers in order; `dipam-layers` fails on any edge up them
//! (docs/architecture.md §2).

pub mod hints;
pub mod node;
pub mod replay;
pub mod rpc;

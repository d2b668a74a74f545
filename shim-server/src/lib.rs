//! dipamd: the CNI-over-gRPC shim that runs the delegated IPAM plugin like a
//! runtime would and records every attachment in a durable ledger. See docs/cfp.md.

// The layers, from the ground up (docs/architecture.md §2), each a folder: `ls` lists them in
// this order. A module uses only modules of its own layer or of the layers above it in this
// list: `cargo run -p dipam-layers -- shim-server` reads each `// Layer NAME:` line below and
// fails on a cycle or on any edge up the layers. A path names its layer
// (`crate::l3_clients::gc`), so an edge up shows in review as it does in the check.

// Layer leaves: facts and small mechanisms every layer may use.
pub mod l1_leaves;

// Layer core: an attachment's life, over the delegate and the ledger.
pub mod l2_core;

// Layer clients: each a handle and its work on the core.
pub mod l3_clients;

// Layer observers: fed by events.
pub mod l4_observers;

// Layer node: the node (the core and the clients' handles assembled), the RPCs on it, and
// the start-up replays through them.
pub mod l5_node;

// Layer transport: the gRPC services, the socket and its activation, health.
pub mod l6_transport;

// Layer daemon: flags, logging and start-up phases.
pub mod l7_daemon;

// What the crate's unit tests share (docs/architecture.md §7).
#[cfg(test)]
pub(crate) mod testing;

/// Parses the command line of `T` with `version` as its `--version` (the binaries pass the
/// crate version and the git commit shim-server/build.rs found), exiting as clap does on
/// `--help`, `--version` or a usage error.
pub fn parse_args<T: clap::Parser>(version: &'static str) -> T {
    let matches = T::command().version(version).get_matches();
    T::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

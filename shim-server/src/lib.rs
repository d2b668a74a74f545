//! dipamd: the CNI-over-gRPC shim that runs the delegated IPAM plugin like a
//! runtime would and records every attachment in a durable ledger. See docs/cfp.md.

// The layers, from the ground up (docs/architecture.md §2), each a folder: `ls` lists them in
// this order. A module uses only modules of its own layer or of the layers above it in this
// list: `cargo run -p dipam-layers -- shim-server` reads each `// Layer NAME:` line below and
// fails on a cycle or on any edge up the layers. Each folder's modules are re-exported here
// under their own names (`crate::gc`, `dipam_shim::clock`): the folder says the layer, the
// path says the module.

// Layer leaves: facts and small mechanisms every layer may use.
mod l1_leaves;
pub use l1_leaves::{
    access, authority, clock, cri_args, error, events, fault, keylock, keys, listen, metric_labels,
    order, paths_record, perms, privilege, quota, trim, validate,
};

// Layer core: an attachment's life, over the delegate and the ledger.
mod l2_core;
pub use l2_core::{addrs, core, delegate};

// Layer clients: each a handle and its work on the core.
mod l3_clients;
pub use l3_clients::{
    adopt, agent, crossed, divergence, gc, liveness, pool, sandboxes, spool, teardown,
};

// Layer observers: fed by events.
mod l4_observers;
pub use l4_observers::{history, metrics, metrics_listen};

// Layer node: the node (the core and the clients' handles assembled), the RPCs on it, and
// the start-up replays through them.
mod l5_node;
pub use l5_node::{hints, node, replay, rpc};

// Layer transport: the gRPC services, the socket and its activation, health.
mod l6_transport;
pub use l6_transport::{activation, health, server, service};

// Layer daemon: flags, logging and start-up phases.
mod l7_daemon;
pub use l7_daemon::{daemon, logging, startup_checks};

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

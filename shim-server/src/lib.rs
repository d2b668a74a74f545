//! dipamd: the CNI-over-gRPC shim that runs the delegated IPAM plugin like a
//! runtime would and records every attachment in a durable ledger. See docs/cfp.md.

// The layers, from the ground up (docs/architecture.md §2). A module uses only modules of its
// own layer or of the layers above it in this list: `cargo run -p dipam-layers -- shim-server`
// reads each `// Layer NAME:` line below and fails on a cycle or on any edge up the layers.

// Layer leaves: facts and small mechanisms every layer may use.
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
pub mod trim;
pub mod validate;

// Layer core: an attachment's life, over the delegate and the ledger.
pub mod addrs;
pub mod core;
pub mod delegate;

// Layer clients: each a handle and its work on the core.
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

// Layer observers: fed by events.
pub mod history;
pub mod metrics;
pub mod metrics_listen;

// Layer node: the node (the core and the clients' handles assembled), the RPCs on it, and
// the start-up replays through them.
pub mod hints;
pub mod node;
pub mod replay;
pub mod rpc;

// Layer transport: the gRPC services, the socket and its activation, health.
pub mod activation;
pub mod health;
pub mod server;
pub mod service;

// Layer daemon: flags, logging and start-up phases.
pub mod daemon;
pub mod logging;
pub mod startup_checks;

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

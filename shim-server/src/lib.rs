//! dipamd and dipamctl: the CNI-over-gRPC shim that runs the delegated IPAM plugin like a
//! runtime would and records every attachment in a durable ledger. See docs/cfp.md.

pub mod access;
pub mod activation;
pub mod addrs;
pub mod adopt;
pub mod agent;
pub mod authority;
pub mod clock;
pub mod core;
pub mod cri_args;
pub mod ctl;
pub mod daemon;
pub mod delegate;
pub mod divergence;
pub mod error;
pub mod events;
pub mod fault;
pub mod gc;
pub mod health;
pub mod hints;
pub mod history;
pub mod keylock;
pub mod keys;
pub mod listen;
pub mod liveness;
pub mod logging;
pub mod metric_labels;
pub mod metrics;
pub mod node;
pub mod order;
pub mod perms;
pub mod pool;
pub mod privilege;
pub mod replay;
pub mod rpc;
pub mod sandboxes;
pub mod server;
pub mod service;

pub mod spool;
pub mod startup_checks;
pub mod teardown;
#[cfg(test)]
pub(crate) mod testing;
pub mod trim;
pub mod validate;

/// Parses the command line of `T` with `version` as its `--version` (the binaries pass the
/// crate version and the git commit shim-server/build.rs found), exiting as clap does on
/// `--help`, `--version` or a usage error.
pub fn parse_args<T: clap::Parser>(version: &'static str) -> T {
    let matches = T::command().version(version).get_matches();
    T::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

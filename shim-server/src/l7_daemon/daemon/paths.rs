//! The record of this dipamd's paths (paths_record.rs), left beside the socket and in the
//! state directory for the tools that run while dipamd is down.

use std::path::{Path, PathBuf};

use tracing::warn;

use super::Args;
use crate::l1_leaves::paths_record::Record;

/// What this dipamd runs with: its flags after their defaults, `spool_dir` as published.
pub(super) fn record(args: &Args, spool_dir: &Path) -> Record {
    describe(
        args,
        spool_dir,
        std::process::id(),
        crate::l1_leaves::clock::now_ms(),
    )
}

/// The record of a dipamd started with `args` (`pid`, at `started_at_ms`): also how
/// `dipamctl` reads a dipamd's paths from its command line or its unit when it left no record.
pub fn describe(args: &Args, spool_dir: &Path, pid: u32, started_at_ms: u64) -> Record {
    Record {
        format: crate::l1_leaves::paths_record::FORMAT,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        pid,
        started_at_ms,
        socket: absolute(&args.socket),
        users_socket: args.users_socket.as_deref().map(absolute),
        state_dir: absolute(&args.state_dir),
        spool_dir: absolute(spool_dir),
        exec_dir: absolute(&crate::l2_core::delegate::survivors::dir_in(
            &args.state_dir,
        )),
        cni_path: args.cni_path.clone(),
        conflist: args.conflist.as_deref().map(absolute),
        conf_dir: args.conf_dir.as_deref().map(absolute),
        network: args.network.clone(),
        metrics_address: args.metrics_address.map(|a| a.to_string()),
        metrics_socket: args.metrics_socket.as_deref().map(absolute),
        cri_endpoint: args.cri_endpoint.clone().filter(|e| !e.trim().is_empty()),
    }
}

/// A relative flag made absolute against dipamd's working directory: a tool reading the
/// record runs elsewhere.
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_owned())
}

/// Writes `record` as `path` with `mode`, off the async workers. A record that cannot be
/// written costs the offline tools their guide, never the node its IPAM: warned, not fatal.
pub(super) async fn leave(path: PathBuf, record: Record, mode: u32) {
    let shown = path.clone();
    let written = tokio::task::spawn_blocking(move || {
        crate::l1_leaves::paths_record::write(&path, &record, mode)
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))
    .and_then(|r| r);
    if let Err(e) = written {
        warn!(path = %shown.display(), error = %e, "cannot leave the record of dipamd's paths; with dipamd down, dipamctl doctor, support-bundle and recover will assume the default paths");
    }
}

//! The replays: work that was left for dipamd to finish, done through the same paths a
//! request takes. At start, before the socket is served, every record of root's a crash left
//! `adding` or `deleting` is released (interrupted.rs; a non-root caller's, after the bind)
//! and every DEL the plugin spooled while
//! dipamd was down is replayed through the DEL RPC (spool.rs); the spool is drained again on
//! a tick while dipamd serves. Before both, the pods of an earlier boot are freed
//! (reboot.rs). They sit above the RPCs they replay through.

pub mod interrupted;
pub mod reboot;
pub mod spool;

//! Start-up replay: every record left in `adding` or `deleting` by a crash is released
//! through the delegate and dropped. An ADD that was never answered is undone (the runtime
//! saw an error and will not use it); an unfinished DEL is finished.
//!
//! Root's records are replayed before the socket is served, one at a time, as the crash
//! argument of docs/cfp.md §8.2 has it: the first requests, the warm pool's start and the
//! first reconcile with the delegate's store then see a ledger with nothing half done. A
//! non-root caller's records (§8.3) are replayed after the bind, a few at a time, each under
//! its uid's slots: they decide nothing for root's pods (their scope is judged apart), and a
//! caller that held its delegate's lock left records whose release waits out
//! `--delegate-timeout` each; replayed before the bind, 4 of them once held the socket closed
//! for 40 s, and a few hundred would have kept pod networking down for an hour. Until one is
//! replayed its key's lock and its record are where they were: the caller's own DEL of it
//! waits for, or does, the same release.

use std::{sync::Arc, time::Duration};

use dipam_state::{AttachmentRecord, AttachmentState};
use tracing::{info, warn};

use crate::{l1_leaves::error::ShimError, l5_node::node::Node};

/// Non-root records replayed at once after the bind (and never more than the non-root share
/// of the admission slots, quota.rs).
pub const PARALLEL: usize = 4;

/// What the replay did, for logs and status.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Replay {
    pub released: usize,
    pub failed: usize,
}

impl Replay {
    fn add(&mut self, released: bool) {
        if released {
            self.released += 1;
        } else {
            self.failed += 1;
        }
    }
}

/// The interrupted records, root's (and dipamd's own) or non-root callers'.
async fn interrupted(node: &Node, root: bool) -> Result<Vec<AttachmentRecord>, ShimError> {
    // From the census: the few records not committed, not every record (census.rs).
    node.core
        .ledger(move |l| {
            l.select(|e| e.state != AttachmentState::Committed && e.creator_uid.is_none() == root)
        })
        .await
}

/// Releases one interrupted record under its key's lock; whether it was released.
async fn release(node: &Node, rec: &AttachmentRecord) -> Result<bool, ShimError> {
    let _guard = node.core.locks.lock(&rec.key).await;
    // Taken again under the lock: the caller's own DEL may have finished it meanwhile.
    let rec = match node.core.lookup(&rec.key)? {
        Some(now) if now.state != AttachmentState::Committed => now,
        _ => return Ok(true),
    };
    let rec = &rec;
    match node.core.release_recorded(rec).await {
        Ok(()) => {
            node.core.forget(rec).await?;
            // An interrupted DEL, finished: the runtime's DEL freed it. (An interrupted ADD
            // was never answered, so no pod held what its rollback frees.)
            if rec.state == AttachmentState::Deleting {
                node.core.events.freed(
                    crate::l1_leaves::events::FreedBy::Del,
                    &crate::l1_leaves::events::Freeing::of(
                        rec,
                        "its DEL was interrupted (dipamd stopped); finished at dipamd's start",
                    ),
                );
            }
            node.core
                .events
                .emit(crate::l1_leaves::events::Event::IntentReplayed);
            info!(key = %rec.key, state = rec.state.as_str(), creator_uid = ?rec.creator_uid, "replayed an interrupted operation: released");
            Ok(true)
        }
        Err(e) => {
            // Kept: the next DEL for this key, or the next start, tries again.
            warn!(key = %rec.key, state = rec.state.as_str(), creator_uid = ?rec.creator_uid, error = %e, "could not release an interrupted operation; will retry");
            Ok(false)
        }
    }
}

/// Root's interrupted records, before the socket is served.
pub async fn replay(node: &Node) -> Result<Replay, ShimError> {
    let mut out = Replay::default();
    for rec in interrupted(node, true).await? {
        out.add(release(node, &rec).await?);
    }
    Ok(out)
}

/// Non-root callers' interrupted records, while dipamd serves: [`PARALLEL`] at a time, each
/// holding one of its uid's slots so that, with the caller's live requests, it never takes
/// more than the caller's share.
pub async fn replay_non_root(node: Arc<Node>) -> Result<Replay, ShimError> {
    let records = interrupted(&node, false).await?;
    if records.is_empty() {
        return Ok(Replay::default());
    }
    let started = std::time::Instant::now();
    let total = records.len();
    let gate = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut tasks = tokio::task::JoinSet::new();
    for rec in records {
        let (node, gate) = (Arc::clone(&node), Arc::clone(&gate));
        tasks.spawn(async move {
            let _one = gate.acquire_owned().await.ok()?;
            let uid = rec.creator_uid.unwrap_or(u32::MAX);
            // However long the caller's own requests hold its slots: this is no request.
            let _slot = node
                .admission
                .quotas
                .slot(uid, Duration::from_secs(3600))
                .await
                .ok()?;
            release(&node, &rec).await.ok()
        });
    }
    let mut out = Replay::default();
    while let Some(done) = tasks.join_next().await {
        out.add(matches!(done, Ok(Some(true))));
    }
    info!(
        records = total,
        released = out.released,
        failed = out.failed,
        took_ms = crate::l1_leaves::clock::log_ms(started.elapsed()),
        "non-root callers' interrupted operations replayed while serving"
    );
    Ok(out)
}

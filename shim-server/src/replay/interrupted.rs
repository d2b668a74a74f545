//! Start-up replay, before the socket is served: every record left in `adding` or `deleting`
//! by a crash is released through the delegate and dropped. An ADD that was never answered is
//! undone (the runtime saw an error and will not use it); an unfinished DEL is finished.

use dipam_state::AttachmentState;
use tracing::{info, warn};

use crate::{error::ShimError, node::Node};

/// What the replay did, for logs and status.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Replay {
    pub released: usize,
    pub failed: usize,
}

pub async fn replay(node: &Node) -> Result<Replay, ShimError> {
    let records = node.core.ledger(|l| l.list(None)).await?;
    let mut out = Replay::default();
    for rec in records
        .into_iter()
        .filter(|r| r.state != AttachmentState::Committed)
    {
        let _guard = node.core.locks.lock(&rec.key).await;
        match node.core.release_recorded(&rec).await {
            Ok(()) => {
                node.core.forget(&rec).await?;
                node.core.events.emit(crate::events::Event::IntentReplayed);
                info!(key = %rec.key, state = rec.state.as_str(), "replayed an interrupted operation: released");
                out.released += 1;
            }
            Err(e) => {
                // Kept: the next DEL for this key, or the next start, tries again.
                warn!(key = %rec.key, state = rec.state.as_str(), error = %e, "could not release an interrupted operation; will retry");
                out.failed += 1;
            }
        }
    }
    Ok(out)
}

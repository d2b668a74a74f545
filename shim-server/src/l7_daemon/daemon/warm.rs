//! What dipamd reads or asks once before it serves, so that no request has to.

use crate::l5_node::node::Node;

use super::DaemonError;

/// Reads the whole ledger once before anything changes it, so that no request has to: the
/// ledger's census (record counts, quotas and container IDs, kept by every commit from here
/// on) and the address index are built from it, and the metrics' gauge gets the attachments
/// by owner and network (from here on every record and release reports its own change).
pub async fn census(node: &Node) -> Result<(), DaemonError> {
    let by = node.core.index_ledger().await?;
    if !node.core.events.listened() {
        return Ok(());
    }
    for ((owner, network), count) in &by {
        node.core
            .events
            .emit(crate::l1_leaves::events::Event::Attachments {
                network,
                owner,
                count: *count,
            });
    }
    Ok(())
}

/// Asks every delegate the ledger records (one per group of records, census.rs) for its
/// VERSION, so that the first STATUS after a start finds the answer cached instead of
/// exec'ing it on the kubelet's poll: that exec was the STATUS handler's p99 (docs/
/// performance.md, run 29). A delegate that does not answer is asked again by the request
/// that needs it, as before. Root's records only: a non-root caller's delegate runs only
/// for that caller's own requests, from the directories it may use (docs/cfp.md §8.3).
pub async fn probe_delegates(node: &Node) {
    let Ok(groups) = node.core.ledger(|l| l.groups()).await else {
        return;
    };
    let mut asked = std::collections::HashSet::new();
    for (key, _, rec) in groups {
        if key.creator_uid.is_none()
            && asked.insert((rec.delegate_type.clone(), rec.cni_path.clone()))
        {
            let _ = node
                .core
                .exec
                .probe(&rec.delegate_type, &rec.cni_path)
                .await;
        }
    }
}

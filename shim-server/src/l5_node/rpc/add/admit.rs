//! ADD's one admission step: every check of who calls and what it asks, in the order they
//! refuse, before the ADD takes anything. The rules themselves stay where they are shared
//! (validation in core's `prepare`, the reserved container IDs in keys/, another caller's
//! container ID in access.rs, the quotas in quota.rs, the refused networks in
//! divergence/); this module is the only place the ADD meets them, as gc/admit.rs is for a GC. It ends holding what the ADD holds until it
//! answers: the key's lock, the birth stamp, and a non-root caller's quota share.

use dipam_proto::v1::CniRequest;

use crate::{
    l1_leaves::access::Caller,
    l1_leaves::error::ShimError,
    l1_leaves::keylock::KeyGuard,
    l1_leaves::quota::{Quotas, Reservation},
    l2_core::core::{Prepared, attach::Early, births::StampOnDrop},
    l5_node::node::Node,
};

/// An ADD let in: its request, prepared, and what it holds until it answers.
pub(super) struct Admitted<'a> {
    pub p: Prepared,
    // Fields drop in this order: the quota share, then the birth stamp, last the key's lock
    // (the stamp is the ADD's last act under it).
    _quota: Option<Reservation>,
    _born: StampOnDrop<'a>,
    _guard: KeyGuard<'a>,
}

/// Admits a runtime's ADD from `caller`, or refuses it with the error that names why.
pub(super) async fn admit<'a>(
    node: &'a Node,
    caller: Caller,
    req: CniRequest,
    early: &Early,
) -> Result<Admitted<'a>, ShimError> {
    let p = node.prepare(req, true, caller)?;
    crate::l1_leaves::keys::refuse_runtime("ADD", &p.req.container_id)?;
    if let Some(why) = node.misconfigured(&p.dc.network, p.caller.recorded_uid()) {
        return Err(ShimError::Misconfigured {
            network: p.dc.network.clone(),
            why,
        });
    }
    let guard = node.core.locks.lock(&p.key).await;
    // Nothing is done yet: a requester that left while this ADD waited its turn gets nothing.
    if early.requester_left() {
        return Err(ShimError::RequesterLeft {
            key: p.key.to_string(),
            released: false,
        });
    }
    // The ADD's birth, stamped again as its last act under the key's lock, whatever it
    // answers: a GC that began before it never frees what it made (core/births.rs), whether
    // from the pool, the delegate or the ledger (a repeat).
    let born = node.core.births.stamp_on_drop(&p.key);
    // A non-root caller's ADD, on the ledger: its container ID must be no other caller's
    // (access.rs), then its share of the records and bytes is reserved (quota.rs). Both read
    // the ledger's census (dipam_state's census.rs), which dipamd builds at start and every
    // commit keeps: they hold across restarts, and the ADD reads a few entries in memory
    // instead of every record (a scan of 2,500 records on every non-root ADD before,
    // docs/performance.md).
    let quota = if p.caller.is_root() {
        None
    } else {
        let estimate = Quotas::record_estimate(&p.req);
        Some(node.core.ledger.census(|c| {
            p.caller
                .refuse_foreign_container_id(&p.req.container_id, &p.key, c)?;
            node.admission
                .quotas
                .reserve(p.caller.uid, &p.key, estimate, c)
        })??)
    };
    Ok(Admitted {
        p,
        _quota: quota,
        _born: born,
        _guard: guard,
    })
}

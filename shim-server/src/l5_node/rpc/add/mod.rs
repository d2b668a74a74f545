//! ADD, top to bottom: its admission (admit.rs: every check of the caller and its request,
//! ending under the key's lock with the caller's quota share), then serve it from the warm
//! pool or run the core's ADD flow (core/attach.rs: intent, delegate, commit, rollback),
//! and roll it back when its requester left before the answer (core/attach.rs too).

mod admit;

use dipam_proto::v1::CniRequest;
use dipam_state::Owner;

use crate::{
    l1_leaves::access::Caller,
    l1_leaves::error::ShimError,
    l2_core::core::{
        Prepared,
        attach::{Added, Early, attach, roll_back_unanswered},
    },
    l5_node::node::Node,
};

/// A runtime's ADD, from `caller`; `early` is the AddEarly stream's sender, if it is one.
pub async fn run(
    node: &Node,
    caller: Caller,
    req: CniRequest,
    early: &mut Early,
) -> Result<Added, ShimError> {
    // Held until the ADD ends: the key's lock, the birth stamp, the quota share.
    let admitted = admit::admit(node, caller, req, early).await?;
    let p = &admitted.p;
    // With the warm pool on: one commit hands a ready entry to the pod, no delegate exec.
    let added = match crate::l3_clients::pool::take::take(&node.core, &node.pool, p, early).await? {
        Some(result) => Added {
            result,
            replayed: false,
        },
        None => attach_or_rescue(node, p, early).await?,
    };
    if !added.replayed && early.requester_left() && !early.offered() {
        return Err(roll_back_unanswered(&node.core, p).await);
    }
    Ok(added)
}

/// How often an ADD the delegate refused is tried again while the warm pool is on.
const RETRIES: u32 = 2;

/// The core's ADD flow. When the delegate hands out an address a dead pod's record holds,
/// that record goes and the ADD is served once more; when the delegate refuses (its range
/// exhausted, while the pool holds what is left), the pool never starves a pod (pool/take.rs,
/// `rescue`).
async fn attach_or_rescue(
    node: &Node,
    p: &Prepared,
    early: &mut Early,
) -> Result<Added, ShimError> {
    // The next address may be another dead pod's: at most this many of them per ADD.
    const DEAD_HOLDERS: usize = 8;
    let (mut tries, mut freed) = (0, 0);
    loop {
        let e = match attach(&node.core, p, Owner::Pod, early).await {
            Ok(added) => return Ok(added),
            Err(e) => e,
        };
        // A pod's record holds the address the delegate handed out (its state went with a
        // reboot, or was wiped): when that pod is provably dead, its record goes and the ADD
        // is served once more (gc/evidence/mod.rs), instead of failing a pod for a dead one.
        if let ShimError::Conflict { ip, .. } = &e
            && freed < DEAD_HOLDERS
            && crate::l3_clients::gc::evidence::free_dead_holder(
                &node.collector(),
                &p.key.network,
                ip,
                &p.key,
            )
            .await
            .unwrap_or(false)
        {
            freed += 1;
            continue;
        }
        if let Some(result) =
            crate::l3_clients::pool::take::rescue(&node.core, &node.pool, p, &e, early).await?
        {
            return Ok(Added {
                result,
                replayed: false,
            });
        }
        // Nothing pooled, nothing being made: an address the refiller was about to take, or
        // a pod's DEL just freed, may be in the delegate again. Once more, with the pool on.
        tries += 1;
        if tries > RETRIES || !node.pool.on() || !matches!(e, ShimError::Delegate(_)) {
            return Err(e);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

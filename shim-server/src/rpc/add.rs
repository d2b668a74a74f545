//! ADD, top to bottom: validate the request for its caller, refuse what this caller or this
//! network may not have, take the key's lock, then serve it from the warm pool or run the
//! core's ADD flow (core/attach.rs: intent, delegate, commit, rollback).

use dipam_proto::v1::CniRequest;
use dipam_state::Owner;
use tracing::warn;

use crate::{
    access::Caller,
    core::{
        Prepared,
        attach::{Added, Early, attach},
    },
    error::ShimError,
    node::Node,
};

/// A runtime's ADD, from `caller`; `early` is the AddEarly stream's sender, if it is one.
pub async fn run(
    node: &Node,
    caller: Caller,
    req: CniRequest,
    early: &mut Early,
) -> Result<Added, ShimError> {
    let p = node.prepare(req, true, caller)?;
    crate::keys::refuse_runtime("ADD", &p.req.container_id)?;
    if let Some(why) = node.misconfigured(&p.dc.network, p.caller.recorded_uid()) {
        return Err(ShimError::Misconfigured {
            network: p.dc.network.clone(),
            why,
        });
    }
    let _guard = node.core.locks.lock(&p.key).await;
    // The ADD's birth, stamped again as its last act under the key's lock (dropped before
    // `_guard`), whatever it answers: a GC that began before it never frees what it made
    // (core/births.rs), whether from the pool, the delegate or the ledger (a repeat).
    let _born = node.core.births.stamp_on_drop(&p.key);
    // Held until the ADD ends: its share of the caller's record and byte quotas.
    let _quota = if p.caller.is_root() {
        None
    } else {
        Some(non_root_checks(node, &p).await?)
    };
    // With the warm pool on: one commit hands a ready entry to the pod, no delegate exec.
    if let Some(result) = crate::pool::take::take(&node.core, &node.pool, &p, early).await? {
        return Ok(Added {
            result,
            replayed: false,
        });
    }
    // The delegate may hand out an address a pod's record holds (its state went with a
    // reboot, or was wiped): when that pod is provably dead, its record goes and the ADD is
    // served once more (gc/evidence.rs), instead of failing a pod for a dead one. The next
    // address may be another dead pod's: at most DEAD_HOLDERS of them per ADD.
    const DEAD_HOLDERS: usize = 8;
    let mut freed = 0;
    loop {
        match attach(&node.core, &p, Owner::Pod, early).await {
            Err(ShimError::Conflict { ip, .. })
                if freed < DEAD_HOLDERS
                    && crate::gc::evidence::free_dead_holder(
                        &node.collector(),
                        &p.key.network,
                        &ip,
                        &p.key,
                    )
                    .await
                    .unwrap_or(false) =>
            {
                freed += 1;
            }
            other => return other,
        }
    }
}

/// What a non-root caller's ADD must pass on the ledger, from one scan of it: the container
/// ID rule below, then the caller's record and byte quotas (quota.rs), counted from the
/// ledger itself so that they hold across restarts. Scanned again if one of the caller's
/// ADDs ended meanwhile (its record was not counted by its estimate any more).
async fn non_root_checks(
    node: &Node,
    p: &Prepared,
) -> Result<crate::quota::Reservation, ShimError> {
    use crate::quota::NotReserved;
    let quotas = &node.admission.quotas;
    let uid = p.caller.uid;
    let r = &p.req;
    // What its record will hold, about: the config and the CNI values it keeps.
    let estimate = (r.stdin.len()
        + r.netns.len()
        + r.cni_args.len()
        + r.cni_path.len()
        + r.container_id.len()
        + r.ifname.len()
        + 1024) as u64;
    for _ in 0..8 {
        let generation = quotas.generation(uid);
        let all = node.core.ledger(|l| l.list(None)).await?;
        refuse_foreign_container_id(p, &all)?;
        match quotas.reserve(uid, &p.key, estimate, &all, generation) {
            Ok(held) => return Ok(held),
            Err(NotReserved::Stale) => continue,
            Err(NotReserved::Refused(e)) => return Err(e),
        }
    }
    Err(ShimError::Busy(format!(
        "uid {uid}'s ADDs kept ending while this one was counted"
    )))
}

/// Refuses a non-root caller's ADD under a container ID that another caller's attachment
/// uses, in any network. Delegates release by container ID (host-local frees every
/// reservation of that ID and ifname in its directory, azure-vnet-ipam keys by the ID
/// alone), and the caller chooses the delegate's config: its own attachment under a root
/// pod's ID, DELed with a config pointing at that pod's store, would free the pod's address.
/// Container IDs are not secret (`ps` shows them), so this is checked, not assumed.
fn refuse_foreign_container_id(
    p: &Prepared,
    all: &[dipam_state::AttachmentRecord],
) -> Result<(), ShimError> {
    let cid = &p.req.container_id;
    let mut others = all
        .iter()
        .filter(|r| r.key.container_id == *cid || r.delegate_ids().0 == cid);
    match others.find(|r| !p.caller.owns(r.creator_uid)) {
        None => Ok(()),
        Some(r) => {
            warn!(uid = p.caller.uid, key = %p.key, other = %r.key, "refused: container ID in use by another caller");
            Err(ShimError::Forbidden {
                msg: format!(
                    "uid {} may not ADD under container ID {}: another caller's attachment \
                     uses it",
                    p.caller.uid,
                    crate::validate::shown(&p.req.container_id)
                ),
                details: "a non-root caller's container IDs must not be another caller's; \
                          nothing was allocated"
                    .into(),
            })
        }
    }
}

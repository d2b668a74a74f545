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
    // Nothing is done yet: a requester that left while this ADD waited its turn gets nothing.
    if early.requester_left() {
        return Err(ShimError::RequesterLeft {
            key: p.key.to_string(),
            released: false,
        });
    }
    // The ADD's birth, stamped again as its last act under the key's lock (dropped before
    // `_guard`), whatever it answers: a GC that began before it never frees what it made
    // (core/births.rs), whether from the pool, the delegate or the ledger (a repeat).
    let _born = node.core.births.stamp_on_drop(&p.key);
    // Held until the ADD ends: its share of the caller's record and byte quotas.
    let _quota = if p.caller.is_root() {
        None
    } else {
        Some(non_root_checks(node, &p)?)
    };
    // With the warm pool on: one commit hands a ready entry to the pod, no delegate exec.
    let added = match crate::pool::take::take(&node.core, &node.pool, &p, early).await? {
        Some(result) => Added {
            result,
            replayed: false,
        },
        None => attach_or_rescue(node, &p, early).await?,
    };
    if !added.replayed && early.requester_left() && !early.offered() {
        return Err(roll_back_unanswered(node, &p).await);
    }
    Ok(added)
}

/// Releases what a fresh ADD committed for a requester that left before its answer (its
/// plugin killed mid-ADD, or its runtime's timeout passed). No one got the result, so no pod
/// uses it, and a runtime that never DELs (its own caller gone too) would leak it. Under the
/// key's lock, through [`crate::core::Core::release`]: marked `deleting` durably, released by
/// the delegate, forgotten, so that a dipamd killed at any point finishes it at its next
/// start, and a runtime's DEL meanwhile finds the record. An AddEarly result already offered
/// is left for the runtime's DEL: the plugin may have wired the pod with it.
async fn roll_back_unanswered(node: &Node, p: &Prepared) -> ShimError {
    let key = p.key.to_string();
    let released = match node.core.lookup(&p.key) {
        Ok(Some(rec)) => match node.core.release(&rec).await {
            Ok(()) => true,
            Err(e) => {
                warn!(%key, error = %e, "could not release the ADD of a plugin that left; its record stays for the runtime's DEL, GC or the next start");
                false
            }
        },
        Ok(None) => true,
        Err(e) => {
            warn!(%key, error = %e, "could not read the ADD of a plugin that left");
            false
        }
    };
    if released {
        warn!(%key, "the plugin left before its ADD was answered; released what the ADD allocated");
    }
    ShimError::RequesterLeft { key, released }
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
        // is served once more (gc/evidence.rs), instead of failing a pod for a dead one.
        if let ShimError::Conflict { ip, .. } = &e
            && freed < DEAD_HOLDERS
            && crate::gc::evidence::free_dead_holder(&node.collector(), &p.key.network, ip, &p.key)
                .await
                .unwrap_or(false)
        {
            freed += 1;
            continue;
        }
        if let Some(result) =
            crate::pool::take::rescue(&node.core, &node.pool, p, &e, early).await?
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

/// What a non-root caller's ADD must pass on the ledger: the container ID rule below, then
/// the caller's record and byte quotas (quota.rs). Both are read from the ledger's census
/// (dipam_state's census.rs), which dipamd builds at start and every commit keeps: they hold
/// across restarts, and the ADD reads a few entries instead of every record (a scan of 2,500
/// records on every non-root ADD before, docs/performance.md).
fn non_root_checks(node: &Node, p: &Prepared) -> Result<crate::quota::Reservation, ShimError> {
    let quotas = &node.admission.quotas;
    let r = &p.req;
    // What its record will hold, about: the config and the CNI values it keeps.
    let estimate = (r.stdin.len()
        + r.netns.len()
        + r.cni_args.len()
        + r.cni_path.len()
        + r.container_id.len()
        + r.ifname.len()
        + 1024) as u64;
    // No disk read: the census is in memory (built before dipamd serves).
    node.core.ledger.census(|c| {
        refuse_foreign_container_id(p, c)?;
        quotas.reserve(p.caller.uid, &p.key, estimate, c)
    })?
}

/// Refuses a non-root caller's ADD under a container ID that another caller's attachment
/// uses, in any network. Delegates release by container ID (host-local frees every
/// reservation of that ID and ifname in its directory, azure-vnet-ipam keys by the ID
/// alone), and the caller chooses the delegate's config: its own attachment under a root
/// pod's ID, DELed with a config pointing at that pod's store, would free the pod's address.
/// Container IDs are not secret (`ps` shows them), so this is checked, not assumed.
fn refuse_foreign_container_id(
    p: &Prepared,
    census: &dipam_state::CensusCounts,
) -> Result<(), ShimError> {
    let mut others = census.using_container_id(&p.req.container_id);
    match others.find(|(_, creator)| !p.caller.owns(*creator)) {
        None => Ok(()),
        Some((other, _)) => {
            warn!(uid = p.caller.uid, key = %p.key, %other, "refused: container ID in use by another caller");
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

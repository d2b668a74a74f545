//! A pod's ADD served from the warm pool in one commit, and the redirection of a pooled
//! pod's DEL and CHECK to the key the delegate knows it by.

use std::sync::atomic::Ordering;

use dipam_state::{AttachmentRecord, AttachmentState, DelegateKey, Durability, Owner};
use serde_json::Value;
use tracing::{info, warn};

use super::*;
use crate::{
    l1_leaves::clock::now,
    l1_leaves::error::ShimError,
    l2_core::core::attach::Early,
    l2_core::core::{Core, Prepared},
    l2_core::delegate::{config::result_ips, version},
};

/// A pod's ADD from the pool, if it can be served from it; `None` sends the request down the
/// normal path. The caller holds the pod key's lock.
pub async fn take(
    core: &Core,
    pool: &Pool,
    p: &Prepared,
    early: &mut Early,
) -> Result<Option<Vec<u8>>, ShimError> {
    let Some(digest) = eligible(core, pool, p) else {
        return Ok(None);
    };
    pool.note_demand(&p.key.network);
    let served = take_entry(core, pool, p, &digest, early).await?;
    if served.is_none() {
        // The normal path also handles a key that has a record (repeated, interrupted).
        pool.misses.fetch_add(1, Ordering::Relaxed);
        pool.count(&p.key.network, &digest, false);
        core.events
            .emit(crate::l1_leaves::events::Event::PoolRequest { outcome: "miss" });
        pool.wake.notify_one();
    }
    Ok(served)
}

/// The pool digest of a request the pool may serve; `None` for the normal path.
fn eligible(core: &Core, pool: &Pool, p: &Prepared) -> Option<String> {
    // Root's pods only: a non-root caller's config must not become the template dipamd
    // fills the network's pool with, as root, in the background (docs/cfp.md, "Threat
    // model"); its ADDs take the normal path, recorded under its uid.
    if !pool.on() || !p.caller.is_root() {
        return None;
    }
    let digest = pool_digest(&p.dc);
    pool.observe(p, &digest);
    if wants_own_ips(p) {
        pool.bypassed.fetch_add(1, Ordering::Relaxed);
        core.events
            .emit(crate::l1_leaves::events::Event::PoolRequest { outcome: "bypass" });
        return None;
    }
    // A stale ADD is refused, a repeated one answered from the ledger and an interrupted one
    // finished: all by the normal path (the refusal is the core's, Core::refuse_stale).
    core.refuse_stale(p).ok()?;
    Some(digest)
}

/// How long an ADD the delegate refused waits for an entry being made.
const RESCUE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A pod's ADD the delegate refused (its normal path ran and rolled back): served from the
/// pool if it holds an entry for it, or will once an entry being made is committed. A pool
/// never starves a pod: the refiller may have taken the range's last addresses between this
/// ADD's miss and its delegate call (docs/cfp.md §7.7, "Never starving a pod"). The caller
/// holds the pod key's lock.
pub async fn rescue(
    core: &Core,
    pool: &Pool,
    p: &Prepared,
    refused: &ShimError,
    early: &mut Early,
) -> Result<Option<Vec<u8>>, ShimError> {
    // Only a delegate's refusal; and a request for its own addresses was counted as a
    // bypass by its take already.
    if !matches!(refused, ShimError::Delegate(_)) || wants_own_ips(p) {
        return Ok(None);
    }
    let Some(digest) = eligible(core, pool, p) else {
        return Ok(None);
    };
    let deadline = tokio::time::Instant::now() + RESCUE_WAIT;
    loop {
        // Registered before the look, so a fill that ends in between still wakes this.
        let filled = pool.filled.notified();
        tokio::pin!(filled);
        filled.as_mut().enable();
        if let Some(served) = take_entry(core, pool, p, &digest, early).await? {
            pool.lock()
                .sizing
                .entry(p.key.network.clone())
                .or_default()
                .rescues += 1;
            info!(key = %p.key, error = %refused, "the delegate refused this ADD; served from the warm pool");
            return Ok(Some(served));
        }
        if !pool.filling(&p.key.network) {
            return Ok(None);
        }
        if tokio::time::timeout_at(deadline, filled).await.is_err() {
            return Ok(None);
        }
    }
}

/// Serves the pod from the oldest ready entry of (network, `digest`); `None` when there is
/// none.
async fn take_entry(
    core: &Core,
    pool: &Pool,
    p: &Prepared,
    digest: &str,
    early: &mut Early,
) -> Result<Option<Vec<u8>>, ShimError> {
    loop {
        let Some(entry) = pool.claim(&p.key.network, digest) else {
            return Ok(None);
        };
        let Some(result) = entry.result.clone() else {
            warn!(entry = %entry.key, "warm pool: an entry without a result; releasing it");
            pool.lock().doomed.push(entry.key);
            continue;
        };
        let rec = pod_record(p, &entry, &result);
        // An entry whose address the agent holds must never reach a pod: release it instead.
        if core.check_conflict(&rec).await.is_err() {
            pool.lock().doomed.push(entry.key);
            pool.wake.notify_one();
            core.recheck_owners();
            continue;
        }
        let parsed = serde_json::from_value(result.clone())
            .map_err(|e| ShimError::Internal(format!("recorded result of {}: {e}", entry.key)))?;
        let rendered = version::render(p.dc.version, parsed)?;
        // One trip to the blocking pool: the pod's key must have no record (else the normal
        // path answers), the entry must still be in the ledger exactly as the pool knows it,
        // and then the one commit. A main-mode plugin (AddEarly) gets the result between the
        // checks and the commit, to wire the pod while it runs (core/attach.rs, `Early`).
        let (commit, expected) = (rec.clone(), entry.clone());
        let (mut tx, answer) = (early.take(), rendered.clone());
        let outcome = core
            .ledger(move |l| {
                if l.get(&commit.key)?.is_some() {
                    return Ok((Take::KeyTaken, tx));
                }
                if l.get(&expected.key)?.as_ref() != Some(&expected) {
                    return Ok((Take::EntryChanged, tx));
                }
                if let Some(tx) = tx.take() {
                    let _ = tx.send(answer);
                }
                // In the kernel is enough (Durability::SurvivesProcessCrash): a power cut that loses the take
                // gives the entry back to the pool, and the pod died with the node.
                l.put_removing(&commit, &expected.key, Durability::SurvivesProcessCrash)?;
                Ok((Take::Done, None))
            })
            .await;
        match outcome {
            Ok((Take::Done, _)) => {}
            Ok((Take::KeyTaken, unused)) => {
                early.restore(unused);
                pool.unclaim(digest, entry);
                return Ok(None);
            }
            Ok((Take::EntryChanged, unused)) => {
                early.restore(unused);
                warn!(entry = %entry.key, "warm pool: the ledger no longer holds this entry as the pool knew it; skipping it");
                continue;
            }
            Err(e) => {
                // Nothing was written: the entry is still the pool's.
                pool.unclaim(digest, entry);
                return Err(e);
            }
        }
        crate::l1_leaves::fault::hit("pool-after-take");
        // The books, the ledger's first and then the pool's: the pod's record replaced the
        // entry's (one pool attachment fewer, one pod's more), and the pool served a hit.
        core.attachment_delta(&entry, -1);
        core.attachment_delta(&rec, 1);
        core.events
            .emit(crate::l1_leaves::events::Event::PoolRequest { outcome: "hit" });
        pool.hits.fetch_add(1, Ordering::Relaxed);
        pool.count(&p.key.network, digest, true);
        super::refill::report_levels(core, pool);
        pool.wake.notify_one();
        info!(
            key = %p.key,
            pool_key = %entry.key,
            ips = ?result_ips(&result),
            "attachment added from the warm pool"
        );
        return Ok(Some(rendered));
    }
}

/// The pod's record for a pool entry: the entry's delegate, config and reservation (its
/// delegate key), under the pod's own key, request, caller and CNI_ARGS.
fn pod_record(
    p: &Prepared,
    entry: &AttachmentRecord,
    result: &serde_json::Value,
) -> AttachmentRecord {
    let t = now();
    AttachmentRecord {
        key: p.key.clone(),
        owner: Owner::Pod,
        state: AttachmentState::Committed,
        delegate_type: entry.delegate_type.clone(),
        delegate_version: entry.delegate_version.clone(),
        delegate_config: entry.delegate_config.clone(),
        netns: p.req.netns.clone(),
        cni_args: p.req.cni_args.clone(),
        cni_path: entry.cni_path.clone(),
        result: Some(result.clone()),
        // The pod's own digest: its repeated ADD is answered from the ledger, and a
        // changed config refused, exactly as for any pod.
        config_digest: p.dc.digest(),
        request_id: p.req.request_id.clone(),
        created_at: t,
        updated_at: t,
        issued_ms: p.req.issued_at_ms,
        issued_at: p.issued.clone(),
        delegate_key: Some(DelegateKey {
            container_id: entry.key.container_id.clone(),
            ifname: entry.key.ifname.clone(),
            netns: entry.netns.clone(),
            cni_args: entry.cni_args.clone(),
        }),
        creator_uid: p.caller.recorded_uid(),
        // The pod's own CNI_ARGS, not the pool entry's: the pod came through CRI or not.
        cri_pod: crate::l1_leaves::cri_args::for_record(&Owner::Pod, &p.key, &p.req.cni_args),
    }
}

/// How the take's ledger step went.
enum Take {
    Done,
    /// The pod's key has a record: the normal path answers.
    KeyTaken,
    /// The entry is gone or differs from what the pool holds in memory.
    EntryChanged,
}

/// Points a request for a pod served from the pool at the delegate's key, before DEL or CHECK
/// runs the delegate: the pool entry's container ID, ifname, netns and args, and the config
/// the delegate got at ADD (the request's cniVersion and prevResult kept). `p.key` stays the
/// pod's: the ledger and the locks are about the pod.
pub fn redirect(p: &mut Prepared, rec: &AttachmentRecord) -> Result<(), ShimError> {
    let Some(d) = &rec.delegate_key else {
        return Ok(());
    };
    let mut conf: Value = serde_json::from_str(&rec.delegate_config)
        .map_err(|e| ShimError::Internal(format!("recorded config of {}: {e}", rec.key)))?;
    if let Some(o) = conf.as_object_mut() {
        o.insert("cniVersion".into(), Value::String(p.dc.version.to_string()));
        match p.dc.conf.get("prevResult") {
            Some(prev) => o.insert("prevResult".into(), prev.clone()),
            None => o.remove("prevResult"),
        };
    }
    p.dc.conf = conf;
    p.dc.kind = rec.delegate_type.clone();
    p.req.container_id = d.container_id.clone();
    p.req.ifname = d.ifname.clone();
    p.req.netns = d.netns.clone();
    p.req.cni_args = d.cni_args.clone();
    Ok(())
}

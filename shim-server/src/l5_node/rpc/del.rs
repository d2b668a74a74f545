//! DEL: release through the delegate, then forget the record.
//!
//! The record is marked `deleting` before the delegate runs, so an interrupted DEL is finished
//! at the next start. DEL of a key dipamd does not know still runs the delegate's DEL: the
//! runtime may know better (a ledger restored from backup, an ADD from before dipam), and the
//! spec wants DEL to succeed when there is nothing to release (§2.5). The one exception is a
//! delegate that cannot release without data from the ADD result (azure-vnet-ipam's pool)
//! when neither the ledger nor prevResult has it: then there is nothing it could release.

use dipam_proto::v1::CniRequest;
use dipam_state::{AttachmentRecord, AttachmentState};
use tracing::{debug, info, warn};

use crate::{
    l1_leaves::clock::now, l1_leaves::error::ShimError, l2_core::core::Prepared,
    l5_node::node::Node,
};

/// What a DEL released: the addresses it concerned, for the request's log line and the spool's
/// replay line. DEL's reply to the plugin stays empty (spec §2.5: DEL returns no result).
#[derive(Debug, Default)]
pub struct Released {
    pub ips: Vec<String>,
}

pub async fn run(
    node: &Node,
    caller: crate::l1_leaves::access::Caller,
    req: CniRequest,
) -> Result<Released, ShimError> {
    let mut p = node.prepare(req, true, caller)?;
    // dipamd's own keys (the agent's, the warm pool's) are never a pod's: a runtime's DEL of
    // one must not release what the agent, the pool, or a pod served from it holds.
    crate::l1_leaves::keys::refuse_runtime("DEL", &p.req.container_id)?;
    let _guard = node.core.locks.lock(&p.key).await;

    let existing = node.core.lookup(&p.key)?;
    match &existing {
        Some(rec) => p.authorize(rec, "DEL")?,
        // Everything a non-root caller added is recorded before its delegate ran, so a key
        // with no record holds nothing of its: the delegate's DEL, with a config the caller
        // chose, could only release someone else's reservation. The spec makes a DEL of what
        // is not there a success, and so it is here, doing nothing.
        None if !p.caller.is_root() => {
            info!(key = %p.key, uid = p.caller.uid, "DEL from a non-root caller of a key with no record; nothing of its to release");
            // Still a DEL: this caller's own ADD issued before it must not bring the key back
            // (F4). Its tombstone binds this caller alone (Core::bury): root's ADD of the key
            // is no attachment of this caller's.
            node.core.bury(&p.key, p.issued.clone(), p.caller);
            return Ok(Released::default());
        }
        // A root DEL of a key the ledger does not hold: seen at once when dipamd holds the
        // container on another network (a conflist swapped under running pods), unless it
        // repeats a DEL of this key that already released it (a runtime's retry).
        None => {
            if node.core.tombstone(&p.key).is_none() {
                node.crossed.look(&node.core, &p.key);
            }
        }
    }
    let issued = p.issued.clone();
    if let Some(rec) = &existing
        && stale(node, &p.key, issued.as_ref(), rec)
    {
        return Ok(Released::default());
    }
    // A pod served from the warm pool is known to the delegate by the pool entry's key.
    if let Some(rec) = &existing {
        crate::l3_clients::pool::take::redirect(&mut p, rec)?;
    }
    let prev =
        p.dc.conf
            .get("prevResult")
            .filter(|v| !v.is_null())
            .cloned();
    let known = existing
        .as_ref()
        .and_then(|r| r.result.as_ref())
        .or(prev.as_ref());
    let ips = known
        .map(crate::l2_core::delegate::config::result_ips)
        .unwrap_or_default();
    if !p.dc.inject_for_del(known) && existing.is_none() {
        info!(key = %p.key, delegate = %p.dc.kind, "nothing recorded and no prevResult: the delegate has nothing dipam could release");
        return Ok(Released::default());
    }
    let (probe, send) = node.core.resolve(&p.dc, &p.req.cni_path).await?;
    let stdin = p.dc.bytes_for(send)?;
    // The record is marked `deleting` while the delegate starts; it reads its config (and so
    // releases anything) only once the mark is durable (exec::run_gated).
    let mark = deleting_mark(existing.as_ref(), &p.req.request_id);
    let gate = async {
        if let Some(marked) = mark {
            node.core.ledger(move |l| l.put(&marked)).await?;
            crate::l1_leaves::fault::hit("del-after-mark");
        }
        Ok(())
    };
    // Until the record is forgotten, an ADD that the delegate hands one of its addresses
    // waits for this release instead of being refused for a holder that is going (addrs.rs).
    let _releasing = existing.as_ref().map(|rec| node.core.addrs.releasing(rec));
    // On failure the record stays `deleting`: the address is still held by the delegate, and
    // the runtime's retry (or the next start) releases it.
    node.core
        .run_delegate_gated(&p, &probe, "DEL", stdin, gate, None)
        .await
        .into_result()?;
    crate::l1_leaves::fault::hit("del-after-exec");

    if let Some(rec) = &existing {
        forget(node, &p, rec).await?;
    }
    node.core.bury(&p.key, issued, p.caller);
    // At debug: the request's one info line, with the IPs, comes from the service.
    debug!(key = %p.key, known = existing.is_some(), "attachment deleted");
    Ok(Released { ips })
}

/// The record as marked `deleting` by this DEL (none when an earlier DEL marked it already).
fn deleting_mark(
    existing: Option<&AttachmentRecord>,
    request_id: &str,
) -> Option<AttachmentRecord> {
    existing
        .filter(|r| r.state != AttachmentState::Deleting)
        .map(|rec| {
            let mut marked = rec.clone();
            marked.state = AttachmentState::Deleting;
            marked.updated_at = now();
            marked.request_id = request_id.to_owned();
            marked
        })
}

/// The released record forgotten, and its history told who freed it.
async fn forget(node: &Node, p: &Prepared, rec: &AttachmentRecord) -> Result<(), ShimError> {
    node.core.forget(rec).await?;
    let reason = if p.caller.is_root() {
        format!("the runtime's DEL (request {})", p.req.request_id)
    } else {
        format!(
            "a DEL from uid {} (request {})",
            p.caller.uid, p.req.request_id
        )
    };
    let mut freeing = crate::l1_leaves::events::Freeing::of(rec, &reason);
    freeing.request_id = &p.req.request_id;
    node.core
        .events
        .freed(crate::l1_leaves::events::FreedBy::Del, &freeing);
    Ok(())
}

/// Whether this DEL, issued at `issued`, is older than the ADD of the current attachment
/// `rec`: it belongs to an earlier incarnation of this key (reordered, or replayed late from
/// the spool), and releasing now would take the newer attachment's address away. Ordered on
/// the boot clock, never the wall clock (order.rs: a step back made a live DEL look stale).
/// When the order cannot be known, the DEL runs. One that is ignored is said loudly and
/// counted.
fn stale(
    node: &Node,
    key: &dipam_state::AttachmentKey,
    issued: Option<&dipam_state::BootStamp>,
    rec: &dipam_state::AttachmentRecord,
) -> bool {
    if crate::l1_leaves::order::before(issued, rec.issued_at.as_ref()) != Some(true) {
        return false;
    }
    warn!(
        key = %key,
        del_issued = ?issued,
        add_issued = ?rec.issued_at,
        "DEL issued before the ADD of the current attachment (on the boot clock); it was \
         meant for an earlier one, already gone: not releasing the current one"
    );
    node.core
        .events
        .emit(crate::l1_leaves::events::Event::StaleDel);
    true
}

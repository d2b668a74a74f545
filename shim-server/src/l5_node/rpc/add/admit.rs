//! ADD's one admission step: every check of who calls and what it asks, in the order they
//! refuse, before the ADD takes anything. The rules themselves stay where they are shared
//! (validation in core's `prepare`, the reserved container IDs in keys/, the quotas in
//! quota.rs, the refused networks in divergence.rs); this module is the only place the ADD
//! meets them, as gc/admit.rs is for a GC. It ends holding what the ADD holds until it
//! answers: the key's lock, the birth stamp, and a non-root caller's quota share.

use dipam_proto::v1::CniRequest;
use dipam_state::Ledger;
use tracing::warn;

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
    let quota = if p.caller.is_root() {
        None
    } else {
        Some(non_root_checks(
            &node.admission.quotas,
            &node.core.ledger,
            &p,
        )?)
    };
    Ok(Admitted {
        p,
        _quota: quota,
        _born: born,
        _guard: guard,
    })
}

/// What a non-root caller's ADD must pass on the ledger: the container ID rule below, then
/// the caller's record and byte quotas (quota.rs). Both are read from the ledger's census
/// (dipam_state's census.rs), which dipamd builds at start and every commit keeps: they hold
/// across restarts, and the ADD reads a few entries instead of every record (a scan of 2,500
/// records on every non-root ADD before, docs/performance.md).
fn non_root_checks(
    quotas: &Quotas,
    ledger: &Ledger,
    p: &Prepared,
) -> Result<Reservation, ShimError> {
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
    ledger.census(|c| {
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
                    crate::l1_leaves::validate::shown(&p.req.container_id)
                ),
                details: "a non-root caller's container IDs must not be another caller's; \
                          nothing was allocated"
                    .into(),
            })
        }
    }
}

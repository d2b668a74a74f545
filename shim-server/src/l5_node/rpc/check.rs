//! CHECK: the ledger must hold a committed attachment that matches prevResult, and the
//! delegate's own CHECK must pass where its version has one (spec §2.6: plugins SHOULD call
//! CHECK on a delegated IPAM and pass its errors up).

use std::collections::BTreeSet;

use dipam_proto::v1::CniRequest;
use dipam_state::AttachmentState;
use rscni_types::version::SpecVersion;

use crate::{
    l1_leaves::error::ShimError, l2_core::delegate::config::result_addrs, l5_node::node::Node,
};

pub async fn run(
    node: &Node,
    caller: crate::l1_leaves::access::Caller,
    req: CniRequest,
) -> Result<Vec<u8>, ShimError> {
    let mut p = node.prepare(req, true, caller)?;
    crate::l1_leaves::keys::refuse_runtime("CHECK", &p.req.container_id)?;
    let _guard = node.core.locks.lock(&p.key).await;

    let prev =
        p.dc.conf
            .get("prevResult")
            .filter(|v| !v.is_null())
            .cloned()
            .ok_or_else(|| ShimError::Config {
                msg: "required prevResult missing".into(),
                details: "CHECK compares the runtime's cached ADD result with the ledger; the \
                      runtime sends it as prevResult"
                    .into(),
            })?;
    let rec = node
        .core
        .lookup(&p.key)?
        .filter(|r| r.state == AttachmentState::Committed)
        .ok_or_else(|| ShimError::NoRecord {
            key: p.key.to_string(),
        })?;
    p.authorize(&rec, "CHECK")?;
    let recorded: BTreeSet<_> = rec
        .result
        .as_ref()
        .map(result_addrs)
        .unwrap_or_default()
        .into_iter()
        .collect();
    let seen: BTreeSet<_> = result_addrs(&prev).into_iter().collect();
    // Later plugins in a chain may add addresses; every recorded one must still be there.
    if !recorded.is_subset(&seen) {
        return Err(ShimError::PrevResultMismatch {
            key: p.key.to_string(),
            recorded: recorded.iter().map(ToString::to_string).collect(),
            prev: seen.iter().map(ToString::to_string).collect(),
        });
    }

    // A pod served from the warm pool is known to the delegate by the pool entry's key.
    crate::l3_clients::pool::take::redirect(&mut p, &rec)?;
    let (probe, send) = node.core.resolve(&p.dc, &p.req.cni_path).await?;
    let effective = crate::l2_core::core::Core::effective(&p.dc, send);
    if crate::l2_core::core::Core::delegate_allows(&probe, effective, SpecVersion::new(0, 4, 0))
        && effective >= SpecVersion::new(0, 4, 0)
    {
        let stdin = p.dc.bytes_for(send)?;
        node.core.run_delegate(&p, &probe, "CHECK", stdin).await?;
    }
    Ok(Vec::new())
}

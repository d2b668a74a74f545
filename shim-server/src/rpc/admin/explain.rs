//! `Admin.Explain` (`dipamctl explain`): one container's ledger records and its recorded
//! history.

use dipam_proto::v1::{ExplainReply, ExplainRequest};

use crate::{error::ShimError, node::Node};

/// `dipamctl explain`: the container's ledger records and its recorded history. A warm-pool ID
/// also finds the pod its address went to (the delegate's executions are recorded under it).
pub async fn run(node: &Node, req: ExplainRequest) -> Result<ExplainReply, ShimError> {
    crate::validate::container_id(&req.container_id)?;
    let cid = req.container_id.clone();
    let (records, events) = node
        .ledger(move |l| {
            let records: Vec<_> = l
                .list(None)?
                .into_iter()
                .filter(|r| r.key.container_id == cid || r.delegate_ids().0 == cid)
                .collect();
            Ok((records, crate::history::read(l, &cid)?))
        })
        .await?;
    let all = super::list_from(records, "");
    Ok(ExplainReply {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        attachments: all,
        events: events.iter().map(ToString::to_string).collect(),
        events_dropped: node.history.get().map_or(0, crate::history::Sink::dropped),
    })
}

//! `Admin.ListAttachments` (`dipamctl attachments`): the ledger's attachments, as far as the
//! caller may see them.

use dipam_proto::v1::{ListAttachmentsReply, ListAttachmentsRequest};

use crate::{l1_leaves::error::ShimError, l5_node::node::Node};

/// The ledger's attachments. Root and --admin-uid see all; another caller only those it
/// created (their netns paths and results are no one else's business).
pub async fn run(
    node: &Node,
    caller: crate::l1_leaves::access::Caller,
    req: ListAttachmentsRequest,
) -> Result<ListAttachmentsReply, ShimError> {
    use crate::l1_leaves::validate::{bounded, limits};
    bounded(
        "the network filter",
        req.network.as_bytes(),
        limits::NETWORK,
        7,
    )?;
    bounded("the owner filter", req.owner.as_bytes(), limits::NAME, 7)?;
    let network = (!req.network.is_empty()).then(|| req.network.clone());
    let mut records = node
        .core
        .ledger(move |l| l.list(network.as_deref()))
        .await?;
    if !caller.admin {
        records.retain(|r| caller.owns(r.creator_uid));
    }
    Ok(ListAttachmentsReply {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        attachments: super::list_from(records, &req.owner),
    })
}

//! `Admin.Adopt` (`dipamctl adopt`, and `dipamctl install --wrap` after it rewrote a conflist):
//! records the running pods' reservations that dipamd never saw, in one network, now.

use dipam_proto::v1::{AdoptReply, AdoptRequest};

use crate::{l1_leaves::error::ShimError, l3_clients::adopt, l5_node::node::Node};

/// Adopts (or, dry run, lists) what the network's delegate holds for running pods that the
/// ledger lacks; says which unrecorded reservations are dead, and which cannot be told.
pub async fn run(node: &Node, req: AdoptRequest) -> Result<AdoptReply, ShimError> {
    let p = super::gc::prepare(node, &req.config, req.mode, "dipamctl-adopt")?;
    let scan = node.gc.scan().await;
    let r = adopt::adopt(&node.core, &node.gc.policy, &p.dc, &scan, req.dry_run).await?;
    Ok(AdoptReply {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        network: p.dc.network.clone(),
        adopted: r.adopted,
        dead: r.dead,
        unverified: r.unverified,
        skipped: r.skipped,
    })
}

//! `Agent.List` (`dipamctl agent list`): every claim (the roles' and the agent's) and its
//! address.

use dipam_proto::v1::AgentListReply;

use crate::{l1_leaves::error::ShimError, l3_clients::agent::reconcile, l5_node::node::Node};

/// The list as published, changed marks included; reading it clears them (the caller has now
/// seen the change), which Watch messages never do.
pub async fn run(node: &Node) -> Result<AgentListReply, ShimError> {
    let snap = node.agent.snapshot();
    let read: Vec<String> = snap
        .addresses
        .iter()
        .filter(|a| a.changed)
        .map(|a| a.container_id.clone())
        .collect();
    if !read.is_empty() {
        reconcile::clear_changed(&node.reconciler(), &read).await?;
    }
    Ok(snap)
}

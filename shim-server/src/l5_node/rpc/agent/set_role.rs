//! `Agent.Allocate` and `Agent.Release` (`dipamctl agent allocate|release`): enable or disable
//! a role (its predefined claims) at runtime.

use std::sync::Arc;

use dipam_proto::v1::AgentListReply;

use crate::{l1_leaves::error::ShimError, l3_clients::agent::reconcile, l5_node::node::Node};

/// Enables or disables `role`, runs a reconcile pass at once, and answers with the result:
/// the agent gets its address (or the reason it has none) in the reply. The work runs in a
/// task of its own (claim.rs): a caller whose deadline expires gets DEADLINE_EXCEEDED, and
/// the role is still enabled or released to the end, at once.
pub async fn run(node: Arc<Node>, role: String, on: bool) -> Result<AgentListReply, ShimError> {
    let work = node.reconciler();
    tokio::spawn(async move {
        reconcile::set_role(&work, &role, on).await?;
        reconcile::pass(&work).await
    })
    .await
    .map_err(|e| ShimError::Internal(format!("role task: {e}")))??;
    Ok(node.agent.snapshot())
}

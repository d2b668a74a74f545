//! `Agent.Allocate` and `Agent.Release` (`dipamctl agent allocate|release`): enable or disable
//! a role at runtime.

use dipam_proto::v1::AgentListReply;

use crate::{agent::reconcile, error::ShimError, node::Node};

/// Enables or disables `role`, runs a reconcile pass at once, and answers with the result:
/// the agent gets its address (or the reason it has none) in the reply.
pub async fn run(node: &Node, role: &str, on: bool) -> Result<AgentListReply, ShimError> {
    reconcile::set_role(node, role, on).await?;
    reconcile::pass(node).await?;
    Ok(node.agent.snapshot())
}

//! The agent's RPCs: list, watch, and allocate/release a role at runtime.

use dipam_proto::v1::AgentListReply;

use crate::{agent::reconcile, error::ShimError, node::Node};

pub fn list(shim: &Node) -> AgentListReply {
    shim.agent.snapshot()
}

/// Enables or disables `role`, runs a reconcile pass at once, and answers with the result:
/// the agent gets its address (or the reason it has none) in the reply.
pub async fn set_role(shim: &Node, role: &str, on: bool) -> Result<AgentListReply, ShimError> {
    reconcile::set_role(shim, role, on).await?;
    reconcile::pass(shim).await?;
    Ok(shim.agent.snapshot())
}

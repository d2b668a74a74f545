//! `Agent.List` (`dipamctl agent list`): the agent's roles and their addresses.

use dipam_proto::v1::AgentListReply;

use crate::node::Node;

pub fn run(node: &Node) -> AgentListReply {
    node.agent.snapshot()
}
